#!/usr/bin/env bash
# The whole test suite: installs what it needs (ci/setup.sh), then format, lints and tests.
# Tests start their own brokers on free 127.0.0.1 ports and stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

bash ci/setup.sh
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked
