#!/bin/sh
# Build llama.cpp's `llama-bench` with CUDA for the H200 (sm_90), from the source vendored in the
# pinned llama-cpp-python 0.3.36 sdist: the peer of pyspec's native WebGPU numbers in
# bench/results/h200-shapes.json. Runs on the GPU machine (nvcc and CMake are there); never in CI.
# scripts/h200.sh packs the source and starts this in the background on the first call.
#
# Only what llama-bench needs: no tests, examples, server or curl; flash-attention kernels for
# the default quant pairs only (GGML_CUDA_FA_ALL_QUANTS off), Hopper's architecture only.
#
# Usage: sh scripts/build_llama_cpp_cuda.sh LLAMA_CPP_DIR   (writes LLAMA_CPP_DIR/build/bin/)
set -eu
SRC=${1:?usage: build_llama_cpp_cuda.sh LLAMA_CPP_DIR}
cd "$SRC"
start=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DGGML_CUDA_FA_ALL_QUANTS=OFF
cmake --build build --target llama-bench -j "$(nproc)"
echo "built llama-bench in $(( $(date +%s) - start )) s: $(build/bin/llama-bench --help >/dev/null 2>&1 && echo ok)"
