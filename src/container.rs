//! The container runtime: brokers as containers, started and removed through testcontainers.
//!
//! Official images by default (`eclipse-mosquitto:2`, `nats:2.11`, `apache/kafka:3.9.1`), each
//! overridable by `DRILL_IMAGE_MQTT`, `DRILL_IMAGE_NATS`, `DRILL_IMAGE_KAFKA` (pinned digests,
//! offline mirrors, or the `drill-local/*` images `ci/images.sh` builds from local binaries).
//! drill runs the broker binary itself (entrypoint + arguments), so an image only needs the
//! binary where the official image has it: `/usr/sbin/mosquitto`, `/nats-server`; a Kafka
//! image is either `apache/kafka` (configured by environment, KRaft single node) or, when its
//! name says `drill-local/kafka` or `tansu`, tansu at `/usr/local/bin/tansu`.
//!
//! Every container carries the labels `drill=1` and `drill.run=<run id>`, publishes its one
//! port on 127.0.0.1 only, and is removed when its [`ContainerBroker`] is stopped or dropped
//! (normal end, error, SIGINT, SIGTERM, panic). A NATS server advertises the proxy's address,
//! never its own; a Kafka broker advertises its own published address (fixed in advance), which
//! the Kafka-aware link rewrites in its answers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
pub use testcontainers::bollard::Docker;
use testcontainers::core::{ContainerPort, IntoContainerPort};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::brokers::BrokerError;
use crate::scenario::DestinationKind;

/// The label every drill container carries (for finding leftovers: `docker ps -a --filter
/// label=drill`).
pub const LABEL: &str = "drill";

/// The image for a destination kind: the environment's override, else the official image.
pub fn image_for(kind: DestinationKind) -> String {
    let (var, official) = match kind {
        DestinationKind::Mqtt => ("DRILL_IMAGE_MQTT", "eclipse-mosquitto:2"),
        DestinationKind::Nats => ("DRILL_IMAGE_NATS", "nats:2.11"),
        DestinationKind::Kafka => ("DRILL_IMAGE_KAFKA", "apache/kafka:3.9.1"),
    };
    std::env::var(var)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| official.to_string())
}

/// A Docker engine that answered a ping, or why not.
pub async fn daemon() -> Result<Docker, String> {
    let docker = Docker::connect_with_defaults().map_err(|e| format!("no Docker engine: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(3), docker.ping()).await {
        Ok(Ok(_)) => Ok(docker),
        Ok(Err(e)) => Err(format!("no Docker engine answers: {e}")),
        Err(_) => Err("no Docker engine answers within 3 s".to_string()),
    }
}

/// The image's id, pulling it first when it is not present; `Err` says why it cannot be had.
pub async fn ensure_image(docker: &Docker, image: &str) -> Result<String, String> {
    if let Ok(found) = docker.inspect_image(image).await {
        return Ok(found.id.unwrap_or_default());
    }
    let (name, tag) = split_image(image);
    let options = testcontainers::bollard::query_parameters::CreateImageOptions {
        from_image: Some(name.to_string()),
        tag: Some(tag.to_string()),
        ..Default::default()
    };
    let mut pull = docker.create_image(Some(options), None, None);
    while let Some(step) = pull.next().await {
        if let Err(e) = step {
            return Err(format!("image {image} cannot be pulled: {e}"));
        }
    }
    docker
        .inspect_image(image)
        .await
        .map(|i| i.id.unwrap_or_default())
        .map_err(|e| format!("image {image} is not there after a pull: {e}"))
}

/// `name:tag` (a digest or no tag count as `latest` where there is none).
fn split_image(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, tag),
        _ => (image, "latest"),
    }
}

/// Removes every container labelled `drill.run=<run>` (created or running).
pub async fn remove_labelled(docker: &Docker, run: &str) {
    use testcontainers::bollard::query_parameters::{
        ListContainersOptions, RemoveContainerOptions,
    };
    let filters = [("label".to_string(), vec![format!("drill.run={run}")])]
        .into_iter()
        .collect();
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for c in list {
        if let Some(id) = c.id {
            let _ = docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptions {
                        force: true,
                        v: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
    }
}

/// A broker running in a container.
pub struct ContainerBroker {
    container: Option<ContainerAsync<GenericImage>>,
    docker: Docker,
    kind: DestinationKind,
    port: ContainerPort,
    /// Where it listens on this machine (127.0.0.1 and the published port).
    pub addr: SocketAddr,
    pub image: String,
    pub image_id: String,
}

impl ContainerBroker {
    pub fn id(&self) -> Option<&str> {
        self.container.as_ref().map(|c| c.id())
    }

    /// SIGKILL inside the container; it stays, stopped, until [`ContainerBroker::restart`].
    pub async fn kill(&mut self) {
        if let Some(id) = self.id() {
            let _ = self.docker.kill_container(id, None).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; it stays, stopped, until [`ContainerBroker::restart`].
    pub async fn stop(&mut self) {
        if let Some(c) = &self.container {
            let _ = c.stop_with_timeout(Some(10)).await;
        }
    }

    pub async fn pause(&mut self) {
        if let Some(c) = &self.container {
            let _ = c.pause().await;
        }
    }

    pub async fn resume(&mut self) {
        if let Some(c) = &self.container {
            let _ = c.unpause().await;
        }
    }

    /// Starts the (killed or stopped) container again, and waits (at most 60 s) until the
    /// broker answers. Its published port may change: the new address is returned, and the
    /// caller points the proxy link at it.
    pub async fn restart(&mut self) -> Result<SocketAddr, BrokerError> {
        let fail = |why: String| BrokerError::Start {
            what: format!("container {}", self.image),
            why,
        };
        let id = self
            .id()
            .ok_or_else(|| fail("the container is gone".to_string()))?
            .to_string();
        self.docker
            .start_container(&id, None)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let inspect = self
            .docker
            .inspect_container(&id, None)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let key = format!("{}/tcp", self.port.as_u16());
        let port = inspect
            .network_settings
            .and_then(|n| n.ports)
            .and_then(|p| p.get(&key).cloned().flatten())
            .and_then(|b| b.into_iter().find_map(|b| b.host_port))
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| fail(format!("no published port for {key} after the restart")))?;
        self.addr = ([127, 0, 0, 1], port).into();
        wait_answers(self.kind, self.addr)
            .await
            .map_err(|e| fail(format!("no answer on {} within 60 s: {e}", self.addr)))?;
        Ok(self.addr)
    }

    /// Removes the container.
    pub async fn remove(&mut self) {
        if let Some(c) = self.container.take() {
            let _ = c.rm().await;
        }
    }
}

/// How the broker binary is started inside the container.
struct Launch {
    entrypoint: &'static str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    files: Vec<(String, Vec<u8>)>,
    port: u16,
}

fn launch(
    kind: DestinationKind,
    image: &str,
    advertise: SocketAddr,
    message_limit: Option<usize>,
) -> Launch {
    match kind {
        DestinationKind::Mqtt => {
            let mut conf = "listener 1883 0.0.0.0\nallow_anonymous true\nuser root\npersistence true\npersistence_location /tmp/\nmax_queued_messages 0\nmax_queued_bytes 0\nmax_inflight_messages 0\nmax_keepalive 65535\n".to_string();
            if let Some(limit) = message_limit {
                conf.push_str(&format!("message_size_limit {limit}\n"));
            }
            Launch {
                entrypoint: "/usr/sbin/mosquitto",
                args: vec!["-c".into(), "/tmp/drill-mosquitto.conf".into()],
                env: Vec::new(),
                files: vec![("/tmp/drill-mosquitto.conf".into(), conf.into_bytes())],
                port: 1883,
            }
        }
        DestinationKind::Nats => Launch {
            entrypoint: "/nats-server",
            args: vec![
                "-js".into(),
                "-sd".into(),
                "/tmp/js".into(),
                "-p".into(),
                "4222".into(),
                "--client_advertise".into(),
                advertise.to_string(),
            ],
            env: Vec::new(),
            files: Vec::new(),
            port: 4222,
        },
        DestinationKind::Kafka
            if image.contains("drill-local/kafka") || image.contains("tansu") =>
        {
            Launch {
                entrypoint: "/usr/local/bin/tansu",
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
            }
        }
        DestinationKind::Kafka => Launch {
            entrypoint: "/etc/kafka/docker/run",
            args: Vec::new(),
            env: [
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
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            files: Vec::new(),
            port: 9092,
        },
    }
}

/// Waits (at most 60 s) until the broker at `addr` answers its protocol.
async fn wait_answers(kind: DestinationKind, addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), answers(kind, addr)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if Instant::now() > deadline => return Err(e),
            Err(_) if Instant::now() > deadline => return Err("no answer".to_string()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Whether the broker at `addr` answers its own protocol: an MQTT CONNECT, a JetStream
/// account-info request, a Kafka metadata request (to the bootstrap connection itself).
pub async fn answers(kind: DestinationKind, addr: SocketAddr) -> Result<(), String> {
    let limit = Duration::from_secs(3);
    match kind {
        DestinationKind::Mqtt => crate::mqtt::connect(addr, "drill-ready", limit, limit)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        DestinationKind::Nats => {
            let client = async_nats::ConnectOptions::new()
                .ignore_discovered_servers()
                .connection_timeout(limit)
                .connect(addr.to_string())
                .await
                .map_err(|e| e.to_string())?;
            tokio::time::timeout(limit, async_nats::jetstream::new(client).query_account())
                .await
                .map_err(|_| "no account-info answer".to_string())?
                .map(drop)
                .map_err(|e| e.to_string())
        }
        DestinationKind::Kafka => {
            use rdkafka::producer::Producer;
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
    }
}

/// Starts a broker of `kind` from `image` (already present), labelled with `run`, its port
/// published on 127.0.0.1. Returns once the broker answers its protocol there.
pub async fn start(
    docker: Docker,
    kind: DestinationKind,
    image: &str,
    image_id: String,
    run: &str,
    advertise: SocketAddr,
    message_limit: Option<usize>,
) -> Result<ContainerBroker, BrokerError> {
    let plan = launch(kind, image, advertise, message_limit);
    let (name, tag) = split_image(image);
    let port = plan.port.tcp();
    let binding = format!("{}/tcp", plan.port);
    // A Kafka broker advertises its own published address, so that port is fixed in advance.
    let host_port = match kind {
        DestinationKind::Kafka => advertise.port().to_string(),
        _ => String::new(),
    };
    let mut request = GenericImage::new(name, tag)
        .with_entrypoint(plan.entrypoint)
        .with_exposed_port(port)
        .with_cmd(plan.args)
        .with_label(LABEL, "1")
        .with_label("drill.run", run)
        .with_startup_timeout(Duration::from_secs(60))
        .with_host_config_modifier(move |host| {
            // Published on loopback only, on a port the engine picks.
            host.publish_all_ports = Some(false);
            host.port_bindings = Some(
                [(
                    binding.clone(),
                    Some(vec![testcontainers::bollard::models::PortBinding {
                        host_ip: Some("127.0.0.1".to_string()),
                        host_port: Some(host_port.clone()),
                    }]),
                )]
                .into_iter()
                .collect(),
            );
        });
    for (k, v) in plan.env {
        request = request.with_env_var(k, v);
    }
    for (path, bytes) in plan.files {
        request = request.with_copy_to(path, bytes);
    }
    let fail = |why: String| BrokerError::Start {
        what: format!("container {image}"),
        why,
    };
    let container = match request.start().await {
        Ok(c) => c,
        Err(e) => {
            // A container that was created but did not start is not removed by testcontainers.
            remove_labelled(&docker, run).await;
            return Err(fail(e.to_string()));
        }
    };
    let host_port = container
        .get_host_port_ipv4(port)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let addr: SocketAddr = ([127, 0, 0, 1], host_port).into();
    // The published port accepts connections before the broker does (Docker's proxy answers
    // for it): wait for the protocol's own answer.
    if let Err(e) = wait_answers(kind, addr).await {
        let _ = container.rm().await;
        return Err(fail(format!("no answer on {addr} within 60 s: {e}")));
    }
    Ok(ContainerBroker {
        container: Some(container),
        docker,
        kind,
        port,
        addr,
        image: image.to_string(),
        image_id,
    })
}
