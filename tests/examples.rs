//! The examples users copy (`scenarios/examples/`): real engines nobody here wrote — a mosquitto
//! bridge (Debian `mosquitto`) and mq-bridge (PyPI `mq-bridge-basic`), both installed by
//! `ci/setup.sh` — drilled full length. What they lose or copy is a finding, not a failure of
//! drill: the test checks drill carried the drill out and accounted for every record (exit 0 or
//! 1, never 2 or 3; the ledger's sum holds; the reader had no fault; records really flowed).

use std::process::Command;

fn drill_example(name: &str) -> serde_json::Value {
    let out = tempfile::tempdir().unwrap();
    let file = format!(
        "{}/scenarios/examples/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file, "--out"])
        .arg(out.path())
        .output()
        .expect("drill runs");
    let shown = format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(matches!(output.status.code(), Some(0 | 1)), "{shown}");
    let text = std::fs::read_to_string(out.path().join(name).join("report.json")).expect(&shown);
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = |f: &str| r["ledger"][f].as_u64().unwrap();
    assert_eq!(
        n("held"),
        n("delivered") + n("waiting") + n("failed") + n("lost"),
        "{shown}"
    );
    assert!(n("delivered") > 1000, "{shown}");
    assert_eq!(n("unexpected"), 0, "{shown}");
    let verdict_pass = r["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["ok"] == true);
    assert_eq!(r["verdict"] == "pass", verdict_pass, "{shown}");
    assert_eq!(output.status.code() == Some(0), verdict_pass, "{shown}");
    assert!(
        !text.contains("verifier fault"),
        "the reader itself failed: {shown}"
    );
    r
}

#[test]
fn the_mosquitto_bridge_example_is_drilled_and_accounted_for() {
    let r = drill_example("mosquitto-bridge");
    assert!(r["ledger"]["delivered"].as_u64().unwrap() > 3000);
}

#[test]
fn the_mq_bridge_example_is_drilled_and_accounted_for() {
    let r = drill_example("mq-bridge");
    assert!(r["ledger"]["delivered"].as_u64().unwrap() > 3000);
}

/// mq-bridge's spool on a disk that fills up (drill's power-cut filesystem, `fill_disk`): the
/// finding is that mq-bridge 1.2.0 answers 202 for records it could not write, so they are
/// lost. drill must see that loss: records lost, none of them refused at ingest.
#[test]
fn the_mq_bridge_disk_full_example_shows_acknowledged_records_lost() {
    let root = nix::unistd::geteuid().is_root();
    let fuse = std::path::Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI=true and no FUSE here (root: {root}, /dev/fuse: {fuse})"
        );
        println!("skipped: fill_disk needs root and /dev/fuse");
        return;
    }
    let r = drill_example("mq-bridge-disk-full");
    let l = &r["ledger"];
    println!("mq-bridge on a full disk: {l}");
    assert!(l["lost"].as_u64().unwrap() > 0, "{l}");
    assert_eq!(l["ingest_refused"], 0, "mq-bridge refused nothing: {l}");
}
