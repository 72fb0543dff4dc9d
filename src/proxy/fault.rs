//! The fault vocabulary (docs/src/design.md#3-fault-vocabulary): what a fault is ([`Fault`],
//! [`Direction`], [`FaultSpec`] with its parameters), and what a link's condition makes of one
//! side of one connection ([`Condition::flow`]: pass, swallow, hang, cut, or shaped by every
//! condition in force). Pure: nothing here touches a socket.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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

    pub(super) fn covers(self, side: Side) -> bool {
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
    pub(super) fn add(&mut self, spec: &FaultSpec) {
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

pub(super) fn is_whole(f: &f64) -> bool {
    *f == 1.0
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub(super) fn is_nothing(f: &f64) -> bool {
    *f == 0.0
}

pub(super) mod millis {
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
    pub(super) fn holds_on(&self, seed: u64, serial: u64) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A link's condition with `active` in force and `stacked` beside it.
    fn condition(active: Option<FaultSpec>, stacked: Vec<FaultSpec>) -> Condition {
        Condition {
            active,
            stacked,
            since: Instant::now(),
            epoch: 1,
            strands: 0,
            budget_epoch: 0,
            seed: 0,
        }
    }

    /// What each side of a connection does with `spec` alone in force.
    fn flows(spec: FaultSpec) -> (Flow, Flow) {
        let c = condition(Some(spec), Vec::new());
        (c.flow(Side::Up, 0), c.flow(Side::Down, 0))
    }

    fn shaped(flow: Flow) -> Shape {
        match flow {
            Flow::Shaped(shape) => shape,
            other => panic!("not shaped: {other:?}"),
        }
    }

    #[test]
    fn refuse_cuts_both_ways_and_is_what_the_listener_follows() {
        let spec = FaultSpec::new(Fault::Refuse, Direction::Both);
        assert_eq!(flows(spec), (Flow::Cut, Flow::Cut));
        assert!(condition(Some(spec), Vec::new()).refuses());
        assert!(Fault::Refuse.on_streams() && Fault::Refuse.on_datagrams());
    }

    #[test]
    fn reset_cuts_both_ways_and_takes_no_direction() {
        let spec = FaultSpec::new(Fault::Reset, Direction::Both);
        assert_eq!(flows(spec), (Flow::Cut, Flow::Cut));
        assert!(!condition(Some(spec), Vec::new()).refuses());
        let one_way = FaultSpec::new(Fault::Reset, Direction::Upstream);
        assert!(
            one_way
                .validate()
                .unwrap_err()
                .contains("leave `direction` out")
        );
        assert!(!Fault::Reset.on_datagrams());
    }

    #[test]
    fn swallow_drops_only_its_direction_and_the_link_knows_it_swallows() {
        let spec = FaultSpec::new(Fault::Swallow, Direction::Downstream);
        assert_eq!(flows(spec), (Flow::Pass, Flow::Swallow));
        assert!(condition(Some(spec), Vec::new()).swallows());
        let both = FaultSpec::new(Fault::Swallow, Direction::Both);
        assert_eq!(flows(both), (Flow::Swallow, Flow::Swallow));
    }

    #[test]
    fn hang_holds_only_its_direction() {
        let spec = FaultSpec::new(Fault::Hang, Direction::Upstream);
        assert_eq!(flows(spec), (Flow::Hang, Flow::Pass));
        assert!(!condition(Some(spec), Vec::new()).swallows());
        assert!(!Fault::Hang.on_datagrams());
    }

    #[test]
    fn delay_shapes_its_direction_and_stacked_delays_add_up() {
        let ms = Duration::from_millis;
        let spec = FaultSpec::delay(Direction::Downstream, ms(100), ms(10));
        let (up, down) = flows(spec);
        assert_eq!(up, Flow::Pass);
        let shape = shaped(down);
        assert_eq!((shape.latency, shape.jitter), (ms(100), ms(10)));
        assert!(shape.holds());
        let more = FaultSpec::delay(Direction::Both, ms(50), Duration::ZERO);
        let c = condition(Some(spec), vec![more]);
        assert_eq!(shaped(c.flow(Side::Down, 0)).latency, ms(150));
        assert_eq!(shaped(c.flow(Side::Up, 0)).latency, ms(50));
        assert_eq!(spec.what(), "delay 100ms±10ms");
        let none = FaultSpec::delay(Direction::Both, Duration::ZERO, Duration::ZERO);
        assert!(none.validate().is_err());
    }

    #[test]
    fn throttle_caps_its_direction_and_the_slowest_rate_wins() {
        let spec = FaultSpec::throttle(Direction::Upstream, 50_000);
        let (up, down) = flows(spec);
        assert_eq!((shaped(up).bytes_per_s, down), (50_000, Flow::Pass));
        let slower = FaultSpec::throttle(Direction::Upstream, 10_000);
        let c = condition(Some(spec), vec![slower]);
        assert_eq!(shaped(c.flow(Side::Up, 0)).bytes_per_s, 10_000);
        assert!(FaultSpec::throttle(Direction::Both, 0).validate().is_err());
    }

    #[test]
    fn limit_data_gives_each_connection_a_byte_budget_and_the_smallest_wins() {
        let spec = FaultSpec::limit(Direction::Both, 1000);
        let c = condition(Some(spec), vec![FaultSpec::limit(Direction::Upstream, 10)]);
        assert_eq!(shaped(c.flow(Side::Up, 0)).limit, 10);
        assert_eq!(shaped(c.flow(Side::Down, 0)).limit, 1000);
        // A budget alone holds nothing back: chunks leave as they come until it is spent.
        assert!(!shaped(c.flow(Side::Down, 0)).holds());
    }

    #[test]
    fn slicer_cuts_what_passes_into_pieces_and_needs_a_size() {
        let spec = FaultSpec::slicer(Direction::Downstream, 64, 8, Duration::from_micros(10));
        let (up, down) = flows(spec);
        assert_eq!(up, Flow::Pass);
        let shape = shaped(down);
        assert!(shape.slices() && shape.holds());
        assert_eq!(shape.slice, (64, 8, Duration::from_micros(10)));
        let empty = FaultSpec::slicer(Direction::Both, 0, 0, Duration::ZERO);
        assert!(empty.validate().is_err());
    }

    #[test]
    fn slow_close_delays_the_end_of_the_stream_only() {
        let spec = FaultSpec::slow_close(Direction::Upstream, Duration::from_millis(300));
        let (up, down) = flows(spec);
        assert_eq!(shaped(up).close_delay, Duration::from_millis(300));
        assert!(!shaped(up).holds(), "the bytes themselves pass at once");
        assert_eq!(down, Flow::Pass);
    }

    #[test]
    fn strand_acts_at_its_instant_and_leaves_the_condition_passing() {
        assert!(Fault::Strand.instantaneous());
        assert!(Fault::Strand.whole_connection());
        // What a strand does is done to the connections open at its instant (their `born`
        // below the link's `strands`), not through the condition: new ones pass.
        let spec = FaultSpec::new(Fault::Strand, Direction::Both);
        assert_eq!(flows(spec), (Flow::Pass, Flow::Pass));
        assert!(!Fault::Strand.on_datagrams());
    }

    #[test]
    fn loss_and_blackhole_are_for_datagram_links_and_loss_needs_a_fraction() {
        for f in [Fault::Loss, Fault::Blackhole] {
            assert!(f.on_datagrams() && !f.on_streams(), "{f:?}");
        }
        assert!(FaultSpec::loss(Direction::Upstream, 0.3).validate().is_ok());
        for bad in [0.0, 1.5, -0.1] {
            let e = FaultSpec::loss(Direction::Upstream, bad)
                .validate()
                .unwrap_err();
            assert!(e.contains("fraction above 0 and at most 1"), "{bad}: {e}");
        }
        let mut swallow = FaultSpec::new(Fault::Swallow, Direction::Both);
        swallow.loss = 0.5;
        assert!(
            swallow
                .validate()
                .unwrap_err()
                .contains("only `loss` takes a fraction")
        );
        assert_eq!(FaultSpec::loss(Direction::Both, 0.3).what(), "loss 30%");
    }

    #[test]
    fn bad_certificate_cuts_every_connection_as_a_whole() {
        let spec = FaultSpec::new(Fault::BadCertificate, Direction::Both);
        assert_eq!(flows(spec), (Flow::Cut, Flow::Cut));
        assert!(Fault::BadCertificate.whole_connection());
        assert!(!Fault::BadCertificate.on_datagrams());
    }

    #[test]
    fn heal_is_pass_through_and_a_cut_takes_no_chance() {
        assert_eq!(
            condition(None, Vec::new()).flow(Side::Up, 0),
            Flow::Pass,
            "nothing in force"
        );
        assert!(!Fault::Heal.shapes() && Fault::Heal.on_streams() && Fault::Heal.on_datagrams());
        let mut hang = FaultSpec::new(Fault::Hang, Direction::Both);
        hang.toxicity = 0.5;
        assert!(
            hang.validate()
                .unwrap_err()
                .contains("holds on every connection")
        );
    }

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
