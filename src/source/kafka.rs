//! A Kafka source (`system.ingest: { kind: kafka, topic, group }`): a topic on a
//! Kafka-protocol broker drill starts for the source alone (tansu, in memory), which drill
//! produces every record into and the engine consumes in a consumer group.
//!
//! drill produces straight to the broker: the broker's acknowledgement of a record is what
//! "held" means, as a log file's fsync is for a file source. The engine reaches the broker
//! only through the Kafka-aware link `source` ([`SOURCE_LINK`]), so link faults on `source`
//! cut the engine off its input while drill goes on producing. Each record is its own batch
//! (`batch.num.messages=1`): a consumer that resumes at a committed offset resumes at a batch's
//! start, never in the middle of one (tansu 0.6 answers a fetch that starts inside a batch with
//! the next batch, which would lose records to the broker, not to the engine).
//!
//! The engine's checkpoint is the group's committed offset, read with OffsetFetch (drill never
//! joins the group): every record below it has been passed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::dest::DestError;
use crate::dest::kafka::broker::{LocalKafka, start_kafka};
use crate::dest::kafka::topic::create_topic;
use crate::proxy::Link;
use crate::scenario::source::{KafkaSourceSpec, SOURCE_DIR, SOURCE_LINK};
use crate::workload::{IngestAnswer, Record};

/// How long drill waits for the broker to take one record.
const PRODUCE_LIMIT: Duration = Duration::from_secs(10);
/// How long one look at the group's offsets or the topic's end may take.
const LOOK_LIMIT: Duration = Duration::from_secs(5);

/// Whether a failed produce means the record is not in the topic: the broker said no to it, or
/// it never left drill. Any other failure (a timeout, a lost connection) is unknown.
fn refused(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        code,
        C::QueueFull
            | C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidRecord
            | C::UnknownTopicOrPartition
            | C::UnknownTopic
            | C::UnknownPartition
    )
}

/// drill's producer (each record its own batch) and the client that reads the group's
/// committed offset and the topic's end.
fn clients(
    addr: SocketAddr,
    spec: &KafkaSourceSpec,
) -> Result<(FutureProducer, BaseConsumer), DestError> {
    let producer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", addr.to_string())
        .set("batch.num.messages", "1")
        .set("linger.ms", "0")
        .set("acks", "all")
        .set("enable.idempotence", "false")
        .set("message.timeout.ms", PRODUCE_LIMIT.as_millis().to_string())
        .create()
        .map_err(|e| DestError::Missing(format!("a Kafka producer for the source: {e}")))?;
    let looker = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", addr.to_string())
        .set("group.id", &spec.group)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| DestError::Missing(format!("a Kafka client for the source: {e}")))?;
    Ok((producer, looker))
}

/// The source topic, its broker and what drill produced into it. Cheap to clone.
#[derive(Clone)]
pub struct KafkaSource {
    inner: Arc<Inner>,
}

struct Inner {
    spec: KafkaSourceSpec,
    /// The broker itself (drill's side: never through the link).
    addr: SocketAddr,
    broker: tokio::sync::Mutex<Option<LocalKafka>>,
    producer: FutureProducer,
    /// A client in the group's name (never joining it) that reads its committed offset and the
    /// topic's end; kept warm, as the chart asks every second.
    looker: Arc<BaseConsumer>,
    /// Each record's offset in the topic's one partition.
    offsets: Mutex<BTreeMap<i64, String>>,
    version: String,
}

impl KafkaSource {
    /// Starts the source's broker below `{work}/source/`, the link `source` in front of it,
    /// and the topic (one partition: tansu does not create topics by itself).
    pub async fn start(
        work: &Path,
        spec: &KafkaSourceSpec,
        cancel: CancellationToken,
    ) -> Result<(KafkaSource, Link), DestError> {
        let folder = work.join(SOURCE_DIR);
        std::fs::create_dir_all(&folder)?;
        let mut broker = start_kafka(&folder, None, None).await?;
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let link = match Link::start_kafka(SOURCE_LINK, any, broker.addr, cancel).await {
            Ok(l) => l,
            Err(e) => {
                broker.stop().await;
                return Err(e.into());
            }
        };
        if let Err(e) = create_topic(broker.addr, &spec.topic, 1).await {
            broker.stop().await;
            link.shutdown().await;
            return Err(e.into());
        }
        let clients = clients(broker.addr, spec);
        let (producer, looker) = match clients {
            Ok(c) => c,
            Err(e) => {
                broker.stop().await;
                link.shutdown().await;
                return Err(e);
            }
        };
        let source = KafkaSource {
            inner: Arc::new(Inner {
                looker: Arc::new(looker),
                spec: spec.clone(),
                addr: broker.addr,
                version: broker.version.clone(),
                broker: tokio::sync::Mutex::new(Some(broker)),
                producer,
                offsets: Mutex::new(BTreeMap::new()),
            }),
        };
        Ok((source, link))
    }

    /// One line for the drill's output and the report.
    pub fn describe(&self) -> String {
        format!(
            "source: Kafka topic `{}` (1 partition) on {} at {}, consumed by the engine in group `{}` through the link `{SOURCE_LINK}`; drill produces to the broker itself",
            self.inner.spec.topic, self.inner.version, self.inner.addr, self.inner.spec.group
        )
    }

    /// Produces `records` into the topic, one batch each; the broker's acknowledgement means
    /// held, a refusal not accepted, no answer within [`PRODUCE_LIMIT`] unknown.
    pub async fn write(&self, records: &[Record]) -> Vec<IngestAnswer> {
        let sends = records.iter().map(|r| async move {
            let payload = serde_json::to_vec(r).unwrap_or_default();
            let to = FutureRecord::to(&self.inner.spec.topic)
                .payload(&payload)
                .key(r.key.as_bytes())
                .partition(0);
            match self.inner.producer.send(to, PRODUCE_LIMIT).await {
                Ok(delivery) => {
                    self.lock().insert(delivery.offset, r.id.clone());
                    IngestAnswer::Accepted(None)
                }
                Err((rdkafka::error::KafkaError::MessageProduction(code), _)) if refused(code) => {
                    IngestAnswer::NotAccepted(format!("the source broker refused it: {code}"))
                }
                // A timeout or a lost connection: the broker may have appended it.
                Err(_) => IngestAnswer::Unknown,
            }
        });
        futures::future::join_all(sends).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, String>> {
        self.inner
            .offsets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The group's committed offset in the partition (`None`: nothing committed yet).
    pub async fn committed(&self) -> Result<Option<i64>, String> {
        let (looker, topic, group) = (
            self.inner.looker.clone(),
            self.inner.spec.topic.clone(),
            self.inner.spec.group.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let mut asked = TopicPartitionList::new();
            asked.add_partition(&topic, 0);
            let got = looker
                .committed_offsets(asked, LOOK_LIMIT)
                .map_err(|e| format!("the group `{group}`'s committed offsets: {e}"))?;
            Ok(got
                .find_partition(&topic, 0)
                .and_then(|p| match p.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                }))
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Where the topic ends: the offset the next record gets.
    async fn end(&self) -> Result<i64, String> {
        let (looker, topic) = (self.inner.looker.clone(), self.inner.spec.topic.clone());
        tokio::task::spawn_blocking(move || {
            looker
                .fetch_watermarks(&topic, 0, LOOK_LIMIT)
                .map(|(_, high)| high)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Whether the engine's group has committed everything drill produced (the drain waits
    /// for it: an engine that consumed nothing yet is not idle).
    pub async fn read_to_end(&self) -> bool {
        match (self.committed().await, self.end().await) {
            (Ok(Some(at)), Ok(end)) => at >= end,
            (Ok(None), Ok(0)) => true,
            _ => false,
        }
    }

    /// Records at or past the group's committed offset (all of them before its first commit).
    pub async fn unread(&self) -> Option<u64> {
        let end = self.end().await.ok()?;
        let at = self.committed().await.ok()?.unwrap_or(0);
        Some(end.saturating_sub(at).max(0) as u64)
    }

    /// The records a committed offset `at` has passed: those at lower offsets.
    pub fn passed_by(&self, at: i64) -> BTreeSet<String> {
        self.lock().range(..at).map(|(_, id)| id.clone()).collect()
    }

    /// Stops the source's broker.
    pub async fn stop(&self) {
        if let Some(mut b) = self.inner.broker.lock().await.take() {
            b.stop().await;
        }
    }
}
