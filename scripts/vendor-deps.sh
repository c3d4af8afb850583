#!/usr/bin/env bash
# Copies the header-only / source dependencies into .deps/ (git-ignored) so
# they can travel to machines where nothing can be installed (the lent GPU
# machines): CLI11, nlohmann-json and fmt headers (fmt used header-only
# there) and the GoogleTest sources. Run on a machine that has them
# (scripts/setup.sh installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
d="$root/.deps"
# Built aside and moved in whole: a partial .deps (a header missing here)
# would make scripts/setup.sh skip installing the packages.
tmp="$(mktemp -d "$root/.deps.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include"
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/fmt "$tmp/include/"
cp -r /usr/src/googletest "$tmp/googletest"
rm -rf "$d"; mv "$tmp" "$d"; trap - EXIT
du -sh "$d"
