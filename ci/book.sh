#!/usr/bin/env bash
# The book (docs/, mdBook): the scenario reference generated from `drill schema`, built with
# `mdbook build`, then every relative link of the book and the README checked and every YAML
# block that is a whole scenario run through `drill check`. Fails on any of them.
#   bash ci/book.sh [DRILL_BINARY] [--write]   (default: target/debug/drill, built if missing;
#   --write regenerates docs/src/reference.md instead of failing on a difference)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
drill=target/debug/drill
if [ -n "${1:-}" ] && [ "$1" != "--write" ]; then drill=$1; fi
if [ ! -x "$drill" ]; then
  cargo build --quiet
fi
# The reference is committed (it reads on GitHub too) and must be what the parser says now.
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
"$drill" schema | python3 ci/book_reference.py > "$fresh"
if [ "${1:-}" = "--write" ] || [ "${2:-}" = "--write" ]; then
  cp "$fresh" docs/src/reference.md
elif ! cmp -s "$fresh" docs/src/reference.md; then
  echo "ci/book.sh: docs/src/reference.md differs from what drill schema says now; regenerate it: bash ci/book.sh --write" >&2
  diff -u docs/src/reference.md "$fresh" | head -40 >&2 || true
  exit 1
fi
mdbook build docs
python3 ci/book_check.py "$drill" README.md docs/src
