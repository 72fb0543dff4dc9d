//! How delivery came back: for each fault that ended, from the first fault-free instant to the
//! first delivery and to the whole backlog delivered ([`recovery`]); and the chart's points,
//! one a second ([`series`]). Pure: every input is what the runner recorded.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{RecoveryRecord, SeriesPoint};
use crate::runner::Sample;
use crate::runner::events::{FaultRecord, FaultTarget};
use crate::verify::{Arrival, Received};
use crate::workload::Sent;

/// For each fault that ended: from the first fault-free instant after its heal to the first
/// delivery (after a strand, of a record accepted from the strand on), and to every record
/// accepted before then having arrived.
pub fn recovery(faults: &[FaultRecord], sent: &Sent, received: &Received) -> Vec<RecoveryRecord> {
    let first_arrival = first_arrivals(received);
    let accepted_at: HashMap<&str, Duration> = sent
        .accepted()
        .map(|(r, _, at)| (r.id.as_str(), at))
        .collect();
    faults
        .iter()
        .filter(|f| f.no_target.is_none())
        // A clock jump interrupts nothing: there is nothing to recover from.
        .filter(|f| f.target != FaultTarget::EngineClock)
        .filter_map(|f| {
            f.until_ms
                .and_then(|t| fault_free_from(faults, t))
                .map(|heal| (f, heal))
        })
        .map(|(f, heal)| {
            let heal_d = Duration::from_millis(heal);
            // A strand is an instant: a record already past the link when it fell arrives a
            // few ms later, which says nothing about the engine noticing. Only records the
            // engine accepted from that instant on show delivery coming back — and, since a
            // record's acceptance is timed when the ingest's answer returns (the engine may
            // have published it just before the strand and answered just after), only their
            // arrivals from `IN_FLIGHT` after it: nothing crosses a stranded link, so what
            // arrives sooner was on its way before.
            let strand = f.until_ms == Some(f.at_ms);
            let met = |a: &Arrival| {
                !strand
                    || (a.at >= Duration::from_millis(f.at_ms) + IN_FLIGHT
                        && a.id
                            .as_deref()
                            .and_then(|id| accepted_at.get(id))
                            .is_some_and(|at| *at >= Duration::from_millis(f.at_ms)))
            };
            let first = received
                .arrivals
                .iter()
                .filter(|a| a.at >= heal_d && met(a))
                .map(|a| a.at)
                .min();
            RecoveryRecord {
                fault: f.label(),
                heal_ms: heal,
                first_delivery_ms: first.map(|d| d.as_millis() as u64),
                drained_ms: drained(sent, &first_arrival, heal_d).map(|d| d.as_millis() as u64),
            }
        })
        .collect()
}

/// How long bytes already past a link may take to reach the destination and its reader (on
/// this machine's loopback, under load): arrivals this soon after a strand were in flight.
const IN_FLIGHT: Duration = Duration::from_millis(250);

/// The first instant from `t` on when no fault is in force: a heal while another fault still
/// holds (an engine restarted during a cut) counts from the end of that fault. `None`: a fault
/// in force then never ended.
fn fault_free_from(faults: &[FaultRecord], mut t: u64) -> Option<u64> {
    loop {
        let mut moved = false;
        for f in faults {
            if f.at_ms <= t && f.until_ms.is_none_or(|u| u > t) {
                t = f.until_ms?;
                moved = true;
            }
        }
        if !moved {
            return Some(t);
        }
    }
}

/// When the last record accepted by `heal` first arrived (at least `heal`); `None` if one never
/// did.
fn drained(sent: &Sent, first: &HashMap<&str, Duration>, heal: Duration) -> Option<Duration> {
    let mut drained = heal;
    for (r, _, at) in sent.accepted() {
        if at > heal {
            continue;
        }
        drained = drained.max(*first.get(r.id.as_str())?);
    }
    Some(drained)
}

/// Each harness id's first arrival.
pub(super) fn first_arrivals(received: &Received) -> HashMap<&str, Duration> {
    let mut first: HashMap<&str, Duration> = HashMap::new();
    for a in &received.arrivals {
        if let Some(id) = a.id.as_deref() {
            first.entry(id).or_insert(a.at);
        }
    }
    first
}

/// The chart's points: each sample, with the first copies that arrived in its second.
pub fn series(samples: &[Sample], received: &Received) -> Vec<SeriesPoint> {
    let mut per_second: BTreeMap<u64, u64> = BTreeMap::new();
    for at in first_arrivals(received).values() {
        *per_second.entry(at.as_millis() as u64 / 1000).or_default() += 1;
    }
    samples
        .iter()
        .map(|s| SeriesPoint {
            at_ms: s.at_ms,
            accepted: s.accepted,
            delivered: per_second.get(&(s.at_ms / 1000)).copied().unwrap_or(0),
            waiting: s.waiting,
            unread: s.unread,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Direction, Fault, FaultSpec};
    use crate::runner::events::FaultKind;
    use crate::workload::{Ingested, Record};

    fn sent(accepted_ms: &[u64]) -> Sent {
        Sent {
            destroyed: Default::default(),
            order: accepted_ms
                .iter()
                .enumerate()
                .map(|(i, &at)| {
                    let r = Record {
                        id: format!("r/k0/{i}"),
                        key: "k0".into(),
                        seq: i as u64,
                        index: i as u64,
                        pad: String::new(),
                    };
                    let at = Duration::from_millis(at);
                    (
                        r,
                        Ingested::Accepted {
                            write_key: None,
                            at,
                        },
                    )
                })
                .collect(),
        }
    }

    fn received(arrived_ms: &[u64]) -> Received {
        Received {
            arrivals: arrived_ms
                .iter()
                .enumerate()
                .map(|(i, &at)| Arrival {
                    id: Some(format!("r/k0/{i}")),
                    write_key: None,
                    at: Duration::from_millis(at),
                    pad: None,
                })
                .collect(),
            ..Received::default()
        }
    }

    fn fault(target: FaultTarget, kind: FaultKind, at_ms: u64, until: Option<u64>) -> FaultRecord {
        FaultRecord {
            index: 0,
            at_ms,
            target,
            kind,
            wiped: false,
            until_ms: until,
            bit: None,
            no_target: None,
        }
    }

    #[test]
    fn recovery_counts_from_the_first_fault_free_instant() {
        let cut = fault(
            FaultTarget::Link("mqtt".into()),
            FaultKind::Link(FaultSpec::new(Fault::Refuse, Direction::Both)),
            1000,
            Some(5000),
        );
        // The engine is down from 4 s to 6 s: the link's heal at 5 s counts from 6 s.
        let kill = fault(FaultTarget::Engine, FaultKind::Kill, 4000, Some(6000));
        let s = sent(&[500, 2000, 3000]);
        let r = received(&[600, 6200, 6900]);
        let rec = recovery(&[cut, kill], &s, &r);
        assert_eq!(rec.len(), 2);
        assert_eq!(rec[0].fault, "link mqtt refuse both");
        assert_eq!(rec[0].heal_ms, 6000);
        assert_eq!(rec[0].first_delivery_ms, Some(6200));
        assert_eq!(rec[0].drained_ms, Some(6900));
        assert_eq!(rec[1].fault, "engine kill (SIGKILL)");
        // A record that never arrived: not drained.
        let r = received(&[600, 6200]);
        let cut_only = fault(
            FaultTarget::Link("mqtt".into()),
            FaultKind::Link(FaultSpec::new(Fault::Refuse, Direction::Both)),
            1000,
            Some(5000),
        );
        assert_eq!(recovery(&[cut_only], &s, &r)[0].drained_ms, None);
    }

    #[test]
    fn after_a_strand_only_records_sent_into_it_show_recovery() {
        // Stranded at 3 s: the record accepted at 2.99 s was past the link and arrives at
        // 3.003 s; the one accepted at 3.1 s went into the dead connection and arrives only
        // after the keepalive noticed, at 9 s.
        let strand = fault(
            FaultTarget::Link("mqtt".into()),
            FaultKind::Link(FaultSpec::new(Fault::Strand, Direction::Both)),
            3000,
            Some(3000),
        );
        let s = sent(&[2990, 3100]);
        let r = received(&[3003, 9000]);
        let rec = recovery(std::slice::from_ref(&strand), &s, &r);
        assert_eq!(rec[0].first_delivery_ms, Some(9000));
        // Answered at 3.004 s but published before the strand (it arrives at 3.006 s): in
        // flight, not a recovery (as in CI, where it read 0 ms for a 6 s keepalive).
        let s = sent(&[2990, 3004, 3100]);
        let r = received(&[3003, 3006, 9000]);
        let rec = recovery(&[strand], &s, &r);
        assert_eq!(rec[0].first_delivery_ms, Some(9000));
    }

    #[test]
    fn series_counts_first_copies_per_second() {
        let samples = [
            Sample {
                at_ms: 0,
                accepted: 1,
                waiting: Some(1),
                unread: None,
            },
            Sample {
                at_ms: 1000,
                accepted: 3,
                waiting: None,
                unread: None,
            },
        ];
        let mut r = received(&[100, 1100, 1900]);
        r.arrivals.push(r.arrivals[1].clone());
        let points = series(&samples, &r);
        assert_eq!(points[0].delivered, 1);
        assert_eq!(points[1].delivered, 2);
        assert_eq!(points[1].waiting, None);
    }
}
