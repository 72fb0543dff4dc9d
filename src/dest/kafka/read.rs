//! The Kafka read-back: the whole topic, straight from the broker (it advertises itself; only
//! the engine's link rewrites addresses), read at the end from where the drill began, with the
//! write key from its header. The end offsets the broker reports are not trusted, so nothing is
//! counted while the drill runs.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::dest::ReadBack;
use crate::verify::{Access, Decoder, Received, WriteKeyPlace};

/// A Kafka topic, read whole at the end.
pub struct TopicReader {
    pub topic: String,
    pub t0: std::time::SystemTime,
    pub decoder: Decoder,
    pub access: Access,
}

impl ReadBack for TopicReader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        async { None }.boxed()
    }

    fn finish(self: Box<Self>, addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let Some(&bootstrap) = addrs.first() else {
                return Received {
                    verifier_fault: Some("verifier: no broker address to read from".to_string()),
                    ..Received::default()
                };
            };
            read_topic_with(
                bootstrap,
                &self.topic,
                Duration::from_secs(120),
                Some(self.t0),
                self.decoder,
                self.access,
            )
            .await
            .unwrap_or_else(|e| Received {
                verifier_fault: Some(e),
                ..Received::default()
            })
        }
        .boxed()
    }
}

/// Reads a whole Kafka topic: every partition from the earliest offset until the broker says
/// partition EOF, with the `write-key` header. The end offsets the broker reports are not
/// trusted (the Kafka-protocol broker used here reports stale high watermarks): the reader goes
/// on until every partition reached EOF and then listens one more second; anything that
/// arrives meanwhile re-opens that partition. A reader that stops early would count engine
/// loss that is not there, so a timeout is reported as a *verifier* fault.
///
/// With `t0` (the drill's start as wall time), arrivals are stamped with the record's
/// timestamp relative to `t0`.
pub async fn read_topic(
    bootstrap: SocketAddr,
    topic: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
) -> Result<Received, String> {
    let decoder = Decoder::builtin(WriteKeyPlace::Meta(super::WRITE_KEY_HEADER.to_string()));
    read_topic_with(bootstrap, topic, limit, t0, decoder, Access::default()).await
}

/// [`read_topic`], finding ids and write keys with `decoder`.
pub async fn read_topic_with(
    bootstrap: SocketAddr,
    topic: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
    decoder: Decoder,
    access: Access,
) -> Result<Received, String> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        read_topic_blocking(bootstrap, &topic, limit, t0, &decoder, &access)
    })
    .await
    .map_err(|e| format!("verifier: {e}"))?
}

/// Assigns every partition of `topic` to `consumer`, each from where the drill started (an
/// existing topic's older records are not the drill's); the partitions.
fn assign_from_start(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    access: &Access,
) -> Result<Vec<i32>, String> {
    use rdkafka::consumer::Consumer;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| format!("verifier: metadata of {topic}: {e}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(format!("verifier: topic {topic} has no partitions"));
    }
    let mut assignment = rdkafka::TopicPartitionList::new();
    for &p in &partitions {
        let from = access
            .offsets
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(rdkafka::Offset::Beginning, |(_, o)| {
                rdkafka::Offset::Offset(*o)
            });
        assignment
            .add_partition_offset(topic, p, from)
            .map_err(|e| format!("verifier: {e}"))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("verifier: {e}"))?;
    Ok(partitions)
}

fn read_topic_blocking(
    bootstrap: SocketAddr,
    topic: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
    decoder: &Decoder,
    access: &Access,
) -> Result<Received, String> {
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::error::KafkaError;
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer =
        crate::dest::kafka::client_config(&bootstrap.to_string(), &access.secrets)
            .set("group.id", format!("drill-verifier-{}", std::process::id()))
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .map_err(|e| format!("verifier: {e}"))?;
    let partitions = assign_from_start(&consumer, topic, access)?;
    let t0_ms = t0
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64);
    let started = Instant::now();
    let mut at_eof: HashSet<i32> = HashSet::new();
    let mut all_eof_since: Option<Instant> = None;
    let mut received = Received::default();
    loop {
        if started.elapsed() > limit {
            received.verifier_fault = Some(format!(
                "verifier read {} records from {topic} but {} of {} partitions never reached EOF within {limit:?}",
                received.arrivals.len(),
                partitions.len() - at_eof.len(),
                partitions.len()
            ));
            return Ok(received);
        }
        if let Some(since) = all_eof_since
            && since.elapsed() > Duration::from_secs(1)
        {
            return Ok(received);
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                at_eof.remove(&m.partition());
                all_eof_since = None;
                let at = match (m.timestamp().to_millis(), t0_ms) {
                    (Some(ts), Some(t0)) => {
                        Duration::from_millis(u64::try_from(ts - t0).unwrap_or(0))
                    }
                    _ => started.elapsed(),
                };
                let meta = |name: &str| {
                    m.headers().and_then(|h| {
                        h.iter()
                            .find(|h| h.key == name)
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    })
                };
                decoder.add(m.payload().unwrap_or_default(), meta, at, &mut received);
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_eof.insert(p);
                if at_eof.len() == partitions.len() && all_eof_since.is_none() {
                    all_eof_since = Some(Instant::now());
                }
            }
            Some(Err(e)) => {
                received.verifier_fault = Some(format!("verifier: reading {topic}: {e}"));
                return Ok(received);
            }
            None => {}
        }
    }
}
