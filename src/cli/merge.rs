//! `drill merge OUT_DIR... --out DIR`: the reports of drills run apart (shards on several CI
//! runners, `drill run --shard K/N`) put back together as one run: each drill's folder copied
//! into DIR, one `summary.md` (and the terminal table), one `junit.xml` with every drill's
//! suite, an index `report.md` linking each drill's report; exit code the worst of the drills.
//!
//! A shard declares itself in `OUT_DIR/shard.json` before its first drill starts (which shard
//! of how many, and its drills). A shard that is missing among 1..N, or a drill a shard declared
//! with no report, is named, and the merge exits 3 (what was there is still merged). Shards of
//! different drill versions or drill sets are not one run: exit 2. Selftest shards
//! (`drill selftest --shard`) are merged by [`super::selftest::merge`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde::{Deserialize, Serialize};

use super::{FAIL, INFRASTRUCTURE, PASS};

/// What `drill run --shard K/N` writes into its output folder first: `shard.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ShardMark {
    pub shard: usize,
    pub of: usize,
    /// This shard's drills.
    pub drills: Vec<String>,
    /// The drill that ran it.
    #[serde(default)]
    pub version: String,
    /// Every drill of the selection the shards split.
    #[serde(default)]
    pub selection: Vec<String>,
}

/// Writes the mark of `shard` with its `drills`, of all those in `selection`, into `out`.
pub fn mark(
    out: &Path,
    shard: super::shard::Shard,
    drills: Vec<String>,
    mut selection: Vec<String>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    selection.sort();
    let mark = ShardMark {
        shard: shard.k,
        of: shard.n,
        drills,
        version: env!("DRILL_BUILD").to_string(),
        selection,
    };
    let text = serde_json::to_string_pretty(&mark).map_err(std::io::Error::other)?;
    std::fs::write(out.join("shard.json"), text)
}

/// One drill found in an input folder.
struct Found {
    name: String,
    dir: PathBuf,
    report: serde_json::Value,
    shard: Option<usize>,
}

impl Found {
    fn passed(&self) -> bool {
        self.report["verdict"] == "pass"
    }

    fn number(&self, field: &str) -> u64 {
        self.report["ledger"][field].as_u64().unwrap_or(0)
    }
}

pub fn merge(inputs: &[PathBuf], out: &Path) -> u8 {
    match kind_of(inputs) {
        Ok(true) => return super::selftest::merge(inputs, out),
        Ok(false) => {}
        Err(why) => {
            eprintln!("drill merge: {why}");
            return super::INVALID;
        }
    }
    merge_runs(inputs, out)
}

/// Whether `inputs` are selftest shards (`true`) or drill runs (`false`); `Err` when both. A
/// folder with nothing in it (a shard that died before writing, an artifact that was not
/// uploaded) is a missing shard of whichever kind the others are.
fn kind_of(inputs: &[PathBuf]) -> Result<bool, String> {
    let selftests = inputs
        .iter()
        .filter(|d| super::selftest::is_selftest(d))
        .count();
    let holds_drills = |d: &PathBuf| !drill_folders(d).is_empty() || d.join("shard.json").is_file();
    let runs = inputs
        .iter()
        .filter(|d| !super::selftest::is_selftest(d) && holds_drills(d))
        .count();
    match (selftests, runs) {
        (0, _) => Ok(false),
        (_, 0) => Ok(true),
        _ => Err(format!(
            "{selftests} of the {} folders hold a selftest and {runs} drill runs: merge the shards of one kind of run",
            inputs.len()
        )),
    }
}

/// The merge of drill runs (`drill run --shard`).
fn merge_runs(inputs: &[PathBuf], out: &Path) -> u8 {
    let mut problems = Vec::new();
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    let mut marks = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            problems.push(format!(
                "{}: no such folder (a shard that did not write its reports?)",
                input.display()
            ));
            continue;
        }
        let mark: Option<ShardMark> = std::fs::read_to_string(input.join("shard.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        for (name, dir) in drill_folders(input) {
            let Some(report) = std::fs::read_to_string(dir.join("report.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
            else {
                continue;
            };
            if let Some(earlier) = found.get(&name) {
                problems.push(format!(
                    "drill `{name}` is in both {} and {}; the first is kept",
                    earlier.dir.display(),
                    dir.display()
                ));
                continue;
            }
            let shard = mark.as_ref().map(|m| m.shard);
            found.insert(
                name.clone(),
                Found {
                    name,
                    dir,
                    report,
                    shard,
                },
            );
        }
        if let Some(m) = mark {
            for d in &m.drills {
                if !found.contains_key(d) {
                    problems.push(format!(
                        "shard {}/{} ({}) declared drill `{d}` and wrote no report for it",
                        m.shard,
                        m.of,
                        input.display()
                    ));
                }
            }
            marks.push(m);
        }
    }
    if let Err(why) = one_run(&marks) {
        eprintln!("drill merge: {why}");
        return super::INVALID;
    }
    problems.extend(missing_shards(&marks));
    if found.is_empty() {
        problems
            .push("no drill reports (DIR/<drill>/report.json) in the folders given".to_string());
    }
    let written = write(out, &found);
    if let Err(e) = &written {
        problems.push(format!(
            "cannot write the merge into {}: {e}",
            out.display()
        ));
    }
    let drills: Vec<&Found> = found.values().collect();
    if !drills.is_empty() {
        println!("{}", table(&drills));
    }
    for p in &problems {
        eprintln!("drill merge: {p}");
    }
    if let Ok(paths) = written {
        for p in paths {
            println!("  wrote {}", p.display());
        }
    }
    let worst = if drills.iter().all(|d| d.passed()) {
        PASS
    } else {
        FAIL
    };
    if problems.is_empty() {
        worst
    } else {
        INFRASTRUCTURE.max(worst)
    }
}

/// The shards must be of one run: one drill version, one selection of drills.
fn one_run(marks: &[ShardMark]) -> Result<(), String> {
    let Some(first) = marks.first() else {
        return Ok(());
    };
    for m in &marks[1..] {
        if m.version != first.version {
            return Err(format!(
                "shard {}/{} was run by drill {} and shard {}/{} by drill {}: merge the shards of one drill version",
                first.shard, first.of, first.version, m.shard, m.of, m.version
            ));
        }
        if m.selection != first.selection {
            return Err(format!(
                "shards {}/{} and {}/{} split different sets of drills: merge the shards of one run (same files and tags)",
                first.shard, first.of, m.shard, m.of
            ));
        }
    }
    Ok(())
}

/// Shards of 1..N that no input declared, and inputs that disagree on N.
fn missing_shards(marks: &[ShardMark]) -> Vec<String> {
    let Some(n) = marks.first().map(|m| m.of) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if let Some(other) = marks.iter().find(|m| m.of != n) {
        problems.push(format!(
            "the shards disagree on how many there are ({n} and {})",
            other.of
        ));
    }
    for k in 1..=n {
        if !marks.iter().any(|m| m.shard == k) {
            problems.push(format!(
                "shard {k}/{n} is missing: none of the folders given holds its reports"
            ));
        }
    }
    problems
}

/// The subfolders of `dir` that hold a drill's report, by name.
fn drill_folders(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("report.json").is_file())
                .filter_map(|p| Some((p.file_name()?.to_str()?.to_string(), p)))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Copies each drill's folder (its work folder left out) and writes the summary, the index and
/// the JUnit file.
fn write(out: &Path, found: &BTreeMap<String, Found>) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out)?;
    for d in found.values() {
        copy_drill(&d.dir, &out.join(&d.name))?;
    }
    let drills: Vec<&Found> = found.values().collect();
    let summary = out.join("summary.md");
    std::fs::write(&summary, summary_md(&drills))?;
    let index = out.join("report.md");
    std::fs::write(&index, index_md(&drills))?;
    let junit = out.join("junit.xml");
    std::fs::write(&junit, junit_xml(&drills))?;
    Ok(vec![summary, index, junit])
}

fn copy_drill(from: &Path, to: &Path) -> std::io::Result<()> {
    if from == to {
        return Ok(());
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)?.flatten() {
        let path = entry.path();
        if path.is_file()
            && let Some(name) = path.file_name()
        {
            std::fs::copy(&path, to.join(name))?;
        }
    }
    Ok(())
}

fn row(d: &Found) -> [String; 6] {
    [
        d.name.clone(),
        if d.passed() { "PASS" } else { "FAIL" }.to_string(),
        d.number("held").to_string(),
        d.number("lost").to_string(),
        d.number("duplicates_beyond_promise").to_string(),
        d.shard.map_or_else(|| "-".to_string(), |s| s.to_string()),
    ]
}

const HEADER: [&str; 6] = [
    "drill",
    "verdict",
    "held",
    "lost",
    "dup. beyond promise",
    "shard",
];

fn table(drills: &[&Found]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED)
        .set_header(HEADER.to_vec());
    for d in drills {
        t.add_row(row(d).to_vec());
    }
    t
}

fn summary_md(drills: &[&Found]) -> String {
    let failed = drills.iter().filter(|d| !d.passed()).count();
    let mut md = format!(
        "# drill: {} drills, {} passed, {failed} failed\n\n| {} |\n|{}\n",
        drills.len(),
        drills.len() - failed,
        HEADER.join(" | "),
        "---|".repeat(HEADER.len())
    );
    for d in drills {
        md.push_str(&format!("| {} |\n", row(d).join(" | ")));
    }
    md
}

fn index_md(drills: &[&Found]) -> String {
    let mut md = String::from("# drill: the merged run\n\n");
    for d in drills {
        let headline = d.report["headline"].as_str().unwrap_or("");
        md.push_str(&format!(
            "- [{}]({}/report.md): {} — {headline}\n",
            d.name,
            d.name,
            if d.passed() { "PASS" } else { "FAIL" }
        ));
    }
    md
}

/// Every drill's `<testsuite>` under one `<testsuites>`, the counts summed.
fn junit_xml(drills: &[&Found]) -> String {
    let mut suites = String::new();
    let (mut tests, mut failures, mut errors, mut time) = (0u64, 0u64, 0u64, 0f64);
    let attr = |tag: &str, name: &str| -> Option<String> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        let end = tag[at..].find('"')?;
        Some(tag[at..at + end].to_string())
    };
    for d in drills {
        let Ok(text) = std::fs::read_to_string(d.dir.join("junit.xml")) else {
            continue;
        };
        let (Some(start), Some(end)) = (text.find("<testsuite "), text.rfind("</testsuite>"))
        else {
            continue;
        };
        let suite = &text[start..end + "</testsuite>".len()];
        let tag = &suite[..suite.find('>').unwrap_or(suite.len())];
        let n = |name: &str| {
            attr(tag, name)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        tests += n("tests");
        failures += n("failures");
        errors += n("errors");
        time += attr(tag, "time")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        suites.push_str("    ");
        suites.push_str(suite);
        suites.push('\n');
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"drill\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{time:.3}\">\n{suites}</testsuites>\n"
    )
}
