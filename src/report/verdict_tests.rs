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
        failed_ids: None,
        gives_account: false,
        system: "test".to_string(),
        engine_log: None,
        idle_links: Vec::new(),
        link: link_status(),
        versions: BTreeMap::new(),
        notes: Vec::new(),
        end_ms: 10_000,
        source: None,
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
        destroyed: Default::default(),
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
fn a_destination_that_cannot_confirm_counts_the_unconfirmed_apart_and_never_says_nothing_lost() {
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

/// The link's tap is the second witness the journal's "sent" needs on TCP and UDP: of the
/// four missing records the journal calls sent, the link read two from the engine (swallowed
/// on the way: sent, unconfirmed) and never saw the other two, which were never written.
#[test]
fn a_record_the_journal_calls_sent_that_never_reached_the_link_is_lost_before_sending() {
    let sent: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
    let sent: Vec<&str> = sent.iter().map(String::as_str).collect();
    let mut f = unconfirmed(Some(&sent));
    // Without a tap the journal's word stands: a pass (the parent commit's verdict).
    assert!(judge(&f).verdict.is_pass());
    let mut t = tapped(&f);
    t.link = Some("syslog".to_string());
    let never_written = |f: &Facts, key: &str| {
        f.sent
            .accepted()
            .find(|(_, k, _)| *k == Some(key))
            .map(|(r, ..)| r.id.clone())
            .unwrap()
    };
    for key in ["w3", "w7"] {
        let id = never_written(&f, key);
        t.left.remove(&id);
        t.sent.remove(&id);
    }
    f.tapped = Some(t);
    let report = judge(&f);
    let l = &report.ledger;
    assert_eq!((l.lost, l.sent_unconfirmed_missing), (2, Some(2)));
    assert_eq!(
        failed(&f),
        ["lost before sending 2", "ledger does not close"]
    );
    assert!(
        report.notes.iter().any(|n| n.starts_with(
            "2 missing records the engine's attempt journal calls sent never reached the link"
        )),
        "{:?}",
        report.notes
    );
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

/// Records the destination refused for good (r/k0/8, r/k0/9: withheld) and an engine that
/// lists as failed two records the destination stored (r/k0/2, r/k0/3) while the refused two
/// went nowhere: the counts agree (2 failed = 2 refused, 8 arrived + 2 failed = 10 held), the
/// ids do not. Where the engine lists its failed records the verdict reads them: 2 lost, the
/// failed row names the 2 stored, the ledger does not close. Without the list it cannot tell.
#[test]
fn a_failed_record_the_destination_stored_excuses_no_missing_one() {
    let swapped = |ids: Option<[&str; 2]>| {
        let mut f = clean("{ lost: 0, failed: 0, ledger: closes }");
        f.received.arrivals.truncate(8);
        f.received.refused_by_destination = vec!["r/k0/8".into(), "r/k0/9".into()];
        if let Some(a) = f.engine.as_mut() {
            a.failed = 2;
            a.delivered = Some(8);
        }
        f.failed_ids = ids.map(|ids| ids.iter().map(|i| i.to_string()).collect());
        f
    };
    let listed = swapped(Some(["r/k0/2", "r/k0/3"]));
    assert_eq!(
        failed(&listed),
        [
            "lost 2",
            "failed 2 (2 of them stored)",
            "ledger does not close"
        ]
    );
    assert_eq!(judge(&listed).ledger.failed_but_stored, Some(2));
    let right = swapped(Some(["r/k0/8", "r/k0/9"]));
    assert!(failed(&right).is_empty(), "{:?}", failed(&right));
    assert_eq!(judge(&right).ledger.failed_but_stored, Some(0));
    let unlisted = swapped(None);
    assert!(
        failed(&unlisted).is_empty(),
        "only the counts: {:?}",
        failed(&unlisted)
    );
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
    assert!(report.inconclusive[0].ends_with("; see the engine's log)"));
    // The engine's own words, where its log is on this host.
    f.engine_log = Some("connect to 127.0.0.1:1 refused (log /tmp/w/engine.log)".to_string());
    assert!(
        judge(&f).inconclusive[0].ends_with(
            "; the engine's last log lines: connect to 127.0.0.1:1 refused (log /tmp/w/engine.log))"
        ),
        "{:?}",
        judge(&f).inconclusive
    );
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

/// A cut of one broker's link of a Kafka cluster that led nothing the engine wrote to: records
/// flowed the whole time by the other brokers' links, and nothing crossed this one.
#[test]
fn a_cut_of_a_broker_link_nothing_crossed_is_inconclusive() {
    let mut f = clean(ALL);
    let mut cut = link_fault(Fault::Refuse, 0, 20_000);
    cut.target = crate::runner::events::FaultTarget::Link("kafka-2".to_string());
    f.faults = vec![cut];
    f.bypass_is_judged = false;
    // Records met the cut (accepted during it): by the records alone it bit.
    assert!(
        judge(&f).inconclusive.is_empty(),
        "{:?}",
        judge(&f).inconclusive
    );
    f.idle_links = vec!["kafka-2".to_string()];
    let report = judge(&f);
    assert_eq!(
        report.inconclusive,
        [
            "the fault at 0.0 s (link kafka-2 refuse) met no traffic: nothing crossed link kafka-2 in the whole drill (no connection, no byte), while records reached the destination by the other brokers' links"
        ]
    );
    assert!(!report.verdict.is_pass());
}

#[test]
fn a_fault_that_met_no_traffic_is_inconclusive() {
    let mut f = clean(ALL);
    f.faults = vec![link_fault(Fault::Swallow, 20_000, 21_000)];
    let report = judge(&f);
    assert!(!report.verdict.is_pass());
    assert_eq!(report.inconclusive.len(), 1);
    assert!(
        report
            .headline
            .starts_with("Inconclusive: the fault at 20.0 s (link mqtt swallow) met no traffic"),
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
