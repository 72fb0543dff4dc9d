//! What a scenario's faults hold on each link while their windows overlap
//! (docs/src/design.md#3-fault-vocabulary: a link holds any number of conditions — `delay`,
//! `throttle` — and at most one cut). A fault's end removes that fault only: a `swallow` for 5 s
//! in the middle of a 20 s `delay` leaves the delay in force when it heals. A cut that starts
//! while another is in force takes its place (a link cannot be refused and swallowed at once); the
//! earlier cut's end then changes nothing. A `heal` step, and the end of a proxy restart, end
//! everything on the link.

use std::collections::BTreeMap;

use crate::proxy::FaultSpec;

/// What one link holds: the scenario's fault index with each spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    pub cut: Option<(usize, FaultSpec)>,
    pub conditions: Vec<(usize, FaultSpec)>,
}

impl Held {
    /// The cut and the conditions, as [`crate::proxy::Link::set_stack`] takes them.
    pub fn specs(&self) -> (Option<FaultSpec>, Vec<FaultSpec>) {
        (
            self.cut.map(|(_, s)| s),
            self.conditions.iter().map(|(_, s)| *s).collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.cut.is_none() && self.conditions.is_empty()
    }

    /// One line for the drill's output: what stays in force (`delay 300ms both`).
    pub fn describe(&self) -> String {
        self.cut
            .iter()
            .chain(&self.conditions)
            .map(|(_, s)| s.describe())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Every link's [`Held`], by link name.
#[derive(Debug, Default)]
pub struct Stacks {
    links: BTreeMap<String, Held>,
}

impl Stacks {
    /// Fault `index` (an instant-free fault: not `strand`) starts on `link`; what it holds now.
    pub fn start(&mut self, link: &str, index: usize, spec: FaultSpec) -> &Held {
        let held = self.links.entry(link.to_string()).or_default();
        if spec.fault.shapes() {
            held.conditions.push((index, spec));
        } else {
            held.cut = Some((index, spec));
        }
        held
    }

    /// Fault `index` ends on `link` (`None`: everything on it ends); what the link holds now.
    pub fn end(&mut self, link: &str, index: Option<usize>) -> Held {
        let held = self.links.entry(link.to_string()).or_default();
        match index {
            None => *held = Held::default(),
            Some(i) => {
                if held.cut.is_some_and(|(c, _)| c == i) {
                    held.cut = None;
                }
                held.conditions.retain(|(c, _)| *c != i);
            }
        }
        held.clone()
    }

    /// What `link` holds now.
    pub fn held(&self, link: &str) -> Held {
        self.links.get(link).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proxy::{Direction, Fault};

    fn delay(ms: u64) -> FaultSpec {
        FaultSpec::delay(Direction::Both, Duration::from_millis(ms), Duration::ZERO)
    }

    #[test]
    fn a_cut_in_the_middle_of_a_condition_leaves_the_condition_when_it_ends() {
        let mut s = Stacks::default();
        s.start("mqtt", 0, delay(300));
        let swallow = FaultSpec::new(Fault::Swallow, Direction::Downstream);
        let held = s.start("mqtt", 1, swallow).specs();
        assert_eq!(held, (Some(swallow), vec![delay(300)]));
        assert_eq!(s.end("mqtt", Some(1)).specs(), (None, vec![delay(300)]));
        assert!(s.end("mqtt", Some(0)).is_empty());
    }

    #[test]
    fn conditions_stack_and_end_one_by_one() {
        let mut s = Stacks::default();
        let rate = FaultSpec::throttle(Direction::Upstream, 50_000);
        s.start("mqtt", 0, delay(100));
        s.start("mqtt", 1, rate);
        assert_eq!(
            s.held("mqtt").describe(),
            "delay 100ms both, throttle 50000 B/s upstream"
        );
        assert_eq!(s.end("mqtt", Some(0)).specs(), (None, vec![rate]));
        assert_eq!(s.held("nats"), Held::default());
    }

    #[test]
    fn a_later_cut_takes_the_place_of_the_earlier_whose_end_then_changes_nothing() {
        let mut s = Stacks::default();
        let refuse = FaultSpec::new(Fault::Refuse, Direction::Both);
        let hang = FaultSpec::new(Fault::Hang, Direction::Upstream);
        s.start("mqtt", 0, refuse);
        s.start("mqtt", 1, hang);
        assert_eq!(s.end("mqtt", Some(0)).specs(), (Some(hang), vec![]));
        s.start("mqtt", 2, delay(5));
        assert!(s.end("mqtt", None).is_empty());
    }
}
