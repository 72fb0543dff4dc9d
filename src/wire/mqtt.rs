//! MQTT 5 sessions, as drill's engine output and verifier need them.
//!
//! drill uses rumqttc's packet codec but drives the session itself, because a store-and-forward
//! engine must own every outcome: rumqttc's event loop silently drops unacknowledged publishes
//! when a session is not resumed, and its queue is not the engine's log. Here a connection is
//! just a framed socket: the caller sends packets, reads packets, and decides what a silence
//! means. This module never retries, never buffers a publish, and never guesses an outcome.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use tokio_util::codec::{Decoder, Encoder, Framed};

pub use rumqttc::v5::mqttbytes::Error as CodecError;
pub use rumqttc::v5::mqttbytes::QoS;
pub use rumqttc::v5::mqttbytes::v5::{
    ConnAck, Connect, ConnectProperties, ConnectReturnCode, Disconnect, DisconnectReasonCode,
    Filter, Login, Packet, PingReq, PubAck, PubAckReason, Publish, PublishProperties, Subscribe,
    SubscribeReasonCode,
};

/// The user property that carries a write key (docs/src/design.md#rule-1-3).
pub const WRITE_KEY_PROPERTY: &str = "write-key";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_puback_with_any_reason_code_and_its_reason_string() {
        let mut codec = DrillCodec;
        // mosquitto's answer to an oversized publish, then a success, split mid-frame.
        let mut src = BytesMut::from(&[0x40, 0x03, 0x00, 0x02, 0x95, 0x40, 0x03][..]);
        let first = codec.decode(&mut src).unwrap();
        assert!(matches!(
            first,
            Some(Inbound::Ack(Ack {
                pkid: 2,
                code: 0x95,
                ..
            }))
        ));
        assert!(
            codec.decode(&mut src).unwrap().is_none(),
            "needs more bytes"
        );
        src.extend_from_slice(&[0x00, 0x03, 0x10]);
        let Some(Inbound::Ack(ack)) = codec.decode(&mut src).unwrap() else {
            panic!("an ack")
        };
        assert!(ack.accepted());
        // With a reason string property.
        let mut src = BytesMut::from(
            &[
                0x40, 0x0b, 0x00, 0x07, 0x97, 0x07, 0x1f, 0x00, 0x04, b'f', b'u', b'l', b'l',
            ][..],
        );
        let Some(Inbound::Ack(ack)) = codec.decode(&mut src).unwrap() else {
            panic!("an ack")
        };
        assert!(!ack.accepted());
        assert_eq!(ack.describe(), "PUBACK 0x97 quota exceeded: full");
        // Two-byte PUBACK (success, no reason code).
        let mut src = BytesMut::from(&[0x40, 0x02, 0x00, 0x09][..]);
        let Some(Inbound::Ack(ack)) = codec.decode(&mut src).unwrap() else {
            panic!("an ack")
        };
        assert_eq!((ack.pkid, ack.code), (9, 0));
    }
}

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

/// An MQTT connection, over plain TCP or TLS.
pub type Framing = Framed<crate::tls::Stream, DrillCodec>;

/// What drill reads from a broker: a PUBACK with whatever reason code the broker chose, or
/// any other packet as rumqttc decodes it.
#[derive(Debug)]
// One value per frame, matched and dropped at once: boxing `Packet` would only cost an
// allocation per frame and the ability to match through it.
#[allow(clippy::large_enum_variant)]
pub enum Inbound {
    Ack(Ack),
    Packet(Packet),
}

/// A PUBACK. Brokers send reason codes rumqttc's enum does not know (mosquitto answers an
/// oversized publish with 0x95 "packet too large"); a refusal must still be read as one, not
/// as a broken connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub pkid: u16,
    pub code: u8,
    pub reason_string: Option<String>,
}

impl Ack {
    /// Codes below 0x80 are successes (0x00, 0x10 "no matching subscribers").
    pub fn accepted(&self) -> bool {
        self.code < 0x80
    }

    /// An error that says "not now" rather than "not this record": 0x97 quota exceeded (the
    /// broker's limit, not the record's fault). The record goes again; no attempt is spent.
    pub fn not_now(&self) -> bool {
        self.code == 0x97
    }

    /// The destination's own words: reason code, name and reason string.
    pub fn describe(&self) -> String {
        let name = match self.code {
            0x00 => "success",
            0x10 => "no matching subscribers",
            0x80 => "unspecified error",
            0x83 => "implementation specific error",
            0x87 => "not authorized",
            0x90 => "topic name invalid",
            0x91 => "packet identifier in use",
            0x95 => "packet too large",
            0x97 => "quota exceeded",
            0x99 => "payload format invalid",
            _ => "unknown reason",
        };
        match &self.reason_string {
            Some(text) => format!("PUBACK 0x{:02x} {name}: {text}", self.code),
            None => format!("PUBACK 0x{:02x} {name}", self.code),
        }
    }
}

/// rumqttc's MQTT 5 codec, except that PUBACKs are decoded here, whatever their reason code.
#[derive(Debug, Clone, Default)]
pub struct DrillCodec;

/// A variable byte integer: (value, bytes used), or None if more bytes are needed.
fn varint(bytes: &[u8]) -> Result<Option<(usize, usize)>, CodecError> {
    let mut value = 0usize;
    for (i, b) in bytes.iter().take(4).enumerate() {
        value |= ((b & 0x7f) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 4 {
        return Err(CodecError::MalformedRemainingLength);
    }
    Ok(None)
}

fn utf8_at(bytes: &[u8], at: usize) -> Option<(String, usize)> {
    let len = u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]) as usize;
    let text = bytes.get(at + 2..at + 2 + len)?;
    Some((String::from_utf8_lossy(text).into_owned(), 2 + len))
}

/// The reason string (property 0x1F) among a PUBACK's properties, if any.
fn reason_string(props: &[u8]) -> Option<String> {
    let mut at = 0;
    while at < props.len() {
        match props[at] {
            0x1F => return utf8_at(props, at + 1).map(|(s, _)| s),
            0x26 => {
                let (_, k) = utf8_at(props, at + 1)?;
                let (_, v) = utf8_at(props, at + 1 + k)?;
                at += 1 + k + v;
            }
            _ => return None,
        }
    }
    None
}

impl Decoder for DrillCodec {
    type Item = Inbound;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Inbound>, CodecError> {
        if src.first() == Some(&0x40) {
            let Some((len, used)) = varint(&src[1..])? else {
                return Ok(None);
            };
            let total = 1 + used + len;
            if src.len() < total {
                src.reserve(total - src.len());
                return Ok(None);
            }
            let frame = src.split_to(total);
            let body = &frame[1 + used..];
            if body.len() < 2 {
                return Err(CodecError::MalformedPacket);
            }
            let pkid = u16::from_be_bytes([body[0], body[1]]);
            let code = body.get(2).copied().unwrap_or(0);
            let reason_string = match body.get(3..).and_then(|b| varint(b).ok().flatten()) {
                Some((plen, pused)) => body
                    .get(3 + pused..3 + pused + plen)
                    .and_then(reason_string),
                None => None,
            };
            return Ok(Some(Inbound::Ack(Ack {
                pkid,
                code,
                reason_string,
            })));
        }
        match Packet::read(src, None) {
            Ok(packet) => Ok(Some(Inbound::Packet(packet))),
            Err(CodecError::InsufficientBytes(n)) => {
                src.reserve(n);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

impl Encoder<Packet> for DrillCodec {
    type Error = CodecError;

    fn encode(&mut self, item: Packet, dst: &mut BytesMut) -> Result<(), CodecError> {
        item.write(dst, None).map(|_| ())
    }
}

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
    connect_as(addr, client_id, keep_alive, limit, None, None).await
}

/// [`connect`] with a user name and password (an external broker's credentials), and over TLS
/// when `tls` is given (the handshake counts in `limit`).
pub async fn connect_as(
    addr: SocketAddr,
    client_id: &str,
    keep_alive: Duration,
    limit: Duration,
    login: Option<Login>,
    tls: Option<&crate::tls::ClientTls>,
) -> Result<Session, MqttError> {
    let attempt = async {
        let socket = crate::tls::client::connect(addr, tls)
            .await
            .map_err(|source| MqttError::Connect { addr, source })?;
        let mut framed = Framed::new(socket, DrillCodec);
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
            .send(Packet::Connect(connect, None, login))
            .await
            .map_err(|e| MqttError::Protocol {
                addr,
                message: e.to_string(),
            })?;
        match framed.next().await {
            Some(Ok(Inbound::Packet(Packet::ConnAck(connack)))) => {
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
                    Some(Ok(Inbound::Packet(Packet::SubAck(ack)))) => {
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
    user_property(publish, WRITE_KEY_PROPERTY)
}

/// The value of user property `name` of a received publish, if it has one.
pub fn user_property(publish: &Publish, name: &str) -> Option<String> {
    publish.properties.as_ref().and_then(|p| {
        p.user_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}
