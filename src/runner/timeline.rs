//! The fault timeline of a drill: the scenario's faults as steps at instants on the drill's
//! clock (a fault, its heal, a restart after `restart_after`). Pure: no I/O, no clock.

use std::time::Duration;

use crate::dest::{AnswerFault, Node};
use crate::proxy::FaultSpec;
use crate::scenario::{FaultAction, Plan, PowerCut, ProcessAction};

/// One scheduled step of the timeline.
#[derive(Debug, Clone)]
pub enum Step {
    Link {
        index: usize,
        link: String,
        spec: FaultSpec,
    },
    ProxyDown {
        index: usize,
    },
    Heal {
        index: Option<usize>,
        link: String,
    },
    Engine {
        index: usize,
        action: ProcessAction,
        wipe_data: bool,
        /// A power cut's shape; with a crash point, this step arms it and the restart comes
        /// `restart_after` after the crash (the play loop schedules it then).
        power: PowerCut,
        restart_after: Option<Duration>,
    },
    RestartEngine,
    /// The end of a `fill_disk`: space returns.
    DiskBack,
    Broker {
        index: usize,
        node: Node,
        action: ProcessAction,
    },
    RestartBroker,
    /// A destination drill hosts answers otherwise (`Some`) or normally again (`None`).
    Answer {
        index: usize,
        fault: Option<AnswerFault>,
    },
    /// drill does something to the file the engine tails.
    Source {
        index: usize,
        action: crate::source::SourceAction,
    },
    /// The engine's wall clock steps by `by_s` seconds: a jump, or one tick of a drift.
    ClockJump {
        index: usize,
        by_s: i64,
        drift: Option<DriftTick>,
    },
    /// The engine's disk answers errors (`Some`), or that fault ends (`None`: at its `for`).
    DiskError {
        index: usize,
        fault: crate::powerfs::IoFault,
        ends: bool,
    },
}

/// Where a tick of a `clock: drift` stands: the first (at `at`, moving nothing) records the
/// fault, the last ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriftTick {
    /// The whole drift: `by` over `over`.
    pub total_s: i64,
    pub over: Duration,
    pub first: bool,
    pub last: bool,
}

/// A drift of `total_s` over `over` (whole seconds, at least 2) as one tick a second: tick `k`
/// moves the clock to where `k` seconds of the drift put it (rounded to whole seconds), so the
/// steps add up to `total_s` exactly. Tick 0 moves nothing.
fn drift_ticks(index: usize, total_s: i64, over: Duration) -> Vec<(Duration, Step)> {
    let n = over.as_secs().max(1) as i64;
    let at_k = |k: i64| (total_s * k + n / 2 * total_s.signum()) / n;
    (0..=n)
        .map(|k| {
            let step = Step::ClockJump {
                index,
                by_s: if k == 0 { 0 } else { at_k(k) - at_k(k - 1) },
                drift: Some(DriftTick {
                    total_s,
                    over,
                    first: k == 0,
                    last: k == n,
                }),
            };
            (Duration::from_secs(k as u64), step)
        })
        .collect()
}

pub fn timeline(plan: &Plan) -> Vec<(Duration, Step)> {
    let mut steps = Vec::new();
    for (index, f) in plan.faults.iter().enumerate() {
        match &f.what {
            FaultAction::Source(action) => steps.push((
                f.at,
                Step::Source {
                    index,
                    action: *action,
                },
            )),
            FaultAction::Broker {
                node,
                action,
                restart_after,
            } => {
                steps.push((
                    f.at,
                    Step::Broker {
                        index,
                        node: *node,
                        action: *action,
                    },
                ));
                if let Some(d) = restart_after {
                    steps.push((f.at + *d, Step::RestartBroker));
                }
            }
            FaultAction::Answer { fault, lasts } => {
                let fault = Some(*fault);
                steps.push((f.at, Step::Answer { index, fault }));
                let fault = None;
                steps.push((f.at + *lasts, Step::Answer { index, fault }));
            }
            FaultAction::Link { link, spec, lasts } => {
                steps.push((
                    f.at,
                    Step::Link {
                        index,
                        link: link.clone(),
                        spec: *spec,
                    },
                ));
                if let Some(d) = lasts.filter(|_| !spec.fault.instantaneous()) {
                    steps.push((
                        f.at + d,
                        Step::Heal {
                            index: Some(index),
                            link: link.clone(),
                        },
                    ));
                }
            }
            FaultAction::ProxyRestart { down_for } => {
                steps.push((f.at, Step::ProxyDown { index }));
                steps.push((
                    f.at + *down_for,
                    Step::Heal {
                        index: Some(index),
                        link: "proxy".to_string(),
                    },
                ));
            }
            FaultAction::Heal { link } => steps.push((
                f.at,
                Step::Heal {
                    index: None,
                    link: link.clone(),
                },
            )),
            FaultAction::Engine {
                action,
                restart_after,
                wipe_data,
                lasts,
                power,
            } => {
                steps.push((
                    f.at,
                    Step::Engine {
                        index,
                        action: *action,
                        wipe_data: *wipe_data,
                        power: power.clone(),
                        restart_after: *restart_after,
                    },
                ));
                if let Some(d) = restart_after.filter(|_| power.crash_at.is_none()) {
                    steps.push((f.at + d, Step::RestartEngine));
                }
                if let Some(d) = lasts {
                    steps.push((f.at + *d, Step::DiskBack));
                }
            }
            FaultAction::Disk { fault, lasts } => {
                let step = |ends| Step::DiskError {
                    index,
                    fault: fault.clone(),
                    ends,
                };
                steps.push((f.at, step(false)));
                if let Some(d) = lasts {
                    steps.push((f.at + *d, step(true)));
                }
            }
            FaultAction::Clock { by_s, over: None } => {
                steps.push((
                    f.at,
                    Step::ClockJump {
                        index,
                        by_s: *by_s,
                        drift: None,
                    },
                ));
            }
            FaultAction::Clock {
                by_s,
                over: Some(over),
            } => {
                for (after, step) in drift_ticks(index, *by_s, *over) {
                    steps.push((f.at + after, step));
                }
            }
        }
    }
    steps.sort_by_key(|(at, _)| *at);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drift is a tick a second; the ticks add up to the whole drift, forward or back.
    #[test]
    fn a_drift_is_a_tick_a_second_adding_up_to_its_whole() {
        for (total, secs) in [(600, 60), (-600, 60), (7, 3), (-5, 4), (1, 10)] {
            let ticks = drift_ticks(3, total, Duration::from_secs(secs));
            assert_eq!(ticks.len() as u64, secs + 1);
            let steps: Vec<i64> = ticks
                .iter()
                .map(|(_, s)| match s {
                    Step::ClockJump { by_s, .. } => *by_s,
                    _ => panic!("a clock step"),
                })
                .collect();
            assert_eq!(
                steps.iter().sum::<i64>(),
                total,
                "{total} over {secs}: {steps:?}"
            );
            assert_eq!(steps[0], 0);
            assert!(steps.iter().all(|s| s.signum() != -total.signum()));
            assert_eq!(ticks.last().unwrap().0, Duration::from_secs(secs));
            let flags: Vec<(bool, bool)> = ticks
                .iter()
                .map(|(_, s)| match s {
                    Step::ClockJump { drift: Some(d), .. } => (d.first, d.last),
                    _ => panic!("a drift tick"),
                })
                .collect();
            assert_eq!(flags.first(), Some(&(true, false)));
            assert_eq!(flags.last(), Some(&(false, true)));
        }
    }
}
