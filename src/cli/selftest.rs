//! `drill selftest [--tag T] [--out DIR]`: every deliberately broken engine (the test-only
//! mutants of the built-in engine, `engine::mutant`) against the catalogue, and the correct
//! engine against the same drills. The matrix says, per mutant and drill, which expectation
//! caught it, or that it was missed. A mutant no drill catches, or a correct engine that fails
//! a drill, fails the selftest.
//!
//! Each cell is one `drill run` of one scenario as a child process (the mutant chosen by
//! `DRILL_MUTANT` in its environment), so cells run side by side (`--jobs`) with their own
//! brokers on their own ports and cannot disturb each other. Unless `--full`, a mutant's row
//! stops at its first catch and drills are tried shortest first: CI pays for one catch per
//! mutant, not for the whole matrix.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use drill::scenario::Plan;

use super::{FAIL, INFRASTRUCTURE, INVALID, PASS};

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
}

/// One engine's row: the correct engine (`mutant: None`) or one mutant.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub engine: String,
    pub description: String,
    pub cells: Vec<Cell>,
}

/// What one drill said of one engine.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub scenario: String,
    pub outcome: CellOutcome,
    /// The expectations that failed, and why a drill was inconclusive.
    pub caught_by: Vec<String>,
    pub exit: Option<i32>,
    pub took_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CellOutcome {
    /// Every expectation held.
    Pass,
    /// An expectation failed (for a mutant: caught; for the correct engine: a false alarm).
    Fail,
    /// The drill could not be run (exit 2 or 3): neither caught nor passed.
    Error,
    /// Not run: the mutant was already caught by an earlier drill.
    NotRun,
}

#[derive(Debug, Serialize)]
pub struct Selftest {
    pub scenarios: Vec<String>,
    pub rows: Vec<Row>,
    pub missed: Vec<String>,
    pub false_alarms: Vec<String>,
    pub errors: Vec<String>,
    pub took_s: f64,
    pub ok: bool,
}

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
            "; a mutant's row stops at its first catch (--full runs every cell)"
        }
    );
    let mut rows: Vec<Row> = std::iter::once((
        "correct".to_string(),
        "the built-in engine as shipped".to_string(),
    ))
    .chain(mutants.iter().map(|(n, d)| (n.to_string(), d.to_string())))
    .map(|(engine, description)| Row {
        engine,
        description,
        cells: plans
            .iter()
            .map(|p| Cell {
                scenario: p.name.clone(),
                outcome: CellOutcome::NotRun,
                caught_by: Vec::new(),
                exit: None,
                took_s: 0.0,
            })
            .collect(),
    })
    .collect();
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
    let result = conclude(
        plans.iter().map(|p| p.name.clone()).collect(),
        rows,
        started,
    );
    println!("{}", matrix(&result));
    for line in summary_lines(&result) {
        println!("{line}");
    }
    let md = markdown(&result);
    let written = std::fs::write(dir.join("selftest.md"), md).and_then(|()| {
        std::fs::write(
            dir.join("selftest.json"),
            serde_json::to_string_pretty(&result).unwrap_or_default(),
        )
    });
    match written {
        Ok(()) => println!(
            "  wrote {} and {}",
            dir.join("selftest.md").display(),
            dir.join("selftest.json").display()
        ),
        Err(e) => {
            eprintln!("drill selftest: cannot write to {}: {e}", dir.display());
            return INFRASTRUCTURE;
        }
    }
    if !result.errors.is_empty() && result.missed.is_empty() && result.false_alarms.is_empty() {
        INFRASTRUCTURE
    } else if result.ok {
        PASS
    } else {
        FAIL
    }
}

/// The mutants this build has (name, description), filtered by `--mutant`; `None` after
/// saying why when there are none or a name is unknown.
fn mutants(only: &[String]) -> Option<Vec<(&'static str, &'static str)>> {
    #[cfg(feature = "mutants")]
    let all: Vec<(&'static str, &'static str)> = drill::engine::mutant::MUTANTS.to_vec();
    #[cfg(not(feature = "mutants"))]
    let all: Vec<(&'static str, &'static str)> = Vec::new();
    if all.is_empty() {
        eprintln!(
            "drill selftest: this drill binary was built without the `mutants` feature (test builds only); run `cargo run --release --features mutants -- selftest`"
        );
        return None;
    }
    if let Some(unknown) = only.iter().find(|m| !all.iter().any(|(n, _)| n == m)) {
        eprintln!(
            "drill selftest: no mutant named `{unknown}`; this build has: {}",
            all.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        );
        return None;
    }
    Some(
        all.into_iter()
            .filter(|(n, _)| only.is_empty() || only.iter().any(|m| m == n))
            .collect(),
    )
}

/// Runs the cells: a pool of `drill run` children.
struct Jobs<'a> {
    exe: &'a Path,
    dir: &'a Path,
    plans: &'a [Plan],
    seed: Option<u64>,
}

/// A cell in flight: (row, column).
type Running = tokio::task::JoinHandle<(usize, usize, Cell)>;

impl Jobs<'_> {
    async fn play(&self, rows: &mut [Row], jobs: usize, full: bool, cancel: &CancellationToken) {
        // The correct engine's row first (every cell), then each mutant's cells in order.
        let mut queue: VecDeque<(usize, usize)> = VecDeque::new();
        for c in 0..self.plans.len() {
            queue.push_back((0, c));
        }
        // Unless --full, a mutant's next cell is queued only when its previous one missed.
        let mut next_for_mutant: Vec<Option<usize>> = vec![None; rows.len()];
        for (r, next) in next_for_mutant.iter_mut().enumerate().skip(1) {
            if full {
                for c in 0..self.plans.len() {
                    queue.push_back((r, c));
                }
            } else {
                queue.push_back((r, 0));
                *next = Some(1);
            }
        }
        let mut running: Vec<Running> = Vec::new();
        let mut done = 0usize;
        loop {
            while running.len() < jobs && !cancel.is_cancelled() {
                let Some((r, c)) = queue.pop_front() else {
                    break;
                };
                running.push(self.spawn(&rows[r].engine, r, c, cancel.clone()));
            }
            if running.is_empty() {
                return;
            }
            let (finished, _, rest) = futures::future::select_all(running).await;
            running = rest;
            let Ok((r, c, cell)) = finished else {
                continue;
            };
            done += 1;
            println!(
                "  [{done}] {:<28} {:<28} {}",
                rows[r].engine,
                cell.scenario,
                describe(r, &cell)
            );
            let caught = cell.outcome == CellOutcome::Fail;
            rows[r].cells[c] = cell;
            if r > 0
                && !full
                && !caught
                && let Some(next) = next_for_mutant[r]
                && next < self.plans.len()
            {
                queue.push_back((r, next));
                next_for_mutant[r] = Some(next + 1);
            }
        }
    }

    fn spawn(&self, engine: &str, r: usize, c: usize, cancel: CancellationToken) -> Running {
        let plan = &self.plans[c];
        let out = self.dir.join(engine);
        let log = out.join(format!("{}.log", plan.name));
        let report = out.join(&plan.name).join("report.json");
        let mut command = tokio::process::Command::new(self.exe);
        command
            .arg("run")
            .arg(&plan.source)
            .arg("--out")
            .arg(&out)
            .env_remove("GITHUB_STEP_SUMMARY")
            .kill_on_drop(true);
        if let Some(seed) = self.seed {
            command.arg("--seed").arg(seed.to_string());
        }
        if r == 0 {
            command.env_remove("DRILL_MUTANT");
        } else {
            command.env("DRILL_MUTANT", engine);
        }
        let scenario = plan.name.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let _ = std::fs::create_dir_all(&out);
            let _ = std::fs::remove_file(&report);
            let exit = match std::fs::File::create(&log) {
                Ok(f) => {
                    let err = f.try_clone();
                    command.stdout(f);
                    if let Ok(e) = err {
                        command.stderr(e);
                    }
                    match command.spawn() {
                        Ok(mut child) => tokio::select! {
                            status = child.wait() => status.ok().and_then(|s| s.code()),
                            _ = cancel.cancelled() => {
                                // SIGINT lets the child drill tear down its brokers.
                                if let Some(pid) = child.id() {
                                    let _ = nix::sys::signal::kill(
                                        nix::unistd::Pid::from_raw(pid as i32),
                                        nix::sys::signal::Signal::SIGINT,
                                    );
                                }
                                let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
                                None
                            }
                        },
                        Err(_) => None,
                    }
                }
                Err(_) => None,
            };
            let caught_by = read_failures(&report);
            let outcome = match exit {
                Some(0) => CellOutcome::Pass,
                Some(1) => CellOutcome::Fail,
                _ => CellOutcome::Error,
            };
            let caught_by = if outcome == CellOutcome::Error {
                vec![last_line(&log)]
            } else {
                caught_by
            };
            (
                r,
                c,
                Cell {
                    scenario,
                    outcome,
                    caught_by,
                    exit,
                    took_s: started.elapsed().as_secs_f64(),
                },
            )
        })
    }
}

/// The failed expectations (`lost: expected 0, got 12`) and inconclusive reasons of a report.
fn read_failures(report: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(report) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let mut out: Vec<String> = json["expectations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["ok"] == false)
        .map(|x| {
            format!(
                "{} (expected {}, got {})",
                x["name"].as_str().unwrap_or("?"),
                plain(&x["expected"]),
                plain(&x["actual"])
            )
        })
        .collect();
    out.extend(
        json["inconclusive"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str())
            .map(|r| format!("inconclusive: {r}")),
    );
    out
}

fn plain(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("no output (see {})", log.display()))
}

/// The first failed expectation's name: `lost`, `duplicates`, … (`inconclusive`).
fn short(cell: &Cell) -> String {
    cell.caught_by
        .first()
        .map(|c| c.split([' ', ':']).next().unwrap_or(c).to_string())
        .unwrap_or_default()
}

fn describe(row: usize, cell: &Cell) -> String {
    let took = format!("{:.0} s", cell.took_s);
    match (row, cell.outcome) {
        (0, CellOutcome::Pass) => format!("pass ({took})"),
        (0, CellOutcome::Fail) => format!("FALSE ALARM: {} ({took})", cell.caught_by.join("; ")),
        (_, CellOutcome::Pass) => format!("missed ({took})"),
        (_, CellOutcome::Fail) => format!("caught: {} ({took})", cell.caught_by.join("; ")),
        (_, CellOutcome::Error) => format!(
            "ERROR (exit {}): {}",
            cell.exit.map_or("-".to_string(), |c| c.to_string()),
            cell.caught_by.join("; ")
        ),
        (_, CellOutcome::NotRun) => "not run".to_string(),
    }
}

fn conclude(scenarios: Vec<String>, rows: Vec<Row>, started: Instant) -> Selftest {
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
                    cell.caught_by.join("; ")
                )),
                CellOutcome::Fail if i == 0 => {
                    false_alarms.push(format!("{}: {}", cell.scenario, cell.caught_by.join("; ")))
                }
                _ => {}
            }
        }
        if i > 0 && !row.cells.iter().any(|c| c.outcome == CellOutcome::Fail) {
            missed.push(row.engine.clone());
        }
    }
    let correct_ran_all = rows
        .first()
        .is_some_and(|r| r.cells.iter().all(|c| c.outcome == CellOutcome::Pass));
    let ok = missed.is_empty() && false_alarms.is_empty() && correct_ran_all;
    Selftest {
        scenarios,
        rows,
        missed,
        false_alarms,
        errors,
        took_s: started.elapsed().as_secs_f64(),
        ok,
    }
}

/// The matrix for a terminal: one row per engine, one column per drill (numbered; the legend
/// follows), each cell the expectation that caught it.
fn matrix(result: &Selftest) -> Table {
    let mut t = Table::new();
    let mut header = vec!["engine".to_string()];
    header.extend((1..=result.scenarios.len()).map(|i| format!("D{i}")));
    header.push("result".to_string());
    t.load_style(UTF8_FULL_CONDENSED).set_header(header);
    for (i, row) in result.rows.iter().enumerate() {
        let mut cells = vec![row.engine.clone()];
        cells.extend(row.cells.iter().map(|c| match (i, c.outcome) {
            (0, CellOutcome::Pass) => "pass".to_string(),
            (0, CellOutcome::Fail) => format!("FAIL {}", short(c)),
            (_, CellOutcome::Pass) => "missed".to_string(),
            (_, CellOutcome::Fail) => short(c),
            (_, CellOutcome::Error) => "ERROR".to_string(),
            (_, CellOutcome::NotRun) => "·".to_string(),
        }));
        cells.push(row_result(i, row));
        t.add_row(cells);
    }
    t
}

fn row_result(i: usize, row: &Row) -> String {
    if i == 0 {
        let failed = row
            .cells
            .iter()
            .filter(|c| c.outcome != CellOutcome::Pass)
            .count();
        return if failed == 0 {
            "passes every drill".to_string()
        } else {
            format!("FAILS {failed} drills")
        };
    }
    match row.cells.iter().find(|c| c.outcome == CellOutcome::Fail) {
        Some(c) => format!("caught by {} ({})", c.scenario, short(c)),
        None => "MISSED".to_string(),
    }
}

fn summary_lines(result: &Selftest) -> Vec<String> {
    let mut lines: Vec<String> = result
        .scenarios
        .iter()
        .enumerate()
        .map(|(i, s)| format!("  D{} = {s}", i + 1))
        .collect();
    let caught = result.rows.len().saturating_sub(1) - result.missed.len();
    let passed = result.rows.first().map_or(0, |r| {
        r.cells
            .iter()
            .filter(|c| c.outcome == CellOutcome::Pass)
            .count()
    });
    lines.push(format!(
        "  the correct engine: {passed} of {} drills passed",
        result.scenarios.len()
    ));
    lines.push(format!(
        "drill selftest: {} — {caught} of {} mutants caught; the correct engine {}; {:.0} s",
        if result.ok { "PASS" } else { "FAIL" },
        result.rows.len().saturating_sub(1),
        if result.false_alarms.is_empty() {
            "passed every drill that ran".to_string()
        } else {
            format!("failed {}", result.false_alarms.len())
        },
        result.took_s
    ));
    lines.extend(result.missed.iter().map(|m| format!("  missed: {m}")));
    lines.extend(
        result
            .false_alarms
            .iter()
            .map(|m| format!("  false alarm: {m}")),
    );
    lines.extend(result.errors.iter().map(|m| format!("  error: {m}")));
    lines
}

/// `selftest.md`: the matrix with full names, and what caught each mutant.
fn markdown(result: &Selftest) -> String {
    let mut md = String::from("# drill selftest\n\n");
    md.push_str(&format!(
        "**{}** — {} mutants, {} drills, {:.0} s. Each cell: the expectation that caught the mutant (`missed`: the drill passed it; `·`: not run, already caught).\n\n",
        if result.ok { "PASS" } else { "FAIL" },
        result.rows.len().saturating_sub(1),
        result.scenarios.len(),
        result.took_s
    ));
    md.push_str("| engine |");
    for s in &result.scenarios {
        md.push_str(&format!(" {s} |"));
    }
    md.push_str(" result |\n|---|");
    md.push_str(&"---|".repeat(result.scenarios.len() + 1));
    md.push('\n');
    for (i, row) in result.rows.iter().enumerate() {
        md.push_str(&format!("| `{}` |", row.engine));
        for c in &row.cells {
            let text = match (i, c.outcome) {
                (0, CellOutcome::Pass) => "pass".to_string(),
                (0, CellOutcome::Fail) => format!("**FAIL** {}", short(c)),
                (_, CellOutcome::Pass) => "missed".to_string(),
                (_, CellOutcome::Fail) => short(c),
                (_, CellOutcome::Error) => "error".to_string(),
                (_, CellOutcome::NotRun) => "·".to_string(),
            };
            md.push_str(&format!(" {text} |"));
        }
        md.push_str(&format!(" {} |\n", row_result(i, row)));
    }
    md.push_str("\n## What caught each mutant\n\n");
    for row in result.rows.iter().skip(1) {
        md.push_str(&format!("- `{}` ({}):", row.engine, row.description));
        let caught: Vec<String> = row
            .cells
            .iter()
            .filter(|c| c.outcome == CellOutcome::Fail)
            .map(|c| format!(" {}: {}", c.scenario, c.caught_by.join("; ")))
            .collect();
        if caught.is_empty() {
            md.push_str(" **missed by every drill**\n");
        } else {
            md.push_str(&caught.join(";"));
            md.push('\n');
        }
    }
    for (title, list) in [
        (
            "False alarms (the correct engine failed)",
            &result.false_alarms,
        ),
        ("Drills that could not run", &result.errors),
    ] {
        if !list.is_empty() {
            md.push_str(&format!("\n## {title}\n\n"));
            for l in list {
                md.push_str(&format!("- {l}\n"));
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(scenario: &str, outcome: CellOutcome, by: &[&str]) -> Cell {
        Cell {
            scenario: scenario.into(),
            outcome,
            caught_by: by.iter().map(|s| s.to_string()).collect(),
            exit: None,
            took_s: 1.0,
        }
    }

    fn row(engine: &str, cells: Vec<Cell>) -> Row {
        Row {
            engine: engine.into(),
            description: String::new(),
            cells,
        }
    }

    #[test]
    fn a_mutant_no_drill_catches_or_a_false_alarm_fails_the_selftest() {
        let ok = conclude(
            vec!["a".into(), "b".into()],
            vec![
                row(
                    "correct",
                    vec![
                        cell("a", CellOutcome::Pass, &[]),
                        cell("b", CellOutcome::Pass, &[]),
                    ],
                ),
                row(
                    "m1",
                    vec![
                        cell("a", CellOutcome::Pass, &[]),
                        cell("b", CellOutcome::Fail, &["lost (expected 0, got 3)"]),
                    ],
                ),
                row(
                    "m2",
                    vec![
                        cell("a", CellOutcome::Fail, &["duplicates (expected 0, got 1)"]),
                        cell("b", CellOutcome::NotRun, &[]),
                    ],
                ),
            ],
            Instant::now(),
        );
        assert!(ok.ok, "{ok:?}");
        assert_eq!(row_result(1, &ok.rows[1]), "caught by b (lost)");
        assert_eq!(row_result(2, &ok.rows[2]), "caught by a (duplicates)");
        let md = markdown(&ok);
        assert!(md.contains("| `m2` | duplicates | · |"), "{md}");

        let missed = conclude(
            vec!["a".into()],
            vec![
                row("correct", vec![cell("a", CellOutcome::Pass, &[])]),
                row("m1", vec![cell("a", CellOutcome::Pass, &[])]),
                row("m2", vec![cell("a", CellOutcome::Error, &["exit 3"])]),
            ],
            Instant::now(),
        );
        assert!(!missed.ok);
        assert_eq!(missed.missed, vec!["m1", "m2"], "an error is not a catch");

        let alarm = conclude(
            vec!["a".into()],
            vec![
                row(
                    "correct",
                    vec![cell("a", CellOutcome::Fail, &["lost (expected 0, got 1)"])],
                ),
                row(
                    "m1",
                    vec![cell("a", CellOutcome::Fail, &["lost (expected 0, got 9)"])],
                ),
            ],
            Instant::now(),
        );
        assert!(!alarm.ok);
        assert_eq!(alarm.false_alarms.len(), 1);
    }
}
