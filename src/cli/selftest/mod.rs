//! `drill selftest [--tag T] [--out DIR]`: every deliberately broken engine (the test-only
//! mutants of the built-in engine, `engine::mutant`) against the catalogue, and the correct
//! engine against the same drills. The matrix says, per mutant and drill, what the drill found:
//! the mutant caught by its *signature* (the expectation its breakage must fail, with the
//! count), missed, or failed for another reason — which is not a catch (`cell.rs`). A mutant no
//! drill catches by its signature, or a correct engine that fails a drill or skips a planned
//! fault, fails the selftest.
//!
//! Each cell is one `drill run` of one scenario as a child process (the mutant chosen by
//! `DRILL_MUTANT` in its environment), so cells run side by side (`--jobs`) with their own
//! brokers on their own ports and cannot disturb each other (`play.rs`). Unless `--full`, a
//! mutant's row stops at its first catch and drills are tried shortest first: CI pays for one
//! catch per mutant, not for the whole matrix. `render.rs` draws the matrix and `selftest.md`.
//!
//! `--shard K/N` runs only shard K of the mutant × drill cells (a stable split by each drill's
//! planned length, as `drill run --shard`); the other cells are `elsewhere`. A shard cannot
//! tell a missed mutant (another shard may catch it): it fails only on a false alarm, and
//! `drill merge` puts the shards' cells back into one matrix and judges it whole (`merge.rs`).

mod cell;
mod merge;
mod play;
mod render;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::check::Signature;
use crate::scenario::Plan;

use super::{FAIL, INFRASTRUCTURE, INVALID, PASS};
pub use cell::{Cell, CellOutcome};
pub use merge::{is_selftest, merge};
use play::Jobs;
use render::{markdown, matrix, summary_lines};

pub struct Flags {
    pub paths: Vec<PathBuf>,
    pub tags: Vec<String>,
    pub out: PathBuf,
    pub jobs: usize,
    pub full: bool,
    /// Only these mutants (all when empty).
    pub mutants: Vec<String>,
    /// Only the correct engine's row: the catalogue's false-alarm check.
    pub no_mutants: bool,
    pub seed: Option<u64>,
    /// Only this shard of the cells.
    pub shard: Option<super::shard::Shard>,
}

/// One engine's row: the correct engine (`mutant: None`) or one mutant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub engine: String,
    pub description: String,
    /// What catches it (empty for the correct engine): see `Mutant::signature`.
    pub signature: Vec<Signature>,
    pub cells: Vec<Cell>,
    /// The drill its row tries first, when the mutant names one (a fault only one drill of
    /// the catalogue plays); the rest follow shortest first.
    #[serde(skip)]
    pub first: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Selftest {
    /// The drill that ran it (`drill merge` refuses to mix versions).
    #[serde(default)]
    pub version: String,
    /// `[K, N]` for a shard's part of the matrix.
    #[serde(default)]
    pub shard: Option<(usize, usize)>,
    pub scenarios: Vec<String>,
    /// Per drill (in `scenarios`' order), the fault targets it plans: what `drill merge` needs
    /// to judge each cell again from its report.
    #[serde(default)]
    pub planned: Vec<Vec<String>>,
    pub rows: Vec<Row>,
    /// Mutants no drill caught by their signature.
    pub missed: Vec<String>,
    pub false_alarms: Vec<String>,
    pub errors: Vec<String>,
    pub took_s: f64,
    pub ok: bool,
}

/// A mutant's name, what it does wrong, its signature, and the drill to try first.
type MutantRow = (
    &'static str,
    &'static str,
    Vec<Signature>,
    Option<&'static str>,
);

pub async fn run(flags: Flags, cancel: CancellationToken) -> u8 {
    let mutants = if flags.no_mutants {
        Vec::new()
    } else {
        let Some(mutants) = mutants(&flags.mutants) else {
            return INVALID;
        };
        mutants
    };
    let plans = match super::run::plans(&flags.paths, &flags.tags) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("drill selftest: cannot find my own executable: {e}");
            return INFRASTRUCTURE;
        }
    };
    let dir = flags.out.join("selftest");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("drill selftest: cannot create {}: {e}", dir.display());
        return INFRASTRUCTURE;
    }
    // Shortest drills first: a mutant's row usually ends at its first, cheapest catch.
    let mut plans = plans;
    plans.sort_by_key(|p| (p.plays_for(), p.name.clone()));
    let started = Instant::now();
    println!(
        "drill selftest: {} engines (the correct one and {} mutants) × {} drills, {} at a time{}",
        mutants.len() + 1,
        mutants.len(),
        plans.len(),
        flags.jobs,
        if flags.full {
            ""
        } else {
            "; a mutant's row stops at its first catch by its signature (--full runs every cell)"
        }
    );
    let mut rows = empty_rows(&mutants, &plans);
    if let Some(shard) = flags.shard {
        let mine = keep_shard(&mut rows, &plans, shard);
        println!(
            "drill selftest: shard {}/{}: {mine} of {} cells",
            shard.k,
            shard.n,
            rows.len() * plans.len()
        );
    }
    let jobs = Jobs {
        exe: &exe,
        dir: &dir,
        plans: &plans,
        seed: flags.seed,
    };
    jobs.play(&mut rows, flags.jobs.max(1), flags.full, &cancel)
        .await;
    if cancel.is_cancelled() {
        eprintln!("drill selftest: interrupted");
        return INFRASTRUCTURE;
    }
    let mut result = conclude(
        plans.iter().map(|p| p.name.clone()).collect(),
        rows,
        started.elapsed().as_secs_f64(),
    );
    result.planned = plans.iter().map(play::planned_targets).collect();
    result.shard = flags.shard.map(|s| (s.k, s.n));
    if result.shard.is_some() {
        // Whether a mutant is missed is the merge's to say: another shard may catch it.
        result.ok = result.false_alarms.is_empty() && result.errors.is_empty();
    }
    if let Err(code) = publish(&result, &dir) {
        return code;
    }
    exit_code(&result)
}

/// The exit code of a selftest, a shard's part of one, or a merged one: 3 when cells could not
/// run and nothing else failed; 1 on a false alarm or (not for a shard, which cannot tell) a
/// missed mutant; else 0.
fn exit_code(result: &Selftest) -> u8 {
    let missed = result.shard.is_none() && !result.missed.is_empty();
    if !result.errors.is_empty() && !missed && result.false_alarms.is_empty() {
        INFRASTRUCTURE
    } else if result.ok {
        PASS
    } else {
        FAIL
    }
}

/// One row per engine (the correct one first), every cell not run yet.
fn empty_rows(mutants: &[MutantRow], plans: &[Plan]) -> Vec<Row> {
    std::iter::once((
        "correct".to_string(),
        "the built-in engine as shipped".to_string(),
        Vec::new(),
        None,
    ))
    .chain(mutants.iter().map(|(n, d, s, first)| {
        (
            n.to_string(),
            d.to_string(),
            s.clone(),
            first.map(str::to_string),
        )
    }))
    .map(|(engine, description, signature, first)| Row {
        engine,
        description,
        signature,
        cells: plans.iter().map(|p| Cell::not_run(&p.name)).collect(),
        first,
    })
    .collect()
}

/// Marks every cell outside `shard` as `elsewhere`; returns how many are this shard's. Each
/// cell (engine × drill) weighs its drill's planned length, so the split is as stable as
/// `drill run --shard`'s and every cell is in exactly one shard for any N.
fn keep_shard(rows: &mut [Row], plans: &[Plan], shard: super::shard::Shard) -> usize {
    let cells: Vec<(String, std::time::Duration)> = rows
        .iter()
        .flat_map(|r| {
            plans
                .iter()
                .map(move |p| (format!("{} × {}", r.engine, p.name), p.plays_for()))
        })
        .collect();
    let of = super::shard::partition(&cells, shard.n);
    let mut mine = 0;
    for (i, cell) in rows.iter_mut().flat_map(|r| r.cells.iter_mut()).enumerate() {
        if of[i] == shard.k {
            mine += 1;
        } else {
            cell.outcome = CellOutcome::Elsewhere;
        }
    }
    mine
}

/// Prints the matrix and the summary, and writes `selftest.md` and `selftest.json` into `dir`.
fn publish(result: &Selftest, dir: &Path) -> Result<(), u8> {
    println!("{}", matrix(result));
    for line in summary_lines(result) {
        println!("{line}");
    }
    let md = markdown(result);
    let written = std::fs::write(dir.join("selftest.md"), md).and_then(|()| {
        std::fs::write(
            dir.join("selftest.json"),
            serde_json::to_string_pretty(result).unwrap_or_default(),
        )
    });
    match written {
        Ok(()) => {
            println!(
                "  wrote {} and {}",
                dir.join("selftest.md").display(),
                dir.join("selftest.json").display()
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("drill selftest: cannot write to {}: {e}", dir.display());
            Err(INFRASTRUCTURE)
        }
    }
}

/// The mutants this build has (name, description, signature), filtered by `--mutant`; `None`
/// after saying why when there are none or a name is unknown.
fn mutants(only: &[String]) -> Option<Vec<MutantRow>> {
    #[cfg(feature = "mutants")]
    let all: Vec<MutantRow> = crate::engine::mutant::Mutant::ALL
        .iter()
        .map(|m| {
            let signature = m.signature().to_vec();
            (m.name(), m.about(), signature, Some(m.tried_first()))
        })
        .collect();
    #[cfg(not(feature = "mutants"))]
    let all: Vec<MutantRow> = Vec::new();
    if all.is_empty() {
        eprintln!(
            "drill selftest: this drill binary was built without the `mutants` feature (test builds only); run `cargo run --release --features mutants -- selftest`"
        );
        return None;
    }
    if let Some(unknown) = only.iter().find(|m| !all.iter().any(|(n, ..)| n == m)) {
        eprintln!(
            "drill selftest: no mutant named `{unknown}`; this build has: {}",
            all.iter().map(|(n, ..)| *n).collect::<Vec<_>>().join(", ")
        );
        return None;
    }
    Some(
        all.into_iter()
            .filter(|(n, ..)| only.is_empty() || only.iter().any(|m| m == n))
            .collect(),
    )
}

fn conclude(scenarios: Vec<String>, mut rows: Vec<Row>, took_s: f64) -> Selftest {
    only_where_the_correct_engine_passed(&mut rows);
    let mut missed = Vec::new();
    let mut false_alarms = Vec::new();
    let mut errors = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        for cell in &row.cells {
            match cell.outcome {
                CellOutcome::Error => errors.push(format!(
                    "{} × {}: {}",
                    row.engine,
                    cell.scenario,
                    cell.failures.join("; ")
                )),
                CellOutcome::Caught | CellOutcome::Other if i == 0 => {
                    false_alarms.push(format!("{}: {}", cell.scenario, cell.failures.join("; ")))
                }
                _ => {}
            }
        }
        if i > 0 && !row.cells.iter().any(|c| c.outcome == CellOutcome::Caught) {
            missed.push(row.engine.clone());
        }
    }
    let correct_ran_all = rows.first().is_some_and(|r| {
        r.cells
            .iter()
            .all(|c| matches!(c.outcome, CellOutcome::Pass | CellOutcome::Elsewhere))
    });
    let ok = missed.is_empty() && false_alarms.is_empty() && correct_ran_all;
    Selftest {
        version: env!("DRILL_BUILD").to_string(),
        shard: None,
        scenarios,
        planned: Vec::new(),
        rows,
        missed,
        false_alarms,
        errors,
        took_s,
        ok,
    }
}

/// A mutant's catch counts only where the correct engine passed the same drill in the same
/// run: a drill that fails the correct engine too proves nothing about the mutant. Such a cell
/// becomes `other`, saying why (a shard's cell whose correct twin ran elsewhere stays; the
/// merge judges it with the twin in view).
fn only_where_the_correct_engine_passed(rows: &mut [Row]) {
    let Some((correct, mutants)) = rows.split_first_mut() else {
        return;
    };
    for row in mutants {
        for (cell, twin) in row.cells.iter_mut().zip(&correct.cells) {
            if cell.outcome != CellOutcome::Caught
                || matches!(twin.outcome, CellOutcome::Pass | CellOutcome::Elsewhere)
            {
                continue;
            }
            cell.outcome = CellOutcome::Other;
            cell.failures.insert(
                0,
                format!(
                    "not a catch: the correct engine's cell of this drill is {} in this run",
                    twin.short()
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cell::Finding;
    use super::render::row_result;
    use super::*;

    /// A cell: `caught` names the signature finding (`lost 3`), `why` what failed.
    fn cell(
        scenario: &str,
        outcome: CellOutcome,
        caught: Option<(Signature, u64)>,
        why: &[&str],
    ) -> Cell {
        Cell {
            scenario: scenario.into(),
            outcome,
            caught_by: caught
                .map(|(signature, n)| Finding {
                    signature,
                    count: Some(n),
                })
                .into_iter()
                .collect(),
            failures: why.iter().map(|s| s.to_string()).collect(),
            exit: None,
            took_s: 1.0,
        }
    }

    fn row(engine: &str, signature: &[Signature], cells: Vec<Cell>) -> Row {
        Row {
            engine: engine.into(),
            description: String::new(),
            signature: signature.to_vec(),
            cells,
            first: None,
        }
    }

    #[test]
    fn every_mutant_caught_by_its_signature_passes_the_selftest() {
        let pass = |s| cell(s, CellOutcome::Pass, None, &[]);
        let ok = conclude(
            vec!["a".into(), "b".into()],
            vec![
                row("correct", &[], vec![pass("a"), pass("b")]),
                row(
                    "m1",
                    &[Signature::Lost],
                    vec![
                        pass("a"),
                        cell(
                            "b",
                            CellOutcome::Caught,
                            Some((Signature::Lost, 3)),
                            &["lost (expected 0, got 3)"],
                        ),
                    ],
                ),
                row(
                    "m2",
                    &[Signature::Duplicates],
                    vec![
                        cell(
                            "a",
                            CellOutcome::Caught,
                            Some((Signature::Duplicates, 1)),
                            &["x"],
                        ),
                        Cell::not_run("b"),
                    ],
                ),
            ],
            0.0,
        );
        assert!(ok.ok, "{ok:?}");
        assert_eq!(row_result(1, &ok.rows[1]), "caught by b (lost 3)");
        assert_eq!(row_result(2, &ok.rows[2]), "caught by a (duplicates 1)");
        let md = markdown(&ok);
        assert!(
            md.contains("| `m2` | duplicates | duplicates 1 | · |"),
            "{md}"
        );
    }

    #[test]
    fn a_mutant_caught_only_for_another_reason_is_missed_and_says_why() {
        let pass = |s| cell(s, CellOutcome::Pass, None, &[]);
        let other = "failed (expected = 1, got 0)";
        let missed = conclude(
            vec!["a".into()],
            vec![
                row("correct", &[], vec![pass("a")]),
                row(
                    "m1",
                    &[Signature::KeylessCopies],
                    vec![cell("a", CellOutcome::Other, None, &[other])],
                ),
                row(
                    "m2",
                    &[Signature::Lost],
                    vec![cell("a", CellOutcome::Error, None, &["exit 3"])],
                ),
            ],
            0.0,
        );
        assert!(!missed.ok);
        assert_eq!(
            missed.missed,
            vec!["m1", "m2"],
            "another expectation, or an error, is not a catch"
        );
        assert_eq!(
            row_result(1, &missed.rows[1]),
            "MISSED (signature: keyless_copies)"
        );
        let md = markdown(&missed);
        assert!(md.contains("| other: failed |"), "{md}");
        assert!(
            md.contains("not caught (failed for another reason)"),
            "{md}"
        );
    }

    /// A drill that fails the correct engine is a false alarm, and a mutant's catch there is
    /// no catch.
    #[test]
    fn a_drill_the_correct_engine_fails_is_a_false_alarm_and_catches_nothing() {
        let alarm = conclude(
            vec!["a".into()],
            vec![
                row(
                    "correct",
                    &[],
                    vec![cell(
                        "a",
                        CellOutcome::Other,
                        None,
                        &["lost (expected 0, got 1)"],
                    )],
                ),
                row(
                    "m1",
                    &[Signature::Lost],
                    vec![cell(
                        "a",
                        CellOutcome::Caught,
                        Some((Signature::Lost, 9)),
                        &[],
                    )],
                ),
            ],
            0.0,
        );
        assert!(!alarm.ok);
        assert_eq!(alarm.false_alarms.len(), 1);
        // The drill failed the correct engine too: the mutant's catch there is no catch.
        assert_eq!(alarm.missed, ["m1"]);
        assert_eq!(alarm.rows[1].cells[0].outcome, CellOutcome::Other);
        assert!(
            alarm.rows[1].cells[0].failures[0].starts_with("not a catch: the correct engine"),
            "{:?}",
            alarm.rows[1].cells[0].failures
        );
    }

    /// Every mutant has a signature, and no two mutants share a name.
    #[cfg(feature = "mutants")]
    #[test]
    fn every_mutant_has_a_signature() {
        for m in crate::engine::mutant::Mutant::ALL {
            assert!(!m.signature().is_empty(), "{}", m.name());
            assert_eq!(crate::engine::mutant::Mutant::parse(m.name()), Ok(m));
        }
    }
}
