//! The drill catalogue (`scenarios/`): every drill says what field failure it reproduces and is
//! tagged, and — the point of it — the `ci` drills catch every deliberately broken engine while
//! the correct engine passes them all (`drill selftest --tag ci`, test builds only).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const TAGS: [&str; 5] = ["ci", "long", "soak", "containers", "finding"];

fn catalogue() -> Vec<drill::scenario::Plan> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut plans: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| drill::scenario::load(&p).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    plans.sort_by(|a, b| a.name.cmp(&b.name));
    plans
}

#[test]
fn every_catalogue_drill_says_what_it_reproduces_and_is_tagged_by_cost() {
    let plans = catalogue();
    assert!(plans.len() >= 20, "{} drills", plans.len());
    for plan in &plans {
        let about = plan.about.as_deref().unwrap_or("");
        assert!(
            about.len() > 80,
            "{}: `about` must say what field failure it reproduces",
            plan.name
        );
        assert!(!plan.tags.is_empty(), "{}: no tags", plan.name);
        for t in &plan.tags {
            assert!(TAGS.contains(&t.as_str()), "{}: unknown tag {t}", plan.name);
        }
        let long = plan.plays_for();
        if plan.tags.iter().any(|t| t == "ci") {
            assert!(
                long <= Duration::from_secs(400),
                "{}: {long:?} is too long for every pull request",
                plan.name
            );
        }
        if plan.tags.iter().any(|t| t == "soak") {
            assert!(
                long >= Duration::from_secs(15 * 60),
                "{}: a soak drill runs 15 minutes or more",
                plan.name
            );
        }
    }
    // The outage longer than librdkafka's own 300 s default runs on every pull request.
    assert!(plans.iter().any(|p| {
        p.tags.iter().any(|t| t == "ci")
            && p.destination.kind == drill::scenario::DestinationKind::Kafka
            && drill::scenario::longest_outage(&p.faults, p.workload.duration)
                >= Duration::from_secs(360)
    }));
    // 15-minute cuts on every destination kind, and a 60-minute one.
    for kind in ["mqtt", "nats", "kafka"] {
        assert!(
            plans.iter().any(|p| p.name == format!("{kind}-cut-15m")),
            "{kind}-cut-15m"
        );
    }
    assert!(plans.iter().any(|p| p.name == "mqtt-cut-60m"));
}

/// Root and /dev/fuse (the power cut and the full disk need them). Under CI=true a missing one
/// fails; elsewhere the selftest is skipped with a line saying why.
fn fuse_available() -> bool {
    let root = nix::unistd::geteuid().is_root();
    let fuse = Path::new("/dev/fuse").exists();
    if root && fuse {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI=true and the power-cut filesystem cannot be mounted here (root: {root}, /dev/fuse: {fuse})"
    );
    println!("skipped: the power-cut drills need root and /dev/fuse");
    false
}

/// The selftest on the `ci` tag: every mutant caught by at least one drill, the correct engine
/// passes every drill. The matrix is printed (cargo test -- --nocapture shows it).
#[cfg(feature = "mutants")]
#[test]
fn the_ci_catalogue_catches_every_mutant_and_passes_the_correct_engine() {
    if !fuse_available() {
        return;
    }
    // Kept after the run (target/tmp/selftest-ci/selftest/selftest.{md,json}): the matrix CI saw.
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("selftest-ci");
    let _ = std::fs::remove_dir_all(&out);
    let started = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["selftest", "--tag", "ci", "--jobs", "5", "--out"])
        .arg(&out)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    println!("selftest took {:?}", started.elapsed());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("selftest/selftest.json")).unwrap())
            .unwrap();
    assert_eq!(
        json["missed"],
        serde_json::json!([]),
        "mutants no drill caught"
    );
    assert_eq!(
        json["false_alarms"],
        serde_json::json!([]),
        "the correct engine failed"
    );
    assert_eq!(
        json["errors"],
        serde_json::json!([]),
        "drills that could not run"
    );
    assert_eq!(json["ok"], true);
    assert_eq!(o.status.code(), Some(0));
    let rows = json["rows"].as_array().unwrap();
    assert!(
        rows.len() >= 15,
        "the correct engine and at least 14 mutants"
    );
    assert!(
        rows[0]["cells"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["outcome"] == "pass")
    );
}

/// Without the `mutants` feature there is nothing to test the catalogue against: the selftest
/// says so in one line and exits 2.
#[cfg(not(feature = "mutants"))]
#[test]
fn the_selftest_needs_a_test_build() {
    let o = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["selftest", "--tag", "ci"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("without the `mutants` feature"), "{stderr}");
    let _ = (Instant::now(), fuse_available as fn() -> bool);
}

/// A power cut, not only a kill: the engine that acknowledges before fdatasync loses records
/// in `mqtt-power-cut` — exactly the ones the ledger cannot account for — and passes the same
/// drill when the power cut is replaced by a SIGKILL (the page cache outlives the process).
/// The correct engine passes the power cut with nothing lost.
#[cfg(feature = "mutants")]
#[test]
fn only_the_power_cut_catches_an_engine_that_acknowledges_before_fdatasync() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let original = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/mqtt-power-cut.yaml");
    let text = std::fs::read_to_string(&original).unwrap();
    assert!(text.contains("action: power_cut"));
    let as_kill = dir.path().join("as-kill.yaml");
    std::fs::write(
        &as_kill,
        text.replace("action: power_cut", "action: kill")
            .replace("name: mqtt-power-cut", "name: mqtt-power-cut-as-kill"),
    )
    .unwrap();
    let run = |file: &Path, mutant: Option<&str>, out: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_drill"));
        c.arg("run")
            .arg(file)
            .arg("--out")
            .arg(dir.path().join(out));
        match mutant {
            Some(m) => c.env("DRILL_MUTANT", m),
            None => c.env_remove("DRILL_MUTANT"),
        };
        let o = c.output().unwrap();
        let name = if file == as_kill.as_path() {
            "mqtt-power-cut-as-kill"
        } else {
            "mqtt-power-cut"
        };
        let report: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(out).join(name).join("report.json"))
                .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(&o.stdout))),
        )
        .unwrap();
        println!(
            "{}",
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains(" — "))
                .unwrap_or("")
        );
        (o.status.code(), report)
    };
    let threads = [
        (original.clone(), Some("ack-before-fdatasync"), "cut"),
        (as_kill.clone(), Some("ack-before-fdatasync"), "kill"),
        (original.clone(), None, "correct"),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = threads
            .iter()
            .map(|(f, m, out)| s.spawn(|| run(f, *m, out)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (cut_code, cut) = &results[0];
    let l = &cut["ledger"];
    let lost = l["lost"].as_u64().unwrap();
    assert_eq!(*cut_code, Some(1), "{cut:#}");
    assert!(
        lost > 0,
        "the power cut must lose what was acknowledged before fdatasync"
    );
    assert_eq!(
        lost,
        l["held"].as_u64().unwrap()
            - l["delivered"].as_u64().unwrap()
            - l["waiting"].as_u64().unwrap()
            - l["failed"].as_u64().unwrap(),
        "lost is exactly what the ledger cannot account for"
    );
    let (kill_code, kill) = &results[1];
    assert_eq!(
        *kill_code,
        Some(0),
        "a SIGKILL keeps the page cache: {kill:#}"
    );
    assert_eq!(kill["ledger"]["lost"], 0);
    let (correct_code, correct) = &results[2];
    assert_eq!(*correct_code, Some(0), "{correct:#}");
    assert_eq!(correct["ledger"]["lost"], 0);
    assert!(
        cut["faults"].as_array().unwrap().iter().any(|f| f["fault"]
            .as_str()
            .unwrap_or("")
            .starts_with("power cut (SIGKILL; ")),
        "{:#}",
        cut["faults"]
    );
}
