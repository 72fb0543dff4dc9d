//! The few AMQP steps drill itself takes on its own node, never through a link: connect as
//! `guest`, declare the drill's durable quorum queue, count what it holds.

use std::net::SocketAddr;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

/// How long drill waits for its own connection to its node.
const CONNECT: Duration = Duration::from_secs(5);

/// The URI of drill's node at `addr`: `guest` on the default virtual host, heartbeats every
/// `heartbeat` seconds (0: none).
pub fn uri(addr: SocketAddr, heartbeat: u64) -> String {
    format!("amqp://guest:guest@{addr}/%2f?heartbeat={heartbeat}")
}

/// A connection of drill's own (no heartbeat: it is short-lived or reads at the end).
pub async fn connect(addr: SocketAddr) -> Result<Connection, String> {
    let props = ConnectionProperties::default().with_connection_name("drill-verifier".into());
    tokio::time::timeout(CONNECT, Connection::connect(&uri(addr, 0), props))
        .await
        .map_err(|_| format!("no AMQP connection to {addr} within {CONNECT:?}"))?
        .map_err(|e| format!("AMQP connection to {addr}: {e}"))
}

/// What ran, from the node's banner in its log (`RabbitMQ 3.10.8`).
pub fn version_in(log: &str) -> String {
    log.lines()
        .find_map(|l| {
            let at = l.find("RabbitMQ ")?;
            let v = l[at + 9..].split_whitespace().next()?;
            v.starts_with(|c: char| c.is_ascii_digit())
                .then(|| format!("RabbitMQ {v}"))
        })
        .unwrap_or_else(|| "RabbitMQ".to_string())
}

/// The type of the drill's queue (`destination.queue_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueType {
    /// A replicated log, fsynced before a confirm; every message persistent whatever the
    /// publisher asked (the default).
    #[default]
    Quorum,
    /// A classic durable queue: a message published transient (`delivery_mode` 1) is kept in
    /// memory only and gone after a restart, confirmed or not.
    Classic,
}

impl QueueType {
    pub fn name(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

/// The arguments of the drill's queue: its type, kept whole: no length limit, no expiry.
fn arguments(kind: QueueType) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(kind.name().into()),
    );
    args
}

/// Declares the drill's durable queue (no harm if it is there).
pub async fn declare(addr: SocketAddr, queue: &str, kind: QueueType) -> Result<(), String> {
    let connection = connect(addr).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments(kind),
        )
        .await
        .map_err(|e| e.to_string())?;
    let _ = connection.close(200, "drill: declared".into()).await;
    Ok(())
}

/// How many messages the queue holds now (a passive declare), or why not.
pub async fn count(connection: &Connection, queue: &str) -> Result<u32, String> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let q = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let _ = channel.close(200, "drill: counted".into()).await;
    Ok(q.message_count())
}

/// Takes every message out of the queue (`basic.get` until it is empty): each body's JSON
/// `id`, `None` for a body without one. For tests that count what a queue holds.
pub async fn drain_ids(addr: SocketAddr, queue: &str) -> Result<Vec<Option<String>>, String> {
    let connection = connect(addr).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    while let Some(message) = channel
        .basic_get(
            queue.into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .map_err(|e| e.to_string())?
    {
        let id = serde_json::from_slice::<serde_json::Value>(&message.delivery.data)
            .ok()
            .and_then(|v| v.get("id")?.as_str().map(str::to_string));
        ids.push(id);
    }
    let _ = connection.close(200, "drill: drained".into()).await;
    Ok(ids)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_is_read_from_the_banner() {
        let log = "\n  ##  ##      RabbitMQ 3.10.8\n  ##  ##\n  ##########  Copyright (c) 2007-2022 VMware\n";
        assert_eq!(super::version_in(log), "RabbitMQ 3.10.8");
        assert_eq!(super::version_in("nothing"), "RabbitMQ");
    }
}
