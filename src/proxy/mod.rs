//! The fault proxy: one [`Link`] per broker listener, and the fault vocabulary of DESIGN.md §3.
//!
//! A link listens on a local port and forwards every accepted connection to its upstream (the
//! broker). Its condition — pass-through or one fault in one direction — lives in a
//! `tokio::sync::watch` channel. Applying a fault is a `send_replace`: it never waits on data
//! flow, however many connections are stalled, and every connection task and the accept loop
//! see the new condition at once. What this module must never do: let a fault leak bytes it
//! claims to hold or drop, or let a "healed" connection carry a byte stream with a hole in it
//! (after `swallow`, a connection that lost bytes is reset at the heal, as DESIGN.md §3 says).

pub mod api;
mod connection;
pub mod toxiproxy;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A network fault (DESIGN.md §3). `Heal` returns the link to pass-through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Nothing listens: new connections get ECONNREFUSED, existing ones are reset.
    Refuse,
    /// New connections are accepted and reset at once; existing ones are reset now.
    Reset,
    /// Bytes in `direction` are read and thrown away; the sender never blocks. Half-open.
    Swallow,
    /// Nothing is read in `direction`; the sender's buffers fill and its writes block.
    Hang,
    /// Bytes in `direction` arrive `latency` ± `jitter` late, in order.
    Delay,
    /// Bytes in `direction` flow at most `bytes_per_s`.
    Throttle,
    /// Toxiproxy's `limit_data`: each connection is reset once `limit_bytes` have passed in
    /// `direction` since the fault began. Only reachable through the Toxiproxy-shaped API.
    #[serde(skip)]
    LimitData,
    /// Instantaneous: every connection open at that instant goes silent for good in both
    /// directions (bytes read and dropped, no FIN, no RST, not even later), while new
    /// connections pass. A NAT or firewall entry lost. The link's condition is unchanged.
    Strand,
    /// Back to pass-through.
    Heal,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Refuse => "refuse",
            Fault::Reset => "reset",
            Fault::Swallow => "swallow",
            Fault::Hang => "hang",
            Fault::Delay => "delay",
            Fault::Throttle => "throttle",
            Fault::LimitData => "limit_data",
            Fault::Strand => "strand",
            Fault::Heal => "heal",
        }
    }

    /// Faults that act on whole connections, not on one direction.
    pub fn whole_connection(self) -> bool {
        matches!(self, Fault::Refuse | Fault::Reset | Fault::Strand)
    }

    /// Faults that act once, at an instant, instead of holding until a heal.
    pub fn instantaneous(self) -> bool {
        matches!(self, Fault::Strand)
    }
}

/// Which way a fault acts: `upstream` is client → broker, `downstream` broker → client.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Upstream,
    Downstream,
    #[default]
    Both,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
            Direction::Both => "both",
        }
    }

    fn covers(self, side: Side) -> bool {
        matches!(
            (self, side),
            (Direction::Both, _)
                | (Direction::Upstream, Side::Up)
                | (Direction::Downstream, Side::Down)
        )
    }
}

/// One way through a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Up,
    Down,
}

/// What one side of a connection does under the link's condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Pass,
    Swallow,
    Hang,
    Delay {
        latency: Duration,
        jitter: Duration,
    },
    Throttle {
        bytes_per_s: u64,
    },
    Limit {
        bytes: u64,
    },
    /// Reset the connection (`refuse` and `reset` both cut existing connections).
    Cut,
}

/// A fault with its parameters, as the control plane and scenarios give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FaultSpec {
    pub fault: Fault,
    pub direction: Direction,
    /// `delay`: added to every chunk.
    #[serde(skip_serializing_if = "Duration::is_zero", with = "millis")]
    pub latency: Duration,
    /// `delay`: each chunk gets a further uniform ±jitter (seeded), never out of order.
    #[serde(skip_serializing_if = "Duration::is_zero", with = "millis")]
    pub jitter: Duration,
    /// `throttle`: the cap.
    #[serde(skip_serializing_if = "is_zero")]
    pub bytes_per_s: u64,
    /// `limit_data`: bytes each connection may pass before it is reset.
    #[serde(skip_serializing_if = "is_zero")]
    pub limit_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

mod millis {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

impl FaultSpec {
    pub fn new(fault: Fault, direction: Direction) -> FaultSpec {
        FaultSpec {
            fault,
            direction,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            bytes_per_s: 0,
            limit_bytes: 0,
        }
    }

    pub fn limit(direction: Direction, bytes: u64) -> FaultSpec {
        FaultSpec {
            limit_bytes: bytes,
            ..FaultSpec::new(Fault::LimitData, direction)
        }
    }

    pub fn delay(direction: Direction, latency: Duration, jitter: Duration) -> FaultSpec {
        FaultSpec {
            latency,
            jitter,
            ..FaultSpec::new(Fault::Delay, direction)
        }
    }

    pub fn throttle(direction: Direction, bytes_per_s: u64) -> FaultSpec {
        FaultSpec {
            bytes_per_s,
            ..FaultSpec::new(Fault::Throttle, direction)
        }
    }

    /// Checks the parameters a fault needs; the message says what to send instead.
    pub fn validate(&self) -> Result<(), String> {
        if self.fault.whole_connection() && self.direction != Direction::Both {
            return Err(format!(
                "`{}` acts on whole connections; leave `direction` out",
                self.fault.name()
            ));
        }
        match self.fault {
            Fault::Delay if self.latency.is_zero() && self.jitter.is_zero() => {
                Err("`delay` needs a latency (and optionally a jitter)".to_string())
            }
            Fault::Throttle if self.bytes_per_s == 0 => {
                Err("`throttle` needs bytes_per_s greater than zero".to_string())
            }
            _ => Ok(()),
        }
    }
}

/// The link's condition, published to every task of the link.
#[derive(Debug, Clone)]
pub(crate) struct Condition {
    pub(crate) active: Option<FaultSpec>,
    pub(crate) since: Instant,
    pub(crate) epoch: u64,
    /// How many `strand`s the link has had: a connection opened when this was lower is
    /// stranded.
    pub(crate) strands: u64,
}

impl Condition {
    pub(crate) fn flow(&self, side: Side) -> Flow {
        let Some(spec) = self.active else {
            return Flow::Pass;
        };
        if matches!(spec.fault, Fault::Refuse | Fault::Reset) {
            return Flow::Cut;
        }
        if !spec.direction.covers(side) {
            return Flow::Pass;
        }
        match spec.fault {
            Fault::Swallow => Flow::Swallow,
            Fault::Hang => Flow::Hang,
            Fault::Delay => Flow::Delay {
                latency: spec.latency,
                jitter: spec.jitter,
            },
            Fault::Throttle => Flow::Throttle {
                bytes_per_s: spec.bytes_per_s,
            },
            Fault::LimitData => Flow::Limit {
                bytes: spec.limit_bytes,
            },
            _ => Flow::Pass,
        }
    }

    pub(crate) fn swallows(&self) -> bool {
        self.active.is_some_and(|a| a.fault == Fault::Swallow)
    }

    fn refuses(&self) -> bool {
        self.active.is_some_and(|a| a.fault == Fault::Refuse)
    }
}

/// Per-link counters, shared by its tasks.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) accepted: AtomicU64,
    pub(crate) reset: AtomicU64,
    pub(crate) active: AtomicU64,
    pub(crate) bytes_up: AtomicU64,
    pub(crate) bytes_down: AtomicU64,
    pub(crate) swallowed_up: AtomicU64,
    pub(crate) swallowed_down: AtomicU64,
    pub(crate) stranded: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// What `GET /links` and the report show of a link.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinkStatus {
    pub name: String,
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    /// `pass` when healed.
    pub fault: String,
    pub direction: Option<String>,
    /// `delay` and `throttle` parameters, when in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<u64>,
    /// How long the current condition has been in force.
    pub since_ms: u64,
    pub connections_accepted: u64,
    pub connections_reset: u64,
    pub connections_open: u64,
    pub bytes_upstream: u64,
    pub bytes_downstream: u64,
    pub bytes_swallowed_upstream: u64,
    pub bytes_swallowed_downstream: u64,
    /// Connections a `strand` left silent (they stay open until their ends close them).
    #[serde(default)]
    pub connections_stranded: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("link {name}: cannot listen on {listen}: {source}")]
    Listen {
        name: String,
        listen: SocketAddr,
        source: std::io::Error,
    },
}

pub(crate) struct LinkShared {
    pub(crate) name: String,
    pub(crate) listen: SocketAddr,
    /// Where new connections go. Changeable: a broker container restarted on a new host port
    /// keeps its client-facing port (the link's) stable.
    pub(crate) upstream: std::sync::RwLock<SocketAddr>,
    pub(crate) condition: watch::Sender<Condition>,
    /// The last epoch the accept loop has acted on (refuse closes the listener, heal reopens it).
    settled: watch::Sender<u64>,
    pub(crate) counters: Counters,
    pub(crate) tasks: TaskTracker,
    /// Jitter draws, seeded.
    pub(crate) rng: std::sync::Mutex<crate::workload::Seeded>,
}

impl LinkShared {
    pub(crate) fn upstream(&self) -> SocketAddr {
        match self.upstream.read() {
            Ok(u) => *u,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

/// One proxied listener. Cheap to clone; all clones drive the same link.
#[derive(Clone)]
pub struct Link {
    shared: Arc<LinkShared>,
    cancel: CancellationToken,
}

impl Link {
    /// Binds `listen` (port 0 picks a free port) and starts forwarding to `upstream`.
    pub async fn start(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
    ) -> Result<Link, ProxyError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ProxyError::Listen {
                name: name.to_string(),
                listen,
                source,
            })?;
        let listen = listener.local_addr().map_err(|source| ProxyError::Listen {
            name: name.to_string(),
            listen,
            source,
        })?;
        let (condition, _) = watch::channel(Condition {
            active: None,
            since: Instant::now(),
            epoch: 0,
            strands: 0,
        });
        let (settled, _) = watch::channel(0);
        let shared = Arc::new(LinkShared {
            name: name.to_string(),
            listen,
            upstream: std::sync::RwLock::new(upstream),
            condition,
            settled,
            counters: Counters::default(),
            tasks: TaskTracker::new(),
            rng: std::sync::Mutex::new(crate::workload::Seeded::new(0)),
        });
        let link = Link { shared, cancel };
        let accept = link.clone();
        link.shared
            .tasks
            .spawn(async move { accept.accept_loop(Some(listener)).await });
        Ok(link)
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.shared.listen
    }

    pub fn upstream_addr(&self) -> SocketAddr {
        self.shared.upstream()
    }

    /// Points new connections at `upstream` (connections already open stay where they are).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        if let Ok(mut u) = self.shared.upstream.write() {
            *u = upstream;
        }
    }

    /// Puts `fault` in force at once for every connection of the link, new and existing.
    /// Never blocks: it only publishes the new condition. `Heal` returns to pass-through.
    pub fn apply(&self, fault: Fault, direction: Direction) -> u64 {
        self.apply_spec(FaultSpec::new(fault, direction))
    }

    /// [`Link::apply`] with parameters (`delay`, `throttle`).
    pub fn apply_spec(&self, spec: FaultSpec) -> u64 {
        if spec.fault == Fault::Strand {
            let mut epoch = 0;
            self.shared.condition.send_modify(|c| {
                c.epoch += 1;
                c.strands += 1;
                epoch = c.epoch;
            });
            return epoch;
        }
        let active = match spec.fault {
            Fault::Heal => None,
            _ => Some(spec),
        };
        let mut epoch = 0;
        self.shared.condition.send_modify(|c| {
            c.epoch += 1;
            epoch = c.epoch;
            if c.active != active {
                c.since = Instant::now();
            }
            c.active = active;
        });
        epoch
    }

    /// Seeds the link's randomness (jitter), so a drill with the same seed replays the same.
    pub fn seed(&self, seed: u64) {
        if let Ok(mut rng) = self.shared.rng.lock() {
            *rng = crate::workload::Seeded::new(seed);
        }
    }

    /// Waits (at most `limit`) until the listener has acted on condition `epoch`: after a
    /// `refuse`, nothing listens any more; after the heal, the port accepts again.
    pub async fn settled(&self, epoch: u64, limit: Duration) -> bool {
        let mut rx = self.shared.settled.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|e| *e >= epoch))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Applies a fault and waits for the listener to follow (bounded; never on data flow).
    pub async fn apply_settled(&self, fault: Fault, direction: Direction) {
        self.apply_spec_settled(FaultSpec::new(fault, direction))
            .await;
    }

    /// [`Link::apply_settled`] with parameters. Only a change between refusing and listening
    /// needs the listener to act; every other fault is in force once published.
    pub async fn apply_spec_settled(&self, spec: FaultSpec) {
        let was_refusing = self.shared.condition.borrow().refuses();
        let epoch = self.apply_spec(spec);
        if was_refusing || spec.fault == Fault::Refuse {
            self.settled(epoch, Duration::from_secs(2)).await;
        }
    }

    pub fn status(&self) -> LinkStatus {
        let c = self.shared.condition.borrow().clone();
        let n = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LinkStatus {
            name: self.shared.name.clone(),
            listen: self.shared.listen,
            upstream: self.shared.upstream(),
            fault: c
                .active
                .map(|a| a.fault.name())
                .unwrap_or("pass")
                .to_string(),
            direction: c.active.map(|a| a.direction.name().to_string()),
            latency_ms: c
                .active
                .filter(|a| a.fault == Fault::Delay)
                .map(|a| a.latency.as_millis() as u64),
            jitter_ms: c
                .active
                .filter(|a| a.fault == Fault::Delay)
                .map(|a| a.jitter.as_millis() as u64),
            bytes_per_s: c
                .active
                .filter(|a| a.fault == Fault::Throttle)
                .map(|a| a.bytes_per_s),
            since_ms: c.since.elapsed().as_millis() as u64,
            connections_accepted: get(&n.accepted),
            connections_reset: get(&n.reset),
            connections_open: get(&n.active),
            bytes_upstream: get(&n.bytes_up),
            bytes_downstream: get(&n.bytes_down),
            bytes_swallowed_upstream: get(&n.swallowed_up),
            bytes_swallowed_downstream: get(&n.swallowed_down),
            connections_stranded: get(&n.stranded),
        }
    }

    /// Stops listening and resets every connection of the link.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }

    async fn accept_loop(self, mut listener: Option<TcpListener>) {
        let mut rx = self.shared.condition.subscribe();
        loop {
            let condition = rx.borrow_and_update().clone();
            if condition.refuses() {
                // Nothing listens: the kernel answers new connects with RST (ECONNREFUSED).
                listener = None;
            } else if listener.is_none() {
                listener = self.rebind().await;
                if listener.is_none() {
                    return;
                }
            }
            self.shared.settled.send_replace(condition.epoch);
            match &listener {
                None => {
                    tokio::select! {
                        _ = rx.changed() => {}
                        _ = self.cancel.cancelled() => return,
                    }
                }
                Some(l) => {
                    tokio::select! {
                        accepted = l.accept() => {
                            if let Ok((socket, _)) = accepted {
                                add(&self.shared.counters.accepted, 1);
                                let shared = self.shared.clone();
                                let abort = self.cancel.child_token();
                                self.shared.tasks.spawn(connection::serve(shared, socket, abort));
                            }
                        }
                        _ = rx.changed() => {}
                        _ = self.cancel.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Listens again on the same address after a `refuse` (SO_REUSEADDR is set by tokio).
    async fn rebind(&self) -> Option<TcpListener> {
        for _ in 0..200 {
            match TcpListener::bind(self.shared.listen).await {
                Ok(l) => return Some(l),
                Err(_) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                        _ = self.cancel.cancelled() => return None,
                    }
                }
            }
        }
        eprintln!(
            "drill: link {}: could not listen again on {}",
            self.shared.name, self.shared.listen
        );
        None
    }
}

/// A set of named links, as `drill proxy` and the runner use them. Cheap to clone; links can
/// be added and removed while it serves (the Toxiproxy-shaped API creates them).
#[derive(Clone)]
pub struct Proxy {
    links: Arc<std::sync::RwLock<BTreeMap<String, Link>>>,
    cancel: CancellationToken,
    /// The runtime that carries the data; links started through the API run there, so the
    /// control plane may live on another thread and never wait behind data flow.
    data: Option<tokio::runtime::Handle>,
}

impl Proxy {
    /// Links this proxy starts itself stop when `cancel` fires. Called inside the runtime
    /// that should carry the data.
    pub fn new(cancel: CancellationToken) -> Proxy {
        Proxy {
            links: Arc::default(),
            cancel,
            data: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Starts a link on the data runtime and adds it.
    pub async fn start_link(
        &self,
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
    ) -> Result<Link, ProxyError> {
        let (owned, cancel) = (name.to_string(), self.cancel.child_token());
        let start = async move { Link::start(&owned, listen, upstream, cancel).await };
        let link = match &self.data {
            Some(handle) => handle.spawn(start).await.map_err(|e| ProxyError::Listen {
                name: name.to_string(),
                listen,
                source: std::io::Error::other(e.to_string()),
            })??,
            None => start.await?,
        };
        self.add(link.clone());
        Ok(link)
    }

    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    pub fn add(&self, link: Link) {
        if let Ok(mut links) = self.links.write() {
            links.insert(link.name().to_string(), link);
        }
    }

    pub fn remove(&self, name: &str) -> Option<Link> {
        self.links.write().ok().and_then(|mut l| l.remove(name))
    }

    pub fn link(&self, name: &str) -> Option<Link> {
        self.links.read().ok().and_then(|l| l.get(name).cloned())
    }

    pub fn links(&self) -> Vec<Link> {
        self.links
            .read()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default()
    }

    pub async fn shutdown(&self) {
        for link in self.links() {
            link.shutdown().await;
        }
    }
}
