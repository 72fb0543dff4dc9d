#!/usr/bin/env bash
# Fuzzes drill on the stable toolchain: runs each proptest target of tests/fuzz.rs in rounds of
# PROPTEST_CASES cases until its share of the time is spent, and prints executions per target.
#   ci/fuzz.sh [SECONDS_PER_TARGET]      (default 100: 6 targets, 10 minutes)
# A failure stops the run; proptest saves the shrunk case under proptest-regressions/ — commit
# it as a regression (it is replayed first on every later run, in the suite too).
set -euo pipefail
cd "$(dirname "$0")/.."
per_target="${1:-100}"
cases="${PROPTEST_CASES_PER_ROUND:-2000}"
targets=(
  the_scenario_parser_never_panics_on_random_text
  the_scenario_parser_never_panics_on_mutated_scenarios
  the_ingest_batch_check_never_panics_and_keeps_only_json
  the_mqtt_decoder_never_panics
  the_log_recovers_from_random_truncation_and_corruption
  the_control_apis_answer_any_json
)
cargo test --test fuzz --no-run -q
for t in "${targets[@]}"; do
  # The log and API targets do real file and HTTP work per case: smaller rounds.
  n="$cases"
  case "$t" in *log*|*apis*) n=$((cases / 10)) ;; esac
  start=$(date +%s)
  rounds=0
  while [ $(( $(date +%s) - start )) -lt "$per_target" ]; do
    PROPTEST_CASES="$n" cargo test -q --test fuzz "$t" -- --exact >/dev/null
    rounds=$((rounds + 1))
  done
  echo "fuzz: $t: $((rounds * n)) executions in $(( $(date +%s) - start )) s, 0 failures"
done
