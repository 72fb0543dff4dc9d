//! Kafka-aware links against a real Kafka-protocol broker (`tansu`) that advertises its own
//! address, with drill's engine (librdkafka) as the client.
//!
//! - A plain link is bypassed: once the client has the metadata it talks to the advertised
//!   broker directly, so a refused link holds nothing — records keep arriving and the link
//!   counts no bytes. This is the failure the Kafka-aware link exists to prevent.
//! - A Kafka-aware link rewrites the broker addresses in the answers: the same refusal holds
//!   every record (none reaches the broker) until the heal, and then all of them arrive.
//! - Each broker gets its own link (`kafka-<node id>`), and a fault on `kafka` is in force on it.
//! - A cluster of three brokers (tansu reports one broker whatever its storage, so a scripted
//!   bootstrap answers Metadata with three, each an echo server): three member links, each to
//!   its broker; `kafka` refuses all three, `kafka-2` only its own.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use drill::engine::{DurText, EngineConfig, OutputConfig};
use drill::promise::{Order, Promise};
use drill::proxy::{Direction, Fault, Link};
use drill::sut::EngineProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::common::engine::{ingest, record, wait_stats};

const TOPIC: &str = "drill-links";
/// How long a wait for the engine's stats may take.
const WAIT: Duration = Duration::from_secs(60);

async fn engine_to(link: &Link, work: &Path) -> EngineProcess {
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
            ..OutputConfig::new("kafka", "kafka", link.listen_addr(), TOPIC)
        }],
        disk: Default::default(),
    };
    EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, work)
        .await
        .unwrap()
}

/// Distinct records in the topic, read straight from the broker.
async fn in_topic(broker: SocketAddr) -> usize {
    let got = drill::dest::kafka::read::read_topic(broker, TOPIC, Duration::from_secs(60), None)
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
    let broker = drill::dest::kafka::broker::start_kafka(work, None, None)
        .await
        .expect("tansu is installed (ci/setup.sh)");
    drill::dest::kafka::topic::create_topic(broker.addr, TOPIC, 1)
        .await
        .unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let cancel = CancellationToken::new();
    let link = if kafka_aware {
        Link::start_kafka("kafka", any, broker.addr, cancel.clone()).await
    } else {
        Link::start("kafka", any, broker.addr, cancel.clone()).await
    }
    .unwrap();
    let mut engine = engine_to(&link, work).await;
    ingest(engine.addr(), (0..100).map(|i| record(i, 100))).await;
    wait_stats(&engine, "100 delivered", WAIT, |s| s.delivered == 100).await;

    link.apply_settled(Fault::Refuse, Direction::Both).await;
    let before = link.family_status().bytes_upstream;
    ingest(engine.addr(), (100..200).map(|i| record(i, 100))).await;
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
    wait_stats(&engine, "200 delivered after the heal", WAIT, |s| {
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

/// A Metadata v12 answer naming `brokers` (node id, port on 127.0.0.1), no topics.
fn metadata_v12(correlation: i32, brokers: &[(i32, u16)]) -> Vec<u8> {
    let mut f = correlation.to_be_bytes().to_vec();
    f.push(0); // header tagged fields
    f.extend_from_slice(&0i32.to_be_bytes()); // throttle
    f.push(brokers.len() as u8 + 1);
    for (node, port) in brokers {
        f.extend_from_slice(&node.to_be_bytes());
        f.push(10); // "127.0.0.1": 9 bytes
        f.extend_from_slice(b"127.0.0.1");
        f.extend_from_slice(&i32::from(*port).to_be_bytes());
        f.push(0); // rack: null
        f.push(0); // tagged fields
    }
    f.push(0); // cluster id: null
    f.extend_from_slice(&brokers[0].0.to_be_bytes()); // controller
    f.push(1); // no topics
    f.push(0);
    f
}

/// A bootstrap broker that answers every request with the cluster's Metadata.
async fn scripted_bootstrap(brokers: Vec<(i32, u16)>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let brokers = brokers.clone();
            tokio::spawn(async move {
                loop {
                    let Ok(len) = s.read_i32().await else { return };
                    let mut req = vec![0u8; len as usize];
                    if s.read_exact(&mut req).await.is_err() {
                        return;
                    }
                    let corr = i32::from_be_bytes([req[4], req[5], req[6], req[7]]);
                    let answer = metadata_v12(corr, &brokers);
                    let _ = s.write_i32(answer.len() as i32).await;
                    let _ = s.write_all(&answer).await;
                }
            });
        }
    });
    addr
}

/// Asks `link` for metadata (v12) and returns the broker addresses in its answer.
async fn ask_metadata(link: SocketAddr) -> Vec<drill::wire::kafka::BrokerAddress> {
    let mut s = TcpStream::connect(link).await.unwrap();
    let mut req = Vec::new();
    req.extend_from_slice(&3i16.to_be_bytes());
    req.extend_from_slice(&12i16.to_be_bytes());
    req.extend_from_slice(&7i32.to_be_bytes());
    req.extend_from_slice(&(-1i16).to_be_bytes()); // no client id
    req.extend_from_slice(&[0, 1, 0, 0, 0]); // tagged, no topics, flags, tagged
    s.write_i32(req.len() as i32).await.unwrap();
    s.write_all(&req).await.unwrap();
    let len = s.read_i32().await.unwrap();
    let mut answer = vec![0u8; len as usize];
    s.read_exact(&mut answer).await.unwrap();
    drill::wire::kafka::brokers(3, 12, &answer).unwrap()
}

/// Whether a Kafka frame (an ApiVersions request; the link passes what it does not rewrite)
/// sent to `addr` comes back whole from the echo server behind it.
async fn echoes(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return false;
    };
    let frame = [0, 0, 0, 8, 0, 18, 0, 0, 0, 0, 0, 1];
    let mut back = [0u8; 12];
    s.write_all(&frame).await.is_ok()
        && tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut back))
            .await
            .is_ok_and(|r| r.is_ok())
        && back == frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_broker_of_a_cluster_gets_a_link_and_faults_follow_the_names() {
    let echoes_ = [
        crate::common::echo().await,
        crate::common::echo().await,
        crate::common::echo().await,
    ];
    let cluster: Vec<(i32, u16)> = echoes_
        .iter()
        .enumerate()
        .map(|(i, e)| (i as i32 + 1, e.addr.port()))
        .collect();
    let bootstrap = scripted_bootstrap(cluster.clone()).await;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let link = Link::start_kafka("kafka", any, bootstrap, CancellationToken::new())
        .await
        .unwrap();

    let seen = ask_metadata(link.listen_addr()).await;
    assert_eq!(seen.len(), 3);
    let members = link.members();
    assert_eq!(
        members
            .iter()
            .map(|m| m.name().to_string())
            .collect::<Vec<_>>(),
        ["kafka-1", "kafka-2", "kafka-3"]
    );
    for (b, (m, e)) in seen.iter().zip(members.iter().zip(&echoes_)) {
        // The answer names the member link; the member goes to the broker.
        assert_eq!(b.port, i32::from(m.listen_addr().port()));
        assert_eq!(m.upstream_addr(), e.addr);
        assert!(echoes(m.listen_addr()).await, "{} passes", m.name());
    }
    // Asked again, the same members answer: nothing new is created.
    assert_eq!(ask_metadata(link.listen_addr()).await, seen);
    assert_eq!(link.members().len(), 3);

    link.apply_settled(Fault::Refuse, Direction::Both).await;
    for m in &members {
        assert!(
            !echoes(m.listen_addr()).await,
            "{} refuses with kafka",
            m.name()
        );
    }
    link.apply_settled(Fault::Heal, Direction::Both).await;
    assert!(
        link.apply_member(
            "kafka-2",
            drill::proxy::FaultSpec::new(Fault::Refuse, Direction::Both)
        )
        .await
    );
    let passing: Vec<bool> =
        futures::future::join_all(members.iter().map(|m| echoes(m.listen_addr()))).await;
    assert_eq!(passing, [true, false, true]);
    assert!(
        !link
            .apply_member(
                "nats-2",
                drill::proxy::FaultSpec::new(Fault::Refuse, Direction::Both)
            )
            .await
    );
    // A fault for a broker not seen yet waits for it.
    assert!(
        link.apply_member(
            "kafka-9",
            drill::proxy::FaultSpec::new(Fault::Refuse, Direction::Both)
        )
        .await
    );
    link.shutdown().await;
}

/// `link: kafka-111` (tansu's one broker, node 111) in a scenario: the bootstrap link stays up,
/// the broker's own link is refused, and the drill holds every record until the heal.
#[test]
fn a_drill_can_cut_one_brokers_link_by_name() {
    use crate::common::run::{run_drill, scenario, show};
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        "kafka-one-broker",
        "name: kafka-one-broker\n\
         destination: { kind: kafka, runtime: process, topic: one-broker }\n\
         workload: { rate: 100/s, duration: 12s, keys: 4 }\n\
         faults:\n  - { at: 3s, link: kafka-111, fault: refuse, for: 5s }\n\
         expect: { lost: 0, ledger: closes, recovery_within: 5s }\n",
    );
    let ran = run_drill(&file, "kafka-one-broker", &[]);
    assert_eq!(ran.output.status.code(), Some(0), "{}", show(&ran.output));
    let faults = ran.report["faults"].to_string();
    assert!(faults.contains("link kafka-111"), "{faults}");
    // The fault met the engine's traffic: nothing inconclusive about it.
    assert_eq!(ran.report["inconclusive"].as_array().map(Vec::len), Some(0));
    assert!(
        ran.markdown.contains("kafka-111 (127.0.0.1:"),
        "the link line names the broker link: {}",
        ran.markdown
    );
    let recovery = &ran.report["recovery"][0];
    println!("one broker's link refused 5 s: {recovery}");
    assert!(
        recovery["first_delivery_ms"].as_u64().unwrap() >= recovery["heal_ms"].as_u64().unwrap()
    );
}

/// `kcat` with `args` and `input` on stdin, stopped after `within`: (exit code, stdout,
/// stderr); `None` as the code when it had to be stopped.
async fn kcat(args: &[&str], input: &str, within: Duration) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::new("kcat");
    // As drill starts a user's engine: without the librdkafka of drill's own build, which
    // `cargo test` puts on LD_LIBRARY_PATH (with it, kcat would not be the old client).
    let mut child = drill::process::with_user_library_path(&mut command)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kcat is installed (ci/setup.sh)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let stdout = tokio::spawn(async move {
        let mut o = String::new();
        let _ = out.read_to_string(&mut o).await;
        o
    });
    let stderr = tokio::spawn(async move {
        let mut e = String::new();
        let _ = err.read_to_string(&mut e).await;
        e
    });
    let code = match tokio::time::timeout(within, child.wait()).await {
        Ok(status) => status.ok().and_then(|s| s.code()),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    };
    (code, stdout.await.unwrap(), stderr.await.unwrap())
}

/// Debian's kcat (librdkafka 2.0.2, what rsyslog's omkafka and syslog-ng's Kafka driver are
/// built on) cannot read tansu's ApiVersions answer: straight to the broker it gets nowhere
/// ("ApiVersionRequest failed: Local: Read underflow"). Through a Kafka-aware link, which drops
/// the answer's trailing tagged fields, it produces, consumes in a consumer group, commits, and
/// a second consumer in the group resumes where the first stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_librdkafka_produces_and_consumes_in_a_group_through_a_kafka_aware_link() {
    use crate::common::run::required;
    if !required(
        std::process::Command::new("kcat")
            .arg("-V")
            .output()
            .is_ok(),
        "kcat (Debian's, librdkafka 2.0.2)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let broker = drill::dest::kafka::broker::start_kafka(dir.path(), None, None)
        .await
        .expect("tansu is installed (ci/setup.sh)");
    let topic = "kcat-old-client";
    drill::dest::kafka::topic::create_topic(broker.addr, topic, 1)
        .await
        .unwrap();
    let lines: String = (0..100).map(|i| format!("line-{i}\n")).collect();

    // Straight to tansu: the failure the rewrite exists for.
    let direct = broker.addr.to_string();
    let (code, _, err) = kcat(
        &["-P", "-b", &direct, "-t", topic, "-m", "5"],
        &lines,
        Duration::from_secs(20),
    )
    .await;
    println!(
        "kcat straight to tansu: exit {code:?}; {}",
        err.lines().next().unwrap_or("")
    );
    assert_ne!(code, Some(0), "kcat produced straight to tansu: {err}");
    assert!(err.contains("ApiVersion"), "{err}");

    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let cancel = CancellationToken::new();
    let link = Link::start_kafka("kafka", any, broker.addr, cancel.clone())
        .await
        .unwrap();
    let via = link.listen_addr().to_string();
    // Two producer runs, 60 lines then 40: the group's commit at 60 falls on a batch boundary.
    // tansu 0.6 answers a fetch that starts inside a batch with the next batch, skipping the
    // rest of the one asked for, or with nothing while there is none (measured with kcat on
    // librdkafka 2.0.2 and on drill's newer one alike: `-o 60` of a 100-line batch then a
    // 40-line one reads line-100 on).
    let split = lines.match_indices('\n').nth(59).unwrap().0 + 1;
    for part in [&lines[..split], &lines[split..]] {
        let (code, _, err) = kcat(
            &["-P", "-b", &via, "-t", topic],
            part,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(code, Some(0), "kcat through the link: {err}");
    }
    assert_eq!(in_topic_lines(broker.addr, topic).await, 100);

    // A consumer group: the first member takes 60 and commits as it closes, the second
    // resumes at 60 and reads to the end.
    // (No `-o`: in a group kcat would apply it to every partition assigned, over the commit.)
    let group = [
        "-b",
        &via,
        "-G",
        "drill-kcat",
        "-X",
        "auto.offset.reset=earliest",
    ];
    let first: Vec<&str> = group.iter().copied().chain(["-c", "60", topic]).collect();
    let (code, got, err) = kcat(&first, "", Duration::from_secs(90)).await;
    assert_eq!(code, Some(0), "first consumer: {err}");
    assert_eq!(got.lines().count(), 60, "{got}");
    assert_eq!(got.lines().next(), Some("line-0"));
    let second: Vec<&str> = group.iter().copied().chain(["-c", "40", topic]).collect();
    let (code, got, err) = kcat(&second, "", Duration::from_secs(90)).await;
    assert_eq!(code, Some(0), "second consumer: {err}\n{got}");
    let got: Vec<&str> = got.lines().collect();
    assert_eq!(
        got.first(),
        Some(&"line-60"),
        "resumed at the committed offset: {got:?}"
    );
    assert_eq!(got.len(), 40);

    let status = link.family_status();
    println!(
        "through the link: {} ApiVersions answers trimmed, {} answers rewritten",
        status.api_versions_trimmed, status.answers_rewritten
    );
    assert!(status.api_versions_trimmed >= 3, "{status:?}");
    link.shutdown().await;
}

/// Records in `topic` (each counted once per copy), read straight from the broker.
async fn in_topic_lines(broker: SocketAddr, topic: &str) -> usize {
    let got = drill::dest::kafka::read::read_topic(broker, topic, Duration::from_secs(60), None)
        .await
        .unwrap();
    got.arrivals.len()
}
