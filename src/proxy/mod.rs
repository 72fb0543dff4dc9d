//! The fault proxy: one [`Link`] per broker listener, and the fault vocabulary of
//! docs/src/design.md#3-fault-vocabulary.
//!
//! A link listens on a local port and forwards every accepted connection to its upstream (the
//! broker). Its condition — pass-through or one fault in one direction — lives in a
//! `tokio::sync::watch` channel. Applying a fault is a `send_replace`: it never waits on data
//! flow, however many connections are stalled, and every connection task and the accept loop
//! see the new condition at once. What this module must never do: let a fault leak bytes it
//! claims to hold or drop, or let a "healed" connection carry a byte stream with a hole in it
//! (after `swallow`, a connection that lost bytes is reset at the heal, as
//! docs/src/design.md#3-fault-vocabulary says).
//!
//! A link carries either byte streams (TCP: [`Link::start`], [`Link::start_kafka`]) or
//! datagrams (UDP: [`Link::start_udp`], see [`udp`]). Both are driven, listed and reported
//! through the same [`Link`]; each refuses the faults that mean nothing for what it carries
//! ([`Fault::on_streams`], [`Fault::on_datagrams`]) when they are applied
//! ([`Link::try_apply_spec`]), and a scenario refuses them at parse.

pub mod api;
mod connection;
pub mod kafka;
pub mod remote;
mod splice;
pub mod tap;
pub mod terminate;
pub mod toxiproxy;
pub mod udp;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

/// Whether healed links in this process forward zero-copy (default) or through drill's own
/// buffers (`drill proxy --copy-only`, for `drill bench proxy`'s comparison).
static ZERO_COPY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets whether healed links forward zero-copy (see [`splice`]); connections check it when
/// they are accepted.
pub fn zero_copy(on: bool) {
    ZERO_COPY.store(on, Ordering::Relaxed);
}

pub(crate) fn zero_copy_on() -> bool {
    ZERO_COPY.load(Ordering::Relaxed)
}

mod fault;
mod link;
mod status;

pub(crate) use fault::{Condition, Flow, Shape, Side};
pub use fault::{Direction, Fault, FaultSpec};
pub use link::Link;
pub(crate) use link::{LinkShared, listen_reusable};
pub(crate) use status::{Counters, add};
pub use status::{DatagramCounts, LinkStatus};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("link {name}: cannot listen on {listen}: {source}")]
    Listen {
        name: String,
        listen: SocketAddr,
        source: std::io::Error,
    },
    /// The heal found the link's port taken: what reached that port during the drill went to
    /// another program, so the drill says nothing about the engine.
    #[error("link {name}: could not listen again on {listen} after the heal: {why}")]
    Relisten {
        name: String,
        listen: SocketAddr,
        why: String,
    },
    /// A fault with no meaning for what the link carries (a `reset` on a datagram link, a
    /// `loss` on a byte stream); nothing changed.
    #[error("link {name}: {why}")]
    FaultRefused { name: String, why: String },
}

/// What a link [`Proxy::start`] makes carries.
#[derive(Debug, Clone, Copy)]
enum Carrying {
    /// TCP byte streams.
    Bytes,
    /// TCP, Kafka-aware.
    Kafka,
    /// UDP datagrams.
    Datagrams,
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
        self.start(name, listen, upstream, Carrying::Bytes).await
    }

    /// Starts a Kafka-aware link (see [`kafka`]) on the data runtime and adds it; its broker
    /// links are listed and faulted by name (`NAME-<node id>`) like any other.
    pub async fn start_kafka_link(
        &self,
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
    ) -> Result<Link, ProxyError> {
        self.start(name, listen, upstream, Carrying::Kafka).await
    }

    /// Starts a datagram (UDP) link (see [`udp`]) on the data runtime and adds it.
    pub async fn start_udp_link(
        &self,
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
    ) -> Result<Link, ProxyError> {
        self.start(name, listen, upstream, Carrying::Datagrams)
            .await
    }

    async fn start(
        &self,
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        carrying: Carrying,
    ) -> Result<Link, ProxyError> {
        let (owned, cancel) = (name.to_string(), self.cancel.child_token());
        let start = async move {
            match carrying {
                Carrying::Bytes => Link::start(&owned, listen, upstream, cancel).await,
                Carrying::Kafka => Link::start_kafka(&owned, listen, upstream, cancel).await,
                Carrying::Datagrams => Link::start_udp(&owned, listen, upstream, cancel).await,
            }
        };
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

    /// The link called `name`, a Kafka-aware link's broker links included.
    pub fn link(&self, name: &str) -> Option<Link> {
        let own = self.links.read().ok().and_then(|l| l.get(name).cloned());
        own.or_else(|| {
            self.own_links()
                .iter()
                .flat_map(Link::members)
                .find(|m| m.name() == name)
        })
    }

    /// Every link, each Kafka-aware link followed by its broker links.
    pub fn links(&self) -> Vec<Link> {
        self.own_links()
            .into_iter()
            .flat_map(|l| {
                let members = l.members();
                std::iter::once(l).chain(members)
            })
            .collect()
    }

    fn own_links(&self) -> Vec<Link> {
        self.links
            .read()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default()
    }

    pub async fn shutdown(&self) {
        for link in self.own_links() {
            link.shutdown().await;
        }
    }
}
