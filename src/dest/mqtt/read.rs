//! The MQTT read-back: one subscriber connected directly to the broker (never through the
//! proxy), subscribed at QoS 1 before the first record is sent. It records every copy it
//! receives with the write key from the user property the engine names. A reader that lost its
//! connection may have missed copies: a verifier fault, never engine loss.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::dest::ReadBack;
use crate::wire::mqtt::{self, Packet, PubAck, PubAckReason};
use crate::verify::{Decoder, Received, WriteKeyPlace};

/// The MQTT read-back: one subscriber connected directly to the broker.
pub struct Reader {
    pub received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    /// Connects, subscribes to `topic` at QoS 1 and starts recording arrivals relative to `t0`.
    pub async fn start(
        broker: SocketAddr,
        topic: &str,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Result<Reader, mqtt::MqttError> {
        let decoder = Decoder::builtin(WriteKeyPlace::Meta(mqtt::WRITE_KEY_PROPERTY.to_string()));
        Reader::start_with(broker, topic, decoder, t0, cancel).await
    }

    /// [`Reader::start`], finding ids and write keys with `decoder`.
    pub async fn start_with(
        broker: SocketAddr,
        topic: &str,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Result<Reader, mqtt::MqttError> {
        Reader::start_as(broker, topic, decoder, t0, cancel, None, None).await
    }

    /// [`Reader::start_with`], logging in as `login` (an external broker's credentials), over
    /// TLS when the broker speaks it.
    pub async fn start_as(
        broker: SocketAddr,
        topic: &str,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
        login: Option<mqtt::Login>,
        tls: Option<&crate::tls::ClientTls>,
    ) -> Result<Reader, mqtt::MqttError> {
        let limit = Duration::from_secs(10);
        let mut session = mqtt::connect_as(
            broker,
            "drill-verifier",
            Duration::from_secs(60),
            limit,
            login,
            tls,
        )
        .await?;
        session.subscribe(topic, limit).await?;
        let received = Arc::new(Mutex::new(Received::default()));
        let sink = received.clone();
        let task = tokio::spawn(async move {
            let (mut tx, mut rx) = session.framed.split();
            let mut ping = tokio::time::interval(Duration::from_secs(20));
            let fault = loop {
                tokio::select! {
                    packet = rx.next() => match packet {
                        Some(Ok(mqtt::Inbound::Packet(Packet::Publish(p)))) => {
                            let meta = |name: &str| mqtt::user_property(&p, name);
                            if let Ok(mut r) = sink.lock() { decoder.add(&p.payload, meta, t0.elapsed(), &mut r); }
                            if p.pkid != 0 {
                                let ack = PubAck { pkid: p.pkid, reason: PubAckReason::Success, properties: None };
                                if let Err(e) = tx.send(Packet::PubAck(ack)).await {
                                    break Some(format!("verifier could not acknowledge: {e}"));
                                }
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => break Some(format!("verifier connection error: {e}")),
                        None => break Some("verifier connection closed by the broker".to_string()),
                    },
                    _ = ping.tick() => {
                        if let Err(e) = tx.send(Packet::PingReq(mqtt::PingReq)).await {
                            break Some(format!("verifier ping failed: {e}"));
                        }
                    }
                    _ = cancel.cancelled() => break None,
                }
            };
            if let Some(f) = fault
                && let Ok(mut r) = sink.lock()
            {
                r.verifier_fault = Some(f);
            }
        });
        Ok(Reader { received, task })
    }

    pub fn count(&self) -> usize {
        self.received.lock().map(|r| r.arrivals.len()).unwrap_or(0)
    }

    pub async fn stop(self) -> Received {
        self.task.abort();
        let _ = self.task.await;
        match Arc::try_unwrap(self.received) {
            Ok(m) => m.into_inner().unwrap_or_default(),
            Err(shared) => {
                let r = shared.lock().map(|r| Received {
                    arrivals: r.arrivals.clone(),
                    verifier_fault: r.verifier_fault.clone(),
                    unexpected_examples: r.unexpected_examples.clone(),
                    overlapping_keys: r.overlapping_keys.clone(),
                    refused_by_destination: r.refused_by_destination.clone(),
                });
                r.unwrap_or_default()
            }
        }
    }
}

impl ReadBack for Reader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        let n = Reader::count(self);
        async move { Some(n) }.boxed()
    }

    fn finish(self: Box<Self>, _addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        self.stop().boxed()
    }
}

/// The read-back of drill's embedded broker: the subscriber's copies, and the ids of the
/// publishes a `reject` fault refused for good (withheld from the subscriber).
pub struct WithRejects {
    pub reader: Reader,
    pub rejects: Arc<super::embedded::Rejects>,
    pub decoder: Decoder,
    pub t0: Instant,
}

impl ReadBack for WithRejects {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        let n = self.reader.count();
        async move { Some(n) }.boxed()
    }

    fn finish(self: Box<Self>, _addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let mut received = self.reader.stop().await;
            let (refused, _) = self.rejects.refused();
            let mut withheld = Received::default();
            for p in &refused {
                let meta = |name: &str| mqtt::user_property(p, name);
                self.decoder
                    .add(&p.payload, meta, self.t0.elapsed(), &mut withheld);
            }
            received.refused_by_destination =
                withheld.arrivals.into_iter().filter_map(|a| a.id).collect();
            received
        }
        .boxed()
    }
}
