#!/bin/sh
# Build llama-cpp-python 0.3.36 from its sdist into a venv (by default .cache/llama-cpp/venv in the
# repository, which git ignores), for the golden
# recorders (scripts/record_golden_forward.py, record_golden_llama.py, record_golden_families.py).
# Not part of CI.
#
# The C and C++ flags turn off AMX: the compiler's -march=native enables it on this machine's CPU,
# but the kernel does not let processes use it, so the build would die of SIGILL at load.
# LLAVA_BUILD=OFF skips the multimodal library, which no recorder uses. The CMake build directory
# is kept beside the venv, so that an interrupted build resumes where it stopped.
#
# Usage: nice -n 19 sh scripts/build_llama_cpp.sh SDIST [VENV_DIR]
#   SDIST: llama_cpp_python-0.3.36.tar.gz from PyPI, or the folder it unpacks to;
#   VENV_DIR: default .cache/llama-cpp/venv under the repository root.
# Writes $VENV_DIR/../READY once the venv imports llama_cpp.
set -eu
if [ $# -lt 1 ]; then
  echo "usage: sh scripts/build_llama_cpp.sh SDIST [VENV_DIR]  (SDIST: llama_cpp_python-0.3.36.tar.gz or its folder)" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SDIST=$1
VENV=${2:-$ROOT/.cache/llama-cpp/venv}
mkdir -p "$(dirname "$VENV")"
FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet numpy jinja2 gguf==0.19.0   # gguf: the recorders
CMAKE_ARGS="-DCMAKE_C_FLAGS='$FLAGS' -DCMAKE_CXX_FLAGS='$FLAGS' -DLLAVA_BUILD=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL=2 \
  "$VENV/bin/pip" install --verbose --no-cache-dir \
  --config-settings=build-dir="$(dirname "$VENV")/build" "$SDIST"
"$VENV/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)"
touch "$(dirname "$VENV")/READY"
