//! `drill bench proxy`, Kafka produce path (this kind's [`crate::dest::Entry::link_bench`]): what a Kafka-aware link costs a producer, side by
//! side in one run with a plain link and with no link at all.
//!
//! Three tansu brokers with the same settings (in-memory storage), one per path: two advertise
//! themselves — the producer reaches one directly, the other through the Kafka-aware link,
//! whose rewritten metadata sends it through that broker's own link `kafka-111` — and one
//! advertises a plain link in front of it, as drill's brokers did before links could read Kafka. One `drill proxy` process carries
//! both links, as users run it. The producer is librdkafka with the engine's settings
//! (idempotent, acks=all, linger 5 ms); every record's delivery report is counted, so nothing
//! is counted that the broker did not confirm. Paths are interleaved, median of the runs.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

use crate::process::{KillOnDrop, free_addr};


const RECORD_BYTES: usize = 200;
const TOPIC: &str = "bench";

/// Counts delivery reports.
#[derive(Clone, Default)]
struct Confirmed {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl ClientContext for Confirmed {}

impl ProducerContext for Confirmed {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let counter = if result.is_ok() {
            &self.ok
        } else {
            &self.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn tansu(bin: &Path, listen: SocketAddr, advertise: SocketAddr) -> std::io::Result<Child> {
    Command::new(bin)
        .arg("broker")
        .arg("--listener-url")
        .arg(format!("tcp://{listen}"))
        .arg("--advertised-listener-url")
        .arg(format!("tcp://{advertise}"))
        .arg("--storage-engine")
        .arg("memory://tansu/")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

fn producer(bootstrap: SocketAddr) -> std::io::Result<(BaseProducer<Confirmed>, Confirmed)> {
    let confirmed = Confirmed::default();
    let p = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap.to_string())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(confirmed.clone())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((p, confirmed))
}

/// Creates the topic through `bootstrap` (waits for the broker to answer).
fn create_topic(bootstrap: SocketAddr) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime
        .block_on(super::topic::create_topic(bootstrap, TOPIC, 1))
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Sends `n` records and waits for every delivery report; records per second.
fn produce(bootstrap: SocketAddr, n: u64) -> std::io::Result<f64> {
    let (p, confirmed) = producer(bootstrap)?;
    let payload = [b'x'; RECORD_BYTES];
    // Warm up: metadata, connections, producer id.
    let _ = p.send(BaseRecord::to(TOPIC).payload(&payload[..]).key("w"));
    p.flush(Duration::from_secs(30))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let base = confirmed.ok.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut sent = 0;
    while sent < n {
        match p.send(BaseRecord::to(TOPIC).payload(&payload[..]).key("k")) {
            Ok(()) => sent += 1,
            Err(_) => {
                p.poll(Duration::from_millis(1));
            }
        }
    }
    p.flush(Duration::from_secs(120))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let took = started.elapsed();
    let got = confirmed.ok.load(Ordering::Relaxed) - base;
    if got != n {
        return Err(std::io::Error::other(format!(
            "{got} of {n} records confirmed"
        )));
    }
    Ok(n as f64 / took.as_secs_f64())
}

/// The Kafka table, or why there is none (tansu not installed).
pub fn measure(drill_exe: &Path, records: u64, runs: usize) -> std::io::Result<String> {
    let Some(bin) = super::broker::tansu_path() else {
        return Ok("\nKafka produce path: tansu is not installed (cargo install tansu --features dynostore,libsql): no Kafka table\n".to_string());
    };
    let mut children = KillOnDrop::default();
    let (own, behind, plain, api) = (free_addr()?, free_addr()?, free_addr()?, free_addr()?);
    let (own_too, aware) = (free_addr()?, free_addr()?);
    // One broker per path, so none carries another path's records.
    children.0.push(tansu(&bin, own, own)?);
    children.0.push(tansu(&bin, own_too, own_too)?);
    children.0.push(tansu(&bin, behind, plain)?);
    children.0.push(
        Command::new(drill_exe)
            .args(["proxy", "--api", &api.to_string()])
            .args(["--link", &format!("plain={plain},{behind}")])
            .args(["--kafka-link", &format!("kafka={aware},{own_too}")])
            .stdout(Stdio::null())
            .spawn()?,
    );
    for addr in [own, own_too, behind, plain, aware] {
        wait_listening(addr)?;
    }
    create_topic(own)?;
    create_topic(own_too)?;
    create_topic(plain)?;
    let paths = [
        ("direct (broker advertises itself)", own),
        ("plain drill link (broker advertises it)", plain),
        ("Kafka-aware drill link (rewrites)", aware),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    for _ in 0..runs.max(1) {
        for (i, (_, bootstrap)) in paths.iter().enumerate() {
            rates[i].push(produce(*bootstrap, records)?);
        }
    }
    let mut out = format!(
        "\nKafka produce path: {records} records of {RECORD_BYTES} B per run, librdkafka idempotent, acks=all, linger 5 ms; every delivery confirmed; median of {} runs, paths interleaved\n\n",
        runs.max(1)
    );
    out.push_str(
        "| path | records/s | MiB/s | vs direct | vs plain link |\n|---|---:|---:|---:|---:|\n",
    );
    let median = |r: &mut Vec<f64>| {
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let medians: Vec<f64> = rates.iter_mut().map(median).collect();
    for ((name, _), rate) in paths.iter().zip(&medians) {
        out.push_str(&format!(
            "| {name} | {rate:.0} | {:.1} | {:.2}× | {:.2}× |\n",
            rate * RECORD_BYTES as f64 / (1024.0 * 1024.0),
            rate / medians[0],
            rate / medians[1],
        ));
    }
    Ok(out)
}

/// Waits up to 10 s for `addr` to take a connection.
fn wait_listening(addr: SocketAddr) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "the Kafka bench: {addr} did not start listening"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
