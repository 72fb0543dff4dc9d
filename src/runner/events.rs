//! The fault log as typed facts: what was hit ([`FaultTarget`]), how ([`FaultKind`]), from when
//! until when ([`FaultRecord`]).
//!
//! Every reader of the log — the oracle (did a fault bite, was the proxy bypassed, which copies
//! a fault excuses), the recovery measure, the chart, `report.md` and `report.json` — matches on
//! these enums. Their words (`link mqtt`, `swallow`, `kill (SIGKILL)`) are made here once, by
//! `Display`, for people and for `report.json`'s fields; no decision ever reads them back.

use std::fmt;

use serde::Serialize;

use crate::proxy::{Direction, Fault, FaultSpec};

/// What a fault acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultTarget {
    /// One proxy link, by name (`mqtt`, `nats-2`, `kafka-111`).
    Link(String),
    /// The proxy itself (every link at once): a restart.
    Proxy,
    /// One broker the drill started, by node name (`n1`), or `container` for the broker's
    /// container.
    Broker(String),
    /// The system under test's process.
    Engine,
    /// The engine's data directory's filesystem.
    EngineDisk,
    /// The engine's wall clock (a clock fault).
    EngineClock,
    /// A destination drill hosts, answering otherwise (`answer: 503`, `answer_after`).
    Destination,
    /// The file the engine tails.
    Source,
}

impl FaultTarget {
    /// A fault on the network path between the engine and its destination (a link or the
    /// proxy): the faults whose records a user's engine may have in flight.
    /// The link `source` in front of a Kafka source is not on that path.
    pub fn is_network(&self) -> bool {
        matches!(self, FaultTarget::Link(_) | FaultTarget::Proxy) && !self.is_source_link()
    }

    /// The link between the engine and a source drill starts (a Kafka topic, an outbox table:
    /// `link: source`): records still reach the destination while it is cut, from what the
    /// engine holds.
    pub fn is_source_link(&self) -> bool {
        matches!(self, FaultTarget::Link(name) if name == crate::scenario::source::SOURCE_LINK)
    }

    /// A fault on the destination's side (network or broker): a user's engine, whose attempts
    /// drill cannot see, may have sent a record twice across it.
    pub fn is_destination_side(&self) -> bool {
        self.is_network() || matches!(self, FaultTarget::Broker(_) | FaultTarget::Destination)
    }
}

impl fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultTarget::Link(name) => write!(f, "link {name}"),
            FaultTarget::Proxy => f.write_str("link proxy"),
            FaultTarget::Broker(name) => write!(f, "broker {name}"),
            FaultTarget::Engine => f.write_str("engine"),
            FaultTarget::EngineDisk => f.write_str("engine disk"),
            FaultTarget::EngineClock => f.write_str("engine clock"),
            FaultTarget::Destination => f.write_str("destination"),
            FaultTarget::Source => f.write_str("source"),
        }
    }
}

/// What a fault did.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// A link fault (`refuse`, `swallow`, `delay` …) in a direction.
    Link(FaultSpec),
    /// Every connection dropped and the port refused until the heal.
    ProxyRestart,
    /// SIGKILL.
    Kill,
    /// SIGTERM (SIGKILL after a grace).
    Stop,
    /// The engine frozen with SIGSTOP until SIGCONT.
    Pause,
    /// A broker's container frozen (`docker pause`) until resumed.
    Freeze,
    /// A broker crashed in its own way (PostgreSQL: immediate shutdown).
    Crash,
    /// SIGKILL, and every write not made durable thrown away — or, `torn`, landed but for the
    /// last write's final sector; at a crash point (`fdatasync #3 on *.log`) when it had one.
    PowerCut {
        cut: crate::powerfs::CutReport,
        /// `dirents:` of the cut: which directory changes it forgot.
        dirents: Option<crate::powerfs::Dirents>,
        crash_point: Option<String>,
    },
    /// The data directory's disk reports no space.
    DiskFull,
    /// The data directory's disk answers errors (`fsync on *.log fails with EIO`).
    DiskError(String),
    /// The data directory's disk answers late (`fsync on *.log answers 300 ms late`).
    DiskSlow(String),
    /// The engine's wall clock stepped by this many seconds.
    ClockJump(i64),
    /// The engine's wall clock gained `by_s` seconds over `over_s`, a step a second.
    ClockDrift { by_s: i64, over_s: u64 },
    /// The destination answered a status, or late, for the window.
    Answer(crate::dest::AnswerFault),
    /// drill rotated, cut, removed or stalled the source file.
    Source(crate::source::SourceAction),
}

impl FaultKind {
    /// The link fault, when this is one.
    pub fn link(&self) -> Option<&FaultSpec> {
        match self {
            FaultKind::Link(spec) => Some(spec),
            _ => None,
        }
    }

    /// The direction a link fault acts in (`None` for every other kind).
    pub fn direction(&self) -> Option<Direction> {
        self.link().map(|s| s.direction)
    }

    /// A link fault that keeps the engine's bytes from reaching the broker: `refuse` and
    /// `blackhole`, or `swallow` and `hang` when they act upstream. A record first delivered
    /// while one is in force went around the proxy. (`loss` lets some through.)
    pub fn stops_upstream(&self) -> bool {
        let Some(spec) = self.link() else {
            return false;
        };
        let upstream = matches!(spec.direction, Direction::Both | Direction::Upstream);
        matches!(spec.fault, Fault::Refuse | Fault::Blackhole)
            || (upstream && matches!(spec.fault, Fault::Swallow | Fault::Hang))
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Link(spec) => f.write_str(&spec.what()),
            FaultKind::ProxyRestart => f.write_str("restart"),
            FaultKind::Kill => f.write_str("kill (SIGKILL)"),
            FaultKind::Stop => f.write_str("stop (SIGTERM)"),
            FaultKind::Pause => f.write_str("pause (SIGSTOP)"),
            FaultKind::Freeze => f.write_str("pause"),
            FaultKind::Crash => f.write_str("crash"),
            FaultKind::PowerCut {
                cut,
                dirents,
                crash_point,
            } => {
                f.write_str("power cut")?;
                if let Some(point) = crash_point {
                    write!(f, " at {point}")?;
                }
                let (files, bytes) = (cut.files, cut.bytes);
                if cut.torn > 0 {
                    write!(
                        f,
                        " (SIGKILL; {} writes torn in {files} files: their last sector, {bytes} bytes, never landed",
                        cut.torn
                    )?;
                } else {
                    write!(
                        f,
                        " (SIGKILL; {} unsynced writes, {bytes} bytes in {files} files thrown away",
                        cut.writes
                    )?;
                }
                if let Some(model) = dirents {
                    write!(
                        f,
                        "; {} directory entries forgotten ({}: {})",
                        cut.entries,
                        model.name(),
                        match model {
                            crate::powerfs::Dirents::Posix =>
                                "kept only where the directory was fsynced",
                            crate::powerfs::Dirents::Ext4 => "kept where any fsync came after",
                        }
                    )?;
                }
                f.write_str(")")
            }
            FaultKind::DiskFull => f.write_str("disk full (data directory)"),
            FaultKind::DiskError(what) => write!(f, "I/O error: {what}"),
            FaultKind::DiskSlow(what) => write!(f, "slow: {what}"),
            FaultKind::ClockJump(by_s) => write!(f, "wall clock jumps {}", signed(*by_s)),
            FaultKind::ClockDrift { by_s, over_s } => {
                write!(f, "wall clock drifts {} over {over_s} s", signed(*by_s))
            }
            FaultKind::Answer(fault) => f.write_str(&fault.describe()),
            FaultKind::Source(action) => f.write_str(&action.describe()),
        }
    }
}

/// A fault as it was applied (times relative to the drill's start).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRecord {
    /// The scenario's fault it carries out (its place in `Plan::faults`).
    pub index: usize,
    pub at_ms: u64,
    pub target: FaultTarget,
    pub kind: FaultKind,
    /// The engine's data directory was emptied with it (`wipe_data`).
    pub wiped: bool,
    /// When it ended (healed, restarted, resumed); `None`: in force until the end.
    pub until_ms: Option<u64>,
    /// Whether the fault met the engine, when the runner saw it directly (a `strand` bites
    /// the connections open at its instant); `None`: judged from the records.
    pub bit: Option<bool>,
    /// Why the fault was not carried out at all (a broker fault that found no node, no
    /// leader): the drill proved nothing about it.
    pub no_target: Option<String>,
}

impl FaultRecord {
    /// What it did, as the report words it: `kill (SIGKILL), data directory emptied`.
    pub fn what(&self) -> String {
        if self.wiped {
            format!("{}, data directory emptied", self.kind)
        } else {
            self.kind.to_string()
        }
    }

    /// `link mqtt swallow both`: target, what, and direction where there is one.
    pub fn label(&self) -> String {
        match self.kind.direction() {
            Some(d) => format!("{} {} {}", self.target, self.what(), d.name()),
            None => format!("{} {}", self.target, self.what()),
        }
    }
}

/// `report.json`'s `faults[]` entry (docs/src/design.md#6-interfaces):
/// `{at_ms, target, fault, direction, until_ms}`, the words made by `Display`.
impl Serialize for FaultRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("FaultRecord", 5)?;
        out.serialize_field("at_ms", &self.at_ms)?;
        out.serialize_field("target", &self.target.to_string())?;
        out.serialize_field("fault", &self.what())?;
        out.serialize_field("direction", &self.kind.direction().map(Direction::name))?;
        out.serialize_field("until_ms", &self.until_ms)?;
        out.end()
    }
}

/// `+2h`, `-10m`, `+1h30m`, `-45s`: a signed number of seconds as a scenario writes it.
pub fn signed(by_s: i64) -> String {
    let s = by_s.unsigned_abs();
    let mut out = String::from(if by_s < 0 { "-" } else { "+" });
    for (n, unit) in [(s / 3600, "h"), (s / 60 % 60, "m"), (s % 60, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(fault: Fault, direction: Direction) -> FaultKind {
        FaultKind::Link(FaultSpec::new(fault, direction))
    }

    #[test]
    fn the_words_are_those_report_json_always_had() {
        let r = FaultRecord {
            index: 0,
            at_ms: 20_000,
            target: FaultTarget::Link("mqtt".into()),
            kind: link(Fault::Swallow, Direction::Both),
            wiped: false,
            until_ms: Some(40_000),
            bit: None,
            no_target: None,
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"at_ms": 20000, "target": "link mqtt", "fault": "swallow", "direction": "both", "until_ms": 40000})
        );
        assert_eq!(r.label(), "link mqtt swallow both");
        let kill = FaultRecord {
            target: FaultTarget::Engine,
            kind: FaultKind::Kill,
            wiped: true,
            until_ms: None,
            ..r
        };
        assert_eq!(
            serde_json::to_value(&kill).unwrap()["fault"],
            "kill (SIGKILL), data directory emptied"
        );
        assert_eq!(
            kill.label(),
            "engine kill (SIGKILL), data directory emptied"
        );
        assert_eq!(FaultTarget::Proxy.to_string(), "link proxy");
        assert_eq!(
            FaultTarget::Broker("container".into()).to_string(),
            "broker container"
        );
        assert_eq!(FaultKind::Freeze.to_string(), "pause");
        assert_eq!(
            FaultKind::ClockJump(7200).to_string(),
            "wall clock jumps +2h"
        );
        assert_eq!(signed(-600), "-10m");
        assert_eq!(signed(5430), "+1h30m30s");
    }

    #[test]
    fn what_stops_the_engines_bytes_on_the_way_up() {
        assert!(link(Fault::Refuse, Direction::Downstream).stops_upstream());
        assert!(link(Fault::Swallow, Direction::Both).stops_upstream());
        assert!(link(Fault::Hang, Direction::Upstream).stops_upstream());
        assert!(!link(Fault::Swallow, Direction::Downstream).stops_upstream());
        assert!(!link(Fault::Delay, Direction::Both).stops_upstream());
        assert!(link(Fault::Blackhole, Direction::Both).stops_upstream());
        assert!(!link(Fault::Loss, Direction::Upstream).stops_upstream());
        assert!(!FaultKind::ProxyRestart.stops_upstream());
        assert!(!FaultKind::Kill.stops_upstream());
    }
}
