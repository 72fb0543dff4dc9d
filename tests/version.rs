//! `drill --version` says which build it is — the version, the git commit, the enabled
//! features — and every report carries the same words, so a report says which drill judged it.

use std::process::Command;

use crate::common::run::drill;

/// What this build must call itself: the build script's words (it sets them for every target
/// of the package, these tests too), checked against git and this build's features.
fn expected() -> String {
    let commit = env!("DRILL_COMMIT");
    let known = Command::new("git")
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .is_ok_and(|s| s.success());
    let in_git = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .is_ok_and(|o| o.status.success());
    if std::env::var("DRILL_COMMIT").is_err() {
        // A commit of this checkout (HEAD may have moved on since the build), or `unknown`
        // when there is no git checkout.
        assert!(
            if in_git { known } else { commit == "unknown" },
            "commit {commit:?}: not a commit of this checkout"
        );
    }
    // In the build script's order: sorted by name.
    let mut features = Vec::new();
    if cfg!(feature = "default") {
        features.push("default");
    }
    if cfg!(feature = "kafka-tls") {
        features.push("kafka-tls");
    }
    if cfg!(feature = "mutants") {
        features.push("mutants");
    }
    if cfg!(feature = "powercut") {
        features.push("powercut");
    }
    if cfg!(feature = "test-hooks") {
        features.push("test-hooks");
    }
    if cfg!(feature = "vendored-openssl") {
        features.push("vendored-openssl");
    }
    let features = if features.is_empty() {
        "none".to_string()
    } else {
        features.join(", ")
    };
    let expected = format!(
        "{} (commit {commit}; features: {features})",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(expected, env!("DRILL_BUILD"));
    expected
}

#[test]
fn version_names_the_commit_and_the_features() {
    let out = drill(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("drill {}", expected())
    );
}

#[test]
fn every_report_carries_the_build_that_judged_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("v.yaml");
    std::fs::write(
        &file,
        "name: v\ndestination: { kind: mqtt, runtime: process, topic: drill/v }\nworkload: { rate: 20/s, duration: 2s, keys: 1 }\nexpect: { lost: 0 }\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = drill(&[
        "run",
        &file.display().to_string(),
        "--out",
        &out_dir.display().to_string(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("v/report.json")).unwrap())
            .unwrap();
    assert_eq!(
        report["versions"]["drill"],
        expected().as_str(),
        "{report:#}"
    );
    let md = std::fs::read_to_string(out_dir.join("v/report.md")).unwrap();
    assert!(md.contains(&format!("drill {}", expected())), "{md}");
}
