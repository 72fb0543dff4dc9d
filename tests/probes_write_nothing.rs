//! Probes carry no data (docs/src/design.md#rule-1-5), for every output kind, against real
//! brokers (syslog over RELP: plain TCP and UDP have no round trip to probe with). The engine
//! delivers 100 records, then its link is refused for 6 s while 50 more arrive
//! (the engine probes about once a second and holds them), and meanwhile 30 probes of exactly the
//! kind the engine makes reach the broker and are answered. After the heal the destination holds
//! exactly 150 records, one copy each: read-back count = accepted count.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use drill::dest::Runtime;
use drill::dest::mqtt::read::Reader;
use drill::engine::{DurText, EngineConfig, OutputConfig};
use drill::promise::Promise;
use drill::proxy::{Direction, Fault, Link};
use drill::sut::EngineProcess;
use tokio_util::sync::CancellationToken;

use crate::common::engine::{ingest, wait_stats};

/// A record with nothing but its harness id.
fn bare(i: usize) -> String {
    format!("{{\"id\":\"r-{i}\"}}\n")
}

/// Runs the drill described above against an output of `kind` through `link`; returns the
/// number of probes that were answered while the engine held records.
async fn probes_during_an_outage(work: &Path, link: &Link, output: OutputConfig) -> usize {
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            keepalive: DurText(Duration::from_secs(1)),
            answer_timeout: DurText(Duration::from_secs(2)),
            ..output.clone()
        }],
        disk: Default::default(),
    };
    let mut engine = EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, work)
        .await
        .unwrap();
    ingest(engine.addr(), (0..100).map(bare)).await;
    let within = Duration::from_secs(60);
    wait_stats(&engine, "100 delivered", within, |s| s.delivered >= 100).await;
    link.apply_settled(Fault::Refuse, Direction::Both).await;
    ingest(engine.addr(), (100..150).map(bare)).await;
    // The same probe the engine makes, straight at the broker (past the refused link).
    let direct = OutputConfig {
        address: link.upstream_addr(),
        answer_timeout: DurText(Duration::from_secs(5)),
        ..output
    };
    let started = Instant::now();
    let mut answered = 0;
    for _ in 0..30 {
        if drill::dest::probe(&direct).await.is_ok() {
            answered += 1;
        }
    }
    if let Some(rest) = Duration::from_secs(6).checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let held = engine.stats().await.unwrap();
    assert_eq!(held.waiting, 50, "held during the outage: {held:?}");
    link.apply_settled(Fault::Heal, Direction::Both).await;
    wait_stats(&engine, "150 delivered", within, |s| s.delivered >= 150).await;
    engine.stop(Duration::from_secs(5)).await;
    answered
}

/// (copies, distinct records) read back. A message without a harness id is unexpected data
/// at the destination — exactly what a probe that wrote would leave — so none may arrive.
fn exactly_once(ids: impl Iterator<Item = Option<String>>) -> (usize, usize) {
    let all: Vec<Option<String>> = ids.collect();
    let unexpected = all.iter().filter(|i| i.is_none()).count();
    assert_eq!(
        unexpected, 0,
        "messages without a harness id reached the destination"
    );
    let ids: Vec<String> = all.into_iter().flatten().collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    (ids.len(), distinct.len())
}

async fn link_to(upstream: SocketAddr) -> Link {
    Link::start(
        "probe",
        "127.0.0.1:0".parse().unwrap(),
        upstream,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_probes_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker =
        drill::dest::mqtt::broker::start_mqtt(Runtime::Process, dir.path(), Default::default())
            .await
            .expect("mosquitto is installed (ci/setup.sh)");
    let reader = Reader::start(
        broker.addr,
        "t/probe",
        Instant::now(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let link = link_to(broker.addr).await;
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig::new("mqtt", "mqtt", link.listen_addr(), "t/probe"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = reader.stop().await;
    let (copies, distinct) = exactly_once(got.arrivals.into_iter().map(|a| a.id));
    println!(
        "mqtt: {answered} probes answered during the outage; {copies} copies of {distinct} records read back"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_probes_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = drill::dest::nats::broker::start_nats(dir.path(), None, None, None)
        .await
        .expect("nats-server is installed (ci/setup.sh)");
    drill::dest::nats::stream::create_stream(
        broker.addr,
        "PROBE",
        "t.probe",
        Duration::from_secs(120),
        None,
        1,
        None,
    )
    .await
    .unwrap();
    let link = link_to(broker.addr).await;
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig {
            promise: Promise::EffectivelyOnce,
            ..OutputConfig::new("nats", "js", link.listen_addr(), "t.probe")
        },
    )
    .await;
    let got =
        drill::dest::nats::read::read_stream(broker.addr, "PROBE", Duration::from_secs(30), None)
            .await
            .unwrap();
    let (copies, distinct) = exactly_once(got.arrivals.into_iter().map(|a| a.id));
    println!(
        "jetstream: {answered} probes answered during the outage; {copies} messages for {distinct} records"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_probes_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = drill::process::free_port().unwrap();
    let link = link_to(([127, 0, 0, 1], port).into()).await;
    let mut broker =
        drill::dest::kafka::broker::start_kafka(dir.path(), Some(port), Some(link.listen_addr()))
            .await
            .expect("tansu is installed (ci/setup.sh)");
    drill::dest::kafka::topic::create_topic(link.listen_addr(), "probe", 1)
        .await
        .unwrap();
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig {
            ..OutputConfig::new("kafka", "kafka", link.listen_addr(), "probe")
        },
    )
    .await;
    let got = drill::dest::kafka::read::read_topic(
        link.listen_addr(),
        "probe",
        Duration::from_secs(60),
        None,
    )
    .await
    .unwrap();
    let (copies, distinct) = exactly_once(got.arrivals.into_iter().map(|a| a.id));
    println!(
        "kafka: {answered} probes answered during the outage; {copies} records for {distinct} read back"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
    broker.stop().await;
}

/// HTTP: the probe is a HEAD to drill's own endpoint; it stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_probes_write_nothing() {
    use drill::dest::http::endpoint::{Store, serve};
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::new(
        "/in",
        drill::dest::http::Dedupe::Atomic,
        "Idempotency-Key",
        None,
    ));
    let (addr, stop) = serve(store.clone()).await.unwrap();
    let link = link_to(addr).await;
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig::new("http", "http", link.listen_addr(), "/in"),
    )
    .await;
    let lines = store.lines();
    let ids = lines.iter().map(|l| {
        let at = l.find("\"id\":\"")? + 6;
        Some(l[at..].split('"').next()?.to_string())
    });
    let (copies, distinct) = exactly_once(ids);
    println!(
        "http: {answered} probes answered during the outage; {copies} copies of {distinct} records stored"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
    stop.cancel();
}

/// PostgreSQL: the probe is `SELECT 1` on a new connection; it inserts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_probes_write_nothing() {
    use drill::dest::postgres::broker;
    let dir = tempfile::tempdir().unwrap();
    let server = broker::start()
        .await
        .expect("PostgreSQL is installed (ci/setup.sh)");
    broker::create_database(server.addr, Some("probe"), None)
        .await
        .unwrap();
    let link = link_to(server.addr).await;
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig::new("postgres", "postgres", link.listen_addr(), "probe"),
    )
    .await;
    let client = broker::connect(server.addr, &drill::dest::postgres::Login::drill())
        .await
        .unwrap();
    let rows = client.query("SELECT id FROM probe", &[]).await.unwrap();
    let (copies, distinct) = exactly_once(rows.iter().map(|r| r.get::<_, Option<String>>(0)));
    println!(
        "postgres: {answered} probes answered during the outage; {copies} rows of {distinct} records stored"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
}

/// Syslog over RELP: the probe is a RELP session `open` answered `rsp 200` (and its `close`);
/// it carries no syslog frame, so rsyslog writes nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syslog_probes_write_nothing() {
    use drill::dest::syslog::broker::{self, Transport};
    let dir = tempfile::tempdir().unwrap();
    let (rsyslog, _process) = broker::start(Transport::Relp, &dir.path().join("rsyslog"))
        .await
        .expect("rsyslog with RELP is installed (ci/setup.sh)");
    let link = link_to(rsyslog.addr).await;
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig::new("syslog", "syslog", link.listen_addr(), "drill"),
    )
    .await;
    // rsyslog answers a frame before its file holds the line: read until the 150 are there,
    // then once more a moment later, so that a late extra line is seen too.
    let ids = |text: &str| -> Vec<Option<String>> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let at = l.find("r-")?;
                let digits = l[at + 2..].chars().take_while(char::is_ascii_digit).count();
                (digits > 0).then(|| l[at..at + 2 + digits].to_string())
            })
            .collect()
    };
    let read = || std::fs::read_to_string(&rsyslog.received).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ids(&read()).len() < 150 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (copies, distinct) = exactly_once(ids(&read()).into_iter());
    println!(
        "syslog (RELP): {answered} probes answered during the outage; {copies} messages of {distinct} records received"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
}

/// AMQP: the probe is the handshake, `confirm.select` and a passive declare of the queue; it
/// publishes nothing, so the queue holds exactly the 150 records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_probes_write_nothing() {
    use drill::dest::amqp::{broker, queue};
    let dir = tempfile::tempdir().unwrap();
    let server = broker::start(None)
        .await
        .expect("RabbitMQ is installed (ci/setup.sh)");
    queue::declare(server.addr, "probe", queue::QueueType::Quorum)
        .await
        .unwrap();
    let link = link_to(server.addr).await;
    let answered = probes_during_an_outage(
        dir.path(),
        &link,
        OutputConfig::new("amqp", "amqp", link.listen_addr(), "probe"),
    )
    .await;
    let ids = queue::drain_ids(server.addr, "probe").await.unwrap();
    let (copies, distinct) = exactly_once(ids.into_iter());
    println!(
        "amqp: {answered} probes answered during the outage; {copies} messages of {distinct} records in the queue"
    );
    assert_eq!(answered, 30);
    assert_eq!((copies, distinct), (150, 150));
}
