//! The destination kind contract (`src/dest/mod.rs`, "What each part must guarantee"), run over
//! every kind with one line each: a drill through the real binary, drill's own engine, the
//! kind's real broker. Answers are swallowed for 5 s (the engine's answer timeout is 2 s), then
//! the link is refused twice for 2 s while the engine probes once a second, with records
//! flowing from the first second on. Each kind must show:
//!
//! - its reader reads from before the first record: nothing lost, the ledger closes;
//! - its probe writes nothing: no record without drill's id arrives (`unexpected`), and no copy
//!   beyond what the promise allows (`duplicates: 0`; a probe carrying a record leaves a
//!   keyless copy at each reconnect);
//! - an unanswered write ends `possibly_sent` (attempts counted so), where the kind's engine
//!   output ends attempts on its answer timeout;
//! - a bypass is judged: the same drill with the engine pointed at the broker itself, around
//!   its link (`DRILL_TEST_ENGINE_AROUND_PROXY`, feature `test-hooks`), is inconclusive (exit
//!   code 1) and its headline says the engine's traffic bypassed the proxy: by arrival times
//!   during the refusals, or by the link's tap seeing none of the records that arrived.
//!
//! A kind added to the `kinds!` list without a line here fails
//! `every_kind_has_a_contract_line`.

use crate::common::run::{Ran, run_drill_with, scenario, show};

/// A kind's line: what its `destination:` needs beyond `kind:`, and whether an unanswered
/// write ends `possibly_sent` in drill's engine.
struct Line {
    kind: &'static str,
    destination: &'static str,
    /// Kafka: librdkafka's idempotent producer keeps the attempt open and retries under the
    /// same producer id and sequence until the broker answers, so no attempt ends unanswered
    /// (`scenarios/kafka-half-open.yaml`: 180 s of swallowed answers, 0 possibly sent).
    unanswered_is_possibly_sent: bool,
}

const LINES: &[Line] = &[
    Line {
        kind: "mqtt",
        destination: "runtime: process, topic: drill/contract",
        unanswered_is_possibly_sent: true,
    },
    Line {
        kind: "nats",
        destination: "topic: drill.contract",
        unanswered_is_possibly_sent: true,
    },
    Line {
        kind: "kafka",
        destination: "topic: drill-contract",
        unanswered_is_possibly_sent: false,
    },
    Line {
        kind: "syslog",
        destination: "transport: relp",
        unanswered_is_possibly_sent: true,
    },
    Line {
        kind: "http",
        destination: "topic: /ingest",
        unanswered_is_possibly_sent: true,
    },
    Line {
        kind: "postgres",
        destination: "runtime: process",
        unanswered_is_possibly_sent: true,
    },
    Line {
        kind: "amqp",
        destination: "topic: drill.contract",
        unanswered_is_possibly_sent: true,
    },
];

fn line(kind: &str) -> &'static Line {
    LINES
        .iter()
        .find(|l| l.kind == kind)
        .unwrap_or_else(|| panic!("no contract line for {kind}"))
}

/// The drill above for `kind`, run with `env` (a mutant, for the failure it prevents).
fn drill_of(kind: &str, env: &[(&str, &str)]) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("contract-{kind}");
    let text = format!(
        "name: {name}
destination: {{ kind: {kind}, {destination} }}
system: {{ builtin: {{ keepalive: 1s, answer_timeout: 2s }} }}
workload: {{ rate: 50/s, duration: 16s, keys: 4 }}
faults:
  - {{ at: 3s, link: {kind}, fault: swallow, direction: downstream, for: 5s }}
  - {{ at: 9s, link: {kind}, fault: refuse, for: 2s }}
  - {{ at: 12s, link: {kind}, fault: refuse, for: 2s }}
expect: {{ lost: 0, duplicates: 0, ledger: closes }}
drain_timeout: 60s
",
        destination = line(kind).destination
    );
    let file = scenario(dir.path(), &name, &text);
    let ran = run_drill_with(&file, &name, &[], env);
    let (ledger, attempts) = (&ran.report["ledger"], &ran.report["attempts"]);
    println!(
        "{kind}: exit {:?}, held {}, delivered {}, lost {}, unexpected {}, duplicates {} (beyond the promise {}), possibly sent {}; {}",
        ran.output.status.code(),
        ledger["held"],
        ledger["delivered"],
        ledger["lost"],
        ledger["unexpected"],
        ledger["duplicates"],
        ledger["duplicates_beyond_promise"],
        attempts["possibly_sent"],
        ran.report["headline"].as_str().unwrap_or_default(),
    );
    ran
}

/// What the drill of `kind` must show.
fn keeps_the_contract(kind: &str) {
    let l = line(kind);
    let Ran {
        output: o, report, ..
    } = drill_of(kind, &[]);
    let (ledger, attempts) = (&report["ledger"], &report["attempts"]);
    assert_eq!(o.status.code(), Some(0), "{kind}: {}", show(&o));
    assert_eq!(report["verdict"], "pass", "{kind}");
    assert!(ledger["held"].as_u64().unwrap() >= 750, "{kind}: {ledger}");
    assert_eq!(
        ledger["lost"], 0,
        "{kind}: read from before the first record"
    );
    assert_eq!(report["closes"], true, "{kind}");
    assert_eq!(ledger["unexpected"], 0, "{kind}: a probe wrote");
    assert_eq!(
        ledger["duplicates_beyond_promise"], 0,
        "{kind}: a copy the promise does not allow (a probe carrying a record?)"
    );
    let possibly_sent = attempts["possibly_sent"].as_u64().unwrap();
    if l.unanswered_is_possibly_sent {
        assert!(
            possibly_sent > 0,
            "{kind}: 5 s of swallowed answers ended no attempt possibly_sent: {attempts}"
        );
    } else {
        assert_eq!(possibly_sent, 0, "{kind}: {attempts}");
    }
    let Ran {
        output: o, report, ..
    } = drill_of(kind, &[("DRILL_TEST_ENGINE_AROUND_PROXY", "1")]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{kind} around the proxy: {}",
        show(&o)
    );
    assert_eq!(report["verdict"], "fail", "{kind} around the proxy");
    let headline = report["headline"].as_str().unwrap_or_default();
    assert!(
        headline.starts_with("Inconclusive: ") && headline.contains("bypassed"),
        "{kind} around the proxy: {headline}"
    );
}

/// The failure the contract drill prevents: an MQTT engine whose probe carries the oldest
/// waiting record (`probe-with-oldest-record`) leaves a copy without its write key at every
/// reconnect after a refusal, and the same drill fails on it.
#[test]
fn a_probe_that_carries_a_record_fails_the_contract_drill() {
    let Ran {
        output: o, report, ..
    } = drill_of("mqtt", &[("DRILL_MUTANT", "probe-with-oldest-record")]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let ledger = &report["ledger"];
    let extra = ledger["duplicates_beyond_promise"].as_u64().unwrap()
        + ledger["unexpected"].as_u64().unwrap();
    assert!(extra > 0, "{ledger}");
}

#[test]
fn every_kind_has_a_contract_line() {
    let kinds: Vec<&str> = drill::dest::Kind::ALL.iter().map(|k| k.name()).collect();
    let lines: Vec<&str> = LINES.iter().map(|l| l.kind).collect();
    assert_eq!(
        kinds, lines,
        "a line per kind, in the order of the kinds! list"
    );
}

#[test]
fn mqtt_keeps_the_kind_contract() {
    keeps_the_contract("mqtt");
}

#[test]
fn nats_keeps_the_kind_contract() {
    keeps_the_contract("nats");
}

#[test]
fn kafka_keeps_the_kind_contract() {
    keeps_the_contract("kafka");
}

#[test]
fn http_keeps_the_kind_contract() {
    keeps_the_contract("http");
}

#[test]
fn amqp_keeps_the_kind_contract() {
    keeps_the_contract("amqp");
}

#[test]
fn postgres_keeps_the_kind_contract() {
    keeps_the_contract("postgres");
}

#[test]
fn syslog_keeps_the_kind_contract() {
    keeps_the_contract("syslog");
}
