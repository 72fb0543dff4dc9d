//! The Kafka-consumer input (`consume:` in `engine.yaml`): reads a topic's one partition in a
//! consumer group and stores each message's value as a record, as the HTTP ingest does.
//!
//! Its read position moves only once the records are safe (docs/src/design.md#rule-1-1): a
//! burst is stored and synced by the writer first, then the position is written to
//! `consume-position.json` in the data folder (durably), then committed to the group (sent,
//! not waited for; an idle consumer sends its position again every 2 s, so a commit the
//! source link lost is made good). On start
//! it resumes at its own position, else the group's committed offset, else the topic's start:
//! its own file is what it knows it stored, so a commit the source link refused never makes it
//! read a record twice. A message stored and not yet written to its position file when the
//! engine dies is read again (a copy, never a loss).
//!
//! It takes the partition by `assign` (no group membership: a restarted engine does not wait
//! for its dead self's session to expire) and commits with the group's id.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::tail::{store_blocking, write_durably};
use super::writer::WriterJob;

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// `consume:` in `engine.yaml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumeConfig {
    /// `host:port` of a broker (drill gives its link `source`).
    pub bootstrap: String,
    pub topic: String,
    pub group: String,
}

/// The position file in the data folder.
pub const POSITION_FILE: &str = "consume-position.json";

/// Most messages stored in one burst.
const BURST: usize = 500;
/// How often an idle consumer commits its position again.
const RECOMMIT: Duration = Duration::from_secs(2);
/// How long one poll waits for a first message.
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
struct Position {
    /// The offset of the next message to store.
    next: i64,
}

/// Starts the consumer on a thread of its own; it ends when `cancel` fires.
pub(super) fn spawn(
    config: ConsumeConfig,
    data_dir: PathBuf,
    writer: mpsc::Sender<WriterJob>,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut input = match Input::new(config, &data_dir, writer) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("drill engine: consume: {e}");
                return;
            }
        };
        while !cancel.is_cancelled() {
            if let Err(e) = input.step() {
                eprintln!("drill engine: consume: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    })
}

struct Input {
    consumer: BaseConsumer,
    topic: String,
    position_path: PathBuf,
    writer: mpsc::Sender<WriterJob>,
    /// Stored (and in the position file) up to here.
    stored: Option<i64>,
    last_commit: Instant,
}

impl Input {
    fn new(
        config: ConsumeConfig,
        data_dir: &Path,
        writer: mpsc::Sender<WriterJob>,
    ) -> Result<Input, String> {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &config.bootstrap)
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "100")
            .set("socket.timeout.ms", "10000")
            // Back within a second of a heal, not librdkafka's 10 s.
            .set("reconnect.backoff.max.ms", "1000")
            .create()
            .map_err(|e| format!("a Kafka consumer: {e}"))?;
        let position_path = data_dir.join(POSITION_FILE);
        let own = std::fs::read(&position_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Position>(&b).ok());
        let start = match own {
            Some(p) => Offset::Offset(p.next),
            None => Offset::Stored,
        };
        let mut assigned = TopicPartitionList::new();
        assigned
            .add_partition_offset(&config.topic, 0, start)
            .map_err(|e| e.to_string())?;
        consumer
            .assign(&assigned)
            .map_err(|e| format!("cannot take {}: {e}", config.topic))?;
        Ok(Input {
            consumer,
            topic: config.topic,
            position_path,
            writer,
            stored: own.map(|p| p.next),
            last_commit: Instant::now(),
        })
    }

    /// One round: a burst of messages stored, its position saved and committed; or, with
    /// nothing new, the last position committed again now and then (a commit is sent, never
    /// waited for: one the source link lost is made good by the next).
    fn step(&mut self) -> Result<(), String> {
        let burst = self.poll_burst();
        let Some((first, next)) = burst.offsets else {
            if let Some(at) = self.stored
                && self.last_commit.elapsed() >= RECOMMIT
            {
                self.commit(at)?;
            }
            return burst.error.map_or(Ok(()), Err);
        };
        #[cfg(feature = "mutants")]
        let early = mutant::is(Mutant::CommitOnPoll);
        #[cfg(not(feature = "mutants"))]
        let early = false;
        if early {
            // Moves its position and commits at poll time, before the records are stored.
            self.save(next)?;
            self.commit(next)?;
        }
        if let Err(e) = store_blocking(&self.writer, burst.body, burst.lines) {
            // Not stored: read them again. The partition is taken anew at the burst's first
            // offset (a local step, unlike a seek, which can time out and leave the consumer
            // past what it never stored).
            self.take_at(first)?;
            return Err(e);
        }
        if !early {
            self.save(next)?;
            self.stored = Some(next);
            self.commit(next)?;
        }
        self.stored = Some(next);
        burst.error.map_or(Ok(()), Err)
    }

    /// Up to [`BURST`] messages: their values as lines, the first offset and the next. An
    /// error ends the burst; what was polled before it is kept (the consumer has moved past it).
    fn poll_burst(&mut self) -> Burst {
        let mut burst = Burst::default();
        let mut wait = POLL;
        while burst.count < BURST {
            let m = match self.consumer.poll(wait) {
                None => break,
                Some(Err(e)) => {
                    burst.error = Some(format!("poll: {e}"));
                    break;
                }
                Some(Ok(m)) => m,
            };
            wait = Duration::ZERO;
            // A value of several lines is several records, as in a file.
            burst
                .body
                .extend_from_slice(m.payload().unwrap_or_default());
            burst.body.push(b'\n');
            burst.count += 1;
            let first = burst.offsets.map_or(m.offset(), |(f, _)| f);
            burst.offsets = Some((first, m.offset() + 1));
        }
        burst.lines = super::tail::lines_of(&burst.body);
        burst
    }

    /// Takes the partition again, fetching from `offset`.
    fn take_at(&self, offset: i64) -> Result<(), String> {
        let mut at = TopicPartitionList::new();
        at.add_partition_offset(&self.topic, 0, Offset::Offset(offset))
            .map_err(|e| e.to_string())?;
        self.consumer
            .assign(&at)
            .map_err(|e| format!("cannot take {} again at {offset}: {e}", self.topic))
    }

    fn save(&self, next: i64) -> Result<(), String> {
        let text = serde_json::to_vec(&Position { next }).map_err(|e| e.to_string())?;
        write_durably(&self.position_path, &text)
    }

    /// Sends a commit of `next` to the group, without waiting for the answer.
    fn commit(&mut self, next: i64) -> Result<(), String> {
        let mut at = TopicPartitionList::new();
        at.add_partition_offset(&self.topic, 0, Offset::Offset(next))
            .map_err(|e| e.to_string())?;
        self.last_commit = Instant::now();
        self.consumer
            .commit(&at, CommitMode::Async)
            .map_err(|e| format!("commit of offset {next}: {e}"))
    }
}

#[derive(Default)]
struct Burst {
    body: Vec<u8>,
    lines: Vec<std::ops::Range<usize>>,
    count: usize,
    offsets: Option<(i64, i64)>,
    error: Option<String>,
}
