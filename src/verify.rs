//! What reached the destination, and the reconciliation by harness id.
//!
//! Each destination kind's reader (`src/dest/<kind>/read.rs`) reads straight from the broker
//! (never through the proxy) and turns every message into [`Arrival`]s with a [`Decoder`]: the
//! harness ids found in it and the write key where the engine put it ([`WriteKeyPlace`]).
//! [`reconcile`] then compares what the source was told was accepted with what arrived:
//! missing, duplicates (with and without the original's write key), reordered (per key),
//! unexpected, and the fate of ingests whose answer was lost. If a reader itself may have
//! missed copies, that is a *verifier* fault ([`Received::verifier_fault`]) and is reported as
//! such — never as engine loss. This module knows no destination kind.

use std::collections::HashMap;
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::credentials::Secrets;
use crate::workload::{Ingested, Sent};

/// Where, at the destination, an engine puts each record's write key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteKeyPlace {
    /// In the message's metadata where the destination kind keeps such things, by name: an
    /// MQTT user property, a Kafka header, a JetStream header (`Nats-Msg-Id`). The kind's
    /// reader looks it up.
    Meta(String),
    /// A field of the message's JSON (dotted path for nested fields).
    JsonField(String),
}

/// One copy seen at the destination.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub id: Option<String>,
    pub write_key: Option<String>,
    pub at: Duration,
    /// A digest of the record's `pad` as it arrived (the run of letters after `pad` that
    /// follows the id), when the message carries one: compared with what the source sent, it
    /// shows a record that arrived altered (a torn write trusted, a truncated body).
    pub pad: Option<u64>,
}

/// The digest [`Arrival::pad`] holds.
pub fn pad_digest(pad: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one(pad)
}

/// How far after an id its record's `pad` may begin (`","key":"k12","seq":12345,"pad":"`,
/// escaped or not).
const PAD_WITHIN: usize = 120;

/// The digest of the `pad` that follows an id ending at `end` in `text`, if one does.
fn pad_after(text: &[u8], end: usize) -> Option<u64> {
    let window = text.get(end..(end + PAD_WITHIN).min(text.len()))?;
    let at = memchr::memmem::find(window, b"pad")? + 3;
    let rest = &text[end + at..];
    // `":"`, or `\":\"` when the record travels as an escaped string, or `": "` when a store
    // wrote the JSON back in its own layout (PostgreSQL's jsonb).
    let quote = rest
        .iter()
        .take(9)
        .position(|b| !matches!(*b, b'"' | b'\\' | b':' | b' '))?;
    if !rest[..quote].contains(&b':') {
        return None;
    }
    let letters = rest[quote..]
        .iter()
        .take_while(|b| b.is_ascii_lowercase())
        .count();
    Some(pad_digest(&rest[quote..quote + letters]))
}

#[derive(Debug, Default)]
pub struct Received {
    /// One per harness id found in a message (a message that batches several records gives
    /// several), and one with no id per message that carries none.
    pub arrivals: Vec<Arrival>,
    /// Set when the reader lost its connection: it may have missed copies.
    pub verifier_fault: Option<String>,
    /// The first few messages that carried no harness id (an engine's status or retained
    /// messages), shortened, for the report.
    pub unexpected_examples: Vec<String>,
    /// Where the destination is drill's own and sees attempts (HTTP): the write keys of
    /// requests that arrived while an earlier request with the same key was unanswered and its
    /// connection still open, in arrival order. `None` where the destination cannot tell.
    pub overlapping_keys: Option<Vec<String>>,
    /// Where drill answers for the destination: the ids of records a destination fault
    /// refused for good (withheld, never stored) — each is expected failed unless a later
    /// write stored it.
    pub refused_by_destination: Vec<String>,
}

/// How many messages without a harness id the report quotes.
const UNEXPECTED_EXAMPLES: usize = 5;

/// Finds the harness ids and the write key in whatever the engine made of a record.
///
/// Engines wrap payloads (a syslog header, a JSON envelope, a renamed field) and some batch
/// several records into one message, so ids are searched as text: every `<run>/k<N>/<seq>` in
/// the payload counts once per message, wherever it sits. The write key is taken from where
/// the scenario says the engine puts it, and is absent otherwise.
/// A payload that is a JSON object with a string `id` counts that id when no harness id of the
/// run is found in it (drill's engine tests send such records).
#[derive(Debug, Clone)]
pub struct Decoder {
    /// `<run>/`, the prefix of every harness id of this drill.
    run: String,
    write_key: Option<WriteKeyPlace>,
}

impl Decoder {
    pub fn new(run: &str, write_key: Option<WriteKeyPlace>) -> Decoder {
        Decoder {
            run: format!("{run}/"),
            write_key,
        }
    }

    /// Reads the JSON `id` and the write key where drill's own engine puts it.
    pub fn builtin(write_key: WriteKeyPlace) -> Decoder {
        Decoder {
            run: String::new(),
            write_key: Some(write_key),
        }
    }

    /// Whether an id of this drill's run is anywhere in `payload` (a row of a user's table
    /// may belong to another run, or to no drill at all).
    pub fn has_run_id(&self, payload: &[u8]) -> bool {
        !self.run_ids(payload).is_empty()
    }

    /// Every distinct harness id in `payload`, in order of appearance.
    pub fn ids(&self, payload: &[u8]) -> Vec<String> {
        self.ids_at(payload).into_iter().map(|(id, _)| id).collect()
    }

    /// Every distinct harness id in `payload`, with where its first occurrence ends (`None`:
    /// taken from a JSON `id` field, not found in place).
    fn ids_at(&self, payload: &[u8]) -> Vec<(String, Option<usize>)> {
        let mut ids: Vec<(String, Option<usize>)> = self
            .run_ids(payload)
            .into_iter()
            .map(|(id, end)| (id, Some(end)))
            .collect();
        if ids.is_empty()
            && let Some(id) = serde_json::from_slice::<serde_json::Value>(payload)
                .ok()
                .and_then(|v| v.get("id")?.as_str().map(str::to_string))
        {
            ids.push((id, None));
        }
        ids
    }

    /// The run's ids in `payload`, each with the byte offset where it ends.
    fn run_ids(&self, payload: &[u8]) -> Vec<(String, usize)> {
        let mut ids: Vec<(String, usize)> = Vec::new();
        if self.run.is_empty() {
            return ids;
        }
        // Offsets are into `payload` itself: the search runs over its bytes (an id is ASCII).
        let text = payload;
        let mut rest: &[u8] = text;
        let finder = memchr::memmem::Finder::new(self.run.as_bytes());
        let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
        while let Some(i) = finder.find(rest) {
            let after = &rest[i + self.run.len()..];
            let parsed = after.strip_prefix(b"k").and_then(|k| {
                let n = digits(k);
                let seq_part = k[n..].strip_prefix(b"/")?;
                let m = digits(seq_part);
                (n > 0 && m > 0).then(|| self.run.len() + 1 + n + 1 + m)
            });
            match parsed {
                Some(len) => {
                    let id = String::from_utf8_lossy(&rest[i..i + len]).into_owned();
                    let end = text.len() - rest.len() + i + len;
                    if !ids.iter().any(|(x, _)| *x == id) {
                        ids.push((id, end));
                    }
                    rest = &rest[i + len..];
                }
                None => rest = after,
            }
        }
        ids
    }

    /// Adds one message to `into`: an arrival per id, or one without an id. `meta` reads a
    /// value of the message's metadata by name (the kind's reader knows how).
    pub fn add(
        &self,
        payload: &[u8],
        meta: impl Fn(&str) -> Option<String>,
        at: Duration,
        into: &mut Received,
    ) {
        let write_key = match &self.write_key {
            None => None,
            Some(WriteKeyPlace::JsonField(path)) => {
                serde_json::from_slice::<serde_json::Value>(payload)
                    .ok()
                    .and_then(|v| {
                        let field = path.split('.').try_fold(&v, |v, part| v.get(part))?;
                        Some(match field {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        })
                    })
            }
            Some(WriteKeyPlace::Meta(name)) => meta(name),
        };
        let ids = self.ids_at(payload);
        if ids.is_empty() {
            if into.unexpected_examples.len() < UNEXPECTED_EXAMPLES {
                let text = String::from_utf8_lossy(payload);
                let short: String = text.chars().take(120).collect();
                into.unexpected_examples.push(short);
            }
            into.arrivals.push(Arrival {
                id: None,
                write_key,
                at,
                pad: None,
            });
            return;
        }
        for (id, end) in ids {
            into.arrivals.push(Arrival {
                id: Some(id),
                write_key: write_key.clone(),
                at,
                pad: end.and_then(|end| pad_after(payload, end)),
            });
        }
    }
}

/// How the verifier reaches a broker the user runs: its credentials, and where the drill's
/// records begin (what was there before is not the drill's and is not read).
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub secrets: Secrets,
    /// NATS: the stream's first sequence of this drill.
    pub first_sequence: Option<u64>,
    /// Kafka: each partition's end offset when the drill started.
    pub offsets: Vec<(i32, i64)>,
    /// Syslog: the file the receiver writes every message to, one per line (drill's own
    /// rsyslog's, or the one `read_back.file` names).
    pub received_file: Option<std::path::PathBuf>,
    /// The broker speaks TLS: the CA drill trusts it by (and the client certificate, for
    /// mutual TLS). The readers and the engine's output use the same.
    pub tls: Option<crate::tls::TlsConfig>,
}

impl Access {
    /// The client side of TLS for a reader, when the broker speaks TLS.
    pub fn client_tls(&self) -> Result<Option<crate::tls::ClientTls>, String> {
        self.tls
            .as_ref()
            .map(crate::tls::ClientTls::new)
            .transpose()
    }
}

/// The reconciliation of one drill, by harness id.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Reconciliation {
    /// Records the source was told were accepted.
    pub accepted: u64,
    /// Accepted records found at the destination (at least one copy).
    pub delivered: u64,
    /// Accepted records not found at the destination (not counting `destroyed`).
    pub missing: u64,
    /// Accepted records not found at the destination that a source fault destroyed before
    /// the engine read them.
    pub destroyed: u64,
    /// Ids of the first of them, for the report.
    pub destroyed_examples: Vec<String>,
    /// Extra copies beyond the first, over all records.
    pub duplicates: u64,
    /// Extra copies carrying the original's write key (a resend the engine knew about).
    pub duplicates_same_key: u64,
    /// Extra copies without it (a resend the engine could not tell apart): worse.
    pub duplicates_other_key: u64,
    /// Per key, first copies that arrived after a later sequence of the same key.
    pub reordered: u64,
    /// Copies at the destination of records never handed to the engine (or unreadable).
    pub unexpected: u64,
    /// Ingests whose answer was lost.
    pub ingest_unknown: u64,
    /// … of which found at the destination.
    pub recovered: u64,
    /// … of which not found (the engine did not take them).
    pub not_accepted: u64,
    /// Records the engine answered no to (e.g. its disk was full): the source keeps them;
    /// not part of `held`.
    pub ingest_refused: u64,
    /// The engine's first such answer, for the report.
    pub ingest_refused_example: Option<String>,
    /// The most copies of any one record at the destination (0 when nothing arrived).
    pub max_copies: u64,
    /// Ids of the first missing records, for the report.
    pub missing_examples: Vec<String>,
    /// Ids that arrived more than once, for the report.
    pub duplicate_examples: Vec<String>,
    /// Copies whose record arrived with other bytes than the source sent (its `pad` differs):
    /// a torn or truncated record passed on as if whole.
    pub altered: u64,
    /// Ids of the first altered copies, for the report.
    pub altered_examples: Vec<String>,
}

/// Compares what the source sent with what arrived.
pub fn reconcile(sent: &Sent, received: &Received) -> Reconciliation {
    // One pass over the arrivals with one index from id to record; per record only counters in
    // flat arrays (copies, the first copy, copies carrying the original's write key). Ten
    // million arrivals stay within seconds and a few hundred MB (`drill bench engine`).
    let index: FxHashMap<&str, u32> = sent
        .order
        .iter()
        .enumerate()
        .map(|(i, (r, _))| (r.id.as_str(), i as u32))
        .collect();
    let n = sent.order.len();
    let mut copies = vec![0u32; n];
    let mut first = vec![u32::MAX; n];
    let mut same_key = vec![0u32; n];
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut rec = Reconciliation::default();
    for (at, a) in received.arrivals.iter().enumerate() {
        let Some(i) =
            a.id.as_deref()
                .and_then(|id| index.get(id))
                .map(|i| *i as usize)
        else {
            rec.unexpected += 1;
            continue;
        };
        let (record, ingested) = &sent.order[i];
        if a.pad
            .is_some_and(|p| p != pad_digest(record.pad.as_bytes()))
        {
            rec.altered += 1;
            if rec.altered_examples.len() < 10 {
                rec.altered_examples.push(record.id.clone());
            }
        }
        if copies[i] == 0 {
            first[i] = at as u32;
            // Order among first copies, per key.
            let top = highest.entry(record.key.as_str()).or_insert(record.seq);
            if record.seq < *top {
                rec.reordered += 1;
            } else {
                *top = record.seq;
            }
        } else {
            // The key the ingest answered, else the first copy's (an engine whose ingest does
            // not tell its keys, or a source that never learnt it).
            let first_key = received.arrivals[first[i] as usize].write_key.as_deref();
            let original = match ingested {
                Ingested::Accepted { write_key, .. } => write_key.as_deref().or(first_key),
                _ => first_key,
            };
            if original.is_some() && a.write_key.as_deref() == original {
                same_key[i] += 1;
            }
        }
        copies[i] += 1;
    }
    tally(sent, &copies, &same_key, &mut rec);
    rec
}

/// The second phase of [`reconcile`]: each record's copies (and copies with the original's
/// write key) counted into missing, delivered, duplicates and the ingest's answers.
fn tally(sent: &Sent, copies: &[u32], same_key: &[u32], rec: &mut Reconciliation) {
    for (i, (record, ingested)) in sent.order.iter().enumerate() {
        let (found, extra, same) = (
            u64::from(copies[i]),
            u64::from(copies[i].saturating_sub(1)),
            u64::from(same_key[i]),
        );
        match ingested {
            Ingested::Accepted { .. } => {
                rec.accepted += 1;
                if found == 0 && sent.destroyed.contains(&record.id) {
                    rec.destroyed += 1;
                    if rec.destroyed_examples.len() < 10 {
                        rec.destroyed_examples.push(record.id.clone());
                    }
                    continue;
                }
                if found == 0 {
                    rec.missing += 1;
                    if rec.missing_examples.len() < 10 {
                        rec.missing_examples.push(record.id.clone());
                    }
                    continue;
                }
                rec.delivered += 1;
                rec.max_copies = rec.max_copies.max(found);
                if extra > 0 {
                    rec.duplicates += extra;
                    rec.duplicates_same_key += same;
                    rec.duplicates_other_key += extra - same;
                    if rec.duplicate_examples.len() < 10 {
                        rec.duplicate_examples.push(record.id.clone());
                    }
                }
            }
            Ingested::Unknown { .. } => {
                rec.ingest_unknown += 1;
                if found == 0 {
                    rec.not_accepted += 1;
                    continue;
                }
                rec.recovered += 1;
                rec.duplicates += extra;
                rec.duplicates_same_key += same;
                rec.duplicates_other_key += extra - same;
            }
            Ingested::NotAccepted { why, .. } => {
                rec.ingest_refused += 1;
                if rec.ingest_refused_example.is_none() {
                    rec.ingest_refused_example = Some(why.clone());
                }
                // The source was told no: a copy at the destination is unexpected.
                rec.unexpected += found;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Record;

    fn record(key: &str, seq: u64) -> Record {
        Record {
            id: format!("r/{key}/{seq}"),
            key: key.to_string(),
            seq,
            index: 0,
            pad: String::new(),
        }
    }

    fn arrival(key: &str, seq: u64, wk: &str) -> Arrival {
        Arrival {
            id: Some(format!("r/{key}/{seq}")),
            write_key: Some(wk.to_string()),
            at: Duration::ZERO,
            pad: None,
        }
    }

    fn accepted(wk: &str) -> Ingested {
        Ingested::Accepted {
            write_key: Some(wk.to_string()),
            at: Duration::ZERO,
        }
    }

    #[test]
    fn counts_missing_duplicates_reordered_and_unknowns() {
        let sent = Sent {
            destroyed: Default::default(),
            order: vec![
                (record("a", 0), accepted("w0")),
                (record("a", 1), accepted("w1")),
                (record("a", 2), accepted("w2")),
                (record("b", 0), accepted("w3")),
                (record("b", 1), Ingested::Unknown { at: Duration::ZERO }),
                (record("b", 2), Ingested::Unknown { at: Duration::ZERO }),
                (
                    record("d", 0),
                    Ingested::NotAccepted {
                        at: Duration::ZERO,
                        why: "HTTP 507: disk full".to_string(),
                    },
                ),
                (
                    record("d", 1),
                    Ingested::NotAccepted {
                        at: Duration::ZERO,
                        why: "HTTP 507: later".to_string(),
                    },
                ),
            ],
        };
        let received = Received {
            arrivals: vec![
                arrival("a", 1, "w1"),
                arrival("a", 0, "w0"), // reordered
                arrival("a", 1, "w1"), // duplicate, same key
                arrival("a", 1, "zz"), // duplicate, other key
                arrival("b", 1, "w9"), // unknown ingest, recovered
                arrival("c", 0, "w8"), // unexpected
            ],
            ..Received::default()
        };
        let r = reconcile(&sent, &received);
        assert_eq!(r.accepted, 4);
        assert_eq!(r.delivered, 2);
        assert_eq!(r.missing, 2);
        assert_eq!(
            (r.duplicates, r.duplicates_same_key, r.duplicates_other_key),
            (2, 1, 1)
        );
        assert_eq!(r.reordered, 1);
        assert_eq!(r.unexpected, 1);
        // Refused at ingest: counted apart from `held`, with the engine's first answer.
        assert_eq!(r.ingest_refused, 2);
        assert_eq!(
            r.ingest_refused_example.as_deref(),
            Some("HTTP 507: disk full")
        );
        assert_eq!((r.ingest_unknown, r.recovered, r.not_accepted), (2, 1, 1));
    }

    #[test]
    fn ids_are_found_wrapped_nested_and_batched() {
        let d = Decoder::new("run-7", None);
        // A syslog-style header around the JSON record.
        assert_eq!(
            d.ids(br#"<13>Nov 30 host app: {"id":"run-7/k3/12","pad":"x"}"#),
            vec!["run-7/k3/12"]
        );
        // Nested in an envelope, and a whole NDJSON body as one message (each id once).
        let batch =
            b"{\"data\":{\"record\":{\"id\":\"run-7/k0/1\"}}}\n{\"id\":\"run-7/k1/0\"} run-7/k0/1";
        assert_eq!(d.ids(batch), vec!["run-7/k0/1", "run-7/k1/0"]);
        // Another run's ids and half ids are not this drill's.
        assert!(
            d.ids(b"run-77/k1/2 run-7/k/2 run-7/kx run-7/k1/")
                .is_empty()
        );
    }

    #[test]
    fn a_record_that_arrives_with_other_bytes_is_altered() {
        let d = Decoder::new("r", None);
        let mut r = record("k0", 7);
        r.id = "r/k0/7".to_string();
        r.pad = "qwertyuiop".to_string();
        let whole = serde_json::to_vec(&r).unwrap();
        let escaped =
            serde_json::to_vec(&serde_json::json!({ "message": String::from_utf8_lossy(&whole) }))
                .unwrap();
        let mut torn = whole.clone();
        let n = torn.len();
        torn[n - 6..].fill(0);
        let truncated = &whole[..whole.len() - 4];
        // As PostgreSQL's jsonb writes it back: keys sorted, a space after each colon.
        let relaid = br#"{"id": "r/k0/7", "key": "k0", "pad": "qwertyuiop", "seq": 7}"#;
        let mut got = Received::default();
        for payload in [
            &whole[..],
            &escaped,
            &torn,
            truncated,
            br#"{"id":"r/k0/7"}"#,
            relaid,
        ] {
            d.add(payload, |_| None, Duration::ZERO, &mut got);
        }
        let want = Some(pad_digest(b"qwertyuiop"));
        let pads: Vec<bool> = got.arrivals.iter().map(|a| a.pad == want).collect();
        assert_eq!(pads, [true, true, false, false, false, true]);
        assert_eq!(got.arrivals[4].pad, None, "no pad carried: not judged");
        let sent = Sent {
            destroyed: Default::default(),
            order: vec![(r, accepted("w0"))],
        };
        let rec = reconcile(&sent, &got);
        assert_eq!((rec.altered, rec.duplicates), (2, 5));
        assert_eq!(rec.altered_examples, ["r/k0/7", "r/k0/7"]);
    }

    #[test]
    fn a_message_without_an_id_is_one_unexpected_arrival_and_is_quoted() {
        let d = Decoder::new("r", Some(WriteKeyPlace::JsonField("meta.key".to_string())));
        let mut got = Received::default();
        d.add(b"engine status: ok", |_| None, Duration::ZERO, &mut got);
        d.add(
            br#"{"meta":{"key":"w1"},"body":"r/k0/0 r/k0/1"}"#,
            |_| None,
            Duration::ZERO,
            &mut got,
        );
        assert_eq!(got.arrivals.len(), 3);
        assert_eq!(got.arrivals[0].id, None);
        assert_eq!(got.unexpected_examples, vec!["engine status: ok"]);
        assert_eq!(got.arrivals[1].write_key.as_deref(), Some("w1"));
        assert_eq!(got.arrivals[2].id.as_deref(), Some("r/k0/1"));
    }

    #[test]
    fn without_an_ingest_key_duplicates_compare_with_the_first_copy() {
        let sent = Sent {
            destroyed: Default::default(),
            order: vec![
                (
                    record("a", 0),
                    Ingested::Accepted {
                        write_key: None,
                        at: Duration::ZERO,
                    },
                ),
                (
                    record("a", 1),
                    Ingested::Accepted {
                        write_key: None,
                        at: Duration::ZERO,
                    },
                ),
            ],
        };
        let mut no_key = arrival("a", 1, "x");
        no_key.write_key = None;
        let received = Received {
            arrivals: vec![
                arrival("a", 0, "k0"),
                arrival("a", 0, "k0"),
                no_key.clone(),
                no_key,
            ],
            ..Received::default()
        };
        let r = reconcile(&sent, &received);
        assert_eq!(
            (r.duplicates, r.duplicates_same_key, r.duplicates_other_key),
            (2, 1, 1)
        );
    }
}
