//! Kafka-aware links against a real Kafka-protocol broker (`tansu`) that advertises its own
//! address, with drill's engine (librdkafka) as the client.
//!
//! - A plain link is bypassed: once the client has the metadata it talks to the advertised
//!   broker directly, so a refused link holds nothing — records keep arriving and the link
//!   counts no bytes. This is the failure the Kafka-aware link exists to prevent.
//! - A Kafka-aware link rewrites the broker addresses in the answers: the same refusal holds
//!   every record (none reaches the broker) until the heal, and then all of them arrive.
//! - Each broker gets its own link (`kafka-<node id>`), and a fault on `kafka` is in force on it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use drill::brokers;
use drill::engine::{DurText, EngineConfig, OutputConfig, OutputKind, Stats};
use drill::proxy::{Direction, Fault, Link};
use drill::scenario::{Order, Promise};
use drill::sut::EngineProcess;
use drill::verify;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "drill-links";

async fn engine_to(link: &Link, work: &Path) -> EngineProcess {
    let config = EngineConfig {
        listen: ([127, 0, 0, 1], brokers::free_port().unwrap()).into(),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            kind: OutputKind::Kafka,
            promise: Promise::AtLeastOnce,
            order: Order::Any,
            keepalive: DurText(Duration::from_secs(1)),
            answer_timeout: DurText(Duration::from_secs(2)),
            ..OutputConfig::mqtt("kafka", link.listen_addr(), TOPIC)
        }],
        disk: Default::default(),
    };
    EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, work)
        .await
        .unwrap()
}

async fn ingest(engine: SocketAddr, from: usize, n: usize) {
    let body: String = (from..from + n)
        .map(|i| format!("{{\"id\":\"r-{i}\",\"pad\":\"{}\"}}\n", "x".repeat(100)))
        .collect();
    let status = reqwest::Client::new()
        .post(format!("http://{engine}/ingest"))
        .body(body)
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "ingest answered {status}");
}

async fn wait_stats(engine: &EngineProcess, what: &str, cond: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = engine.stats().await.unwrap();
        if cond(&stats) {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Distinct records in the topic, read straight from the broker.
async fn in_topic(broker: SocketAddr) -> usize {
    let got = verify::read_topic(broker, TOPIC, Duration::from_secs(60), None)
        .await
        .unwrap();
    assert!(got.verifier_fault.is_none(), "{:?}", got.verifier_fault);
    let mut ids: Vec<&str> = got
        .arrivals
        .iter()
        .filter_map(|a| a.id.as_deref())
        .collect();
    ids.sort();
    ids.dedup();
    ids.len()
}

/// What one run saw while its link refused.
struct Refused {
    /// Records in the topic after 100 were ingested under the refusal (100 were there before).
    in_topic_during: usize,
    /// Bytes the family of links carried towards the broker while refused.
    bytes_up_during: u64,
    in_topic_after_heal: usize,
    broker_links: Vec<String>,
}

async fn refuse_with(kafka_aware: bool) -> Refused {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    // The broker advertises itself, as a user's broker does.
    let broker = brokers::start_kafka(work, None, None)
        .await
        .expect("tansu is installed (ci/setup.sh)");
    brokers::create_topic(broker.addr, TOPIC, 1).await.unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let cancel = CancellationToken::new();
    let link = if kafka_aware {
        Link::start_kafka("kafka", any, broker.addr, cancel.clone()).await
    } else {
        Link::start("kafka", any, broker.addr, cancel.clone()).await
    }
    .unwrap();
    let mut engine = engine_to(&link, work).await;
    ingest(engine.addr(), 0, 100).await;
    wait_stats(&engine, "100 delivered", |s| s.delivered == 100).await;

    link.apply_settled(Fault::Refuse, Direction::Both).await;
    let before = link.family_status().bytes_upstream;
    ingest(engine.addr(), 100, 100).await;
    // Long enough for a bypassing client to deliver everything (it takes well under a second
    // when nothing stands in its way), measured, not assumed: stop early once all arrived.
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut in_topic_during = in_topic(broker.addr).await;
    while in_topic_during < 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        in_topic_during = in_topic(broker.addr).await;
    }
    let bytes_up_during = link.family_status().bytes_upstream - before;

    link.apply_settled(Fault::Heal, Direction::Both).await;
    wait_stats(&engine, "200 delivered after the heal", |s| {
        s.delivered == 200
    })
    .await;
    let in_topic_after_heal = in_topic(broker.addr).await;
    let broker_links = link.family_status().broker_links;
    engine.stop(Duration::from_secs(5)).await;
    link.shutdown().await;
    Refused {
        in_topic_during,
        bytes_up_during,
        in_topic_after_heal,
        broker_links,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plain_link_is_bypassed_by_a_self_advertising_broker() {
    let r = refuse_with(false).await;
    println!(
        "plain link, refused: {} of 200 records in the topic, {} bytes through the link",
        r.in_topic_during, r.bytes_up_during
    );
    // The failure a Kafka-aware link prevents: the fault held nothing.
    assert_eq!(
        r.in_topic_during, 200,
        "the client went around the refused link"
    );
    assert_eq!(r.bytes_up_during, 0, "not a byte went through the link");
    assert_eq!(r.in_topic_after_heal, 200);
    assert!(r.broker_links.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kafka_aware_link_holds_every_record_until_the_heal() {
    let r = refuse_with(true).await;
    println!(
        "Kafka-aware link, refused: {} of 200 records in the topic, {} bytes through; broker links {:?}",
        r.in_topic_during, r.bytes_up_during, r.broker_links
    );
    assert_eq!(
        r.in_topic_during, 100,
        "nothing reached the broker while refused"
    );
    assert_eq!(r.bytes_up_during, 0);
    assert_eq!(
        r.in_topic_after_heal, 200,
        "every record arrived after the heal"
    );
    assert_eq!(r.broker_links.len(), 1, "{:?}", r.broker_links);
    assert!(
        r.broker_links[0].starts_with("kafka-"),
        "{:?}",
        r.broker_links
    );
}
