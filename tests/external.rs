//! `runtime: external`: the test starts the brokers itself (a 3-node NATS cluster, a mosquitto
//! that wants a password, a Kafka-protocol broker that advertises itself), then runs `drill
//! run` against them as a user would against theirs:
//!
//! - the verdict is the one the same drill gets on brokers drill starts itself;
//! - drill starts nothing, and leaves nothing it created (the stream or topic is gone after the
//!   drill) unless `keep: true`; what existed before is left as it was and not read;
//! - credentials come from environment variables the scenario names (a variable not set is one
//!   line and exit 3); broker faults are refused in one line (exit 2); an address nothing
//!   listens on is one line and exit 3.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::common::run::{Ran, run_drill, run_drill_with, scenario, show};

/// A drill of 12 s at 100 records/s with the link refused from 3 s to 7 s.
fn drill_text(name: &str, destination: &str, link: &str) -> String {
    format!(
        "name: {name}\n\
         destination: {destination}\n\
         workload: {{ rate: 100/s, duration: 12s, keys: 4 }}\n\
         faults:\n  - {{ at: 3s, link: {link}, fault: refuse, for: 4s }}\n\
         expect: {{ lost: 0, duplicates: 0, ledger: closes }}\n"
    )
}

fn verdict(ran: &Ran) -> (String, u64, u64) {
    let r = &ran.report;
    (
        r["verdict"].as_str().unwrap_or("?").to_string(),
        r["ledger"]["held"].as_u64().unwrap_or(0),
        r["ledger"]["lost"].as_u64().unwrap_or(u64::MAX),
    )
}

/// Runs the same drill on a broker drill starts itself (`destination`) and asserts the verdict
/// and the lost count equal the external run's.
fn agrees_with_managed(dir: &Path, name: &str, destination: &str, link: &str, external: &Ran) {
    let file = scenario(dir, name, &drill_text(name, destination, link));
    let managed = run_drill(&file, name, &[]);
    assert_eq!(
        managed.output.status.code(),
        Some(0),
        "{}",
        show(&managed.output)
    );
    let (ve, he, le) = verdict(external);
    let (vm, _, lm) = verdict(&managed);
    println!("{name}: external {ve}, {he} held, {le} lost; managed {vm}, {lm} lost");
    assert_eq!((ve.as_str(), le), (vm.as_str(), lm));
    assert!(he > 1000, "{he} held");
}

async fn stream_exists(server: SocketAddr, name: &str) -> bool {
    let client = async_nats::connect(server.to_string()).await.unwrap();
    async_nats::jetstream::new(client)
        .get_stream(name)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_nats_cluster_gets_the_managed_verdict_and_keeps_nothing_drill_made() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3)
        .map(|_| drill::process::free_port().unwrap())
        .collect();
    let own: Vec<SocketAddr> = ports.iter().map(|p| ([127, 0, 0, 1], *p).into()).collect();
    // A cluster of the user's: its servers advertise themselves.
    let _cluster = drill::dest::nats::broker::start_nats_cluster(dir.path(), &ports, &own, None)
        .await
        .expect("nats-server is installed (ci/setup.sh)");
    let servers = own
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let ext = scenario(
        dir.path(),
        "ext-nats",
        &drill_text(
            "ext-nats",
            &format!(
                "{{ kind: nats, runtime: external, servers: [{servers}], topic: ext.data, stream: EXTDRILL, create: true }}"
            ),
            "nats-1",
        ),
    );
    let external = run_drill(&ext, "ext-nats", &[]);
    assert_eq!(
        external.output.status.code(),
        Some(0),
        "{}",
        show(&external.output)
    );
    assert!(
        external
            .markdown
            .contains("was created by drill and is removed at the end"),
        "{}",
        external.markdown
    );
    // Nothing drill created is left.
    assert!(
        !stream_exists(own[0], "EXTDRILL").await,
        "the stream drill created is gone"
    );

    agrees_with_managed(
        dir.path(),
        "managed-nats",
        "{ kind: nats, runtime: process, nodes: 3, topic: ext.data }",
        "nats-1",
        &external,
    );

    // keep: true keeps what drill made; a second drill then finds it and reads only its own.
    let kept = scenario(
        dir.path(),
        "ext-nats-keep",
        &drill_text(
            "ext-nats-keep",
            &format!(
                "{{ kind: nats, runtime: external, servers: [{servers}], topic: ext.data, stream: KEPT, create: true, keep: true }}"
            ),
            "nats-1",
        ),
    );
    let first = run_drill(&kept, "ext-nats-keep", &[]);
    assert_eq!(
        first.output.status.code(),
        Some(0),
        "{}",
        show(&first.output)
    );
    assert!(stream_exists(own[0], "KEPT").await);
    let again = run_drill(&kept, "ext-nats-keep", &["--seed", "2"]);
    assert_eq!(
        again.output.status.code(),
        Some(0),
        "{}",
        show(&again.output)
    );
    assert!(
        again.markdown.contains("existed already"),
        "{}",
        again.markdown
    );
    assert_eq!(again.report["ledger"]["unexpected"].as_u64(), Some(0));
    assert!(
        stream_exists(own[0], "KEPT").await,
        "what existed is left as it was"
    );
}

#[test]
fn broker_faults_and_unreachable_brokers_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let with_broker_fault = scenario(
        dir.path(),
        "ext-broker-fault",
        "name: ext-broker-fault\n\
         destination: { kind: kafka, runtime: external, bootstrap: [127.0.0.1:9] }\n\
         workload: { rate: 10/s, duration: 5s }\n\
         faults:\n  - { at: 1s, target: broker, action: kill, restart_after: 1s }\n",
    );
    let o = run_drill(&with_broker_fault, "ext-broker-fault", &[]).output;
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("broker faults are refused for external brokers"),
        "{err}"
    );
    assert!(
        err.contains("ext-broker-fault.yaml:5"),
        "names file and line: {err}"
    );

    // Nothing listens on port 9 here: one line, exit 3, nothing started.
    let unreachable = scenario(
        dir.path(),
        "ext-unreachable",
        "name: ext-unreachable\n\
         destination: { kind: mqtt, runtime: external, address: 127.0.0.1:9 }\n\
         workload: { rate: 10/s, duration: 5s }\n",
    );
    let o = run_drill(&unreachable, "ext-unreachable", &[]).output;
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot reach the external broker at 127.0.0.1:9"),
        "{err}"
    );
}

/// A mosquitto that admits only `drill-user` with its password.
fn mosquitto_with_password(dir: &Path) -> (std::process::Child, SocketAddr) {
    let passwords = dir.join("passwords");
    let made = std::process::Command::new("mosquitto_passwd")
        .args(["-b", "-c"])
        .arg(&passwords)
        .args(["drill-user", "s3cret-Pass"])
        .status()
        .expect("mosquitto_passwd is installed (Debian: mosquitto)");
    assert!(made.success());
    let port = drill::process::free_port().unwrap();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\npersistence false\nmax_queued_messages 0\n",
            passwords.display()
        ),
    )
    .unwrap();
    let child =
        std::process::Command::new(drill::dest::mqtt::broker::mosquitto_path().expect("mosquitto"))
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "mosquitto did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, addr)
}

#[test]
fn an_external_mqtt_broker_takes_credentials_from_the_environment_only() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, addr) = mosquitto_with_password(dir.path());
    let file = scenario(
        dir.path(),
        "ext-mqtt",
        &drill_text(
            "ext-mqtt",
            &format!(
                "{{ kind: mqtt, runtime: external, address: \"{addr}\", topic: ext/data, credentials: {{ username_env: DRILL_TEST_MQTT_USER, password_env: DRILL_TEST_MQTT_PASSWORD }} }}"
            ),
            "mqtt",
        ),
    );
    // The variables not set: one line naming the first, exit 3.
    let o = run_drill(&file, "ext-mqtt", &[]).output;
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("`DRILL_TEST_MQTT_USER`"), "{err}");

    let env = [
        ("DRILL_TEST_MQTT_USER", "drill-user"),
        ("DRILL_TEST_MQTT_PASSWORD", "s3cret-Pass"),
    ];
    let ran = run_drill_with(&file, "ext-mqtt", &[], &env);
    let _ = broker.kill();
    assert_eq!(ran.output.status.code(), Some(0), "{}", show(&ran.output));
    let (v, held, lost) = verdict(&ran);
    println!("external mqtt with a password: {v}, {held} held, {lost} lost");
    assert!(held > 1000);
    // The secret appears nowhere drill wrote.
    assert!(!ran.markdown.contains("s3cret-Pass"));
    assert!(!ran.report.to_string().contains("s3cret-Pass"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_kafka_broker_gets_the_managed_verdict_and_older_records_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    // The user's broker advertises itself; it already holds a topic with records of its own.
    let broker = drill::dest::kafka::broker::start_kafka(dir.path(), None, None)
        .await
        .expect("tansu is installed (ci/setup.sh)");
    drill::dest::kafka::topic::create_topic(broker.addr, "site-data", 1)
        .await
        .unwrap();
    let bootstrap = broker.addr.to_string();
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        // One record per batch: tansu 0.6 advances a partition's end by one per batch, not per
        // record, so a batch of several would overlap the next one (a broker bug, not drill's).
        let p: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        for i in 0..50 {
            let payload = format!("{{\"id\":\"older-{i}\"}}");
            p.send(BaseRecord::to("site-data").payload(&payload).key("k"))
                .unwrap();
            p.flush(Duration::from_secs(10)).unwrap();
        }
    })
    .await
    .unwrap();
    let file = scenario(
        dir.path(),
        "ext-kafka",
        &drill_text(
            "ext-kafka",
            &format!(
                "{{ kind: kafka, runtime: external, bootstrap: [{}], topic: site-data }}",
                broker.addr
            ),
            "kafka",
        ),
    );
    let external = run_drill(&file, "ext-kafka", &[]);
    assert_eq!(
        external.output.status.code(),
        Some(0),
        "{}",
        show(&external.output)
    );
    assert!(
        external.markdown.contains("existed already"),
        "{}",
        external.markdown
    );
    assert_eq!(external.report["ledger"]["unexpected"].as_u64(), Some(0));
    let members = external.report["link"]["broker_links"].clone();
    assert!(
        members.as_array().is_some_and(|m| !m.is_empty()),
        "the engine went through a broker link: {members}"
    );

    agrees_with_managed(
        dir.path(),
        "managed-kafka",
        "{ kind: kafka, runtime: process, topic: site-data }",
        "kafka",
        &external,
    );

    // A topic drill creates is gone afterwards; the one that existed is still there.
    let made = scenario(
        dir.path(),
        "ext-kafka-made",
        &drill_text(
            "ext-kafka-made",
            &format!(
                "{{ kind: kafka, runtime: external, bootstrap: [{}], topic: made-by-drill, create: true }}",
                broker.addr
            ),
            "kafka",
        ),
    );
    let ran = run_drill(&made, "ext-kafka-made", &[]);
    assert_eq!(ran.output.status.code(), Some(0), "{}", show(&ran.output));
    assert!(!topic_exists(broker.addr, "made-by-drill").await);
    assert!(topic_exists(broker.addr, "site-data").await);
}

async fn topic_exists(broker: SocketAddr, topic: &str) -> bool {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", broker.to_string())
            .set("allow.auto.create.topics", "false")
            .create()
            .unwrap();
        let m = c
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .unwrap();
        m.topics()
            .iter()
            .any(|t| t.error().is_none() && !t.partitions().is_empty())
    })
    .await
    .unwrap()
}
