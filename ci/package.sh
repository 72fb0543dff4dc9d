#!/usr/bin/env bash
# Packs a built drill binary the way `cargo binstall` looks for it (Cargo.toml's
# [package.metadata.binstall]): drill-v<version>-<target>.tar.gz holding
# drill-v<version>-<target>/drill (with README.md and LICENSE when present), and a .sha256 beside
# it. Used by the release workflow (ci/github/release.yml) and checked by ci/test.sh.
#   ci/package.sh <binary> <target triple> <out dir>
set -euo pipefail
bin="$1" target="$2" out="$3"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml" | head -1)"
name="drill-v${version}-${target}"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name" "$out"
cp "$bin" "$stage/$name/drill"
for f in README.md LICENSE; do
  if [ -f "$(dirname "$0")/../$f" ]; then cp "$(dirname "$0")/../$f" "$stage/$name/"; fi
done
tar -C "$stage" -czf "$out/$name.tar.gz" "$name"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "$out/$name.tar.gz"
