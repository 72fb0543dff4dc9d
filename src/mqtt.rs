//! MQTT 5 sessions, as drill's engine output and verifier need them.
//!
//! drill uses rumqttc's packet codec but drives the session itself, because a store-and-forward
//! engine must own every outcome: rumqttc's event loop silently drops unacknowledged publishes
//! when a session is not resumed, and its queue is not the engine's log. Here a connection is
//! just a framed socket: the caller sends packets, reads packets, and decides what a silence
//! means. This module never retries, never buffers a publish, and never guesses an outcome.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

pub use rumqttc::v5::mqttbytes::QoS;
pub use rumqttc::v5::mqttbytes::v5::{
    Codec, ConnAck, Connect, ConnectProperties, ConnectReturnCode, Disconnect,
    DisconnectReasonCode, Filter, Packet, PingReq, PubAck, PubAckReason, Publish,
    PublishProperties, Subscribe, SubscribeReasonCode,
};

/// The user property that carries a write key (DESIGN.md §1.3).
pub const WRITE_KEY_PROPERTY: &str = "write-key";

#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("no CONNACK from {addr} within {limit:?}")]
    NoConnAck { addr: SocketAddr, limit: Duration },
    #[error("{addr} refused the connection: {code:?}")]
    Refused {
        addr: SocketAddr,
        code: ConnectReturnCode,
    },
    #[error("{addr}: connection closed")]
    Closed { addr: SocketAddr },
    #[error("{addr}: protocol error: {message}")]
    Protocol { addr: SocketAddr, message: String },
    #[error("{addr}: no SUBACK within {limit:?}")]
    NoSubAck { addr: SocketAddr, limit: Duration },
}

pub type Framing = Framed<TcpStream, Codec>;

/// An MQTT 5 connection that has received a successful CONNACK.
pub struct Session {
    pub addr: SocketAddr,
    pub framed: Framing,
    pub connack: ConnAck,
}

/// Opens a TCP connection, sends CONNECT and waits (at most `limit`) for a successful CONNACK.
pub async fn connect(
    addr: SocketAddr,
    client_id: &str,
    keep_alive: Duration,
    limit: Duration,
) -> Result<Session, MqttError> {
    let attempt = async {
        let socket = TcpStream::connect(addr)
            .await
            .map_err(|source| MqttError::Connect { addr, source })?;
        let _ = socket.set_nodelay(true);
        let codec = Codec {
            max_incoming_size: None,
            max_outgoing_size: None,
        };
        let mut framed = Framed::new(socket, codec);
        let properties = ConnectProperties {
            // The engine, not the broker, decides how long an unfinished write waits.
            session_expiry_interval: Some(0),
            receive_maximum: Some(u16::MAX),
            ..ConnectProperties::new()
        };
        let connect = Connect {
            keep_alive: keep_alive.as_secs().clamp(1, u16::MAX as u64) as u16,
            client_id: client_id.to_string(),
            clean_start: true,
            properties: Some(properties),
        };
        framed
            .send(Packet::Connect(connect, None, None))
            .await
            .map_err(|e| MqttError::Protocol {
                addr,
                message: e.to_string(),
            })?;
        match framed.next().await {
            Some(Ok(Packet::ConnAck(connack))) => {
                if connack.code == ConnectReturnCode::Success {
                    Ok(Session {
                        addr,
                        framed,
                        connack,
                    })
                } else {
                    Err(MqttError::Refused {
                        addr,
                        code: connack.code,
                    })
                }
            }
            Some(Ok(other)) => Err(MqttError::Protocol {
                addr,
                message: format!("expected CONNACK, got {other:?}"),
            }),
            Some(Err(e)) => Err(MqttError::Protocol {
                addr,
                message: e.to_string(),
            }),
            None => Err(MqttError::Closed { addr }),
        }
    };
    tokio::time::timeout(limit, attempt)
        .await
        .map_err(|_| MqttError::NoConnAck { addr, limit })?
}

impl Session {
    /// Subscribes to one filter at QoS 1 and waits for the SUBACK.
    pub async fn subscribe(&mut self, filter: &str, limit: Duration) -> Result<(), MqttError> {
        let addr = self.addr;
        let mut subscribe = Subscribe::new(Filter::new(filter, QoS::AtLeastOnce), None);
        subscribe.pkid = 1;
        self.framed
            .send(Packet::Subscribe(subscribe))
            .await
            .map_err(|e| MqttError::Protocol {
                addr,
                message: e.to_string(),
            })?;
        let wait = async {
            loop {
                match self.framed.next().await {
                    Some(Ok(Packet::SubAck(ack))) => {
                        return match ack.return_codes.first() {
                            Some(SubscribeReasonCode::Success(_)) => Ok(()),
                            other => Err(MqttError::Protocol {
                                addr,
                                message: format!("subscription refused: {other:?}"),
                            }),
                        };
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        return Err(MqttError::Protocol {
                            addr,
                            message: e.to_string(),
                        });
                    }
                    None => return Err(MqttError::Closed { addr }),
                }
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| MqttError::NoSubAck { addr, limit })?
    }
}

/// A QoS 1 publish carrying `write_key` as the user property `write-key`.
pub fn publish_with_key(topic: &str, pkid: u16, payload: bytes::Bytes, write_key: &str) -> Packet {
    let properties = PublishProperties {
        user_properties: vec![(WRITE_KEY_PROPERTY.to_string(), write_key.to_string())],
        ..PublishProperties::default()
    };
    let mut publish = Publish::new(topic, QoS::AtLeastOnce, payload, Some(properties));
    publish.pkid = pkid;
    Packet::Publish(publish)
}

/// The write key a received publish carries, if any.
pub fn write_key_of(publish: &Publish) -> Option<String> {
    publish.properties.as_ref().and_then(|p| {
        p.user_properties
            .iter()
            .find(|(k, _)| k == WRITE_KEY_PROPERTY)
            .map(|(_, v)| v.clone())
    })
}
