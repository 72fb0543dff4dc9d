//! A drill cannot pass by accident, end to end: a fault that meets no traffic, and an engine
//! that reaches the broker around the proxy, each make the drill inconclusive (exit 1), and the
//! headline says why.

use crate::common::run::{Ran, run_scenario, show};

#[test]
fn an_engine_that_goes_around_the_proxy_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    // A forwarder configured with the broker's own address (read from the broker's config in
    // drill's work folder), not the link: the refusal on the link cannot touch it.
    let text = format!(
        r#"name: bypass
destination: {{ kind: mqtt, runtime: process, topic: drill/bypass }}
system:
  command: [sh, -c, "port=$(awk '/^listener/ {{{{print $2}}}}' {{work_dir}}/mosquitto/mosquitto.conf); exec python3 {}/fixtures/forwarder.py --ingest-kind http --ingest {{ingest}} --mqtt 127.0.0.1:$port --topic {{topic}} --data {{data_dir}}"]
  ingest: {{ kind: http }}
  ready: {{ http: /health }}
  stats: {{ path: /stats }}
workload: {{ rate: 50/s, duration: 12s }}
faults:
  - {{ at: 3s, link: mqtt, fault: refuse, for: 6s }}
expect: {{ lost: 0, duplicates: 0 }}
"#,
        env!("CARGO_MANIFEST_DIR")
    );
    let Ran {
        output: o, report, ..
    } = run_scenario(dir.path(), "bypass", &text);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(report["verdict"], "fail");
    assert_eq!(
        report["ledger"]["lost"], 0,
        "nothing lost: only the bypass fails it"
    );
    let headline = report["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("Inconclusive: the engine's traffic bypassed link mqtt"),
        "{headline}"
    );
}

#[test]
fn a_fault_after_the_workload_is_invalid_unless_said_and_then_inconclusive() {
    let dir = tempfile::tempdir().unwrap();
    let text = |extra: &str| {
        format!(
            "name: late\ndestination: {{ kind: mqtt, runtime: process, topic: drill/late }}\nworkload: {{ rate: 20/s, duration: 4s }}\nfaults:\n  - {{ at: 6s, link: mqtt, fault: swallow, for: 2s{extra} }}\ndrain_timeout: 10s\n"
        )
    };
    // As a new user would write it: refused at parse time, with the place.
    let Ran { output: o, .. } = run_scenario(dir.path(), "late", &text(""));
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("late.yaml:5:5: field `faults[0].at`"), "{err}");
    assert!(err.contains("after_workload: true"), "{err}");
    // Said on purpose: it runs, meets nothing (everything was delivered long before), and the
    // drill is inconclusive instead of "PASS — nothing lost".
    let Ran {
        output: o, report, ..
    } = run_scenario(dir.path(), "late", &text(", after_workload: true"));
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(report["ledger"]["lost"], 0);
    let headline = report["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("Inconclusive: the fault at 6.0 s (link mqtt swallow) met no traffic"),
        "{headline}"
    );
}

/// Kafka's arrival times are the producer's, so a bypass cannot be seen by time; the links' tap
/// sees it: an engine (drill's own, run as a user's engine) given the broker's own address
/// instead of the link delivers through a refused link, and the drill is inconclusive.
#[tokio::test]
async fn a_kafka_engine_that_goes_around_the_proxy_is_caught_by_the_tap() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = drill::dest::kafka::broker::start_kafka(dir.path(), None, None)
        .await
        .expect("tansu is installed (ci/setup.sh)");
    let own = broker.addr;
    std::fs::write(
        dir.path().join("engine.yaml.tmpl"),
        format!(
            "listen: \"{{ingest}}\"\ndata_dir: \"{{data_dir}}\"\noutputs:\n  - {{{{ name: out, kind: kafka, address: \"{own}\", topic: bypass }}}}\n"
        ),
    )
    .unwrap();
    let text = format!(
        r#"name: kafka-bypass
destination: {{ kind: kafka, runtime: external, bootstrap: ["{own}"], topic: bypass, create: true }}
system:
  command: [drill, engine, --config, "{{work_dir}}/engine.yaml"]
  files: {{ engine.yaml: engine.yaml.tmpl }}
  ingest: {{ kind: http, path: /ingest }}
  ready: {{ http: /stats }}
  stats: {{ path: /stats }}
  write_key: {{ kafka_header: write-key }}
  promise: at_least_once
workload: {{ rate: 50/s, duration: 12s }}
faults:
  - {{ at: 3s, link: kafka, fault: refuse, for: 6s }}
expect: {{ lost: 0, duplicates: 0 }}
"#
    );
    let path = dir.path().to_path_buf();
    let Ran {
        output: o, report, ..
    } = tokio::task::spawn_blocking(move || run_scenario(&path, "kafka-bypass", &text))
        .await
        .unwrap();
    broker.stop().await;
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(report["ledger"]["lost"], 0, "only the bypass fails it");
    let why = report["inconclusive"].as_array().unwrap();
    assert!(
        why.iter().any(|w| w
            .as_str()
            .unwrap_or("")
            .contains("records reached the destination without crossing the link")),
        "{why:?}"
    );
}
