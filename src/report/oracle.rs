//! The oracle's pure parts (docs/src/design.md#5-verdict), apart from brokers and files so that
//! each cell of the promise table is unit-tested: which records a promise may excuse
//! ([`excuses`]), what a declared promise allows ([`allowance`]), whether each fault met the
//! traffic it was meant to disturb ([`unbitten`]), and whether records reached the destination
//! around the proxy ([`bypassed`]).
//!
//! It never reads a clock or a socket: every input is what the runner recorded.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::promise::Promise;
use crate::runner::Tapped;
use crate::runner::events::{FaultRecord, FaultTarget};
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

/// The promise table of docs/src/design.md#5-verdict:
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
                duplicates: allowed_duplicates(sent, received, &excused),
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

/// Extra copies the declared promise allows: same write key as the original (the one the
/// ingest answered, else the first copy's), and the record is in `excused` — its write had a
/// `possibly_sent` attempt, or it was accepted before an engine crash (ids).
pub fn allowed_duplicates(sent: &Sent, received: &Received, excused: &HashSet<&str>) -> u64 {
    let keys: HashMap<&str, Option<&str>> = sent
        .accepted()
        .map(|(r, k, _)| (r.id.as_str(), k))
        .collect();
    let mut first: HashMap<&str, Option<&str>> = HashMap::new();
    let mut allowed = 0;
    for a in &received.arrivals {
        let Some(id) = a.id.as_deref() else { continue };
        let Some(&key) = keys.get(id) else { continue };
        match first.get(id) {
            None => {
                first.insert(id, key.or(a.write_key.as_deref()));
            }
            Some(original) => {
                let same = original.is_some() && a.write_key.as_deref() == *original;
                if same && excused.contains(id) {
                    allowed += 1;
                }
            }
        }
    }
    allowed
}

/// Records the promise may excuse (ids): writes with a `possibly_sent` attempt (from the
/// built-in engine's journal, `possibly_sent`; for a user's engine, whose attempts drill cannot
/// see, records accepted before the end of a link or broker fault stand in), and records
/// accepted before an engine crash.
pub fn excuses<'a>(
    sent: &'a Sent,
    received: &Received,
    possibly_sent: Option<&HashSet<String>>,
    crashes: Crashes<'_>,
    faults: &[FaultRecord],
) -> Excuses<'a> {
    let last_fault_end = match possibly_sent {
        Some(_) => None,
        None => faults
            .iter()
            .filter(|f| f.target.is_destination_side())
            .map(|f| Duration::from_millis(f.until_ms.unwrap_or(u64::MAX)))
            .max(),
    };
    let mut first: HashMap<&str, Duration> = HashMap::new();
    for a in &received.arrivals {
        if let Some(id) = a.id.as_deref() {
            first.entry(id).or_insert(a.at);
        }
    }
    let mut e = Excuses::default();
    for (r, key, at) in sent.accepted() {
        if last_fault_end.is_some_and(|end| at <= end)
            || possibly_sent
                .zip(key)
                .is_some_and(|(keys, k)| keys.contains(k))
        {
            e.possibly_sent.insert(r.id.as_str());
        }
        let arrived = first.get(r.id.as_str()).copied();
        if crashes.excuse(at, arrived) {
            e.crashed.insert(r.id.as_str());
        }
    }
    e
}

/// How long before a SIGKILL or SIGTERM the destination's confirmation of a record must have
/// come for the engine to be expected to have noted it: a record first delivered earlier than
/// this before a kill, sent again after it, is a duplicate the crash does not excuse (an
/// engine that forgets its delivery marks on restart). A power cut excuses every record
/// accepted before it: unsynced marks are lost with it.
const NOTED_WITHIN: Duration = Duration::from_secs(5);

/// The drill's engine crashes (kill, stop, power cut), and which were power cuts.
#[derive(Clone, Copy)]
pub struct Crashes<'a> {
    pub all: &'a [Duration],
    pub power_cuts: &'a [Duration],
}

impl Crashes<'_> {
    /// Whether a crash excuses a second copy of a record accepted at `at` and first delivered
    /// at `arrived`: it was accepted before the crash, and the crash could have left its
    /// delivery unnoted.
    fn excuse(&self, at: Duration, arrived: Option<Duration>) -> bool {
        self.all.iter().any(|c| {
            at <= *c
                && (self.power_cuts.contains(c) || arrived.is_none_or(|d| d + NOTED_WITHIN > *c))
        })
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

/// Faults that proved nothing: one that found no target (a broker fault with no such node, no
/// leader), and one that met no traffic — nothing was accepted while it was in force, and
/// nothing accepted before it was still undelivered when it began. Each is a reason the drill
/// is inconclusive ("the fault at 10 s met no traffic"). A flapping fault (one `faults:` entry
/// carried out several times; `entry_of` maps a record's index to its entry) is judged as one:
/// it proved something when any of its outages met traffic — one outage that fell into a
/// stall of the workload's intake does not unmake the others.
pub fn unbitten(
    faults: &[FaultRecord],
    sent: &Sent,
    received: &Received,
    end_ms: u64,
    entry_of: impl Fn(usize) -> usize,
) -> Vec<String> {
    let records = timings(sent, received);
    let met_none = |f: &FaultRecord| {
        if let Some(bit) = f.bit {
            return !bit;
        }
        let from = Duration::from_millis(f.at_ms);
        let until = Duration::from_millis(f.until_ms.unwrap_or(end_ms).max(f.at_ms));
        // A full disk bites the records it turned away, too.
        let refused = f.target == FaultTarget::EngineDisk
            && sent.order.iter().any(|(_, i)| {
                matches!(i, Ingested::NotAccepted { at, .. } if *at >= from && *at <= until)
            });
        let during = refused || records.iter().any(|(at, _)| *at >= from && *at <= until);
        let held = records
            .iter()
            .any(|(at, first)| *at <= from && first.is_none_or(|d| d > from));
        !(during || held)
    };
    let carried_out: Vec<&FaultRecord> = faults.iter().filter(|f| f.no_target.is_none()).collect();
    let bitten_entries: HashSet<usize> = carried_out
        .iter()
        .filter(|f| !met_none(f))
        .map(|f| entry_of(f.index))
        .collect();
    let mut named = HashSet::new();
    let unbitten = carried_out
        .into_iter()
        .filter(|f| !bitten_entries.contains(&entry_of(f.index)))
        .filter(|f| named.insert(entry_of(f.index)))
        .map(|f| {
            format!(
                "the fault at {:.1} s ({} {}) met no traffic: nothing was accepted while it was in force and nothing was waiting when it began",
                f.at_ms as f64 / 1000.0,
                f.target,
                f.what()
            )
        });
    let no_target = faults.iter().filter_map(|f| {
        let why = f.no_target.as_ref()?;
        Some(format!(
            "the fault at {:.1} s ({} {}) found no target: {why}",
            f.at_ms as f64 / 1000.0,
            f.target,
            f.what()
        ))
    });
    no_target.chain(unbitten).collect()
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
        .filter(|f| f.target.is_network() && f.kind.stops_upstream())
        .filter_map(|f| {
            let from = Duration::from_millis(f.at_ms) + BYPASS_GRACE;
            let until = Duration::from_millis(f.until_ms.unwrap_or(end_ms))
                .saturating_sub(BYPASS_GRACE);
            let n = firsts.iter().filter(|t| **t > from && **t < until).count();
            (n > 0).then(|| {
                format!(
                    "the engine's traffic bypassed {}: {n} records arrived while it was {} ({:.1}–{:.1} s)",
                    f.target,
                    f.what(),
                    f.at_ms as f64 / 1000.0,
                    f.until_ms.unwrap_or(end_ms) as f64 / 1000.0
                )
            })
        })
        .collect()
}

/// Records that reached the destination without crossing any link, as the links' tap saw it
/// (judged only when the tap read every data frame it saw): the engine went around the proxy.
/// Unlike [`bypassed`], this needs no arrival times, so it holds for every kind (Kafka too).
pub fn went_around(tapped: &Tapped, received: &Received) -> Option<String> {
    if !tapped.reads_everything() {
        return None;
    }
    let mut seen = HashSet::new();
    let around: Vec<&str> = received
        .arrivals
        .iter()
        .filter_map(|a| a.id.as_deref())
        .filter(|id| seen.insert(*id) && !tapped.sent.contains_key(*id))
        .collect();
    let first = around.first()?;
    Some(format!(
        "{} records reached the destination without crossing the link (the first: {first}): the engine's traffic bypassed the proxy",
        around.len()
    ))
}

/// Link faults that keep the engine's bytes from the broker (refuse, swallow or hang
/// upstream) through which the tap saw records go to the broker anyway, past the fault's first
/// and last half second: a cut that did not hold proves nothing about it.
pub fn leaked(faults: &[FaultRecord], tapped: &Tapped, end_ms: u64) -> Vec<String> {
    let grace = BYPASS_GRACE.as_millis() as u64;
    faults
        .iter()
        .filter(|f| f.target.is_network() && f.kind.stops_upstream())
        .filter(|f| {
            tapped
                .link
                .as_ref()
                .is_some_and(|l| f.target == crate::runner::events::FaultTarget::Link(l.clone()))
        })
        .filter_map(|f| {
            let until = f.until_ms.unwrap_or(end_ms);
            let (from, to) = (f.at_ms + grace, until.saturating_sub(grace));
            let n = tapped
                .sent
                .values()
                .filter(|at| **at > from && **at < to)
                .count();
            (n > 0).then(|| {
                format!(
                    "{} carried {n} records to the broker while it was {} ({:.1}–{:.1} s): the fault did not hold",
                    f.target,
                    f.what(),
                    f.at_ms as f64 / 1000.0,
                    until as f64 / 1000.0
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
    //! The promise table of docs/src/design.md#5-verdict, cell by cell: for each declared promise
    //! and each situation, the verdict `judge` gives under the default expectations (lost 0,
    //! duplicates beyond the promise 0, reordered 0, unexpected 0).

    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::proxy::{Direction, Fault, FaultSpec};
    use crate::report::judge;
    use crate::runner::events::FaultKind;
    use crate::verify::Arrival;
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
            pad: None,
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

    fn verdict(name: &str, case: Case) -> bool {
        let mut sent = Sent {
            destroyed: Default::default(),
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
                pad: None,
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
            verifier_fault: verifier_fault.then(|| "the reader lost its connection".to_string()),
            ..Received::default()
        };
        let mut facts = crate::report::verdict::tests::facts(plan(name), sent, received);
        // The excuses this case names, as the engine's journal or its crashes would give them.
        facts.possibly_sent_keys = Some(
            excuses
                .possibly_sent
                .iter()
                .map(|id| format!("w{}", id.rsplit('/').next().unwrap_or("")))
                .collect(),
        );
        if !excuses.crashed.is_empty() {
            // A crash at the end excuses every record accepted before it that never arrived
            // earlier than 5 s before it.
            facts.crashes = vec![Duration::from_secs(3600)];
            facts.power_cuts = vec![Duration::from_secs(3600)];
        }
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
            for (name, want) in [
                ("at_most_once", most),
                ("at_least_once", least),
                ("effectively_once", exactly),
            ] {
                cells += 1;
                let got = verdict(name, case);
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

    fn fault(at_ms: u64, until_ms: u64, fault: Fault, direction: Direction) -> FaultRecord {
        FaultRecord {
            index: 0,
            at_ms,
            target: FaultTarget::Link("mqtt".to_string()),
            kind: FaultKind::Link(FaultSpec::new(fault, direction)),
            wiped: false,
            until_ms: Some(until_ms),
            bit: None,
            no_target: None,
        }
    }

    fn accepted_at(ms: &[u64]) -> Sent {
        Sent {
            destroyed: Default::default(),
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
                    pad: None,
                })
                .collect(),
            ..Received::default()
        }
    }

    #[test]
    fn a_fault_after_the_traffic_met_nothing_and_one_during_it_did() {
        let sent = accepted_at(&[0, 1000, 2000]);
        let received = arrived_at(&[10, 1010, 2010]);
        let late = fault(10_000, 12_000, Fault::Swallow, Direction::Both);
        let why = unbitten(&[late], &sent, &received, 15_000, |i| i);
        assert_eq!(why.len(), 1);
        assert!(why[0].starts_with("the fault at 10.0 s"), "{}", why[0]);
        let during = fault(500, 1500, Fault::Swallow, Direction::Both);
        assert!(unbitten(&[during], &sent, &received, 15_000, |i| i).is_empty());
        // Nothing accepted during it, but a record accepted before it was still on its way.
        let held = fault(2005, 2500, Fault::Refuse, Direction::Both);
        let late_arrival = arrived_at(&[10, 1010, 3000]);
        assert!(unbitten(&[held], &sent, &late_arrival, 15_000, |i| i).is_empty());
    }

    #[test]
    fn a_flapping_fault_is_judged_as_one_entry() {
        // Three outages of one entry (0, 1, 2) and a lone fault (3); traffic only at 0–2.5 s.
        let sent = accepted_at(&[0, 1000, 2000]);
        let received = arrived_at(&[10, 1010, 2010]);
        let outage = |index, at| FaultRecord {
            index,
            ..fault(at, at + 500, Fault::Refuse, Direction::Both)
        };
        let faults = [
            outage(0, 900),
            outage(1, 4_000),
            outage(2, 7_000),
            outage(3, 10_000),
        ];
        let entry_of = |i: usize| if i < 3 { 0 } else { 1 };
        // The first outage met traffic: the flapping entry proved something, the lone one not.
        let why = unbitten(&faults, &sent, &received, 15_000, entry_of);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].starts_with("the fault at 10.0 s"), "{}", why[0]);
        // None of its outages met traffic: named once, by its first outage.
        let why = unbitten(&faults[1..], &sent, &received, 15_000, entry_of);
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].starts_with("the fault at 4.0 s"), "{}", why[0]);
        // Judged one by one (each its own entry), the quiet outages are each inconclusive.
        assert_eq!(unbitten(&faults, &sent, &received, 15_000, |i| i).len(), 3);
    }

    #[test]
    fn deliveries_during_a_refused_or_swallowed_upstream_link_are_a_bypass() {
        let received = arrived_at(&[100, 5000, 9000]);
        let refused = fault(2000, 8000, Fault::Refuse, Direction::Both);
        let why = bypassed(&[refused], &received, 10_000);
        assert_eq!(why.len(), 1);
        assert!(
            why[0].contains("bypassed link mqtt: 1 records"),
            "{}",
            why[0]
        );
        // Swallowing answers only (downstream) lets records through: no bypass.
        let downstream = fault(2000, 8000, Fault::Swallow, Direction::Downstream);
        assert!(bypassed(&[downstream], &received, 10_000).is_empty());
        // Right at the edges (bytes already past the proxy): not held against the engine.
        let edge = arrived_at(&[2100, 7900]);
        assert!(
            bypassed(
                &[fault(2000, 8000, Fault::Refuse, Direction::Both)],
                &edge,
                10_000
            )
            .is_empty()
        );
    }
}
