//! Provisioning for brokers the user already runs (`runtime: external`): no broker is started,
//! links go in front of the given addresses, the topic or stream is found (or created when the
//! scenario allows), and the reader is told where the drill's records begin. At the end drill
//! removes what it created — and nothing else — unless the scenario says `keep: true`.

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::provision::{Rig, kafka_note, stream_note};
use super::{KAFKA_PARTITIONS, RunError, say};
use crate::brokers::{self, external};
use crate::proxy::Link;
use crate::scenario::{DestinationKind, External, Plan, RuntimeChoice, Secrets};
use crate::verify::Access;

/// What drill knows of the user's brokers during a drill.
pub struct ExternalRig {
    /// The brokers' own addresses, as resolved (the reader goes there directly).
    pub servers: Vec<SocketAddr>,
    /// The reader's credentials and starting point.
    pub access: Access,
    /// The topic or stream drill created, to remove at the end (`None`: nothing to remove).
    made: Option<Made>,
}

enum Made {
    Topic { bootstrap: SocketAddr, name: String },
    Stream { server: SocketAddr, name: String },
}

impl ExternalRig {
    /// Removes what drill created (a `keep: true` scenario never gets here with anything).
    pub async fn clean_up(&self) {
        let secrets = &self.access.secrets;
        let done = match &self.made {
            None => return,
            Some(Made::Topic { bootstrap, name }) => {
                external::delete_kafka_topic(*bootstrap, name, secrets).await
            }
            Some(Made::Stream { server, name }) => {
                external::delete_nats_stream(*server, name, secrets).await
            }
        };
        match done {
            Ok(()) => say("  removed what drill created on the external broker"),
            Err(e) => say(&format!(
                "  could not remove what drill created on the external broker: {e}"
            )),
        }
    }
}

impl Rig {
    /// A rig in front of the user's brokers (see the module docs).
    pub(super) async fn external(
        plan: &Plan,
        ext: &External,
        runtime: RuntimeChoice,
        seed: u64,
        cancel: &CancellationToken,
    ) -> Result<Rig, RunError> {
        let kind = plan.destination.kind;
        let field = match kind {
            DestinationKind::Kafka => "destination.bootstrap",
            DestinationKind::Nats => "destination.servers",
            DestinationKind::Mqtt => "destination.address",
        };
        if runtime != RuntimeChoice::External && runtime != RuntimeChoice::Auto {
            say(&format!(
                "  --runtime {runtime:?} does not apply: this scenario drills external brokers"
            ));
        }
        let secrets: Secrets = ext.credentials.read().map_err(RunError::External)?;
        let mut servers = Vec::new();
        for (i, address) in ext.addresses.iter().enumerate() {
            let at = if ext.addresses.len() > 1 {
                format!("{field}[{i}]")
            } else {
                field.to_string()
            };
            servers.push(
                external::reach(address, &at)
                    .await
                    .map_err(RunError::External)?,
            );
        }
        let link_cancel = cancel.child_token();
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut links = Vec::new();
        let mut notes = vec![format!(
            "external {} broker(s) at {}: drill started nothing and removes only what it created",
            kind.name(),
            ext.addresses.join(", ")
        )];
        let mut access = Access {
            secrets: secrets.clone(),
            ..Access::default()
        };
        let made = match kind {
            DestinationKind::Kafka => {
                // One Kafka-aware link at the first bootstrap address; it gives every broker
                // the cluster names a link of its own.
                let name = plan.destination.link_name();
                links.push(Link::start_kafka(name, any, servers[0], link_cancel.clone()).await?);
                let topic = external::kafka_topic(
                    servers[0],
                    &plan.destination.topic,
                    KAFKA_PARTITIONS,
                    ext.create,
                    &secrets,
                )
                .await
                .map_err(RunError::External)?;
                notes.push(kafka_note(plan));
                notes.push(format!(
                    "topic `{}` {}; the drill's records begin at offsets {:?} (partition, offset)",
                    plan.destination.topic,
                    made_or_found(topic.created, ext.keep),
                    topic.offsets
                ));
                access.offsets = topic.offsets;
                topic.created.then(|| Made::Topic {
                    bootstrap: servers[0],
                    name: plan.destination.topic.clone(),
                })
            }
            DestinationKind::Nats => {
                for (name, server) in plan.destination.link_names().iter().zip(&servers) {
                    links.push(Link::start(name, any, *server, link_cancel.clone()).await?);
                }
                let limit =
                    (!plan.workload.poison.is_empty()).then(|| plan.workload.message_limit());
                let wish = external::StreamWish {
                    name: &plan.destination.stream,
                    subject: &plan.destination.topic,
                    duplicate_window: plan
                        .destination
                        .duplicate_window
                        .unwrap_or(Duration::from_secs(120)),
                    max_message_size: limit,
                    replicas: servers.len().clamp(1, 3),
                };
                let stream = external::nats_stream(servers[0], wish, ext.create, &secrets)
                    .await
                    .map_err(RunError::External)?;
                notes.push(stream_note(plan, stream.replicas, stream.duplicate_window));
                notes.push(format!(
                    "stream `{}` {}; the drill's messages begin at sequence {}",
                    plan.destination.stream,
                    made_or_found(stream.created, ext.keep),
                    stream.first_sequence
                ));
                access.first_sequence = Some(stream.first_sequence);
                stream.created.then(|| Made::Stream {
                    server: servers[0],
                    name: plan.destination.stream.clone(),
                })
            }
            DestinationKind::Mqtt => {
                let name = plan.destination.link_name();
                links.push(Link::start(name, any, servers[0], link_cancel.clone()).await?);
                None
            }
        };
        let broker = brokers::Broker::without_process(
            servers[0],
            "external",
            format!("external {} at {}", kind.name(), ext.addresses.join(", ")),
        );
        let rig = Rig {
            broker,
            link: links[0].clone(),
            links,
            cluster: Vec::new(),
            containers: Vec::new(),
            notes,
            stream: plan.destination.stream.clone(),
            external: Some(ExternalRig {
                servers,
                access,
                made: made.filter(|_| !ext.keep),
            }),
            link_cancel,
        };
        rig.say_provisioned(seed);
        Ok(rig)
    }
}

fn made_or_found(created: bool, keep: bool) -> &'static str {
    match (created, keep) {
        (false, _) => "existed already (drill leaves it as it was)",
        (true, false) => "was created by drill and is removed at the end",
        (true, true) => "was created by drill and kept (`keep: true`)",
    }
}
