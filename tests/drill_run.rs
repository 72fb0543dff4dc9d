//! `drill run` end to end, through the real binary: a real broker (mosquitto when installed,
//! else the embedded one), the real proxy, the engine as a child process, the real verifier.
//! The catalogue's `ci` drills themselves (engine-crash, mqtt-flapping, nats-cluster-node-loss,
//! …) run in tests/catalogue.rs, as the correct engine's row of `drill selftest --tag ci`.

use std::path::Path;
use std::process::Command;

use crate::common::run::{Ran, drill, have_local_image, run_drill, run_drill_with, scenario, show};

#[test]
fn a_misspelled_field_exits_2_naming_file_line_column_and_field_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "typo",
        "name: typo\n\
         destination: { kind: mqtt }\n\
         workload: { rate: 100/s, duration: 5s }\n\
         faults:\n  - { at: 1s, link: mqtt, falt: swallow }\n",
    );
    let out = dir.path().join("out");
    let o = &drill(&["run", &file, "--out", &out.display().to_string()]);
    assert_eq!(o.status.code(), Some(2), "{}", show(o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&format!("{file}:5:")), "{stderr}");
    assert!(stderr.contains("falt"), "{stderr}");
    assert!(o.stdout.is_empty(), "nothing started: {}", show(o));
    assert!(!out.exists(), "no report folder for an invalid plan");

    let bad_rate = scenario(
        dir.path(),
        "rate",
        "name: rate\ndestination: { kind: mqtt }\nworkload: { rate: -3/s, duration: 5s }\n",
    );
    let o = &drill(&["run", &bad_rate]);
    assert_eq!(o.status.code(), Some(2), "{}", show(o));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("{bad_rate}:3:")));
}

#[test]
fn records_really_lost_fail_the_drill_with_the_exact_count() {
    // The link refuses from the start, so nothing can be delivered. All 200 records are
    // acknowledged by 2 s; at 3 s the engine is SIGKILLed and its data directory removed, then
    // it restarts empty. Exactly those 200 acknowledged records are gone.
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "wiped",
        "name: wiped\n\
         destination: { kind: mqtt, topic: t/wiped }\n\
         workload: { rate: 100/s, duration: 2s, keys: 4 }\n\
         faults:\n\
         \x20 - { at: 0s, link: mqtt, fault: refuse, for: 5s }\n\
         \x20 - { at: 3s, target: engine, action: kill, restart_after: 1s, wipe_data: true, after_workload: true }\n\
         expect: { lost: 0, ledger: closes }\n\
         drain_timeout: 20s\n",
    );
    let ran = run_drill(&file, "wiped", &[]);
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(1), "{}", show(o));
    assert_eq!(r["verdict"], "fail");
    assert_eq!(r["ledger"]["held"], 200, "{r:#}");
    assert_eq!(r["ledger"]["delivered"], 0, "{r:#}");
    assert_eq!(r["ledger"]["lost"], 200, "{r:#}");
    assert_eq!(r["closes"], false);
    assert_eq!(
        r["headline"], "Ledger does not close; 200 records lost.",
        "failed expectations first, then what was lost"
    );
    let md = &ran.markdown;
    assert!(
        md.contains("200 held = 0 delivered + 0 waiting + 0 failed + 200 lost"),
        "{md}"
    );
    assert!(md.contains("does not close"), "{md}");
}

#[test]
fn a_sigkill_during_a_swallow_loses_nothing_the_engine_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "crash",
        "name: crash\n\
         destination: { kind: mqtt, topic: t/crash }\n\
         workload: { rate: 100/s, duration: 10s, keys: 4 }\n\
         faults:\n\
         \x20 - { at: 2s, link: mqtt, fault: swallow, for: 5s }\n\
         \x20 - { at: 4s, target: engine, action: kill, restart_after: 1s }\n\
         expect: { lost: 0, duplicates: 0, reordered: 0, ledger: closes, recovery_within: 5s }\n",
    );
    let ran = run_drill(&file, "crash", &[]);
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    assert_eq!(r["ledger"]["lost"], 0);
    assert_eq!(r["closes"], true);
    // Ingests refused while the engine was down are not held: held < 1000 is expected.
    let held = r["ledger"]["held"].as_u64().unwrap();
    assert!(held > 800 && held < 1000, "held {held}");
    assert_eq!(r["ledger"]["delivered"], held);
}

#[test]
fn the_quickstart_scenario_passes() {
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quickstart.yaml");
    let ran = run_drill(quickstart, "quickstart", &[]);
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    assert_eq!(r["verdict"], "pass");
    assert_eq!(r["ledger"]["held"], 6000);
    assert_eq!(r["ledger"]["delivered"], 6000);
    assert_eq!(r["ledger"]["lost"], 0);
    assert_eq!(r["ledger"]["duplicates_beyond_promise"], 0);
    assert_eq!(r["closes"], true);
    assert!(ran.markdown.contains("Nothing lost."), "{}", ran.markdown);
}

#[test]
fn the_embedded_broker_carries_a_drill() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "embedded",
        "name: embedded\n\
         destination: { kind: mqtt, topic: t/embedded }\n\
         workload: { rate: 100/s, duration: 8s, keys: 4 }\n\
         faults:\n\
         \x20 - { at: 2s, link: mqtt, fault: swallow, for: 4s }\n\
         expect: { lost: 0, duplicates: 0, reordered: 0, ledger: closes, recovery_within: 5s }\n",
    );
    let ran = run_drill(&file, "embedded", &["--runtime", "embedded"]);
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    assert_eq!(r["runtime"], "embedded");
    assert_eq!(r["ledger"]["delivered"], 800);
    assert_eq!(r["closes"], true);
}

/// The embedded broker is not lenient: an engine that drops what waited through a refused
/// window (the mutant `expire-by-age`) fails on it, with every dropped record counted lost.
#[cfg(feature = "mutants")]
#[test]
fn a_lossy_engine_fails_on_the_embedded_broker_with_its_losses_counted() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "embedded-lossy",
        "name: embedded-lossy\n\
         destination: { kind: mqtt, topic: t/embedded-lossy }\n\
         workload: { rate: 100/s, duration: 12s, keys: 4 }\n\
         faults:\n\
         \x20 - { at: 2s, link: mqtt, fault: refuse, for: 8s }\n\
         expect: { lost: 0, ledger: closes }\n",
    );
    let ran = run_drill_with(
        &file,
        "embedded-lossy",
        &["--runtime", "embedded"],
        &[("DRILL_MUTANT", "expire-by-age")],
    );
    let (o, r) = (&ran.output, &ran.report);
    let l = &r["ledger"];
    println!(
        "expire-by-age on the embedded broker: exit {:?}; held {}, delivered {}, lost {}",
        o.status.code(),
        l["held"],
        l["delivered"],
        l["lost"]
    );
    assert_eq!(o.status.code(), Some(1), "{}\n{r:#}", show(o));
    assert_eq!(r["runtime"], "embedded");
    let (held, delivered, lost) = (
        l["held"].as_u64().unwrap(),
        l["delivered"].as_u64().unwrap(),
        l["lost"].as_u64().unwrap(),
    );
    assert_eq!(held, 1200, "{r:#}");
    // Records accepted more than 5 s into an 8 s refusal are dropped: about 300 of them.
    assert!(lost >= 100, "{r:#}");
    assert_eq!(
        held,
        delivered + lost,
        "every record is delivered or counted lost: {r:#}"
    );
}

#[test]
fn a_runtime_that_cannot_start_exits_3_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "nocontainer",
        "name: nocontainer\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 1s }\n",
    );
    let ran = run_drill_with(
        &file,
        "nocontainer",
        &["--runtime", "container"],
        &[("DOCKER_HOST", NO_DAEMON)],
    );
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(3), "{}", show(o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("container runtime"), "{stderr}");
    assert!(stderr.contains("no Docker engine"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// A Docker endpoint where nothing answers.
const NO_DAEMON: &str = "unix:///nonexistent/drill-no-docker.sock";

#[test]
fn auto_without_a_docker_engine_falls_back_and_says_why_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "fallback",
        "name: fallback\ndestination: { kind: mqtt }\nworkload: { rate: 20/s, duration: 2s }\n",
    );
    let ran = run_drill_with(&file, "fallback", &[], &[("DOCKER_HOST", NO_DAEMON)]);
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(0), "{}", show(o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("Docker") || l.contains("runtime auto"))
        .collect();
    assert_eq!(said.len(), 1, "{stdout}");
    assert!(
        said[0].contains("runtime auto: using local mosquitto, because no Docker engine answers"),
        "{stdout}"
    );
    assert_ne!(ran.report["runtime"], "container");
}

/// The local images `ci/images.sh` builds, when a Docker engine answers and they are there.
fn local_images() -> Option<Vec<(&'static str, &'static str)>> {
    let images = [
        ("DRILL_IMAGE_MQTT", "drill-local/mosquitto"),
        ("DRILL_IMAGE_NATS", "drill-local/nats"),
        ("DRILL_IMAGE_KAFKA", "drill-local/kafka"),
    ];
    if !images.iter().all(|(_, image)| have_local_image(image)) {
        return None;
    }
    Some(images.to_vec())
}

fn no_drill_containers(run: &str) -> bool {
    let o = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=drill.run={run}")])
        .output()
        .unwrap();
    o.stdout.is_empty()
}

#[test]
fn the_quickstart_runs_in_a_container() {
    let Some(images) = local_images() else { return };
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quickstart.yaml");
    let ran = run_drill_with(scenario, "quickstart", &["--runtime", "container"], &images);
    assert_clean_pass_allowing_promised_copies(&ran);
    assert_eq!(ran.report["runtime"], "container");
    assert!(
        ran.report["versions"]["broker"]
            .as_str()
            .unwrap_or("")
            .contains("drill-local/mosquitto (image "),
        "{:#}",
        ran.report["versions"]
    );
    assert!(no_drill_containers("quickstart-7"));
}

/// Brokers in containers speak TLS too: the drill's certificates are copied in (the key of
/// mode 0600), mosquitto gets a TLS listener and nats-server its TLS flags, and readiness is
/// checked over TLS. A wrong certificate on MQTT, mutual TLS on JetStream with a half-open
/// link, and Kafka over TLS ended at the links: all pass, nothing left behind.
#[test]
fn brokers_in_containers_speak_tls() {
    let Some(images) = local_images() else { return };
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/mqtt-tls-bad-certificate.yaml"
    );
    let ran = run_drill_with(
        scenario,
        "mqtt-tls-bad-certificate",
        &["--runtime", "container"],
        &images,
    );
    ran.say("mqtt-tls-bad-certificate in a container");
    ran.assert_passed();
    assert_eq!(ran.report["runtime"], "container");
    assert!(no_drill_containers("mqtt-tls-bad-certificate-61"));

    let dir = tempfile::tempdir().unwrap();
    let file = crate::common::run::scenario(
        dir.path(),
        "nats-tls-container",
        "name: nats-tls-container\nseed: 5\ndestination: { kind: nats, runtime: container, topic: drill.tlsc, tls: { client_certificates: true } }\nsystem: { builtin: { keepalive: 1s, answer_timeout: 2s } }\nworkload: { rate: 100/s, duration: 12s, keys: 2 }\nfaults:\n  - { at: 3s, link: nats, fault: swallow, direction: downstream, for: 4s }\nexpect: { lost: 0, duplicates: 0, ledger: closes, recovery_within: 10s }\n",
    );
    let ran = run_drill_with(&file, "nats-tls-container", &[], &images);
    ran.say("JetStream over mutual TLS in a container");
    ran.assert_passed();
    assert_eq!(ran.report["runtime"], "container");
    assert!(ran.markdown.contains("asks every client for a certificate"));
    assert!(no_drill_containers("nats-tls-container-5"));
    // Kafka in a container serves no TLS either: the links end it in front.
    if cfg!(feature = "kafka-tls") {
        let scenario = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/kafka-tls-terminate.yaml"
        );
        let ran = run_drill_with(
            scenario,
            "kafka-tls-terminate",
            &["--runtime", "container"],
            &images,
        );
        ran.say("kafka-tls-terminate in a container");
        ran.assert_passed();
        assert_eq!(ran.report["runtime"], "container");
        assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
        assert!(no_drill_containers("kafka-tls-terminate-67"));
    }
}

#[test]
fn the_kafka_half_open_drill_runs_in_a_container() {
    let Some(images) = local_images() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = shortened(
        dir.path(),
        "scenarios/kafka-half-open.yaml",
        KAFKA_HALF_OPEN_SHORT,
    );
    let ran = run_drill_with(
        &file,
        "kafka-half-open",
        &["--runtime", "container"],
        &images,
    );
    assert_clean_pass(&ran);
    assert_eq!(ran.report["runtime"], "container");
    assert!(no_drill_containers("kafka-half-open-22"));
}

#[test]
fn the_nats_half_open_scenario_leaves_one_copy_of_each_record() {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/nats-half-open.yaml");
    let ran = run_drill(scenario, "nats-half-open", &[]);
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    let l = &r["ledger"];
    assert_eq!(l["lost"], 0);
    assert_eq!(l["duplicates"], 0, "effectively_once: not one extra copy");
    assert_eq!(r["closes"], true);
    assert!(l["held"].as_u64().unwrap_or(0) > 10_000);
    // The swallow bit: answers were discarded, and the attempts they belonged to ended
    // possibly_sent (the stream's duplicate window then kept the resends to one copy).
    assert_the_swallow_bit(r, true);
    for rec in r["recovery"].as_array().unwrap() {
        let heal = rec["heal_ms"].as_u64().unwrap();
        let first = rec["first_delivery_ms"].as_u64().unwrap_or(u64::MAX);
        assert!(first.saturating_sub(heal) <= 5000, "{rec}");
    }
}

#[test]
fn the_poison_record_scenario_sets_one_record_aside() {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/poison-record.yaml");
    let ran = run_drill(scenario, "poison-record", &[]);
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    let l = &r["ledger"];
    assert_eq!(
        (l["held"].as_u64(), l["delivered"].as_u64()),
        (Some(3000), Some(2999))
    );
    assert_eq!(
        (
            l["waiting"].as_u64(),
            l["failed"].as_u64(),
            l["lost"].as_u64()
        ),
        (Some(0), Some(1), Some(0))
    );
    assert_eq!(r["closes"], true);
    assert_eq!(r["attempts"]["refused"], 10);
    assert!(
        ran.markdown
            .contains("3000 held = 2999 delivered + 0 waiting + 1 failed + 0 lost")
    );
}

/// A scenario file with some of its durations replaced (each must be there), written to `dir`
/// under the same name: how CI runs the long drills, ten times shorter.
fn shortened(dir: &Path, file: &str, swaps: &[(&str, &str)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in swaps {
        assert!(text.contains(from), "{file} has no `{from}`");
        text = text.replacen(from, to, 1);
    }
    let target = dir.join(path.file_name().unwrap());
    std::fs::write(&target, text).unwrap();
    target.display().to_string()
}

fn assert_clean_pass(ran: &Ran) {
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    let l = &r["ledger"];
    assert_eq!(l["lost"], 0);
    assert_eq!(l["duplicates"], 0);
    assert_eq!(r["closes"], true);
    for rec in r["recovery"].as_array().unwrap() {
        let heal = rec["heal_ms"].as_u64().unwrap();
        let first = rec["first_delivery_ms"].as_u64().unwrap_or(u64::MAX);
        assert!(first.saturating_sub(heal) <= 5000, "{rec}");
    }
}

const KAFKA_HALF_OPEN_SHORT: &[(&str, &str)] = &[
    ("duration: 260s", "duration: 26s"),
    ("at: 40s", "at: 4s"),
    ("for: 180s", "for: 18s"),
];

#[test]
fn the_kafka_cut_scenario_ten_times_shorter_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = shortened(
        dir.path(),
        "scenarios/kafka-cut.yaml",
        &[
            ("duration: 200s", "duration: 20s"),
            ("at: 40s", "at: 4s"),
            ("for: 120s", "for: 12s"),
        ],
    );
    assert_clean_pass(&run_drill(&file, "kafka-cut", &[]));
}

#[test]
fn the_kafka_half_open_scenario_ten_times_shorter_loses_nothing_and_copies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = shortened(
        dir.path(),
        "scenarios/kafka-half-open.yaml",
        KAFKA_HALF_OPEN_SHORT,
    );
    let ran = run_drill(&file, "kafka-half-open", &[]);
    assert_clean_pass(&ran);
    // librdkafka keeps an unanswered batch open and retries it itself under the same producer
    // id, so the engine's attempts need not end possibly_sent: the link's count shows the bite.
    assert_the_swallow_bit(&ran.report, false);
}

/// A half-open drill proves something only when its swallow met the engine's traffic: the
/// link discarded answers (bytes swallowed downstream), and, where the engine's own attempts
/// show it (`possibly_sent`: the built-in engine's MQTT and JetStream sessions), attempts
/// ended with no answer.
fn assert_the_swallow_bit(r: &serde_json::Value, possibly_sent: bool) {
    let swallowed = r["link"]["bytes_swallowed_downstream"]
        .as_u64()
        .unwrap_or(0);
    let open = r["attempts"]["possibly_sent"].as_u64().unwrap_or(0);
    println!("the swallow: {swallowed} bytes of answers discarded, {open} attempts possibly_sent");
    assert!(swallowed > 0, "the swallow discarded no answer: {r:#}");
    if possibly_sent {
        assert!(open > 0, "no attempt ended possibly_sent: {r:#}");
    }
}

/// The check is real: the same (shortened) half-open drill against a deliberately naive Kafka
/// output — the mutant `resend-on-timer`: no idempotence, an unanswered record put on the wire
/// again every second — must fail, with the copies counted. Only in test builds
/// (`--features mutants`).
#[cfg(feature = "mutants")]
#[test]
fn a_naive_engine_fails_the_kafka_half_open_drill_with_extra_copies() {
    let dir = tempfile::tempdir().unwrap();
    let file = shortened(
        dir.path(),
        "scenarios/kafka-half-open.yaml",
        KAFKA_HALF_OPEN_SHORT,
    );
    let ran = run_drill_with(
        &file,
        "kafka-half-open",
        &[],
        &[("DRILL_MUTANT", "resend-on-timer")],
    );
    let (o, r) = (&ran.output, &ran.report);
    let l = &r["ledger"];
    println!(
        "naive engine: exit {:?}; lost {}, duplicates {} ({} beyond at_least_once)",
        o.status.code(),
        l["lost"],
        l["duplicates"],
        l["duplicates_beyond_promise"]
    );
    assert_eq!(o.status.code(), Some(1), "{}\n{r:#}", show(o));
    // Extra copies, nothing lost: what the mutant does, and only that.
    assert_eq!(l["lost"].as_u64(), Some(0), "{r:#}");
    let beyond = l["duplicates_beyond_promise"].as_u64().unwrap();
    assert!(beyond > 0, "{r:#}");
}

/// Like [`assert_clean_pass`], for drills whose promise allows copies with the write key.
fn assert_clean_pass_allowing_promised_copies(ran: &Ran) {
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    assert_eq!(r["ledger"]["lost"], 0);
    assert_eq!(r["ledger"]["duplicates_beyond_promise"], 0);
    assert_eq!(r["closes"], true);
}

#[test]
fn a_broker_container_killed_restarted_paused_and_resumed_loses_nothing() {
    let Some(images) = local_images() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "broker-faults",
        "name: broker-faults\n\
         destination: { kind: nats, topic: drill.bf }\n\
         system: { builtin: { keepalive: 1s, answer_timeout: 2s } }\n\
         workload: { rate: 100/s, duration: 24s, keys: 4 }\n\
         faults:\n\
         \x20 - { at: 4s, target: broker, action: kill, restart_after: 4s }\n\
         \x20 - { at: 14s, target: broker, action: pause, restart_after: 4s }\n\
         expect: { lost: 0, duplicates: 0, reordered: 0, ledger: closes, recovery_within: 5s }\n",
    );
    let ran = run_drill_with(&file, "broker-faults", &["--runtime", "container"], &images);
    assert_clean_pass(&ran);
    let faults: Vec<String> = ran.report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{} {}", f["target"], f["fault"]))
        .collect();
    println!("broker faults: {faults:?}");
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert!(no_drill_containers("broker-faults-1"));
}

#[test]
fn broker_faults_without_containers_or_a_cluster_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "nobrokerfaults",
        "name: nobrokerfaults\ndestination: { kind: nats }\nworkload: { rate: 10/s, duration: 2s }\nfaults:\n  - { at: 1s, target: broker, action: pause, restart_after: 1s }\n",
    );
    let ran = run_drill(&file, "nobrokerfaults", &["--runtime", "process"]);
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(3), "{}", show(o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("broker faults need the container runtime"),
        "{stderr}"
    );
}

/// A power cut needs the power-cut filesystem (FUSE). Where it cannot be mounted the drill
/// exits 3 with one line saying so — never a drill that cut nothing and passed.
#[cfg(feature = "test-hooks")]
#[test]
fn a_power_cut_without_fuse_exits_3_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "nofuse",
        "name: nofuse\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 3s }\nfaults:\n  - { at: 1s, target: engine, action: power_cut, restart_after: 1s }\n",
    );
    let out = dir.path().join("out");
    let o = crate::common::run::drill_with(
        &["run", &file, "--out", out.to_str().unwrap()],
        &[("DRILL_TEST_NO_FUSE", "1")],
    );
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("power-cut filesystem (FUSE)"), "{stderr}");
    assert!(
        !out.join("nofuse/report.json").exists(),
        "no verdict without the fault"
    );
}

/// A crash point whose operation never comes (no file of that name) cut nothing: the drill is
/// inconclusive (exit 1) and says which point was never reached — never a pass. Needs FUSE and
/// root, as every power cut: under CI their absence fails the test.
#[test]
fn a_crash_point_never_reached_makes_the_drill_inconclusive() {
    if !Path::new("/dev/fuse").exists() || !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "a power cut needs /dev/fuse and root, which CI has"
        );
        eprintln!("skipped: needs /dev/fuse and root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "nocrash",
        "name: nocrash\ndestination: { kind: mqtt }\nworkload: { rate: 20/s, duration: 4s }\nfaults:\n  - { at: 1s, target: engine, action: power_cut, crash_at: { op: fdatasync, path: no-such-file }, restart_after: 1s }\n",
    );
    let ran = run_drill(&file, "nocrash", &["--runtime", "process"]);
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(1), "{}", show(o));
    let why = ran.report["inconclusive"].to_string();
    assert!(
        why.contains("its crash point (fdatasync #1 on no-such-file) was never reached"),
        "{why}"
    );
}

/// A fault that did not happen proves nothing: a second SIGKILL while the engine is still down
/// from the first strikes no process, and the drill is inconclusive, saying so.
#[test]
fn a_kill_of_an_engine_already_down_makes_the_drill_inconclusive() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "deadkill",
        "name: deadkill\ndestination: { kind: mqtt, topic: t/deadkill }\nworkload: { rate: 50/s, duration: 6s }\nfaults:\n  - { at: 2s, target: engine, action: kill, restart_after: 3s }\n  - { at: 3s, target: engine, action: kill, restart_after: 1s }\n",
    );
    let ran = run_drill(&file, "deadkill", &["--runtime", "process"]);
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(1), "{}", show(o));
    let why = ran.report["inconclusive"].to_string();
    assert!(
        why.contains("the fault at 3.0 s (engine kill (SIGKILL)) found no target: the engine was already down"),
        "{why}"
    );
    assert_eq!(ran.report["ledger"]["lost"], 0, "{}", ran.markdown);
}

/// A link condition the link did not take (test builds: `DRILL_TEST_LINKS_REFUSE_CONDITIONS`,
/// as a condition the proxy refuses would be) proves nothing: the drill is inconclusive (exit
/// 1), saying which fault and why, and the records that flowed untouched are not a pass.
#[cfg(feature = "test-hooks")]
#[test]
fn a_link_condition_not_applied_makes_the_drill_inconclusive() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "notapplied",
        "name: notapplied\ndestination: { kind: mqtt, topic: t/notapplied }\nworkload: { rate: 50/s, duration: 6s }\nfaults:\n  - { at: 2s, link: mqtt, fault: swallow, for: 2s }\n",
    );
    let ran = run_drill_with(
        &file,
        "notapplied",
        &["--runtime", "process"],
        &[("DRILL_TEST_LINKS_REFUSE_CONDITIONS", "1")],
    );
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(1), "{}", show(o));
    let why = ran.report["inconclusive"].to_string();
    assert!(
        why.contains("the fault at 2.0 s (link mqtt swallow")
            && why.contains("found no target: the link could not apply it"),
        "{why}"
    );
    // Nothing was swallowed: the records flowed as if no fault had been scripted.
    assert_eq!(ran.number(&["link", "bytes_swallowed_upstream"]), 0);
    assert_eq!(ran.report["ledger"]["lost"], 0, "{}", ran.markdown);
}

/// A stranded Kafka connection (silent for good, never reset): the built-in engine's producer
/// must notice within its answer timeout and deliver again. It did not before librdkafka's
/// `socket.timeout.ms` was set to the answer timeout (no delivery for 36 s, 1,601 waiting).
#[test]
fn a_stranded_kafka_connection_is_noticed_within_the_answer_timeout() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/kafka-strand.yaml");
    let ran = run_drill(file.to_str().unwrap(), "kafka-strand", &[]);
    assert_clean_pass(&ran);
}

/// Faults that overlap on one link stack (docs/src/design.md#3-fault-vocabulary): a swallow and a
/// rate in the middle of a delay, each ending on its own — the delay holds until its own end, and
/// the drill says so at each heal. Before, the second fault replaced the first and the first heal
/// ended both.
#[test]
fn overlapping_faults_on_one_link_stack_and_end_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "stacked",
        "name: stacked\nseed: 3\ndestination: { kind: mqtt, runtime: auto, topic: drill/stacked }\n\
         workload: { rate: 50/s, duration: 16s, keys: 4 }\n\
         faults:\n\
         \x20 - { at: 3s, link: mqtt, fault: delay, latency: 150ms, for: 10s }\n\
         \x20 - { at: 4s, link: mqtt, fault: throttle, direction: upstream, bytes_per_s: 20000, for: 6s }\n\
         \x20 - { at: 5s, link: mqtt, fault: swallow, direction: downstream, for: 3s }\n\
         expect: { lost: 0, ledger: closes }\n",
    );
    let ran = run_drill(&file, "stacked", &[]);
    ran.say("stacked");
    let said = String::from_utf8_lossy(&ran.output.stdout);
    for line in [
        "heal: link mqtt (delay 150ms both, throttle 20000 B/s upstream still in force)",
        "heal: link mqtt (delay 150ms both still in force)",
    ] {
        assert!(said.contains(line), "no `{line}` in\n{said}");
    }
    assert_eq!(said.matches("heal: link mqtt").count(), 3, "{said}");
    ran.assert_passed();
}
