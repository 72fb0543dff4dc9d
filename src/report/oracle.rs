//! The oracle's pure parts (DESIGN.md §5), apart from brokers and files so that each cell of
//! the promise table is unit-tested: what a declared promise allows ([`allowance`]), whether
//! each fault met the traffic it was meant to disturb ([`unbitten`]), and whether records
//! reached the destination around the proxy ([`bypassed`]).
//!
//! It never reads a clock or a socket: every input is what the runner recorded.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::FaultRecord;
use crate::scenario::Promise;
use crate::verify::{Received, Reconciliation};
use crate::workload::{Ingested, Sent};

/// What the declared promise excuses in one drill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowance {
    /// Extra copies within the promise.
    pub duplicates: u64,
    /// Missing records within the promise (`at_most_once` only).
    pub missing: u64,
}

/// Which records may be excused, by harness id.
#[derive(Debug, Clone, Default)]
pub struct Excuses<'a> {
    /// Writes that had an attempt end `possibly_sent` or `sent_unconfirmed` (for a user's
    /// engine, whose attempts drill cannot see: records accepted before a link or broker fault
    /// ended).
    pub possibly_sent: HashSet<&'a str>,
    /// Records accepted before an engine crash (kill or stop).
    pub crashed: HashSet<&'a str>,
}

/// DESIGN.md §5's table:
///
/// | promise | missing allowed | duplicates allowed |
/// |---|---|---|
/// | at_most_once | only writes with a possibly-sent attempt | never |
/// | at_least_once | never | only after a possibly-sent attempt or a crash, and only with the original's write key |
/// | effectively_once | never | never |
pub fn allowance(
    promise: Promise,
    sent: &Sent,
    received: &Received,
    excuses: &Excuses<'_>,
) -> Allowance {
    match promise {
        Promise::EffectivelyOnce => Allowance::default(),
        Promise::AtLeastOnce => {
            let excused: HashSet<&str> = excuses
                .possibly_sent
                .union(&excuses.crashed)
                .copied()
                .collect();
            Allowance {
                duplicates: super::allowed_duplicates(sent, received, &excused),
                missing: 0,
            }
        }
        Promise::AtMostOnce => {
            let arrived: HashSet<&str> = received
                .arrivals
                .iter()
                .filter_map(|a| a.id.as_deref())
                .collect();
            let missing = sent
                .accepted()
                .filter(|(r, _, _)| {
                    !arrived.contains(r.id.as_str())
                        && excuses.possibly_sent.contains(r.id.as_str())
                })
                .count() as u64;
            Allowance {
                duplicates: 0,
                missing,
            }
        }
    }
}

/// When each accepted record was accepted and first arrived (if it did).
fn timings(sent: &Sent, received: &Received) -> Vec<(Duration, Option<Duration>)> {
    let mut first: HashMap<&str, Duration> = HashMap::new();
    for a in &received.arrivals {
        if let Some(id) = a.id.as_deref() {
            first.entry(id).or_insert(a.at);
        }
    }
    sent.order
        .iter()
        .filter_map(|(r, i)| match i {
            Ingested::Accepted { at, .. } => Some((*at, first.get(r.id.as_str()).copied())),
            _ => None,
        })
        .collect()
}

/// Faults that met no traffic: nothing was accepted while they were in force, and nothing
/// accepted before them was still undelivered when they began. Each is a reason the drill
/// proved nothing about that fault ("the fault at 10 s met no traffic").
pub fn unbitten(
    faults: &[FaultRecord],
    sent: &Sent,
    received: &Received,
    end_ms: u64,
) -> Vec<String> {
    let records = timings(sent, received);
    faults
        .iter()
        .filter(|f| {
            if let Some(bit) = f.bit {
                return !bit;
            }
            let from = Duration::from_millis(f.at_ms);
            let until = Duration::from_millis(f.until_ms.unwrap_or(end_ms).max(f.at_ms));
            // A full disk bites the records it turned away, too.
            let refused = f.target == "engine disk"
                && sent.order.iter().any(|(_, i)| {
                    matches!(i, Ingested::NotAccepted { at, .. } if *at >= from && *at <= until)
                });
            let during = refused || records.iter().any(|(at, _)| *at >= from && *at <= until);
            let held = records
                .iter()
                .any(|(at, first)| *at <= from && first.is_none_or(|d| d > from));
            !(during || held)
        })
        .map(|f| {
            format!(
                "the fault at {:.1} s ({} {}) met no traffic: nothing was accepted while it was in force and nothing was waiting when it began",
                f.at_ms as f64 / 1000.0,
                f.target,
                f.fault
            )
        })
        .collect()
}

/// How long after a fault begins, and before it ends, a delivery is not held against it: bytes
/// already past the proxy, clocks a little apart.
const BYPASS_GRACE: Duration = Duration::from_millis(500);

/// Records first delivered while the destination's only link was refused, swallowed upstream
/// or hung: the engine reached the broker around the proxy. Judged only where the read-back's
/// timestamps are the destination's (not Kafka's producer timestamps) and there is one link.
pub fn bypassed(faults: &[FaultRecord], received: &Received, end_ms: u64) -> Vec<String> {
    let mut seen = HashSet::new();
    let firsts: Vec<Duration> = received
        .arrivals
        .iter()
        .filter(|a| a.id.as_deref().is_some_and(|id| seen.insert(id)))
        .map(|a| a.at)
        .collect();
    faults
        .iter()
        .filter(|f| f.target.starts_with("link"))
        .filter(|f| {
            let upstream = f
                .direction
                .as_deref()
                .is_none_or(|d| d == "both" || d == "upstream");
            f.fault == "refuse" || (upstream && (f.fault == "swallow" || f.fault == "hang"))
        })
        .filter_map(|f| {
            let from = Duration::from_millis(f.at_ms) + BYPASS_GRACE;
            let until = Duration::from_millis(f.until_ms.unwrap_or(end_ms))
                .saturating_sub(BYPASS_GRACE);
            let n = firsts.iter().filter(|t| **t > from && **t < until).count();
            (n > 0).then(|| {
                format!(
                    "the engine's traffic bypassed {}: {n} records arrived while it was {} ({:.1}–{:.1} s)",
                    f.target,
                    f.fault,
                    f.at_ms as f64 / 1000.0,
                    f.until_ms.unwrap_or(end_ms) as f64 / 1000.0
                )
            })
        })
        .collect()
}

/// The counts the verdict reads, with what the promise allows taken off.
pub fn beyond(r: &Reconciliation, allowance: Allowance, lost: u64) -> (u64, u64) {
    (
        lost.saturating_sub(allowance.missing),
        r.duplicates.saturating_sub(allowance.duplicates),
    )
}

#[cfg(test)]
mod tests {
    //! DESIGN.md §5's table, cell by cell: for each declared promise and each situation, the
    //! verdict `judge` gives under the default expectations (lost 0, duplicates beyond the
    //! promise 0, reordered 0, unexpected 0).

    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::proxy::LinkStatus;
    use crate::report::{Facts, judge};
    use crate::verify::{Arrival, reconcile};
    use crate::workload::Record;

    fn record(seq: u64) -> Record {
        Record {
            id: format!("r/k0/{seq}"),
            key: "k0".to_string(),
            seq,
            index: seq,
            pad: String::new(),
        }
    }

    fn arrival(seq: u64, key: Option<&str>) -> Arrival {
        Arrival {
            id: Some(format!("r/k0/{seq}")),
            write_key: key.map(str::to_string),
            at: Duration::from_millis(seq * 10),
        }
    }

    /// The situations of the table. Records 0..4 are accepted with write keys w0..w3.
    #[derive(Debug, Clone, Copy)]
    enum Case {
        Clean,
        MissingPlain,
        MissingPossiblySent,
        DuplicateSameKeyPossiblySent,
        DuplicateSameKeyCrash,
        DuplicateSameKeyNeither,
        DuplicateOtherKeyPossiblySent,
        DuplicateNoKeyCrash,
        Reordered,
        Unexpected,
        IngestUnknownFound,
        IngestUnknownNotFound,
        VerifierFault,
    }

    /// (`at_most_once`, `at_least_once`, `effectively_once`): pass?
    fn expected(case: Case) -> (bool, bool, bool) {
        use Case::*;
        match case {
            Clean | IngestUnknownFound | IngestUnknownNotFound => (true, true, true),
            MissingPlain => (false, false, false),
            MissingPossiblySent => (true, false, false),
            DuplicateSameKeyPossiblySent | DuplicateSameKeyCrash => (false, true, false),
            DuplicateSameKeyNeither | DuplicateOtherKeyPossiblySent | DuplicateNoKeyCrash => {
                (false, false, false)
            }
            Reordered | Unexpected | VerifierFault => (false, false, false),
        }
    }

    fn plan(promise: &str) -> crate::scenario::Plan {
        let text = format!(
            "name: oracle\ndestination: {{ kind: mqtt }}\nsystem: {{ builtin: {{ promise: {promise} }} }}\nworkload: {{ rate: 10/s, duration: 1s }}\nexpect: {{ lost: 0, duplicates: 0, reordered: 0 }}\n"
        );
        crate::scenario::parse(Path::new("oracle.yaml"), &text).expect("a valid plan")
    }

    fn verdict(promise: Promise, name: &str, case: Case) -> bool {
        let mut sent = Sent {
            order: (0..4)
                .map(|i| {
                    (
                        record(i),
                        Ingested::Accepted {
                            write_key: Some(format!("w{i}")),
                            at: Duration::ZERO,
                        },
                    )
                })
                .collect(),
        };
        let mut arrivals: Vec<Arrival> =
            (0..4).map(|i| arrival(i, Some(&format!("w{i}")))).collect();
        let mut excuses = Excuses::default();
        let mut verifier_fault = false;
        match case {
            Case::Clean => {}
            Case::MissingPlain => {
                arrivals.remove(3);
            }
            Case::MissingPossiblySent => {
                arrivals.remove(3);
                excuses.possibly_sent.insert("r/k0/3");
            }
            Case::DuplicateSameKeyPossiblySent => {
                arrivals.push(arrival(2, Some("w2")));
                excuses.possibly_sent.insert("r/k0/2");
            }
            Case::DuplicateSameKeyCrash => {
                arrivals.push(arrival(2, Some("w2")));
                excuses.crashed.insert("r/k0/2");
            }
            Case::DuplicateSameKeyNeither => arrivals.push(arrival(2, Some("w2"))),
            Case::DuplicateOtherKeyPossiblySent => {
                arrivals.push(arrival(2, Some("other")));
                excuses.possibly_sent.insert("r/k0/2");
            }
            Case::DuplicateNoKeyCrash => {
                arrivals.push(arrival(2, None));
                excuses.crashed.insert("r/k0/2");
            }
            Case::Reordered => arrivals.swap(1, 2),
            Case::Unexpected => arrivals.push(Arrival {
                id: None,
                write_key: None,
                at: Duration::ZERO,
            }),
            Case::IngestUnknownFound | Case::IngestUnknownNotFound => {
                sent.order
                    .push((record(4), Ingested::Unknown { at: Duration::ZERO }));
                if matches!(case, Case::IngestUnknownFound) {
                    arrivals.push(arrival(4, Some("w4")));
                }
            }
            Case::VerifierFault => verifier_fault = true,
        }
        let received = Received {
            arrivals,
            ..Received::default()
        };
        let excuses_view = Excuses {
            possibly_sent: excuses.possibly_sent.clone(),
            crashed: excuses.crashed.clone(),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        let facts = Facts {
            plan: plan(name),
            seed: 1,
            runtime: "process".to_string(),
            reconciliation: reconcile(&sent, &received),
            allowance: allowance(promise, &sent, &received, &excuses_view),
            inconclusive: Vec::new(),
            drain_ms: 0,
            engine: None,
            gives_account: false,
            system: "test".to_string(),
            unexpected_examples: Vec::new(),
            series: Vec::new(),
            faults: Vec::new(),
            recovery: Vec::new(),
            link: LinkStatus {
                name: "mqtt".to_string(),
                listen: addr,
                upstream: addr,
                fault: "pass".to_string(),
                direction: None,
                latency_ms: None,
                jitter_ms: None,
                bytes_per_s: None,
                since_ms: 0,
                connections_accepted: 0,
                connections_reset: 0,
                connections_open: 0,
                bytes_upstream: 0,
                bytes_downstream: 0,
                bytes_swallowed_upstream: 0,
                bytes_swallowed_downstream: 0,
                broker_links: Vec::new(),
                answers_rewritten: 0,
                connections_stranded: 0,
            },
            versions: BTreeMap::new(),
            notes: Vec::new(),
            verifier_fault,
            duration_ms: 1000,
        };
        judge(&facts).verdict.is_pass()
    }

    #[test]
    fn every_cell_of_the_promise_table() {
        use Case::*;
        let cases = [
            Clean,
            MissingPlain,
            MissingPossiblySent,
            DuplicateSameKeyPossiblySent,
            DuplicateSameKeyCrash,
            DuplicateSameKeyNeither,
            DuplicateOtherKeyPossiblySent,
            DuplicateNoKeyCrash,
            Reordered,
            Unexpected,
            IngestUnknownFound,
            IngestUnknownNotFound,
            VerifierFault,
        ];
        let mut cells = 0;
        let mut wrong = Vec::new();
        for case in cases {
            let (most, least, exactly) = expected(case);
            for (promise, name, want) in [
                (Promise::AtMostOnce, "at_most_once", most),
                (Promise::AtLeastOnce, "at_least_once", least),
                (Promise::EffectivelyOnce, "effectively_once", exactly),
            ] {
                cells += 1;
                let got = verdict(promise, name, case);
                if got != want {
                    wrong.push(format!(
                        "{case:?} × {name}: expected pass={want}, got pass={got}"
                    ));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "{} of {cells} cells wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        assert_eq!(cells, 39);
    }

    fn fault(at_ms: u64, until_ms: u64, fault: &str, direction: &str) -> FaultRecord {
        FaultRecord {
            index: 0,
            at_ms,
            target: "link mqtt".to_string(),
            fault: fault.to_string(),
            direction: Some(direction.to_string()),
            until_ms: Some(until_ms),
            bit: None,
        }
    }

    fn accepted_at(ms: &[u64]) -> Sent {
        Sent {
            order: ms
                .iter()
                .enumerate()
                .map(|(i, &at)| {
                    (
                        record(i as u64),
                        Ingested::Accepted {
                            write_key: None,
                            at: Duration::from_millis(at),
                        },
                    )
                })
                .collect(),
        }
    }

    fn arrived_at(ms: &[u64]) -> Received {
        Received {
            arrivals: ms
                .iter()
                .enumerate()
                .map(|(i, &at)| Arrival {
                    id: Some(format!("r/k0/{i}")),
                    write_key: None,
                    at: Duration::from_millis(at),
                })
                .collect(),
            ..Received::default()
        }
    }

    #[test]
    fn a_fault_after_the_traffic_met_nothing_and_one_during_it_did() {
        let sent = accepted_at(&[0, 1000, 2000]);
        let received = arrived_at(&[10, 1010, 2010]);
        let late = fault(10_000, 12_000, "swallow", "both");
        let why = unbitten(&[late], &sent, &received, 15_000);
        assert_eq!(why.len(), 1);
        assert!(why[0].starts_with("the fault at 10.0 s"), "{}", why[0]);
        let during = fault(500, 1500, "swallow", "both");
        assert!(unbitten(&[during], &sent, &received, 15_000).is_empty());
        // Nothing accepted during it, but a record accepted before it was still on its way.
        let held = fault(2005, 2500, "refuse", "both");
        let late_arrival = arrived_at(&[10, 1010, 3000]);
        assert!(unbitten(&[held], &sent, &late_arrival, 15_000).is_empty());
    }

    #[test]
    fn deliveries_during_a_refused_or_swallowed_upstream_link_are_a_bypass() {
        let received = arrived_at(&[100, 5000, 9000]);
        let refused = fault(2000, 8000, "refuse", "both");
        let why = bypassed(&[refused], &received, 10_000);
        assert_eq!(why.len(), 1);
        assert!(
            why[0].contains("bypassed link mqtt: 1 records"),
            "{}",
            why[0]
        );
        // Swallowing answers only (downstream) lets records through: no bypass.
        let downstream = fault(2000, 8000, "swallow", "downstream");
        assert!(bypassed(&[downstream], &received, 10_000).is_empty());
        // Right at the edges (bytes already past the proxy): not held against the engine.
        let edge = arrived_at(&[2100, 7900]);
        assert!(bypassed(&[fault(2000, 8000, "refuse", "both")], &edge, 10_000).is_empty());
    }
}
