//! What a link counts and shows: the counters its tasks share, and [`LinkStatus`], what
//! `GET /links` and the report show of a link.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::fault::is_zero;

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
    /// A datagram link's datagrams forwarded and dropped, per direction.
    pub(crate) datagrams_up: AtomicU64,
    pub(crate) datagrams_down: AtomicU64,
    pub(crate) dropped_up: AtomicU64,
    pub(crate) dropped_down: AtomicU64,
    /// Datagrams a `delay` holds now (both directions).
    pub(crate) held: AtomicU64,
    /// Connections served so far: each one's serial number.
    pub(crate) served: AtomicU64,
    /// Of the bytes forwarded (both ways), those that went zero-copy (`splice`).
    pub(crate) spliced: AtomicU64,
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
    /// `loss`: the fraction of datagrams dropped, when in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Shaping conditions stacked beside `fault` (`delay 80ms downstream`, `throttle 100000
    /// B/s upstream`, `limit_data 10 bytes upstream`): [`FaultSpec::describe`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacked: Vec<String>,
    /// How long the current condition has been in force.
    pub since_ms: u64,
    pub connections_accepted: u64,
    pub connections_reset: u64,
    pub connections_open: u64,
    pub bytes_upstream: u64,
    pub bytes_downstream: u64,
    pub bytes_swallowed_upstream: u64,
    pub bytes_swallowed_downstream: u64,
    /// Of `bytes_upstream` + `bytes_downstream`, those a healed link passed zero-copy
    /// (`splice(2)`, Linux) instead of through its own buffers.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_spliced: u64,
    /// Connections a `strand` left silent (they stay open until their ends close them).
    #[serde(default)]
    pub connections_stranded: u64,
    /// A Kafka-aware link's broker links (`kafka-<node id>`, listen → broker), when its counters
    /// are the whole family's ([`Link::family_status`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker_links: Vec<String>,
    /// A Kafka-aware link's answers with broker addresses rewritten.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub answers_rewritten: u64,
    /// A Kafka-aware link's ApiVersions answers stripped of their trailing tagged fields (for
    /// clients such as librdkafka 2.0 that cannot read them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub api_versions_trimmed: u64,
    /// A datagram link's datagram counts (`None`: the link carries byte streams). On such a
    /// link the byte counters count datagram payloads (`bytes_swallowed_*`: those dropped),
    /// and the connection counters count flows (one per client address: opened, closed by a
    /// `refuse`, open now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams: Option<DatagramCounts>,
}

impl LinkStatus {
    /// A link from `listen` to `upstream` that carried nothing yet and holds no fault.
    pub fn idle(name: &str, listen: SocketAddr, upstream: SocketAddr) -> LinkStatus {
        LinkStatus {
            name: name.to_string(),
            listen,
            upstream,
            fault: "pass".to_string(),
            direction: None,
            latency_ms: None,
            jitter_ms: None,
            bytes_per_s: None,
            loss: None,
            stacked: Vec::new(),
            since_ms: 0,
            connections_accepted: 0,
            connections_reset: 0,
            connections_open: 0,
            bytes_upstream: 0,
            bytes_downstream: 0,
            bytes_swallowed_upstream: 0,
            bytes_swallowed_downstream: 0,
            bytes_spliced: 0,
            connections_stranded: 0,
            broker_links: Vec::new(),
            answers_rewritten: 0,
            api_versions_trimmed: 0,
            datagrams: None,
        }
    }
}

/// What a datagram link passed and dropped, per direction (`upstream`: client → server).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DatagramCounts {
    pub upstream: u64,
    pub downstream: u64,
    /// Read and not forwarded: dropped by `swallow`, `loss`, `blackhole`, queued at the
    /// instant of a `refuse`, beyond a `delay`'s queue, or held when a `refuse` ended the flow.
    /// (What the kernel refuses while the link refuses is never read: not counted.)
    pub dropped_upstream: u64,
    pub dropped_downstream: u64,
    /// Held by a `delay` now, both directions (neither forwarded nor dropped yet).
    pub held: u64,
}
