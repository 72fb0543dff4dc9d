//! [`judge`]: the runner's [`Facts`] → a [`Report`] with its verdict.
//!
//! In order: reconcile by id (`verify::reconcile`); what the declared promise excuses
//! (`oracle::excuses`, `oracle::allowance`); why the drill might have proved nothing (a fault
//! that met no traffic, records that went around the proxy); the ledger and whether it closes;
//! one [`ExpectationResult`] per expectation the scenario sets; the headline. Pure: it reads
//! no clock, file or socket, so every expectation and every inconclusive reason is unit-tested
//! below on facts made by hand.

use super::last_seen::last_seen;
use super::oracle::{self, Allowance, Crashes};
use super::recovery::{recovery, series};
use std::time::Duration;

use super::{
    Check, EngineAccount, ExpectationResult, Ledger, RecoveryRecord, Report, Undelivered, Verdict,
};
use crate::runner::Facts;
use crate::scenario::Expectations;
use crate::verify::{self, Reconciliation};

/// Closes the ledger and checks every expectation.
pub fn judge(facts: &Facts) -> Report {
    let r = verify::reconcile(&facts.sent, &facts.received);
    let allowance = allowance(facts);
    let inconclusive = inconclusive(facts);
    let recovery = recovery(&facts.faults, &facts.sent, &facts.received);
    let (ledger, lost_beyond_promise) = ledger(&r, facts, allowance);
    let closes = closes(&ledger, &r, facts);
    let undelivered = undelivered(&ledger, facts);
    let expectations = expectations(
        facts,
        Judged {
            r: &r,
            ledger: &ledger,
            allowance,
            lost_beyond_promise,
            closes,
            recovery: &recovery,
            undelivered: undelivered.as_ref(),
        },
    );
    let lost_last_seen = last_seen(facts, &ledger);
    let verifier_fault = facts.received.verifier_fault.as_deref();
    let notes = notes(facts, verifier_fault);
    let pass =
        expectations.iter().all(|x| x.ok) && inconclusive.is_empty() && verifier_fault.is_none();
    let mut headline = headline(
        &ledger,
        &expectations,
        undelivered.as_ref(),
        verifier_fault.is_some(),
    );
    if let Some(first) = inconclusive.first() {
        headline = format!("Inconclusive: {first}. {headline}");
    }
    Report {
        scenario: facts.plan.name.clone(),
        about: facts.plan.about.clone(),
        seed: facts.seed,
        verdict: if pass { Verdict::Pass } else { Verdict::Fail },
        inconclusive,
        verifier_fault: verifier_fault.map(str::to_string),
        headline,
        engine_account: facts.engine.as_ref().map(|s| EngineAccount {
            held: s.held,
            delivered: s.delivered,
            waiting: s.waiting,
            failed: s.failed,
        }),
        ledger,
        closes,
        undelivered,
        expectations,
        faults: facts.faults.clone(),
        recovery,
        attempts: facts
            .journal_attempts
            .or_else(|| facts.engine.as_ref().and_then(|s| s.attempts))
            .unwrap_or_default(),
        promise: facts.plan.engine.promise.name(),
        runtime: facts.runtime.clone(),
        link: facts.link.clone(),
        versions: facts.versions.clone(),
        missing_examples: r.missing_examples.clone(),
        lost_last_seen,
        ingest_refused_example: r.ingest_refused_example.clone(),
        duplicate_examples: r.duplicate_examples.clone(),
        unexpected_examples: facts.received.unexpected_examples.clone(),
        altered_examples: r.altered_examples.clone(),
        overlapping_examples: overlapping_examples(facts),
        series: series(&facts.samples, &facts.received),
        gives_account: facts.gives_account,
        system: facts.system.clone(),
        notes,
        duration_ms: facts.duration_ms,
    }
}

/// What the declared promise excuses in this drill (DESIGN.md §5).
fn allowance(facts: &Facts) -> Allowance {
    let excuses = oracle::excuses(
        &facts.sent,
        &facts.received,
        facts.possibly_sent_keys.as_ref(),
        Crashes {
            all: &facts.crashes,
            power_cuts: &facts.power_cuts,
        },
        &facts.faults,
    );
    oracle::allowance(
        facts.plan.engine.promise,
        &facts.sent,
        &facts.received,
        &excuses,
    )
}

/// Why the drill proved nothing, if it did not: a fault that met no traffic or found no target,
/// records that arrived while the only link was cut (where the read-back's times can tell), a
/// cut the tap saw records cross, records that reached the destination without crossing the
/// link (where the tap reads every frame).
fn inconclusive(facts: &Facts) -> Vec<String> {
    let entry_of = |i: usize| facts.plan.faults.get(i).map_or(usize::MAX - i, |f| f.entry);
    let mut why: Vec<String> = never_worked(facts).into_iter().collect();
    why.extend(oracle::unbitten(
        &facts.faults,
        &facts.sent,
        &facts.received,
        facts.end_ms,
        entry_of,
    ));
    if facts.bypass_is_judged {
        why.extend(oracle::bypassed(
            &facts.faults,
            &facts.received,
            facts.end_ms,
        ));
    }
    if let Some(tapped) = &facts.tapped {
        why.extend(oracle::leaked(&facts.faults, tapped, facts.end_ms));
        why.extend(oracle::went_around(tapped, &facts.received));
    }
    why
}

/// The ids of the first records written again while an attempt of theirs was open (their write
/// keys, as the source was told them).
fn overlapping_examples(facts: &Facts) -> Vec<String> {
    let Some(keys) = &facts.received.overlapping_keys else {
        return Vec::new();
    };
    let ids: std::collections::HashMap<&str, &str> = facts
        .sent
        .accepted()
        .filter_map(|(r, key, _)| Some((key?, r.id.as_str())))
        .collect();
    let mut seen = std::collections::HashSet::new();
    keys.iter()
        .filter(|k| seen.insert(k.as_str()))
        .map(|k| {
            ids.get(k.as_str())
                .map_or_else(|| k.clone(), |id| id.to_string())
        })
        .take(5)
        .collect()
}

/// How long records must have been accepted before the first fault for "nothing delivered
/// before it" to say the pipeline never worked (a client takes a moment to connect).
const WORKED_WITHIN: Duration = Duration::from_secs(3);

/// A pipeline that never worked: records were accepted well before the first fault and none
/// reached the destination before it (a wrong address, a client the broker cannot talk to).
/// Its losses say nothing about faults, so the drill is inconclusive, with the link's counts.
fn never_worked(facts: &Facts) -> Option<String> {
    let first = facts.faults.iter().map(|f| f.at_ms).min()?;
    let first = Duration::from_millis(first);
    let accepted_early = facts
        .sent
        .accepted()
        .any(|(_, _, at)| at + WORKED_WITHIN <= first);
    // Where arrival times are not the destination's own (Kafka's), the link's tap tells
    // what went up before the fault; without either, nothing is judged.
    let delivered_before = if facts.plan.destination.imp.arrivals_timed_by_destination() {
        facts.received.arrivals.iter().any(|a| a.at < first)
    } else if let Some(t) = facts.tapped.as_ref().filter(|t| t.reads_everything()) {
        t.sent.values().any(|ms| Duration::from_millis(*ms) < first)
    } else {
        true
    };
    if !accepted_early || delivered_before {
        return None;
    }
    let l = &facts.link;
    Some(format!(
        "nothing was delivered before the first fault at {:.1} s, though records were accepted from the start: the engine never reached its destination (link {}: {} connections accepted, {} bytes up, {} down; see the engine's log)",
        first.as_secs_f64(),
        l.name,
        l.connections_accepted,
        l.bytes_upstream,
        l.bytes_downstream
    ))
}

/// The ledger: what is neither at the destination nor still held by the engine is lost. Also
/// the losses beyond what the promise allows.
fn ledger(r: &Reconciliation, facts: &Facts, allowance: Allowance) -> (Ledger, u64) {
    let (waiting, failed) = facts
        .engine
        .as_ref()
        .map(|s| (s.waiting, s.failed))
        .unwrap_or((0, 0));
    let unconfirmed = sent_unconfirmed_missing(facts);
    // What the engine reports waiting is held and not delivered only as far as it is missing
    // at the destination: the rest was read back while the engine had no answer yet (its
    // own ledger line, never a reason the ledger fails to close).
    let still_held = waiting.min(r.missing.saturating_sub(failed));
    let delivered_unanswered = waiting - still_held;
    let waiting = still_held;
    let lost = r
        .missing
        .saturating_sub(waiting + failed + unconfirmed.unwrap_or(0));
    let (mut lost_beyond_promise, duplicates_beyond_promise) = oracle::beyond(r, allowance, lost);
    if !facts.plan.destination.imp.confirms() {
        // Where the destination cannot confirm, no promise excuses a loss: what never left the
        // built-in engine is lost outright, and for a user's engine drill cannot tell what left
        // it, so a fault window must not excuse every record in it (a drill that could not
        // tell must not pass by accident).
        lost_beyond_promise = lost;
    }
    let ledger = Ledger {
        held: r.accepted,
        delivered: r.delivered,
        waiting,
        failed,
        lost,
        delivered_unanswered,
        overlapping_attempts: facts
            .received
            .overlapping_keys
            .as_ref()
            .map(|k| k.len() as u64),
        sent_unconfirmed_missing: unconfirmed,
        duplicates: r.duplicates,
        duplicates_same_key: r.duplicates_same_key,
        duplicates_other_key: r.duplicates_other_key,
        duplicates_beyond_promise,
        reordered: r.reordered,
        unexpected: r.unexpected,
        altered: r.altered,
        ingest_unknown: r.ingest_unknown,
        recovered: r.recovered,
        ingest_refused: r.ingest_refused,
    };
    (ledger, lost_beyond_promise)
}

/// On a destination that cannot confirm a write: the missing records the engine sent without
/// confirmation (their write key's attempt ended `sent_unconfirmed` in its journal). `None`
/// where the destination confirms, and for a user's engine, whose attempts drill cannot see:
/// drill cannot split what was lost in flight from what never left, so every missing record
/// counts as lost and a note says so.
fn sent_unconfirmed_missing(facts: &Facts) -> Option<u64> {
    if facts.plan.destination.imp.confirms() {
        return None;
    }
    let keys = facts.sent_unconfirmed_keys.as_ref()?;
    let arrived: std::collections::HashSet<&str> = facts
        .received
        .arrivals
        .iter()
        .filter_map(|a| a.id.as_deref())
        .collect();
    let n = facts
        .sent
        .accepted()
        .filter(|(r, key, _)| {
            !arrived.contains(r.id.as_str()) && key.is_some_and(|k| keys.contains(k))
        })
        .count();
    Some(n as u64)
}

/// What the engine still held when the drain ended (`None`: nothing), and whether delivery had
/// stalled: no record arrived in the drain's last ten seconds.
fn undelivered(ledger: &Ledger, facts: &Facts) -> Option<Undelivered> {
    if ledger.waiting == 0 {
        return None;
    }
    let from = facts.drain_end_ms.saturating_sub(Undelivered::WINDOW_MS);
    let arrived = facts
        .received
        .arrivals
        .iter()
        .filter(|a| a.id.is_some())
        .filter(|a| (from..=facts.drain_end_ms).contains(&(a.at.as_millis() as u64)))
        .count() as u64;
    let window_s = (facts.drain_end_ms - from).max(1) as f64 / 1000.0;
    Some(Undelivered {
        count: ledger.waiting,
        stalled: arrived == 0,
        per_s: arrived as f64 / window_s,
    })
}

/// The ledger closes when the equation holds with nothing lost, and the engine's own account
/// agrees with what the source and the destination saw (as far as it gives one: a user's
/// engine may report only waiting and failed, or nothing).
fn closes(ledger: &Ledger, r: &Reconciliation, facts: &Facts) -> bool {
    let engine_agrees = match &facts.engine {
        Some(s) => {
            let held_agrees = s.held.is_none_or(|h| h == ledger.held + r.recovered);
            let sums = match (s.held, s.delivered) {
                (Some(h), Some(d)) => d + s.waiting + s.failed == h,
                _ => true,
            };
            held_agrees && sums
        }
        None => !facts.gives_account,
    };
    let unconfirmed = ledger.sent_unconfirmed_missing.unwrap_or(0);
    ledger.lost == 0
        && ledger.delivered + ledger.waiting + ledger.failed + unconfirmed == ledger.held
        && engine_agrees
}

/// What the expectations are checked against.
struct Judged<'a> {
    r: &'a Reconciliation,
    ledger: &'a Ledger,
    allowance: Allowance,
    lost_beyond_promise: u64,
    closes: bool,
    recovery: &'a [RecoveryRecord],
    undelivered: Option<&'a Undelivered>,
}

/// One row per expectation the scenario sets, in a fixed order.
fn expectations(facts: &Facts, j: Judged<'_>) -> Vec<ExpectationResult> {
    let e: &Expectations = &facts.plan.expect;
    let promise = facts.plan.engine.promise.name();
    let (r, l) = (j.r, j.ledger);
    let mut rows = Vec::new();
    // Liveness: when the drain ends, a held record is delivered, failed or (where the
    // destination cannot confirm) sent. What the engine still holds was never delivered.
    if let Some(n) = e.undelivered {
        let held = j.undelivered.map_or(0, |u| u.count);
        let name = "undelivered".to_string();
        let mut x = row(Check::Undelivered, name, n.to_string(), held, held <= n);
        if let Some(u) = j.undelivered {
            x.actual = format!("{held} ({})", u.state());
        }
        rows.push(x);
    }
    // A count against a bound: `at most n`.
    let mut at_most = |check: Check, name: String, n: u64, actual: u64| {
        rows.push(row(check, name, n.to_string(), actual, actual <= n))
    };
    if let Some(n) = e.lost {
        let name = if l.sent_unconfirmed_missing.is_some() {
            "lost before sending".to_string()
        } else if j.allowance.missing > 0 {
            format!("lost beyond {promise}")
        } else {
            "lost".to_string()
        };
        at_most(Check::Lost, name, n, j.lost_beyond_promise);
    }
    // Data at the destination that the engine never accepted (a probe that wrote, a record
    // the source was told was refused) fails the drill unless the scenario allows some.
    if let Some(n) = e.unexpected {
        at_most(Check::Unexpected, "unexpected".into(), n, r.unexpected);
    }
    // A record that arrived with other bytes than were sent (a torn write passed on) is not
    // delivered whole.
    if let Some(n) = e.altered {
        at_most(Check::Altered, "altered".into(), n, r.altered);
    }
    if let Some(n) = e.not_accepted {
        let name = "ingests not accepted".into();
        at_most(Check::NotAccepted, name, n, r.not_accepted);
    }
    if let Some(n) = e.duplicates {
        let name = format!("duplicates beyond {promise}");
        at_most(Check::Duplicates, name, n, l.duplicates_beyond_promise);
    }
    if let Some(n) = e.reordered {
        at_most(Check::Reordered, "reordered".into(), n, r.reordered);
    }
    // One open attempt per write key, where the destination sees attempts.
    if let (Some(n), Some(seen)) = (e.overlapping_attempts, l.overlapping_attempts) {
        let name = "overlapping attempts".into();
        at_most(Check::OverlappingAttempts, name, n, seen);
    }
    // Set aside: exactly as many as the destination refused (drill's brokers refuse only the
    // planted poison records), so drops reported as "failed" do not pass.
    if let Some(n) = e.failed {
        let ok = l.failed == n;
        rows.push(row(
            Check::Failed,
            "failed".into(),
            format!("= {n}"),
            l.failed,
            ok,
        ));
    }
    if let Some(n) = e.max_copies {
        let ok = r.max_copies <= n;
        let name = "copies of one record".into();
        rows.push(row(
            Check::MaxCopies,
            name,
            format!("≤ {n}"),
            r.max_copies,
            ok,
        ));
    }
    if let Some(bound) = e.drain_within {
        rows.push(timed(
            Check::Drain,
            "drain".into(),
            bound,
            Some(facts.drain_ms),
        ));
    }
    if e.ledger_closes {
        rows.push(ExpectationResult {
            check: Check::Ledger,
            name: "ledger".into(),
            expected: "closes".into(),
            actual: if j.closes { "closes" } else { "does not close" }.into(),
            count: None,
            ok: j.closes,
        });
    }
    if let Some(bound) = e.recovery_within {
        for rec in j.recovery {
            let took = rec.first_delivery_ms.map(|f| f.saturating_sub(rec.heal_ms));
            let name = format!("recovery after {}", rec.fault);
            rows.push(timed(Check::Recovery, name, bound, took));
        }
    }
    order(rows)
}

/// The rows in the order reports have always shown them.
fn order(mut rows: Vec<ExpectationResult>) -> Vec<ExpectationResult> {
    let rank = |c: Check| match c {
        Check::Lost => 0,
        Check::Undelivered => 1,
        Check::Unexpected => 2,
        Check::Altered => 3,
        Check::Failed => 4,
        Check::NotAccepted => 5,
        Check::MaxCopies => 6,
        Check::Drain => 7,
        Check::Duplicates => 8,
        Check::Reordered => 9,
        Check::Ledger => 10,
        Check::Recovery => 11,
        Check::OverlappingAttempts => 12,
    };
    rows.sort_by_key(|x| rank(x.check));
    rows
}

/// A row that compares a count.
fn row(check: Check, name: String, expected: String, actual: u64, ok: bool) -> ExpectationResult {
    ExpectationResult {
        check,
        name,
        expected,
        actual: actual.to_string(),
        count: Some(actual),
        ok,
    }
}

/// A row that compares a time against its bound (`None`: it never happened).
fn timed(check: Check, name: String, bound: Duration, took_ms: Option<u64>) -> ExpectationResult {
    ExpectationResult {
        check,
        name,
        expected: format!("≤ {} ms", bound.as_millis()),
        actual: took_ms.map_or_else(|| "no delivery".to_string(), |t| format!("{t} ms")),
        count: took_ms,
        ok: took_ms.is_some_and(|t| u128::from(t) <= bound.as_millis()),
    }
}

/// The runner's notes, then what the verdict itself has to say.
fn notes(facts: &Facts, verifier_fault: Option<&str>) -> Vec<String> {
    let mut notes = facts.notes.clone();
    if let Some(f) = verifier_fault {
        notes.push(format!(
            "verifier fault: {f} — read-back counts may be low; this is not engine loss"
        ));
    }
    if !facts.plan.destination.imp.confirms() {
        notes.push(match facts.sent_unconfirmed_keys {
            Some(_) => "the destination never confirms a write: a record the engine sent (the OS took the bytes) and that is missing is counted as sent but not confirmed, apart from lost; lost counts what never left the engine (from its attempt journal)".to_string(),
            None => "the destination never confirms a write, and drill cannot see a user's engine's attempts: what was lost in flight cannot be told from what never left the engine, so every missing record counts as lost".to_string(),
        });
    }
    if facts.tapped.is_none() {
        // A kind with a tap whose links carry TLS untouched: the tap cannot read ciphertext.
        let why = if !facts.plan.remote_links.is_empty() {
            "the link is served by a drill proxy on another host, which reads no protocol"
        } else if facts.plan.destination.kind.entry().taps.is_some() {
            "the links pass TLS untouched, so their protocol tap cannot read it (`tls: { links: terminate }` lets it)"
        } else {
            "the links carry no protocol tap for this destination kind"
        };
        notes.push(format!("{why}: where lost records were last seen cannot be told, and a bypass of the proxy is judged by arrival times alone"));
    }
    if let Some(n) = facts.engine.as_ref().map(|a| a.errors).filter(|n| *n > 0) {
        notes.push(format!("the engine reported {n} failed writes of its attempt journal, delivery marks or failed store (see its log): the verdict's allowance for extra copies may be wrong"));
    }
    if verifier_fault.is_some() {
        notes.push("the verdict is fail because the reader itself failed; fix the verifier, the engine was not judged".to_string());
    }
    notes
}

/// The failed expectations first, then what was lost: "recovery after link mqtt swallow both
/// 2 ms (expected ≤ 1 ms); nothing lost." On a destination that cannot confirm, never
/// "nothing lost": "none lost before sending; 12 sent but not confirmed and missing." Nor
/// while the engine still holds records: "6002 held records were never delivered (the engine
/// still holds them; delivery stalled); none lost outright."
pub fn headline(
    ledger: &Ledger,
    expectations: &[ExpectationResult],
    undelivered: Option<&Undelivered>,
    verifier_fault: bool,
) -> String {
    let records = |n: u64| match n {
        1 => "1 record".to_string(),
        n => format!("{n} records"),
    };
    let held = undelivered.is_some();
    let losses = match (ledger.sent_unconfirmed_missing, ledger.lost) {
        (None, 0) if held => "none lost outright".to_string(),
        (None, 0) => "nothing lost".to_string(),
        (None, n) => format!("{} lost", records(n)),
        (Some(u), lost) => {
            let before = match lost {
                0 => "none lost before sending".to_string(),
                n => format!("{} lost before sending", records(n)),
            };
            format!("{before}; {u} sent but not confirmed and missing")
        }
    };
    let mut parts: Vec<String> = Vec::new();
    if verifier_fault {
        parts.push("the reader itself failed (a verifier fault, not engine loss)".to_string());
    }
    if let Some(u) = undelivered {
        let were = if u.count == 1 {
            "1 held record was"
        } else {
            &format!("{} held records were", u.count)
        };
        let allowed = !expectations
            .iter()
            .any(|x| x.check == Check::Undelivered && !x.ok);
        let allowed = if allowed {
            ", as the scenario allows"
        } else {
            ""
        };
        parts.push(format!("{were} never delivered ({}){allowed}", u.state()));
    }
    parts.extend(
        expectations
            .iter()
            .filter(|x| !x.ok && !matches!(x.check, Check::Lost | Check::Undelivered))
            .map(|x| {
                if x.expected == "closes" {
                    format!("{} {}", x.name, x.actual)
                } else {
                    format!("{} {} (expected {})", x.name, x.actual, x.expected)
                }
            }),
    );
    parts.push(losses);
    let mut text = parts.join("; ");
    if let Some(first) = text.get(..1) {
        text = first.to_uppercase() + &text[1..];
    }
    text + "."
}

#[cfg(test)]
pub(crate) mod tests {
    //! One test per expectation and per inconclusive reason, each on facts made by hand: a
    //! clean drill passes, and the one thing changed fails exactly its row.

    use std::collections::{BTreeMap, HashSet};
    use std::net::SocketAddr;
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::proxy::{Direction, Fault, FaultSpec, LinkStatus};
    use crate::runner::events::{FaultKind, FaultRecord, FaultTarget};
    use crate::scenario::Plan;
    use crate::sut::Account;
    use crate::verify::{Arrival, Received};
    use crate::workload::{Ingested, Record, Sent};

    pub(crate) fn link_status() -> LinkStatus {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        LinkStatus::idle("mqtt", addr, addr)
    }

    /// Facts with nothing observed beyond `sent` and `received`: no faults, no account.
    pub(crate) fn facts(plan: Plan, sent: Sent, received: Received) -> Facts {
        let tapped = crossed(&received);
        Facts {
            plan,
            seed: 1,
            runtime: "process".to_string(),
            sent,
            received,
            possibly_sent_keys: Some(HashSet::new()),
            sent_unconfirmed_keys: Some(HashSet::new()),
            journal_attempts: None,
            crashes: Vec::new(),
            power_cuts: Vec::new(),
            faults: Vec::new(),
            samples: Vec::new(),
            tapped: Some(tapped),
            bypass_is_judged: true,
            drain_ms: 0,
            drain_end_ms: 10_000,
            engine: None,
            gives_account: false,
            system: "test".to_string(),
            link: link_status(),
            versions: BTreeMap::new(),
            notes: Vec::new(),
            end_ms: 10_000,
            duration_ms: 10_000,
        }
    }

    /// A tap that saw every record the destination holds cross the link, before the drill
    /// began: nothing went around it and nothing crossed during a fault.
    fn crossed(received: &Received) -> crate::runner::Tapped {
        let mut t = crate::runner::Tapped {
            protocol: "a test tap",
            ..Default::default()
        };
        for id in received.arrivals.iter().filter_map(|a| a.id.clone()) {
            t.frames += 1;
            t.left.insert(id.clone());
            t.sent.insert(id.clone(), 0);
            t.acked.insert(id);
        }
        t
    }

    fn plan(expect: &str) -> Plan {
        let text = format!(
            "name: verdict\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1s }}\nexpect: {expect}\n"
        );
        crate::scenario::parse(Path::new("verdict.yaml"), &text).expect("a valid plan")
    }

    fn record(seq: u64) -> Record {
        Record {
            id: format!("r/k0/{seq}"),
            key: "k0".to_string(),
            seq,
            index: seq,
            pad: String::new(),
        }
    }

    /// Ten records accepted one a second with write keys w0..w9, each delivered 100 ms later.
    fn clean(expect: &str) -> Facts {
        let sent = Sent {
            order: (0..10)
                .map(|i| {
                    let at = Duration::from_secs(i);
                    let write_key = Some(format!("w{i}"));
                    (record(i), Ingested::Accepted { write_key, at })
                })
                .collect(),
        };
        let received = Received {
            arrivals: (0..10)
                .map(|i| Arrival {
                    id: Some(format!("r/k0/{i}")),
                    write_key: Some(format!("w{i}")),
                    at: Duration::from_millis(i * 1000 + 100),
                    pad: None,
                })
                .collect(),
            ..Received::default()
        };
        let mut f = facts(plan(expect), sent, received);
        f.gives_account = true;
        f.engine = Some(Account {
            held: Some(10),
            delivered: Some(10),
            waiting: 0,
            failed: 0,
            in_flight: 0,
            attempts: None,
            errors: 0,
        });
        f
    }

    fn link_fault(fault: Fault, at_ms: u64, until_ms: u64) -> FaultRecord {
        // Answers lost, requests land (a half-open link): deliveries go on during it.
        let direction = if fault == Fault::Swallow {
            Direction::Downstream
        } else {
            Direction::Both
        };
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

    /// A report of a clean drill with one fault, for the renderers' tests.
    pub(crate) fn a_report() -> Report {
        let mut f =
            clean("{ lost: 0, duplicates: 0, reordered: 0, ledger: closes, recovery_within: 5s }");
        f.faults = vec![link_fault(Fault::Swallow, 2500, 4000)];
        judge(&f)
    }

    /// The rows that failed, by name.
    fn failed(f: &Facts) -> Vec<String> {
        let report = judge(f);
        report
            .expectations
            .iter()
            .filter(|x| !x.ok)
            .map(|x| format!("{} {}", x.name, x.actual))
            .collect()
    }

    /// A plain-TCP syslog drill: records 0..10 accepted, 3 of them (w2, w3, w4) sent without
    /// confirmation and missing, one (w7) missing and never sent (a drop before sending).
    fn unconfirmed(journal: Option<&[&str]>) -> Facts {
        let text = "name: verdict\ndestination: { kind: syslog, transport: tcp }\nworkload: { rate: 10/s, duration: 1s }\nexpect: { lost_before_sending: 0, ledger: closes }\n";
        let mut f = clean("{}");
        f.plan = crate::scenario::parse(Path::new("verdict.yaml"), text).expect("a valid plan");
        f.received
            .arrivals
            .retain(|a| !["w2", "w3", "w4", "w7"].contains(&a.write_key.as_deref().unwrap()));
        f.sent_unconfirmed_keys = journal.map(|keys| keys.iter().map(|k| k.to_string()).collect());
        f
    }

    #[test]
    fn a_destination_that_cannot_confirm_counts_the_unconfirmed_apart_and_never_says_nothing_lost()
    {
        // The journal: every record went out unconfirmed but w7 (dropped before sending).
        let sent: Vec<String> = (0..10)
            .filter(|i| *i != 7)
            .map(|i| format!("w{i}"))
            .collect();
        let sent: Vec<&str> = sent.iter().map(String::as_str).collect();
        let report = judge(&unconfirmed(Some(&sent)));
        let l = &report.ledger;
        assert_eq!(
            (l.delivered, l.lost, l.sent_unconfirmed_missing),
            (6, 1, Some(3))
        );
        assert_eq!(
            report.headline,
            "Ledger does not close; 1 record lost before sending; 3 sent but not confirmed and missing."
        );
        assert!(!report.verdict.is_pass());
        assert_eq!(
            failed(&unconfirmed(Some(&sent))),
            ["lost before sending 1", "ledger does not close"]
        );
        assert_eq!(
            report.ledger_line(),
            "10 held = 6 delivered + 0 waiting + 0 failed + 3 sent unconfirmed and missing + 1 lost before sending"
        );
        // Nothing dropped before sending: a pass, and still not "nothing lost".
        let mut all = sent.clone();
        all.push("w7");
        let report = judge(&unconfirmed(Some(&all)));
        assert!(report.verdict.is_pass(), "{:?}", report.expectations);
        assert_eq!(
            report.headline,
            "None lost before sending; 4 sent but not confirmed and missing."
        );
        // A user's engine: drill cannot split, so every missing record counts as lost.
        let report = judge(&unconfirmed(None));
        assert_eq!(
            (report.ledger.lost, report.ledger.sent_unconfirmed_missing),
            (4, None)
        );
        assert_eq!(report.headline, "Ledger does not close; 4 records lost.");
        // … and a fault window excuses none of them, whatever the declared promise.
        let mut f = unconfirmed(None);
        f.faults = vec![link_fault(Fault::Swallow, 0, 20_000)];
        f.plan.expect.ledger_closes = false;
        assert_eq!(failed(&f), ["lost 4"]);
        assert!(report.notes.iter().any(|n| n.contains("cannot be told")));
    }

    const ALL: &str = "{ lost: 0, duplicates: 0, reordered: 0, ledger: closes, recovery_within: 5s, failed: 0, unexpected: 0, altered: 0, not_accepted: 0, drain_within: 1s, max_copies: 2 }";

    #[test]
    fn a_clean_drill_passes_every_expectation() {
        let mut f = clean(ALL);
        f.faults = vec![link_fault(Fault::Swallow, 2500, 4000)];
        let report = judge(&f);
        assert!(report.verdict.is_pass(), "{:?}", report.expectations);
        assert_eq!(report.expectations.len(), 12);
        assert_eq!(report.headline, "Nothing lost.");
        assert_eq!(
            report.ledger_line(),
            "10 held = 10 delivered + 0 waiting + 0 failed + 0 lost"
        );
    }

    #[test]
    fn lost() {
        let mut f = clean(ALL);
        f.received.arrivals.remove(4);
        f.engine = None;
        f.gives_account = false;
        assert_eq!(failed(&f), ["lost 1", "ledger does not close"]);
        assert_eq!(judge(&f).headline, "Ledger does not close; 1 record lost.");
    }

    #[test]
    fn unexpected() {
        let mut f = clean(ALL);
        f.received.arrivals.push(Arrival {
            id: None,
            write_key: None,
            at: Duration::from_secs(3),
            pad: None,
        });
        assert_eq!(failed(&f), ["unexpected 1"]);
    }

    #[test]
    fn failed_must_be_exactly_the_refused() {
        let mut f = clean(ALL);
        f.received.arrivals.remove(9);
        if let Some(a) = f.engine.as_mut() {
            a.failed = 1;
            a.delivered = Some(9);
        }
        assert_eq!(failed(&f), ["failed 1"]);
    }

    #[test]
    fn ingests_not_accepted() {
        let mut f = clean(ALL);
        f.sent.order.push((
            record(10),
            Ingested::Unknown {
                at: Duration::from_secs(9),
            },
        ));
        assert_eq!(failed(&f), ["ingests not accepted 1"]);
        // Found at the destination: recovered, not a failure.
        f.received.arrivals.push(Arrival {
            id: Some("r/k0/10".into()),
            write_key: None,
            at: Duration::from_secs(10),
            pad: None,
        });
        if let Some(a) = f.engine.as_mut() {
            a.held = Some(11);
            a.delivered = Some(11);
        }
        assert_eq!(failed(&f), Vec::<String>::new());
    }

    #[test]
    fn copies_of_one_record_and_duplicates_beyond_the_promise() {
        let mut f = clean(ALL);
        for _ in 0..2 {
            f.received.arrivals.push(f.received.arrivals[3].clone());
        }
        assert_eq!(
            failed(&f),
            [
                "copies of one record 3",
                "duplicates beyond at_least_once 2"
            ]
        );
        // Its write had a possibly_sent attempt: within at_least_once, but still 3 copies.
        f.possibly_sent_keys = Some(HashSet::from(["w3".to_string()]));
        assert_eq!(failed(&f), ["copies of one record 3"]);
    }

    /// Records 0..4 delivered, 5..9 still held by the engine when the drain ends (at 10 s).
    fn stuck(expect: &str) -> Facts {
        let mut f = clean(expect);
        f.received.arrivals.truncate(5);
        if let Some(a) = f.engine.as_mut() {
            a.delivered = Some(5);
            a.waiting = 5;
        }
        // The drain ended 16 s after the last arrival.
        f.drain_end_ms = 20_000;
        f
    }

    #[test]
    fn an_engine_that_stopped_delivering_fails_as_undelivered_and_never_reads_nothing_lost() {
        let report = judge(&stuck(ALL));
        assert!(!report.verdict.is_pass());
        assert_eq!(
            failed(&stuck(ALL)),
            ["undelivered 5 (the engine still holds them; delivery stalled)"]
        );
        assert_eq!(
            report.headline,
            "5 held records were never delivered (the engine still holds them; delivery stalled); none lost outright."
        );
        assert!(
            report.closes,
            "held = delivered + waiting: the ledger closes"
        );
        assert_eq!(
            report.ledger_line(),
            "10 held = 5 delivered + 5 waiting (never delivered) + 0 failed + 0 lost"
        );
        let u = report.undelivered.expect("held records");
        assert_eq!((u.count, u.stalled), (5, true));
        // Left out of `expect:`, it is still judged (and so is `lost`).
        let f = stuck("{ duplicates: 0 }");
        assert_eq!(f.plan.expect.lost, Some(0));
        assert_eq!(
            failed(&f),
            ["undelivered 5 (the engine still holds them; delivery stalled)"]
        );
        // Said on purpose: passes, and the headline still says so.
        let report = judge(&stuck("{ undelivered: any, lost: 0 }"));
        assert!(report.verdict.is_pass(), "{:?}", report.expectations);
        assert_eq!(
            report.headline,
            "5 held records were never delivered (the engine still holds them; delivery stalled), as the scenario allows; none lost outright."
        );
        assert!(judge(&stuck("{ undelivered: 5 }")).verdict.is_pass());
        assert!(!judge(&stuck("{ undelivered: 4 }")).verdict.is_pass());
    }

    #[test]
    fn a_slow_engine_still_draining_is_told_from_a_stalled_one() {
        let mut f = stuck(ALL);
        // The drain ended at 12 s: records 2..4 arrived within its last ten seconds.
        f.drain_end_ms = 12_000;
        let report = judge(&f);
        let u = report.undelivered.expect("held records");
        assert!(!u.stalled);
        assert_eq!(u.per_s, 0.3);
        assert_eq!(
            failed(&f),
            ["undelivered 5 (the engine still holds them; still draining at 0.3/s)"]
        );
        f.drain_end_ms = 14_200;
        assert!(judge(&f).undelivered.expect("held").stalled);
    }

    #[test]
    fn records_read_back_while_the_engine_reports_them_waiting_are_their_own_line() {
        let mut f = clean(ALL);
        // The engine still says 3 wait, but every record was read back: it has no answer yet.
        if let Some(a) = f.engine.as_mut() {
            a.waiting = 3;
            a.delivered = Some(7);
        }
        let report = judge(&f);
        assert_eq!(report.ledger.waiting, 0);
        assert_eq!(report.ledger.delivered_unanswered, 3);
        assert!(report.undelivered.is_none());
        assert!(
            report.closes,
            "the overlap never keeps the ledger from closing"
        );
        assert!(report.verdict.is_pass(), "{:?}", report.expectations);
        assert_eq!(
            report.ledger_line(),
            "10 held = 10 delivered + 0 waiting + 0 failed + 0 lost; 3 of the delivered with no answer yet (the engine still reports them waiting)"
        );
        // Four missing, the engine says 6 wait: 4 undelivered, 2 read back with no answer.
        f.received.arrivals.truncate(6);
        if let Some(a) = f.engine.as_mut() {
            a.waiting = 6;
        }
        let l = judge(&f).ledger;
        assert_eq!((l.waiting, l.delivered_unanswered, l.lost), (4, 2, 0));
    }

    #[test]
    fn lost_any_turns_the_loss_check_off_on_purpose() {
        let mut f = clean("{ lost: any }");
        f.received.arrivals.remove(4);
        f.engine = None;
        f.gives_account = false;
        assert!(failed(&f).is_empty(), "{:?}", failed(&f));
        assert_eq!(judge(&f).headline, "1 record lost.");
    }

    #[test]
    fn a_pipeline_that_never_delivered_before_the_first_fault_is_named_as_such() {
        let mut f = clean(ALL);
        f.faults = vec![link_fault(Fault::Refuse, 5000, 6000)];
        // Everything arrived only after the fault: nothing in the first five seconds.
        for a in f.received.arrivals.iter_mut() {
            a.at += Duration::from_secs(6);
        }
        f.bypass_is_judged = false;
        let report = judge(&f);
        assert!(!report.verdict.is_pass());
        assert!(
            report.inconclusive[0].starts_with(
                "nothing was delivered before the first fault at 5.0 s, though records were accepted from the start"
            ),
            "{:?}",
            report.inconclusive
        );
        assert!(report.inconclusive[0].contains("link mqtt: 0 connections accepted"));
        // A delivery before it: the pipeline worked.
        f.received.arrivals[0].at = Duration::from_millis(100);
        assert!(
            judge(&f).inconclusive.is_empty(),
            "{:?}",
            judge(&f).inconclusive
        );
        // A fault too early to tell (nothing accepted 3 s before it): not judged.
        let mut f = clean(ALL);
        f.faults = vec![link_fault(Fault::Refuse, 2000, 2500)];
        for a in f.received.arrivals.iter_mut() {
            a.at += Duration::from_secs(3);
        }
        f.bypass_is_judged = false;
        assert!(
            !judge(&f)
                .inconclusive
                .iter()
                .any(|w| w.starts_with("nothing was delivered")),
            "{:?}",
            judge(&f).inconclusive
        );
    }

    #[test]
    fn a_write_sent_again_while_its_attempt_was_open_is_an_overlapping_attempt() {
        let mut f = clean(ALL);
        // The destination sees attempts and saw none overlap: a row, passing.
        f.received.overlapping_keys = Some(Vec::new());
        let report = judge(&f);
        assert!(report.verdict.is_pass(), "{:?}", report.expectations);
        assert_eq!(report.ledger.overlapping_attempts, Some(0));
        // Two requests for w3 arrived while its first was open.
        f.received.overlapping_keys = Some(vec!["w3".into(), "w3".into(), "w5".into()]);
        assert_eq!(failed(&f), ["overlapping attempts 3"]);
        assert_eq!(judge(&f).overlapping_examples, ["r/k0/3", "r/k0/5"]);
        let md = crate::report::markdown(&judge(&f));
        assert!(
            md.contains("Overlapping attempts: 3 writes arrived"),
            "{md}"
        );
        // Where the destination cannot tell: no row, no count.
        f.received.overlapping_keys = None;
        assert!(judge(&f).ledger.overlapping_attempts.is_none());
        assert!(judge(&f).verdict.is_pass());
    }

    #[test]
    fn drain() {
        let mut f = clean(ALL);
        f.drain_ms = 1500;
        assert_eq!(failed(&f), ["drain 1500 ms"]);
    }

    #[test]
    fn reordered() {
        let mut f = clean(ALL);
        f.received.arrivals.swap(5, 6);
        assert_eq!(failed(&f), ["reordered 1"]);
    }

    #[test]
    fn ledger_closes_only_when_the_engine_agrees() {
        let mut f = clean(ALL);
        if let Some(a) = f.engine.as_mut() {
            a.held = Some(12);
        }
        assert_eq!(failed(&f), ["ledger does not close"]);
    }

    #[test]
    fn recovery_within() {
        let mut f = clean(ALL);
        f.faults = vec![link_fault(Fault::Swallow, 2500, 4000)];
        // Nothing arrives for 6 s after the heal.
        for a in f.received.arrivals.iter_mut().skip(3) {
            a.at += Duration::from_secs(6);
        }
        assert_eq!(
            failed(&f),
            ["recovery after link mqtt swallow downstream 5100 ms"]
        );
    }

    #[test]
    fn a_fault_that_met_no_traffic_is_inconclusive() {
        let mut f = clean(ALL);
        f.faults = vec![link_fault(Fault::Swallow, 20_000, 21_000)];
        let report = judge(&f);
        assert!(!report.verdict.is_pass());
        assert_eq!(report.inconclusive.len(), 1);
        assert!(
            report.headline.starts_with(
                "Inconclusive: the fault at 20.0 s (link mqtt swallow) met no traffic"
            ),
            "{}",
            report.headline
        );
    }

    #[test]
    fn deliveries_through_a_refused_link_are_a_bypass_where_judged() {
        let mut f = clean(ALL);
        f.faults = vec![link_fault(Fault::Refuse, 2000, 8000)];
        let report = judge(&f);
        assert!(!report.verdict.is_pass());
        assert!(
            report.inconclusive[0].starts_with(
                "the engine's traffic bypassed link mqtt: 5 records arrived while it was refuse"
            ),
            "{:?}",
            report.inconclusive
        );
        f.bypass_is_judged = false;
        assert!(judge(&f).inconclusive.is_empty());
    }

    #[test]
    fn a_reader_that_failed_fails_the_verdict_and_says_so() {
        let mut f = clean(ALL);
        f.received.verifier_fault = Some("connection closed".into());
        let report = judge(&f);
        assert!(!report.verdict.is_pass());
        assert!(
            report.headline.starts_with("The reader itself failed"),
            "{}",
            report.headline
        );
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.starts_with("verifier fault: connection closed"))
        );
    }

    #[test]
    fn a_broker_fault_that_found_no_target_is_inconclusive() {
        let mut f = clean(ALL);
        f.faults = vec![FaultRecord {
            index: 0,
            at_ms: 3000,
            target: FaultTarget::Broker("leader".into()),
            kind: FaultKind::Kill,
            wiped: false,
            until_ms: Some(3000),
            bit: None,
            no_target: Some("no node leads the drill's stream now".into()),
        }];
        let report = judge(&f);
        assert!(!report.verdict.is_pass());
        assert_eq!(
            report.inconclusive,
            [
                "the fault at 3.0 s (broker leader kill (SIGKILL)) found no target: no node leads the drill's stream now"
            ]
        );
        assert!(report.recovery.is_empty(), "nothing to recover from");
    }

    /// A clean drill as the tap saw it: every record went up at its acceptance and was
    /// acknowledged.
    fn tapped(f: &Facts) -> crate::runner::Tapped {
        let mut t = crate::runner::Tapped {
            protocol: "a test tap",
            frames: 10,
            link: Some("mqtt".to_string()),
            ..Default::default()
        };
        for (r, _, at) in f.sent.accepted() {
            t.left.insert(r.id.clone());
            t.sent.insert(r.id.clone(), at.as_millis() as u64);
            t.acked.insert(r.id.clone());
        }
        t
    }

    #[test]
    fn records_at_the_destination_that_never_crossed_the_link_went_around_it() {
        let mut f = clean(ALL);
        let mut t = tapped(&f);
        f.tapped = Some(t.clone());
        assert!(judge(&f).inconclusive.is_empty());
        t.sent.remove("r/k0/4");
        f.tapped = Some(t.clone());
        assert_eq!(
            judge(&f).inconclusive,
            [
                "1 records reached the destination without crossing the link (the first: r/k0/4): the engine's traffic bypassed the proxy"
            ]
        );
        // A tap that could not read every frame judges nothing.
        t.unreadable = 1;
        f.tapped = Some(t);
        assert!(judge(&f).inconclusive.is_empty());
    }

    #[test]
    fn a_cut_the_tap_saw_records_cross_did_not_hold() {
        let mut f = clean(ALL);
        // Refused from 2.2 s to 4.8 s, and records 3 and 4 went up at 3 s and 4 s.
        f.faults = vec![link_fault(Fault::Refuse, 2200, 4800)];
        f.bypass_is_judged = false;
        f.tapped = Some(tapped(&f));
        let report = judge(&f);
        assert_eq!(
            report.inconclusive,
            [
                "link mqtt carried 2 records to the broker while it was refuse (2.2–4.8 s): the fault did not hold"
            ]
        );
        // Several links share one tap (a NATS cluster): what crossed cannot be pinned on the
        // refused one, so nothing is judged.
        if let Some(t) = f.tapped.as_mut() {
            t.link = None;
        }
        assert!(judge(&f).inconclusive.is_empty());
    }

    #[test]
    fn lost_records_are_classed_by_where_the_tap_last_saw_them() {
        let mut f = clean(ALL);
        f.engine = None;
        f.gives_account = false;
        let mut t = tapped(&f);
        // Lost: 7 never went up, 8 went up unanswered, 9 was acknowledged by the broker.
        f.received
            .arrivals
            .retain(|a| !matches!(a.id.as_deref(), Some("r/k0/7" | "r/k0/8" | "r/k0/9")));
        t.left.remove("r/k0/7");
        t.sent.remove("r/k0/7");
        t.acked.remove("r/k0/7");
        t.acked.remove("r/k0/8");
        f.tapped = Some(t);
        let report = judge(&f);
        let seen = report.lost_last_seen.clone().expect("something was lost");
        assert_eq!(report.ledger.lost, 3);
        assert_eq!(
            (
                seen.never_left.count,
                seen.no_answer.count,
                seen.broker_lost.count
            ),
            (1, 1, 1)
        );
        assert_eq!(seen.broker_lost.first, ["r/k0/9"]);
        let md = crate::report::markdown(&report);
        assert!(
            md.contains("## Where the lost records were last seen"),
            "{md}"
        );
        assert!(
            md.contains("| the broker acknowledged it and does not have it | 1 | r/k0/9 |"),
            "{md}"
        );
        // Nothing lost: no section.
        assert!(judge(&clean(ALL)).lost_last_seen.is_none());
    }
}
