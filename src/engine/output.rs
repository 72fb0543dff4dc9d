//! One output of the engine: the attempt ledger as a state machine, and the MQTT 5 driver.
//!
//! [`Output`] is synchronous state (STYLE.md, crucible's `apply`): it decides what to send next,
//! opens and closes attempts, and classifies outcomes. It never touches a socket, so it is unit
//! tested without one. [`drive_mqtt`] is the I/O side: it turns the socket, the ingest channel
//! and timers into calls on `Output`, and persists what `Output` reports.
//!
//! Rules kept here (DESIGN.md §1): no age limit anywhere; at most one open attempt per write key
//! (a record with an open attempt is never put on the wire again); every attempt ends
//! `delivered`, `refused` or `possibly_sent`; only a PUBACK with an error reason (the destination
//! itself said no while the connection worked) counts toward the refusal limit — a cut, a
//! timeout or a refused connect spends nothing; a record whose attempt ended `possibly_sent` is
//! held and sent again with the same write key only after a data-free probe (CONNACK and a
//! PINGREQ/PINGRESP round trip) shows the destination back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::log::StoredRecord;
use crate::mqtt::{Ack, Packet};
use crate::scenario::Order;

/// How counted refusals back off and when a record is set aside as failed.
#[derive(Debug, Clone, Copy)]
pub struct RefusalPolicy {
    pub max: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for RefusalPolicy {
    fn default() -> Self {
        RefusalPolicy {
            max: 10,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }
}

impl RefusalPolicy {
    /// Backoff after the `n`th refusal (1-based): min, 2·min, 4·min … capped at max.
    pub fn backoff(&self, n: u32) -> Duration {
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(30));
        self.backoff_min
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// How an attempt ended (DESIGN.md §1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Delivered,
    Refused,
    PossiblySent,
    SentUnconfirmed,
}

/// One closed attempt, as written to `attempts.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    pub output: String,
    pub key: String,
    pub seq: u64,
    pub attempt: u32,
    pub opened_ms: u64,
    pub closed_ms: u64,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A record set aside after its last counted refusal (`failed-<output>.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FailedRecord {
    pub output: String,
    pub key: String,
    pub seq: u64,
    pub data: String,
    pub error: String,
    pub refusals: u32,
    pub first_attempt_ms: u64,
    pub last_attempt_ms: u64,
}

/// What a destination said to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Stored (for JetStream also a `duplicate: true` PubAck: the copy it has is this one).
    Accepted,
    /// The destination said no to this record, in these words, while the connection worked.
    Refused(String),
}

/// What the I/O side must persist after a call on [`Output`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Closed(AttemptRecord),
    /// Confirmed: `(segment, seq)` of the record, for its delivery mark.
    Delivered(u64, u64),
    Failed(FailedRecord),
}

#[derive(Debug, Clone)]
struct Entry {
    record: Arc<StoredRecord>,
    attempts: u32,
    refusals: u32,
    first_attempt_ms: Option<u64>,
}

#[derive(Debug)]
struct Open {
    entry: Entry,
    opened_ms: u64,
}

/// Attempts by outcome, for `/stats`.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct AttemptCounts {
    pub delivered: u64,
    pub refused: u64,
    pub possibly_sent: u64,
    pub sent_unconfirmed: u64,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The state of one output: which records wait, which have an open attempt, what happened.
pub struct Output {
    pub name: String,
    topic: String,
    order: Order,
    refusals: RefusalPolicy,
    window: usize,
    /// Waiting records with no open attempt, by sequence.
    ready: BTreeMap<u64, Entry>,
    /// Refused records waiting out their backoff: sequence → (not before, entry).
    delayed: BTreeMap<u64, (Instant, Entry)>,
    /// Open attempts by MQTT packet id.
    open: HashMap<u16, Open>,
    next_pkid: u16,
    pub attempts: AttemptCounts,
    pub delivered: u64,
    pub failed: u64,
    /// One past the highest sequence this output has been given.
    seen_through: u64,
}

impl Output {
    pub fn new(
        name: &str,
        topic: &str,
        order: Order,
        refusals: RefusalPolicy,
        window: usize,
    ) -> Output {
        Output {
            name: name.to_string(),
            topic: topic.to_string(),
            order,
            refusals,
            window: window.clamp(1, 65_000),
            ready: BTreeMap::new(),
            delayed: BTreeMap::new(),
            open: HashMap::new(),
            next_pkid: 1,
            attempts: AttemptCounts::default(),
            delivered: 0,
            failed: 0,
            seen_through: 0,
        }
    }

    /// Every record below the returned sequence is settled for this output: delivered, or set
    /// aside in its failed messages. Records it was not given yet lie above it, so the log may
    /// delete whole segments below it.
    pub fn settled_below(&self) -> u64 {
        let open = self.open.values().map(|o| o.entry.record.seq).min();
        [
            self.ready.first_key_value().map(|(s, _)| *s),
            self.delayed.first_key_value().map(|(s, _)| *s),
            open,
        ]
        .into_iter()
        .flatten()
        .fold(self.seen_through, u64::min)
    }

    /// The log's next sequence when this output started: everything below it was given at
    /// start (recovered records) or is settled.
    pub fn starting_at(mut self, next_seq: u64) -> Output {
        self.seen_through = next_seq;
        self
    }

    /// Records the engine accepted (or recovered) that this output has not delivered.
    pub fn ingest(&mut self, records: impl IntoIterator<Item = Arc<StoredRecord>>) {
        for record in records {
            self.seen_through = self.seen_through.max(record.seq + 1);
            self.ready.insert(
                record.seq,
                Entry {
                    record,
                    attempts: 0,
                    refusals: 0,
                    first_attempt_ms: None,
                },
            );
        }
    }

    pub fn waiting(&self) -> u64 {
        (self.ready.len() + self.delayed.len() + self.open.len()) as u64
    }

    pub fn in_flight(&self) -> usize {
        self.open.len()
    }

    /// Is there a write key with two open attempts? (Never; checked by tests.)
    pub fn open_keys_unique(&self) -> bool {
        let mut seen = std::collections::HashSet::new();
        self.open.values().all(|o| seen.insert(o.entry.record.seq))
    }

    /// Opens attempts for as many waiting records as the window allows and returns the MQTT
    /// publishes to put on the wire, in order (the packet id is the attempt's tag).
    pub fn next_sends(&mut self, now: Instant) -> Vec<Packet> {
        let topic = self.topic.clone();
        self.next_attempts(now)
            .into_iter()
            .map(|(tag, record)| {
                crate::mqtt::publish_with_key(
                    &topic,
                    tag,
                    bytes::Bytes::from(record.data.clone().into_bytes()),
                    &record.key,
                )
            })
            .collect()
    }

    /// Opens attempts for as many waiting records as the window allows: each gets a tag (unique
    /// among open attempts) to answer it by. In order of sequence.
    pub fn next_attempts(&mut self, now: Instant) -> Vec<(u16, Arc<StoredRecord>)> {
        let due: Vec<u64> = self
            .delayed
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            if let Some((_, entry)) = self.delayed.remove(&seq) {
                self.ready.insert(seq, entry);
            }
        }
        let mut sends = Vec::new();
        while self.open.len() < self.window {
            let Some((&seq, _)) = self.ready.first_key_value() else {
                break;
            };
            if self.order == Order::InOrder
                && self
                    .delayed
                    .first_key_value()
                    .is_some_and(|(d, _)| *d < seq)
            {
                // A refused record blocks those behind it until it is delivered or set aside.
                break;
            }
            let Some(mut entry) = self.ready.remove(&seq) else {
                break;
            };
            let pkid = self.free_pkid();
            entry.attempts += 1;
            let opened_ms = wall_ms();
            entry.first_attempt_ms.get_or_insert(opened_ms);
            sends.push((pkid, entry.record.clone()));
            self.open.insert(pkid, Open { entry, opened_ms });
        }
        sends
    }

    fn free_pkid(&mut self) -> u16 {
        loop {
            let pkid = self.next_pkid;
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            if !self.open.contains_key(&pkid) {
                return pkid;
            }
        }
    }

    /// When the next delayed (refused) record may be sent again.
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.values().map(|(at, _)| *at).min()
    }

    /// The MQTT destination answered one publish.
    pub fn on_ack(&mut self, ack: &Ack, now: Instant) -> Vec<Effect> {
        let answer = if ack.accepted() {
            Answer::Accepted
        } else {
            Answer::Refused(ack.describe())
        };
        self.on_answer(ack.pkid, answer, now)
    }

    /// The destination answered the attempt tagged `tag`.
    pub fn on_answer(&mut self, tag: u16, answer: Answer, now: Instant) -> Vec<Effect> {
        let Some(open) = self.open.remove(&tag) else {
            return Vec::new();
        };
        let closed_ms = wall_ms();
        let mut entry = open.entry;
        let attempt = |outcome, error| AttemptRecord {
            output: self.name.clone(),
            key: entry.record.key.clone(),
            seq: entry.record.seq,
            attempt: entry.attempts,
            opened_ms: open.opened_ms,
            closed_ms,
            outcome,
            error,
        };
        let error = match answer {
            Answer::Refused(error) => error,
            Answer::Accepted => {
                self.attempts.delivered += 1;
                self.delivered += 1;
                return vec![
                    Effect::Closed(attempt(Outcome::Delivered, None)),
                    Effect::Delivered(entry.record.segment, entry.record.seq),
                ];
            }
        };
        self.attempts.refused += 1;
        let closed = Effect::Closed(attempt(Outcome::Refused, Some(error.clone())));
        entry.refusals += 1;
        if entry.refusals >= self.refusals.max {
            self.failed += 1;
            let failed = FailedRecord {
                output: self.name.clone(),
                key: entry.record.key.clone(),
                seq: entry.record.seq,
                data: entry.record.data.clone(),
                error,
                refusals: entry.refusals,
                first_attempt_ms: entry.first_attempt_ms.unwrap_or(open.opened_ms),
                last_attempt_ms: open.opened_ms,
            };
            return vec![closed, Effect::Failed(failed)];
        }
        let at = now + self.refusals.backoff(entry.refusals);
        self.delayed.insert(entry.record.seq, (at, entry));
        vec![closed]
    }

    /// The connection is gone (cut, reset, or silent past the answer timeout). Every open
    /// attempt ends `possibly_sent`; its record is held for a resend after the next probe.
    /// No refusal is counted: an outage spends nothing.
    pub fn on_link_lost(&mut self, reason: &str) -> Vec<Effect> {
        let closed_ms = wall_ms();
        let mut effects = Vec::new();
        let mut open: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        open.sort_by_key(|o| o.entry.record.seq);
        for o in open {
            self.attempts.possibly_sent += 1;
            effects.push(Effect::Closed(AttemptRecord {
                output: self.name.clone(),
                key: o.entry.record.key.clone(),
                seq: o.entry.record.seq,
                attempt: o.entry.attempts,
                opened_ms: o.opened_ms,
                closed_ms,
                outcome: Outcome::PossiblySent,
                error: Some(reason.to_string()),
            }));
            self.ready.insert(o.entry.record.seq, o.entry);
        }
        effects
    }

    /// The age of the oldest open attempt.
    pub fn oldest_open_ms(&self) -> Option<u64> {
        self.open.values().map(|o| o.opened_ms).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: u64) -> Vec<Arc<StoredRecord>> {
        (0..n)
            .map(|seq| {
                Arc::new(StoredRecord {
                    seq,
                    key: format!("k-{seq}"),
                    data: format!("{{\"seq\":{seq}}}"),
                    segment: 0,
                })
            })
            .collect()
    }

    fn pkids(packets: &[Packet]) -> Vec<u16> {
        packets
            .iter()
            .map(|p| match p {
                Packet::Publish(p) => p.pkid,
                _ => 0,
            })
            .collect()
    }

    const SUCCESS: u8 = 0x00;
    const QUOTA_EXCEEDED: u8 = 0x97;

    fn ack(pkid: u16, code: u8) -> Ack {
        Ack {
            pkid,
            code,
            reason_string: None,
        }
    }

    fn policy() -> RefusalPolicy {
        RefusalPolicy {
            max: 3,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
        }
    }

    #[test]
    fn the_window_bounds_open_attempts_and_keys_are_never_open_twice() {
        let mut out = Output::new("o", "t", Order::InOrder, policy(), 4);
        out.ingest(records(10));
        let now = Instant::now();
        assert_eq!(out.next_sends(now).len(), 4);
        assert!(out.next_sends(now).is_empty(), "window is full");
        assert!(out.open_keys_unique());
        assert_eq!(out.waiting(), 10);
    }

    #[test]
    fn a_cut_ends_open_attempts_possibly_sent_and_spends_no_refusal() {
        let mut out = Output::new("o", "t", Order::InOrder, policy(), 2);
        out.ingest(records(3));
        let now = Instant::now();
        out.next_sends(now);
        let effects = out.on_link_lost("cut");
        assert_eq!(effects.len(), 2);
        assert!(effects.iter().all(|e| matches!(e,
            Effect::Closed(a) if a.outcome == Outcome::PossiblySent)));
        assert_eq!(out.attempts.possibly_sent, 2);
        assert_eq!(out.attempts.refused, 0);
        // Resent in order, same keys, after the link is back.
        let again = out.next_sends(now);
        let keys: Vec<_> = again
            .iter()
            .map(|p| match p {
                Packet::Publish(p) => crate::mqtt::write_key_of(p).unwrap(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(keys, vec!["k-0", "k-1"]);
    }

    #[test]
    fn settled_below_is_the_oldest_record_not_yet_settled() {
        let mut out = Output::new("o", "t", Order::Any, policy(), 8).starting_at(0);
        assert_eq!(out.settled_below(), 0);
        out.ingest(records(3));
        let now = Instant::now();
        let sent = pkids(&out.next_sends(now));
        assert_eq!(out.settled_below(), 0, "all three open");
        out.on_ack(&ack(sent[1], SUCCESS), now);
        assert_eq!(out.settled_below(), 0, "record 0 still open");
        out.on_ack(&ack(sent[0], QUOTA_EXCEEDED), now);
        assert_eq!(out.settled_below(), 0, "record 0 refused, backing off");
        out.on_ack(&ack(sent[2], SUCCESS), now);
        out.on_link_lost("cut");
        assert_eq!(out.settled_below(), 0);
        // Record 0 fails for good (policy: 3 refusals): everything given is settled.
        for _ in 2..=3 {
            let due = out.next_due().unwrap();
            let again = pkids(&out.next_sends(due));
            out.on_ack(&ack(again[0], QUOTA_EXCEEDED), due);
        }
        assert_eq!(out.failed, 1);
        assert_eq!(out.settled_below(), 3);
        // A fresh output over a log that already holds 10 sequences starts past them.
        assert_eq!(
            Output::new("o", "t", Order::Any, policy(), 8)
                .starting_at(10)
                .settled_below(),
            10
        );
    }

    #[test]
    fn refusals_back_off_then_the_record_fails_and_the_rest_flows() {
        let mut out = Output::new("o", "t", Order::InOrder, policy(), 8);
        out.ingest(records(3));
        let mut now = Instant::now();
        let sent = pkids(&out.next_sends(now));
        assert_eq!(sent.len(), 3);
        // Record 0 refused; 1 and 2 delivered.
        out.on_ack(&ack(sent[0], QUOTA_EXCEEDED), now);
        out.on_ack(&ack(sent[1], SUCCESS), now);
        out.on_ack(&ack(sent[2], SUCCESS), now);
        assert_eq!(out.delivered, 2);
        assert!(out.next_sends(now).is_empty(), "backing off");
        let mut failed = None;
        for refusal in 2..=3 {
            now = out.next_due().unwrap();
            let sent = pkids(&out.next_sends(now));
            assert_eq!(sent.len(), 1);
            let effects = out.on_ack(&ack(sent[0], QUOTA_EXCEEDED), now);
            if refusal == 3 {
                failed = effects.into_iter().find_map(|e| match e {
                    Effect::Failed(f) => Some(f),
                    _ => None,
                });
            }
        }
        let failed = failed.expect("set aside after 3 refusals");
        assert_eq!((failed.seq, failed.refusals), (0, 3));
        assert!(failed.error.contains("quota exceeded"), "{}", failed.error);
        assert_eq!((out.failed, out.waiting()), (1, 0));
    }

    #[test]
    fn in_order_blocks_behind_a_refused_record() {
        let mut out = Output::new("o", "t", Order::InOrder, policy(), 1);
        out.ingest(records(2));
        let now = Instant::now();
        let sent = pkids(&out.next_sends(now));
        out.on_ack(&ack(sent[0], QUOTA_EXCEEDED), now);
        assert!(out.next_sends(now).is_empty(), "record 1 waits behind 0");
        let mut any = Output::new("o", "t", Order::Any, policy(), 1);
        any.ingest(records(2));
        let sent = pkids(&any.next_sends(now));
        any.on_ack(&ack(sent[0], QUOTA_EXCEEDED), now);
        assert_eq!(any.next_sends(now).len(), 1, "record 1 overtakes");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RefusalPolicy::default();
        assert_eq!(p.backoff(1), Duration::from_secs(1));
        assert_eq!(p.backoff(2), Duration::from_secs(2));
        assert_eq!(p.backoff(7), Duration::from_secs(60));
    }
}
