//! drill's embedded MQTT 5 broker: what a drill gets when no mosquitto is installed and Docker
//! is not wanted (the quickstart on a fresh machine). It runs inside drill on the Tokio runtime,
//! on rumqttc's packet codec ([`crate::wire::mqtt::DrillCodec`]).
//!
//! It is a relay, not a store: QoS 0 and 1, subscriptions with `+` and `#`, a publish is
//! acknowledged only after a copy is queued for every matching subscriber, a subscriber's queue
//! has no limit (nothing is ever dropped for the verifier), and it is delivered in publish order
//! under the subscriber's own receive maximum. It keeps no sessions (`session_present` is always
//! false) and nothing on disk: a subscriber that disconnects misses what is published while it
//! is away, which drill's verifier reports as its own fault, never as engine loss. A second
//! connection with a client id takes the session over (the first gets DISCONNECT 0x8E); a client
//! silent for 1.5 × its keep-alive is disconnected (0x8D), as the specification asks. QoS 2,
//! retained messages and shared subscriptions are declared unavailable in the CONNACK; an MQTT
//! 3.1.1 client is answered "unacceptable protocol version". Poison records need a broker that
//! refuses one oversized write, which this one never does: such drills use mosquitto.
//!
//! Under a `reject` destination fault ([`Rejects`]) the broker answers exactly the fault's
//! share of QoS 1 publishes with a PUBACK carrying the fault's reason code (MQTT 5's "yes,
//! but": the session carries on) and routes them to no one; those refused for good are kept,
//! for the verdict to expect them failed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rumqttc::v5::mqttbytes::v5::{
    ConnAckProperties, SubAck, UnsubAck, UnsubAckReason, Unsubscribe,
};
use rumqttc::v5::mqttbytes::{matches, valid_filter, valid_topic};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use crate::wire::mqtt::{
    CodecError, ConnAck, Connect, ConnectReturnCode, DisconnectReasonCode, DrillCodec, Inbound,
    Packet, PubAck, PubAckReason, Publish, QoS, Subscribe, SubscribeReasonCode,
};

/// What the broker reports as its version.
pub const VERSION: &str = concat!("drill's embedded broker ", env!("CARGO_PKG_VERSION"));

/// How long a new connection may take to send its CONNECT.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// A running embedded broker. It stops when this is dropped (or [`Embedded::stop`]).
pub struct Embedded {
    pub addr: SocketAddr,
    /// The `reject` fault in force, and what it refused.
    pub rejects: Arc<Rejects>,
    stop: CancellationToken,
}

/// A `reject` destination fault on the embedded broker: which publishes it answers with an
/// error reason, and the ones it refused for good.
#[derive(Default)]
pub struct Rejects {
    inner: Mutex<RejectState>,
}

#[derive(Default)]
struct RejectState {
    /// The reason code and its share, per million, of QoS 1 publishes.
    fault: Option<(u16, u32)>,
    /// QoS 1 publishes since the fault began.
    turn: u64,
    /// Publishes answered with an error reason.
    answered: u64,
    /// Those refused for good (every reason but 0x97 quota exceeded), withheld from everyone.
    refused: Vec<Publish>,
}

impl Rejects {
    fn state(&self) -> std::sync::MutexGuard<'_, RejectState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reason this QoS 1 publish is answered with, when it is its turn to be rejected (it
    /// is then kept, if refused for good, and routed to no one).
    fn next(&self, publish: &Publish) -> Option<PubAckReason> {
        let mut state = self.state();
        let (code, per_million) = state.fault?;
        let turn = state.turn;
        state.turn += 1;
        if !crate::dest::rejects_turn(turn, per_million) {
            return None;
        }
        state.answered += 1;
        if super::ANSWERS.reject.for_good(code) != Some(false) {
            state.refused.push(publish.clone());
        }
        Some(reason_of(code))
    }

    /// The publishes refused for good, and how many were answered with an error reason.
    pub fn refused(&self) -> (Vec<Publish>, u64) {
        let state = self.state();
        (state.refused.clone(), state.answered)
    }
}

impl crate::dest::AnswerControl for Rejects {
    fn set(&self, fault: Option<crate::dest::AnswerFault>) {
        let mut state = self.state();
        state.fault = match fault {
            Some(crate::dest::AnswerFault::Reject {
                code, per_million, ..
            }) => {
                Some((code, per_million))
            }
            // Validation gives this broker no other fault.
            _ => None,
        };
        state.turn = 0;
    }
}

/// The PUBACK reason of an error code `reject` takes (validated: one of the table in
/// `super::ANSWERS`).
fn reason_of(code: u16) -> PubAckReason {
    match code {
        0x97 => PubAckReason::QuotaExceeded,
        0x83 => PubAckReason::ImplementationSpecificError,
        0x87 => PubAckReason::NotAuthorized,
        0x90 => PubAckReason::TopicNameInvalid,
        0x99 => PubAckReason::PayloadFormatInvalid,
        _ => PubAckReason::UnspecifiedError,
    }
}

impl Embedded {
    /// Listens on `addr` (port 0: a free one) and serves until stopped.
    pub async fn start(addr: SocketAddr) -> std::io::Result<Embedded> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let router = Arc::new(Router::default());
        let rejects = router.rejects.clone();
        let until = stop.clone();
        tokio::spawn(async move {
            let mut next_conn = 0u64;
            loop {
                let (socket, _) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        // Out of file descriptors and the like: try again shortly, as a broker does.
                        Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue }
                    },
                    _ = until.cancelled() => break,
                };
                next_conn += 1;
                let (router, until) = (router.clone(), until.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = serve(socket, router, next_conn) => {}
                        _ = until.cancelled() => {}
                    }
                });
            }
        });
        Ok(Embedded {
            addr,
            rejects,
            stop,
        })
    }

    /// Closes the listener and every connection.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One subscription of one connection.
struct Subscription {
    conn: u64,
    filter: String,
    qos: QoS,
}

/// A connection's queue of publishes to deliver.
type Queue = mpsc::UnboundedSender<Publish>;

/// Who is connected and who subscribed to what.
#[derive(Default)]
struct Router {
    inner: Mutex<Routes>,
    rejects: Arc<Rejects>,
}

#[derive(Default)]
struct Routes {
    subscriptions: Vec<Subscription>,
    queues: HashMap<u64, Queue>,
    /// Client id → the connection holding it, and how to end that connection.
    clients: HashMap<String, (u64, CancellationToken)>,
}

impl Router {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        // A panic while holding the lock cannot leave the routes half-changed in a way that
        // matters more than stopping the broker would; carry on with what is there.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a connection; a connection already holding `client_id` is told to end.
    fn join(&self, conn: u64, client_id: &str, queue: Queue) -> CancellationToken {
        let mut routes = self.routes();
        let taken = CancellationToken::new();
        if let Some((_, old)) = routes
            .clients
            .insert(client_id.to_string(), (conn, taken.clone()))
        {
            old.cancel();
        }
        routes.queues.insert(conn, queue);
        taken
    }

    fn leave(&self, conn: u64, client_id: &str) {
        let mut routes = self.routes();
        routes.subscriptions.retain(|s| s.conn != conn);
        routes.queues.remove(&conn);
        if routes
            .clients
            .get(client_id)
            .is_some_and(|(c, _)| *c == conn)
        {
            routes.clients.remove(client_id);
        }
    }

    /// Adds (or replaces) a subscription; the QoS granted is at most 1.
    fn subscribe(&self, conn: u64, filter: &str, qos: QoS) -> QoS {
        let granted = if qos == QoS::AtMostOnce {
            QoS::AtMostOnce
        } else {
            QoS::AtLeastOnce
        };
        let mut routes = self.routes();
        routes
            .subscriptions
            .retain(|s| !(s.conn == conn && s.filter == filter));
        routes.subscriptions.push(Subscription {
            conn,
            filter: filter.to_string(),
            qos: granted,
        });
        granted
    }

    fn unsubscribe(&self, conn: u64, filter: &str) -> bool {
        let mut routes = self.routes();
        let before = routes.subscriptions.len();
        routes
            .subscriptions
            .retain(|s| !(s.conn == conn && s.filter == filter));
        routes.subscriptions.len() != before
    }

    /// Queues a copy of `publish` for every connection with a matching subscription (one copy
    /// per connection, at the highest QoS among its matching subscriptions). Returns how many.
    fn route(&self, publish: &Publish) -> usize {
        let topic = String::from_utf8_lossy(&publish.topic);
        let routes = self.routes();
        let mut best: HashMap<u64, QoS> = HashMap::new();
        for s in &routes.subscriptions {
            if matches(&topic, &s.filter) {
                let q = best.entry(s.conn).or_insert(QoS::AtMostOnce);
                if s.qos == QoS::AtLeastOnce {
                    *q = QoS::AtLeastOnce;
                }
            }
        }
        let mut copies = 0;
        for (conn, sub_qos) in best {
            let Some(queue) = routes.queues.get(&conn) else {
                continue;
            };
            let mut copy = publish.clone();
            copy.qos = if publish.qos == QoS::AtMostOnce {
                QoS::AtMostOnce
            } else {
                sub_qos
            };
            copy.dup = false;
            copy.retain = false;
            copy.pkid = 0;
            if let Some(p) = copy.properties.as_mut() {
                p.topic_alias = None;
                p.subscription_identifiers.clear();
            }
            if queue.send(copy).is_ok() {
                copies += 1;
            }
        }
        copies
    }
}

/// Packet ids of QoS 1 deliveries a subscriber has not acknowledged yet.
struct Inflight {
    open: Vec<bool>,
    count: usize,
    next: u16,
    limit: usize,
}

impl Inflight {
    fn new(limit: u16) -> Inflight {
        Inflight {
            open: vec![false; 65536],
            count: 0,
            next: 0,
            limit: limit.max(1) as usize,
        }
    }

    fn has_room(&self) -> bool {
        self.count < self.limit
    }

    /// A free packet id (there is one: `count` < `limit` ≤ 65535).
    fn take(&mut self) -> u16 {
        loop {
            self.next = self.next.wrapping_add(1).max(1);
            if !self.open[self.next as usize] {
                self.open[self.next as usize] = true;
                self.count += 1;
                return self.next;
            }
        }
    }

    fn release(&mut self, pkid: u16) {
        if std::mem::take(&mut self.open[pkid as usize]) {
            self.count -= 1;
        }
    }
}

/// Serves one connection from its CONNECT to its end.
async fn serve(socket: TcpStream, router: Arc<Router>, conn: u64) {
    let _ = socket.set_nodelay(true);
    let mut framed = Framed::new(socket, DrillCodec);
    let connect = match tokio::time::timeout(CONNECT_LIMIT, framed.next()).await {
        Ok(Some(Ok(Inbound::Packet(Packet::Connect(c, _, _))))) => c,
        Ok(Some(Err(CodecError::InvalidProtocolLevel(level)))) if level < 5 => {
            // An MQTT 3.1/3.1.1 client: its own CONNACK, return code 1 (unacceptable version).
            let mut socket = framed.into_inner();
            let _ = socket.write_all(&[0x20, 0x02, 0x00, 0x01]).await;
            return;
        }
        _ => return,
    };
    let client_id = match connect.client_id.as_str() {
        "" => format!("drill-embedded-{conn}"),
        id => id.to_string(),
    };
    let (queue, mut deliveries) = mpsc::unbounded_channel();
    let taken = router.join(conn, &client_id, queue);
    let ended = session(
        &mut framed,
        &router,
        conn,
        &connect,
        &client_id,
        &mut deliveries,
        &taken,
    )
    .await;
    if let Some(reason) = ended {
        // Written by hand: rumqttc 0.25 encodes a DISCONNECT with a reason code as remaining
        // length 1 followed by two bytes, and cannot read one of length 1. This is the form
        // it reads: the reason and an empty property list.
        let _ = framed.flush().await;
        let _ = framed
            .get_mut()
            .write_all(&[0xE0, 0x02, reason as u8, 0x00])
            .await;
    }
    router.leave(conn, &client_id);
}

fn connack(connect: &Connect, client_id: &str) -> Packet {
    let properties = ConnAckProperties {
        session_expiry_interval: None,
        receive_max: Some(u16::MAX),
        max_qos: Some(1),
        retain_available: Some(0),
        max_packet_size: None,
        assigned_client_identifier: connect.client_id.is_empty().then(|| client_id.to_string()),
        topic_alias_max: None,
        reason_string: None,
        user_properties: Vec::new(),
        wildcard_subscription_available: Some(1),
        subscription_identifiers_available: Some(0),
        shared_subscription_available: Some(0),
        server_keep_alive: None,
        response_information: None,
        server_reference: None,
        authentication_method: None,
        authentication_data: None,
    };
    Packet::ConnAck(ConnAck {
        session_present: false,
        code: ConnectReturnCode::Success,
        properties: Some(properties),
    })
}

/// The connected part of a connection. Returns the reason to send in a DISCONNECT, if any.
async fn session(
    framed: &mut Framed<TcpStream, DrillCodec>,
    router: &Router,
    conn: u64,
    connect: &Connect,
    client_id: &str,
    deliveries: &mut mpsc::UnboundedReceiver<Publish>,
    taken: &CancellationToken,
) -> Option<DisconnectReasonCode> {
    framed.send(connack(connect, client_id)).await.ok()?;
    let receive_max = connect
        .properties
        .as_ref()
        .and_then(|p| p.receive_maximum)
        .unwrap_or(u16::MAX);
    let mut inflight = Inflight::new(receive_max);
    // 1.5 × the keep-alive; 0 means the client asked for none.
    let silence =
        (connect.keep_alive > 0).then(|| Duration::from_millis(connect.keep_alive as u64 * 1500));
    let mut heard = Instant::now();
    loop {
        let deadline = silence.map(|s| heard + s);
        tokio::select! {
            frame = framed.next() => {
                heard = Instant::now();
                let packet = match frame {
                    Some(Ok(p)) => p,
                    Some(Err(_)) => return Some(DisconnectReasonCode::MalformedPacket),
                    None => return None,
                };
                match answer(packet, router, conn, &mut inflight) {
                    Ok(Some(reply)) => framed.send(reply).await.ok()?,
                    Ok(None) => {}
                    Err(end) => return end,
                }
            }
            Some(publish) = deliveries.recv(), if inflight.has_room() => {
                // Everything queued that the subscriber may take now, in one write.
                let mut next = Some(publish);
                while let Some(mut publish) = next.take() {
                    if publish.qos == QoS::AtLeastOnce {
                        publish.pkid = inflight.take();
                    }
                    framed.feed(Packet::Publish(publish)).await.ok()?;
                    if inflight.has_room() {
                        next = deliveries.try_recv().ok();
                    }
                }
                framed.flush().await.ok()?;
            }
            _ = sleep_until(deadline) => return Some(DisconnectReasonCode::KeepAliveTimeout),
            _ = taken.cancelled() => return Some(DisconnectReasonCode::SessionTakenOver),
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What the broker does with one packet from a connected client: a reply to send, nothing, or
/// the end of the connection (with the reason to send, if any).
fn answer(
    packet: Inbound,
    router: &Router,
    conn: u64,
    inflight: &mut Inflight,
) -> Result<Option<Packet>, Option<DisconnectReasonCode>> {
    let packet = match packet {
        Inbound::Ack(ack) => {
            inflight.release(ack.pkid);
            return Ok(None);
        }
        Inbound::Packet(p) => p,
    };
    match packet {
        Packet::Publish(publish) => publish_from(publish, router),
        Packet::Subscribe(subscribe) => Ok(Some(subscribe_to(subscribe, router, conn))),
        Packet::Unsubscribe(unsubscribe) => Ok(Some(unsubscribe_from(unsubscribe, router, conn))),
        Packet::PingReq(_) => Ok(Some(Packet::PingResp(rumqttc::v5::mqttbytes::v5::PingResp))),
        Packet::Disconnect(_) => Err(None),
        Packet::Connect(..) => Err(Some(DisconnectReasonCode::ProtocolError)),
        // Nothing else is sent by a client this broker serves (no QoS 2, no AUTH).
        _ => Err(Some(DisconnectReasonCode::ProtocolError)),
    }
}

fn publish_from(
    publish: Publish,
    router: &Router,
) -> Result<Option<Packet>, Option<DisconnectReasonCode>> {
    if publish.qos == QoS::ExactlyOnce {
        return Err(Some(DisconnectReasonCode::QoSNotSupported));
    }
    let topic = String::from_utf8_lossy(&publish.topic);
    if topic.is_empty() || !valid_topic(&topic) {
        return Err(Some(DisconnectReasonCode::TopicNameInvalid));
    }
    if publish.qos == QoS::AtMostOnce {
        router.route(&publish);
        return Ok(None);
    }
    let reason = match router.rejects.next(&publish) {
        Some(rejected) => rejected,
        None => {
            router.route(&publish);
            PubAckReason::Success
        }
    };
    Ok(Some(Packet::PubAck(PubAck {
        pkid: publish.pkid,
        reason,
        properties: None,
    })))
}

fn subscribe_to(subscribe: Subscribe, router: &Router, conn: u64) -> Packet {
    let return_codes = subscribe
        .filters
        .iter()
        .map(|f| {
            if f.path.starts_with("$share/") {
                SubscribeReasonCode::SharedSubscriptionsNotSupported
            } else if valid_filter(&f.path) {
                SubscribeReasonCode::Success(router.subscribe(conn, &f.path, f.qos))
            } else {
                SubscribeReasonCode::TopicFilterInvalid
            }
        })
        .collect();
    Packet::SubAck(SubAck {
        pkid: subscribe.pkid,
        return_codes,
        properties: None,
    })
}

fn unsubscribe_from(unsubscribe: Unsubscribe, router: &Router, conn: u64) -> Packet {
    let reasons = unsubscribe
        .filters
        .iter()
        .map(|f| match router.unsubscribe(conn, f) {
            true => UnsubAckReason::Success,
            false => UnsubAckReason::NoSubscriptionExisted,
        })
        .collect();
    Packet::UnsubAck(UnsubAck {
        pkid: unsubscribe.pkid,
        reasons,
        properties: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::mqtt::{self, ConnectProperties, Filter};

    async fn broker() -> Embedded {
        Embedded::start(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap()
    }

    const LIMIT: Duration = Duration::from_secs(5);

    async fn next_packet(s: &mut mqtt::Session) -> Inbound {
        tokio::time::timeout(LIMIT, s.framed.next())
            .await
            .expect("a packet within 5 s")
            .expect("the connection is open")
            .expect("a well-formed packet")
    }

    /// A raw MQTT 5 connection with the given receive maximum and keep-alive (seconds).
    async fn raw(addr: SocketAddr, id: &str, receive_max: u16, keep_alive: u16) -> mqtt::Session {
        let socket = crate::tls::Stream::Plain(TcpStream::connect(addr).await.unwrap());
        let mut framed = Framed::new(socket, DrillCodec);
        let properties = ConnectProperties {
            receive_maximum: Some(receive_max),
            ..ConnectProperties::new()
        };
        let connect = Connect {
            keep_alive,
            client_id: id.to_string(),
            clean_start: true,
            properties: Some(properties),
        };
        framed
            .send(Packet::Connect(connect, None, None))
            .await
            .unwrap();
        let Some(Ok(Inbound::Packet(Packet::ConnAck(connack)))) = framed.next().await else {
            panic!("a CONNACK")
        };
        mqtt::Session {
            addr,
            framed,
            connack,
        }
    }

    #[tokio::test]
    async fn every_publish_reaches_a_subscriber_in_order_and_is_acknowledged() {
        let b = broker().await;
        let mut sub = mqtt::connect(b.addr, "sub", LIMIT, LIMIT).await.unwrap();
        sub.subscribe("plant/+/temp", LIMIT).await.unwrap();
        let mut other = mqtt::connect(b.addr, "other", LIMIT, LIMIT).await.unwrap();
        other.subscribe("elsewhere/#", LIMIT).await.unwrap();
        let mut publisher = mqtt::connect(b.addr, "pub", LIMIT, LIMIT).await.unwrap();
        let n = 2000u16;
        for i in 1..=n {
            let p =
                mqtt::publish_with_key("plant/a/temp", i, format!("{i}").into(), &format!("k{i}"));
            publisher.framed.feed(p).await.unwrap();
        }
        publisher.framed.flush().await.unwrap();
        let mut acked = Vec::new();
        while acked.len() < n as usize {
            match next_packet(&mut publisher).await {
                Inbound::Ack(a) => {
                    assert!(a.accepted(), "{}", a.describe());
                    acked.push(a.pkid);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(acked, (1..=n).collect::<Vec<_>>());
        for i in 1..=n {
            let Inbound::Packet(Packet::Publish(p)) = next_packet(&mut sub).await else {
                panic!("a publish")
            };
            assert_eq!(p.payload, format!("{i}").as_bytes());
            assert_eq!(
                mqtt::write_key_of(&p).as_deref(),
                Some(format!("k{i}").as_str())
            );
            assert_eq!(p.qos, QoS::AtLeastOnce);
            let ack = PubAck::new(p.pkid, None);
            sub.framed.send(Packet::PubAck(ack)).await.unwrap();
        }
        // Nothing reached the subscriber of another topic.
        other
            .framed
            .send(Packet::PingReq(mqtt::PingReq))
            .await
            .unwrap();
        assert!(matches!(
            next_packet(&mut other).await,
            Inbound::Packet(Packet::PingResp(_))
        ));
    }

    #[tokio::test]
    async fn a_subscriber_gets_no_more_than_its_receive_maximum_unacknowledged() {
        let b = broker().await;
        let mut sub = raw(b.addr, "slow", 3, 60).await;
        let subscribe = Subscribe::new(Filter::new("t", QoS::AtLeastOnce), None);
        sub.framed.send(Packet::Subscribe(subscribe)).await.unwrap();
        assert!(matches!(
            next_packet(&mut sub).await,
            Inbound::Packet(Packet::SubAck(_))
        ));
        let mut publisher = mqtt::connect(b.addr, "pub", LIMIT, LIMIT).await.unwrap();
        for i in 1..=10u16 {
            let p = mqtt::publish_with_key("t", i, format!("{i}").into(), "k");
            publisher.framed.send(p).await.unwrap();
            assert!(matches!(next_packet(&mut publisher).await, Inbound::Ack(_)));
        }
        let mut first = Vec::new();
        for _ in 0..3 {
            let Inbound::Packet(Packet::Publish(p)) = next_packet(&mut sub).await else {
                panic!("a publish")
            };
            first.push(p.pkid);
        }
        // A fourth would break the subscriber's limit; it comes only after an acknowledgement.
        let early = tokio::time::timeout(Duration::from_millis(300), sub.framed.next()).await;
        assert!(
            early.is_err(),
            "a fourth publish before any PUBACK: {early:?}"
        );
        let ack = PubAck::new(first[0], None);
        sub.framed.send(Packet::PubAck(ack)).await.unwrap();
        let Inbound::Packet(Packet::Publish(p)) = next_packet(&mut sub).await else {
            panic!("the fourth publish")
        };
        assert_eq!(p.payload, "4".as_bytes());
    }

    /// A `reject` fault answers exactly its share of QoS 1 publishes with its reason code and
    /// routes them to no one; those refused for good are kept, the 0x97s are not; the rest are
    /// acknowledged and delivered, and the fault's end answers everything again.
    #[tokio::test]
    async fn a_reject_fault_answers_its_share_with_the_reason_and_withholds_them() {
        use crate::dest::{AnswerControl, AnswerFault};
        let b = broker().await;
        let mut sub = mqtt::connect(b.addr, "sub", LIMIT, LIMIT).await.unwrap();
        sub.subscribe("t", LIMIT).await.unwrap();
        let mut publisher = mqtt::connect(b.addr, "pub", LIMIT, LIMIT).await.unwrap();
        let mut publish_all = async |from: u16, to: u16| {
            for i in from..=to {
                let p = mqtt::publish_with_key("t", i, format!("{i}").into(), &format!("k{i}"));
                publisher.framed.feed(p).await.unwrap();
            }
            publisher.framed.flush().await.unwrap();
            let mut codes = Vec::new();
            while codes.len() < usize::from(to - from + 1) {
                match next_packet(&mut publisher).await {
                    Inbound::Ack(a) => codes.push((a.pkid, a.code)),
                    other => panic!("unexpected {other:?}"),
                }
            }
            codes
        };
        b.rejects.set(Some(AnswerFault::Reject { code: 0x99, per_million: 250_000, words: &super::super::ANSWERS.reject }));
        let first = publish_all(1, 8).await;
        b.rejects.set(Some(AnswerFault::Reject { code: 0x97, per_million: 500_000, words: &super::super::ANSWERS.reject }));
        let second = publish_all(9, 12).await;
        b.rejects.set(None);
        let third = publish_all(13, 14).await;
        let refused: Vec<u16> = first.iter().filter(|a| a.1 == 0x99).map(|a| a.0).collect();
        assert_eq!(refused, [4, 8], "one in four, in arrival order: {first:?}");
        let quota: Vec<u16> = second.iter().filter(|a| a.1 == 0x97).map(|a| a.0).collect();
        assert_eq!(quota, [10, 12], "{second:?}");
        assert!(third.iter().all(|a| a.1 == 0), "{third:?}");
        let (kept, answered) = b.rejects.refused();
        assert_eq!(answered, 4);
        let kept: Vec<&[u8]> = kept.iter().map(|p| &p.payload[..]).collect();
        assert_eq!(kept, [b"4".as_slice(), b"8"], "only the ones refused for good");
        let mut delivered = Vec::new();
        for _ in 0..10 {
            let Inbound::Packet(Packet::Publish(p)) = next_packet(&mut sub).await else {
                panic!("a publish")
            };
            delivered.push(String::from_utf8_lossy(&p.payload).to_string());
            sub.framed
                .send(Packet::PubAck(PubAck::new(p.pkid, None)))
                .await
                .unwrap();
        }
        assert_eq!(
            delivered,
            ["1", "2", "3", "5", "6", "7", "9", "11", "13", "14"],
            "the rejected ones reach no subscriber"
        );
    }

    #[tokio::test]
    async fn a_second_connection_with_a_client_id_takes_the_session_over() {
        let b = broker().await;
        let mut first = mqtt::connect(b.addr, "engine", LIMIT, LIMIT).await.unwrap();
        let _second = mqtt::connect(b.addr, "engine", LIMIT, LIMIT).await.unwrap();
        let Inbound::Packet(Packet::Disconnect(d)) = next_packet(&mut first).await else {
            panic!("a DISCONNECT")
        };
        assert_eq!(d.reason_code, DisconnectReasonCode::SessionTakenOver);
    }

    #[tokio::test]
    async fn a_silent_client_is_disconnected_after_one_and_a_half_keep_alives() {
        let b = broker().await;
        let started = Instant::now();
        let mut quiet = raw(b.addr, "quiet", 10, 1).await;
        let Inbound::Packet(Packet::Disconnect(d)) = next_packet(&mut quiet).await else {
            panic!("a DISCONNECT")
        };
        let after = started.elapsed();
        assert_eq!(d.reason_code, DisconnectReasonCode::KeepAliveTimeout);
        assert!(
            after >= Duration::from_millis(1400) && after < Duration::from_secs(4),
            "disconnected after {after:?}, expected about 1.5 s"
        );
    }

    #[tokio::test]
    async fn an_mqtt_3_client_is_told_its_version_is_not_served() {
        let b = broker().await;
        let mut socket = TcpStream::connect(b.addr).await.unwrap();
        // MQTT 3.1.1 CONNECT, client id "c", clean session, keep-alive 60.
        let connect = [
            0x10, 0x0d, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x02, 0x00, 0x3c, 0x00, 0x01,
            b'c',
        ];
        socket.write_all(&connect).await.unwrap();
        let mut answer = Vec::new();
        use tokio::io::AsyncReadExt;
        tokio::time::timeout(LIMIT, socket.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer, [0x20, 0x02, 0x00, 0x01]);
    }

    #[tokio::test]
    async fn a_qos_0_publish_is_delivered_at_qos_0_without_an_acknowledgement() {
        let b = broker().await;
        let mut sub = mqtt::connect(b.addr, "sub", LIMIT, LIMIT).await.unwrap();
        sub.subscribe("#", LIMIT).await.unwrap();
        let mut publisher = mqtt::connect(b.addr, "pub", LIMIT, LIMIT).await.unwrap();
        let p = Publish::new("a/b", QoS::AtMostOnce, "x", None);
        publisher.framed.send(Packet::Publish(p)).await.unwrap();
        let Inbound::Packet(Packet::Publish(got)) = next_packet(&mut sub).await else {
            panic!("a publish")
        };
        assert_eq!((got.qos, got.pkid), (QoS::AtMostOnce, 0));
        let none = tokio::time::timeout(Duration::from_millis(200), publisher.framed.next()).await;
        assert!(none.is_err(), "no PUBACK for QoS 0: {none:?}");
    }
}
