//! Provisioning: the broker (a container, a local process, or the embedded MQTT broker) and
//! the proxy links in front of it, as one [`Rig`] with one teardown.
//!
//! NATS servers advertise the proxy's address, never their own: the link is bound first so the
//! server can be told where it is. Kafka brokers advertise themselves: their link is
//! Kafka-aware and rewrites the addresses in the answers (see `proxy::kafka`). Nothing here
//! knows about the system under test.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{KAFKA_PARTITIONS, RunError, say};
use crate::brokers;
use crate::container;
use crate::proxy::Link;
use crate::scenario::{DestinationKind, FaultAction, Plan, ProcessAction, RuntimeChoice};

/// Everything a drill started outside the system under test.
pub struct Rig {
    /// The destination's broker (for a NATS cluster, a stand-in naming node 1; the nodes
    /// themselves are in `cluster`).
    pub broker: brokers::Broker,
    /// The link the system under test forwards to (the first of `links`).
    pub link: Link,
    /// Every proxy link, one per broker node, named after the destination kind.
    pub links: Vec<Link>,
    /// A NATS cluster's nodes, each killable and restartable on its own; empty otherwise.
    pub cluster: Vec<brokers::NatsNode>,
    /// Brokers in containers (at most one so far).
    pub containers: Vec<container::ContainerBroker>,
    /// What the report should say about how the broker was set up.
    pub notes: Vec<String>,
    /// The JetStream stream of a NATS destination.
    pub(super) stream: String,
    /// Brokers the user runs (`runtime: external`): how to reach them, what drill created.
    pub external: Option<super::external::ExternalRig>,
    /// Cancels every link's tasks.
    pub(super) link_cancel: CancellationToken,
}

impl Rig {
    /// Starts the broker and its links for `plan`, and says what it started.
    pub async fn provision(
        plan: &Plan,
        runtime: RuntimeChoice,
        work: &Path,
        run_id: &str,
        seed: u64,
        cancel: &CancellationToken,
    ) -> Result<Rig, RunError> {
        let io = |source| RunError::Io {
            path: work.to_path_buf(),
            source,
        };
        if let Some(external) = &plan.destination.external {
            return Rig::external(plan, external, runtime, seed, cancel).await;
        }
        let limit = (!plan.workload.poison.is_empty()).then(|| plan.workload.message_limit());
        let link_cancel = cancel.child_token();
        let link_name = plan.destination.link_name();
        let mut notes = Vec::new();
        let mut cluster: Vec<brokers::NatsNode> = Vec::new();
        let mut containers: Vec<container::ContainerBroker> = Vec::new();
        let placement = place(plan.destination.kind, runtime, &mut notes).await?;
        let broker_faults = plan
            .faults
            .iter()
            .any(|f| matches!(f.what, FaultAction::Broker { .. }));
        let pauses = plan.faults.iter().any(|f| {
            matches!(
                f.what,
                FaultAction::Broker {
                    action: ProcessAction::Pause,
                    ..
                }
            )
        });
        if broker_faults && placement.is_none() && (plan.destination.nodes < 2 || pauses) {
            return Err(brokers::BrokerError::ContainerUnavailable(
                "broker faults need the container runtime (pause too) or a NATS cluster (kill, stop); use --runtime container".to_string(),
            )
            .into());
        }
        let mut links: Vec<Link> = Vec::new();
        let (broker, link) = match (plan.destination.kind, placement.clone()) {
            (DestinationKind::Nats, Some((docker, image, image_id))) => {
                if plan.destination.nodes > 1 {
                    return Err(brokers::BrokerError::ContainerUnavailable(
                        "a NATS cluster runs as local processes so far; use --runtime process"
                            .to_string(),
                    )
                    .into());
                }
                let link = Link::start(
                    link_name,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    SocketAddr::from(([127, 0, 0, 1], 9)),
                    link_cancel.clone(),
                )
                .await?;
                let c = container::start(
                    docker,
                    DestinationKind::Nats,
                    &image,
                    image_id,
                    run_id,
                    link.listen_addr(),
                    None,
                )
                .await?;
                link.set_upstream(c.addr);
                let window = plan
                    .destination
                    .duplicate_window
                    .unwrap_or(Duration::from_secs(120));
                brokers::create_stream(
                    c.addr,
                    &plan.destination.stream,
                    &plan.destination.topic,
                    window,
                    limit,
                    1,
                )
                .await?;
                notes.push(stream_note(plan, 1, window));
                let broker = container_broker(&c);
                containers.push(c);
                links.push(link.clone());
                (broker, link)
            }
            (DestinationKind::Nats, None) => {
                // The proxies are bound first, so each server can advertise its own (never itself).
                let mut ports = Vec::new();
                for name in plan.destination.link_names() {
                    let port = brokers::free_port().map_err(io)?;
                    let upstream = SocketAddr::from(([127, 0, 0, 1], port));
                    links.push(
                        Link::start(
                            &name,
                            SocketAddr::from(([127, 0, 0, 1], 0)),
                            upstream,
                            link_cancel.clone(),
                        )
                        .await?,
                    );
                    ports.push(port);
                }
                let advertised: Vec<SocketAddr> = links.iter().map(Link::listen_addr).collect();
                let broker = if ports.len() == 1 {
                    brokers::start_nats(work, Some(ports[0]), Some(advertised[0])).await?
                } else {
                    cluster = brokers::start_nats_cluster(work, &ports, &advertised).await?;
                    brokers::Broker::without_process(
                        cluster[0].addr,
                        "process",
                        format!("nats-server cluster of {} nodes", cluster.len()),
                    )
                };
                let window = plan
                    .destination
                    .duplicate_window
                    .unwrap_or(Duration::from_secs(120));
                let replicas = cluster.len().clamp(1, 3);
                brokers::create_stream(
                    broker.addr,
                    &plan.destination.stream,
                    &plan.destination.topic,
                    window,
                    limit,
                    replicas,
                )
                .await?;
                notes.push(stream_note(plan, replicas, window));
                (broker, links[0].clone())
            }
            (DestinationKind::Kafka, Some((docker, image, image_id))) => {
                // The broker advertises its own published address; the link rewrites it.
                let port = brokers::free_port().map_err(io)?;
                let own = SocketAddr::from(([127, 0, 0, 1], port));
                let c = container::start(
                    docker,
                    DestinationKind::Kafka,
                    &image,
                    image_id,
                    run_id,
                    own,
                    None,
                )
                .await?;
                let link = Link::start_kafka(
                    link_name,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    c.addr,
                    link_cancel.clone(),
                )
                .await?;
                brokers::create_topic(c.addr, &plan.destination.topic, KAFKA_PARTITIONS).await?;
                notes.push(kafka_note(plan));
                let broker = container_broker(&c);
                containers.push(c);
                links.push(link.clone());
                (broker, link)
            }
            (DestinationKind::Kafka, None) => {
                let broker = brokers::start_kafka(work, None, None).await?;
                let link = Link::start_kafka(
                    link_name,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    broker.addr,
                    link_cancel.clone(),
                )
                .await?;
                brokers::create_topic(broker.addr, &plan.destination.topic, KAFKA_PARTITIONS)
                    .await?;
                notes.push(kafka_note(plan));
                links.push(link.clone());
                (broker, link)
            }
            (DestinationKind::Mqtt, Some((docker, image, image_id))) => {
                let c = container::start(
                    docker,
                    DestinationKind::Mqtt,
                    &image,
                    image_id,
                    run_id,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    limit,
                )
                .await?;
                let link = Link::start(
                    link_name,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    c.addr,
                    link_cancel.clone(),
                )
                .await?;
                let broker = container_broker(&c);
                containers.push(c);
                links.push(link.clone());
                (broker, link)
            }
            (DestinationKind::Mqtt, None) => {
                let runtime = if runtime == RuntimeChoice::Container {
                    RuntimeChoice::Auto
                } else {
                    runtime
                };
                let broker = brokers::start_mqtt(runtime, work, limit).await?;
                let link = Link::start(
                    link_name,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    broker.addr,
                    link_cancel.clone(),
                )
                .await?;
                links.push(link.clone());
                (broker, link)
            }
        };
        let rig = Rig {
            broker,
            link,
            links,
            cluster,
            containers,
            notes,
            stream: plan.destination.stream.clone(),
            external: None,
            link_cancel,
        };
        rig.say_provisioned(seed);
        Ok(rig)
    }

    /// Says what was started and where every link points.
    pub(super) fn say_provisioned(&self, seed: u64) {
        if let Some(note) = &self.broker.note {
            say(&format!("  {note}"));
        }
        say(&format!(
            "  broker: {} ({}) on {}",
            self.broker.version, self.broker.runtime, self.broker.addr
        ));
        for note in &self.notes {
            say(&format!("  {note}"));
        }
        for l in &self.links {
            l.seed(seed);
            say(&format!(
                "  proxy link {}: {} -> {}",
                l.name(),
                l.listen_addr(),
                l.upstream_addr()
            ));
        }
    }

    /// Where the verifier reads from: the broker itself, never through the proxy.
    pub fn broker_addrs(&self) -> Vec<SocketAddr> {
        if let Some(e) = &self.external {
            e.servers.clone()
        } else if let Some(c) = self.containers.first() {
            vec![c.addr]
        } else if self.cluster.is_empty() {
            vec![self.broker.addr]
        } else {
            self.cluster.iter().map(|n| n.addr).collect()
        }
    }

    /// Stops every broker process, container and proxy link the drill started.
    pub async fn teardown(&mut self) {
        for l in &self.links {
            l.shutdown().await;
        }
        if let Some(e) = &self.external {
            e.clean_up().await;
        }
        self.link_cancel.cancel();
        for c in self.containers.iter_mut() {
            c.remove().await;
        }
        for node in self.cluster.iter_mut() {
            node.halt(false).await;
        }
        self.broker.stop().await;
    }

    /// Which node of the cluster leads the drill's stream now (asked of every live node).
    pub async fn stream_leader_node(&self) -> Option<usize> {
        for node in &self.cluster {
            if let Some(leader) = brokers::stream_leader(node.addr, &self.stream).await {
                return self.cluster.iter().position(|n| n.name == leader);
            }
        }
        None
    }
}

/// Where the broker runs: `Some((engine, image, image id))` for a container, `None` for a
/// local process (or the embedded MQTT broker). `auto` takes a container when a Docker engine
/// answers and the image is present or can be pulled, and says in one line why not otherwise.
async fn place(
    kind: DestinationKind,
    runtime: RuntimeChoice,
    notes: &mut Vec<String>,
) -> Result<Option<(container::Docker, String, String)>, RunError> {
    let local = match kind {
        DestinationKind::Mqtt => "local mosquitto (or the embedded broker)",
        DestinationKind::Nats => "local nats-server",
        DestinationKind::Kafka => "local tansu",
    };
    match runtime {
        RuntimeChoice::Process | RuntimeChoice::Embedded | RuntimeChoice::External => Ok(None),
        RuntimeChoice::Container => {
            let docker = container::daemon().await.map_err(|why| {
                brokers::BrokerError::ContainerUnavailable(format!(
                    "{why}; start Docker (or set DOCKER_HOST), or use --runtime process"
                ))
            })?;
            let image = container::image_for(kind);
            let id = container::ensure_image(&docker, &image).await.map_err(|why| {
                brokers::BrokerError::ContainerUnavailable(format!(
                    "{why}; pull it, set DRILL_IMAGE_{} to an image you have, or use --runtime process",
                    kind.name().to_uppercase()
                ))
            })?;
            Ok(Some((docker, image, id)))
        }
        RuntimeChoice::Auto => {
            let why = match container::daemon().await {
                Ok(docker) => {
                    let image = container::image_for(kind);
                    match container::ensure_image(&docker, &image).await {
                        Ok(id) => return Ok(Some((docker, image, id))),
                        Err(why) => why,
                    }
                }
                Err(why) => why,
            };
            notes.push(format!("{why}: using {local}"));
            Ok(None)
        }
    }
}

/// The report's view of a broker in a container.
fn container_broker(c: &container::ContainerBroker) -> brokers::Broker {
    let short: String = c
        .image_id
        .trim_start_matches("sha256:")
        .chars()
        .take(12)
        .collect();
    brokers::Broker::without_process(c.addr, "container", format!("{} (image {short})", c.image))
}

/// What the report says of the drill's Kafka topic and how its brokers are reached.
pub(super) fn kafka_note(plan: &Plan) -> String {
    format!(
        "Kafka topic `{}`: {KAFKA_PARTITIONS} partitions; the broker advertises itself and the Kafka-aware link `{}` rewrites every broker address in its answers to a link of its own (`{}-<node id>`)",
        plan.destination.topic,
        plan.destination.link_name(),
        plan.destination.link_name()
    )
}

/// What the report says of the drill's JetStream stream, and whether its duplicate window is
/// long enough: shorter than the longest outage plus the longest backoff, a record resent after
/// the outage is stored again (the finding `nats-short-duplicate-window` shows).
pub(super) fn stream_note(plan: &Plan, replicas: usize, window: Duration) -> String {
    let needed = crate::scenario::longest_outage(&plan.faults, plan.workload.duration)
        + plan.engine.refusals.2;
    let verdict = if window >= needed {
        "at least the longest outage plus the longest backoff".to_string()
    } else {
        format!(
            "SHORTER than the longest outage plus the longest backoff ({} s): a write resent after it is stored again, a duplicate the stream cannot catch",
            needed.as_secs()
        )
    };
    format!(
        "JetStream stream {} on subject `{}`: {replicas} replica(s), duplicate window {} s ({verdict})",
        plan.destination.stream,
        plan.destination.topic,
        window.as_secs()
    )
}
