//! `drill init`: what it writes for the fixture forwarder passes `drill check` and `drill run`
//! as written; the same drill written for the forwarder's `ack-before-write` mode fails with
//! the records the kill took; bad input exits 2 and writes nothing. Real broker, real proxy,
//! the real binary.

use std::process::{Command, Output, Stdio};

use crate::common::run::{drill_in as drill, show};

fn forwarder(extra: &str) -> String {
    format!(
        "python3 {}/fixtures/forwarder.py --ingest-kind http --ingest {{ingest}} --mqtt {{link.mqtt}} --topic {{topic}} --data {{data_dir}}{extra}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `drill init` for the forwarder (`extra` on its argv), then `drill check` and `drill run` on
/// what it wrote; the report.
fn init_and_run(name: &str, extra: &str) -> (Output, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let engine = forwarder(extra);
    let init = drill(
        dir.path(),
        &[
            "init",
            "--engine",
            &engine,
            "--ingest",
            "http",
            "--destination",
            "mqtt",
            "--name",
            name,
            "--stats",
            "/stats",
            "--write-key",
            "write-key",
            "--ci",
        ],
    );
    assert_eq!(init.status.code(), Some(0), "{}", show(&init));
    for f in [
        format!("drills/{name}.yaml"),
        "drills/README.md".to_string(),
        ".github/workflows/drill.yml".to_string(),
    ] {
        assert!(dir.path().join(&f).is_file(), "{f} written");
    }
    let check = drill(dir.path(), &["check", "drills/"]);
    assert_eq!(check.status.code(), Some(0), "{}", show(&check));
    let run = drill(
        dir.path(),
        &["run", "drills/", "--tag", "ci", "--out", "reports"],
    );
    let report = std::fs::read_to_string(dir.path().join(format!("reports/{name}/report.json")))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (run, report)
}

#[test]
fn what_init_writes_for_the_fixture_forwarder_passes_as_written() {
    let (run, report) = init_and_run("forwarder", "");
    assert_eq!(run.status.code(), Some(0), "{}", show(&run));
    assert_eq!(report["verdict"], "pass", "{report:#}");
    let ledger = &report["ledger"];
    assert_eq!(ledger["lost"], 0, "{ledger}");
    assert_eq!(ledger["held"], ledger["delivered"], "{ledger}");
    // The three faults it writes were all played.
    let faults: Vec<String> = report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["fault"].as_str().unwrap_or("").to_string())
        .collect();
    for f in ["swallow", "kill", "refuse"] {
        assert!(faults.iter().any(|x| x.starts_with(f)), "{f} in {faults:?}");
    }
}

#[test]
fn the_same_drill_fails_an_engine_that_acknowledges_before_writing() {
    let (run, report) = init_and_run("forwarder-ack-before-write", " --broken ack-before-write");
    assert_eq!(run.status.code(), Some(1), "{}", show(&run));
    assert_eq!(report["verdict"], "fail", "{report:#}");
    // The kill at 18 s takes what the outage held in memory: 8 s of 50/s, give or take.
    let lost = report["ledger"]["lost"].as_u64().unwrap();
    eprintln!("ack-before-write: {}", report["headline"]);
    assert!((200..=600).contains(&lost), "lost {lost}: {report:#}");
}

#[test]
fn init_without_what_it_needs_off_a_terminal_says_so_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = drill(dir.path(), &["init", "--ingest", "http"]);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--engine"), "{err}");
    assert!(!dir.path().join("drills").exists());

    let bad = drill(
        dir.path(),
        &[
            "init",
            "--engine",
            "x 'unclosed",
            "--ingest",
            "http",
            "--destination",
            "nats",
        ],
    );
    assert_eq!(bad.status.code(), Some(2), "{}", show(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unbalanced quotes"));
}

#[test]
fn init_never_overwrites_unless_forced_and_every_kind_loads() {
    let dir = tempfile::tempdir().unwrap();
    let every_kind = [
        ("http", "mqtt"),
        ("mqtt", "nats"),
        ("tcp_lines", "kafka"),
        ("http", "syslog"),
        ("mqtt", "postgres"),
        ("tcp_lines", "http"),
    ];
    for (ingest, destination) in every_kind {
        let engine = format!(
            "./my-forwarder --in {{ingest}} --out {{link.{destination}}} --data {{data_dir}}"
        );
        let args = [
            "init",
            "--engine",
            &engine,
            "--ingest",
            ingest,
            "--destination",
            destination,
            "--force",
        ];
        let out = drill(dir.path(), &args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{ingest} → {destination}: {}",
            show(&out)
        );
        let text = std::fs::read_to_string(dir.path().join("drills/my-forwarder.yaml")).unwrap();
        assert!(text.contains(&format!("kind: {destination}")), "{text}");
        // Without --write-key, the file and the screen say what an extra copy will count as,
        // and how to declare the key.
        let said = String::from_utf8_lossy(&out.stderr);
        for (whom, words) in [("the file", text.as_str()), ("the screen", &said)] {
            assert!(
                words.contains("counts as a duplicate against") && words.contains("write_key: {"),
                "{destination}: {whom} does not say it: {words}"
            );
        }
        assert!(said.contains("--write-key NAME"), "{said}");
        let check = drill(dir.path(), &["check", "drills/my-forwarder.yaml"]);
        assert_eq!(check.status.code(), Some(0), "{}", show(&check));
    }
    // A placeholder the destination has not: said with the file, line and column.
    let wrong = drill(
        dir.path(),
        &[
            "init",
            "--engine",
            "./my-forwarder {ingest} {link.nats}",
            "--ingest",
            "http",
            "--destination",
            "mqtt",
            "--force",
        ],
    );
    assert_eq!(wrong.status.code(), Some(2), "{}", show(&wrong));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("drills/my-forwarder.yaml:")
            && err.contains("unknown placeholder `{link.nats}`"),
        "{err}"
    );
    let again = drill(
        dir.path(),
        &[
            "init",
            "--engine",
            "./my-forwarder {ingest}",
            "--ingest",
            "http",
            "--destination",
            "mqtt",
        ],
    );
    assert_eq!(again.status.code(), Some(2), "{}", show(&again));
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
}

/// On a terminal without flags it asks (a pseudo-terminal from util-linux's `script`), and
/// what the answers make loads like the flags' version.
#[test]
fn on_a_terminal_it_asks_the_questions_the_flags_would_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("script")
        .args([
            "-qec",
            &format!("{} init", env!("CARGO_BIN_EXE_drill")),
            "/dev/null",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"./fwd --in {ingest} --to {link.kafka} --spool {data_dir}\n\nkafka\ny\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    for question in [
        "Your engine's command",
        "How drill hands records",
        "Where it forwards",
        "GitHub workflow",
    ] {
        assert!(said.contains(question), "{question:?} asked: {said}");
    }
    let text = std::fs::read_to_string(dir.path().join("drills/fwd.yaml")).unwrap();
    assert!(
        text.contains("kind: kafka") && text.contains("kind: http"),
        "{text}"
    );
    assert!(dir.path().join(".github/workflows/drill.yml").is_file());
    let check = drill(dir.path(), &["check", "drills/fwd.yaml"]);
    assert_eq!(check.status.code(), Some(0), "{}", show(&check));
}
