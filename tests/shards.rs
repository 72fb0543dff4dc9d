//! Drills split across CI runners (issue: past one machine): `drill run --shard K/N`, `drill
//! list --shards N` and `drill merge`. Six short drills on drill's embedded MQTT broker, one of
//! them failing, run whole and as three shards one after another: the merge gives the same
//! drills, verdicts and exit code. A shard missing from the merge, or a drill a shard declared
//! with no report, makes it exit 3 naming what is missing.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::run::{drill, show};

/// Six drills, 2–4 s each; `short-4` expects a recovery no engine makes (1 ms): it fails.
fn six_drills(dir: &Path) {
    for i in 1..=6u32 {
        let expect = if i == 4 {
            "{ lost: 0, recovery_within: 1ms }"
        } else {
            "{ lost: 0, ledger: closes }"
        };
        let text = format!(
            "name: short-{i}\nseed: {i}\ndestination: {{ kind: mqtt, runtime: embedded, topic: drill/short{i} }}\nsystem: {{ builtin: {{ keepalive: 1s, answer_timeout: 2s }} }}\nworkload: {{ rate: 50/s, duration: {}s, keys: 2 }}\nfaults:\n  - {{ at: 1s, link: mqtt, fault: refuse, for: 1s }}\nexpect: {expect}\n",
            2 + (i - 1) / 2
        );
        std::fs::write(dir.join(format!("s{i}.yaml")), text).unwrap();
    }
}

/// drill → verdict, from each `<drill>/report.json` under `dir`.
fn verdicts(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("report.json")).ok()?;
            let r: serde_json::Value = serde_json::from_str(&text).ok()?;
            Some((
                r["scenario"].as_str()?.to_string(),
                r["verdict"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[test]
fn three_shards_merged_give_the_unsharded_runs_drills_verdicts_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let drills = dir.path().join("drills");
    std::fs::create_dir(&drills).unwrap();
    six_drills(&drills);
    let d = drills.display().to_string();
    let whole = dir.path().join("whole");
    let o = drill(&["run", &d, "--out", &whole.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let expected = verdicts(&whole);
    assert_eq!(expected.len(), 6, "{expected:?}");
    assert_eq!(expected["short-4"], "fail");

    let mut outs = Vec::new();
    for k in 1..=3 {
        let out = dir.path().join(format!("shard-{k}"));
        let o = drill(&[
            "run",
            &d,
            "--shard",
            &format!("{k}/3"),
            "--out",
            &out.display().to_string(),
        ]);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", show(&o));
        outs.push(out.display().to_string());
    }
    let merged = dir.path().join("merged");
    let mut args = vec!["merge"];
    args.extend(outs.iter().map(String::as_str));
    let merged_arg = merged.display().to_string();
    args.extend(["--out", &merged_arg]);
    let o = drill(&args);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(verdicts(&merged), expected);
    // One JUnit file with every drill's suite, one failing; an index and a summary.
    let junit = std::fs::read_to_string(merged.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testsuite ").count(), 6, "{junit}");
    assert!(junit.contains("failures=\"1\""), "{junit}");
    let index = std::fs::read_to_string(merged.join("report.md")).unwrap();
    assert!(
        index.contains("[short-4](short-4/report.md): FAIL"),
        "{index}"
    );
    let summary = std::fs::read_to_string(merged.join("summary.md")).unwrap();
    assert!(
        summary.contains("6 drills, 5 passed, 1 failed"),
        "{summary}"
    );

    // A shard missing: named, exit 3 (what was there is merged all the same).
    let o = drill(&[
        "merge",
        &outs[0],
        &outs[2],
        "--out",
        &dir.path().join("partial").display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("shard 2/3 is missing"),
        "{}",
        show(&o)
    );
    // A shard that declared a drill and wrote no report for it (stopped early): named, exit 3.
    let stopped = Path::new(&outs[0]);
    let gone = std::fs::read_dir(stopped)
        .unwrap()
        .flatten()
        .find(|e| e.path().join("report.json").is_file())
        .unwrap()
        .path();
    std::fs::remove_dir_all(&gone).unwrap();
    let o = drill(&[
        "merge",
        &outs[0],
        &outs[1],
        &outs[2],
        "--out",
        &dir.path().join("stopped").display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("wrote no report for it"),
        "{}",
        show(&o)
    );
    // Shards of another drill version, or of another set of drills, are not one run: exit 2.
    let mark = Path::new(&outs[1]).join("shard.json");
    let original = std::fs::read_to_string(&mark).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&original).unwrap();
    for (field, value, says) in [
        ("version", serde_json::json!("0.0.1"), "one drill version"),
        (
            "selection",
            serde_json::json!(["another"]),
            "different sets of drills",
        ),
    ] {
        let kept = doc[field].clone();
        doc[field] = value;
        std::fs::write(&mark, doc.to_string()).unwrap();
        let o = drill(&[
            "merge",
            &outs[0],
            &outs[1],
            &outs[2],
            "--out",
            &dir.path().join("mixed").display().to_string(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{field}: {}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(says),
            "{}",
            show(&o)
        );
        doc[field] = kept;
    }
}

/// `drill list --shards 3` over the `ci` catalogue: every drill in exactly one shard, and the
/// shards as even as the drills allow: none longer than the longest drill or 1.25 × the mean.
/// (The `ci` catalogue holds `kafka-cut-6m`, 390 s of its 917: no split of whole drills gets
/// within 25 % there.)
#[test]
fn the_ci_catalogue_lists_into_three_shards_each_drill_once() {
    let scenarios = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
    let o = drill(&["list", scenarios, "--tag", "ci", "--shards", "3", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let drills = doc["drills"].as_array().unwrap();
    let all = drill(&["list", scenarios, "--tag", "ci", "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(drills.len(), all["drills"].as_array().unwrap().len());
    let mut names: Vec<&str> = drills.iter().map(|d| d["name"].as_str().unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), drills.len(), "each drill once");
    let mut load = [0u64; 3];
    for d in drills {
        let shard = d["shard"].as_u64().unwrap() as usize;
        assert!((1..=3).contains(&shard), "{d}");
        load[shard - 1] += d["plays_s"].as_u64().unwrap();
    }
    let longest = drills
        .iter()
        .map(|d| d["plays_s"].as_u64().unwrap())
        .max()
        .unwrap();
    let mean = load.iter().sum::<u64>() as f64 / 3.0;
    let bound = (longest as f64).max(1.25 * mean);
    println!("planned per shard: {load:?}, longest drill {longest} s, mean {mean:.0} s");
    assert!(load.iter().all(|l| *l as f64 <= bound), "{load:?}");
    let totals: Vec<u64> = doc["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["plays_s"].as_u64().unwrap())
        .collect();
    assert_eq!(totals, load.to_vec());
}

#[test]
fn a_shard_that_is_not_k_of_n_is_refused() {
    let scenarios = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
    for bad in ["0/3", "4/3", "two"] {
        let o = drill(&["run", scenarios, "--shard", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("K/N"),
            "{bad}: {}",
            show(&o)
        );
    }
}

/// `drill selftest --shard K/N`: the mutant × drill cells split in two, run one shard after
/// the other, and merged: the same matrix verdict as the unsharded selftest — the correct
/// engine passes both drills and `memory-only` is caught (lost) by the drill that kills the
/// engine mid-outage, whichever shard ran that cell. A shard alone is missing its twin (exit
/// 3, named), and a selftest shard is not merged with a drill run (exit 2).
#[test]
fn selftest_shards_merged_give_the_unsharded_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let drills = dir.path().join("drills");
    std::fs::create_dir(&drills).unwrap();
    let head = |name: &str| {
        format!(
            "name: {name}\ndestination: {{ kind: mqtt, runtime: embedded, topic: drill/{name} }}\nsystem: {{ builtin: {{ keepalive: 1s, answer_timeout: 2s }} }}\nworkload: {{ rate: 50/s, duration: 6s, keys: 2 }}\nexpect: {{ lost: 0, ledger: closes }}\nfaults:\n  - {{ at: 1s, link: mqtt, fault: refuse, for: 3s }}\n"
        )
    };
    std::fs::write(drills.join("refused.yaml"), head("st-refused")).unwrap();
    std::fs::write(
        drills.join("killed.yaml"),
        head("st-killed") + "  - { at: 2s, target: engine, action: kill, restart_after: 1s }\n",
    )
    .unwrap();
    let d = drills.display().to_string();
    let selftest = |out: &Path, shard: Option<&str>| {
        let out = out.display().to_string();
        let mut args = vec![
            "selftest",
            &d,
            "--mutant",
            "memory-only",
            "--jobs",
            "2",
            "--out",
            &out,
        ];
        if let Some(s) = shard {
            args.extend(["--shard", s]);
        }
        drill(&args)
    };
    let read = |out: &Path| -> serde_json::Value {
        let text = std::fs::read_to_string(out.join("selftest/selftest.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let caught_by = |doc: &serde_json::Value| -> Vec<String> {
        doc["rows"][1]["cells"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["outcome"] == "caught")
            .map(|c| c["scenario"].as_str().unwrap().to_string())
            .collect()
    };
    let whole = dir.path().join("whole");
    let o = selftest(&whole, None);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let whole = read(&whole);
    assert_eq!(caught_by(&whole), ["st-killed"], "{whole:#}");

    let shards: Vec<std::path::PathBuf> = (1..=2)
        .map(|k| dir.path().join(format!("shard-{k}")))
        .collect();
    for (k, out) in shards.iter().enumerate() {
        let o = selftest(out, Some(&format!("{}/2", k + 1)));
        assert_eq!(
            o.status.code(),
            Some(0),
            "a shard fails only on a false alarm: {}",
            show(&o)
        );
        let part = read(out);
        let elsewhere = part["rows"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["cells"].as_array().unwrap().iter())
            .filter(|c| c["outcome"] == "elsewhere")
            .count();
        assert!(elsewhere > 0 && elsewhere < 4, "{part:#}");
    }
    let merged = dir.path().join("merged");
    let (a, b) = (
        shards[0].display().to_string(),
        shards[1].display().to_string(),
    );
    let m = merged.display().to_string();
    let o = drill(&["merge", &a, &b, "--out", &m]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let merged = read(&merged);
    assert_eq!(caught_by(&merged), caught_by(&whole));
    assert_eq!(merged["missed"], whole["missed"]);
    assert_eq!(merged["ok"], true);
    let correct: Vec<&str> = merged["rows"][0]["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(correct, ["pass", "pass"], "{merged:#}");

    // A shard's summary is not taken on its word: one that claims its catch was a miss is
    // judged again from the drill's report (still caught); one whose report is gone is an
    // error, not the catch it claims: the mutant is missed (exit 1).
    let holder = shards
        .iter()
        .find(|s| {
            read(s)["rows"][1]["cells"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["scenario"] == "st-killed" && c["outcome"] == "caught")
        })
        .expect("a shard caught memory-only");
    let file = holder.join("selftest/selftest.json");
    let mut doc = read(holder);
    for c in doc["rows"][1]["cells"].as_array_mut().unwrap() {
        if c["scenario"] == "st-killed" {
            c["outcome"] = "pass".into();
            c["caught_by"] = serde_json::json!([]);
        }
    }
    std::fs::write(&file, serde_json::to_string(&doc).unwrap()).unwrap();
    let rejudged = dir.path().join("rejudged");
    let r = rejudged.display().to_string();
    let o = drill(&["merge", &a, &b, "--out", &r]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(caught_by(&read(&rejudged)), ["st-killed"]);
    std::fs::remove_file(holder.join("selftest/memory-only/st-killed/report.json")).unwrap();
    let gone = dir.path().join("gone");
    let g = gone.display().to_string();
    let o = drill(&["merge", &a, &b, "--out", &g]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(read(&gone)["missed"], serde_json::json!(["memory-only"]));
    let errors = read(&gone)["errors"].to_string();
    assert!(errors.contains("no report to judge again"), "{errors}");

    // Merges that cannot be one selftest: only shard 1 (exit 3); shard 1 beside an empty
    // folder, a shard that died before writing (exit 3); beside a drill run's folder (exit 2).
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let run = dir.path().join("a-run");
    std::fs::create_dir_all(run.join("some-drill")).unwrap();
    std::fs::write(run.join("some-drill/report.json"), "{\"verdict\":\"pass\"}").unwrap();
    for (with, code, says) in [
        (None, 3, "selftest shard 2/2 is missing"),
        (Some(&empty), 3, "no selftest shard there"),
        (Some(&run), 2, "merge the shards of one kind of run"),
    ] {
        let out = dir.path().join(format!("bad-{code}-{}", with.is_some()));
        let out = out.display().to_string();
        let other = with.map(|w| w.display().to_string());
        let mut args = vec!["merge", a.as_str()];
        args.extend(other.as_deref());
        args.extend(["--out", out.as_str()]);
        let o = drill(&args);
        assert_eq!(o.status.code(), Some(code), "{}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(says),
            "{}",
            show(&o)
        );
    }
}
