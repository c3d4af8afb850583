#!/usr/bin/env bash
# Copies the header-only / source dependencies into .deps/ (git-ignored) so
# they can travel to machines where nothing can be installed (the lent GPU
# machines): CLI11, nlohmann-json and fmt headers (fmt used header-only
# there) and the GoogleTest sources. Run on a machine that has them
# (scripts/setup.sh installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
d="$root/.deps"
rm -rf "$d"; mkdir -p "$d/include"
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/fmt "$d/include/"
cp -r /usr/src/googletest "$d/googletest"
du -sh "$d"
