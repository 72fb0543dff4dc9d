//! MQTT 3.1.1 sessions, for engines whose listener speaks nothing newer (RabbitMQ's MQTT
//! plugin, older brokers and bridges): drill's MQTT ingest with `version: "3.1.1"`. Like
//! [`super::mqtt`], a session is a framed socket and nothing more (rumqttc's v4 codec); the
//! caller sends, reads and decides. A 3.1.1 PUBACK carries no reason code: it always means
//! the publish was taken.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rumqttc::mqttbytes::v4::{Codec, ConnectReturnCode, Packet};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use super::mqtt::MqttError;

/// The largest packet drill sends or takes (the broker's own limit is what counts).
const MAX_PACKET: usize = 16 << 20;

/// A connected 3.1.1 session (CONNACK accepted, clean session).
pub struct Session {
    pub framed: Framed<TcpStream, Codec>,
}

/// Connects as `client_id` with a clean session and waits for the CONNACK, all within
/// `limit`.
pub async fn connect(
    addr: SocketAddr,
    client_id: &str,
    keep_alive: Duration,
    limit: Duration,
) -> Result<Session, MqttError> {
    let protocol = |message: String| MqttError::Protocol { addr, message };
    let attempt = async {
        let socket = TcpStream::connect(addr)
            .await
            .map_err(|source| MqttError::Connect { addr, source })?;
        let mut framed = Framed::new(
            socket,
            Codec {
                max_incoming_size: MAX_PACKET,
                max_outgoing_size: MAX_PACKET,
            },
        );
        let mut connect = rumqttc::mqttbytes::v4::Connect::new(client_id);
        connect.keep_alive = keep_alive.as_secs().clamp(1, u16::MAX as u64) as u16;
        connect.clean_session = true;
        framed
            .send(Packet::Connect(connect))
            .await
            .map_err(|e| protocol(e.to_string()))?;
        match framed.next().await {
            Some(Ok(Packet::ConnAck(ack))) if ack.code == ConnectReturnCode::Success => {
                Ok(Session { framed })
            }
            Some(Ok(Packet::ConnAck(ack))) => Err(protocol(format!(
                "the MQTT 3.1.1 listener refused the connection: {:?}",
                ack.code
            ))),
            Some(Ok(other)) => Err(protocol(format!("expected CONNACK, got {other:?}"))),
            Some(Err(e)) => Err(protocol(e.to_string())),
            None => Err(MqttError::Closed { addr }),
        }
    };
    tokio::time::timeout(limit, attempt)
        .await
        .unwrap_or(Err(MqttError::NoConnAck { addr, limit }))
}
