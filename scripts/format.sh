#!/usr/bin/env bash
# Formats the tracked C++ / CUDA sources with .clang-format, or checks them.
#   scripts/format.sh           rewrite files in place
#   scripts/format.sh --check   list unformatted files, exit 1 if any
# The check runs as the ctest test `format` (scripts/test.sh). It uses the
# clang-format on PATH (CLANG_FORMAT overrides); the style was set with
# clang-format 14, Debian 12's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cf="${CLANG_FORMAT:-clang-format}"
command -v "$cf" >/dev/null || { echo "format: $cf not found (scripts/setup.sh installs clang-format)" >&2; exit 2; }
cd "$root"
mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h' 2>/dev/null ||
                     find include src tests tools bench -name '*.[ch]pp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    [ -f "$f" ] || continue
    if ! "$cf" --style=file "$f" | cmp -s - "$f"; then
      echo "format: $f is not formatted (scripts/format.sh fixes it)"
      bad=$((bad + 1))
    fi
  done
  echo "format: ${#files[@]} files checked, $bad unformatted"
  [ "$bad" -eq 0 ]
else
  "$cf" --style=file -i "${files[@]}"
fi
