#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-speculative-simple and llama-server from source, once, into the cache,
# for `specviz bench --compare-llamacpp DIR` (optional: nothing else in specviz needs it).
#
#   bash scripts/build_llamacpp.sh            # prints the build folder to pass as DIR
#
# The source is the llama.cpp tree vendored in the pinned llama-cpp-python sdist on PyPI (MIT, like
# llama.cpp; its LICENSE is checked below). No binary is downloaded. cmake + ninja + a C++ compiler are needed
# (Debian: cmake ninja-build g++); 5-25 min on 2 cores. GGML_NATIVE is off (on an AMX Xeon a native build
# crashed at the first compute): the x86 instruction sets are switched on from this CPU's own flags instead.
set -euo pipefail
version=${LLAMACPP_PY_VERSION:-0.3.36}
# the cache root the package uses (models/cache.py): SPECVIZ_CACHE, else the platform's ($XDG_CACHE_HOME or ~/.cache)
cache=${SPECVIZ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specviz}/llama.cpp
src=$cache/src-$version
build=$cache/build-$version
jobs=${JOBS:-$(nproc)}

if [ -x "$build/bin/llama-bench" ] && [ -x "$build/bin/llama-speculative-simple" ] && [ -x "$build/bin/llama-server" ]; then
  echo "$build"; exit 0
fi
for tool in cmake ninja c++; do
  command -v "$tool" >/dev/null || { echo "[llama.cpp] $tool is missing (Debian: apt install cmake ninja-build g++)" >&2; exit 1; }
done
mkdir -p "$cache"
if [ ! -d "$src" ]; then
  tmp=$(mktemp -d)
  echo "[llama.cpp] fetching the llama-cpp-python $version sdist (source only) from PyPI" >&2
  python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version" >&2
  tar -xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
  grep -q "MIT License" "$tmp/llama_cpp_python-$version/vendor/llama.cpp/LICENSE" \
    || { echo "[llama.cpp] the vendored tree's LICENSE is not MIT: not building it" >&2; exit 1; }
  mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -rf "$tmp"
fi

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
echo "[llama.cpp] configuring (native off; AVX2 $(has avx2), AVX-512 $(has avx512f), BF16 $(has avx512_bf16))" >&2
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c) \
  -DGGML_BMI2=$(has bmi2) -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi) \
  -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16) \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_OPENSSL=OFF >&2
echo "[llama.cpp] building with $jobs jobs (5-25 min on 2 cores)" >&2
cmake --build "$build" -j "$jobs" --target llama-bench llama-speculative-simple llama-server >&2
echo "$build"
