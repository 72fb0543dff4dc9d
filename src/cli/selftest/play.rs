//! Playing the selftest's cells: a pool of `drill run` children, the correct engine's row
//! first, then each mutant's cells in order; unless `--full`, a mutant's next cell is queued
//! only while it has not been caught by its signature.

use crate::check::Signature;
use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::scenario::{FaultAction, Plan, ProcessAction};

use super::Row;
use super::cell::{Cell, CellOutcome, judge};

/// Runs the cells: a pool of `drill run` children.
pub(super) struct Jobs<'a> {
    pub(super) exe: &'a Path,
    pub(super) dir: &'a Path,
    pub(super) plans: &'a [Plan],
    pub(super) seed: Option<u64>,
}

/// A cell in flight: (row, column).
type Running = tokio::task::JoinHandle<(usize, usize, Cell)>;

impl Jobs<'_> {
    pub(super) async fn play(
        &self,
        rows: &mut [Row],
        jobs: usize,
        full: bool,
        cancel: &CancellationToken,
    ) {
        // The correct engine's row first (every cell), longest drill first: the selftest
        // lasts at least as long as its longest drill (kafka-cut-6m, 6.5 min), so that one
        // starts at once and the other slots work through everything else meanwhile (queued
        // last, it ended the `ci` selftest minutes after every other cell). Then each
        // mutant's cells in order.
        let mut queue: VecDeque<(usize, usize)> = VecDeque::new();
        let mut longest_first: Vec<usize> = (0..self.plans.len()).collect();
        longest_first.sort_by_key(|c| std::cmp::Reverse(self.plans[*c].plays_for()));
        for c in longest_first {
            if rows[0].cells[c].outcome == CellOutcome::NotRun {
                queue.push_back((0, c));
            }
        }
        // Each mutant's drills in order: the one it names first, then shortest first.
        let orders: Vec<Vec<usize>> = rows
            .iter()
            .map(|row| {
                let mut order: Vec<usize> = (0..self.plans.len()).collect();
                if let Some(i) = row
                    .first
                    .as_ref()
                    .and_then(|f| self.plans.iter().position(|p| p.name == *f))
                {
                    order.retain(|c| *c != i);
                    order.insert(0, i);
                }
                // Under --shard, only this shard's cells.
                order.retain(|c| row.cells[*c].outcome == CellOutcome::NotRun);
                order
            })
            .collect();
        // Unless --full, a mutant's next cell is queued only when its previous one missed.
        let mut next_for_mutant: Vec<Option<usize>> = vec![None; rows.len()];
        for (r, next) in next_for_mutant.iter_mut().enumerate().skip(1) {
            if full {
                for c in &orders[r] {
                    queue.push_back((r, *c));
                }
            } else if let Some(c) = orders[r].first() {
                queue.push_back((r, *c));
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
                let signature = rows[r].signature.clone();
                running.push(self.spawn(&rows[r].engine, signature, r, c, cancel.clone()));
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
            let caught = cell.outcome == CellOutcome::Caught;
            rows[r].cells[c] = cell;
            if r > 0
                && !full
                && !caught
                && let Some(next) = next_for_mutant[r]
                && let Some(c) = orders[r].get(next)
            {
                queue.push_back((r, *c));
                next_for_mutant[r] = Some(next + 1);
            }
        }
    }

    fn spawn(
        &self,
        engine: &str,
        signature: Vec<Signature>,
        r: usize,
        c: usize,
        cancel: CancellationToken,
    ) -> Running {
        let plan = &self.plans[c];
        let planned = planned_targets(plan);
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
            let json = std::fs::read_to_string(&report)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            let (outcome, caught_by, mut failures) =
                judge(exit, json.as_ref(), &signature, &planned);
            if outcome == CellOutcome::Error {
                failures = vec![last_line(&log)];
            }
            (
                r,
                c,
                Cell {
                    scenario,
                    outcome,
                    caught_by,
                    failures,
                    exit,
                    took_s: started.elapsed().as_secs_f64(),
                },
            )
        })
    }
}

/// The fault targets a scenario plans, as its report's fault log names them: `link mqtt`,
/// `link proxy` (a restart), `engine`, `engine disk` (a full disk), `broker` (any node).
pub(super) fn planned_targets(plan: &Plan) -> Vec<String> {
    plan.faults
        .iter()
        .filter_map(|f| match &f.what {
            FaultAction::Link { link, .. } => Some(format!("link {link}")),
            FaultAction::ProxyRestart { .. } => Some("link proxy".to_string()),
            FaultAction::Heal { .. } => None,
            FaultAction::Engine {
                action: ProcessAction::FillDisk,
                ..
            } => Some("engine disk".to_string()),
            FaultAction::Engine { .. } => Some("engine".to_string()),
            FaultAction::Broker { .. } => Some("broker".to_string()),
            FaultAction::Answer { .. } => Some("destination".to_string()),
            FaultAction::Source(_) => Some("source".to_string()),
            FaultAction::Disk { .. } => Some("engine disk".to_string()),
            FaultAction::Clock { .. } => Some("engine clock".to_string()),
        })
        .collect()
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

/// A finished cell in a line, for the progress log.
fn describe(row: usize, cell: &Cell) -> String {
    let took = format!("{:.0} s", cell.took_s);
    let why = cell.failures.join("; ");
    match (row, cell.outcome) {
        (0, CellOutcome::Pass) => format!("pass ({took})"),
        (0, CellOutcome::Caught | CellOutcome::Other) => format!("FALSE ALARM: {why} ({took})"),
        (_, CellOutcome::Pass) => format!("missed ({took})"),
        (_, CellOutcome::Caught) => format!("caught: {} — {why} ({took})", cell.short()),
        (_, CellOutcome::Other) => {
            format!("not caught (failed for another reason: {why}) ({took})")
        }
        (_, CellOutcome::Error) => format!(
            "ERROR (exit {}): {why}",
            cell.exit.map_or("-".to_string(), |c| c.to_string())
        ),
        (_, CellOutcome::NotRun) => "not run".to_string(),
        (_, CellOutcome::Elsewhere) => "another shard's".to_string(),
    }
}
