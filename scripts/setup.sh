#!/usr/bin/env bash
# Installs what a fresh Debian machine needs to build Tessera (skipped for
# what is already there), then configures and builds into build/.
#   scripts/setup.sh [extra cmake args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
[ -f /usr/include/fmt/format.h ] || need+=(libfmt-dev)
[ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
[ -f /usr/src/googletest/CMakeLists.txt ] || need+=(googletest libgtest-dev)
command -v clang-format >/dev/null || need+=(clang-format)  # the ctest test `format`
if [ ${#need[@]} -gt 0 ] && [ ! -d "$root/.deps/include" ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "setup: the CUDA toolkit (nvcc) is required" >&2; exit 1; }
export PATH="$PATH:/usr/local/cuda/bin"

jobs="${TESSERA_BUILD_JOBS:-$(nproc)}"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$root/build" -j "$jobs"
