//! `drill schema` and `drill check`: the JSON Schema validates every scenario in `scenarios/`
//! with a real JSON-Schema validator (and rejects a misspelled field); `drill check` passes every
//! scenario and names file, line and column for each broken one in `fixtures/broken/`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn drill(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("drill runs")
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scenarios in {}", dir.display());
    files
}

fn schema() -> jsonschema::Validator {
    let out = drill(&["schema"]);
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

#[test]
fn every_scenario_validates_against_the_schema() {
    let validator = schema();
    let mut files = yaml_files("scenarios");
    files.extend(yaml_files("scenarios/examples"));
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", file.display());
    }
    println!(
        "{} scenario files valid against `drill schema`",
        files.len()
    );
}

#[test]
fn the_schema_takes_a_kinds_own_field_only_for_that_kind() {
    let validator = schema();
    let doc = |dest: &str| -> serde_json::Value {
        serde_saphyr::from_str(&format!(
            "name: t\ndestination: {{ {dest} }}\nworkload: {{ rate: 10/s, duration: 5s }}\n"
        ))
        .unwrap()
    };
    for good in [
        "kind: nats, stream: DRILL, nodes: 3",
        "kind: http, dedupe: conflict",
        "kind: mqtt, tls: true",
        "kind: syslog, transport: udp",
    ] {
        assert!(validator.is_valid(&doc(good)), "{good} failed the schema");
    }
    for bad in [
        "kind: mqtt, stream: DRILL",
        "kind: http, tls: true",
        "kind: nats, transport: udp",
        "kind: kafka, topc: t",
    ] {
        assert!(!validator.is_valid(&doc(bad)), "{bad} passed the schema");
    }
}

#[test]
fn the_schema_rejects_a_misspelled_field_and_a_bad_duration() {
    let validator = schema();
    for file in ["misspelled-field.yaml", "bad-duration.yaml"] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/broken")
                .join(file),
        )
        .unwrap();
        let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert!(!validator.is_valid(&doc), "{file} passed the schema");
    }
}

#[test]
fn check_passes_every_scenario_and_locates_every_broken_one() {
    let ok = drill(&["check", "scenarios", "scenarios/examples"]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(ok.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        yaml_files("scenarios").len() + yaml_files("scenarios/examples").len()
    );
    let bad = drill(&["check", "fixtures/broken"]);
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(2), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), yaml_files("fixtures/broken").len(), "{stdout}");
    for (line, (file, at)) in lines.iter().zip([
        ("bad-duration.yaml", ":3:"),
        ("misspelled-field.yaml", ":3:"),
        ("unknown-placeholder.yaml", ":4:"),
    ]) {
        assert!(line.starts_with("error "), "{line}");
        assert!(line.contains(&format!("{file}{at}")), "{line}");
    }
}
