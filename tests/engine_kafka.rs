//! The Kafka output against a real Kafka-protocol broker (`tansu`), through a real proxy link;
//! the broker advertises the proxy, so every client goes through it.
//!
//! - One record larger than the producer may send among accepted ones is refused and counted
//!   (never left the machine), then set aside; the rest flows. A cut spends no refusal.
//! - A half-open link (answers swallowed) loses nothing; every copy carries its write key, and
//!   the test prints how many extra copies the broker kept (an idempotent producer's retries
//!   are the broker's to drop).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use drill::engine::{DurText, EngineConfig, OutputConfig, RefusalConfig};
use drill::promise::{Order, Promise};
use drill::proxy::{Direction, Fault, Link};
use drill::sut::EngineProcess;
use tokio_util::sync::CancellationToken;

use crate::common::engine::{attempts, ingest_keyed, record, wait_stats};

const TOPIC: &str = "drill-t";
/// How long a wait for the engine's stats may take.
const WAIT: Duration = Duration::from_secs(90);

struct Rig {
    broker: drill::dest::kafka::broker::LocalKafka,
    link: Link,
    engine: EngineProcess,
    _dir: tempfile::TempDir,
    work: std::path::PathBuf,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().to_path_buf();
    let port = drill::process::free_port().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let link = Link::start(
        "kafka",
        any,
        ([127, 0, 0, 1], port).into(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let broker =
        drill::dest::kafka::broker::start_kafka(&work, Some(port), Some(link.listen_addr()))
            .await
            .expect("tansu is installed (ci/setup.sh)");
    drill::dest::kafka::topic::create_topic(link.listen_addr(), TOPIC, 3)
        .await
        .unwrap();
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            promise: Promise::AtLeastOnce,
            order: Order::Any,
            keepalive: DurText(Duration::from_secs(1)),
            answer_timeout: DurText(Duration::from_secs(2)),
            window: 64,
            refusals: Some(RefusalConfig {
                max: 3,
                backoff: [
                    DurText(Duration::from_millis(100)),
                    DurText(Duration::from_millis(400)),
                ],
            }),
            ..OutputConfig::new("kafka", "kafka", link.listen_addr(), TOPIC)
        }],
        disk: Default::default(),
    };
    let engine = EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, &work)
        .await
        .unwrap();
    Rig {
        broker,
        link,
        engine,
        _dir: dir,
        work,
    }
}

/// Copies per harness id in the topic, and how many of the extra ones carry a write key that
/// differs from the first copy's.
async fn topic_copies(bootstrap: SocketAddr) -> (HashMap<String, u32>, usize, usize) {
    let got = drill::dest::kafka::read::read_topic(bootstrap, TOPIC, Duration::from_secs(60), None)
        .await
        .unwrap();
    assert!(got.verifier_fault.is_none(), "{:?}", got.verifier_fault);
    let mut copies = HashMap::new();
    let mut keys: HashMap<String, String> = HashMap::new();
    let mut other_key = 0;
    for a in &got.arrivals {
        let id = a.id.clone().unwrap();
        let key = a.write_key.clone().expect("every record carries write-key");
        if let Some(first) = keys.get(&id) {
            if *first != key {
                other_key += 1;
            }
        } else {
            keys.insert(id.clone(), key);
        }
        *copies.entry(id).or_insert(0) += 1;
    }
    (copies, got.arrivals.len(), other_key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_record_is_refused_and_counted_a_cut_is_not() {
    let mut rig = rig().await;
    let addr = rig.engine.addr();
    // Record 150 is larger than librdkafka's message.max.bytes (1 MB): it cannot be sent.
    let keys = ingest_keyed(
        addr,
        (0..300).map(|i| record(i, if i == 150 { 1_100_000 } else { 180 })),
    )
    .await;
    let poison_key = keys[150].clone();
    wait_stats(&rig.engine, "299 delivered, 1 failed", WAIT, |s| {
        s.delivered == 299 && s.failed == 1
    })
    .await;
    let refused: Vec<_> = attempts(&rig.work)
        .into_iter()
        .filter(|a| a["key"] == poison_key.as_str() && a["outcome"] == "refused")
        .collect();
    let words = refused[0]["error"].as_str().unwrap_or_default().to_string();
    println!(
        "{} counted refusals of the oversized record; librdkafka said: {words}",
        refused.len()
    );
    assert_eq!(refused.len(), 3);
    assert!(words.contains("too large"), "{words}");

    rig.link.apply_settled(Fault::Refuse, Direction::Both).await;
    ingest_keyed(addr, (300..400).map(|i| record(i, 180))).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = rig.engine.stats().await.unwrap();
    assert_eq!(
        during.attempts.refused, 3,
        "a cut spends no refusal: {during:?}"
    );
    assert_eq!((during.waiting, during.failed), (100, 1));
    rig.link.apply_settled(Fault::Heal, Direction::Both).await;
    let healed = Instant::now();
    let after = wait_stats(&rig.engine, "399 delivered", WAIT, |s| s.delivered == 399).await;
    println!(
        "after a 3 s refused link: 100 held records delivered {:?} after the heal",
        healed.elapsed()
    );
    assert_eq!(after.attempts.refused, 3);

    let (copies, total, other_key) = topic_copies(rig.link.listen_addr()).await;
    println!("topic {TOPIC}: {total} records, {} distinct", copies.len());
    assert_eq!(copies.len(), 399);
    assert_eq!(other_key, 0);
    assert!(!copies.contains_key("r-150"));
    assert_eq!(total, 399, "one copy each");
    rig.engine.stop(Duration::from_secs(5)).await;
    rig.broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_link_loses_nothing_and_every_copy_carries_its_write_key() {
    let mut rig = rig().await;
    let addr = rig.engine.addr();
    ingest_keyed(addr, (0..200).map(|i| record(i, 180))).await;
    wait_stats(&rig.engine, "200 delivered", WAIT, |s| s.delivered == 200).await;
    rig.link
        .apply_settled(Fault::Swallow, Direction::Downstream)
        .await;
    ingest_keyed(addr, (200..600).map(|i| record(i, 180))).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = rig.engine.stats().await.unwrap();
    rig.link.apply_settled(Fault::Heal, Direction::Both).await;
    let healed = Instant::now();
    let after = wait_stats(&rig.engine, "600 delivered", WAIT, |s| s.delivered == 600).await;
    println!(
        "half-open 6 s: during it {:?}; all 600 delivered {:?} after the heal; attempts {:?}",
        during.attempts,
        healed.elapsed(),
        after.attempts
    );
    let (copies, total, other_key) = topic_copies(rig.link.listen_addr()).await;
    println!(
        "topic {TOPIC}: {total} records for {} distinct; {} extra copies, {other_key} with another write key",
        copies.len(),
        total - copies.len()
    );
    assert_eq!(copies.len(), 600, "nothing lost");
    assert_eq!(other_key, 0, "every resend carries its write key");
    rig.engine.stop(Duration::from_secs(5)).await;
    rig.broker.stop().await;
}
