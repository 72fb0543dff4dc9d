//! The Kafka-aware link's codec against answers captured from real traffic with the broker here
//! (`fixtures/kafka/`, see its README): every Metadata, FindCoordinator and DescribeCluster
//! version the broker serves, in both encodings, asked by a raw client, and every version
//! drill's engine's librdkafka sends (negotiated, and the older ones it falls back to).
//!
//! For each captured answer: the broker addresses are found, rewritten to new ones, found
//! again as rewritten; every byte after the last address is unchanged; and rewriting back
//! gives the captured bytes exactly.
//!
//! `capture_fixtures` (ignored; needs tansu) is how the fixtures were made:
//! `cargo test --test suite -- --ignored kafka_codec::capture_fixtures --nocapture`.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drill::wire::kafka::{
    self, BrokerAddress, DESCRIBE_CLUSTER, FIND_COORDINATOR, METADATA, brokers, located, rewrite,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kafka")
}

fn api_name(key: i16) -> &'static str {
    match key {
        METADATA => "metadata",
        FIND_COORDINATOR => "find-coordinator",
        DESCRIBE_CLUSTER => "describe-cluster",
        _ => "other",
    }
}

/// `(source, api key, version, answer)` for every fixture.
fn captured() -> Vec<(String, i16, i16, Vec<u8>)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(fixtures()).expect("fixtures/kafka exists") {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".bin") else {
            continue;
        };
        // <source>-<api>-v<version>.bin
        let (rest, version) = stem.rsplit_once("-v").unwrap();
        let version: i16 = version.parse().unwrap();
        let (source, api) = rest.split_once('-').unwrap();
        let key = match api {
            "metadata" => METADATA,
            "find-coordinator" => FIND_COORDINATOR,
            "describe-cluster" => DESCRIBE_CLUSTER,
            other => panic!("unknown api in fixture name {other}"),
        };
        all.push((
            source.to_string(),
            key,
            version,
            std::fs::read(&path).unwrap(),
        ));
    }
    all.sort_by(|a, b| (a.1, a.2, &a.0).cmp(&(b.1, b.2, &b.0)));
    all
}

#[test]
fn every_captured_answer_round_trips_with_its_addresses_rewritten() {
    let all = captured();
    let mut seen: BTreeMap<(i16, bool), Vec<i16>> = BTreeMap::new();
    for (source, key, version, frame) in &all {
        let what = format!("{source} {} v{version}", api_name(*key));
        let before = brokers(*key, *version, frame).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!before.is_empty(), "{what}: no broker address found");
        let to = |b: &BrokerAddress| Some(("drill-link.test".to_string(), 40_000 + b.node_id));
        let new = rewrite(*key, *version, frame, to).unwrap();
        let after = brokers(*key, *version, &new).unwrap();
        assert_eq!(after.len(), before.len(), "{what}");
        for (a, b) in after.iter().zip(&before) {
            assert_eq!(a.node_id, b.node_id, "{what}");
            if b.node_id >= 0 && !b.host.is_empty() {
                assert_eq!(a.host, "drill-link.test", "{what}");
                assert_eq!(a.port, 40_000 + b.node_id, "{what}");
            }
        }
        // Between the addresses, every byte is as captured.
        let (old_at, new_at) = (
            located(*key, *version, frame).unwrap(),
            located(*key, *version, &new).unwrap(),
        );
        let gaps = |at: &[(BrokerAddress, std::ops::Range<usize>)], len: usize| {
            let mut from = 0;
            let mut gaps = Vec::new();
            for (_, span) in at {
                gaps.push(from..span.start);
                from = span.end;
            }
            gaps.push(from..len);
            gaps
        };
        for (a, b) in gaps(&old_at, frame.len())
            .into_iter()
            .zip(gaps(&new_at, new.len()))
        {
            assert_eq!(
                frame[a], new[b],
                "{what}: a byte outside the addresses changed"
            );
        }
        assert_eq!(
            new.len() as isize - frame.len() as isize,
            before
                .iter()
                .filter(|b| b.node_id >= 0 && !b.host.is_empty())
                .map(|b| "drill-link.test".len() as isize - b.host.len() as isize)
                .sum::<isize>(),
            "{what}: only the host names changed length"
        );
        let originals: HashMap<i32, (String, i32)> = before
            .iter()
            .map(|b| (b.node_id, (b.host.clone(), b.port)))
            .collect();
        let back = rewrite(*key, *version, &new, |b| originals.get(&b.node_id).cloned()).unwrap();
        assert_eq!(
            &back, frame,
            "{what}: rewriting back gives the captured bytes"
        );
        seen.entry((*key, kafka::flexible(*key, *version)))
            .or_default()
            .push(*version);
    }
    println!("fixtures by (api, flexible): {seen:?}");
    // Both encodings of Metadata and FindCoordinator, and DescribeCluster, are covered.
    for need in [
        (METADATA, false),
        (METADATA, true),
        (FIND_COORDINATOR, false),
        (FIND_COORDINATOR, true),
        (DESCRIBE_CLUSTER, true),
    ] {
        assert!(seen.contains_key(&need), "no fixture for {need:?}");
    }
    // The versions librdkafka sent are among them.
    assert!(all.iter().any(|f| f.0 == "librdkafka" && f.1 == METADATA));
    assert!(
        all.iter()
            .any(|f| f.0 == "librdkafka" && f.1 == FIND_COORDINATOR)
    );
}

// ---- Capturing (ignored: needs tansu; writes fixtures/kafka) ----

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut frame = vec![0u8; i32::from_be_bytes(len).max(0) as usize];
    s.read_exact(&mut frame)?;
    Ok(frame)
}

fn write_frame(s: &mut TcpStream, frame: &[u8]) -> std::io::Result<()> {
    s.write_all(&(frame.len() as i32).to_be_bytes())?;
    s.write_all(frame)
}

/// Saves `<source>-<api>-v<version>.bin` once.
fn save(source: &str, key: i16, version: i16, frame: &[u8]) {
    let path = fixtures().join(format!("{source}-{}-v{version}.bin", api_name(key)));
    if !path.exists() {
        std::fs::write(&path, frame).unwrap();
        println!("captured {}", path.display());
    }
}

/// A tap between librdkafka and the broker: frames pass unchanged, answers that carry broker
/// addresses are saved.
fn tap(broker: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(broker) else {
                continue;
            };
            let pending: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let p2 = pending.clone();
            std::thread::spawn(move || {
                while let Ok(f) = read_frame(&mut c2) {
                    let key = i16::from_be_bytes([f[0], f[1]]);
                    let version = i16::from_be_bytes([f[2], f[3]]);
                    let corr = i32::from_be_bytes([f[4], f[5], f[6], f[7]]);
                    if kafka::carries_brokers(key) {
                        p2.lock().unwrap().insert(corr, (key, version));
                    }
                    if write_frame(&mut s2, &f).is_err() {
                        break;
                    }
                }
                let _ = s2.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                while let Ok(f) = read_frame(&mut server) {
                    let corr = i32::from_be_bytes([f[0], f[1], f[2], f[3]]);
                    if let Some((key, version)) = pending.lock().unwrap().remove(&corr) {
                        save("librdkafka", key, version, &f);
                    }
                    if write_frame(&mut client, &f).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

fn put_string(out: &mut Vec<u8>, s: &str, compact: bool) {
    if compact {
        out.push(s.len() as u8 + 1);
    } else {
        out.extend_from_slice(&(s.len() as i16).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

/// One request of a raw client; the answer without its length prefix.
fn call(s: &mut TcpStream, key: i16, version: i16, corr: i32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&corr.to_be_bytes());
    put_string(&mut f, "drill-capture", false);
    if kafka::flexible(key, version) {
        f.push(0); // request header v2: no tagged fields
    }
    f.extend_from_slice(body);
    write_frame(s, &f).unwrap();
    read_frame(s).unwrap()
}

/// The versions of each api the broker serves (ApiVersions v0).
fn api_versions(s: &mut TcpStream) -> HashMap<i16, (i16, i16)> {
    let a = call(s, 18, 0, 1, &[]);
    let mut at = 4 + 2; // correlation id, error code
    let n = i32::from_be_bytes(a[at..at + 4].try_into().unwrap());
    at += 4;
    let mut out = HashMap::new();
    for _ in 0..n {
        let g = |i: usize| i16::from_be_bytes([a[i], a[i + 1]]);
        out.insert(g(at), (g(at + 2), g(at + 4)));
        at += 6;
    }
    out
}

fn metadata_request(version: i16, topic: &str) -> Vec<u8> {
    let flex = version >= 9;
    let mut b = Vec::new();
    if flex {
        b.push(2); // one topic
        if version >= 10 {
            b.extend_from_slice(&[0u8; 16]); // topic id: none
        }
        put_string(&mut b, topic, true);
        b.push(0);
    } else {
        b.extend_from_slice(&1i32.to_be_bytes());
        put_string(&mut b, topic, false);
    }
    if version >= 4 {
        b.push(0); // allow_auto_topic_creation
    }
    if (8..=10).contains(&version) {
        b.push(0); // include_cluster_authorized_operations
    }
    if version >= 8 {
        b.push(0); // include_topic_authorized_operations
    }
    if flex {
        b.push(0);
    }
    b
}

fn find_coordinator_request(version: i16, group: &str) -> Vec<u8> {
    let mut b = Vec::new();
    match version {
        0 => put_string(&mut b, group, false),
        1 | 2 => {
            put_string(&mut b, group, false);
            b.push(0); // key_type: group
        }
        3 => {
            put_string(&mut b, group, true);
            b.push(0);
            b.push(0);
        }
        _ => {
            b.push(0); // key_type
            b.push(2); // one key
            put_string(&mut b, group, true);
            b.push(0);
        }
    }
    b
}

fn describe_cluster_request(version: i16) -> Vec<u8> {
    let mut b = vec![0u8]; // include_cluster_authorized_operations
    if version >= 1 {
        b.push(1); // endpoint_type: brokers
    }
    if version >= 2 {
        b.push(0); // include_fenced_brokers
    }
    b.push(0);
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "makes the fixtures: needs tansu; run by hand"]
async fn capture_fixtures() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    std::fs::create_dir_all(fixtures()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = drill::process::free_port().unwrap();
    let broker_addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let tap_addr = tap(broker_addr);
    // The broker advertises the tap, so every librdkafka connection passes it.
    let broker = drill::dest::kafka::broker::start_kafka(dir.path(), Some(port), Some(tap_addr))
        .await
        .expect("tansu is installed");
    drill::dest::kafka::topic::create_topic(tap_addr, "drill", 1)
        .await
        .unwrap();

    // A raw client: every version the broker serves.
    let mut s = TcpStream::connect(broker.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let served = api_versions(&mut s);
    println!("the broker serves {served:?}");
    let mut corr = 100;
    for key in [METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER] {
        let Some(&(min, max)) = served.get(&key) else {
            println!("the broker does not serve {}", api_name(key));
            continue;
        };
        for version in min..=max {
            corr += 1;
            let body = match key {
                METADATA => metadata_request(version, "drill"),
                FIND_COORDINATOR => find_coordinator_request(version, "drill-group"),
                _ => describe_cluster_request(version),
            };
            let answer = call(&mut s, key, version, corr, &body);
            save("tansu", key, version, &answer);
        }
    }

    // librdkafka as the engine runs it (versions negotiated), and as it falls back for older
    // brokers (no ApiVersions request).
    let settings: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![
            ("api.version.request", "false"),
            ("broker.version.fallback", "0.9.0"),
        ],
        vec![
            ("api.version.request", "false"),
            ("broker.version.fallback", "0.10.0"),
        ],
        vec![
            ("api.version.request", "false"),
            ("broker.version.fallback", "0.11.0"),
        ],
        vec![
            ("api.version.request", "false"),
            ("broker.version.fallback", "1.0.0"),
        ],
        vec![
            ("api.version.request", "false"),
            ("broker.version.fallback", "2.0.0"),
        ],
    ];
    for extra in settings {
        let extra2 = extra.clone();
        let tap = tap_addr.to_string();
        tokio::task::spawn_blocking(move || {
            let mut config = rdkafka::ClientConfig::new();
            config.set("bootstrap.servers", &tap);
            for (k, v) in &extra2 {
                config.set(*k, *v);
            }
            let producer: BaseProducer = config
                .clone()
                .set("enable.idempotence", "true")
                .create()
                .unwrap();
            let _ = producer.send(BaseRecord::to("drill").payload("x").key("k"));
            let _ = producer.flush(Duration::from_secs(5));
            let consumer: BaseConsumer = config.set("group.id", "drill-capture").create().unwrap();
            consumer.subscribe(&["drill"]).unwrap();
            for _ in 0..15 {
                let _ = consumer.poll(Duration::from_millis(200));
            }
        })
        .await
        .unwrap();
        println!("librdkafka with {extra:?} done");
    }
}
