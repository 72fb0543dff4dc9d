//! One proxied listener ([`Link`]): its port, held from the first bind to its end, its
//! condition published to every connection task, faults put in force and healed, its status.
//! What the connections do under the condition is `connection.rs`'s (streams) and `udp.rs`'s
//! (datagrams).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;

pub(crate) struct LinkShared {
    pub(crate) name: String,
    pub(crate) listen: SocketAddr,
    /// Where new connections go. Changeable: a broker container restarted on a new host port
    /// keeps its client-facing port (the link's) stable.
    pub(crate) upstream: std::sync::RwLock<SocketAddr>,
    pub(crate) condition: watch::Sender<Condition>,
    /// The last epoch the accept loop has acted on (refuse closes the listener, heal reopens it).
    pub(super) settled: watch::Sender<u64>,
    /// Why the accept loop could not listen again after a heal, once it gave up.
    pub(super) relisten_failed: std::sync::Mutex<Option<String>>,
    pub(crate) counters: Counters,
    pub(crate) tasks: TaskTracker,
    /// Jitter draws, seeded.
    pub(crate) rng: std::sync::Mutex<crate::seed::Seeded>,
    /// A Kafka-aware link's place in its family (`None`: bytes only).
    pub(crate) kafka: Option<kafka::Role>,
    /// The protocol tap its connections get (set by the destination kind; `None`: none).
    pub(crate) tapping: std::sync::RwLock<Option<tap::Tapping>>,
    /// A terminating link's TLS sides (`None`: the link passes bytes as they come).
    pub(crate) terminate: std::sync::RwLock<Option<Arc<terminate::Terminate>>>,
    /// The expired certificate of the drill's CA, for `bad_certificate` with `certificate:
    /// expired` (`None`: the link has none to present).
    pub(crate) expired: std::sync::RwLock<Option<Arc<tokio_rustls::rustls::ServerConfig>>>,
    /// A datagram link's own state (`None`: the link carries byte streams).
    pub(crate) datagrams: Option<udp::Datagrams>,
}

impl LinkShared {
    pub(super) fn new(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        kafka: Option<kafka::Role>,
        datagrams: Option<udp::Datagrams>,
    ) -> Arc<LinkShared> {
        let (condition, _) = watch::channel(Condition {
            active: None,
            stacked: Vec::new(),
            since: Instant::now(),
            epoch: 0,
            strands: 0,
            budget_epoch: 0,
            seed: 0,
        });
        let (settled, _) = watch::channel(0);
        Arc::new(LinkShared {
            name: name.to_string(),
            listen,
            upstream: std::sync::RwLock::new(upstream),
            condition,
            settled,
            relisten_failed: std::sync::Mutex::new(None),
            counters: Counters::default(),
            tasks: TaskTracker::new(),
            rng: std::sync::Mutex::new(crate::seed::Seeded::new(0)),
            kafka,
            tapping: std::sync::RwLock::new(None),
            terminate: std::sync::RwLock::new(None),
            expired: std::sync::RwLock::new(None),
            datagrams,
        })
    }

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
    pub(super) shared: Arc<LinkShared>,
    pub(super) cancel: CancellationToken,
}

impl Link {
    /// Binds `listen` (port 0 picks a free port) and starts forwarding to `upstream`.
    pub async fn start(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
    ) -> Result<Link, ProxyError> {
        Link::bind(name, listen, upstream, cancel, None)
    }

    /// A Kafka-aware link (see [`kafka`]): it rewrites the broker addresses in the answers that
    /// carry them, so every broker is reached through a link of its own, `NAME-<node id>`,
    /// created on first sight. Faults on this link are in force on all of them.
    pub async fn start_kafka(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
    ) -> Result<Link, ProxyError> {
        let family = Arc::new(kafka::Family::new(name, listen.ip(), cancel.child_token()));
        Link::bind(
            name,
            listen,
            upstream,
            cancel,
            Some(kafka::Role::Head(family)),
        )
    }

    pub(super) fn bind(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
        kafka: Option<kafka::Role>,
    ) -> Result<Link, ProxyError> {
        let error = |source| ProxyError::Listen {
            name: name.to_string(),
            listen,
            source,
        };
        let listener = listen_reusable(listen).map_err(error)?;
        Link::from_std(name, listener, upstream, cancel, kafka).map_err(error)
    }

    /// Starts a link on a bound listener. Must be called inside a Tokio runtime.
    pub(crate) fn from_std(
        name: &str,
        listener: std::net::TcpListener,
        upstream: SocketAddr,
        cancel: CancellationToken,
        kafka: Option<kafka::Role>,
    ) -> std::io::Result<Link> {
        let listen = listener.local_addr()?;
        let port = Port::new(listener)?;
        let shared = LinkShared::new(name, listen, upstream, kafka, None);
        let link = Link { shared, cancel };
        let accept = link.clone();
        link.shared
            .tasks
            .spawn(async move { accept.accept_loop(port).await });
        Ok(link)
    }

    /// A datagram link (see [`udp`]): binds UDP `listen` (port 0 picks a free port) and
    /// forwards each client's datagrams to UDP `upstream` from a socket of that client's own
    /// (a flow), so the answers go back to that client. It knows the faults
    /// [`Fault::on_datagrams`] names and refuses the rest. Must be called inside a Tokio
    /// runtime.
    pub async fn start_udp(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
    ) -> Result<Link, ProxyError> {
        let error = |source| ProxyError::Listen {
            name: name.to_string(),
            listen,
            source,
        };
        let socket = udp::bind(listen).map_err(error)?;
        let listen = socket.local_addr().map_err(error)?;
        let shared = LinkShared::new(
            name,
            listen,
            upstream,
            None,
            Some(udp::Datagrams::default()),
        );
        let link = Link { shared, cancel };
        let serve = link.clone();
        link.shared.tasks.spawn(async move {
            udp::serve(serve.shared.clone(), socket, serve.cancel.clone()).await
        });
        Ok(link)
    }

    /// Whether the link carries datagrams (UDP) rather than byte streams.
    pub fn carries_datagrams(&self) -> bool {
        self.shared.datagrams.is_some()
    }

    /// Whether conditions stack on this link ([`Link::set_stack`]): a plain stream link.
    pub fn stacks(&self) -> bool {
        !self.carries_datagrams() && !self.is_kafka_aware()
    }

    /// Whether `spec`'s fault means something for what this link carries. (Its parameters are
    /// [`FaultSpec::validate`]'s to check, before it reaches a link.)
    pub fn check(&self, spec: &FaultSpec) -> Result<(), ProxyError> {
        let refused = |why: String| ProxyError::FaultRefused {
            name: self.shared.name.clone(),
            why,
        };
        let fault = spec.fault;
        if self.carries_datagrams() && !fault.on_datagrams() {
            return Err(refused(format!(
                "`{}` has no meaning on a datagram (UDP) link; it knows refuse, swallow, delay, loss, blackhole and heal",
                fault.name()
            )));
        }
        if self.carries_datagrams() && spec.toxicity < 1.0 {
            return Err(refused(
                "a datagram (UDP) link has no connections to draw a toxicity for; use toxicity 1 (or `loss` for a share of the datagrams)".to_string(),
            ));
        }
        if spec.expired && self.shared.expired.read().is_ok_and(|e| e.is_none()) {
            return Err(refused(
                "`certificate: expired` needs the drill's CA (a drill run over TLS mints the expired certificate); this link has none".to_string(),
            ));
        }
        if !self.carries_datagrams() && !fault.on_streams() {
            return Err(refused(format!(
                "`{}` is for datagram (UDP) links; this link carries a byte stream (use swallow)",
                fault.name()
            )));
        }
        Ok(())
    }

    /// The family this link heads, if it is a Kafka-aware bootstrap link.
    pub(super) fn family(&self) -> Option<&Arc<kafka::Family>> {
        match &self.shared.kafka {
            Some(kafka::Role::Head(f)) => Some(f),
            _ => None,
        }
    }

    /// Reads every connection from now on with `tapping` (a Kafka-aware link: its broker
    /// links too, those made later included).
    pub fn set_tap(&self, tapping: tap::Tapping) {
        if let Some(family) = self.family() {
            family.set_tap(tapping.clone());
        }
        if let Ok(mut t) = self.shared.tapping.write() {
            *t = Some(tapping);
        }
    }

    /// Terminates TLS on every connection accepted from now on (a Kafka-aware link: its
    /// broker links too, those made later included): see [`terminate`].
    pub fn terminate(&self, t: Arc<terminate::Terminate>) {
        if let Some(family) = self.family() {
            family.set_terminate(t.clone());
        }
        if let Ok(mut slot) = self.shared.terminate.write() {
            *slot = Some(t);
        }
    }

    /// Gives the link the expired certificate it presents for `bad_certificate` with
    /// `certificate: expired` (a Kafka-aware link: to its broker links too).
    pub fn set_expired(&self, config: Arc<tokio_rustls::rustls::ServerConfig>) {
        for m in self.members() {
            m.set_expired(config.clone());
        }
        if let Ok(mut slot) = self.shared.expired.write() {
            *slot = Some(config);
        }
    }

    /// Whether this link terminates TLS.
    pub fn terminates(&self) -> bool {
        self.shared.terminate.read().is_ok_and(|t| t.is_some())
    }

    /// A Kafka-aware link's broker links so far (empty for any other link).
    pub fn members(&self) -> Vec<Link> {
        self.family().map(|f| f.members()).unwrap_or_default()
    }

    /// Whether this link heads a family of broker links (a Kafka-aware bootstrap link).
    pub fn is_kafka_aware(&self) -> bool {
        self.family().is_some()
    }

    /// The name a member for broker `node_id` has (or will have) in this link's family.
    pub fn member_name(&self, node_id: i32) -> Option<String> {
        self.family().map(|f| f.member_name(node_id))
    }

    /// Puts `spec` on the member called `name` — at once if it exists, or from its creation
    /// on. False when this link heads no family or `name` is not one of its members' names.
    pub async fn apply_member(&self, name: &str, spec: FaultSpec) -> bool {
        let Some(family) = self.family() else {
            return false;
        };
        let Some(node) = name
            .strip_prefix(&format!("{}-", family.name))
            .and_then(|n| n.parse::<i32>().ok())
        else {
            return false;
        };
        match family.member(&family.member_name(node)) {
            Some(m) => m.apply_spec_settled(spec).await,
            None => family.apply_early(name, spec),
        }
        true
    }

    /// [`Link::status`] with the counters of every broker link of the family added in.
    pub fn family_status(&self) -> LinkStatus {
        let mut s = self.status();
        if let Some(f) = self.family() {
            for m in f.members() {
                let t = m.status();
                s.connections_accepted += t.connections_accepted;
                s.connections_reset += t.connections_reset;
                s.connections_open += t.connections_open;
                s.bytes_upstream += t.bytes_upstream;
                s.bytes_downstream += t.bytes_downstream;
                s.bytes_swallowed_upstream += t.bytes_swallowed_upstream;
                s.bytes_swallowed_downstream += t.bytes_swallowed_downstream;
                s.bytes_spliced += t.bytes_spliced;
                s.connections_stranded += t.connections_stranded;
                s.broker_links
                    .push(format!("{} ({} → {})", t.name, t.listen, t.upstream));
            }
            s.answers_rewritten = f.rewritten.load(Ordering::Relaxed);
            s.api_versions_trimmed = f.trimmed.load(Ordering::Relaxed);
        }
        s
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

    /// [`Link::apply`] with parameters (`delay`, `throttle`, `loss`). A fault the link cannot
    /// carry out ([`Link::check`]) changes nothing: it is said on stderr and the current epoch
    /// is returned. [`Link::try_apply_spec`] returns the refusal instead.
    pub fn apply_spec(&self, spec: FaultSpec) -> u64 {
        match self.try_apply_spec(spec) {
            Ok(epoch) => epoch,
            Err(e) => {
                eprintln!("drill: {e}");
                self.shared.condition.borrow().epoch
            }
        }
    }

    /// [`Link::apply_spec`], or why the link cannot carry `spec` out (nothing changed then).
    pub fn try_apply_spec(&self, spec: FaultSpec) -> Result<u64, ProxyError> {
        self.check(&spec)?;
        Ok(self.publish(spec))
    }

    pub(super) fn publish(&self, spec: FaultSpec) -> u64 {
        if spec.fault == Fault::Strand {
            let mut epoch = 0;
            self.shared.condition.send_modify(|c| {
                c.epoch += 1;
                c.strands += 1;
                epoch = c.epoch;
            });
            for m in self.members() {
                m.apply_spec(spec);
            }
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
            c.budget_epoch = c.epoch;
            if spec.fault == Fault::Heal {
                c.stacked.clear();
            }
        });
        if let Some(f) = self.family() {
            f.set_group(active);
        }
        epoch
    }

    /// Puts a whole stack in force at once: at most one `cut` (`refuse`, `reset`, `swallow`,
    /// `hang`; `None`: none) and any number of shaping conditions ([`Fault::shapes`]), each in
    /// its own direction — Toxiproxy's toxics on one proxy. Only plain stream links stack; a
    /// datagram or Kafka-aware link takes one fault at a time ([`Link::apply_spec`]). Waits for
    /// the listener as [`Link::apply_spec_settled`] does.
    pub async fn set_stack(
        &self,
        cut: Option<FaultSpec>,
        stacked: Vec<FaultSpec>,
    ) -> Result<(), ProxyError> {
        let refused = |why: String| ProxyError::FaultRefused {
            name: self.shared.name.clone(),
            why,
        };
        if !stacked.is_empty() && !self.stacks() {
            return Err(refused(
                "only a plain stream (TCP) link stacks conditions; this one takes one fault at a time"
                    .to_string(),
            ));
        }
        if let Some(c) = cut.filter(|c| c.fault.shapes() || c.fault.instantaneous()) {
            return Err(refused(format!("`{}` is not a cut", c.fault.name())));
        }
        if let Some(s) = stacked.iter().find(|s| !s.fault.shapes()) {
            return Err(refused(format!(
                "`{}` does not stack: a link holds at most one cut (refuse, reset, swallow, hang)",
                s.fault.name()
            )));
        }
        for spec in cut.iter().chain(&stacked) {
            self.check(spec)?;
            spec.validate().map_err(refused)?;
        }
        let was_refusing = self.shared.condition.borrow().refuses();
        let refusing = cut.is_some_and(|c| c.fault == Fault::Refuse);
        let budgets = |specs: &[FaultSpec]| -> Vec<FaultSpec> {
            specs
                .iter()
                .filter(|s| s.fault == Fault::LimitData)
                .copied()
                .collect()
        };
        let mut epoch = 0;
        self.shared.condition.send_modify(|c| {
            c.epoch += 1;
            epoch = c.epoch;
            if c.active != cut || c.stacked != stacked {
                c.since = Instant::now();
            }
            if budgets(&c.stacked) != budgets(&stacked) {
                c.budget_epoch = c.epoch;
            }
            c.active = cut;
            c.stacked = stacked;
        });
        if let Some(f) = self.family() {
            f.set_group(cut);
        }
        if was_refusing || refusing {
            self.settled(epoch, Duration::from_secs(2)).await;
        }
        Ok(())
    }

    /// Seeds the link's randomness (jitter, a datagram link's losses), so a drill with the
    /// same seed replays the same.
    pub fn seed(&self, seed: u64) {
        if let Ok(mut rng) = self.shared.rng.lock() {
            *rng = crate::seed::Seeded::new(seed);
        }
        self.shared.condition.send_modify(|c| c.seed = seed);
        if let Some(d) = &self.shared.datagrams {
            d.seed(seed);
        }
        if let Some(f) = self.family() {
            f.seed(seed);
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

    /// `Err` once the link could not listen again after a heal (its port was taken): it
    /// accepts nothing from then on.
    pub fn listening(&self) -> Result<(), ProxyError> {
        let failed = match self.shared.relisten_failed.lock() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let members = self.members().into_iter().map(|m| m.listening());
        match failed {
            Some(why) => Err(ProxyError::Relisten {
                name: self.shared.name.clone(),
                listen: self.shared.listen,
                why,
            }),
            None => members.collect(),
        }
    }

    /// Applies a fault and waits for the listener to follow (bounded; never on data flow).
    pub async fn apply_settled(&self, fault: Fault, direction: Direction) {
        self.apply_spec_settled(FaultSpec::new(fault, direction))
            .await;
    }

    /// [`Link::apply_settled`] with parameters. Only a change between refusing and listening
    /// needs the listener to act; every other fault is in force once published. A fault the
    /// link cannot carry out changes nothing (see [`Link::apply_spec`]).
    pub async fn apply_spec_settled(&self, spec: FaultSpec) {
        if let Err(e) = self.try_apply_spec_settled(spec).await {
            eprintln!("drill: {e}");
        }
    }

    /// [`Link::apply_spec_settled`], or why the link cannot carry `spec` out.
    pub async fn try_apply_spec_settled(&self, spec: FaultSpec) -> Result<(), ProxyError> {
        self.check(&spec)?;
        let was_refusing = self.shared.condition.borrow().refuses();
        let epoch = self.publish(spec);
        if was_refusing || spec.fault == Fault::Refuse {
            self.settled(epoch, Duration::from_secs(2)).await;
            // The family's broker links follow the head; wait for theirs too.
            for m in self.members() {
                let epoch = m.shared.condition.borrow().epoch;
                m.settled(epoch, Duration::from_secs(2)).await;
            }
        }
        Ok(())
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
            loss: c.active.filter(|a| a.fault == Fault::Loss).map(|a| a.loss),
            stacked: c.stacked.iter().map(FaultSpec::describe).collect(),
            since_ms: c.since.elapsed().as_millis() as u64,
            connections_accepted: get(&n.accepted),
            connections_reset: get(&n.reset),
            connections_open: get(&n.active),
            bytes_upstream: get(&n.bytes_up),
            bytes_downstream: get(&n.bytes_down),
            bytes_swallowed_upstream: get(&n.swallowed_up),
            bytes_swallowed_downstream: get(&n.swallowed_down),
            bytes_spliced: get(&n.spliced),
            connections_stranded: get(&n.stranded),
            broker_links: Vec::new(),
            answers_rewritten: 0,
            api_versions_trimmed: 0,
            datagrams: self.carries_datagrams().then(|| DatagramCounts {
                upstream: get(&n.datagrams_up),
                downstream: get(&n.datagrams_down),
                dropped_upstream: get(&n.dropped_up),
                dropped_downstream: get(&n.dropped_down),
                held: get(&n.held),
            }),
        }
    }

    /// Stops listening and resets every connection of the link (and of its broker links).
    pub async fn shutdown(&self) {
        for m in self.members() {
            Box::pin(m.shutdown()).await;
        }
        self.cancel.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }

    pub(super) async fn accept_loop(self, mut port: Port) {
        let mut rx = self.shared.condition.subscribe();
        loop {
            let condition = rx.borrow_and_update().clone();
            if condition.refuses() {
                port.refuse();
            } else if let Err(e) = port.listen(&self.cancel).await {
                eprintln!(
                    "drill: link {}: could not listen again on {}: {e}",
                    self.shared.name, self.shared.listen
                );
                if let Ok(mut failed) = self.shared.relisten_failed.lock() {
                    *failed = Some(e.to_string());
                }
                self.shared.settled.send_replace(condition.epoch);
                return;
            }
            self.shared.settled.send_replace(condition.epoch);
            match &port.accepting {
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
                                let tls = self.shared.terminate.read().ok().and_then(|t| t.clone());
                                match tls {
                                    Some(t) => self.shared.tasks.spawn(terminate::serve(shared, socket, abort, t)),
                                    None => self.shared.tasks.spawn(connection::serve(shared, socket, abort)),
                                };
                            }
                        }
                        _ = rx.changed() => {}
                        _ = self.cancel.cancelled() => return,
                    }
                }
            }
        }
    }
}

/// A link's port, held from the first bind to the link's end. While the link refuses, a
/// socket stays bound to the port without listening: a connect gets RST (ECONNREFUSED), as
/// from a stopped service, and nothing else can take the port meanwhile — a free-port pick
/// (`bind` to port 0) and a client's ephemeral source port both pass over a bound port. The
/// heal makes that same socket listen. Closing the listener and binding anew at the heal left
/// the port free for the whole refusal; once another drill of the same selftest took it, the
/// link could not listen again and the engine delivered into that other drill's broker (seen
/// once in CI: `mqtt-flapping`, 1101 records lost after the proxy restart). Linux cannot stop
/// a socket listening (`shutdown` of a listener gives its port up), so the listener itself is
/// closed and the holder bound at once after: a window of microseconds, not seconds.
pub(super) struct Port {
    pub(super) listen: SocketAddr,
    /// The listener, while the link accepts.
    pub(super) accepting: Option<TcpListener>,
    /// The bound, not listening socket, while the link refuses.
    pub(super) held: Option<socket2::Socket>,
}

impl Port {
    pub(super) fn new(listener: std::net::TcpListener) -> std::io::Result<Port> {
        let listen = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        Ok(Port {
            listen,
            accepting: Some(TcpListener::from_std(listener)?),
            held: None,
        })
    }

    /// Listens (again, after a refusal) on the same port; a no-op while listening.
    pub(super) async fn listen(&mut self, cancel: &CancellationToken) -> std::io::Result<()> {
        if self.accepting.is_some() {
            return Ok(());
        }
        let listener: std::net::TcpListener = match self.held.take() {
            Some(held) => {
                held.listen(1024)?;
                held.into()
            }
            // The holder could not be bound: the port was free; take it back if it still is.
            None => Port::rebind(self.listen, cancel).await?,
        };
        listener.set_nonblocking(true)?;
        self.accepting = Some(TcpListener::from_std(listener)?);
        Ok(())
    }

    /// Stops listening (what waits in the accept queue is reset) and holds the port.
    pub(super) fn refuse(&mut self) {
        if self.accepting.take().is_none() {
            return;
        }
        match hold(self.listen) {
            Ok(held) => self.held = Some(held),
            Err(e) => eprintln!(
                "drill: cannot hold {} while refusing ({e}); it is free until the heal",
                self.listen
            ),
        }
    }

    /// Binds `listen` again, retrying for 2 s while it is in use.
    pub(super) async fn rebind(
        listen: SocketAddr,
        cancel: &CancellationToken,
    ) -> std::io::Result<std::net::TcpListener> {
        let mut tries = 0;
        loop {
            match listen_reusable(listen) {
                Ok(l) => return Ok(l),
                Err(e) if tries >= 200 || cancel.is_cancelled() => return Err(e),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// A socket bound to `listen` with SO_REUSEADDR (as the listener had), not listening.
pub(super) fn hold(listen: SocketAddr) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(listen),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&listen.into())?;
    Ok(socket)
}

/// A listening socket with SO_REUSEADDR (as Tokio's own bind sets it): after a `refuse` the
/// link listens again on the same port while old connections linger in TIME_WAIT.
pub(crate) fn listen_reusable(listen: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = hold(listen)?;
    socket.listen(1024)?;
    Ok(socket.into())
}
