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
use std::collections::HashSet;
use std::time::Duration;

use super::{
    Check, EngineAccount, ExpectationResult, Ledger, RecoveryRecord, Report, Undelivered, Verdict,
};
use crate::runner::Facts;
use crate::scenario::Expectations;
use crate::verify::{self, Received, Reconciliation};

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
    let checkpoint_ahead = checkpoint_ahead(facts, &ledger);
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
        destroyed_examples: r.destroyed_examples.clone(),
        checkpoint_ahead,
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

/// The lost records the engine's checkpoint had passed after the drain: the source will not
/// give them again. As many as are lost at most (a missing record the engine still holds is
/// waiting, not lost); the first ten by id.
fn checkpoint_ahead(facts: &Facts, ledger: &Ledger) -> Option<super::CheckpointAhead> {
    let c = facts.source.as_ref()?.checkpoint.as_ref()?;
    if ledger.lost == 0 {
        return None;
    }
    let arrived = arrived_ids(facts);
    let behind: Vec<&str> = facts
        .sent
        .accepted()
        .map(|(r, _, _)| r.id.as_str())
        .filter(|id| !arrived.contains(id) && !facts.sent.destroyed.contains(*id))
        .filter(|id| c.passed.contains(*id))
        .collect();
    if behind.is_empty() {
        return None;
    }
    Some(super::CheckpointAhead {
        count: (behind.len() as u64).min(ledger.lost),
        checkpoint: c.said.clone(),
        examples: behind.iter().take(10).map(|s| s.to_string()).collect(),
    })
}

/// The harness ids found at the destination.
fn arrived_ids(facts: &Facts) -> std::collections::HashSet<&str> {
    facts
        .received
        .arrivals
        .iter()
        .filter_map(|a| a.id.as_deref())
        .collect()
}

/// What the declared promise excuses in this drill (docs/src/design.md#5-verdict).
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
    why.extend(idle_link_cuts(facts));
    if let Some(tapped) = &facts.tapped {
        why.extend(oracle::leaked(&facts.faults, tapped, facts.end_ms));
        why.extend(oracle::went_around(tapped, &facts.received));
    }
    why
}

/// Faults on a broker link nothing crossed in the whole drill, while records reached the
/// destination: they went by the other brokers' links, and the cut met nothing.
fn idle_link_cuts(facts: &Facts) -> Vec<String> {
    if facts.received.arrivals.is_empty() {
        return Vec::new();
    }
    let mut named = std::collections::HashSet::new();
    facts
        .faults
        .iter()
        .filter(|f| f.no_target.is_none())
        .filter_map(|f| match &f.target {
            crate::runner::events::FaultTarget::Link(name)
                if facts.idle_links.contains(name) && named.insert(name.clone()) =>
            {
                Some(format!(
                    "the fault at {:.1} s ({} {}) met no traffic: nothing crossed link {name} in the whole drill (no connection, no byte), while records reached the destination by the other brokers' links",
                    f.at_ms as f64 / 1000.0,
                    f.target,
                    f.what()
                ))
            }
            _ => None,
        })
        .collect()
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
    let log = match &facts.engine_log {
        Some(tail) => format!("; the engine's last log lines: {tail}"),
        None => "; see the engine's log".to_string(),
    };
    Some(format!(
        "nothing was delivered before the first fault at {:.1} s, though records were accepted from the start: the engine never reached its destination (link {}: {} connections accepted, {} bytes up, {} down{log})",
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
    // Where the engine lists which records failed, only those missing at the destination
    // account for missing ones: a stored record the engine calls failed excuses nothing.
    let failed_but_stored = failed_but_stored(facts);
    let failed_missing = failed.saturating_sub(failed_but_stored.unwrap_or(0));
    // What the engine reports waiting is held and not delivered only as far as it is missing
    // at the destination: the rest was read back while the engine had no answer yet (its
    // own ledger line, never a reason the ledger fails to close).
    let still_held = waiting.min(r.missing.saturating_sub(failed_missing));
    let delivered_unanswered = waiting - still_held;
    let waiting = still_held;
    let lost = r
        .missing
        .saturating_sub(waiting + failed_missing + unconfirmed.unwrap_or(0));
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
        failed_but_stored,
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
        destroyed: r.destroyed,
    };
    (ledger, lost_beyond_promise)
}

/// The records the engine lists as failed that are at the destination all the same (`None`:
/// it lists none). Each such record is counted twice by an engine's `failed`: once as
/// delivered (it arrived), once as failed.
fn failed_but_stored(facts: &Facts) -> Option<u64> {
    let ids = facts.failed_ids.as_ref()?;
    let arrived: HashSet<&str> = facts
        .received
        .arrivals
        .iter()
        .filter_map(|a| a.id.as_deref())
        .collect();
    let stored: HashSet<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| arrived.contains(id))
        .collect();
    Some(stored.len() as u64)
}

/// On a destination that cannot confirm a write: the missing records the engine sent without
/// confirmation (their write key's attempt ended `sent_unconfirmed` in its journal) and, where
/// the links are tapped, that the link read from the engine. A record the journal calls sent
/// that never reached the link was never written: lost before sending, whatever the journal
/// says. `None` where the destination confirms, and for a user's engine, whose attempts drill
/// cannot see: drill cannot split what was lost in flight from what never left, so every
/// missing record counts as lost and a note says so.
fn sent_unconfirmed_missing(facts: &Facts) -> Option<u64> {
    Some(sent_unconfirmed_split(facts)?.0)
}

/// [`sent_unconfirmed_missing`], and how many of the missing records the journal calls sent
/// the link never read from the engine (0 without a tap).
fn sent_unconfirmed_split(facts: &Facts) -> Option<(u64, u64)> {
    if facts.plan.destination.imp.confirms() {
        return None;
    }
    let keys = facts.sent_unconfirmed_keys.as_ref()?;
    let arrived = arrived_ids(facts);
    let left = |id: &str| {
        facts
            .tapped
            .as_ref()
            .is_none_or(|t| t.left.contains(id) || t.sent.contains_key(id))
    };
    let (mut sent, mut never_left) = (0, 0);
    for (r, key, _) in facts.sent.accepted() {
        if arrived.contains(r.id.as_str()) || !key.is_some_and(|k| keys.contains(k)) {
            continue;
        }
        if left(&r.id) {
            sent += 1;
        } else {
            never_left += 1;
        }
    }
    Some((sent, never_left))
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
            // A record a source fault destroyed never reached the engine.
            let held_agrees = s
                .held
                .is_none_or(|h| h == ledger.held - ledger.destroyed + r.recovered);
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
        && ledger.delivered + ledger.waiting + ledger.failed + unconfirmed + ledger.destroyed
            == ledger.held
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

/// Records a destination fault refused for good (withheld, never stored) that no later write
/// stored: each one a refusal the engine must count failed.
fn refused_by_destination(received: &Received) -> u64 {
    let arrived: HashSet<&str> = received
        .arrivals
        .iter()
        .filter_map(|a| a.id.as_deref())
        .collect();
    let refused: HashSet<&str> = received
        .refused_by_destination
        .iter()
        .map(String::as_str)
        .filter(|id| !arrived.contains(id))
        .collect();
    refused.len() as u64
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
    // planted poison records; where drill answers for the destination, also the records a
    // destination fault refused for good), so drops reported as "failed" do not pass.
    // Where the engine lists its failed records, they must be the refused ones: a record the
    // destination stored is never failed.
    if let Some(n) = e.failed {
        let n = n + refused_by_destination(&facts.received);
        let stored = l.failed_but_stored.unwrap_or(0);
        let mut failed = row(
            Check::Failed,
            "failed".into(),
            format!("= {n}"),
            l.failed,
            l.failed == n && stored == 0,
        );
        if stored > 0 {
            failed.actual = format!("{} ({stored} of them stored)", l.failed);
        }
        rows.push(failed);
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
    whole_drill(facts, &j, &mut rows);
    order(rows)
}

/// The rows about the drill as a whole rather than a count: the drain, the ledger, the
/// recovery after each fault.
fn whole_drill(facts: &Facts, j: &Judged<'_>, rows: &mut Vec<ExpectationResult>) {
    let e: &Expectations = &facts.plan.expect;
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
    if let Some(s) = &facts.source {
        for e in &s.account.events {
            notes.push(format!("source: {e}"));
        }
        if let Some(c) = &s.checkpoint {
            notes.push(format!(
                "the engine's checkpoint after the drain: {}, past {} of the records drill wrote",
                c.said,
                c.passed.len()
            ));
        }
        if let Some(why) = &s.checkpoint_unread {
            notes.push(format!(
                "{why}: which lost records the checkpoint had passed cannot be told"
            ));
        }
    }
    if let Some(f) = verifier_fault {
        notes.push(format!(
            "verifier fault: {f} — read-back counts may be low; this is not engine loss"
        ));
    }
    if !facts.plan.destination.imp.confirms() {
        notes.push(match facts.sent_unconfirmed_keys {
            Some(_) if facts.tapped.is_some() => "the destination never confirms a write: a record the engine sent (its attempt journal says so, and the link read it from the engine) and that is missing is counted as sent but not confirmed, apart from lost; lost counts what never left the engine".to_string(),
            Some(_) => "the destination never confirms a write: a record the engine sent (the OS took the bytes) and that is missing is counted as sent but not confirmed, apart from lost; lost counts what never left the engine (from its attempt journal alone: no tap read the link)".to_string(),
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
    if let Some((_, n)) = sent_unconfirmed_split(facts).filter(|(_, n)| *n > 0) {
        notes.push(format!("{n} missing records the engine's attempt journal calls sent never reached the link (its tap read no byte of them from the engine): they were never written, and count as lost before sending"));
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
#[path = "verdict_tests.rs"]
pub(crate) mod tests;
