//! The workload: seeded records at a fixed rate, posted to the system under test's ingest.
//!
//! Every record carries its harness id in the payload — `<run>/<key>/<sequence>` — so the
//! verifier can reconcile by id whatever the engine does to it. The generator is seeded
//! (SplitMix64): the same seed gives the same keys and payloads. Each record's ingest answer
//! (an [`IngestAnswer`] from its [`Intake`]) is recorded: `accepted` (held, with the write key if the engine
//! told it), `not_accepted`, or `unknown` (the answer was lost — the engine killed
//! mid-request). This module never retries an ingest whose answer is unknown: that would hide
//! exactly what a drill must count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::seed::Seeded;

/// What a scenario's `workload:` asks for, validated.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub rate_per_s: f64,
    pub duration: Duration,
    pub keys: u32,
    pub payload_bytes: usize,
    /// Indices of records the destination will refuse.
    pub poison: Vec<u64>,
}

impl WorkloadSpec {
    /// The broker's message size limit when a drill has poison records: well above every
    /// ordinary record, well below a poison one.
    pub fn message_limit(&self) -> usize {
        (self.payload_bytes * 4).max(16 * 1024)
    }

    /// How large a poison record's payload is made.
    pub fn poison_bytes(&self) -> usize {
        self.message_limit() + 4096
    }
}

impl WorkloadSpec {
    /// How many records a complete run generates.
    pub fn total_records(&self) -> u64 {
        (self.rate_per_s * self.duration.as_secs_f64()).round() as u64
    }
}

/// One generated record.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub id: String,
    pub key: String,
    pub seq: u64,
    /// Position in the whole workload (0-based), i.e. the order of generation.
    #[serde(skip)]
    pub index: u64,
    pub pad: String,
}

/// Generates the records of one run, in order.
pub struct Generator {
    run: String,
    keys: u32,
    payload_bytes: usize,
    poison: std::collections::HashSet<u64>,
    poison_bytes: usize,
    rng: Seeded,
    next_seq: Vec<u64>,
    index: u64,
}

impl Generator {
    pub fn new(run: &str, spec: &WorkloadSpec, seed: u64) -> Generator {
        Generator {
            run: run.to_string(),
            keys: spec.keys,
            payload_bytes: spec.payload_bytes,
            poison: spec.poison.iter().copied().collect(),
            poison_bytes: spec.poison_bytes(),
            rng: Seeded::new(seed),
            next_seq: vec![0; spec.keys as usize],
            index: 0,
        }
    }

    pub fn next_record(&mut self) -> Record {
        let k = self.rng.below(self.keys as u64) as usize;
        let seq = self.next_seq[k];
        self.next_seq[k] += 1;
        let key = format!("k{k}");
        let id = format!("{}/{key}/{seq}", self.run);
        let base = id.len() + key.len() + 40;
        let size = if self.poison.contains(&self.index) {
            self.poison_bytes
        } else {
            self.payload_bytes
        };
        let fill = size.saturating_sub(base);
        let pad: String = (0..fill)
            .map(|_| (b'a' + self.rng.below(26) as u8) as char)
            .collect();
        let index = self.index;
        self.index += 1;
        Record {
            id,
            key,
            seq,
            index,
            pad,
        }
    }
}

/// What the engine said of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestAnswer {
    /// Held, with the write key if the engine told it.
    Accepted(Option<String>),
    /// The answer was lost: the engine may or may not hold it.
    Unknown,
    /// The engine refused it, or the request never reached it.
    NotAccepted(String),
}

/// Where the workload's records go: the system under test's ingest (`sut::Ingest`). One
/// answer per record, in order; an answer that never came is [`IngestAnswer::Unknown`], never
/// retried.
pub trait Intake: Send {
    fn send(&mut self, records: &[Record]) -> impl Future<Output = Vec<IngestAnswer>> + Send;
}

/// What the source knows of one record after posting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingested {
    /// Held, with the write key when the engine told it (drill's own engine does).
    Accepted {
        write_key: Option<String>,
        at: Duration,
    },
    Unknown {
        at: Duration,
    },
    NotAccepted {
        at: Duration,
        why: String,
    },
}

/// Everything the workload sent, by harness id, in generation order.
#[derive(Debug, Default)]
pub struct Sent {
    pub order: Vec<(Record, Ingested)>,
    /// Records a source fault destroyed before the engine read them (a file drill removed or
    /// cut): held, and never the engine's to lose.
    pub destroyed: std::collections::HashSet<String>,
}

impl Sent {
    pub fn accepted(&self) -> impl Iterator<Item = (&Record, Option<&str>, Duration)> {
        self.order.iter().filter_map(|(r, i)| match i {
            Ingested::Accepted { write_key, at } => Some((r, write_key.as_deref(), *at)),
            _ => None,
        })
    }

    pub fn count(&self, pred: impl Fn(&Ingested) -> bool) -> u64 {
        self.order.iter().filter(|(_, i)| pred(i)).count() as u64
    }

    pub fn by_id(&self) -> HashMap<&str, &Ingested> {
        self.order.iter().map(|(r, i)| (r.id.as_str(), i)).collect()
    }
}

/// Hands the workload to `ingest` at the planned rate until its duration has passed. Records
/// go in small batches (whatever fell due since the last one); each gets the answer the
/// ingest gave for it.
pub async fn drive(
    spec: WorkloadSpec,
    run: String,
    seed: u64,
    mut ingest: impl Intake,
    t0: Instant,
    sent: Arc<Mutex<Sent>>,
    cancel: CancellationToken,
) {
    let total = spec.total_records();
    let mut generator = Generator::new(&run, &spec, seed);
    let mut generated = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while generated < total {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        let due = ((t0.elapsed().as_secs_f64() * spec.rate_per_s) as u64).min(total);
        if due <= generated {
            continue;
        }
        let batch: Vec<Record> = (generated..due).map(|_| generator.next_record()).collect();
        generated = due;
        let answers = ingest.send(&batch).await;
        let at = t0.elapsed();
        let mut sent = match sent.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for (r, answer) in batch.into_iter().zip(answers) {
            let ingested = match answer {
                IngestAnswer::Accepted(write_key) => Ingested::Accepted { write_key, at },
                IngestAnswer::Unknown => Ingested::Unknown { at },
                IngestAnswer::NotAccepted(why) => Ingested::NotAccepted { at, why },
            };
            sent.order.push((r, ingested));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_makes_the_same_records() {
        let spec = WorkloadSpec {
            rate_per_s: 10.0,
            duration: Duration::from_secs(1),
            keys: 3,
            payload_bytes: 100,
            poison: vec![5],
        };
        let a: Vec<String> = {
            let mut g = Generator::new("r", &spec, 7);
            (0..20)
                .map(|_| serde_json::to_string(&g.next_record()).unwrap())
                .collect()
        };
        let b: Vec<String> = {
            let mut g = Generator::new("r", &spec, 7);
            (0..20)
                .map(|_| serde_json::to_string(&g.next_record()).unwrap())
                .collect()
        };
        assert_eq!(a, b);
        assert!(a[0].len() >= 90 && a[0].len() <= 110, "{}", a[0].len());
        assert!(a[5].len() > spec.message_limit(), "record 5 is poison");
    }
}
