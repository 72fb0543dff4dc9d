//! The JetStream output against a real `nats-server -js`, through a real proxy link.
//!
//! - One oversized record among accepted ones is refused by the stream (`max_msg_size`): exactly
//!   the configured number of counted refusals, then Failed messages with the server's words;
//!   the rest flows. A cut in the middle spends no refusal.
//! - A half-open link (answers swallowed) ends attempts `possibly_sent`; after the heal they go
//!   again with the same `Nats-Msg-Id`, and the stream holds exactly one copy of each record:
//!   read-back count = accepted count.
//! - A publish that lands and is never answered (a silent subscriber, no stream) ends
//!   `possibly_sent` after the answer timeout, spends no refusal, and is stored once when a
//!   stream captures the subject.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use drill::engine::{DurText, EngineConfig, OutputConfig, RefusalConfig};
use drill::promise::{Order, Promise};
use drill::proxy::{Direction, Fault, Link};
use drill::sut::EngineProcess;
use tokio_util::sync::CancellationToken;

use crate::common::engine::{attempts, ingest_keyed, record, wait_stats};

const STREAM: &str = "DRILL";
const SUBJECT: &str = "drill.t";
/// How long a wait for the engine's stats may take.
const WAIT: Duration = Duration::from_secs(60);

struct Rig {
    broker: drill::dest::nats::broker::LocalNats,
    link: Link,
    engine: EngineProcess,
    _dir: tempfile::TempDir,
    work: std::path::PathBuf,
}

async fn rig(max_msg_size: i32) -> Rig {
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
            duplicate_window: Duration::from_secs(120),
            max_message_size: max_msg_size,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let link = Link::start("nats", any, broker.addr, CancellationToken::new())
        .await
        .unwrap();
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            promise: Promise::EffectivelyOnce,
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
            ..OutputConfig::new("nats", "js", link.listen_addr(), SUBJECT)
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

/// Copies per harness id in the stream.
async fn stream_copies(broker: SocketAddr) -> (HashMap<String, u32>, usize) {
    let got = drill::dest::nats::read::read_stream(broker, STREAM, Duration::from_secs(30), None)
        .await
        .unwrap();
    assert!(got.verifier_fault.is_none(), "{:?}", got.verifier_fault);
    let mut copies = HashMap::new();
    for a in &got.arrivals {
        assert!(a.write_key.is_some(), "every message carries Nats-Msg-Id");
        *copies.entry(a.id.clone().unwrap()).or_insert(0) += 1;
    }
    (copies, got.arrivals.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_record_is_refused_and_counted_a_cut_is_not() {
    let mut rig = rig(2000).await;
    let addr = rig.engine.addr();
    // 300 records; number 150 is larger than the stream's max_msg_size.
    let keys = ingest_keyed(
        addr,
        (0..300).map(|i| record(i, if i == 150 { 5000 } else { 180 })),
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
        "{} counted refusals of the oversized record; the server said: {words}",
        refused.len()
    );
    assert_eq!(refused.len(), 3);
    assert!(words.contains("maximum"), "the server's own words: {words}");

    // A cut: the link refuses while 100 more records are ingested. Nothing is counted.
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
    let after = wait_stats(&rig.engine, "399 delivered", WAIT, |s| s.delivered == 399).await;
    assert_eq!(after.attempts.refused, 3);

    let (copies, total) = stream_copies(rig.broker.addr).await;
    println!(
        "stream {STREAM}: {total} messages, {} distinct records",
        copies.len()
    );
    assert_eq!(copies.len(), 399);
    assert_eq!(total, 399, "one copy each");
    assert!(!copies.contains_key("r-150"));
    rig.engine.stop(Duration::from_secs(5)).await;
    rig.broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_link_leaves_exactly_one_copy_of_each_record() {
    let mut rig = rig(1 << 20).await;
    let addr = rig.engine.addr();
    ingest_keyed(addr, (0..200).map(|i| record(i, 180))).await;
    wait_stats(&rig.engine, "200 delivered", WAIT, |s| s.delivered == 200).await;
    // Answers are swallowed: publishes land, PubAcks never come back.
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
        "half-open 6 s: {} possibly_sent attempts during it; all 600 delivered {:?} after the heal; attempts {:?}",
        during.attempts.possibly_sent,
        healed.elapsed(),
        after.attempts
    );
    assert!(
        during.attempts.possibly_sent > 0,
        "the swallowed answers must end attempts possibly_sent: {during:?}"
    );
    assert_eq!(after.attempts.refused, 0);
    let (copies, total) = stream_copies(rig.broker.addr).await;
    println!(
        "stream {STREAM}: {total} messages for {} records",
        copies.len()
    );
    assert_eq!(copies.len(), 600, "nothing lost");
    assert_eq!(
        total, 600,
        "resends were deduplicated by Nats-Msg-Id: no extra copy"
    );
    rig.engine.stop(Duration::from_secs(5)).await;
    rig.broker.stop().await;
}

/// A publish that lands but is never answered, on a connection that is otherwise fine (pings
/// answered): a plain subscriber takes the subject and no stream does, so the server has a
/// responder (no "no responders") and no PubAck ever comes. The output's answer timeout (the
/// oldest open attempt's age) must end the attempts `possibly_sent`, count no refusal, and
/// send again after the probe; once a stream captures the subject, each record is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_nobody_answers_ends_possibly_sent_after_the_answer_timeout() {
    use futures::StreamExt;
    let mut rig = rig(1 << 20).await;
    let addr = rig.engine.addr();
    let client = async_nats::connect(rig.broker.addr.to_string())
        .await
        .unwrap();
    let js = jetstream::new(client.clone());
    js.delete_stream(STREAM).await.unwrap();
    let mut silent = client.subscribe(SUBJECT).await.unwrap();
    client.flush().await.unwrap();
    ingest_keyed(addr, (0..20).map(|i| record(i, 180))).await;
    let landed = tokio::time::timeout(Duration::from_secs(30), silent.next())
        .await
        .expect("the publishes reach the subject");
    assert!(landed.is_some());
    let started = Instant::now();
    let during = wait_stats(&rig.engine, "20 attempts possibly_sent", WAIT, |s| {
        s.attempts.possibly_sent >= 20
    })
    .await;
    println!(
        "unanswered publishes ended possibly_sent after {:?} (answer timeout 2 s): {:?}",
        started.elapsed(),
        during.attempts
    );
    assert_eq!((during.delivered, during.attempts.refused), (0, 0));
    js.create_stream(jetstream::stream::Config {
        name: STREAM.to_string(),
        subjects: vec![SUBJECT.to_string()],
        duplicate_window: Duration::from_secs(120),
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .unwrap();
    let after = wait_stats(&rig.engine, "20 delivered", WAIT, |s| s.delivered == 20).await;
    assert_eq!(after.attempts.refused, 0);
    let (copies, total) = stream_copies(rig.broker.addr).await;
    assert_eq!((copies.len(), total), (20, 20), "one copy each");
    rig.engine.stop(Duration::from_secs(5)).await;
    rig.broker.stop().await;
}
