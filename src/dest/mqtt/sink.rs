//! The engine's MQTT 5 sink: QoS 1 publishes with the write key in the user property
//! `write-key`, one attempt per packet id. The probe is CONNECT/CONNACK and a PINGREQ/PINGRESP
//! round trip; an idle session is probed every keepalive (and at once when an attempt has
//! waited half the answer timeout with nothing heard), and a session silent past the answer
//! timeout is lost (its open attempts end `possibly_sent`). A PUBACK with an error reason is
//! the broker refusing that one record: a counted refusal — except 0x97 (quota exceeded),
//! which says "not now": every answer already in is recorded, then the session ends and the
//! record goes again (no attempt spent), after the backoff.

use std::time::{Duration, Instant};

use futures::stream::{ReadyChunks, SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};

use crate::engine::OutputConfig;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::wire::mqtt::{self, Packet};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// The MQTT 5 sink (stateless: everything is in the output's config).
#[derive(Clone, Copy)]
pub struct MqttSink;

/// CONNECT/CONNACK with the output's keepalive, answer timeout and TLS, as `login`.
async fn open(
    cfg: &OutputConfig,
    client_id: &str,
    login: Option<mqtt::Login>,
) -> Result<mqtt::Session, String> {
    let tls = cfg.client_tls()?;
    let limit = cfg.answer_timeout.0;
    mqtt::connect_as(
        cfg.address,
        client_id,
        cfg.keepalive.0,
        limit,
        login,
        tls.as_ref(),
    )
    .await
    .map_err(|e| e.to_string())
}

/// Connects and probes: CONNECT/CONNACK, then a PINGREQ/PINGRESP round trip. Writes no data.
pub async fn connect_and_probe(
    cfg: &OutputConfig,
    client_id: &str,
) -> Result<mqtt::Session, String> {
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::LocalConnectedFlag) {
        // MUTANT: "connected" once TCP connects: no CONNACK, no PINGRESP round trip.
        return mutants::connect_without_answer(cfg, client_id).await;
    }
    let limit = cfg.answer_timeout.0;
    let secrets = cfg.credentials.read()?;
    let mut session = open(cfg, client_id, super::login(&secrets)).await?;
    let probe = async {
        session
            .framed
            .send(Packet::PingReq(mqtt::PingReq))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            match session.framed.next().await {
                Some(Ok(mqtt::Inbound::Packet(Packet::PingResp(_)))) => return Ok(()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("closed during probe".to_string()),
            }
        }
    };
    tokio::time::timeout(limit, probe)
        .await
        .map_err(|_| format!("no PINGRESP within {limit:?}"))??;
    Ok(session)
}

impl Sink for MqttSink {
    type Session = MqttSession;

    const PROMISE: (Promise, &'static str) = (
        Promise::AtLeastOnce,
        "an MQTT 5 QoS 1 output keeps `at_least_once` (a lost PUBACK means a resend)",
    );

    /// MQTT's QoS 1 window (further capped by the broker's Receive Maximum).
    const DEFAULT_WINDOW: usize = 1024;
    const TLS: bool = true;

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<MqttSession, String> {
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::ProbeWithOldestRecord)
            && let Some(record) = to.oldest
        {
            // MUTANT: the probe writes data: the oldest waiting record, QoS 0, no write
            // key (docs/src/design.md#rule-1-5).
            let session = mutants::probe_with_record(to.cfg, to.client_id, record).await?;
            return Ok(MqttSession::new(session, to.cfg));
        }
        let session = connect_and_probe(to.cfg, to.client_id).await?;
        Ok(MqttSession::new(session, to.cfg))
    }
}

/// One MQTT connection: the write half, the read half in batches, and the keepalive's state.
pub struct MqttSession {
    tx: SplitSink<mqtt::Framing, Packet>,
    /// Every packet already readable arrives as one batch, so a burst of PUBACKs costs one
    /// write of delivery marks, not one per record.
    incoming: ReadyChunks<SplitStream<mqtt::Framing>>,
    topic: String,
    receive_max: Option<u16>,
    keepalive: Duration,
    answer_timeout: Duration,
    last_ping: Instant,
    ping_out: Option<Instant>,
    last_heard: Instant,
}

impl MqttSession {
    fn new(session: mqtt::Session, cfg: &OutputConfig) -> MqttSession {
        let receive_max = session
            .connack
            .properties
            .as_ref()
            .and_then(|p| p.receive_max);
        let (tx, incoming) = session.framed.split();
        let now = Instant::now();
        MqttSession {
            tx,
            incoming: incoming.ready_chunks(256),
            topic: cfg.topic.clone(),
            receive_max,
            keepalive: cfg.keepalive.0,
            answer_timeout: cfg.answer_timeout.0,
            last_ping: now,
            ping_out: None,
            last_heard: now,
        }
    }

    /// Sends one packet, within the answer timeout.
    async fn send_one(&mut self, packet: Packet) -> Result<(), String> {
        let limit = self.answer_timeout;
        match tokio::time::timeout(limit, self.tx.send(packet)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("write failed: {e}")),
            Err(_) => Err(format!("writes blocked for {limit:?}")),
        }
    }
}

impl Session for MqttSession {
    fn window(&self) -> Option<usize> {
        self.receive_max.map(usize::from)
    }

    async fn send(
        &mut self,
        attempts: &mut Attempts,
        _answers: &mut Answers,
    ) -> Result<(), String> {
        let (tx, topic) = (&mut self.tx, &self.topic);
        let write = async {
            for (tag, record) in attempts.iter() {
                let payload = bytes::Bytes::from(record.data.clone().into_bytes());
                let packet = mqtt::publish_with_key(topic, *tag, payload, &record.key);
                tx.feed(packet).await?;
            }
            tx.flush().await
        };
        let limit = self.answer_timeout;
        match tokio::time::timeout(limit, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("write failed: {e}")),
            Err(_) => Err(format!("writes blocked for {limit:?}")),
        }
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        let Some(packets) = self.incoming.next().await else {
            return Err("connection closed".to_string());
        };
        self.last_heard = Instant::now();
        let mut not_now = None;
        for packet in packets {
            match packet {
                Ok(mqtt::Inbound::Ack(ack)) => {
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::PubackReasonIgnored) {
                        // MUTANT: a PUBACK is a PUBACK: delivered, whatever its reason code.
                        into.push((ack.pkid, Answer::Accepted));
                        continue;
                    }
                    if ack.accepted() {
                        into.push((ack.pkid, Answer::Accepted));
                    } else if ack.not_now() {
                        not_now.get_or_insert_with(|| format!("broker said not now: {}", ack.describe()));
                    } else {
                        into.push((ack.pkid, Answer::Refused(ack.describe())));
                    }
                }
                Ok(mqtt::Inbound::Packet(Packet::PingResp(_))) => self.ping_out = None,
                Ok(mqtt::Inbound::Packet(Packet::Disconnect(d))) => {
                    return Err(format!("broker disconnected: {:?}", d.reason_code));
                }
                Ok(_) => {}
                Err(e) => return Err(format!("connection error: {e}")),
            }
        }
        not_now.map_or(Ok(()), Err)
    }

    async fn tick(&mut self, now: Instant, open: Open) -> Tick {
        #[cfg(feature = "mutants")]
        if let Some(tick) = mutant::session_tick(self.answer_timeout) {
            // MUTANT `no-keepalive` or `local-connected-flag` (see `mutant::session_tick`).
            return tick;
        }
        let limit = self.answer_timeout;
        if let Some(sent) = self.ping_out {
            if now.duration_since(sent) > limit {
                return Tick::Lost(format!("no PINGRESP within {limit:?}"));
            }
            return Tick::Fine;
        }
        // Probe when idle for a keepalive, or at once when an attempt has waited half the
        // answer timeout with nothing heard since.
        let stalled = open.in_flight > 0 && now.duration_since(self.last_heard) > limit / 2;
        if now.duration_since(self.last_ping) >= self.keepalive || stalled {
            if let Err(why) = self.send_one(Packet::PingReq(mqtt::PingReq)).await {
                return Tick::Lost(why);
            }
            self.ping_out = Some(now);
            self.last_ping = now;
        }
        Tick::Fine
    }

    async fn close(&mut self) -> () {
        let bye = mqtt::Disconnect::new(mqtt::DisconnectReasonCode::NormalDisconnection);
        let _ = self.tx.send(Packet::Disconnect(bye)).await;
    }
}

/// The MQTT mutants' own connects (test builds only; see `engine::mutant`).
#[cfg(feature = "mutants")]
mod mutants {
    use super::*;
    use crate::engine::log::StoredRecord;
    use crate::wire::mqtt::DrillCodec;
    use tokio_util::codec::Framed;

    /// `probe-with-oldest-record`: CONNECT/CONNACK, then the oldest waiting record published
    /// at QoS 0 without its write key as the "probe" (no answer is awaited: the publish went
    /// out).
    pub(super) async fn probe_with_record(
        cfg: &OutputConfig,
        client_id: &str,
        record: &StoredRecord,
    ) -> Result<mqtt::Session, String> {
        let limit = cfg.answer_timeout.0;
        let mut session = super::open(cfg, client_id, None).await?;
        let publish = mqtt::Publish::new(
            &cfg.topic,
            mqtt::QoS::AtMostOnce,
            bytes::Bytes::from(record.data.clone().into_bytes()),
            None,
        );
        tokio::time::timeout(limit, session.framed.send(Packet::Publish(publish)))
            .await
            .map_err(|_| format!("probe publish blocked for {limit:?}"))?
            .map_err(|e| e.to_string())?;
        Ok(session)
    }

    /// `local-connected-flag`: TCP connect and CONNECT sent, and "connected" at once: no
    /// CONNACK is awaited (it arrives later, as any packet, and is ignored).
    pub(super) async fn connect_without_answer(
        cfg: &OutputConfig,
        client_id: &str,
    ) -> Result<mqtt::Session, String> {
        let addr = cfg.address;
        let limit = cfg.answer_timeout.0;
        let tls = cfg.client_tls()?;
        let socket = tokio::time::timeout(limit, crate::tls::client::connect(addr, tls.as_ref()))
            .await
            .map_err(|_| format!("no connection within {limit:?}"))?
            .map_err(|e| format!("{addr}: {e}"))?;
        let mut framed = Framed::new(socket, DrillCodec);
        let connect = mqtt::Connect {
            keep_alive: cfg.keepalive.0.as_secs().clamp(1, u16::MAX as u64) as u16,
            client_id: client_id.to_string(),
            clean_start: true,
            properties: Some(mqtt::ConnectProperties {
                session_expiry_interval: Some(0),
                receive_maximum: Some(u16::MAX),
                ..mqtt::ConnectProperties::new()
            }),
        };
        tokio::time::timeout(limit, framed.send(Packet::Connect(connect, None, None)))
            .await
            .map_err(|_| format!("CONNECT blocked for {limit:?}"))?
            .map_err(|e| e.to_string())?;
        Ok(mqtt::Session {
            addr,
            framed,
            // What the flag believes, not what the broker said.
            connack: mqtt::ConnAck {
                session_present: false,
                code: mqtt::ConnectReturnCode::Success,
                properties: None,
            },
        })
    }
}
