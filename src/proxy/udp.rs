//! A datagram (UDP) link: the faults that mean something for datagrams
//! (docs/src/design.md#3-fault-vocabulary), and nothing that needs a stream.
//!
//! The link reads each client's datagrams on its port and forwards them to the upstream from a
//! socket of that client's own — a *flow*, one per client address, connected to the upstream —
//! so what the upstream answers goes back to that client from the link's port. A flow is
//! opened by its client's first datagram that is not dropped, and ends at a `refuse`, at the
//! link's shutdown, or after [`FLOW_IDLE`] without a datagram from its client or its upstream.
//! The connection counters of [`super::LinkStatus`] count flows; its byte counters count
//! datagram payloads, and [`super::DatagramCounts`] the datagrams themselves. A link with a
//! protocol tap reads every datagram it took from a client (it left the engine, whatever its
//! fate) and every one it sent upstream, each with a tap of its own.
//!
//! A datagram's fate is decided when the link reads it, under the condition in force at that
//! instant (the same `watch` channel as a TCP link's, so a fault is atomic for every flow):
//!
//! - `refuse` — nothing answers, as from a stopped service. The link's socket is `connect`ed to
//!   its own address: it keeps the port (a free-port pick never lands on it, a plain `bind` is
//!   told it is in use), and since no socket matches a datagram from anyone else, the kernel
//!   answers each with ICMP port unreachable. Measured on Linux 6.x (`tests/proxy_udp.rs`): a
//!   sender whose socket is `connect`ed to the link gets `ECONNREFUSED` on its next `recv` (or
//!   `send`); an unconnected sender hears nothing, because the kernel reports ICMP errors only
//!   to connected sockets (or with `IP_RECVERR`). ICMP is also rate-limited
//!   (`net.ipv4.icmp_msgs_per_sec`, 1000/s with a burst of 50, loopback included), so a
//!   sender that floods gets an error for some datagrams, not each. Datagrams queued at the
//!   instant of the refusal are dropped and every flow ends (the upstream sees new source
//!   ports after the heal, as after a NAT entry lost). At the heal a fresh socket is bound to
//!   the port beside the refusing one before that one closes (both with `SO_REUSEADDR`, the
//!   only way Linux lets two UDP sockets share a port), so the port is never free. The cost:
//!   a program that sets `SO_REUSEADDR` on its own UDP socket could bind the link's port too.
//! - `swallow` — datagrams in `direction` are dropped silently (no ICMP: the link read them).
//! - `blackhole` — exactly `swallow` both ways (it takes no `direction`), named for the route
//!   to nowhere it stands for: unlike `refuse`, nobody is told.
//! - `delay` — datagrams in `direction` leave `latency` ± `jitter` (seeded) after they were
//!   read, in the order they came: a datagram never overtakes an earlier one of its flow, and
//!   while any are held, even one read after a heal waits its turn. At most [`HELD_LIMIT`] are
//!   held per flow and direction; beyond that they are dropped, as a router's full queue would.
//!   A held datagram is dropped at its time if its direction is dropped by then (`swallow`,
//!   `blackhole`, `refuse`): those faults are in force from the instant they are published,
//!   for what is held too, as on a TCP link.
//! - `loss` — each datagram in `direction` is dropped with probability `loss`. The draws come
//!   from the link's seed, the condition's epoch and the direction, so the same datagrams in
//!   the same order lose the same ones under the same seed.
//!
//! What this module must never do: forward a datagram its condition drops, let the port go
//! free while the link lives, or answer for the upstream.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::tap::{Tap, TapLog};
use super::{Condition, Fault, LinkShared, Side, add};
use crate::seed::Seeded;

/// The largest UDP payload over IPv4; a read buffer this size never truncates one.
const MAX_DATAGRAM: usize = 65_535;
/// Datagrams a delayed direction of one flow may hold before it drops the next.
pub const HELD_LIMIT: usize = 4096;
/// A flow with no datagram either way for this long ends (its upstream socket is closed).
pub const FLOW_IDLE: Duration = Duration::from_secs(120);
/// What the link asks of the kernel for its sockets' receive buffers (it may give less).
const RECEIVE_BUFFER: usize = 4 << 20;

/// A datagram link's own state beside [`LinkShared`]: the seeded loss draws, per direction.
pub(crate) struct Datagrams {
    seed: AtomicU64,
    /// `[upstream, downstream]`.
    draws: [Mutex<Draws>; 2],
}

/// One direction's loss draws: restarted from the seed whenever the condition changes.
struct Draws {
    epoch: Option<u64>,
    rng: Seeded,
}

impl Default for Datagrams {
    fn default() -> Datagrams {
        let draws = || {
            Mutex::new(Draws {
                epoch: None,
                rng: Seeded::new(0),
            })
        };
        Datagrams {
            seed: AtomicU64::new(0),
            draws: [draws(), draws()],
        }
    }
}

impl Datagrams {
    pub(crate) fn seed(&self, seed: u64) {
        self.seed.store(seed, Ordering::Relaxed);
        for d in &self.draws {
            if let Ok(mut d) = d.lock() {
                d.epoch = None;
            }
        }
    }

    /// Whether the next datagram on `side` is lost under `loss` of `fraction`, in force since
    /// condition `epoch`.
    fn loses(&self, side: Side, epoch: u64, fraction: f64) -> bool {
        let (index, salt) = match side {
            Side::Up => (0, 0x5555_5555_5555_5555u64),
            Side::Down => (1, 0xAAAA_AAAA_AAAA_AAAAu64),
        };
        let Ok(mut d) = self.draws[index].lock() else {
            return false;
        };
        if d.epoch != Some(epoch) {
            let seed = self.seed.load(Ordering::Relaxed);
            d.rng = Seeded::new(seed ^ salt ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            d.epoch = Some(epoch);
        }
        // 53 random bits: a uniform draw in [0, 1).
        let draw = (d.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        draw < fraction
    }
}

/// What becomes of one datagram read under the link's condition.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Pass,
    /// Read and thrown away, silently.
    Drop,
    /// Held this long, then passed.
    Delay(Duration),
}

/// Whether `condition` drops every datagram on `side` (`refuse`, `blackhole`, `swallow`).
fn silenced(condition: &Condition, side: Side) -> bool {
    condition.active.is_some_and(|spec| match spec.fault {
        Fault::Refuse | Fault::Blackhole => true,
        Fault::Swallow => spec.direction.covers(side),
        _ => false,
    })
}

fn fate(shared: &LinkShared, condition: &Condition, side: Side) -> Fate {
    if silenced(condition, side) {
        return Fate::Drop;
    }
    let Some(spec) = condition.active else {
        return Fate::Pass;
    };
    if !spec.direction.covers(side) {
        return Fate::Pass;
    }
    match spec.fault {
        Fault::Delay => Fate::Delay(late_by(shared, spec.latency, spec.jitter)),
        Fault::Loss => match &shared.datagrams {
            Some(d) if d.loses(side, condition.epoch, spec.loss) => Fate::Drop,
            _ => Fate::Pass,
        },
        // Handled above (`refuse`, `blackhole`, `swallow`), or refused before it is in force
        // on a datagram link (`Link::check`).
        Fault::Refuse
        | Fault::Blackhole
        | Fault::Swallow
        | Fault::Reset
        | Fault::Hang
        | Fault::Throttle
        | Fault::LimitData
        | Fault::Slicer
        | Fault::SlowClose
        | Fault::Strand
        | Fault::BadCertificate
        | Fault::Heal => Fate::Pass,
    }
}

/// `latency` ± a seeded uniform draw of `jitter` (never below zero).
fn late_by(shared: &LinkShared, latency: Duration, jitter: Duration) -> Duration {
    let j = jitter.as_micros() as u64;
    if j == 0 {
        return latency;
    }
    let draw = shared
        .rng
        .lock()
        .map(|mut r| r.below(2 * j + 1))
        .unwrap_or(j);
    (latency + Duration::from_micros(draw)).saturating_sub(jitter)
}

/// A datagram went on to `side`: counted, and an upstream one read by the link's tap (it
/// reached the receiver's socket).
fn passed(shared: &LinkShared, side: Side, datagram: &[u8]) {
    if side == Side::Up {
        tap(shared, |t, log| t.up(datagram, log));
    }
    let n = datagram.len();
    let c = &shared.counters;
    let (datagrams, bytes) = match side {
        Side::Up => (&c.datagrams_up, &c.bytes_up),
        Side::Down => (&c.datagrams_down, &c.bytes_down),
    };
    add(datagrams, 1);
    add(bytes, n as u64);
}

/// Reads one datagram with the link's protocol tap, if it has one: a tap of its own, so that
/// nothing of one datagram is read as part of the next.
fn tap(shared: &LinkShared, read: impl FnOnce(&mut dyn Tap, &TapLog)) {
    let Ok(tapping) = shared.tapping.read() else {
        return;
    };
    if let Some(t) = tapping.as_ref() {
        read(t.maker.tap().as_mut(), &t.log);
    }
}

fn dropped(shared: &LinkShared, side: Side, n: usize) {
    let c = &shared.counters;
    let (datagrams, bytes) = match side {
        Side::Up => (&c.dropped_up, &c.swallowed_up),
        Side::Down => (&c.dropped_down, &c.swallowed_down),
    };
    add(datagrams, 1);
    add(bytes, n as u64);
}

/// A UDP socket bound to `listen` with `SO_REUSEADDR` (so that the heal can bind the port
/// again before the refusing socket lets it go). Must be called inside a Tokio runtime.
pub(crate) fn bind(listen: SocketAddr) -> io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(listen),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    socket.set_reuse_address(true)?;
    let _ = socket.set_recv_buffer_size(RECEIVE_BUFFER);
    socket.set_nonblocking(true)?;
    socket.bind(&listen.into())?;
    UdpSocket::from_std(socket.into())
}

/// The link's port: the socket clients send to, passing or refusing.
struct Port {
    listen: SocketAddr,
    socket: Arc<UdpSocket>,
    refusing: bool,
}

impl Port {
    /// Stops answering: the socket only takes datagrams from itself from now on, so the kernel
    /// refuses everyone else's. What was already queued is dropped.
    async fn refuse(&mut self, shared: &LinkShared) {
        if self.refusing {
            return;
        }
        if let Err(e) = self.socket.connect(self.listen).await {
            eprintln!(
                "drill: link {}: cannot refuse on {} ({e}); datagrams go unread, not refused",
                shared.name, self.listen
            );
        }
        self.refusing = true;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while let Ok((n, _)) = self.socket.try_recv_from(&mut buf) {
            dropped(shared, Side::Up, n);
        }
    }

    /// Answers again, on a fresh socket bound beside the refusing one (which then closes).
    fn answer(&mut self) -> io::Result<()> {
        if !self.refusing {
            return Ok(());
        }
        self.socket = Arc::new(bind(self.listen)?);
        self.refusing = false;
        Ok(())
    }
}

/// One client's flow: the socket its datagrams leave from, connected to the upstream.
struct Flow {
    upstream: Arc<UdpSocket>,
    /// The upstream direction's held (delayed) datagrams.
    held: Held,
    /// When a datagram last went either way (ms since `born`), for the idle end.
    last: Arc<AtomicU64>,
    born: Instant,
    ends: CancellationToken,
}

/// A direction's queue of delayed datagrams, sent in order by [`deliver_late`].
#[derive(Clone)]
struct Held {
    queue: mpsc::Sender<(Instant, Bytes)>,
    /// Datagrams queued and not yet sent (a datagram read meanwhile queues behind them).
    count: Arc<AtomicUsize>,
}

impl Held {
    /// Queues `bytes` to leave at `due`; false (and nothing queued) when the queue is full.
    fn hold(&self, shared: &LinkShared, due: Instant, bytes: &[u8]) -> bool {
        self.count.fetch_add(1, Ordering::Relaxed);
        add(&shared.counters.held, 1);
        let queued = self
            .queue
            .try_send((due, Bytes::copy_from_slice(bytes)))
            .is_ok();
        if !queued {
            self.count.fetch_sub(1, Ordering::Relaxed);
            shared.counters.held.fetch_sub(1, Ordering::Relaxed);
        }
        queued
    }

    fn is_empty(&self) -> bool {
        self.count.load(Ordering::Relaxed) == 0
    }
}

/// Where a direction's datagrams go.
#[derive(Clone)]
enum Onward {
    /// Upstream, from the flow's own socket.
    Upstream(Arc<UdpSocket>),
    /// Back to the client, from the link's port.
    Client(Arc<UdpSocket>, SocketAddr),
}

impl Onward {
    fn side(&self) -> Side {
        match self {
            Onward::Upstream(_) => Side::Up,
            Onward::Client(..) => Side::Down,
        }
    }

    /// Sends one datagram. A connected socket reports an earlier datagram's ICMP error on the
    /// next send, without sending: one more try sends this one.
    async fn send(&self, bytes: &[u8]) -> bool {
        for _ in 0..2 {
            let sent = match self {
                Onward::Upstream(s) => s.send(bytes).await,
                Onward::Client(s, to) => s.send_to(bytes, *to).await,
            };
            if sent.is_ok() {
                return true;
            }
        }
        false
    }
}

/// Passes, holds or drops one datagram read on `side`, as `fate` says.
async fn forward(shared: &LinkShared, fate: Fate, onward: &Onward, held: &Held, bytes: &[u8]) {
    let side = onward.side();
    let due = match fate {
        Fate::Drop => return dropped(shared, side, bytes.len()),
        Fate::Pass if held.is_empty() => {
            if onward.send(bytes).await {
                passed(shared, side, bytes);
            }
            return;
        }
        // Behind the datagrams still held: never overtake them.
        Fate::Pass => Instant::now(),
        Fate::Delay(after) => Instant::now() + after,
    };
    if !held.hold(shared, due, bytes) {
        dropped(shared, side, bytes.len());
    }
}

/// Sends a direction's held datagrams, each at its due instant, in the order they were held.
/// When the flow ends, what it still holds is dropped.
async fn deliver_late(
    shared: Arc<LinkShared>,
    mut queue: mpsc::Receiver<(Instant, Bytes)>,
    onward: Onward,
    count: Arc<AtomicUsize>,
    ends: CancellationToken,
) {
    let side = onward.side();
    let released = |bytes: &Bytes, sent: Option<bool>| {
        match sent {
            Some(true) => passed(&shared, side, bytes),
            Some(false) => {}
            None => dropped(&shared, side, bytes.len()),
        }
        count.fetch_sub(1, Ordering::Relaxed);
        shared.counters.held.fetch_sub(1, Ordering::Relaxed);
    };
    loop {
        let next = tokio::select! {
            next = queue.recv() => next,
            _ = ends.cancelled() => None,
        };
        let Some((due, bytes)) = next else { break };
        let on_time = tokio::select! {
            _ = tokio::time::sleep_until(due.into()) => true,
            _ = ends.cancelled() => false,
        };
        if !on_time || silenced(&shared.condition.borrow(), side) {
            released(&bytes, None);
        } else {
            let sent = onward.send(&bytes).await;
            released(&bytes, Some(sent));
        }
        if !on_time {
            break;
        }
    }
    queue.close();
    while let Ok((_, bytes)) = queue.try_recv() {
        released(&bytes, None);
    }
}

/// A queue of held datagrams and the task that sends them.
fn held(shared: &Arc<LinkShared>, onward: Onward, ends: &CancellationToken) -> Held {
    let (queue, rx) = mpsc::channel(HELD_LIMIT);
    let count = Arc::new(AtomicUsize::new(0));
    shared.tasks.spawn(deliver_late(
        shared.clone(),
        rx,
        onward,
        count.clone(),
        ends.clone(),
    ));
    Held { queue, count }
}

/// Opens `client`'s flow: a socket connected to the upstream, and the task that carries the
/// upstream's answers back to `client` from `port`.
async fn open_flow(
    shared: &Arc<LinkShared>,
    port: &Arc<UdpSocket>,
    client: SocketAddr,
    cancel: &CancellationToken,
) -> io::Result<Flow> {
    let upstream = shared.upstream();
    let local = match (upstream.ip(), upstream.ip().is_loopback()) {
        (IpAddr::V4(_), true) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        (IpAddr::V4(_), false) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (IpAddr::V6(_), true) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        (IpAddr::V6(_), false) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
    let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(RECEIVE_BUFFER);
    socket.connect(upstream).await?;
    let socket = Arc::new(socket);
    let ends = cancel.child_token();
    let born = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    add(&shared.counters.accepted, 1);
    add(&shared.counters.active, 1);
    let up_held = held(shared, Onward::Upstream(socket.clone()), &ends);
    let back = Onward::Client(port.clone(), client);
    let down_held = held(shared, back.clone(), &ends);
    shared.tasks.spawn(answers(
        shared.clone(),
        socket.clone(),
        back,
        down_held,
        (born, last.clone()),
        ends.clone(),
    ));
    Ok(Flow {
        upstream: socket,
        held: up_held,
        last,
        born,
        ends,
    })
}

fn ms_since(born: Instant) -> u64 {
    born.elapsed().as_millis() as u64
}

/// Carries a flow's answers from the upstream back to its client until the flow ends.
async fn answers(
    shared: Arc<LinkShared>,
    upstream: Arc<UdpSocket>,
    back: Onward,
    held: Held,
    (born, last): (Instant, Arc<AtomicU64>),
    ends: CancellationToken,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let received = tokio::select! {
            r = tokio::time::timeout(FLOW_IDLE, upstream.recv(&mut buf)) => r,
            _ = ends.cancelled() => break,
        };
        match received {
            Err(_idle) => {
                let quiet = ms_since(born).saturating_sub(last.load(Ordering::Relaxed));
                if quiet >= FLOW_IDLE.as_millis() as u64 {
                    ends.cancel();
                    break;
                }
            }
            // The upstream's ICMP error for an earlier datagram (nothing listens there yet).
            Ok(Err(_)) => {}
            Ok(Ok(n)) => {
                last.store(ms_since(born), Ordering::Relaxed);
                let condition = shared.condition.borrow().clone();
                let fate = fate(&shared, &condition, Side::Down);
                forward(&shared, fate, &back, &held, &buf[..n]).await;
            }
        }
    }
    shared.counters.active.fetch_sub(1, Ordering::Relaxed);
}

/// Serves a datagram link on `socket` (bound to its port) until `cancel` fires: reads what
/// clients send, follows the condition (see the module's docs), and opens flows.
pub(crate) async fn serve(shared: Arc<LinkShared>, socket: UdpSocket, cancel: CancellationToken) {
    let mut port = Port {
        listen: shared.listen,
        socket: Arc::new(socket),
        refusing: false,
    };
    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
    let mut rx = shared.condition.subscribe();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let condition = rx.borrow_and_update().clone();
        if condition.refuses() {
            port.refuse(&shared).await;
            for (_, flow) in flows.drain() {
                if !flow.ends.is_cancelled() {
                    flow.ends.cancel();
                    add(&shared.counters.reset, 1);
                }
            }
        } else if let Err(e) = port.answer() {
            eprintln!(
                "drill: link {}: could not answer again on {}: {e}",
                shared.name, shared.listen
            );
            if let Ok(mut failed) = shared.relisten_failed.lock() {
                *failed = Some(e.to_string());
            }
            shared.settled.send_replace(condition.epoch);
            break;
        }
        shared.settled.send_replace(condition.epoch);
        if port.refusing {
            tokio::select! {
                _ = rx.changed() => {}
                _ = cancel.cancelled() => break,
            }
            continue;
        }
        let socket = port.socket.clone();
        tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
                Ok((n, client)) => {
                    from_client(&shared, &port, &mut flows, client, &buf[..n], &cancel).await;
                }
                // Nothing a client did: the next read goes on (never a busy loop).
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            },
            _ = rx.changed() => {}
            _ = cancel.cancelled() => break,
        }
    }
    for flow in flows.values() {
        flow.ends.cancel();
    }
}

/// One datagram from `client`: dropped, or forwarded on its flow (opened if need be).
async fn from_client(
    shared: &Arc<LinkShared>,
    port: &Port,
    flows: &mut HashMap<SocketAddr, Flow>,
    client: SocketAddr,
    bytes: &[u8],
    cancel: &CancellationToken,
) {
    // The condition now, not the one the read began under: a fault is in force from the
    // instant it is published.
    let condition = shared.condition.borrow().clone();
    // It left the engine, whether or not the link passes it on.
    tap(shared, |t, log| t.left(bytes, log));
    let fate = fate(shared, &condition, Side::Up);
    if fate == Fate::Drop {
        return dropped(shared, Side::Up, bytes.len());
    }
    if flows.get(&client).is_none_or(|f| f.ends.is_cancelled()) {
        flows.retain(|_, f| !f.ends.is_cancelled());
        match open_flow(shared, &port.socket, client, cancel).await {
            Ok(flow) => {
                flows.insert(client, flow);
            }
            Err(e) => {
                eprintln!(
                    "drill: link {}: cannot open a flow for {client} to {}: {e}",
                    shared.name,
                    shared.upstream()
                );
                return dropped(shared, Side::Up, bytes.len());
            }
        }
    }
    let Some(flow) = flows.get(&client) else {
        return;
    };
    flow.last.store(ms_since(flow.born), Ordering::Relaxed);
    let onward = Onward::Upstream(flow.upstream.clone());
    forward(shared, fate, &onward, &flow.held, bytes).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_follow_the_seed_the_epoch_and_the_direction() {
        let draw = |seed: u64, side: Side, epoch: u64| {
            let d = Datagrams::default();
            d.seed(seed);
            (0..2000)
                .map(|_| d.loses(side, epoch, 0.3))
                .collect::<Vec<_>>()
        };
        let a = draw(7, Side::Up, 1);
        assert_eq!(a, draw(7, Side::Up, 1), "same seed, same losses");
        assert_ne!(a, draw(8, Side::Up, 1), "another seed");
        assert_ne!(
            a,
            draw(7, Side::Down, 1),
            "the other direction draws its own"
        );
        assert_ne!(a, draw(7, Side::Up, 2), "another loss window draws anew");
        let lost = a.iter().filter(|l| **l).count();
        assert!((500..=700).contains(&lost), "{lost} of 2000 at 0.3");
    }

    #[test]
    fn no_loss_and_all_loss_are_exact() {
        let d = Datagrams::default();
        assert!((0..1000).all(|_| !d.loses(Side::Up, 1, 0.0)));
        assert!((0..1000).all(|_| d.loses(Side::Up, 1, 1.0)));
    }
}
