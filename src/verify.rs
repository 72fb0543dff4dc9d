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
use rustc_hash::FxHashMap;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::mqtt::{self, Packet, PubAck, PubAckReason};
use crate::scenario::{Secrets, WriteKeyPlace};
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
    /// One per harness id found in a message (a message that batches several records gives
    /// several), and one with no id per message that carries none.
    pub arrivals: Vec<Arrival>,
    /// Set when the reader lost its connection: it may have missed copies.
    pub verifier_fault: Option<String>,
    /// The first few messages that carried no harness id (an engine's status or retained
    /// messages), shortened, for the report.
    pub unexpected_examples: Vec<String>,
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

    /// Every distinct harness id in `payload`, in order of appearance.
    pub fn ids(&self, payload: &[u8]) -> Vec<String> {
        let mut ids = self.run_ids(payload);
        if ids.is_empty()
            && let Some(id) = serde_json::from_slice::<serde_json::Value>(payload)
                .ok()
                .and_then(|v| v.get("id")?.as_str().map(str::to_string))
        {
            ids.push(id);
        }
        ids
    }

    fn run_ids(&self, payload: &[u8]) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        if self.run.is_empty() {
            return ids;
        }
        let text = String::from_utf8_lossy(payload);
        let mut rest: &str = &text;
        while let Some(i) = rest.find(self.run.as_str()) {
            let after = &rest[i + self.run.len()..];
            let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let parsed = after.strip_prefix('k').and_then(|k| {
                let n = digits(k);
                let seq_part = k[n..].strip_prefix('/')?;
                let m = digits(seq_part);
                (n > 0 && m > 0).then(|| self.run.len() + 1 + n + 1 + m)
            });
            match parsed {
                Some(len) => {
                    let id = &rest[i..i + len];
                    if !ids.iter().any(|x| x == id) {
                        ids.push(id.to_string());
                    }
                    rest = &rest[i + len..];
                }
                None => rest = after,
            }
        }
        ids
    }

    /// Adds one message to `into`: an arrival per id, or one without an id.
    /// `meta` reads the write key from the message's metadata, for the place configured.
    pub fn add(
        &self,
        payload: &[u8],
        meta: impl Fn(&WriteKeyPlace) -> Option<String>,
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
            Some(place) => meta(place),
        };
        let ids = self.ids(payload);
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
            });
            return;
        }
        for id in ids {
            into.arrivals.push(Arrival {
                id: Some(id),
                write_key: write_key.clone(),
                at,
            });
        }
    }
}

/// The MQTT read-back: one subscriber connected directly to the broker.
pub struct Reader {
    pub received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
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
}

impl Reader {
    /// Connects, subscribes to `topic` at QoS 1 and starts recording arrivals relative to `t0`.
    pub async fn start(
        broker: SocketAddr,
        topic: &str,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Result<Reader, mqtt::MqttError> {
        let decoder = Decoder::builtin(WriteKeyPlace::MqttUserProperty(
            mqtt::WRITE_KEY_PROPERTY.to_string(),
        ));
        Reader::start_with(broker, topic, decoder, t0, cancel).await
    }

    /// [`Reader::start`], finding ids and write keys with `decoder`.
    pub async fn start_with(
        broker: SocketAddr,
        topic: &str,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Result<Reader, mqtt::MqttError> {
        Reader::start_as(broker, topic, decoder, t0, cancel, None).await
    }

    /// [`Reader::start_with`], logging in as `login` (an external broker's credentials).
    pub async fn start_as(
        broker: SocketAddr,
        topic: &str,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
        login: Option<mqtt::Login>,
    ) -> Result<Reader, mqtt::MqttError> {
        let limit = Duration::from_secs(10);
        let mut session = mqtt::connect_as(
            broker,
            "drill-verifier",
            Duration::from_secs(60),
            limit,
            login,
        )
        .await?;
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
                            let meta = |place: &WriteKeyPlace| match place {
                                WriteKeyPlace::MqttUserProperty(name) => mqtt::user_property(&p, name),
                                _ => None,
                            };
                            if let Ok(mut r) = sink.lock() { decoder.add(&p.payload, meta, t0.elapsed(), &mut r); }
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
                    unexpected_examples: r.unexpected_examples.clone(),
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
    for (i, (record, ingested)) in sent.order.iter().enumerate() {
        let (found, extra, same) = (
            u64::from(copies[i]),
            u64::from(copies[i].saturating_sub(1)),
            u64::from(same_key[i]),
        );
        match ingested {
            Ingested::Accepted { .. } => {
                rec.accepted += 1;
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
        decoder: Decoder,
        access: Access,
    },
    /// A Kafka topic, read whole from the broker at `bootstrap` at the end (the broker
    /// advertises itself; only the engine's Kafka-aware link rewrites addresses).
    Topic {
        bootstrap: SocketAddr,
        topic: String,
        t0: std::time::SystemTime,
        decoder: Decoder,
        access: Access,
    },
}

impl ReadBack {
    /// Watches a stream (it must exist); `t0` is the drill's start as wall time.
    pub async fn stream(
        servers: Vec<SocketAddr>,
        stream: &str,
        t0: std::time::SystemTime,
        decoder: Decoder,
        access: Access,
    ) -> Result<ReadBack, String> {
        let addrs: Vec<async_nats::ServerAddr> = servers
            .iter()
            .filter_map(|a| format!("nats://{a}").parse().ok())
            .collect();
        let client = crate::brokers::nats_options(&access.secrets)
            .await?
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
            decoder,
            access,
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
                decoder,
                access,
                ..
            } => {
                let mut last = Received::default();
                for server in servers {
                    match read_stream_with(
                        server,
                        &stream,
                        Duration::from_secs(120),
                        Some(t0),
                        &decoder,
                        &access,
                    )
                    .await
                    {
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
                decoder,
                access,
            } => read_topic_with(
                bootstrap,
                &topic,
                Duration::from_secs(120),
                Some(t0),
                decoder,
                access,
            )
            .await
            .unwrap_or_else(|e| Received {
                verifier_fault: Some(e),
                ..Received::default()
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
    read_stream_with(
        server,
        stream,
        limit,
        t0,
        &Decoder::builtin(WriteKeyPlace::NatsMsgId),
        &Access::default(),
    )
    .await
}

/// [`read_stream`], finding ids and write keys with `decoder`.
pub async fn read_stream_with(
    server: SocketAddr,
    stream: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
    decoder: &Decoder,
    access: &Access,
) -> Result<Received, String> {
    use async_nats::jetstream::{self, consumer};
    let client = crate::brokers::nats_options(&access.secrets)
        .await?
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
    let state = handle
        .info()
        .await
        .map_err(|e| format!("verifier: stream {stream} info: {e}"))?
        .state
        .clone();
    // Reading from the drill's first sequence: what the stream holds from there on.
    let (expected, deliver_policy) = match access.first_sequence {
        Some(first) if first > 1 => (
            (state.last_sequence + 1).saturating_sub(first.max(state.first_sequence)),
            consumer::DeliverPolicy::ByStartSequence {
                start_sequence: first,
            },
        ),
        _ => (state.messages, consumer::DeliverPolicy::All),
    };
    let reader: consumer::PullConsumer = handle
        .create_consumer(consumer::pull::Config {
            deliver_policy,
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
    let mut read = 0u64;
    let started = Instant::now();
    while read < expected {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, messages.next()).await {
            Ok(Some(Ok(m))) => {
                read += 1;
                let stored = t0.and_then(|t0| {
                    let at = m.info().ok()?.published.unix_timestamp_nanos();
                    let t0 = t0.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128;
                    Some(Duration::from_nanos(u64::try_from(at - t0).unwrap_or(0)))
                });
                let meta = |place: &WriteKeyPlace| match place {
                    WriteKeyPlace::NatsMsgId => m
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                        .map(|v| v.as_str().to_string()),
                    _ => None,
                };
                decoder.add(
                    &m.payload,
                    meta,
                    stored.unwrap_or_else(|| started.elapsed()),
                    &mut received,
                );
            }
            Ok(Some(Err(e))) => {
                received.verifier_fault = Some(format!("verifier: reading {stream}: {e}"));
                break;
            }
            Ok(None) | Err(_) => {
                received.verifier_fault = Some(format!(
                    "verifier read {read} of the {expected} messages in stream {stream} within {limit:?}"
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
    let decoder = Decoder::builtin(WriteKeyPlace::KafkaHeader("write-key".to_string()));
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

fn read_topic_blocking(
    bootstrap: SocketAddr,
    topic: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
    decoder: &Decoder,
    access: &Access,
) -> Result<Received, String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer =
        crate::brokers::kafka_config(&bootstrap.to_string(), &access.secrets)
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
        // From where the drill started (an existing topic's older records are not its).
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
                let meta = |place: &WriteKeyPlace| match place {
                    WriteKeyPlace::KafkaHeader(name) => m.headers().and_then(|h| {
                        h.iter()
                            .find(|h| h.key == name.as_str())
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    }),
                    _ => None,
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
            write_key: Some(wk.to_string()),
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
