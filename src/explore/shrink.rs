//! Shrinking a failing timeline to a minimal one that fails the same way, as Hypothesis and
//! QuickCheck shrink an input: passes in a fixed order, each repeated until nothing changes —
//! a shorter workload, one fault fewer, two overlapping faults of one kind merged, a fault half
//! as long, a fault earlier. Pure: the runs are the caller's ([`shrink`]'s `run`), so the same
//! code shrinks real drills and the synthetic oracles of its tests.
//!
//! The rules, where a rerun may not reproduce (DEMi's lesson):
//! - the failing timeline is rerun once before anything; when it does not fail the same way
//!   again it is [`Found::Flaky`] and not shrunk;
//! - a candidate is accepted only when it fails with the same signature (the set of failed
//!   checks, no counts) `confirm` runs in a row — one that fails so once and then passes is
//!   flaky, counted unresolved — and one failing otherwise is a new finding, kept and never
//!   accepted;
//! - a candidate counts as passing only after `retries` runs that all passed; a run that is
//!   neither (an unapplied fault, an infrastructure failure, an inconclusive drill) is
//!   *unresolved*, never a pass;
//! - candidates run `jobs` at a time, and the accepted one is the first in the pass's order
//!   that shrinks, whichever run finished first;
//! - it stops at a fixpoint (no pass changes anything: no single fault can be removed), at the
//!   budget, or after `stale_runs` runs without progress, and says which. The minimal timeline
//!   is then rerun `reproduce` times.

use std::collections::BTreeSet;

use super::timeline::{Fault, Timeline};

/// A signature: the names of the checks a run failed (`lost`, `duplicates`), no counts.
pub type Failed = BTreeSet<String>;

/// What one run of a timeline came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The drill failed these checks.
    Fails(Failed),
    /// Every check held.
    Passes,
    /// Neither: why (a fault that did not apply, exit 3, an inconclusive drill).
    Unresolved(String),
}

/// How hard to shrink.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Runs a candidate must pass before it counts as passing (`--shrink-retries`).
    pub retries: usize,
    /// Runs in a row a candidate must fail the same way before it is accepted
    /// (`--shrink-confirm`): one lucky failure does not make a minimal timeline.
    pub confirm: usize,
    /// Candidates run at once.
    pub jobs: usize,
    /// At most this many runs (the run budget; a clock is the caller's `out_of_time`).
    pub max_runs: usize,
    /// Stop after this many runs without an accepted candidate.
    pub stale_runs: usize,
    /// Reruns of the minimal timeline ("reproduces k/K").
    pub reproduce: usize,
    /// The shortest workload a candidate may have.
    pub min_workload_ms: u64,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            retries: 2,
            confirm: 2,
            jobs: 2,
            max_runs: usize::MAX,
            stale_runs: 15,
            reproduce: 3,
            min_workload_ms: 5_000,
        }
    }
}

/// Why shrinking stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// No pass changed anything: no single fault can be removed, shortened or moved earlier
    /// and still fail the same way (of those candidates, `unresolved` could not be judged).
    Minimal { unresolved: usize },
    /// The run budget or the clock ran out.
    Budget,
    /// `stale_runs` runs in a row accepted nothing.
    NoProgress,
}

/// A failure shrunk.
#[derive(Debug, Clone)]
pub struct Shrunk {
    pub minimal: Timeline,
    pub failed: Failed,
    /// Runs spent, the first rerun and the reproductions included.
    pub runs: usize,
    pub stop: Stop,
    /// Other signatures met on the way, each with the first timeline that showed it.
    pub found: Vec<(Failed, Timeline)>,
    /// Reruns of the minimal timeline that failed the same way, of `reproduce`.
    pub reproduced: usize,
}

/// What shrinking a failure came to.
#[derive(Debug, Clone)]
pub enum Found {
    /// The rerun did not fail the same way: reported, not shrunk.
    Flaky {
        rerun: Outcome,
    },
    Shrunk(Shrunk),
}

/// A candidate's runs, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    Same,
    Other(Failed),
    Passes,
    Unresolved,
}

/// Shrinks `start`, which failed with `failed`. `run` runs timelines (up to `jobs` at once)
/// and returns their outcomes in the order given; `out_of_time` says when the clock budget is
/// spent.
pub fn shrink(
    start: Timeline,
    failed: Failed,
    settings: &Settings,
    run: &mut dyn FnMut(&[Timeline]) -> Vec<Outcome>,
    out_of_time: &mut dyn FnMut() -> bool,
) -> Found {
    let mut s = Shrinker {
        failed,
        settings,
        run,
        runs: 0,
        stale: 0,
        found: Vec::new(),
    };
    let rerun = s.run_all(std::slice::from_ref(&start)).remove(0);
    if rerun != Outcome::Fails(s.failed.clone()) {
        return Found::Flaky { rerun };
    }
    let mut current = start;
    let stop = 'shrink: loop {
        let mut progressed = false;
        let mut unresolved = 0;
        for pass in PASSES {
            loop {
                if s.runs >= settings.max_runs || out_of_time() {
                    break 'shrink Stop::Budget;
                }
                if s.stale >= settings.stale_runs {
                    break 'shrink Stop::NoProgress;
                }
                let candidates: Vec<Timeline> = pass(&current, settings)
                    .into_iter()
                    .filter(|c| *c != current)
                    .collect();
                match s.first_that_shrinks(&candidates, &mut unresolved) {
                    Some(better) => {
                        current = better;
                        progressed = true;
                        unresolved = 0;
                    }
                    None => break,
                }
            }
        }
        if !progressed {
            break Stop::Minimal { unresolved };
        }
    };
    let again = vec![current.clone(); settings.reproduce];
    let reproduced = s
        .run_all(&again)
        .iter()
        .filter(|o| **o == Outcome::Fails(s.failed.clone()))
        .count();
    Found::Shrunk(Shrunk {
        minimal: current,
        failed: s.failed,
        runs: s.runs,
        stop,
        found: s.found,
        reproduced,
    })
}

struct Shrinker<'a> {
    failed: Failed,
    settings: &'a Settings,
    run: &'a mut dyn FnMut(&[Timeline]) -> Vec<Outcome>,
    runs: usize,
    /// Runs since the last accepted candidate.
    stale: usize,
    found: Vec<(Failed, Timeline)>,
}

impl Shrinker<'_> {
    fn run_all(&mut self, timelines: &[Timeline]) -> Vec<Outcome> {
        let outcomes = (self.run)(timelines);
        assert_eq!(outcomes.len(), timelines.len(), "one outcome per timeline");
        self.runs += timelines.len();
        self.stale += timelines.len();
        outcomes
    }

    /// The first of `candidates`, in their order, that fails the same way, judged `jobs` at a
    /// time; `unresolved` counts those that could not be judged.
    fn first_that_shrinks(
        &mut self,
        candidates: &[Timeline],
        unresolved: &mut usize,
    ) -> Option<Timeline> {
        for batch in candidates.chunks(self.settings.jobs.max(1)) {
            if self.runs >= self.settings.max_runs || self.stale >= self.settings.stale_runs {
                return None;
            }
            let judged = self.judge(batch);
            for (candidate, j) in batch.iter().zip(&judged) {
                match j {
                    Judged::Other(failed) if !self.found.iter().any(|(f, _)| f == failed) => {
                        self.found.push((failed.clone(), candidate.clone()));
                    }
                    Judged::Unresolved => *unresolved += 1,
                    _ => {}
                }
            }
            if let Some(i) = judged.iter().position(|j| *j == Judged::Same) {
                self.stale = 0;
                return Some(batch[i].clone());
            }
        }
        None
    }

    /// Each of `batch` run until it has passed `retries` times, failed the same way `confirm`
    /// times in a row, or come to anything else.
    fn judge(&mut self, batch: &[Timeline]) -> Vec<Judged> {
        let mut judged = vec![Judged::Passes; batch.len()];
        let mut passes = vec![0; batch.len()];
        let mut same = vec![0; batch.len()];
        loop {
            let pending: Vec<usize> = (0..batch.len())
                .filter(|&i| match judged[i] {
                    Judged::Passes => passes[i] < self.settings.retries.max(1),
                    Judged::Same => same[i] < self.settings.confirm.max(1),
                    _ => false,
                })
                .collect();
            if pending.is_empty() {
                return judged;
            }
            let timelines: Vec<Timeline> = pending.iter().map(|&i| batch[i].clone()).collect();
            for (&i, outcome) in pending.iter().zip(self.run_all(&timelines)) {
                judged[i] = match outcome {
                    Outcome::Fails(f) if f == self.failed => {
                        same[i] += 1;
                        Judged::Same
                    }
                    Outcome::Fails(f) => Judged::Other(f),
                    // Failed the same way, then passed: neither shrinks nor passes.
                    Outcome::Passes if same[i] > 0 => Judged::Unresolved,
                    Outcome::Passes => {
                        passes[i] += 1;
                        Judged::Passes
                    }
                    Outcome::Unresolved(_) => Judged::Unresolved,
                };
            }
        }
    }
}

/// A pass: the candidates it makes of a timeline, in the order they are tried.
type Pass = fn(&Timeline, &Settings) -> Vec<Timeline>;

/// The passes in order: the workload first (every later run is shorter for it), then one
/// fault fewer, merged, shorter, earlier.
const PASSES: [Pass; 5] = [shorter_workload, one_fewer, merged, halved, earlier];

fn shorter_workload(t: &Timeline, s: &Settings) -> Vec<Timeline> {
    let half = (t.workload_ms / 2 / 1_000 * 1_000).max(s.min_workload_ms);
    if half >= t.workload_ms {
        return Vec::new();
    }
    vec![Timeline::new(t.faults.clone(), half)]
}

fn one_fewer(t: &Timeline, _: &Settings) -> Vec<Timeline> {
    (0..t.faults.len())
        .map(|i| {
            let mut faults = t.faults.clone();
            faults.remove(i);
            Timeline::new(faults, t.workload_ms)
        })
        .collect()
}

fn merged(t: &Timeline, _: &Settings) -> Vec<Timeline> {
    let mut out = Vec::new();
    for i in 0..t.faults.len() {
        for j in i + 1..t.faults.len() {
            let (a, b) = (t.faults[i], t.faults[j]);
            let overlap = a.choice == b.choice
                && a.len_ms.is_some()
                && b.len_ms.is_some()
                && b.at_ms <= a.end_ms();
            if overlap {
                let mut faults = t.faults.clone();
                faults[i] = Fault {
                    len_ms: Some(a.end_ms().max(b.end_ms()) - a.at_ms),
                    ..a
                };
                faults.remove(j);
                out.push(Timeline::new(faults, t.workload_ms));
            }
        }
    }
    out
}

/// The shortest a halved fault gets.
const SHORTEST_MS: u64 = 500;

fn halved(t: &Timeline, _: &Settings) -> Vec<Timeline> {
    (0..t.faults.len())
        .filter_map(|i| {
            let len = t.faults[i].len_ms?;
            let half = (len / 2 / 100 * 100).max(SHORTEST_MS);
            (half < len).then(|| {
                let mut faults = t.faults.clone();
                faults[i].len_ms = Some(half);
                Timeline::new(faults, t.workload_ms)
            })
        })
        .collect()
}

/// The earliest a fault moves to: after the workload's first second.
const EARLIEST_MS: u64 = 1_000;

fn earlier(t: &Timeline, _: &Settings) -> Vec<Timeline> {
    (0..t.faults.len())
        .filter_map(|i| {
            let at = t.faults[i].at_ms;
            let to = (EARLIEST_MS + (at.saturating_sub(EARLIEST_MS)) / 2) / 100 * 100;
            (to < at).then(|| {
                let mut faults = t.faults.clone();
                faults[i].at_ms = to;
                Timeline::new(faults, t.workload_ms)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashMap;

    use super::*;

    const REFUSE: usize = 0;
    const SWALLOW: usize = 1;
    const STRAND: usize = 3;
    const KILL: usize = 4;

    fn fault(choice: usize, at_s: f64, len_s: Option<f64>) -> Fault {
        Fault {
            at_ms: (at_s * 1000.0) as u64,
            choice,
            len_ms: len_s.map(|l| (l * 1000.0) as u64),
        }
    }

    fn names(n: &[&str]) -> Failed {
        n.iter().map(|s| s.to_string()).collect()
    }

    /// Bug A: a kill that starts within 2 s after a refusal heals loses records. Bug B: a
    /// swallow of 4 s or more duplicates them. A is checked first.
    fn bugs(t: &Timeline) -> Outcome {
        let a = t.faults.iter().any(|r| {
            r.choice == REFUSE
                && t.faults.iter().any(|k| {
                    k.choice == KILL && k.at_ms >= r.end_ms() && k.at_ms <= r.end_ms() + 2_000
                })
        });
        let b = t
            .faults
            .iter()
            .any(|f| f.choice == SWALLOW && f.len_ms.unwrap_or(0) >= 4_000);
        match (a, b) {
            (true, _) => Outcome::Fails(names(&["lost"])),
            (false, true) => Outcome::Fails(names(&["duplicates"])),
            _ => Outcome::Passes,
        }
    }

    fn both_bugs() -> Timeline {
        Timeline::new(
            vec![
                fault(SWALLOW, 2.0, Some(8.0)),
                fault(REFUSE, 3.0, Some(10.0)),
                fault(KILL, 14.0, Some(5.0)),
                fault(STRAND, 25.0, None),
            ],
            30_000,
        )
    }

    fn shrunk(found: Found) -> Shrunk {
        match found {
            Found::Shrunk(s) => s,
            Found::Flaky { rerun } => panic!("flaky: {rerun:?}"),
        }
    }

    fn run_with(
        oracle: &dyn Fn(&Timeline) -> Outcome,
        jobs_seen: &Cell<usize>,
    ) -> impl FnMut(&[Timeline]) -> Vec<Outcome> {
        move |ts: &[Timeline]| {
            jobs_seen.set(jobs_seen.get().max(ts.len()));
            ts.iter().map(oracle).collect()
        }
    }

    #[test]
    fn shrinking_bug_a_never_ends_at_bug_b_and_reports_b() {
        let seen = Cell::new(0);
        let settings = Settings {
            reproduce: 3,
            ..Settings::default()
        };
        let s = shrunk(shrink(
            both_bugs(),
            names(&["lost"]),
            &settings,
            &mut run_with(&bugs, &seen),
            &mut || false,
        ));
        assert_eq!(s.failed, names(&["lost"]));
        assert_eq!(bugs(&s.minimal), Outcome::Fails(names(&["lost"])));
        let kinds: Vec<usize> = s.minimal.faults.iter().map(|f| f.choice).collect();
        assert_eq!(kinds, [REFUSE, KILL], "{:?}", s.minimal);
        assert_eq!(s.minimal.workload_ms, 5_000);
        assert!(
            matches!(s.stop, Stop::Minimal { unresolved: 0 }),
            "{:?}",
            s.stop
        );
        assert_eq!(s.reproduced, 3);
        assert_eq!(s.found.len(), 1);
        assert_eq!(s.found[0].0, names(&["duplicates"]));
        assert_eq!(bugs(&s.found[0].1), Outcome::Fails(names(&["duplicates"])));
        // Shorter and earlier, not only fewer: the kill's restart halved down to 0.5 s, the
        // refusal moved earlier (a shorter or later one would heal more than 2 s before the
        // kill: no longer bug A).
        assert_eq!(s.minimal.faults[1].len_ms, Some(500), "{:?}", s.minimal);
        assert!(s.minimal.faults[0].at_ms < 3_000, "{:?}", s.minimal);
        assert!(seen.get() <= 3, "jobs 2, reproduce 3");
    }

    #[test]
    fn which_candidate_is_accepted_does_not_depend_on_jobs() {
        let minimal = |jobs: usize| {
            let seen = Cell::new(0);
            let settings = Settings {
                jobs,
                ..Settings::default()
            };
            let s = shrunk(shrink(
                both_bugs(),
                names(&["lost"]),
                &settings,
                &mut run_with(&bugs, &seen),
                &mut || false,
            ));
            assert!(seen.get() <= jobs.max(3));
            s.minimal
        };
        assert_eq!(minimal(1), minimal(2));
        assert_eq!(minimal(1), minimal(4));
    }

    #[test]
    fn a_failure_that_does_not_fail_again_is_flaky_and_not_shrunk() {
        let calls = Cell::new(0);
        // Fails half the time: every other run.
        let mut half = |ts: &[Timeline]| {
            ts.iter()
                .map(|t| {
                    calls.set(calls.get() + 1);
                    if calls.get() % 2 == 1 {
                        Outcome::Passes
                    } else {
                        bugs(t)
                    }
                })
                .collect()
        };
        match shrink(
            both_bugs(),
            names(&["lost"]),
            &Settings::default(),
            &mut half,
            &mut || false,
        ) {
            Found::Flaky { rerun } => assert_eq!(rerun, Outcome::Passes),
            Found::Shrunk(s) => panic!("shrunk a flaky failure: {s:?}"),
        }
        assert_eq!(calls.get(), 1, "one rerun, nothing more");
    }

    /// [`both_bugs`] shrunk for `lost` with `settings`, each timeline's outcome given by
    /// `oracle(timeline, how many times it has run, this run included)`.
    fn shrunk_by_run(settings: Settings, oracle: impl Fn(&Timeline, usize) -> Outcome) -> Shrunk {
        let mut seen: HashMap<Timeline, usize> = HashMap::new();
        let mut run = |ts: &[Timeline]| {
            ts.iter()
                .map(|t| {
                    let n = seen.entry(t.clone()).or_default();
                    *n += 1;
                    oracle(t, *n)
                })
                .collect()
        };
        shrunk(shrink(
            both_bugs(),
            names(&["lost"]),
            &settings,
            &mut run,
            &mut || false,
        ))
    }

    #[test]
    fn a_candidate_passes_only_after_the_retries() {
        // Each timeline's first run passes, later runs tell the truth: with one try every
        // candidate looks passing; with two, the shrink goes through.
        let runs_of = |retries: usize| {
            let settings = Settings {
                retries,
                ..Settings::default()
            };
            shrunk_by_run(settings, |t, n| {
                if n == 1 && *t != both_bugs() {
                    Outcome::Passes
                } else {
                    bugs(t)
                }
            })
        };
        let once = runs_of(1);
        assert_eq!(once.minimal, both_bugs(), "with one try nothing shrinks");
        let twice = runs_of(2);
        assert_eq!(twice.minimal.faults.len(), 2, "{:?}", twice.minimal);
    }

    #[test]
    fn a_candidate_that_failed_once_by_luck_is_not_accepted() {
        // The start fails every time; every candidate fails as it does on its first run only
        // (a lucky timing), then passes.
        let minimal_with = |confirm: usize| {
            let settings = Settings {
                confirm,
                ..Settings::default()
            };
            shrunk_by_run(settings, |t, n| {
                if n == 1 || *t == both_bugs() {
                    bugs(t)
                } else {
                    Outcome::Passes
                }
            })
        };
        let believed = minimal_with(1);
        assert_ne!(believed.minimal, both_bugs(), "one failure was enough");
        assert_eq!(
            believed.reproduced, 0,
            "and the minimal one does not reproduce"
        );
        let confirmed = minimal_with(2);
        assert_eq!(confirmed.minimal, both_bugs(), "{:?}", confirmed.minimal);
        assert_eq!(confirmed.reproduced, 3);
        assert!(
            matches!(confirmed.stop, Stop::Minimal { unresolved } if unresolved > 0),
            "{:?}",
            confirmed.stop
        );
    }

    #[test]
    fn unresolved_runs_are_no_pass_and_stop_a_shrink_that_makes_no_progress() {
        let mut unresolved = |ts: &[Timeline]| {
            ts.iter()
                .map(|t| {
                    if *t == both_bugs() {
                        bugs(t)
                    } else {
                        Outcome::Unresolved("exit 3".into())
                    }
                })
                .collect()
        };
        // A round of candidates is 12 runs here: with 5 stale runs allowed it stops first.
        let settings = Settings {
            stale_runs: 5,
            ..Settings::default()
        };
        let s = shrunk(shrink(
            both_bugs(),
            names(&["lost"]),
            &settings,
            &mut unresolved,
            &mut || false,
        ));
        assert_eq!(s.minimal, both_bugs());
        assert_eq!(s.stop, Stop::NoProgress);
        // With the default 15 it makes the whole round and says none of it could be judged.
        let s = shrunk(shrink(
            both_bugs(),
            names(&["lost"]),
            &Settings::default(),
            &mut unresolved,
            &mut || false,
        ));
        assert_eq!(s.stop, Stop::Minimal { unresolved: 12 });
        // With few enough candidates to try them all, the fixpoint says some were unresolved.
        let mut small_unresolved = |ts: &[Timeline]| {
            ts.iter()
                .map(|t| {
                    if t.faults.len() == 1 && t.workload_ms == 5_000 && t.faults[0].at_ms == 1_000 {
                        Outcome::Fails(names(&["lost"]))
                    } else {
                        Outcome::Unresolved("a fault did not apply".into())
                    }
                })
                .collect()
        };
        let one = Timeline::new(vec![fault(KILL, 1.0, Some(0.5))], 5_000);
        let s = shrunk(shrink(
            one,
            names(&["lost"]),
            &Settings::default(),
            &mut small_unresolved,
            &mut || false,
        ));
        assert_eq!(s.stop, Stop::Minimal { unresolved: 1 });
    }

    #[test]
    fn the_budget_stops_a_shrink_and_says_so() {
        let seen = Cell::new(0);
        let settings = Settings {
            max_runs: 6,
            ..Settings::default()
        };
        let s = shrunk(shrink(
            both_bugs(),
            names(&["lost"]),
            &settings,
            &mut run_with(&bugs, &seen),
            &mut || false,
        ));
        assert_eq!(s.stop, Stop::Budget);
        assert!(
            s.runs <= 6 + settings.reproduce + settings.jobs,
            "{}",
            s.runs
        );
        let s = shrunk(shrink(
            both_bugs(),
            names(&["lost"]),
            &Settings::default(),
            &mut run_with(&bugs, &seen),
            &mut || true,
        ));
        assert_eq!(s.stop, Stop::Budget);
        assert_eq!(s.minimal, both_bugs());
    }

    #[test]
    fn the_passes_make_smaller_timelines() {
        let t = Timeline::new(
            vec![
                fault(REFUSE, 3.0, Some(10.0)),
                fault(REFUSE, 8.0, Some(10.0)),
            ],
            20_000,
        );
        let s = Settings::default();
        assert_eq!(shorter_workload(&t, &s)[0].workload_ms, 10_000);
        assert_eq!(one_fewer(&t, &s).len(), 2);
        let m = merged(&t, &s);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].faults, [fault(REFUSE, 3.0, Some(15.0))]);
        assert_eq!(halved(&t, &s)[0].faults[0].len_ms, Some(5_000));
        assert_eq!(earlier(&t, &s)[0].faults[0].at_ms, 2_000);
        let tiny = Timeline::new(vec![fault(STRAND, 1.0, None)], 5_000);
        assert!(shorter_workload(&tiny, &s).is_empty());
        assert!(halved(&tiny, &s).is_empty());
        assert!(earlier(&tiny, &s).is_empty());
    }
}
