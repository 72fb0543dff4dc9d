//! The drill catalogue (`scenarios/`): every drill says what field failure it reproduces and is
//! tagged, and — the point of it — the `ci` drills catch every deliberately broken engine while
//! the correct engine passes them all (`drill selftest --tag ci`, test builds only).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const TAGS: [&str; 11] = [
    "ci",
    "full",
    "long",
    "soak",
    "containers",
    "finding",
    "syslog",
    "http",
    "postgres",
    "tls",
    "amqp",
];

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
            && p.destination.kind.name() == "kafka"
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

/// The fault families a `full` selftest plays on every destination kind, and how a drill is
/// told to belong to one.
fn families(plan: &drill::scenario::Plan) -> Vec<&'static str> {
    use drill::proxy::{Direction, Fault};
    use drill::scenario::{FaultAction, ProcessAction};
    let mut found = Vec::new();
    if !plan.workload.poison.is_empty() {
        found.push("poison");
    }
    for f in &plan.faults {
        found.push(match &f.what {
            FaultAction::Link { spec, .. } if spec.fault == Fault::Strand => "strand",
            FaultAction::Link { spec, .. }
                if spec.fault == Fault::Swallow && spec.direction == Direction::Downstream =>
            {
                "half-open"
            }
            FaultAction::Link { spec, .. }
                if matches!(spec.fault, Fault::Refuse | Fault::Swallow) =>
            {
                "cut"
            }
            FaultAction::Engine {
                action: ProcessAction::Kill,
                ..
            } => "kill",
            FaultAction::Engine {
                action: ProcessAction::PowerCut,
                ..
            } => "power cut",
            FaultAction::Engine {
                action: ProcessAction::FillDisk,
                ..
            } => "disk full",
            _ => continue,
        });
    }
    found
}

/// Every family (cut, half-open, strand, kill, power cut, disk full, poison) has a `full`
/// drill on MQTT, JetStream, Kafka, syslog over RELP, HTTP and PostgreSQL — but poison on Kafka, which
/// cannot refuse one record, and on syslog, whose rsyslog takes every message
/// (docs/src/catalogue.md, "Every fault family on every kind").
#[test]
fn the_full_tag_plays_every_fault_family_on_every_kind() {
    let plans = catalogue();
    for kind in ["mqtt", "nats", "kafka", "syslog", "http", "postgres"] {
        for family in [
            "cut",
            "half-open",
            "strand",
            "kill",
            "power cut",
            "disk full",
            "poison",
        ] {
            if matches!((kind, family), ("kafka" | "syslog", "poison")) {
                continue;
            }
            assert!(
                plans.iter().any(|p| p.destination.kind.name() == kind
                    && p.tags.iter().any(|t| t == "full")
                    && families(p).contains(&family)),
                "no `full` drill plays {family} on {kind}"
            );
        }
    }
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
    let matrix = std::fs::read_to_string(out.join("selftest/selftest.md")).unwrap_or_default();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("selftest/selftest.json")).unwrap())
            .unwrap();
    assert_eq!(
        json["missed"],
        serde_json::json!([]),
        "mutants no drill caught by their signature:\n{matrix}"
    );
    assert_eq!(
        json["false_alarms"],
        serde_json::json!([]),
        "the correct engine failed (or skipped a planned fault):\n{matrix}"
    );
    assert_eq!(
        json["errors"],
        serde_json::json!([]),
        "drills that could not run:\n{matrix}"
    );
    assert_eq!(json["ok"], true, "{matrix}");
    assert_eq!(o.status.code(), Some(0), "{matrix}");
    let rows = json["rows"].as_array().unwrap();
    assert!(
        rows.len() >= 16,
        "the correct engine and at least 15 mutants"
    );
    assert!(
        rows[0]["cells"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["outcome"] == "pass")
    );
    // The half-open drill's swallow bit the correct engine: answers were discarded on the link
    // and the attempts they belonged to ended possibly_sent (then delivered, one copy each).
    let half_open: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("selftest/correct/mqtt-half-open/report.json")).unwrap(),
    )
    .unwrap();
    let swallowed = &half_open["link"]["bytes_swallowed_downstream"];
    let open = &half_open["attempts"]["possibly_sent"];
    println!(
        "mqtt-half-open: {swallowed} bytes of answers swallowed, {open} attempts possibly_sent"
    );
    assert!(swallowed.as_u64().unwrap_or(0) > 0, "{half_open:#}");
    assert!(open.as_u64().unwrap_or(0) > 0, "{half_open:#}");
    // Every mutant caught by its signature on a `ci` drill, conclusively.
    for row in &rows[1..] {
        let cells = row["cells"].as_array().unwrap();
        assert!(
            cells.iter().any(|c| c["outcome"] == "caught"),
            "{} is not caught by {}:\n{matrix}",
            row["engine"],
            row["signature"]
        );
    }
    // The committed matrix (reports/catalogue/selftest-ci.json, what the book and the README
    // quote) is what CI sees: the same drills, the same mutants, each with the same signature
    // and the same status — not cell by cell (timing moves which drill catches first).
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/catalogue/selftest-ci.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        summary(&committed),
        summary(&json),
        "the committed ci matrix differs from CI's; regenerate reports/catalogue/selftest-ci.{{json,md}} from {}",
        out.join("selftest").display()
    );
}

/// A selftest's drills, and per engine its signature and whether any drill caught it.
fn summary(selftest: &serde_json::Value) -> (Vec<String>, Vec<(String, String, bool)>) {
    let scenarios = selftest["scenarios"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap_or("").to_string())
        .collect();
    let rows = selftest["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let caught = r["cells"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["outcome"] == "caught");
            (
                r["engine"].as_str().unwrap_or("").to_string(),
                r["signature"].to_string(),
                caught,
            )
        })
        .collect();
    (scenarios, rows)
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
    // Where they were last seen: acknowledged, not yet synced, never sent (the link was
    // refused): every one never left the engine.
    let seen = &cut["lost_last_seen"];
    assert_eq!(seen["never_left"]["count"].as_u64(), Some(lost), "{seen:#}");
    assert_eq!(seen["no_answer"]["count"], 0, "{seen:#}");
    assert_eq!(seen["broker_lost"]["count"], 0, "{seen:#}");
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

/// An engine that keeps its buffer as if in memory, killed in the middle of a swallowed link:
/// it forgets what it held. The report says where each lost record was last seen: those the
/// engine had sent into the swallowing link left it and got no answer, the rest never left it;
/// the classes add up to what was lost.
#[cfg(feature = "mutants")]
#[test]
fn memory_only_killed_mid_outage_loses_records_and_says_where_they_were_last_seen() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/engine-crash.yaml");
    let o = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", "--runtime", "process", "--out"])
        .arg(dir.path())
        .arg(&scenario)
        .env("DRILL_MUTANT", "memory-only")
        .output()
        .unwrap();
    let text = std::fs::read_to_string(dir.path().join("engine-crash/report.json"))
        .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(&o.stdout)));
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", r["headline"]);
    let lost = r["ledger"]["lost"].as_u64().unwrap();
    assert!(lost > 0);
    let seen = &r["lost_last_seen"];
    let class = |c: &str| seen[c]["count"].as_u64().unwrap();
    println!("memory-only, killed mid-swallow: {seen:#}");
    assert_eq!(
        class("never_left") + class("no_answer") + class("broker_lost"),
        lost,
        "{seen:#}"
    );
    assert!(class("never_left") > 0, "{seen:#}");
    assert_eq!(
        class("broker_lost"),
        0,
        "mosquitto lost nothing it acknowledged"
    );
    let md = std::fs::read_to_string(dir.path().join("engine-crash/report.md")).unwrap();
    assert!(
        md.contains("## Where the lost records were last seen"),
        "{md}"
    );
}
