//! The engine at depth (issue #15): a backlog of a million records held behind a refused link
//! in bounded memory, then drained whole.
//!
//! The engine's output link (a real proxy link in front of a real `nats-server -js`) refuses
//! while 1 000 000 records of 200 bytes are ingested. The engine's resident memory
//! (`/proc/PID/status` VmRSS) is read as the backlog grows: it must stay flat — the backlog is
//! on disk and each output reads it a bounded read-ahead at a time, where the engine used to
//! keep every held record in memory (≈ 300 MB for this backlog). Then the link heals, the
//! ledger closes (held = delivered, nothing waiting, nothing failed), and every record is read
//! back from the stream exactly once.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use drill::engine::{EngineConfig, OutputConfig};
use drill::promise::Promise;
use drill::proxy::{Direction, Fault, Link};
use drill::sut::EngineProcess;
use tokio_util::sync::CancellationToken;

use crate::common::engine::ingest_batches;

const STREAM: &str = "DEPTH";
const SUBJECT: &str = "depth.t";
const RECORDS: u64 = 1_000_000;
/// Records a request; four requests at a time.
const BATCH: usize = 1000;
/// Above the memory with 100 000 held, the engine may grow by at most this much while the
/// backlog grows tenfold (it grew by ≈ 300 MB when every held record stayed in memory).
const GROWTH_LIMIT: u64 = 40 << 20;
/// And never more than this in all.
const RSS_LIMIT: u64 = 150 << 20;

fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn line(i: u64) -> String {
    let head = format!("{{\"id\":\"depth/{i}\",\"pad\":\"");
    format!("{head}{}\"}}\n", "x".repeat(200 - head.len() - 2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_held_in_flat_memory_then_drained_whole() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().to_path_buf();
    let broker = drill::dest::nats::broker::start_nats(&work, None, None, None)
        .await
        .expect("nats-server is installed (ci/setup.sh)");
    let client = async_nats::connect(broker.addr.to_string()).await.unwrap();
    jetstream::new(client)
        .create_stream(jetstream::stream::Config {
            name: STREAM.to_string(),
            subjects: vec![SUBJECT.to_string()],
            duplicate_window: Duration::from_secs(600),
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let link = Link::start("nats", any, broker.addr, CancellationToken::new())
        .await
        .unwrap();
    link.apply_settled(Fault::Refuse, Direction::Both).await;
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            promise: Promise::EffectivelyOnce,
            // The kind's own window: as many publishes in flight as JetStream takes.
            window: 0,
            ..OutputConfig::new("nats", "js", link.listen_addr(), SUBJECT)
        }],
        disk: Default::default(),
    };
    let engine = EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, &work)
        .await
        .unwrap();
    let pid = engine.pid().expect("the engine runs");

    let started = Instant::now();
    ingest_batches(engine.addr(), (0..RECORDS / 10).map(line), BATCH, 4).await;
    let base = rss(pid);
    let mut highest = base;
    for tenth in 1..10 {
        let records = tenth * RECORDS / 10..(tenth + 1) * RECORDS / 10;
        ingest_batches(engine.addr(), records.map(line), BATCH, 4).await;
        highest = highest.max(rss(pid));
    }
    let stats = engine.stats().await.unwrap();
    println!(
        "{} held after {:.1} s; engine RSS {:.1} MB at 100 000 held, highest {:.1} MB up to 1 000 000",
        stats.held,
        started.elapsed().as_secs_f64(),
        base as f64 / 1e6,
        highest as f64 / 1e6
    );
    assert_eq!((stats.held, stats.delivered), (RECORDS, 0));
    assert!(
        highest <= base + GROWTH_LIMIT && highest <= RSS_LIMIT,
        "memory grew with the backlog: {base} bytes at 100 000 held, {highest} at most up to 1 000 000"
    );

    link.apply_settled(Fault::Heal, Direction::Both).await;
    let healed = Instant::now();
    let deadline = healed + Duration::from_secs(420);
    let stats = loop {
        let stats = engine.stats().await.unwrap();
        highest = highest.max(rss(pid));
        if stats.delivered == RECORDS || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "drained in {:.1} s; highest RSS {:.1} MB; {stats:?}",
        healed.elapsed().as_secs_f64(),
        highest as f64 / 1e6
    );
    assert_eq!(
        (stats.held, stats.delivered, stats.waiting, stats.failed),
        (RECORDS, RECORDS, 0, 0),
        "the ledger closes"
    );
    assert!(highest <= RSS_LIMIT, "{highest} bytes while draining");

    // Every record read back from the stream, exactly once. A generous limit: alone
    // it reads the million in ~40 s; under CI's load it once read 958 400 in 120 s.
    let read_started = Instant::now();
    let got =
        drill::dest::nats::read::read_stream(broker.addr, STREAM, Duration::from_secs(480), None)
            .await
            .unwrap();
    println!("read back in {:.1} s", read_started.elapsed().as_secs_f64());
    assert!(got.verifier_fault.is_none(), "{:?}", got.verifier_fault);
    let mut ids = HashSet::with_capacity(RECORDS as usize);
    for a in &got.arrivals {
        assert!(a.write_key.is_some(), "every message carries Nats-Msg-Id");
        assert!(
            ids.insert(a.id.clone().unwrap()),
            "a second copy of {:?}",
            a.id
        );
    }
    assert_eq!(ids.len() as u64, RECORDS);
    for i in [0, RECORDS / 2, RECORDS - 1] {
        assert!(ids.contains(&format!("depth/{i}")));
    }
}
