//! Kafka brokers a drill starts: `tansu` (a Kafka-protocol broker) as a local process, a Kafka
//! in a container (`apache/kafka:3.9.1`, KRaft single node, or `DRILL_IMAGE_KAFKA`; a
//! `drill-local/kafka` or `tansu` image runs tansu), or the user's cluster (`runtime:
//! external`).
//!
//! The broker advertises itself; the link in front of it is Kafka-aware (`proxy::kafka`): it
//! rewrites every broker address in Metadata, FindCoordinator and DescribeCluster answers to a
//! link of its own (`kafka-<node id>`), so no client reaches a broker around the proxy. The
//! drill's topic has one partition ([`PARTITIONS`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::process::Command;

use super::{Kafka, topic};
use crate::container::{self, Launch, Placement};
use crate::dest::running::Place;
use crate::dest::{DestError, Provision, Provisioned, Running, place};
use crate::process::{LocalProcess, free_port};
use crate::proxy::Link;

/// Partitions of a drill's topic: one, so that the order records arrive in is the order they
/// are read back in (reordering is only observable within a partition; the engine keys records
/// by write key, which would scatter a source's sequence across partitions). The reader itself
/// reads any number of partitions.
pub const PARTITIONS: i32 = 1;

/// The image and the variable that overrides it.
pub(crate) const IMAGE: (&str, &str) = ("DRILL_IMAGE_KAFKA", "apache/kafka:3.9.1");

/// Finds the Kafka-protocol broker `tansu`, if installed (on PATH or in ~/.cargo/bin, where
/// `cargo install tansu --features dynostore,libsql` puts it; ci/setup.sh does that).
pub fn tansu_path() -> Option<PathBuf> {
    let more: Vec<PathBuf> = crate::process::cargo_bin().into_iter().collect();
    crate::process::find_binary("tansu", &more)
}

/// A tansu drill started.
pub struct LocalKafka {
    pub addr: SocketAddr,
    pub version: String,
    pub process: LocalProcess,
}

impl LocalKafka {
    /// Stops it (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(&mut self) {
        self.process.stop(false).await;
    }
}

/// Starts a Kafka-protocol broker (`tansu broker`, in-memory storage) as a local process on
/// `port` (one try) or a free port (up to five tries). It advertises `advertise`, or itself
/// when `None` (a drill's Kafka-aware link rewrites the addresses in its answers, so no client
/// bypasses a fault either way).
pub async fn start_kafka(
    work: &Path,
    port: Option<u16>,
    advertise: Option<SocketAddr>,
) -> Result<LocalKafka, DestError> {
    let bin = tansu_path().ok_or_else(|| {
        DestError::Missing(
            "tansu (a Kafka-protocol broker) is not installed; install it: cargo install tansu --features dynostore,libsql (ci/setup.sh does, about 14 minutes)".to_string(),
        )
    })?;
    let store = work.join("kafka");
    std::fs::create_dir_all(&store)?;
    let (process, addr) = crate::process::start_listening("tansu", port, |port| {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let advertised = advertise.unwrap_or(addr);
        let mut command = Command::new(&bin);
        command
            .arg("broker")
            .arg("--listener-url")
            .arg(format!("tcp://{addr}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://{advertised}"))
            .arg("--storage-engine")
            .arg("memory://tansu/")
            .current_dir(&store)
            .stdout(Stdio::from(std::fs::File::create(store.join("tansu.log"))?))
            .stderr(Stdio::from(std::fs::File::create(store.join("tansu.err"))?));
        Ok(command)
    })
    .await?;
    Ok(LocalKafka {
        addr,
        version: "tansu 0.6 (Kafka protocol, memory storage)".to_string(),
        process,
    })
}

/// A Kafka broker in a container, advertising `advertise` (its own published address).
fn launch(image: &str, advertise: SocketAddr) -> Launch {
    let host_port = Some(advertise.port());
    if image.contains("drill-local/kafka") || image.contains("tansu") {
        return Launch {
            entrypoint: "/usr/local/bin/tansu".into(),
            args: vec![
                "broker".into(),
                "--listener-url".into(),
                "tcp://0.0.0.0:9092".into(),
                "--advertised-listener-url".into(),
                format!("tcp://{advertise}"),
                "--storage-engine".into(),
                "memory://tansu/".into(),
            ],
            env: Vec::new(),
            files: Vec::new(),
            port: 9092,
            host_port,
            ..Default::default()
        };
    }
    let env = [
        ("KAFKA_NODE_ID", "1".to_string()),
        ("KAFKA_PROCESS_ROLES", "broker,controller".to_string()),
        (
            "KAFKA_LISTENERS",
            "PLAINTEXT://:9092,CONTROLLER://:9093".to_string(),
        ),
        (
            "KAFKA_ADVERTISED_LISTENERS",
            format!("PLAINTEXT://{advertise}"),
        ),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER".to_string()),
        (
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".to_string(),
        ),
        (
            "KAFKA_CONTROLLER_QUORUM_VOTERS",
            "1@localhost:9093".to_string(),
        ),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1".to_string()),
        (
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "1".to_string(),
        ),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1".to_string()),
    ];
    Launch {
        entrypoint: "/etc/kafka/docker/run".into(),
        args: Vec::new(),
        env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        files: Vec::new(),
        port: 9092,
        host_port,
        ..Default::default()
    }
}

/// Whether a Kafka broker answers at `addr`: a metadata request to that connection itself.
pub(crate) fn ready(addr: SocketAddr) -> BoxFuture<'static, Result<(), String>> {
    async move {
        use rdkafka::producer::Producer;
        let limit = Duration::from_secs(3);
        let producer: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", addr.to_string())
            .create()
            .map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, limit)
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }
    .boxed()
}

/// The provisioning of a Kafka destination: the broker, a Kafka-aware link in front of it, and
/// the topic (straight at the broker: it advertises itself).
pub(super) async fn provision(dest: Kafka, p: Provision<'_>) -> Result<Provisioned, DestError> {
    if let Some(ext) = &p.spec.external {
        return external(dest, p, ext).await;
    }
    let mut notes = Vec::new();
    let placement = place(IMAGE, "local tansu", p.runtime, &mut notes).await?;
    crate::dest::check_broker_faults(&p.needs, placement.is_some(), 1)?;
    let dest = Arc::new(dest);
    let running = match placement {
        Some(at) => in_container(dest, at, p.run_id).await?,
        None => {
            let broker = start_kafka(p.work, None, None).await?;
            let place = Place::Local(Some(broker.process));
            Running::new(dest, vec![broker.addr], "process", broker.version, place)
        }
    };
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let name = p.spec.link_name();
    let link = Link::start_kafka(&name, any, running.addrs[0], p.links.clone()).await?;
    topic::create_topic(running.addrs[0], &p.spec.topic, PARTITIONS).await?;
    notes.push(note(&p.spec.topic, &name));
    Ok(Provisioned {
        links: vec![link],
        running,
        notes,
    })
}

/// The broker in a container, advertising its own published address (a host port chosen in
/// advance).
async fn in_container(dest: Arc<Kafka>, at: Placement, run_id: &str) -> Result<Running, DestError> {
    let own = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let launch = launch(&at.image, own);
    let c = container::start(at, launch, run_id, container::ready(ready)).await?;
    let version = c.describe();
    let addr = c.addr;
    Ok(Running::new(
        dest,
        vec![addr],
        "container",
        version,
        Place::Container(Box::new(c)),
    ))
}

/// The user's cluster: one Kafka-aware link at the first bootstrap address (it gives every
/// broker the cluster names a link of its own), the topic found or created, and where the
/// drill's records begin.
async fn external(
    dest: Kafka,
    p: Provision<'_>,
    ext: &crate::dest::External,
) -> Result<Provisioned, DestError> {
    let reached = crate::dest::external::reach_all(p.spec, ext).await?;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let name = p.spec.link_name();
    let bootstrap = reached.servers[0];
    let link = Link::start_kafka(&name, any, bootstrap, p.links.clone()).await?;
    let topic = &p.spec.topic;
    let found = topic::find_or_create(bootstrap, topic, PARTITIONS, ext.create, &reached.secrets)
        .await
        .map_err(DestError::External)?;
    let notes = vec![
        reached.note.clone(),
        note(topic, &name),
        format!(
            "topic `{topic}` {}; the drill's records begin at offsets {:?} (partition, offset)",
            crate::dest::external::made_or_found(found.created, ext.keep),
            found.offsets
        ),
    ];
    let access = crate::verify::Access {
        offsets: found.offsets,
        ..Default::default()
    };
    let made = found.created.then(|| {
        let (topic, secrets) = (topic.clone(), reached.secrets.clone());
        let remove: crate::dest::running::Remove = Box::new(move || {
            async move { topic::delete(bootstrap, &topic, &secrets).await }.boxed()
        });
        remove
    });
    let running =
        crate::dest::external::running(Arc::new(dest), p.spec, ext, reached, access, made);
    Ok(Provisioned {
        links: vec![link],
        running,
        notes,
    })
}

/// What the report says of the drill's Kafka topic and how its brokers are reached.
fn note(topic: &str, link: &str) -> String {
    format!(
        "Kafka topic `{topic}`: {PARTITIONS} partitions; the broker advertises itself and the Kafka-aware link `{link}` rewrites every broker address in its answers to a link of its own (`{link}-<node id>`)"
    )
}

impl From<LocalKafka> for crate::dest::BenchBroker {
    fn from(b: LocalKafka) -> Self {
        crate::dest::BenchBroker {
            addr: b.addr,
            version: b.version,
            process: Some(b.process),
        }
    }
}
