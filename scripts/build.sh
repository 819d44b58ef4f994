#!/usr/bin/env bash
# Configures and builds headscope into build/ (ccache and precompiled headers keep rebuilds short).
#   scripts/build.sh                  Debian's libtorch 1.13 (libtorch-dev) into build/
#   scripts/build.sh --torch PREFIX   another libtorch (2.x) into build-torch2/; PREFIX is the folder
#                                     holding share/cmake/Torch (an unpacked libtorch archive, a cluster
#                                     module's prefix), or the pip wheel's
#                                     `python -c 'import torch; print(torch.utils.cmake_prefix_path)'`
#   HEADSCOPE_TORCH_PREFIX=PREFIX scripts/build.sh   the same as --torch PREFIX
# For a machine without Debian's -dev packages (scripts/device_check.sh unpacks them into a prefix), with
# --torch only:
#   HEADSCOPE_EXTRA_PREFIX=DIR[;DIR]  searched by find_package after libtorch's root (CMAKE_PREFIX_PATH)
#   HEADSCOPE_LDFLAGS=FLAGS           appended to the executable's linker flags (e.g. -Wl,-rpath-link,DIR)
#   HEADSCOPE_CMAKE_ARGS="-DA=B ..."  more cache entries (split on spaces), e.g. -DHS_BUILD_TESTS=OFF
#   HEADSCOPE_BUILD_TARGET=T          build only target T (a quick check: device_check.sh --dry-run)
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/build.sh [--torch PREFIX]   (or HEADSCOPE_TORCH_PREFIX=PREFIX scripts/build.sh)" >&2; exit 2; }
torch="${HEADSCOPE_TORCH_PREFIX:-}"
case "${1:-}" in
  --torch) [ $# -eq 2 ] || usage; torch="$2" ;;
  --torch=*) [ $# -eq 1 ] || usage; torch="${1#--torch=}" ;;
  "") ;;
  *) usage ;;
esac
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ -z "$torch" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
  exit 0
fi

# --- another libtorch, into build-torch2/ (never mixed with build/) ---
# libtorch's root: the folder with include/, lib/ and share/cmake/Torch/ (PREFIX may be any of the three
# levels: the root, its share/cmake, its share/cmake/Torch).
root=""
for r in "$torch" "$torch/../.." "$torch/../../.."; do
  if [ -f "$r/share/cmake/Torch/TorchConfig.cmake" ]; then root="$(cd "$r" && pwd)"; break; fi
done
[ -n "$root" ] || { echo "build.sh: no share/cmake/Torch/TorchConfig.cmake in or above '$torch'" >&2; exit 2; }
# Torch_DIR: find_package(Torch) cannot fall back to Debian's /usr/lib/x86_64-linux-gnu/cmake/Torch.
# CMAKE_PREFIX_PATH=root: TorchConfig.cmake looks for libtorch.so and libc10.so with find_library, which
# searches /usr/lib/x86_64-linux-gnu (Debian's 1.13 libraries) before root/lib unless root is a prefix.
args=(-DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$root/share/cmake/Torch" -DCMAKE_PREFIX_PATH="$root${HEADSCOPE_EXTRA_PREFIX:+;$HEADSCOPE_EXTRA_PREFIX}")
ldflags="${HEADSCOPE_LDFLAGS:-}"
# C++11 ABI: Debian's fmt, yaml-cpp, HDF5 C++ users and g++'s default are all the new ABI
# (_GLIBCXX_USE_CXX11_ABI=1), so libtorch must be too: torch >= 2.7 wheels and the "cxx11 ABI" libtorch
# archives are (torch._C._GLIBCXX_USE_CXX11_ABI is True); older pip wheels were built with the old one
# and cannot be linked with Debian's libraries. No flag is needed for a new-ABI libtorch.
c10="$root/lib/libc10.so"
if [ -f "$c10" ] && [ "$(nm -D --defined-only "$c10" | grep -c __cxx11)" -eq 0 ]; then  # (grep -q: SIGPIPE under pipefail)
  echo "build.sh: $c10 uses the pre-C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=0); headscope links Debian's" >&2
  echo "  libraries (new ABI): use torch >= 2.7 or a 'cxx11 ABI' libtorch archive" >&2
  exit 2
fi
# CUDA: a CUDA-enabled libtorch (the PyPI wheel is one, even on a machine without a GPU) makes
# find_package(Torch) enable the CUDA language and find a CUDA toolkit (nvcc, cudart, nvrtc), and fails
# without one, though headscope compiles no CUDA code. The nvcc used, first found of:
#   1. $CUDACXX;
#   2. the pip wheel's own: nvidia/cu*/bin/nvcc next to torch/ in site-packages, there after
#      `pip install "cuda-toolkit[nvcc]==V"` with V the cuda-toolkit version torch pulled in
#      (scripts/test_torch2.sh does it): the same CUDA as the wheel's runtime libraries. Those wheels
#      ship only versioned libraries (libcudart.so.13, no libcudart.so), which find_library does not
#      find: they are named here;
#   3. nvcc on PATH, $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, the newest /usr/local/cuda-*/bin/nvcc
#      (a cluster's CUDA module, a system toolkit; torch 2.x wants CUDA >= 12.6).
# CMake then warns that "pytorch is not compatible with CMAKE_CUDA_ARCHITECTURES" and "library kineto not
# found" (kineto is inside libtorch_cpu.so in the wheel): both harmless here.
if [ -f "$root/lib/libtorch_cuda.so" ]; then
  nvcc="${CUDACXX:-}"
  cuda_libs=""
  if [ -z "$nvcc" ]; then
    for d in "$root"/../nvidia/cu*/; do
      if [ -x "$d/bin/nvcc" ]; then nvcc="$(cd "$d" && pwd)/bin/nvcc"; cuda_libs="$(cd "$d" && pwd)/lib"; fi
    done
  fi
  if [ -z "$nvcc" ]; then
    for c in "$(command -v nvcc || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc \
             $(ls -d /usr/local/cuda-*/bin/nvcc 2>/dev/null | sort -V -r); do
      if [ -n "$c" ] && [ -x "$c" ]; then nvcc="$c"; break; fi
    done
  fi
  if [ -z "$nvcc" ]; then
    echo "build.sh: $root is a CUDA build of libtorch and its CMake files need a CUDA toolkit (nvcc);" >&2
    echo "  none found. For the pip wheel: pip install \"cuda-toolkit[nvcc]==V\" in its environment" >&2
    echo "  (V: pip show cuda-toolkit), or set CUDACXX / CUDA_HOME, or load a CUDA >= 12.6 module" >&2
    exit 2
  fi
  cuda_root="$(cd "$(dirname "$nvcc")/.." && pwd)"
  echo "build.sh: libtorch $root, CUDA toolkit $cuda_root" >&2
  args+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCUDAToolkit_ROOT="$cuda_root")
  if [ -n "$cuda_libs" ]; then
    cudart=$(ls "$cuda_libs"/libcudart.so.* | head -1)
    nvrtc=$(ls "$cuda_libs"/libnvrtc.so.* | head -1)
    args+=(-DCUDA_CUDART_LIBRARY="$cudart" -DCUDA_cudart_LIBRARY="$cudart" -DCUDA_nvrtc_LIBRARY="$nvrtc")
  fi
  # The wheel's libtorch_cuda.so finds NCCL, cuDNN, ... in site-packages/nvidia/*/lib through its own
  # RPATH, but at link time ld searches the toolkit's lib folder (an -rpath) first: a system toolkit
  # that holds an older libnccl.so.2 (/usr/local/cuda/lib64 here) failed the link with undefined
  # ncclCommSuspend & co. -rpath-link to the wheel's folders, searched before any -rpath, avoids it.
  if ls -d "$root"/../nvidia/*/lib >/dev/null 2>&1; then
    ldflags="-Wl,-rpath-link,$(cd "$root/../nvidia" && ls -d "$PWD"/*/lib | paste -sd:)${ldflags:+ $ldflags}"
  fi
fi
[ -n "$ldflags" ] && args+=(-DCMAKE_EXE_LINKER_FLAGS="$ldflags")
# shellcheck disable=SC2206
[ -n "${HEADSCOPE_CMAKE_ARGS:-}" ] && args+=(${HEADSCOPE_CMAKE_ARGS})
cmake -S . -B build-torch2 "${args[@]}" >/dev/null
cmake --build build-torch2 -j"$(nproc)" ${HEADSCOPE_BUILD_TARGET:+--target "$HEADSCOPE_BUILD_TARGET"}
