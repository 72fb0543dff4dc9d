//! The fault timeline of a drill: the scenario's faults as steps at instants on the drill's
//! clock (a fault, its heal, a restart after `restart_after`). Pure: no I/O, no clock.

use std::time::Duration;

use crate::proxy::{Fault, FaultSpec};
use crate::scenario::{BrokerNode, FaultAction, Plan, ProcessAction};

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
    },
    RestartEngine,
    /// The end of a `fill_disk`: space returns.
    DiskBack,
    Broker {
        index: usize,
        node: BrokerNode,
        action: ProcessAction,
    },
    RestartBroker,
}

pub fn timeline(plan: &Plan) -> Vec<(Duration, Step)> {
    let mut steps = Vec::new();
    for (index, f) in plan.faults.iter().enumerate() {
        match &f.what {
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
            } => {
                steps.push((
                    f.at,
                    Step::Engine {
                        index,
                        action: *action,
                        wipe_data: *wipe_data,
                    },
                ));
                if let Some(d) = restart_after {
                    steps.push((f.at + *d, Step::RestartEngine));
                }
                if let Some(d) = lasts {
                    steps.push((f.at + *d, Step::DiskBack));
                }
            }
        }
    }
    steps.sort_by_key(|(at, _)| *at);
    steps
}

/// `swallow`, `delay 100ms±10ms`, `throttle 50000 B/s`.
pub fn describe(spec: &FaultSpec) -> String {
    match spec.fault {
        Fault::Delay => format!(
            "delay {}ms±{}ms",
            spec.latency.as_millis(),
            spec.jitter.as_millis()
        ),
        Fault::Throttle => format!("throttle {} B/s", spec.bytes_per_s),
        f => f.name().to_string(),
    }
}
