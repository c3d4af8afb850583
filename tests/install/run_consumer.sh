#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds
# and runs tests/install/consumer against it (find_package(Tessera CONFIG)).
#   run_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"; src="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" --component dev >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }
cmake -S "$src/tests/install/consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$tmp/build/consumer"
