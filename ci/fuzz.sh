#!/usr/bin/env bash
# Fuzzes drill on the stable toolchain: runs each proptest target of tests/fuzz.rs in rounds of
# cases until its share of the time is spent, and prints executions per target.
#   ci/fuzz.sh [TOTAL_SECONDS]      (default 180, shared equally by the targets; ci/test.sh
#                                    runs it so, a longer hunt: ci/fuzz.sh 3600)
# A failure stops the run; proptest saves the shrunk case in tests/fuzz.proptest-regressions —
# commit it: it is replayed first on every later run, in the suite too.
set -euo pipefail
cd "$(dirname "$0")/.."
total="${1:-180}"
# Target, and the cases of one round (about 3 s each in a debug build on a 2-core machine):
# targets that do real file or HTTP work per case run smaller rounds.
targets=(
  "the_scenario_parser_never_panics_on_random_text 1500"
  "the_scenario_parser_never_panics_on_mutated_scenarios 1500"
  "the_ingest_batch_check_never_panics_and_keeps_only_json 3000"
  "the_mqtt_decoder_never_panics 4000"
  "the_mqtt_decoder_reads_back_packets_cut_anyhow 1000"
  "the_mqtt_tap_notes_exactly_what_crossed 1000"
  "the_syslog_tap_notes_exactly_the_ids_written 2000"
  "the_postgres_tap_finds_exactly_the_overlapping_attempts 2000"
  "the_log_recovers_every_record_before_the_damage_and_invents_none 250"
  "the_control_apis_answer_any_json 1000"
)
share=$(( total / ${#targets[@]} ))
cargo test --features mutants,test-hooks,kafka-tls,powercut --test fuzz --no-run -q
for entry in "${targets[@]}"; do
  read -r t n <<<"$entry"
  start=$(date +%s)
  rounds=0
  # At least one round; a round is never cut short, so a target may run a few seconds over.
  while [ "$rounds" -eq 0 ] || [ $(( $(date +%s) - start )) -lt "$share" ]; do
    if ! PROPTEST_CASES="$n" cargo test -q --features mutants,test-hooks,kafka-tls,powercut --test fuzz "$t" -- --exact >/tmp/drill-fuzz.$$ 2>&1; then
      cat /tmp/drill-fuzz.$$
      rm -f /tmp/drill-fuzz.$$
      echo "fuzz: $t FAILED after $((rounds * n)) passing executions; the case is in tests/fuzz.proptest-regressions" >&2
      exit 1
    fi
    rounds=$((rounds + 1))
  done
  echo "fuzz: $t: $((rounds * n)) executions in $(( $(date +%s) - start )) s, 0 failures"
done
rm -f /tmp/drill-fuzz.$$
