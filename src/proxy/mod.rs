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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// A network fault (docs/src/design.md#3-fault-vocabulary). `Heal` returns the link to
/// pass-through.
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
    /// Toxiproxy's `slicer`: what passes in `direction` is cut into pieces of `slice_bytes` ±
    /// `slice_variation` bytes (seeded), each written on its own, `slice_delay` apart. Only
    /// reachable through the Toxiproxy-shaped API.
    #[serde(skip)]
    Slicer,
    /// Toxiproxy's `slow_close`: the end of a stream in `direction` is passed on `close_delay`
    /// late. Only reachable through the Toxiproxy-shaped API.
    #[serde(skip)]
    SlowClose,
    /// Instantaneous: every connection open at that instant goes silent for good in both
    /// directions (bytes read and dropped, no FIN, no RST, not even later), while new
    /// connections pass. A NAT or firewall entry lost. The link's condition is unchanged.
    Strand,
    /// Datagram links only: each datagram in `direction` is dropped with probability `loss`
    /// (seeded: the same datagrams in the same order lose the same ones).
    Loss,
    /// Datagram links only: every datagram, both ways, is dropped silently — exactly `swallow`
    /// in both directions, named for the route to nowhere it stands for (no ICMP, unlike
    /// `refuse`).
    Blackhole,
    /// TLS links: the broker seems to present a certificate from another CA (a rotation gone
    /// wrong). Connections open now are reset; each new one meets a TLS server at the link
    /// that presents an impostor's certificate, so the client's handshake fails; nothing
    /// reaches the broker. A handshake failure is no refusal of a write.
    BadCertificate,
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
            Fault::Slicer => "slicer",
            Fault::SlowClose => "slow_close",
            Fault::Strand => "strand",
            Fault::Loss => "loss",
            Fault::Blackhole => "blackhole",
            Fault::BadCertificate => "bad_certificate",
            Fault::Heal => "heal",
        }
    }

    /// Faults that act on whole connections (or a datagram link as a whole), not on one
    /// direction.
    pub fn whole_connection(self) -> bool {
        matches!(
            self,
            Fault::Refuse | Fault::Reset | Fault::Strand | Fault::Blackhole | Fault::BadCertificate
        )
    }

    /// Whether a link that carries byte streams (TCP) knows this fault. A stream has no
    /// datagrams to lose one by one: `loss` and `blackhole` are for datagram links.
    pub fn on_streams(self) -> bool {
        match self {
            Fault::Refuse
            | Fault::Reset
            | Fault::Swallow
            | Fault::Hang
            | Fault::Delay
            | Fault::Throttle
            | Fault::LimitData
            | Fault::Slicer
            | Fault::SlowClose
            | Fault::Strand
            | Fault::BadCertificate
            | Fault::Heal => true,
            Fault::Loss | Fault::Blackhole => false,
        }
    }

    /// Whether a link that carries datagrams (UDP) knows this fault
    /// (docs/src/design.md#3-fault-vocabulary). What needs a stream — a reset, a stalled reader, a
    /// byte rate, a byte count, a connection to strand — has no meaning there.
    pub fn on_datagrams(self) -> bool {
        match self {
            Fault::Refuse
            | Fault::Swallow
            | Fault::Delay
            | Fault::Loss
            | Fault::Blackhole
            | Fault::Heal => true,
            Fault::Reset
            | Fault::Hang
            | Fault::Throttle
            | Fault::LimitData
            | Fault::Slicer
            | Fault::SlowClose
            | Fault::BadCertificate
            | Fault::Strand => false,
        }
    }

    /// Faults that act once, at an instant, instead of holding until a heal.
    pub fn instantaneous(self) -> bool {
        matches!(self, Fault::Strand)
    }

    /// Conditions that shape what passes without cutting it: any number of them stack on one
    /// stream link (delays add up, the slowest rate and the smallest byte budget hold), beside
    /// at most one cut ([`Link::set_stack`]).
    pub fn shapes(self) -> bool {
        matches!(
            self,
            Fault::Delay | Fault::Throttle | Fault::LimitData | Fault::Slicer | Fault::SlowClose
        )
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
    /// Passed, shaped by every condition in force on this side.
    Shaped(Shape),
    /// Reset the connection (`refuse` and `reset` both cut existing connections).
    Cut,
}

/// The conditions in force on one side of a connection, folded into one: each chunk read is
/// due `latency ± jitter` late, chunks leave no faster than `bytes_per_s`, and the connection
/// is reset once `limit` bytes have passed. Zero means "no such condition".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Shape {
    pub(crate) latency: Duration,
    pub(crate) jitter: Duration,
    pub(crate) bytes_per_s: u64,
    pub(crate) limit: u64,
    /// `slicer`: pieces of `slice.0` ± `slice.1` bytes, `slice.2` apart (`slice.0` 0: none).
    pub(crate) slice: (u64, u64, Duration),
    /// `slow_close`: how late the end of the stream is passed on.
    pub(crate) close_delay: Duration,
}

impl Shape {
    /// Adds one condition: delays add up (as Toxiproxy's chained latency toxics do), the
    /// slowest rate and the smallest byte budget win.
    fn add(&mut self, spec: &FaultSpec) {
        let least = |a: u64, b: u64| if a == 0 { b } else { a.min(b) };
        match spec.fault {
            Fault::Delay => {
                self.latency += spec.latency;
                self.jitter += spec.jitter;
            }
            Fault::Throttle => self.bytes_per_s = least(self.bytes_per_s, spec.bytes_per_s),
            Fault::LimitData => self.limit = least(self.limit, spec.limit_bytes),
            Fault::Slicer if self.slice.0 == 0 || spec.slice_bytes < self.slice.0 => {
                self.slice = (spec.slice_bytes, spec.slice_variation, spec.slice_delay);
            }
            Fault::SlowClose => self.close_delay += spec.close_delay,
            _ => {}
        }
    }

    /// Whether chunks wait (a delay or a rate), rather than leave as they are read.
    pub(crate) fn holds(&self) -> bool {
        !self.latency.is_zero() || !self.jitter.is_zero() || self.bytes_per_s > 0 || self.slices()
    }

    pub(crate) fn slices(&self) -> bool {
        self.slice.0 > 0
    }
}

/// A fault with its parameters, as the control plane and scenarios give it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
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
    /// `loss`: the fraction of datagrams dropped, above 0 and at most 1.
    #[serde(skip_serializing_if = "is_nothing")]
    pub loss: f64,
    /// `slicer`: the average piece, its variation (bytes), and the time between pieces.
    #[serde(skip_serializing_if = "is_zero")]
    pub slice_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub slice_variation: u64,
    #[serde(skip_serializing_if = "Duration::is_zero", with = "millis")]
    pub slice_delay: Duration,
    /// `slow_close`: how late the end of the stream is passed on.
    #[serde(skip_serializing_if = "Duration::is_zero", with = "millis")]
    pub close_delay: Duration,
    /// Toxiproxy's `toxicity`, for a shaping condition: the chance that it holds on a given
    /// connection, drawn once per connection from the link's seed and `salt` (1: every
    /// connection). A cut always holds on every connection.
    #[serde(skip_serializing_if = "is_whole")]
    pub toxicity: f64,
    /// Tells apart the draws of two conditions on one link (a toxic's name, hashed).
    #[serde(skip)]
    pub salt: u64,
    /// `bad_certificate`: the certificate presented is the broker's own, from the drill's CA,
    /// but expired (`certificate: expired`), instead of one from a CA nobody trusts.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
}

fn is_whole(f: &f64) -> bool {
    *f == 1.0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_nothing(f: &f64) -> bool {
    *f == 0.0
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
            loss: 0.0,
            slice_bytes: 0,
            slice_variation: 0,
            slice_delay: Duration::ZERO,
            close_delay: Duration::ZERO,
            toxicity: 1.0,
            salt: 0,
            expired: false,
        }
    }

    /// Whether this condition holds on connection `serial` of a link seeded `seed`.
    fn holds_on(&self, seed: u64, serial: u64) -> bool {
        if self.toxicity >= 1.0 {
            return true;
        }
        let mix = seed ^ serial.wrapping_mul(0xA24B_AED4_963E_E407) ^ self.salt.rotate_left(29);
        let draw = crate::seed::Seeded::new(mix).next_u64();
        ((draw >> 11) as f64 / (1u64 << 53) as f64) < self.toxicity
    }

    /// Toxiproxy's `slicer`: pieces of `bytes` ± `variation`, `delay` apart, in `direction`.
    pub fn slicer(direction: Direction, bytes: u64, variation: u64, delay: Duration) -> FaultSpec {
        FaultSpec {
            slice_bytes: bytes,
            slice_variation: variation,
            slice_delay: delay,
            ..FaultSpec::new(Fault::Slicer, direction)
        }
    }

    /// Toxiproxy's `slow_close`: the end of the stream in `direction` passed on `delay` late.
    pub fn slow_close(direction: Direction, delay: Duration) -> FaultSpec {
        FaultSpec {
            close_delay: delay,
            ..FaultSpec::new(Fault::SlowClose, direction)
        }
    }

    /// `loss` of `fraction` (0 < fraction ≤ 1) of the datagrams in `direction`.
    pub fn loss(direction: Direction, fraction: f64) -> FaultSpec {
        FaultSpec {
            loss: fraction,
            ..FaultSpec::new(Fault::Loss, direction)
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

    /// The fault and its parameters in a few words, as the drill's output and reports say
    /// them: `swallow`, `delay 100ms±10ms`, `throttle 50000 B/s`, `loss 30%`.
    pub fn what(&self) -> String {
        match self.fault {
            Fault::Delay if self.jitter.is_zero() => {
                format!("delay {}ms", self.latency.as_millis())
            }
            Fault::Delay => format!(
                "delay {}ms±{}ms",
                self.latency.as_millis(),
                self.jitter.as_millis()
            ),
            Fault::Throttle => format!("throttle {} B/s", self.bytes_per_s),
            Fault::Loss => format!("loss {}%", self.loss * 100.0),
            Fault::LimitData => format!("limit_data {} bytes", self.limit_bytes),
            Fault::Slicer => format!(
                "slicer {}±{} bytes every {}µs",
                self.slice_bytes,
                self.slice_variation,
                self.slice_delay.as_micros()
            ),
            Fault::SlowClose => format!("slow_close {}ms", self.close_delay.as_millis()),
            f => f.name().to_string(),
        }
    }

    /// [`FaultSpec::what`] with its direction: `delay 80ms downstream`.
    pub fn describe(&self) -> String {
        format!("{} {}", self.what(), self.direction.name())
    }

    /// Checks the parameters a fault needs; the message says what to send instead.
    pub fn validate(&self) -> Result<(), String> {
        if self.fault.whole_connection() && self.direction != Direction::Both {
            return Err(format!(
                "`{}` acts on whole connections (both ways); leave `direction` out",
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
            Fault::Slicer if self.slice_bytes == 0 => {
                Err("`slicer` needs an average_size greater than zero".to_string())
            }
            Fault::Loss if !(self.loss > 0.0 && self.loss <= 1.0) => Err(format!(
                "`loss` needs a fraction above 0 and at most 1 (e.g. loss: 0.3), not {}",
                self.loss
            )),
            f if f != Fault::Loss && self.loss != 0.0 => Err(format!(
                "only `loss` takes a fraction; `{}` does not",
                f.name()
            )),
            _ if !(0.0..=1.0).contains(&self.toxicity) => Err(format!(
                "toxicity is a chance between 0 and 1, not {}",
                self.toxicity
            )),
            f if self.toxicity < 1.0 && !f.shapes() => Err(format!(
                "`{}` holds on every connection (toxicity 1): a cut with a chance would be a different fault on each connection",
                f.name()
            )),
            _ => Ok(()),
        }
    }
}

/// The link's condition, published to every task of the link.
#[derive(Debug, Clone)]
pub(crate) struct Condition {
    /// The one fault in force (a cut, or a single shaping condition as scenarios give it).
    pub(crate) active: Option<FaultSpec>,
    /// Shaping conditions stacked beside it ([`Fault::shapes`]; stream links only).
    pub(crate) stacked: Vec<FaultSpec>,
    pub(crate) since: Instant,
    pub(crate) epoch: u64,
    /// How many `strand`s the link has had: a connection opened when this was lower is
    /// stranded.
    pub(crate) strands: u64,
    /// The epoch the byte budgets (`limit_data`) in force began at: each connection counts
    /// its bytes from there, whatever else changed since.
    pub(crate) budget_epoch: u64,
    /// The link's seed: which connections a condition with a toxicity below 1 holds on.
    pub(crate) seed: u64,
}

impl Condition {
    /// What `side` of connection `serial` does now.
    pub(crate) fn flow(&self, side: Side, serial: u64) -> Flow {
        if let Some(spec) = self.active {
            if matches!(
                spec.fault,
                Fault::Refuse | Fault::Reset | Fault::BadCertificate
            ) {
                return Flow::Cut;
            }
            if spec.direction.covers(side) {
                match spec.fault {
                    Fault::Swallow => return Flow::Swallow,
                    Fault::Hang => return Flow::Hang,
                    _ => {}
                }
            }
        }
        // What is left shapes the flow: the active fault if it is a condition, and every
        // stacked one. (`strand` acts at its instant; `loss` and `blackhole` are refused on a
        // stream link before they are in force.)
        let mut shape = Shape::default();
        let conditions = self.active.iter().chain(&self.stacked);
        let holds = |s: &&FaultSpec| {
            s.fault.shapes() && s.direction.covers(side) && s.holds_on(self.seed, serial)
        };
        for spec in conditions.filter(holds) {
            shape.add(spec);
        }
        if shape == Shape::default() {
            Flow::Pass
        } else {
            Flow::Shaped(shape)
        }
    }

    pub(crate) fn swallows(&self) -> bool {
        self.active.is_some_and(|a| a.fault == Fault::Swallow)
    }

    pub(crate) fn refuses(&self) -> bool {
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

pub(crate) struct LinkShared {
    pub(crate) name: String,
    pub(crate) listen: SocketAddr,
    /// Where new connections go. Changeable: a broker container restarted on a new host port
    /// keeps its client-facing port (the link's) stable.
    pub(crate) upstream: std::sync::RwLock<SocketAddr>,
    pub(crate) condition: watch::Sender<Condition>,
    /// The last epoch the accept loop has acted on (refuse closes the listener, heal reopens it).
    settled: watch::Sender<u64>,
    /// Why the accept loop could not listen again after a heal, once it gave up.
    relisten_failed: std::sync::Mutex<Option<String>>,
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
    fn new(
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

    fn bind(
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
    fn family(&self) -> Option<&Arc<kafka::Family>> {
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

    fn publish(&self, spec: FaultSpec) -> u64 {
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

    async fn accept_loop(self, mut port: Port) {
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
struct Port {
    listen: SocketAddr,
    /// The listener, while the link accepts.
    accepting: Option<TcpListener>,
    /// The bound, not listening socket, while the link refuses.
    held: Option<socket2::Socket>,
}

impl Port {
    fn new(listener: std::net::TcpListener) -> std::io::Result<Port> {
        let listen = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        Ok(Port {
            listen,
            accepting: Some(TcpListener::from_std(listener)?),
            held: None,
        })
    }

    /// Listens (again, after a refusal) on the same port; a no-op while listening.
    async fn listen(&mut self, cancel: &CancellationToken) -> std::io::Result<()> {
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
    fn refuse(&mut self) {
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
    async fn rebind(
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
fn hold(listen: SocketAddr) -> std::io::Result<socket2::Socket> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toxicity_holds_on_its_share_of_connections_the_same_for_the_same_seed() {
        let mut spec = FaultSpec::delay(Direction::Both, Duration::from_millis(5), Duration::ZERO);
        spec.toxicity = 0.3;
        spec.salt = 42;
        let share =
            |spec: &FaultSpec, seed| (0..10_000).filter(|&n| spec.holds_on(seed, n)).count();
        for seed in [0, 7, 1 << 40] {
            let held = share(&spec, seed);
            assert!(
                (2_800..=3_200).contains(&held),
                "seed {seed}: {held} of 10000"
            );
            assert_eq!(held, share(&spec, seed));
        }
        spec.toxicity = 0.0;
        assert_eq!(share(&spec, 0), 0);
        spec.toxicity = 1.0;
        assert_eq!(share(&spec, 0), 10_000);
    }
}
