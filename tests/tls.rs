//! TLS end to end (issue: links complete): brokers drill starts speak TLS with a CA minted for
//! the drill, the links pass the ciphertext, the built-in engine and drill's readers speak
//! TLS, and a user's engine gets the files as placeholders. Each drill must be able to fail:
//! an engine that speaks plain MQTT to the TLS broker delivers nothing. (`bad_certificate`
//! and the mutant that counts a failed handshake as a refusal are in the `ci` selftest:
//! `scenarios/mqtt-tls-bad-certificate.yaml`, tests/catalogue.rs.)

use crate::common::run::{catalogue_drill_passes, run_drill, scenario};

#[test]
fn mqtt_over_tls_rides_half_open_refused_hung_and_stranded_links() {
    if !crate::common::run::have_mosquitto() {
        return;
    }
    let ran = catalogue_drill_passes("mqtt-tls-half-open");
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert!(
        ran.markdown.contains("TLS: the broker speaks only TLS")
            && ran
                .markdown
                .contains("the links pass TLS untouched, so their protocol tap cannot read it"),
        "{}",
        ran.markdown
    );
    // Every fault met the TLS traffic (the verdict would be inconclusive otherwise), and the
    // half-open stretch made unanswered attempts that were resent.
    assert!(
        ran.number(&["attempts", "possibly_sent"]) > 0,
        "{:#}",
        ran.report
    );
}

#[test]
fn jetstream_over_mutual_tls_rides_every_cut() {
    if !crate::common::run::have_nats_server() {
        return;
    }
    let ran = catalogue_drill_passes("nats-tls-cut");
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
    assert!(
        ran.markdown.contains("asks every client for a certificate"),
        "{}",
        ran.markdown
    );
}

/// Links that terminate TLS (`tls: { links: terminate }`): the engine's TLS ends at the link,
/// and the link speaks TLS again to mosquitto. The MQTT tap reads the plaintext between, so a
/// loss says where each record was last seen, as on a plain link. The correct engine passes
/// every fault (bad_certificate included); the memory-only mutant, killed while records wait,
/// loses them and the tap names them as never having left the engine.
#[test]
fn terminating_links_let_the_tap_read_tls_and_every_fault_still_bites() {
    if !crate::common::run::have_mosquitto() {
        return;
    }
    let ran = catalogue_drill_passes("mqtt-tls-terminate");
    assert!(
        ran.markdown.contains("the links terminate TLS"),
        "{}",
        ran.markdown
    );
    assert!(
        !ran.markdown.contains("cannot read it"),
        "the tap reads a terminating link: {}",
        ran.markdown
    );
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
    assert!(
        ran.number(&["attempts", "possibly_sent"]) > 0,
        "{:#}",
        ran.report
    );
    if !cfg!(feature = "mutants") {
        return;
    }
    let ran = crate::common::run::catalogue_drill_fails_mutant("mqtt-tls-terminate", "memory-only");
    let lost = ran.number(&["ledger", "lost"]);
    assert!(lost > 0, "{:#}", ran.report);
    let seen = &ran.report["lost_last_seen"];
    let class = |c: &str| seen[c]["count"].as_u64().unwrap();
    assert_eq!(
        class("never_left") + class("no_answer") + class("broker_lost"),
        lost,
        "{seen:#}"
    );
    assert!(class("never_left") > 0, "the tap saw them stay: {seen:#}");
}

/// Kafka over TLS: tansu serves none, so the links end the engine's mutual TLS and speak plain
/// Kafka to it. The Kafka-aware link rewrites broker addresses in the plaintext (to broker
/// links that terminate TLS too), and every fault bites: the correct engine passes; an engine
/// that resends on a timer without the idempotent producer makes copies, counted.
#[cfg(feature = "kafka-tls")]
#[test]
fn kafka_over_links_that_terminate_tls_passes_and_a_timer_resending_engine_fails() {
    let ran = catalogue_drill_passes("kafka-tls-terminate");
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
    assert!(
        ran.markdown
            .contains("the broker serves no TLS, so the links speak plain to it"),
        "{}",
        ran.markdown
    );
    assert!(
        ran.markdown.contains("answers rewritten"),
        "{}",
        ran.markdown
    );
    if !cfg!(feature = "mutants") {
        return;
    }
    let ran =
        crate::common::run::catalogue_drill_fails_mutant("kafka-tls-terminate", "resend-on-timer");
    assert!(
        ran.number(&["ledger", "duplicates"]) > 0,
        "{:#}",
        ran.report
    );
    assert_eq!(ran.number(&["ledger", "lost"]), 0, "{:#}", ran.report);
}

/// `bad_certificate` with `certificate: expired`: the broker's own certificate, from the right
/// CA, expired. The correct engine holds and passes; the engine that counts a failed handshake
/// as a refusal sets records aside as failed (155 of 1400 here; its journal names the expiry:
/// "invalid peer certificate: certificate expired").
#[test]
fn an_expired_certificate_is_no_refusal_and_the_engine_that_counts_it_fails() {
    if !crate::common::run::have_mosquitto() {
        return;
    }
    let ran = catalogue_drill_passes("mqtt-tls-expired-certificate");
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
    if !cfg!(feature = "mutants") {
        return;
    }
    let ran = crate::common::run::catalogue_drill_fails_mutant(
        "mqtt-tls-expired-certificate",
        "handshake-failure-is-refusal",
    );
    assert!(ran.number(&["ledger", "failed"]) > 0, "{:#}", ran.report);
}

/// A short MQTT drill over mutual TLS whose engine is `drill engine` with `template`.
fn users_engine(name: &str, template: &str) -> String {
    format!(
        r#"name: {name}
destination: {{ kind: mqtt, topic: drill/{name}, tls: {{ client_certificates: true }} }}
system:
  command: [drill, engine, --config, "{{work_dir}}/engine.yaml"]
  files: {{ engine.yaml: "{fixtures}/{template}" }}
  ingest: {{ kind: http, path: /ingest }}
  ready: {{ http: /stats }}
  stats: {{ path: /stats }}
  write_key: {{ mqtt_user_property: write-key }}
  promise: at_least_once
drain_timeout: 10s
workload: {{ rate: 100/s, duration: 12s, keys: 2 }}
faults:
  - {{ at: 4s, link: mqtt, fault: refuse, for: 3s }}
expect: {{ lost: 0, duplicates: 0, ledger: closes, recovery_within: 10s }}
"#,
        fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"),
    )
}

#[test]
fn a_users_engine_given_the_tls_placeholders_passes_and_one_speaking_plain_mqtt_fails() {
    if !crate::common::run::have_mosquitto() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tls = scenario(
        dir.path(),
        "tls-engine",
        &users_engine("tls-engine", "tls-engine.yaml.tmpl"),
    );
    let ran = run_drill(&tls, "tls-engine", &[]);
    ran.say("engine with {tls.ca_file} and its client certificate");
    ran.assert_passed();
    // The same engine without `tls:` in its config: the broker's only listener speaks TLS, so
    // not one record arrives, and the drill says so (delivery never came back after the
    // refused stretch; without `recovery_within` the 1200 records would stand as waiting).
    let plain = scenario(
        dir.path(),
        "plain-engine",
        &users_engine("plain-engine", "builtin-engine.yaml.tmpl"),
    );
    let ran = run_drill(&plain, "plain-engine", &[]);
    ran.say("engine speaking plain MQTT to the TLS broker");
    assert_eq!(
        ran.output.status.code(),
        Some(1),
        "{}",
        crate::common::run::show(&ran.output)
    );
    let accepted = ran.number(&["ledger", "held"]);
    assert!(accepted >= 1000, "{:#}", ran.report);
    assert_eq!(ran.number(&["ledger", "delivered"]), 0, "{:#}", ran.report);
    assert!(ran.markdown.contains("no delivery"), "{}", ran.markdown);
}

/// `drill check` on scenario `text` exits 2, saying `says`, at line `line` of the file.
fn invalid_at(dir: &std::path::Path, name: &str, text: &str, says: &str, line: usize) {
    let file = scenario(dir, name, text);
    let out = crate::common::run::drill(&["check", &file]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{name}: {text}");
    assert!(text.contains(says), "{name}: {text}");
    assert!(
        text.contains(&format!("{name}.yaml:{line}")),
        "{name}: located? {text}"
    );
}

#[test]
fn tls_that_cannot_be_served_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "kafka",
            "destination: { kind: kafka, tls: true }",
            "write `tls: { links: terminate }`",
        ),
        (
            "syslog",
            "destination: { kind: syslog, tls: true }",
            "only a `mqtt` or `nats` or `kafka` destination takes it",
        ),
        (
            "embedded",
            "destination: { kind: mqtt, runtime: embedded, tls: true }",
            "embedded MQTT broker serves no TLS",
        ),
        (
            "names",
            "destination: { kind: mqtt, tls: { names: [\"a b\"] } }",
            "not a DNS name",
        ),
        (
            "field",
            "destination: { kind: mqtt, tls: { client_certs: true } }",
            "tls",
        ),
        (
            "natsterm",
            "destination: { kind: nats, tls: { links: terminate } }",
            "plain text before the TLS handshake",
        ),
        (
            "mode",
            "destination: { kind: mqtt, tls: { links: open } }",
            "tls",
        ),
        (
            "yoursterm",
            "destination: { kind: mqtt, runtime: external, address: \"127.0.0.1:8883\", tls: { ca_file: /tmp/ca.pem, links: terminate } }",
            "brokers drill starts",
        ),
    ];
    for (name, destination, says) in cases {
        let text =
            format!("name: {name}\n{destination}\nworkload: {{ rate: 10/s, duration: 5s }}\n");
        invalid_at(dir.path(), name, &text, says, 2);
    }
    // `bad_certificate` needs TLS, and a kind whose TLS starts at connect.
    for (name, destination, says) in [
        (
            "nocert",
            "destination: { kind: mqtt }",
            "destination.tls: true",
        ),
        (
            "natscert",
            "destination: { kind: nats, tls: true }",
            "plain text before its handshake",
        ),
    ] {
        let link = if name == "natscert" { "nats" } else { "mqtt" };
        let text = format!(
            "name: {name}\n{destination}\nworkload: {{ rate: 10/s, duration: 5s }}\nfaults:\n  - {{ at: 1s, link: {link}, fault: bad_certificate, for: 2s }}\n"
        );
        invalid_at(dir.path(), name, &text, says, 5);
    }
    // `certificate:` belongs to `bad_certificate`, and `expired` needs the CA drill mints.
    for (name, destination, fault, says) in [
        (
            "certswallow",
            "destination: { kind: mqtt, tls: true }",
            "fault: swallow, certificate: expired",
            "only `bad_certificate` takes it",
        ),
        (
            "certyours",
            "destination: { kind: mqtt, runtime: external, address: \"127.0.0.1:8883\", tls: { ca_file: /tmp/ca.pem } }",
            "fault: bad_certificate, certificate: expired",
            "drill holds no key of your CA",
        ),
        (
            "certwhat",
            "destination: { kind: mqtt, tls: true }",
            "fault: bad_certificate, certificate: revoked",
            "certificate",
        ),
    ] {
        let text = format!(
            "name: {name}\n{destination}\nworkload: {{ rate: 10/s, duration: 5s }}\nfaults:\n  - {{ at: 1s, link: mqtt, {fault}, for: 2s }}\n"
        );
        invalid_at(dir.path(), name, &text, says, 5);
    }
    // A placeholder for TLS files without TLS.
    let file = scenario(
        dir.path(),
        "placeholder",
        "name: placeholder\ndestination: { kind: mqtt }\nsystem:\n  command: [engine, --ca, \"{tls.ca_file}\"]\n  ingest: { kind: http, path: /ingest }\nworkload: { rate: 10/s, duration: 5s }\n",
    );
    let out = crate::common::run::drill(&["check", &file]);
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("destination.tls: true"), "{text}");
}

/// What the engine says of a Kafka output's junk CA file: with `kafka-tls`, that the file
/// holds no certificate; without it, that this build speaks no TLS to Kafka.
const KAFKA_JUNK: &str = if cfg!(feature = "kafka-tls") {
    "holds no PEM certificate"
} else {
    "--features kafka-tls"
};

#[test]
fn the_engine_refuses_tls_files_that_do_not_parse_and_tls_on_kinds_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    for (kind, ca, says) in [
        ("mqtt", junk.clone(), "holds no PEM certificate"),
        ("nats", dir.path().join("absent.pem"), "absent.pem"),
        ("kafka", junk.clone(), KAFKA_JUNK),
        (
            "postgres",
            junk.clone(),
            "speaks no TLS to this kind of output",
        ),
    ] {
        let config = dir.path().join(format!("{kind}.yaml"));
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0\ndata_dir: {}\noutputs:\n- name: out\n  kind: {kind}\n  address: 127.0.0.1:1\n  topic: t\n  tls: {{ ca_file: {} }}\n",
                dir.path().join("data").display(),
                ca.display()
            ),
        )
        .unwrap();
        let out = crate::common::run::drill(&["engine", "--config", &config.display().to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{kind}: {err}");
        assert!(
            err.contains("output `out`: `tls`") && err.contains(says),
            "{kind}: {err}"
        );
    }
}

/// A scenario for the MQTT broker at `addr` that the user runs, over TLS with `tls`.
fn external_text(name: &str, addr: std::net::SocketAddr, tls: &str) -> String {
    format!(
        "name: {name}\ndestination: {{ kind: mqtt, runtime: external, address: \"{addr}\", topic: ext/{name}, tls: {tls} }}\nsystem: {{ builtin: {{ keepalive: 1s, answer_timeout: 2s }} }}\nworkload: {{ rate: 100/s, duration: 10s, keys: 2 }}\nfaults:\n  - {{ at: 3s, link: mqtt, fault: swallow, for: 3s }}\nexpect: {{ lost: 0, duplicates: 0, ledger: closes, recovery_within: 10s }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_broker_over_mutual_tls_takes_the_key_from_the_environment_only() {
    if !crate::common::run::have_mosquitto() {
        return;
    }
    // The user's broker: mosquitto with their own CA's certificate for `broker.site`, asking
    // every client for a certificate.
    let dir = tempfile::tempdir().unwrap();
    let theirs = drill::tls::BrokerTls::mint(
        &dir.path().join("site-ca"),
        "site",
        &["broker.site".to_string()],
        true,
    )
    .unwrap();
    let options = drill::dest::mqtt::broker::Options {
        tls: Some(&theirs),
        ..Default::default()
    };
    let mut broker = drill::dest::mqtt::broker::start_mqtt(
        drill::dest::Runtime::Process,
        &dir.path().join("broker"),
        options,
    )
    .await
    .unwrap();
    let f = &theirs.files;
    let tls = format!(
        "{{ ca_file: \"{}\", client_cert_file: \"{}\", client_key_env: DRILL_TEST_TLS_KEY, server_name: broker.site }}",
        f.ca_file.display(),
        f.client_cert_file.display()
    );
    let file = scenario(
        dir.path(),
        "ext-tls",
        &external_text("ext-tls", broker.addr, &tls),
    );
    let key = std::fs::read_to_string(&f.client_key_file).unwrap();
    let (file2, key2) = (file.clone(), key.clone());
    let ran = tokio::task::spawn_blocking(move || {
        // The variable not set: one line naming it, exit 3, as for credentials.
        let unset = run_drill(&file2, "ext-tls", &[]).output;
        let passed = crate::common::run::run_drill_with(
            &file2,
            "ext-tls",
            &[],
            &[("DRILL_TEST_TLS_KEY", &key2)],
        );
        (unset, passed)
    })
    .await
    .unwrap();
    let (unset, passed) = ran;
    let err = String::from_utf8_lossy(&unset.stderr);
    assert_eq!(
        unset.status.code(),
        Some(3),
        "{}",
        crate::common::run::show(&unset)
    );
    assert!(err.contains("`DRILL_TEST_TLS_KEY` is not set"), "{err}");
    passed.say("external broker over mutual TLS");
    passed.assert_passed();
    assert!(passed.number(&["ledger", "delivered"]) >= 1000);
    assert!(
        passed.markdown.contains("trust your CA"),
        "{}",
        passed.markdown
    );
    // The key appears nowhere drill wrote.
    let body = key.lines().nth(1).unwrap();
    assert!(!passed.markdown.contains(body) && !passed.report.to_string().contains(body));

    // A CA file that is not a CA: bad input, exit 2, before anything starts.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let bad = scenario(
        dir.path(),
        "ext-junk",
        &external_text(
            "ext-junk",
            broker.addr,
            &format!("{{ ca_file: \"{}\" }}", junk.display()),
        ),
    );
    let o = tokio::task::spawn_blocking(move || run_drill(&bad, "ext-junk", &[]).output)
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", crate::common::run::show(&o));
    assert!(
        err.contains("junk.pem") && err.contains("no PEM certificate"),
        "{err}"
    );
    broker.stop().await;
}

/// A NATS server the user runs, over mutual TLS with their own CA (its certificate names
/// `broker.site`): drill's set-up, its reader and the engine trust that CA and check that name,
/// though each dials a link or the server on 127.0.0.1; the stream drill created is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_nats_server_over_mutual_tls_is_drilled_with_the_users_ca() {
    if !crate::common::run::have_nats_server() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let theirs = drill::tls::BrokerTls::mint(
        &dir.path().join("site-ca"),
        "site",
        &["broker.site".to_string()],
        true,
    )
    .unwrap();
    let mut server =
        drill::dest::nats::broker::start_nats(&dir.path().join("nats"), None, None, Some(&theirs))
            .await
            .unwrap();
    let f = &theirs.files;
    let text = format!(
        "name: ext-nats-tls\ndestination: {{ kind: nats, runtime: external, servers: [\"{}\"], topic: ext.tls, stream: EXTTLS, create: true, tls: {{ ca_file: \"{}\", client_cert_file: \"{}\", client_key_env: DRILL_TEST_TLS_KEY, server_name: broker.site }} }}\nsystem: {{ builtin: {{ keepalive: 1s, answer_timeout: 2s }} }}\nworkload: {{ rate: 100/s, duration: 10s, keys: 2 }}\nfaults:\n  - {{ at: 3s, link: nats, fault: swallow, for: 3s }}\nexpect: {{ lost: 0, duplicates: 0, ledger: closes, recovery_within: 10s }}\n",
        server.addr,
        f.ca_file.display(),
        f.client_cert_file.display()
    );
    let file = scenario(dir.path(), "ext-nats-tls", &text);
    let key = std::fs::read_to_string(&f.client_key_file).unwrap();
    let passed = tokio::task::spawn_blocking(move || {
        crate::common::run::run_drill_with(
            &file,
            "ext-nats-tls",
            &[],
            &[("DRILL_TEST_TLS_KEY", &key)],
        )
    })
    .await
    .unwrap();
    passed.say("external NATS over mutual TLS");
    passed.assert_passed();
    assert!(passed.number(&["ledger", "delivered"]) >= 1000);
    assert!(
        passed.markdown.contains("check the name `broker.site`")
            && passed.markdown.contains("removed at the end"),
        "{}",
        passed.markdown
    );
    server.stop().await;
}
