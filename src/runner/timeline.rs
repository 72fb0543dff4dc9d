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
    /// The engine's wall clock steps by `by_s` seconds.
    ClockJump {
        index: usize,
        by_s: i64,
    },
    /// The engine's disk answers errors (`Some`), or that fault ends (`None`: at its `for`).
    DiskError {
        index: usize,
        fault: crate::powerfs::IoFault,
        ends: bool,
    },
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
            FaultAction::Clock { by_s } => {
                steps.push((f.at, Step::ClockJump { index, by_s: *by_s }));
            }
        }
    }
    steps.sort_by_key(|(at, _)| *at);
    steps
}
