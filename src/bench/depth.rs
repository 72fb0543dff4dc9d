//! `drill bench engine`, the engine at depth: how fast a held backlog drains to each kind of
//! destination against the raw client library sending the same records to the same broker,
//! how much memory the engine takes while millions of records are held, and how long the
//! verifier takes to reconcile millions of arrivals.
//!
//! Each drain is measured the way a drill meets it: the engine's output link (an in-process
//! [`crate::proxy::Link`]) refuses while `records` are ingested, then heals; the clock runs from
//! the first delivery the engine reports to the last. The raw client then sends the same
//! records (same bytes, same write key carried, same deliveries in flight) to the same broker
//! through the same healed link. This module prints numbers; it asserts nothing.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::BenchError;
use super::engine::record_line;
use crate::brokers;
use crate::engine::{OutputKind, Stats};
use crate::proxy::{Direction, Fault, Link};
use crate::scenario::RuntimeChoice;

fn other(e: impl std::fmt::Display) -> BenchError {
    BenchError::Io(std::io::Error::other(e.to_string()))
}

/// A `drill engine` child, killed on drop.
pub(super) struct EngineChild {
    child: Child,
    pub(super) api: SocketAddr,
}

impl Drop for EngineChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EngineChild {
    /// Starts `drill engine` in `dir` with one output of `kind` at `address`, the kind's own
    /// window (the engine.yaml leaves it out).
    pub(super) fn start(
        drill_exe: &Path,
        dir: &Path,
        kind: &str,
        address: SocketAddr,
        topic: &str,
    ) -> Result<EngineChild, BenchError> {
        std::fs::create_dir_all(dir)?;
        let api = super::free()?;
        let config = dir.join("engine.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: {api}\ndata_dir: {}\noutputs:\n  - {{ name: out, kind: {kind}, address: {address}, topic: {topic}, order: in_order }}\n",
                dir.join("data").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("engine.log"))?;
        let child = Command::new(drill_exe)
            .args(["engine", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let engine = EngineChild { child, api };
        super::wait_listening("drill engine", api)?;
        Ok(engine)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The engine's resident memory, in bytes (`VmRSS`).
    pub(super) fn rss(&self) -> u64 {
        rss_of(self.pid())
    }
}

/// `VmRSS` of a process, in bytes (0 if unreadable).
pub fn rss_of(pid: u32) -> u64 {
    status_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

fn status_field(path: &str, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub(super) async fn stats(http: &reqwest::Client, api: SocketAddr) -> Result<Stats, BenchError> {
    http.get(format!("http://{api}/stats"))
        .send()
        .await
        .map_err(other)?
        .json()
        .await
        .map_err(other)
}

/// Posts `total` records to the engine in batches of `batch` from `clients` concurrent
/// clients. Returns when every batch was answered 200; calls `at_each(held)` after every
/// `every` records.
pub(super) async fn fill(
    http: &reqwest::Client,
    api: SocketAddr,
    total: u64,
    batch: usize,
    clients: usize,
    record_bytes: usize,
) -> Result<(), BenchError> {
    let url = format!("http://{api}/ingest");
    let batches = total.div_ceil(batch as u64);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = FuturesUnordered::new();
    for _ in 0..clients {
        let (http, url, next) = (http.clone(), url.clone(), next.clone());
        tasks.push(async move {
            loop {
                let b = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if b >= batches {
                    return Ok::<(), BenchError>(());
                }
                let from = b * batch as u64;
                let to = (from + batch as u64).min(total);
                let mut body = String::with_capacity((to - from) as usize * (record_bytes + 1));
                for i in from..to {
                    body.push_str(&record_line(i, record_bytes));
                    body.push('\n');
                }
                let answer = http.post(&url).body(body).send().await.map_err(other)?;
                if !answer.status().is_success() {
                    return Err(other(format!("ingest answered {}", answer.status())));
                }
            }
        });
    }
    while let Some(done) = tasks.next().await {
        done?;
    }
    Ok(())
}

/// One drain measurement: records per second, engine and raw client.
pub struct Drain {
    pub kind: &'static str,
    pub records: u64,
    pub engine: Duration,
    /// From the heal to the first delivery (probe, reconnect).
    pub reconnect: Duration,
    pub raw: Duration,
    pub window: usize,
    pub note: String,
}

/// Drains `records` held behind a refused link to a broker of `kind`, then sends the same
/// records with the raw client. `work` holds the brokers' and engines' files.
pub async fn drain(
    drill_exe: &Path,
    work: &Path,
    kind: OutputKind,
    records: u64,
    record_bytes: usize,
) -> Result<Drain, BenchError> {
    let http = reqwest::Client::new();
    let dir = work.join(format!("drain-{kind:?}").to_lowercase());
    std::fs::create_dir_all(&dir)?;
    let any: SocketAddr = "127.0.0.1:0".parse().map_err(other)?;
    let start_link = |upstream: SocketAddr| async move {
        Link::start("bench", any, upstream, CancellationToken::new())
            .await
            .map_err(other)
    };
    let (broker, link, topic, raw_topic, kind_name) = match kind {
        OutputKind::Mqtt => {
            let b = brokers::start_mqtt(RuntimeChoice::Process, &dir, None)
                .await
                .map_err(other)?;
            let link = start_link(b.addr).await?;
            (b, link, "bench/engine", "bench/raw", "mqtt")
        }
        OutputKind::Nats => {
            let port = brokers::free_port()?;
            let link = start_link(([127, 0, 0, 1], port).into()).await?;
            let b = brokers::start_nats(&dir, Some(port), Some(link.listen_addr()))
                .await
                .map_err(other)?;
            for (name, subject) in [("ENGINE", "bench.engine"), ("RAW", "bench.raw")] {
                brokers::create_stream(b.addr, name, subject, Duration::from_secs(120), None, 1)
                    .await
                    .map_err(other)?;
            }
            (b, link, "bench.engine", "bench.raw", "nats")
        }
        OutputKind::Kafka => {
            let port = brokers::free_port()?;
            let link = start_link(([127, 0, 0, 1], port).into()).await?;
            let b = brokers::start_kafka(&dir, Some(port), Some(link.listen_addr()))
                .await
                .map_err(other)?;
            for t in ["bench-engine", "bench-raw"] {
                brokers::create_topic(link.listen_addr(), t, 1)
                    .await
                    .map_err(other)?;
            }
            (b, link, "bench-engine", "bench-raw", "kafka")
        }
    };
    let note = broker.version.clone();
    link.apply_settled(Fault::Refuse, Direction::Both).await;
    let engine = EngineChild::start(
        drill_exe,
        &dir.join("engine"),
        kind_name,
        link.listen_addr(),
        topic,
    )?;
    fill(&http, engine.api, records, 1000, 8, record_bytes).await?;
    let held = stats(&http, engine.api).await?;
    if held.held != records || held.delivered != 0 {
        return Err(other(format!(
            "before the heal the engine holds {} and delivered {} (expected {records} and 0)",
            held.held, held.delivered
        )));
    }
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let healed = Instant::now();
    let mut first = None;
    let last = loop {
        let s = stats(&http, engine.api).await?;
        let now = Instant::now();
        let connected = s.outputs.first().is_some_and(|o| o.connected);
        if (connected || s.delivered > 0) && first.is_none() {
            first = Some((now, s.delivered));
        }
        if s.delivered >= records {
            break now;
        }
        if now.duration_since(healed) > Duration::from_secs(600) {
            return Err(other(format!(
                "{kind_name}: {} of {records} delivered after 10 minutes",
                s.delivered
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(engine);
    let (started, already) = first.unwrap_or((healed, 0));
    // Rate over what was delivered after the first report; the time to reconnect is apart.
    let engine_took = last.duration_since(started);
    let engine_took = if already > 0 && records > already {
        engine_took.mul_f64(records as f64 / (records - already) as f64)
    } else {
        engine_took
    };
    let window = kind.default_window();
    let raw = match kind {
        OutputKind::Mqtt => {
            raw_mqtt(link.listen_addr(), raw_topic, records, record_bytes, window).await?
        }
        OutputKind::Nats => {
            raw_nats(link.listen_addr(), raw_topic, records, record_bytes, window).await?
        }
        OutputKind::Kafka => {
            raw_kafka(link.listen_addr(), raw_topic, records, record_bytes, window).await?
        }
    };
    drop(broker);
    Ok(Drain {
        kind: kind_name,
        records,
        engine: engine_took,
        reconnect: started.duration_since(healed),
        raw,
        window,
        note,
    })
}

/// The write key the raw clients carry, shaped like the engine's.
fn raw_key(i: u64) -> String {
    format!("0123456789abcdef-{i}")
}

/// The crate's MQTT 5 QoS 1 code: `window` publishes in flight, each with its write key.
async fn raw_mqtt(
    addr: SocketAddr,
    topic: &str,
    records: u64,
    record_bytes: usize,
    window: usize,
) -> Result<Duration, BenchError> {
    use crate::mqtt::{self, Inbound};
    let session = mqtt::connect(
        addr,
        "bench-raw",
        Duration::from_secs(30),
        Duration::from_secs(10),
    )
    .await
    .map_err(other)?;
    let window = session
        .connack
        .properties
        .as_ref()
        .and_then(|p| p.receive_max)
        .map_or(window, |m| window.min(usize::from(m.max(1))));
    let (mut tx, rx) = session.framed.split();
    let mut rx = rx.ready_chunks(256);
    let started = Instant::now();
    let (mut sent, mut acked, mut open) = (0u64, 0u64, 0usize);
    while acked < records {
        while open < window && sent < records {
            let pkid = (sent % 65_535) as u16 + 1;
            let payload = bytes::Bytes::from(record_line(sent, record_bytes).into_bytes());
            tx.feed(mqtt::publish_with_key(topic, pkid, payload, &raw_key(sent)))
                .await
                .map_err(other)?;
            sent += 1;
            open += 1;
        }
        tx.flush().await.map_err(other)?;
        let Some(packets) = rx.next().await else {
            return Err(other("MQTT broker closed the connection"));
        };
        for p in packets {
            if let Ok(Inbound::Ack(ack)) = p {
                if !ack.accepted() {
                    return Err(other(format!("MQTT broker refused: {}", ack.describe())));
                }
                acked += 1;
                open = open.saturating_sub(1);
            }
        }
    }
    Ok(started.elapsed())
}

/// async-nats JetStream publishes with `Nats-Msg-Id`, `window` acks awaited at once.
async fn raw_nats(
    addr: SocketAddr,
    subject: &str,
    records: u64,
    record_bytes: usize,
    window: usize,
) -> Result<Duration, BenchError> {
    use async_nats::jetstream::{self, message::PublishMessage};
    let client = async_nats::ConnectOptions::new()
        .ignore_discovered_servers()
        .connect(format!("nats://{addr}"))
        .await
        .map_err(other)?;
    let js = jetstream::new(client);
    let started = Instant::now();
    let mut acks = FuturesUnordered::new();
    let mut sent = 0u64;
    let mut acked = 0u64;
    while acked < records {
        while acks.len() < window && sent < records {
            let publish = PublishMessage::build()
                .payload(bytes::Bytes::from(
                    record_line(sent, record_bytes).into_bytes(),
                ))
                .message_id(raw_key(sent));
            let ack = js
                .send_publish(subject.to_string(), publish)
                .await
                .map_err(other)?;
            acks.push(ack.into_future());
            sent += 1;
        }
        match acks.next().await {
            Some(Ok(_)) => acked += 1,
            Some(Err(e)) => return Err(other(e)),
            None => break,
        }
    }
    Ok(started.elapsed())
}

/// rdkafka's FutureProducer with the engine's settings (idempotent, acks=all, no message
/// timeout, linger 5 ms), the write key as key and header, `window` deliveries in flight.
async fn raw_kafka(
    addr: SocketAddr,
    topic: &str,
    records: u64,
    record_bytes: usize,
    window: usize,
) -> Result<Duration, BenchError> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", addr.to_string())
        .set("client.id", "bench-raw")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .set("linger.ms", "5")
        .create()
        .map_err(other)?;
    let started = Instant::now();
    let mut deliveries = FuturesUnordered::new();
    let mut sent = 0u64;
    let mut acked = 0u64;
    while acked < records {
        while deliveries.len() < window && sent < records {
            let key = raw_key(sent);
            let data = record_line(sent, record_bytes);
            let headers = OwnedHeaders::new().insert(Header {
                key: "write-key",
                value: Some(key.as_str()),
            });
            let record = FutureRecord::to(topic)
                .payload(data.as_str())
                .key(key.as_str())
                .headers(headers);
            match producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((e, _)) => return Err(other(e)),
            }
            sent += 1;
        }
        match deliveries.next().await {
            Some(Ok(Ok(_))) => acked += 1,
            Some(Ok(Err((e, _)))) => return Err(other(e)),
            Some(Err(_)) => return Err(other("delivery report dropped")),
            None => break,
        }
    }
    Ok(started.elapsed())
}

/// Engine memory with records held behind a refused destination: `(held, VmRSS)` at each of
/// `marks`, and the highest VmRSS seen.
pub async fn held_memory(
    drill_exe: &Path,
    work: &Path,
    marks: &[u64],
    record_bytes: usize,
) -> Result<(Vec<(u64, u64)>, u64), BenchError> {
    let http = reqwest::Client::new();
    // Nothing listens on port 9 of loopback: every connect is refused.
    let refused: SocketAddr = "127.0.0.1:9".parse().map_err(other)?;
    let engine = EngineChild::start(drill_exe, &work.join("held"), "mqtt", refused, "bench")?;
    let mut out = Vec::new();
    let mut peak = 0;
    let mut held = 0;
    for &mark in marks {
        while held < mark {
            let step = (mark - held).min(1_000_000);
            fill(&http, engine.api, step, 1000, 8, record_bytes).await?;
            held += step;
            peak = peak.max(engine.rss());
        }
        let s = stats(&http, engine.api).await?;
        if s.held != held {
            return Err(other(format!("the engine holds {} of {held}", s.held)));
        }
        out.push((held, engine.rss()));
    }
    peak = peak.max(engine.rss());
    let _ = std::fs::remove_dir_all(work.join("held"));
    Ok((out, peak))
}

/// `verify::reconcile` over `n` records sent and arrived: how long it took, and how much its
/// own peak added to the process's resident memory (inputs excluded).
pub fn reconcile(n: u64) -> Result<(Duration, u64, u64), BenchError> {
    use crate::verify::{Arrival, Received, reconcile};
    use crate::workload::{Ingested, Record, Sent};
    let before_inputs = status_field("/proc/self/status", "VmRSS:");
    let sent = Sent {
        order: (0..n)
            .map(|i| {
                (
                    Record {
                        id: format!("bench/k{}/{i}", i % 8),
                        key: format!("k{}", i % 8),
                        seq: i,
                        index: i,
                        pad: String::new(),
                    },
                    Ingested::Accepted {
                        write_key: None,
                        at: Duration::from_millis(i / 1000),
                    },
                )
            })
            .collect(),
    };
    let received = Received {
        arrivals: (0..n)
            .map(|i| Arrival {
                id: Some(format!("bench/k{}/{i}", i % 8)),
                write_key: None,
                at: Duration::from_millis(i / 1000 + 1),
            })
            .collect(),
        ..Received::default()
    };
    let inputs = status_field("/proc/self/status", "VmRSS:").saturating_sub(before_inputs);
    // Reset the peak so VmHWM afterwards is reconcile's own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let base = status_field("/proc/self/status", "VmRSS:");
    let started = Instant::now();
    let r = reconcile(&sent, &received);
    let took = started.elapsed();
    let peak = status_field("/proc/self/status", "VmHWM:");
    if r.missing != 0 || r.duplicates != 0 {
        return Err(other(format!(
            "reconcile found {} lost and {} duplicates in a clean run",
            r.missing, r.duplicates
        )));
    }
    drop(r);
    Ok((took, peak.saturating_sub(base), inputs))
}
