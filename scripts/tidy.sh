#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy) over the host C++ sources of the library and
# tools, using build/compile_commands.json (scripts/setup.sh writes it).
#   scripts/tidy.sh [file...]     default: every src/ and tools/ .cpp
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
db="${TESSERA_BUILD_DIR:-$root/build}"
[ -f "$db/compile_commands.json" ] || { echo "tidy: $db/compile_commands.json missing (run scripts/setup.sh)" >&2; exit 2; }
cd "$root"
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files -- 'src/*.cpp' 'tools/*.cpp'); fi
clang-tidy -p "$db" --quiet "${files[@]}"
