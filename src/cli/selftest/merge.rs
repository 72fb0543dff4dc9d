//! `drill merge` of selftest shards (`drill selftest --shard K/N`, each with its own `--out`):
//! the cells of every shard put back into one matrix, judged whole — a mutant is missed only if
//! no shard caught it — and published as `selftest.md` / `selftest.json` in `OUT/selftest`,
//! beside the drills' reports each shard ran (copied, under `OUT/selftest/<engine>/`).
//!
//! A shard's summary is not trusted: each cell is judged again from the drill's own
//! `report.json` (and exit code), with the same rules as `drill selftest` (`cell::judge`); a
//! cell whose report is missing is an error, whatever the shard said.
//!
//! Bad input, exit 2: parts of different drill versions, of different drill sets or of
//! different shard counts. A shard missing among 1..N, or a cell no shard ran, exit 3 (what was
//! there is still merged and shown).

use std::path::{Path, PathBuf};

use super::cell::{CellOutcome, judge};
use super::{Row, Selftest, conclude, exit_code, publish};
use crate::cli::{INFRASTRUCTURE, INVALID};

/// Whether `dir` holds a selftest's output (`dir/selftest/selftest.json`).
pub fn is_selftest(dir: &Path) -> bool {
    dir.join("selftest").join("selftest.json").is_file()
}

/// Merges the selftest shards in `inputs` into `out`; the exit code of the whole selftest.
pub fn merge(inputs: &[PathBuf], out: &Path) -> u8 {
    let mut parts: Vec<(PathBuf, Selftest)> = Vec::new();
    let mut problems = Vec::new();
    for input in inputs {
        let file = input.join("selftest").join("selftest.json");
        match std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Selftest>(&t).map_err(|e| e.to_string()))
        {
            Ok(part) => parts.push((input.clone(), part)),
            Err(e) => problems.push(format!(
                "{}: no selftest shard there ({e}); a shard that did not write its reports?",
                file.display()
            )),
        }
    }
    if let Err(why) = same_run(&parts) {
        eprintln!("drill merge: {why}");
        return INVALID;
    }
    let Some((_, first)) = parts.first() else {
        for p in &problems {
            eprintln!("drill merge: {p}");
        }
        return INFRASTRUCTURE;
    };
    let n = first.shard.map_or(1, |(_, n)| n);
    for k in 1..=n {
        if !parts
            .iter()
            .any(|(_, p)| p.shard.map_or(1, |(k, _)| k) == k)
        {
            problems.push(format!(
                "selftest shard {k}/{n} is missing: none of the folders given holds it"
            ));
        }
    }
    let scenarios = first.scenarios.clone();
    let mut rows = first.rows.clone();
    for (dir, part) in parts.iter().skip(1) {
        for (row, theirs) in rows.iter_mut().zip(&part.rows) {
            for (cell, their) in row.cells.iter_mut().zip(&theirs.cells) {
                match (cell.outcome, their.outcome) {
                    (_, CellOutcome::Elsewhere) => {}
                    (CellOutcome::Elsewhere, _) => *cell = their.clone(),
                    _ => problems.push(format!(
                        "{} × {} is in two shards ({} too); the first is kept",
                        row.engine,
                        cell.scenario,
                        dir.display()
                    )),
                }
            }
        }
    }
    let unrun = rows
        .iter()
        .flat_map(|r| r.cells.iter())
        .filter(|c| c.outcome == CellOutcome::Elsewhere)
        .count();
    if unrun > 0 && problems.is_empty() {
        problems.push(format!("{unrun} cells were run by no shard"));
    }
    // The shards ran side by side: the merged selftest took as long as the longest.
    let took_s = parts.iter().map(|(_, p)| p.took_s).fold(0.0, f64::max);
    let dir = out.join("selftest");
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| copy_reports(&parts, &dir)) {
        problems.push(format!(
            "cannot copy the shards' reports into {}: {e}",
            dir.display()
        ));
    }
    let planned = first.planned.clone();
    rejudge(&mut rows, &planned, &dir);
    let mut result = conclude(scenarios, rows, took_s);
    result.planned = planned;
    let published = publish(&result, &dir);
    for p in &problems {
        eprintln!("drill merge: {p}");
    }
    if !problems.is_empty() || published.is_err() {
        INFRASTRUCTURE
    } else {
        exit_code(&result)
    }
}

/// Judges every cell that ran again from its drill's report under `dir/<engine>/<drill>/`:
/// a shard's word for it is not taken.
fn rejudge(rows: &mut [Row], planned: &[Vec<String>], dir: &Path) {
    for row in rows.iter_mut() {
        for (c, cell) in row.cells.iter_mut().enumerate() {
            if !matches!(
                cell.outcome,
                CellOutcome::Pass | CellOutcome::Caught | CellOutcome::Other
            ) {
                continue;
            }
            let file = dir
                .join(&row.engine)
                .join(&cell.scenario)
                .join("report.json");
            let report = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            let targets = planned.get(c).cloned().unwrap_or_default();
            let claimed = cell.short();
            let (outcome, caught_by, failures) =
                judge(cell.exit, report.as_ref(), &row.signature, &targets);
            cell.outcome = outcome;
            cell.caught_by = caught_by;
            cell.failures = if outcome == CellOutcome::Error {
                vec![format!(
                    "{}: no report to judge again (the shard said {claimed})",
                    file.display()
                )]
            } else {
                failures
            };
        }
    }
}

/// The parts must be shards of one selftest: one drill version, one set of drills and
/// engines, one shard count.
fn same_run(parts: &[(PathBuf, Selftest)]) -> Result<(), String> {
    let Some((first_dir, first)) = parts.first() else {
        return Ok(());
    };
    let engines = |s: &Selftest| s.rows.iter().map(|r| r.engine.clone()).collect::<Vec<_>>();
    for (dir, part) in &parts[1..] {
        let (a, b) = (first_dir.display(), dir.display());
        if part.version != first.version {
            return Err(format!(
                "{a} was run by drill {} and {b} by drill {}: merge shards of one drill version",
                first.version, part.version
            ));
        }
        if part.scenarios != first.scenarios || engines(part) != engines(first) {
            return Err(format!(
                "{a} and {b} are selftests of different drills or mutants: merge the shards of one selftest (same files, tags and --mutant)"
            ));
        }
        if part.shard.map(|(_, n)| n) != first.shard.map(|(_, n)| n) {
            return Err(format!("{a} and {b} disagree on how many shards there are"));
        }
    }
    Ok(())
}

/// Each shard's drill reports (`selftest/<engine>/<drill>/`) into `into`.
fn copy_reports(parts: &[(PathBuf, Selftest)], into: &Path) -> std::io::Result<()> {
    for (dir, _) in parts {
        let from = dir.join("selftest");
        for engine in std::fs::read_dir(&from)?.flatten() {
            if engine.path().is_dir() {
                copy_tree(&engine.path(), &into.join(engine.file_name()))?;
            }
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    if from == to {
        return Ok(());
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_tree(&path, &to.join(entry.file_name()))?;
        } else {
            std::fs::copy(&path, to.join(entry.file_name()))?;
        }
    }
    Ok(())
}
