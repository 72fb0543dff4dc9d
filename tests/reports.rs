//! The CI gate's outputs from a real drill: `timeline.svg` (one shaded band per fault window at
//! its instant), `junit.xml` (read by a real JUnit reader, `junitparser`, via
//! `ci/junit_check.py`), the GitHub job summary, plain output when piped, and `drill run DIR
//! --tag T` with its summary table and the worst exit code.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::run::show;

fn drill(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(args)
        .env_remove("GITHUB_STEP_SUMMARY")
        .envs(env.iter().copied())
        .output()
        .expect("drill runs")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A passing and a failing drill through ci/junit_check.py: what a CI's JUnit reader sees.
fn junit_check(file: &Path) -> String {
    let o = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/junit_check.py"))
        .arg(file)
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "junit_check: {}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_drill_with_two_fault_windows_and_a_kill_writes_chart_junit_and_job_summary() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "two-windows",
        r#"name: two-windows
seed: 4
destination: { kind: mqtt, runtime: process, topic: drill/two-windows }
workload: { rate: 100/s, duration: 24s, keys: 4 }
faults:
  - { at: 4s, link: mqtt, fault: swallow, direction: both, for: 6s }
  - { at: 6s, target: engine, action: kill, restart_after: 1s }
  - { at: 14s, link: mqtt, fault: refuse, for: 4s }
expect: { lost: 0, duplicates: 0, ledger: closes, recovery_within: 1ms }
"#,
    );
    let summary = dir.path().join("summary.md");
    let out = dir.path().join("out");
    let o = drill(
        &["run", &file, "--out", &out.display().to_string()],
        &[("GITHUB_STEP_SUMMARY", &summary.display().to_string())],
    );
    // Nothing is lost, but no engine recovers within 1 ms: the headline names that first.
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(!stdout.contains('\u{1b}'), "escape codes in piped output");
    assert!(
        stdout.contains("FAIL — Recovery after link mqtt swallow both"),
        "{stdout}"
    );
    assert!(stdout.contains("nothing lost."), "{stdout}");
    let folder = out.join("two-windows");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("report.json")).unwrap())
            .unwrap();

    // The chart: one band per link fault window, where the report says it was.
    let svg = std::fs::read_to_string(folder.join("timeline.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the SVG parses");
    let bands: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("fault"))
        .collect();
    let windows: Vec<&serde_json::Value> = report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["target"].as_str().unwrap().starts_with("link"))
        .collect();
    assert_eq!(bands.len(), 2);
    assert_eq!(windows.len(), 2);
    let chart = drill::report::svg::Chart {
        title: "",
        duration_ms: report["duration_ms"].as_u64().unwrap(),
        samples: &[],
        windows: &[],
        marks: &[],
    };
    for (band, window) in bands.iter().zip(&windows) {
        let from = window["at_ms"].as_u64().unwrap();
        let until = window["until_ms"].as_u64().unwrap();
        assert_eq!(
            band.attribute("data-from-ms"),
            Some(from.to_string().as_str())
        );
        let x: f64 = band.attribute("x").unwrap().parse().unwrap();
        let w: f64 = band.attribute("width").unwrap().parse().unwrap();
        let want_x = drill::report::svg::x_of(&chart, from);
        let want_w = drill::report::svg::x_of(&chart, until) - want_x;
        assert!((x - want_x).abs() < 0.5, "x {x} vs {want_x}");
        assert!((w - want_w).abs() < 0.5, "width {w} vs {want_w}");
    }
    let kinds: Vec<&str> = doc
        .descendants()
        .filter_map(|n| n.attribute("data-kind"))
        .collect();
    assert!(
        kinds.contains(&"kill") && kinds.contains(&"restart"),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"first_delivery"), "{kinds:?}");
    assert!(
        report["series"].as_array().unwrap().len() >= 24,
        "a point a second"
    );
    let md = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(md.contains("](timeline.svg)"), "the chart is embedded");

    // JUnit: the failing expectations with expected and actual, read by junitparser.
    let seen = junit_check(&folder.join("junit.xml"));
    assert!(
        seen.contains("suite 'two-windows': tests=10 failures=3"),
        "{seen}"
    );
    assert!(seen.contains("expected ≤ 1 ms, got"), "{seen}");

    // The job summary: headline, tiles, ledger line.
    let summary = std::fs::read_to_string(&summary).unwrap();
    assert!(
        summary.contains("### drill two-windows: ❌ FAIL — Recovery after"),
        "{summary}"
    );
    assert!(
        summary.contains("| held | delivered | waiting | failed | lost |"),
        "{summary}"
    );
    assert!(summary.contains("Ledger: `"), "{summary}");
}

fn short(name: &str, tags: &str, expect: &str) -> String {
    format!(
        "name: {name}\ntags: {tags}\ndestination: {{ kind: mqtt, runtime: process, topic: drill/{name} }}\nworkload: {{ rate: 50/s, duration: 6s }}\nfaults:\n  - {{ at: 2s, link: mqtt, fault: refuse, for: 2s }}\nexpect: {expect}\n"
    )
}

#[test]
fn a_folder_of_drills_selected_by_tag_ends_with_a_summary_table_and_the_worst_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let drills = dir.path().join("drills");
    std::fs::create_dir(&drills).unwrap();
    write(
        &drills,
        "a-pass",
        &short("a-pass", "[ci]", "{ lost: 0, ledger: closes }"),
    );
    write(
        &drills,
        "b-fail",
        &short("b-fail", "[ci, slow]", "{ lost: 0, recovery_within: 1ms }"),
    );
    write(
        &drills,
        "c-untagged",
        &short("c-untagged", "[soak]", "{ lost: 0 }"),
    );
    let out = dir.path().join("out");
    let o = drill(
        &[
            "run",
            &drills.display().to_string(),
            "--tag",
            "ci",
            "--out",
            &out.display().to_string(),
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(out.join("a-pass/junit.xml").exists());
    assert!(out.join("b-fail/junit.xml").exists());
    assert!(!out.join("c-untagged").exists(), "not selected by --tag ci");
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.contains("scenario") || !l.contains("verdict"))
        .collect();
    assert!(
        table
            .iter()
            .any(|l| l.contains("a-pass") && l.contains("PASS")),
        "{stdout}"
    );
    assert!(
        table
            .iter()
            .any(|l| l.contains("b-fail") && l.contains("FAIL")),
        "{stdout}"
    );
    let seen = junit_check(&out.join("a-pass/junit.xml"));
    assert!(seen.contains("failures=0"), "{seen}");

    let none = drill(
        &["run", &drills.display().to_string(), "--tag", "nightly"],
        &[],
    );
    assert_eq!(none.status.code(), Some(2), "{}", show(&none));
}
