//! `drill run FILE|DIR... [--tag T] [--shard K/N]`: every scenario validated before anything
//! starts (only shard K of N kept, see [`super::shard`]), then run
//! one after another, each into `OUT/<scenario name>/`; a summary table at the end when there
//! were several, and the worst exit code. With `GITHUB_STEP_SUMMARY` set, each drill's
//! headline, tiles and ledger line are appended to that file.

use std::path::PathBuf;
use std::time::Instant;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use tokio_util::sync::CancellationToken;

use crate::dest::Runtime;
use crate::scenario::Plan;
use crate::{report, runner, scenario};

use super::{FAIL, INFRASTRUCTURE, INVALID, PASS};

/// What one scenario came to, for the summary table.
struct Outcome {
    name: String,
    code: u8,
    report: Option<report::Report>,
    took_s: f64,
}

pub struct Flags {
    pub paths: Vec<PathBuf>,
    pub out: PathBuf,
    pub seed: Option<u64>,
    pub runtime: Option<Runtime>,
    pub tags: Vec<String>,
    /// Only this shard of the selected drills.
    pub shard: Option<super::shard::Shard>,
}

pub async fn run(flags: Flags, cancel: CancellationToken) -> u8 {
    let mut plans = match plans(&flags.paths, &flags.tags) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(shard) = flags.shard {
        let of = plans.len();
        let selection: Vec<String> = plans.iter().map(|p| p.name.clone()).collect();
        plans = super::shard::keep(plans, shard);
        let names: Vec<&str> = plans.iter().map(|p| p.name.as_str()).collect();
        println!(
            "drill: shard {}/{}: {} of {of} drills{}{}",
            shard.k,
            shard.n,
            plans.len(),
            if names.is_empty() { "" } else { ": " },
            names.join(", ")
        );
        // The shard declares itself first, so a merge can tell a shard that stopped early
        // from one that never ran.
        let drills = plans.iter().map(|p| p.name.clone()).collect();
        if let Err(e) = super::merge::mark(&flags.out, shard, drills, selection) {
            eprintln!(
                "drill: cannot write {}: {e}",
                flags.out.join("shard.json").display()
            );
            return INFRASTRUCTURE;
        }
        if plans.is_empty() {
            return PASS;
        }
    }
    let engine_exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("drill: cannot find my own executable to run the engine: {e}");
            return INFRASTRUCTURE;
        }
    };
    let options = runner::Options {
        out: flags.out.clone(),
        runtime: flags.runtime,
        seed: flags.seed,
        engine_exe,
    };
    let summary_file = std::env::var_os("GITHUB_STEP_SUMMARY").map(PathBuf::from);
    let mut outcomes = Vec::new();
    for plan in &plans {
        if cancel.is_cancelled() {
            break;
        }
        let started = Instant::now();
        let (code, report) = one(plan, &options, &flags.out, &cancel).await;
        if let (Some(path), Some(r)) = (&summary_file, &report) {
            let dir = flags.out.join(&plan.name);
            if let Err(e) = append(path, &report::step_summary(r, &dir)) {
                eprintln!(
                    "drill: cannot append to GITHUB_STEP_SUMMARY ({}): {e}",
                    path.display()
                );
            }
        }
        outcomes.push(Outcome {
            name: plan.name.clone(),
            code,
            report,
            took_s: started.elapsed().as_secs_f64(),
        });
        // An interrupted drill stops the whole run.
        if code == INFRASTRUCTURE && cancel.is_cancelled() {
            break;
        }
    }
    if outcomes.len() > 1 {
        println!("{}", table(&outcomes));
    }
    outcomes.iter().map(|o| o.code).max().unwrap_or(PASS)
}

/// `drill list`: every selected drill with its planned length and shard, as a table or JSON
/// (then each shard's planned total). Exit 2 on an invalid scenario, as `drill run`.
pub fn list(paths: &[PathBuf], tags: &[String], shards: usize, json: bool) -> u8 {
    let plans = match plans(paths, tags) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let listed = super::shard::list(&plans, shards);
    let mut totals = vec![0u64; shards];
    for l in &listed {
        totals[l.shard - 1] += l.plays_s;
    }
    if json {
        let doc = serde_json::json!({ "drills": listed, "shards": totals.iter().enumerate().map(|(i, t)| serde_json::json!({ "shard": i + 1, "plays_s": t })).collect::<Vec<_>>() });
        println!("{doc:#}");
        return PASS;
    }
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED)
        .set_header(vec!["drill", "plays", "shard", "tags", "file"]);
    for l in &listed {
        t.add_row(vec![
            l.name.clone(),
            format!("{} s", l.plays_s),
            format!("{}/{shards}", l.shard),
            l.tags.join(", "),
            l.file.clone(),
        ]);
    }
    println!("{t}");
    let each: Vec<String> = totals
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{}: {s} s", i + 1))
        .collect();
    println!("planned per shard: {}", each.join(", "));
    PASS
}

/// Every scenario, validated, selected by tag; exit 2 on the first invalid one.
pub(super) fn plans(paths: &[PathBuf], tags: &[String]) -> Result<Vec<Plan>, u8> {
    let files = super::scenario_files(paths).map_err(|e| {
        eprintln!("drill: {e}");
        INVALID
    })?;
    let mut plans = Vec::new();
    for file in &files {
        match scenario::load(file) {
            Ok(plan) => plans.push(plan),
            Err(e) => {
                eprintln!("drill: {e}");
                return Err(INVALID);
            }
        }
    }
    if !tags.is_empty() {
        plans.retain(|p| p.tags.iter().any(|t| tags.contains(t)));
        if plans.is_empty() {
            eprintln!(
                "drill: no scenario has the tag {}; tags are set with `tags: [...]` in a scenario",
                tags.join(" or ")
            );
            return Err(INVALID);
        }
    }
    let mut names = std::collections::HashSet::new();
    for p in &plans {
        if !names.insert(p.name.clone()) {
            eprintln!(
                "drill: two scenarios are named `{}` ({}); names choose report folders, make them unique",
                p.name,
                p.source.display()
            );
            return Err(INVALID);
        }
    }
    Ok(plans)
}

/// Runs, judges and writes one drill.
async fn one(
    plan: &Plan,
    options: &runner::Options,
    out: &std::path::Path,
    cancel: &CancellationToken,
) -> (u8, Option<report::Report>) {
    let facts = match runner::run(plan, options, cancel.clone()).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drill: {}: {e}", plan.name);
            // Bad input only the destination could tell (a read-back query that fails).
            let invalid = matches!(
                e,
                runner::RunError::Broker(crate::dest::DestError::Invalid(_))
                    | runner::RunError::Engine(crate::sut::SutError::Refused(_))
            );
            return (if invalid { INVALID } else { INFRASTRUCTURE }, None);
        }
    };
    let report = report::judge(&facts);
    let dir = out.join(&plan.name);
    match report::write(&report, &dir) {
        Ok(paths) => {
            let l = &report.ledger;
            println!(
                "{}: {} — {} {} ({}); {} duplicates, {} reordered",
                plan.name,
                report.verdict.word(),
                report.headline,
                report.ledger_line(),
                if report.closes {
                    "closes"
                } else {
                    "does not close"
                },
                l.duplicates,
                l.reordered
            );
            for x in report.expectations.iter().filter(|x| !x.ok) {
                println!(
                    "  expectation failed: {}: expected {}, got {}",
                    x.name, x.expected, x.actual
                );
            }
            for p in paths {
                println!("  wrote {}", p.display());
            }
        }
        Err(e) => {
            eprintln!("drill: cannot write the report to {}: {e}", dir.display());
            return (INFRASTRUCTURE, Some(report));
        }
    }
    let code = if report.verdict.is_pass() { PASS } else { FAIL };
    (code, Some(report))
}

fn append(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// scenario, verdict, held, lost, duplicates beyond promise, worst recovery, time.
fn table(outcomes: &[Outcome]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(vec![
        "scenario",
        "verdict",
        "held",
        "lost",
        "dup. beyond promise",
        "worst recovery",
        "time",
    ]);
    for o in outcomes {
        let row = match &o.report {
            Some(r) => {
                let worst = r
                    .recovery
                    .iter()
                    .filter_map(|x| x.first_delivery_ms.map(|f| f.saturating_sub(x.heal_ms)))
                    .max();
                vec![
                    o.name.clone(),
                    r.verdict.word().to_string(),
                    r.ledger.held.to_string(),
                    r.ledger.lost.to_string(),
                    r.ledger.duplicates_beyond_promise.to_string(),
                    worst.map_or("-".to_string(), |ms| format!("{ms} ms")),
                    format!("{:.0} s", o.took_s),
                ]
            }
            None => vec![
                o.name.clone(),
                format!("ERROR (exit {})", o.code),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("{:.0} s", o.took_s),
            ],
        };
        t.add_row(row);
    }
    t
}
