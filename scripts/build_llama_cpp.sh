#!/bin/sh
# Build llama-cpp-python 0.3.36 from its sdist into a venv outside the repository, for the golden
# recorders (scripts/record_golden_forward.py, record_golden_llama.py, record_golden_families.py).
# Not part of CI.
#
# The C and C++ flags turn off AMX: the compiler's -march=native enables it on this machine's CPU,
# but the kernel does not let processes use it, so the build would die of SIGILL at load.
# LLAVA_BUILD=OFF skips the multimodal library, which no recorder uses. The CMake build directory
# is kept beside the venv, so that an interrupted build resumes where it stopped.
#
# Usage: nice -n 19 sh scripts/build_llama_cpp.sh [SDIST_DIR] [VENV_DIR]
# Writes $VENV_DIR/../READY once the venv imports llama_cpp.
set -eu
SDIST=${1:-/work/llama-cpp/llama_cpp_python-0.3.36}
VENV=${2:-/work/llama-cpp/venv}
FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet numpy jinja2 gguf==0.19.0   # gguf: the recorders
CMAKE_ARGS="-DCMAKE_C_FLAGS='$FLAGS' -DCMAKE_CXX_FLAGS='$FLAGS' -DLLAVA_BUILD=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL=2 \
  "$VENV/bin/pip" install --verbose --no-cache-dir \
  --config-settings=build-dir="$(dirname "$VENV")/build" "$SDIST"
"$VENV/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)"
touch "$(dirname "$VENV")/READY"
