//! `drill diff` on two real runs of one drill: a stranded MQTT connection, found by the
//! built-in engine's keepalive (a PINGREQ, then its answer timeout) — 1 s and 1 s in the base
//! run, 6 s and 3 s in the new one, so the new run recovers seconds later. The diff must show it, and `--fail-on` must turn it into exit 1.

use crate::common::run::{drill, scenario, show};

fn strand_drill(dir: &std::path::Path, keepalive: &str, answer_timeout: &str) -> String {
    scenario(
        dir,
        &format!("strand-{keepalive}"),
        &format!(
            "name: strand-diff\n\
             destination: {{ kind: mqtt, topic: drill/strand-diff }}\n\
             system: {{ builtin: {{ keepalive: {keepalive}, answer_timeout: {answer_timeout} }} }}\n\
             workload: {{ rate: 100/s, duration: 16s, keys: 4 }}\n\
             faults:\n\
             \x20 - {{ at: 3s, link: mqtt, fault: strand }}\n\
             expect: {{ lost: 0, duplicates: 0, ledger: closes, recovery_within: 30s }}\n\
             drain_timeout: 30s\n"
        ),
    )
}

#[test]
fn a_slower_recovery_shows_in_the_diff_and_fails_it_beyond_the_margin() {
    let dir = tempfile::tempdir().unwrap();
    let (base, new) = (dir.path().join("base"), dir.path().join("new"));
    for (keepalive, answer_timeout, out) in [("1s", "1s", &base), ("6s", "3s", &new)] {
        let file = strand_drill(dir.path(), keepalive, answer_timeout);
        let o = drill(&["run", &file, "--out", &out.display().to_string()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "keepalive {keepalive}: {}",
            show(&o)
        );
    }
    let recovery = |out: &std::path::Path| {
        let text = std::fs::read_to_string(out.join("strand-diff/report.json")).unwrap();
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        let rec = &r["recovery"][0];
        rec["first_delivery_ms"].as_u64().unwrap() - rec["heal_ms"].as_u64().unwrap()
    };
    let (b, n) = (recovery(&base), recovery(&new));
    println!("recovery after the strand: keepalive 1 s + 1 s {b} ms, keepalive 6 s + 3 s {n} ms");
    assert!(
        n > b * 3 / 2 + 1000,
        "the longer keepalive recovers later: {b} → {n} ms"
    );

    let (base, new) = (base.display().to_string(), new.display().to_string());
    // Without margins it only reports, and says what changed.
    let o = drill(&["diff", &base, &new]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    println!("{text}");
    assert!(text.contains("strand-diff"), "{text}");
    assert!(text.contains("recovery after link mqtt strand"), "{text}");
    assert!(text.contains("no regression"), "{text}");
    // Beyond the margin: exit 1, the row flagged, in the table and in markdown.
    let o = drill(&[
        "diff",
        &base,
        &new,
        "--fail-on",
        "recovery+20%,duplicates+0",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("REGRESSION (recovery+20%)"), "{text}");
    let o = drill(&[
        "diff",
        &base,
        &new,
        "--markdown",
        "--fail-on",
        "recovery+20%",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.contains("| recovery after link mqtt strand"), "{md}");
    assert!(md.contains("**regression** (`recovery+20%`)"), "{md}");
    // The other way round it is faster: no regression, exit 0.
    let o = drill(&["diff", &new, &base, "--fail-on", "recovery+20%"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    // A run against itself changes nothing.
    let o = drill(&[
        "diff",
        &base,
        &base,
        "--fail-on",
        "recovery+0,drain+0,lost+0",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

#[test]
fn bad_input_exits_2_and_says_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here").display().to_string();
    let o = drill(&["diff", &missing, &missing]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file or folder"));
    let empty = dir.path().display().to_string();
    let o = drill(&["diff", &empty, &empty]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no report.json"));
    let o = drill(&["diff", &empty, &empty, "--fail-on", "recovery-5%"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("recovery+N%"));
}
