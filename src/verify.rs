//! Reading back and reconciling: what reached the destination, by harness id.
//!
//! The [`Reader`] subscribes straight to the broker (never through the proxy) before the
//! workload starts, and records every copy it receives with its write key. [`reconcile`] then
//! compares what the source was told was accepted with what arrived: missing, duplicates (with
//! and without the original's write key), reordered (per key), unexpected, and the fate of
//! ingests whose answer was lost. If the reader itself lost its connection, that is a *verifier*
//! fault and is reported as such — never as engine loss. [`read_stream`] reads a whole JetStream
//! stream the same way, straight from the server.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::mqtt::{self, Packet, PubAck, PubAckReason};
use crate::workload::{Ingested, Sent};

/// One copy seen at the destination.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub id: Option<String>,
    pub write_key: Option<String>,
    pub at: Duration,
}

#[derive(Debug, Default)]
pub struct Received {
    pub arrivals: Vec<Arrival>,
    /// Set when the reader lost its connection: it may have missed copies.
    pub verifier_fault: Option<String>,
}

/// The MQTT read-back: one subscriber connected directly to the broker.
pub struct Reader {
    pub received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    /// Connects, subscribes to `topic` at QoS 1 and starts recording arrivals relative to `t0`.
    pub async fn start(
        broker: SocketAddr,
        topic: &str,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Result<Reader, mqtt::MqttError> {
        let limit = Duration::from_secs(10);
        let mut session =
            mqtt::connect(broker, "drill-verifier", Duration::from_secs(60), limit).await?;
        session.subscribe(topic, limit).await?;
        let received = Arc::new(Mutex::new(Received::default()));
        let sink = received.clone();
        let task = tokio::spawn(async move {
            let (mut tx, mut rx) = session.framed.split();
            let mut ping = tokio::time::interval(Duration::from_secs(20));
            let fault = loop {
                tokio::select! {
                    packet = rx.next() => match packet {
                        Some(Ok(mqtt::Inbound::Packet(Packet::Publish(p)))) => {
                            let id = serde_json::from_slice::<serde_json::Value>(&p.payload)
                                .ok()
                                .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string));
                            let arrival = Arrival { id, write_key: mqtt::write_key_of(&p), at: t0.elapsed() };
                            if let Ok(mut r) = sink.lock() { r.arrivals.push(arrival); }
                            if p.pkid != 0 {
                                let ack = PubAck { pkid: p.pkid, reason: PubAckReason::Success, properties: None };
                                if let Err(e) = tx.send(Packet::PubAck(ack)).await {
                                    break Some(format!("verifier could not acknowledge: {e}"));
                                }
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => break Some(format!("verifier connection error: {e}")),
                        None => break Some("verifier connection closed by the broker".to_string()),
                    },
                    _ = ping.tick() => {
                        if let Err(e) = tx.send(Packet::PingReq(mqtt::PingReq)).await {
                            break Some(format!("verifier ping failed: {e}"));
                        }
                    }
                    _ = cancel.cancelled() => break None,
                }
            };
            if let Some(f) = fault
                && let Ok(mut r) = sink.lock()
            {
                r.verifier_fault = Some(f);
            }
        });
        Ok(Reader { received, task })
    }

    pub fn count(&self) -> usize {
        self.received.lock().map(|r| r.arrivals.len()).unwrap_or(0)
    }

    pub async fn stop(self) -> Received {
        self.task.abort();
        let _ = self.task.await;
        match Arc::try_unwrap(self.received) {
            Ok(m) => m.into_inner().unwrap_or_default(),
            Err(shared) => {
                let r = shared.lock().map(|r| Received {
                    arrivals: r.arrivals.clone(),
                    verifier_fault: r.verifier_fault.clone(),
                });
                r.unwrap_or_default()
            }
        }
    }
}

/// The reconciliation of one drill, by harness id.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Reconciliation {
    /// Records the source was told were accepted.
    pub accepted: u64,
    /// Accepted records found at the destination (at least one copy).
    pub delivered: u64,
    /// Accepted records not found at the destination.
    pub missing: u64,
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
    /// Ids of the first missing records, for the report.
    pub missing_examples: Vec<String>,
    /// Ids that arrived more than once, for the report.
    pub duplicate_examples: Vec<String>,
}

/// Compares what the source sent with what arrived.
pub fn reconcile(sent: &Sent, received: &Received) -> Reconciliation {
    let by_id = sent.by_id();
    let mut copies: HashMap<&str, Vec<&Arrival>> = HashMap::new();
    let mut rec = Reconciliation::default();
    for a in &received.arrivals {
        match a.id.as_deref() {
            Some(id) if by_id.contains_key(id) => copies.entry(id).or_default().push(a),
            _ => rec.unexpected += 1,
        }
    }
    let mut seen_first: HashSet<&str> = HashSet::new();
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let seq_of: HashMap<&str, (&str, u64)> = sent
        .order
        .iter()
        .map(|(r, _)| (r.id.as_str(), (r.key.as_str(), r.seq)))
        .collect();
    for a in &received.arrivals {
        let Some(id) = a.id.as_deref() else { continue };
        let Some(&(key, seq)) = seq_of.get(id) else {
            continue;
        };
        if !seen_first.insert(id) {
            continue;
        }
        let top = highest.entry(key).or_insert(seq);
        if seq < *top {
            rec.reordered += 1;
        } else {
            *top = seq;
        }
    }
    for (record, ingested) in &sent.order {
        let found = copies.get(record.id.as_str());
        match ingested {
            Ingested::Accepted { write_key, .. } => {
                rec.accepted += 1;
                match found {
                    Some(c) => {
                        rec.delivered += 1;
                        let extra = c.len() as u64 - 1;
                        if extra > 0 {
                            rec.duplicates += extra;
                            let same = c[1..]
                                .iter()
                                .filter(|a| a.write_key.as_deref() == Some(write_key.as_str()))
                                .count() as u64;
                            rec.duplicates_same_key += same;
                            rec.duplicates_other_key += extra - same;
                            if rec.duplicate_examples.len() < 10 {
                                rec.duplicate_examples.push(record.id.clone());
                            }
                        }
                    }
                    None => {
                        rec.missing += 1;
                        if rec.missing_examples.len() < 10 {
                            rec.missing_examples.push(record.id.clone());
                        }
                    }
                }
            }
            Ingested::Unknown { .. } => {
                rec.ingest_unknown += 1;
                match found {
                    Some(c) => {
                        rec.recovered += 1;
                        // The source never learnt the write key: compare with the first copy's.
                        let extra = c.len() as u64 - 1;
                        let same = c[1..]
                            .iter()
                            .filter(|a| a.write_key.is_some() && a.write_key == c[0].write_key)
                            .count() as u64;
                        rec.duplicates += extra;
                        rec.duplicates_same_key += same;
                        rec.duplicates_other_key += extra - same;
                    }
                    None => rec.not_accepted += 1,
                }
            }
            Ingested::NotAccepted { .. } => {
                // The source was told no: a copy at the destination is unexpected.
                if let Some(c) = found {
                    rec.unexpected += c.len() as u64;
                }
            }
        }
    }
    rec
}

/// The read-back side of a drill: a live MQTT subscriber, or a JetStream stream read whole once
/// the drill has drained. Both connect to the broker directly, never through the proxy.
pub enum ReadBack {
    Mqtt(Reader),
    Stream {
        /// Every node (a cluster's read-back goes to whichever answers).
        servers: Vec<SocketAddr>,
        stream: String,
        js: Box<async_nats::jetstream::Context>,
        t0: std::time::SystemTime,
    },
    /// A Kafka topic, read whole through `bootstrap` at the end (the broker advertises the
    /// proxy's address, so that is where every client goes; the runner heals the link first).
    Topic {
        bootstrap: SocketAddr,
        topic: String,
        t0: std::time::SystemTime,
    },
}

impl ReadBack {
    /// Watches a stream (it must exist); `t0` is the drill's start as wall time.
    pub async fn stream(
        servers: Vec<SocketAddr>,
        stream: &str,
        t0: std::time::SystemTime,
    ) -> Result<ReadBack, String> {
        let addrs: Vec<async_nats::ServerAddr> = servers
            .iter()
            .filter_map(|a| format!("nats://{a}").parse().ok())
            .collect();
        let client = async_nats::ConnectOptions::new()
            .name("drill-verifier-count")
            .ignore_discovered_servers()
            .connect(addrs)
            .await
            .map_err(|e| format!("verifier cannot connect to {servers:?}: {e}"))?;
        Ok(ReadBack::Stream {
            servers,
            stream: stream.to_string(),
            js: Box::new(async_nats::jetstream::new(client)),
            t0,
        })
    }

    /// Reads from `servers` from now on (a broker container restarted on a new host port).
    pub fn point_at(&mut self, now: Vec<SocketAddr>) {
        if let ReadBack::Stream { servers, .. } = self {
            *servers = now;
        }
    }

    /// How many copies have arrived so far, where that can be known without reading them
    /// (not for Kafka: its reported end offsets are not trusted).
    pub async fn count(&self) -> Option<usize> {
        match self {
            ReadBack::Mqtt(r) => Some(r.count()),
            // Bounded: a progress line must never wait on a broker that is down.
            ReadBack::Stream { js, stream, .. } => {
                let ask = async {
                    let mut s = js.get_stream(stream).await.ok()?;
                    s.info().await.ok().map(|i| i.state.messages as usize)
                };
                tokio::time::timeout(Duration::from_millis(500), ask)
                    .await
                    .ok()
                    .flatten()
            }
            ReadBack::Topic { .. } => None,
        }
    }

    /// Everything that arrived.
    pub async fn stop(self) -> Received {
        match self {
            ReadBack::Mqtt(r) => r.stop().await,
            ReadBack::Stream {
                servers,
                stream,
                t0,
                ..
            } => {
                let mut last = Received::default();
                for server in servers {
                    match read_stream(server, &stream, Duration::from_secs(120), Some(t0)).await {
                        Ok(r) if r.verifier_fault.is_none() => return r,
                        Ok(r) => last = r,
                        Err(e) => last.verifier_fault = Some(e),
                    }
                }
                last
            }
            ReadBack::Topic {
                bootstrap,
                topic,
                t0,
            } => read_topic(bootstrap, &topic, Duration::from_secs(120), Some(t0))
                .await
                .unwrap_or_else(|e| Received {
                    arrivals: Vec::new(),
                    verifier_fault: Some(e),
                }),
        }
    }
}

/// Reads a whole JetStream stream straight from the server (never through the proxy): every
/// message from the first sequence to the last, with its `Nats-Msg-Id` as the write key. The
/// count read is checked against the stream's own message count; a shortfall is a *verifier*
/// fault, never engine loss.
///
/// With `t0` (the drill's start as wall time), each arrival is stamped with the server's own
/// time of storing it, relative to `t0`; otherwise with the time it was read.
pub async fn read_stream(
    server: SocketAddr,
    stream: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
) -> Result<Received, String> {
    use async_nats::jetstream::{self, consumer};
    let client = async_nats::ConnectOptions::new()
        .name("drill-verifier")
        .ignore_discovered_servers()
        .connect(server.to_string())
        .await
        .map_err(|e| format!("verifier cannot connect to {server}: {e}"))?;
    let js = jetstream::new(client);
    let mut handle = js
        .get_stream(stream)
        .await
        .map_err(|e| format!("verifier: stream {stream}: {e}"))?;
    let expected = handle
        .info()
        .await
        .map_err(|e| format!("verifier: stream {stream} info: {e}"))?
        .state
        .messages;
    let reader: consumer::PullConsumer = handle
        .create_consumer(consumer::pull::Config {
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("verifier: consumer on {stream}: {e}"))?;
    let mut messages = reader
        .messages()
        .await
        .map_err(|e| format!("verifier: reading {stream}: {e}"))?;
    let mut received = Received::default();
    let started = Instant::now();
    while (received.arrivals.len() as u64) < expected {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, messages.next()).await {
            Ok(Some(Ok(m))) => {
                let id = serde_json::from_slice::<serde_json::Value>(&m.payload)
                    .ok()
                    .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string));
                let write_key = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.as_str().to_string());
                let stored = t0.and_then(|t0| {
                    let at = m.info().ok()?.published.unix_timestamp_nanos();
                    let t0 = t0.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128;
                    Some(Duration::from_nanos(u64::try_from(at - t0).unwrap_or(0)))
                });
                received.arrivals.push(Arrival {
                    id,
                    write_key,
                    at: stored.unwrap_or_else(|| started.elapsed()),
                });
            }
            Ok(Some(Err(e))) => {
                received.verifier_fault = Some(format!("verifier: reading {stream}: {e}"));
                break;
            }
            Ok(None) | Err(_) => {
                received.verifier_fault = Some(format!(
                    "verifier read {} of the {expected} messages in stream {stream} within {limit:?}",
                    received.arrivals.len()
                ));
                break;
            }
        }
    }
    Ok(received)
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
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || read_topic_blocking(bootstrap, &topic, limit, t0))
        .await
        .map_err(|e| format!("verifier: {e}"))?
}

fn read_topic_blocking(
    bootstrap: SocketAddr,
    topic: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
) -> Result<Received, String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap.to_string())
        .set("group.id", format!("drill-verifier-{}", std::process::id()))
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(|e| format!("verifier: {e}"))?;
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
        assignment
            .add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .map_err(|e| format!("verifier: {e}"))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("verifier: {e}"))?;
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
                let id = m
                    .payload()
                    .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                    .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string));
                let write_key = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "write-key")
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                });
                let at = match (m.timestamp().to_millis(), t0_ms) {
                    (Some(ts), Some(t0)) => {
                        Duration::from_millis(u64::try_from(ts - t0).unwrap_or(0))
                    }
                    _ => started.elapsed(),
                };
                received.arrivals.push(Arrival { id, write_key, at });
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
        }
    }

    fn accepted(wk: &str) -> Ingested {
        Ingested::Accepted {
            write_key: wk.to_string(),
            at: Duration::ZERO,
        }
    }

    #[test]
    fn counts_missing_duplicates_reordered_and_unknowns() {
        let sent = Sent {
            order: vec![
                (record("a", 0), accepted("w0")),
                (record("a", 1), accepted("w1")),
                (record("a", 2), accepted("w2")),
                (record("b", 0), accepted("w3")),
                (record("b", 1), Ingested::Unknown { at: Duration::ZERO }),
                (record("b", 2), Ingested::Unknown { at: Duration::ZERO }),
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
            verifier_fault: None,
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
        assert_eq!((r.ingest_unknown, r.recovered, r.not_accepted), (2, 1, 1));
    }
}
