//! `drill explore SCENARIO`: run generated fault timelines over a scenario until one fails,
//! save it, shrink it, and write what was found (`crate::explore` holds the pure parts).
//!
//! Each timeline is a scenario file of its own (`runs/<i>.yaml`, the base with its faults
//! replaced) run by a `drill run` child, exactly as a user would run it, its `report.json`
//! read back ([`crate::explore::judge`]). An infrastructure failure (exit 3) is run once more
//! and never reported as a finding. A failure is written at once as `failing-<n>.yaml`, then
//! shrunk to `minimal-<n>.yaml`; `explore.json` and `explore.md` are written after every
//! finding and at the end, so an explore stopped at any point leaves what it found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{FAIL, INFRASTRUCTURE, INVALID, PASS};
use crate::explore::menu::Base;
use crate::explore::shrink::{self, Failed, Found, Outcome, Settings, Stop};
use crate::explore::{Menu, Timeline, judge};
use crate::units::Dur;

/// Columns of a timeline's chart in `explore.md`.
const CHART_WIDTH: usize = 40;

/// The longest workload explore takes: every run plays it, and shrinking plays it many times.
const LONGEST_WORKLOAD: Duration = Duration::from_secs(30);
/// Runs that must all fail to start (exit 3, each run twice) before explore gives up.
const GIVE_UP_AFTER: usize = 8;

#[derive(clap::Args, Clone)]
pub struct Flags {
    /// The base scenario: its destination, system, workload and expectations are kept, its
    /// faults replaced by generated ones. Folders (or several files) explore each scenario in
    /// them, selected by --tag, one after the other, the budget shared equally.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// With folders: only the scenarios with this tag (repeat for any of several).
    #[arg(long = "tag")]
    pub tags: Vec<String>,
    /// Shard K of N (a nightly CI matrix): every shard explores every selected scenario, with
    /// seed S+K (S: --seed, else each scenario's own), so N runners try N different sets of
    /// timelines.
    #[arg(long)]
    pub shard: Option<super::shard::Shard>,
    /// How long to explore in all (runs started after it are not started).
    #[arg(long, default_value = "30m", value_parser = Dur::parse)]
    pub budget: Dur,
    /// At most this many generated timelines (shrink runs not counted).
    #[arg(long)]
    pub runs: Option<u64>,
    /// Drills run side by side (each with its own brokers and ports).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// The seed of the timelines (default: the scenario's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How long to shrink each failure.
    #[arg(long, default_value = "20m", value_parser = Dur::parse)]
    pub shrink_budget: Dur,
    /// Runs a shrink candidate must pass before it counts as passing.
    #[arg(long, default_value_t = 2)]
    pub shrink_retries: usize,
    /// Runs in a row a shrink candidate must fail the same way before it is accepted.
    #[arg(long, default_value_t = 2)]
    pub shrink_confirm: usize,
    /// Reruns of each minimal timeline ("reproduces k/K").
    #[arg(long, default_value_t = 3)]
    pub reproduce: usize,
    /// Where it writes (default reports/explore/<scenario name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Stop exploring once the first finding is shrunk — a flaky one, not shrunk, does not
    /// stop it (to measure the time to a first
    /// failure, as the per-mutant table under reports/explore/ does).
    #[arg(long)]
    pub first: bool,
    /// Run timeline N of the seed once, and nothing else.
    #[arg(long)]
    pub replay: Option<u64>,
}

/// One timeline run, as `explore.json` lists it.
#[derive(Debug, Clone, Serialize)]
struct RunLog {
    /// `12` (timeline 12 of the seed), `failing-1`, `shrink-1-7`, `minimal-1-r2`.
    label: String,
    faults: Vec<String>,
    workload_ms: u64,
    outcome: String,
    /// Timing rows it failed: reported, not judged.
    timing: Vec<String>,
    took_s: f64,
}

/// A failure found and what shrinking made of it.
#[derive(Debug, Clone, Serialize)]
struct Finding {
    n: usize,
    failed: Vec<String>,
    /// The timeline that found it (`None`: met while shrinking another).
    found_by: Option<u64>,
    found_after_s: f64,
    before: Vec<String>,
    before_size: (usize, u64, u64),
    before_chart: String,
    /// What became of it: flaky, shrunk (with why it stopped), or not shrunk yet.
    status: String,
    minimal: Vec<String>,
    minimal_size: Option<(usize, u64, u64)>,
    minimal_chart: Option<String>,
    shrink_runs: usize,
    reproduced: Option<(usize, usize)>,
    failing_file: String,
    minimal_file: Option<String>,
}

#[derive(Debug, Serialize)]
struct Explored {
    version: &'static str,
    scenario: String,
    seed: u64,
    budget_s: u64,
    jobs: usize,
    took_s: f64,
    runs: usize,
    /// Runs neither passed nor failed (exit 2 or 3, inconclusive, a fault not applied).
    unresolved: usize,
    /// Of those, infrastructure failures (exit 3), each run once more.
    infrastructure: usize,
    runs_per_hour: f64,
    findings: Vec<Finding>,
    log: Vec<RunLog>,
}

pub fn run(flags: Flags) -> u8 {
    let single = matches!(flags.scenarios.as_slice(), [one] if !one.is_dir())
        && flags.tags.is_empty()
        && flags.shard.is_none();
    if single {
        let file = flags.scenarios[0].clone();
        let base = match Base::load(&file) {
            Ok(b) => settle_runtime(b),
            Err(e) => {
                eprintln!("drill explore: {e}");
                return INVALID;
            }
        };
        if let Err(why) = explorable(&base) {
            eprintln!("drill explore: {}: {why}", file.display());
            return INVALID;
        }
        let out = flags.out.clone();
        return explore_one(flags, file, base, out);
    }
    if flags.replay.is_some() {
        eprintln!("drill explore: --replay re-runs a timeline of one scenario: name one file");
        return INVALID;
    }
    explore_many(flags)
}

/// Several scenarios (folders, --tag, --shard): each explored in turn with its share of the
/// budget, under `<out>/<name>`; the exit code the worst one's.
fn explore_many(flags: Flags) -> u8 {
    let files = match super::scenario_files(&flags.scenarios) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drill explore: {e}");
            return INVALID;
        }
    };
    let mut chosen = Vec::new();
    let mut tagged = 0;
    for file in files {
        let base = match Base::load(&file) {
            Ok(b) => settle_runtime(b),
            Err(e) => {
                eprintln!("drill explore: {e}");
                return INVALID;
            }
        };
        if !flags.tags.is_empty() && !base.plan.tags.iter().any(|t| flags.tags.contains(t)) {
            continue;
        }
        tagged += 1;
        match explorable(&base) {
            Ok(()) => chosen.push((file, base)),
            Err(why) => eprintln!("drill explore: skipping {}: {why}", file.display()),
        }
    }
    if chosen.is_empty() {
        eprintln!(
            "drill explore: of {tagged} scenario(s) selected{}, none can be explored (see above); explore takes scenarios with a workload of at most 30s on which drill check accepts some fault",
            if flags.tags.is_empty() {
                String::new()
            } else {
                format!(" by --tag {}", flags.tags.join(" or "))
            }
        );
        return INVALID;
    }
    let share = flags.budget.0 / chosen.len() as u32;
    let count = chosen.len();
    let mut worst = PASS;
    let mut ended = Vec::new();
    for (i, (file, base)) in chosen.into_iter().enumerate() {
        let mut one = flags.clone();
        one.budget = Dur(share);
        one.seed = Some(
            flags
                .seed
                .unwrap_or(base.plan.seed)
                .wrapping_add(flags.shard.map_or(0, |s| s.k as u64)),
        );
        let name = base.plan.name.clone();
        let out = flags.out.as_ref().map(|o| o.join(&name));
        eprintln!(
            "drill explore: scenario {} of {count}: {name} ({} of the budget)",
            i + 1,
            Dur(share)
        );
        let code = explore_one(one, file, base, out);
        ended.push(format!("{name}: exit {code}"));
        // 1 (a finding) outranks 0; 2 and 3 outrank both, as `drill run` over a folder.
        worst = worst.max(code);
    }
    println!("drill explore: {}", ended.join("; "));
    worst
}

/// Why explore cannot take `base`, if it cannot.
fn explorable(base: &Base) -> Result<(), String> {
    if base.plan.workload.duration > LONGEST_WORKLOAD {
        return Err(format!(
            "the workload runs {}; explore plays every timeline and every shrink candidate in full, so it takes workloads of at most 30s: write `duration: 30s` or less in a copy of the drill",
            Dur(base.plan.workload.duration)
        ));
    }
    if base.menu().choices.is_empty() {
        return Err(
            "drill check accepts no fault on this scenario's links and targets".to_string(),
        );
    }
    Ok(())
}

/// `base` told whether its broker will run in a container, as `drill run` will decide it:
/// `runtime: auto` takes one when a Docker engine answers and has the image (or can pull it).
/// Where it will not, broker faults stay off the menu (the run would refuse them, exit 3).
fn settle_runtime(base: Base) -> Base {
    use crate::dest::Runtime;
    if base.plan.destination.runtime != Runtime::Auto {
        return base;
    }
    let Some(image) = base.plan.destination.imp.image() else {
        return base;
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return base;
    };
    let mut notes = Vec::new();
    let placed = handle.block_on(crate::dest::place(
        image,
        "a local broker",
        Runtime::Auto,
        &mut notes,
    ));
    let container = matches!(placed, Ok(Some(_)));
    if !container {
        eprintln!(
            "drill explore: {}: no broker faults ({})",
            base.plan.name,
            notes.join("; ")
        );
    }
    base.broker_in_container(container)
}

/// Explores one scenario; the exit code.
fn explore_one(flags: Flags, scenario: PathBuf, base: Base, out: Option<PathBuf>) -> u8 {
    let menu = base.menu();
    let out = out.unwrap_or_else(|| Path::new("reports/explore").join(&base.plan.name));
    if let Err(e) = std::fs::create_dir_all(out.join("runs")) {
        eprintln!("drill explore: {}: {e}", out.display());
        return INFRASTRUCTURE;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("drill explore: the drill binary: {e}");
            return INFRASTRUCTURE;
        }
    };
    let seed = flags.seed.unwrap_or(base.plan.seed);
    let mut x = Explorer {
        runner: Runner {
            exe,
            out: out.clone(),
            base,
            menu,
        },
        flags,
        scenario,
        seed,
        started: Instant::now(),
        log: Vec::new(),
        findings: Vec::new(),
        unresolved: 0,
        infrastructure: 0,
    };
    eprintln!(
        "drill explore: {} choices of fault in {} families; seed {seed}; writing {}",
        x.runner.menu.choices.len(),
        x.runner.menu.families().len(),
        out.display()
    );
    if let Some(i) = x.flags.replay {
        return x.replay(i);
    }
    x.explore();
    x.write();
    eprintln!();
    let (runs, findings) = (x.log.len(), x.findings.len());
    println!(
        "drill explore: {runs} runs in {:.0} s, {findings} finding(s), {} unresolved; {}",
        x.started.elapsed().as_secs_f64(),
        x.unresolved,
        out.join("explore.md").display()
    );
    match (findings, runs) {
        (0, r) if r > 0 && x.infrastructure == r => INFRASTRUCTURE,
        (0, _) => PASS,
        _ => FAIL,
    }
}

/// Runs timelines as `drill run` children.
struct Runner {
    exe: PathBuf,
    out: PathBuf,
    base: Base,
    menu: Menu,
}

impl Runner {
    /// Runs `batch` side by side; each `(label, timeline)` gets `runs/<label>.yaml` and its
    /// own report folder. An exit 3 is run once more.
    fn run(&self, batch: &[(String, Timeline)]) -> Vec<(Outcome, RunLog, bool)> {
        let first = self.run_once(batch);
        let again: Vec<usize> = (0..batch.len())
            .filter(|&i| first[i].3 == Some(3))
            .collect();
        let retried = self.run_once(&again.iter().map(|&i| batch[i].clone()).collect::<Vec<_>>());
        let mut retried = again.into_iter().zip(retried).collect::<BTreeMap<_, _>>();
        first
            .into_iter()
            .enumerate()
            .map(|(i, run)| {
                let (outcome, log, _, exit) = retried.remove(&i).unwrap_or(run);
                (outcome, log, exit == Some(3))
            })
            .collect()
    }

    fn run_once(&self, batch: &[(String, Timeline)]) -> Vec<(Outcome, RunLog, f64, Option<i32>)> {
        let started = Instant::now();
        let children: Vec<_> = batch
            .iter()
            .map(|(label, t)| self.spawn(label, t))
            .collect();
        batch
            .iter()
            .zip(children)
            .map(|((label, t), child)| {
                let exit = child.and_then(|mut c| c.wait().ok()).and_then(|s| s.code());
                let report = std::fs::read_to_string(
                    self.out
                        .join("runs")
                        .join(label)
                        .join(&self.base.plan.name)
                        .join("report.json"),
                )
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
                let outcome = judge::outcome(exit, report.as_ref(), t.faults.len());
                let took_s = started.elapsed().as_secs_f64();
                let log = RunLog {
                    label: label.clone(),
                    faults: t.words(&self.menu),
                    workload_ms: t.workload_ms,
                    outcome: said(&outcome),
                    timing: report
                        .as_ref()
                        .map(judge::timing_failed)
                        .unwrap_or_default(),
                    took_s: (took_s * 10.0).round() / 10.0,
                };
                (outcome, log, took_s, exit)
            })
            .collect()
    }

    fn spawn(&self, label: &str, t: &Timeline) -> Option<std::process::Child> {
        let runs = self.out.join("runs");
        let file = runs.join(format!("{label}.yaml"));
        std::fs::write(&file, self.base.scenario(t, &self.menu, &runs)).ok()?;
        let log = std::fs::File::create(runs.join(format!("{label}.log"))).ok()?;
        // The child stops with explore (SIGTERM: a SIGKILL mid-shrink leaves no drill running
        // on); the thread that spawns it lives as long as the explore does.
        crate::process::std_stops_with_drill(&mut Command::new(&self.exe))
            .arg("run")
            .arg(&file)
            .arg("--out")
            .arg(runs.join(label))
            .env_remove("GITHUB_STEP_SUMMARY")
            .stdin(Stdio::null())
            .stdout(log.try_clone().ok()?)
            .stderr(log)
            .spawn()
            .ok()
    }
}

/// An outcome in a few words.
fn said(o: &Outcome) -> String {
    match o {
        Outcome::Passes => "pass".to_string(),
        Outcome::Fails(f) => format!("fails {}", names(f)),
        Outcome::Unresolved(why) => format!("unresolved: {why}"),
    }
}

fn names(f: &Failed) -> String {
    f.iter().cloned().collect::<Vec<_>>().join(", ")
}

struct Explorer {
    runner: Runner,
    flags: Flags,
    /// The scenario file explored.
    scenario: PathBuf,
    seed: u64,
    started: Instant,
    log: Vec<RunLog>,
    findings: Vec<Finding>,
    unresolved: usize,
    infrastructure: usize,
}

impl Explorer {
    /// Whether to start no more timelines: the clock, `--runs` timelines started, or every
    /// one of the first [`GIVE_UP_AFTER`] failed to run (a drill that cannot start: going on
    /// would only repeat it, hundreds of times a minute).
    fn out_of_budget(&self, started: u64) -> bool {
        (self.flags.first && self.findings.iter().any(|f| f.minimal_file.is_some()))
            || self.started.elapsed() >= self.flags.budget.0
            || self.flags.runs.is_some_and(|r| started >= r)
            || self.none_ran()
    }

    /// The first [`GIVE_UP_AFTER`] runs all exited 3 (each run twice).
    fn none_ran(&self) -> bool {
        self.log.len() >= GIVE_UP_AFTER
            && self.log.iter().all(|l| l.outcome == "unresolved: exit 3")
    }

    /// Runs a batch and logs it.
    fn run(&mut self, batch: &[(String, Timeline)]) -> Vec<Outcome> {
        let ran = self.runner.run(batch);
        ran.into_iter()
            .map(|(outcome, log, infra)| {
                if matches!(outcome, Outcome::Unresolved(_)) {
                    self.unresolved += 1;
                }
                self.infrastructure += usize::from(infra);
                self.log.push(log);
                outcome
            })
            .collect()
    }

    fn progress(&self, doing: &str) {
        let minutes = self.started.elapsed().as_secs_f64() / 60.0;
        let by: Vec<String> = self
            .findings
            .iter()
            .map(|f| format!("{{{}}}", f.failed.join(", ")))
            .collect();
        eprint!(
            "\rexplore: {} runs ({:.1}/min), findings: {}; {doing}\x1b[K",
            self.log.len(),
            self.log.len() as f64 / minutes.max(1e-9),
            if by.is_empty() {
                "none".to_string()
            } else {
                by.join(" ")
            }
        );
    }

    fn explore(&mut self) {
        let mut i = 0u64;
        while !self.out_of_budget(i) {
            let jobs =
                (self.flags.jobs.max(1) as u64).min(self.flags.runs.map_or(u64::MAX, |r| r - i));
            let batch: Vec<(u64, Timeline)> = (i..i + jobs)
                .filter_map(|k| {
                    self.runner
                        .base
                        .timeline(self.seed, k, &self.runner.menu)
                        .map(|t| (k, t))
                })
                .collect();
            i += jobs;
            self.progress(&format!(
                "running timeline {}",
                batch.first().map_or(i, |b| b.0)
            ));
            let labelled: Vec<(String, Timeline)> = batch
                .iter()
                .map(|(k, t)| (k.to_string(), t.clone()))
                .collect();
            let outcomes = self.run(&labelled);
            for ((k, t), outcome) in batch.into_iter().zip(outcomes) {
                if let Outcome::Fails(failed) = outcome
                    && !self.findings.iter().any(|f| f.failed == to_vec(&failed))
                {
                    self.found(Some(k), t, failed);
                }
            }
        }
        if self.none_ran() {
            eprintln!(
                "\ndrill explore: the first {GIVE_UP_AFTER} runs all failed to run (exit 3, each tried twice); stopped. Why: {}",
                self.runner.out.join("runs/0.log").display()
            );
        }
    }

    /// A failure: saved at once, then shrunk, then saved again.
    fn found(&mut self, by: Option<u64>, t: Timeline, failed: Failed) {
        let n = self.findings.len() + 1;
        let failing_file = format!("failing-{n}.yaml");
        let header = format!(
            "# drill explore {}: fails {} (timeline {} of seed {}, from {})\n",
            env!("CARGO_PKG_VERSION"),
            names(&failed),
            by.map_or_else(|| "met while shrinking".to_string(), |k| k.to_string()),
            self.seed,
            self.scenario.display()
        );
        let text = header
            + &self
                .runner
                .base
                .scenario(&t, &self.runner.menu, &self.runner.out);
        let _ = std::fs::write(self.runner.out.join(&failing_file), text);
        self.findings.push(Finding {
            n,
            failed: to_vec(&failed),
            found_by: by,
            found_after_s: self.started.elapsed().as_secs_f64().round(),
            before: t.words(&self.runner.menu),
            before_size: t.size(),
            before_chart: t.chart(&self.runner.menu, CHART_WIDTH),
            status: "not shrunk yet".to_string(),
            minimal: Vec::new(),
            minimal_size: None,
            minimal_chart: None,
            shrink_runs: 0,
            reproduced: None,
            failing_file,
            minimal_file: None,
        });
        self.write();
        let shrink_started = Instant::now();
        let budget = self.flags.shrink_budget.0;
        let settings = Settings {
            retries: self.flags.shrink_retries,
            confirm: self.flags.shrink_confirm,
            jobs: self.flags.jobs.max(1),
            reproduce: self.flags.reproduce,
            ..Settings::default()
        };
        let mut k = 0;
        let mut run = |ts: &[Timeline]| {
            let labelled: Vec<(String, Timeline)> = ts
                .iter()
                .map(|t| {
                    k += 1;
                    (format!("shrink-{n}-{k}"), t.clone())
                })
                .collect();
            self.progress(&format!(
                "shrinking finding {n}: candidate {k}, {} fault(s)",
                ts.first().map_or(0, |t| t.faults.len())
            ));
            self.run(&labelled)
        };
        let found = shrink::shrink(t, failed.clone(), &settings, &mut run, &mut || {
            shrink_started.elapsed() >= budget
        });
        let met = self.shrunk(n, k, &failed, found, settings.reproduce);
        self.write();
        for (other, t) in met {
            if !self.findings.iter().any(|f| f.failed == to_vec(&other)) {
                self.found(None, t, other);
            }
        }
    }

    /// Records what shrinking finding `n` came to (`k` runs): its status, and when shrunk,
    /// `minimal-<n>.yaml` and its size, chart and reproduction. Returns the other failures
    /// met on the way.
    fn shrunk(
        &mut self,
        n: usize,
        k: usize,
        failed: &Failed,
        found: Found,
        reproduce: usize,
    ) -> Vec<(Failed, Timeline)> {
        let f = &mut self.findings[n - 1];
        f.shrink_runs = k;
        match found {
            Found::Flaky { rerun } => {
                f.status = format!(
                    "flaky: the rerun did not fail the same way ({})",
                    said(&rerun)
                );
                Vec::new()
            }
            Found::Shrunk(s) => {
                let file = format!("minimal-{n}.yaml");
                let header = format!(
                    "# drill explore {}: the smallest timeline found that fails {} (shrunk from {}; reproduces {}/{})\n",
                    env!("CARGO_PKG_VERSION"),
                    names(failed),
                    f.failing_file,
                    s.reproduced,
                    reproduce
                );
                let text = header
                    + &self
                        .runner
                        .base
                        .scenario(&s.minimal, &self.runner.menu, &self.runner.out);
                let _ = std::fs::write(self.runner.out.join(&file), text);
                f.status = match s.stop {
                    Stop::Minimal { unresolved: 0 } => {
                        "shrunk: no fault can be removed, shortened or moved earlier".to_string()
                    }
                    Stop::Minimal { unresolved } => format!(
                        "shrunk: no candidate shrinks it ({unresolved} of the last round unresolved)"
                    ),
                    Stop::Budget => "shrinking stopped at --shrink-budget".to_string(),
                    Stop::NoProgress => "shrinking stopped: 15 runs without progress".to_string(),
                };
                f.minimal = s.minimal.words(&self.runner.menu);
                f.minimal_size = Some(s.minimal.size());
                f.minimal_chart = Some(s.minimal.chart(&self.runner.menu, CHART_WIDTH));
                f.reproduced = Some((s.reproduced, reproduce));
                f.minimal_file = Some(file);
                s.found
            }
        }
    }

    fn replay(&mut self, i: u64) -> u8 {
        let Some(t) = self.runner.base.timeline(self.seed, i, &self.runner.menu) else {
            eprintln!(
                "drill explore: timeline {i} of seed {} is one drill check refuses",
                self.seed
            );
            return INVALID;
        };
        let outcome = self.run(&[(format!("replay-{i}"), t)]).remove(0);
        println!("drill explore: timeline {i}: {}", said(&outcome));
        match outcome {
            Outcome::Passes => PASS,
            Outcome::Fails(_) => FAIL,
            Outcome::Unresolved(_) => INFRASTRUCTURE,
        }
    }

    fn write(&self) {
        let took = self.started.elapsed().as_secs_f64();
        let explored = Explored {
            version: env!("CARGO_PKG_VERSION"),
            scenario: self.scenario.display().to_string(),
            seed: self.seed,
            budget_s: self.flags.budget.0.as_secs(),
            jobs: self.flags.jobs,
            took_s: took.round(),
            runs: self.log.len(),
            unresolved: self.unresolved,
            infrastructure: self.infrastructure,
            runs_per_hour: (self.log.len() as f64 * 3600.0 / took.max(1.0)).round(),
            findings: self.findings.clone(),
            log: self.log.clone(),
        };
        if let Ok(json) = serde_json::to_string_pretty(&explored) {
            let _ = std::fs::write(self.runner.out.join("explore.json"), json + "\n");
        }
        let _ = std::fs::write(self.runner.out.join("explore.md"), markdown(&explored));
    }
}

fn to_vec(f: &Failed) -> Vec<String> {
    f.iter().cloned().collect()
}

/// `explore.md`: the budget and pace, then each finding.
fn markdown(x: &Explored) -> String {
    let mut out = format!(
        "# drill explore: {}\n\n{} runs in {:.0} s ({:.0} per hour; jobs {}), seed {}, budget {} s; {} unresolved ({} infrastructure failures, each run once more).\n\n",
        x.scenario,
        x.runs,
        x.took_s,
        x.runs_per_hour,
        x.jobs,
        x.seed,
        x.budget_s,
        x.unresolved,
        x.infrastructure
    );
    if x.findings.is_empty() {
        out.push_str(
            "No finding: every resolved run passed the checks a timeline cannot excuse.\n",
        );
        return out;
    }
    out.push_str("| # | fails | found by | after | faults before → after | fault seconds before → after | shrink runs | reproduces | |\n|---|---|---|---:|---:|---:|---:|---:|---|\n");
    for f in &x.findings {
        let (faults_after, secs_after) = f
            .minimal_size
            .map_or(("—".to_string(), "—".to_string()), |(n, ms, _)| {
                (n.to_string(), format!("{:.1}", ms as f64 / 1000.0))
            });
        out.push_str(&format!(
            "| {} | {} | {} | {} s | {} → {faults_after} | {:.1} → {secs_after} | {} | {} | {} |\n",
            f.n,
            f.failed.join(", "),
            f.found_by
                .map_or_else(|| "shrinking".to_string(), |k| format!("timeline {k}")),
            f.found_after_s,
            f.before_size.0,
            f.before_size.1 as f64 / 1000.0,
            f.shrink_runs,
            f.reproduced
                .map_or("—".to_string(), |(k, n)| format!("{k}/{n}")),
            f.status
        ));
    }
    for f in &x.findings {
        out.push_str(&format!(
            "\n## Finding {}: fails {}\n\nFound as `{}`:\n\n",
            f.n,
            f.failed.join(", "),
            f.failing_file
        ));
        out.push_str(&format!("```text\n{}```\n", f.before_chart));
        if let Some(file) = &f.minimal_file {
            out.push_str(&format!(
                "\nShrunk to `{file}` (`drill run {file}` replays it):\n\n"
            ));
            if let Some(chart) = &f.minimal_chart {
                out.push_str(&format!("```text\n{chart}```\n"));
            }
            if f.minimal.is_empty() {
                out.push_str("- no fault at all: the engine fails this drill unprovoked\n");
            }
        }
        out.push_str(&format!("\n{}.\n", f.status));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explore_md_has_the_pace_the_table_and_each_finding_charted() {
        let finding = Finding {
            n: 1,
            failed: vec!["ledger".into(), "lost".into()],
            found_by: Some(0),
            found_after_s: 24.0,
            before: vec!["at 2.7 s: link mqtt swallow upstream, for 18.5 s".into()],
            before_size: (1, 18_500, 8_000),
            before_chart: "██·  at 2.7 s: …\n".into(),
            status: "shrinking stopped at --shrink-budget".into(),
            minimal: vec!["at 1 s: link mqtt swallow upstream, for 9.2 s".into()],
            minimal_size: Some((1, 9_200, 5_000)),
            minimal_chart: Some("·█·  at 1 s: …\n".into()),
            shrink_runs: 14,
            reproduced: Some((2, 2)),
            failing_file: "failing-1.yaml".into(),
            minimal_file: Some("minimal-1.yaml".into()),
        };
        let x = Explored {
            version: "0",
            scenario: "base.yaml".into(),
            seed: 5,
            budget_s: 1800,
            jobs: 2,
            took_s: 191.0,
            runs: 16,
            unresolved: 1,
            infrastructure: 0,
            runs_per_hour: 302.0,
            findings: vec![finding],
            log: Vec::new(),
        };
        let md = markdown(&x);
        assert!(
            md.contains("16 runs in 191 s (302 per hour; jobs 2), seed 5"),
            "{md}"
        );
        assert!(
            md.contains("| 1 | ledger, lost | timeline 0 | 24 s | 1 → 1 | 18.5 → 9.2 | 14 | 2/2 |"),
            "{md}"
        );
        assert!(md.contains("```text\n██·  at 2.7 s: …\n```"), "{md}");
        assert!(md.contains("Shrunk to `minimal-1.yaml`"), "{md}");
        assert!(md.contains("```text\n·█·  at 1 s: …\n```"), "{md}");
        let clean = Explored {
            findings: Vec::new(),
            ..x
        };
        assert!(markdown(&clean).contains("No finding"));
    }
}
