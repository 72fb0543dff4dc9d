//! Scenario files: YAML in, a validated [`Plan`] out.
//!
//! This module owns the scenario language (DESIGN.md §4). Parsing is two steps, as in ripgrep:
//! raw YAML is deserialized with `serde-saphyr` into `Raw*` types that reject unknown fields, and
//! then validated into a [`Plan`] whose values can be trusted. Every error names the file, line,
//! column and field, and says what to write instead. Nothing is started on an invalid plan: the
//! runner only ever sees a `Plan`.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_saphyr::Spanned;

use crate::proxy::{Direction, Fault, FaultSpec};

pub mod command;
pub use command::{CommandSpec, IngestSpec, Ready, StatsSpec, WriteKeyPlace};

/// Why a scenario could not be turned into a plan. Both variants mean "invalid input" (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{path}: cannot read the scenario: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: String,
        line: u32,
        column: u32,
        message: String,
    },
}

/// A duration written with a unit: `500ms`, `20s`, `5m`, `1h`, or a sum such as `2m30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn parse(text: &str) -> Result<Dur, String> {
        let hint = "write a number with a unit, e.g. 500ms, 20s, 5m or 1h";
        let s = text.trim();
        if s.is_empty() {
            return Err(format!("empty duration: {hint}"));
        }
        if s.starts_with('-') {
            return Err(format!("negative duration `{s}`: {hint}"));
        }
        let mut total = Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| format!("duration `{s}` has no unit: {hint}"))?;
            if digits == 0 {
                return Err(format!("invalid duration `{s}`: {hint}"));
            }
            let number: f64 = rest[..digits]
                .parse()
                .map_err(|_| format!("invalid number in duration `{s}`: {hint}"))?;
            let after = &rest[digits..];
            let unit_len = after
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(after.len());
            let seconds = match &after[..unit_len] {
                "ms" => number / 1000.0,
                "s" => number,
                "m" => number * 60.0,
                "h" => number * 3600.0,
                other => return Err(format!("unknown unit `{other}` in duration `{s}`: {hint}")),
            };
            total += Duration::from_secs_f64(seconds);
            rest = &after[unit_len..];
        }
        Ok(Dur(total))
    }
}

impl schemars::JsonSchema for Dur {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$",
            "description": "A duration with a unit: 500ms, 20s, 5m, 1h, or a sum such as 2m30s."
        })
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(60_000) && ms > 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Dur::parse(&text).map_err(de::Error::custom)
    }
}

/// Records per second, written `100/s`, `6000/m` or a bare number (per second). Must be > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub f64);

impl Rate {
    pub fn parse(text: &str) -> Result<Rate, String> {
        let hint = "write a positive rate such as 100/s or 6000/m";
        let s = text.trim();
        let (number, per) = match s.split_once('/') {
            Some((n, unit)) => (n.trim(), unit.trim()),
            None => (s, "s"),
        };
        let n: f64 = number
            .parse()
            .map_err(|_| format!("invalid rate `{s}`: {hint}"))?;
        let per_second = match per {
            "s" => n,
            "m" => n / 60.0,
            "h" => n / 3600.0,
            other => return Err(format!("unknown rate unit `/{other}` in `{s}`: {hint}")),
        };
        if !per_second.is_finite() || per_second <= 0.0 {
            return Err(format!("rate `{s}` must be greater than zero: {hint}"));
        }
        Ok(Rate(per_second))
    }
}

impl schemars::JsonSchema for Rate {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Rate".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [
                { "type": "string", "pattern": "^ *[0-9]+(\\.[0-9]+)? *(/ *(s|m|h))? *$" },
                { "type": "number", "exclusiveMinimum": 0 }
            ],
            "description": "Records per unit of time, e.g. 200/s or 600/m (a bare number is per second)."
        })
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            Number(f64),
            Text(String),
        }
        let text = match Text::deserialize(deserializer)? {
            Text::Number(n) => n.to_string(),
            Text::Text(s) => s,
        };
        Rate::parse(&text).map_err(de::Error::custom)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DestinationKind {
    Mqtt,
    Kafka,
    Nats,
}

impl DestinationKind {
    pub fn name(self) -> &'static str {
        match self {
            DestinationKind::Mqtt => "mqtt",
            DestinationKind::Kafka => "kafka",
            DestinationKind::Nats => "nats",
        }
    }
}

/// Where a broker runs (DESIGN.md §2). `auto` picks the best one available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeChoice {
    Auto,
    Container,
    Process,
    Embedded,
}

/// The order an output keeps (DESIGN.md §1.9).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    #[default]
    InOrder,
    Any,
}

/// What an output promises (DESIGN.md §1.7).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Promise {
    AtMostOnce,
    #[default]
    AtLeastOnce,
    EffectivelyOnce,
}

impl Promise {
    pub fn name(self) -> &'static str {
        match self {
            Promise::AtMostOnce => "at_most_once",
            Promise::AtLeastOnce => "at_least_once",
            Promise::EffectivelyOnce => "effectively_once",
        }
    }

    /// How much the promise claims: at_most_once < at_least_once < effectively_once.
    pub fn rank(self) -> u8 {
        match self {
            Promise::AtMostOnce => 0,
            Promise::AtLeastOnce => 1,
            Promise::EffectivelyOnce => 2,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[schemars(with = "String")]
    name: Spanned<String>,
    #[serde(default)]
    about: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    destination: RawDestination,
    #[serde(default)]
    system: Option<RawSystem>,
    workload: RawWorkload,
    #[serde(default)]
    #[schemars(with = "Vec<RawFault>")]
    faults: Vec<Spanned<RawFault>>,
    #[serde(default)]
    expect: Option<RawExpect>,
    #[serde(default)]
    drain_timeout: Option<Dur>,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawDestination {
    #[schemars(with = "DestinationKind")]
    kind: Spanned<DestinationKind>,
    #[serde(default)]
    runtime: Option<RuntimeChoice>,
    #[serde(default)]
    topic: Option<String>,
    /// NATS only: the stream's duplicate window (default: the longest outage plus the longest
    /// backoff, at least 2 min).
    #[serde(default)]
    #[schemars(with = "Option<Dur>")]
    duplicate_window: Option<Spanned<Dur>>,
    /// NATS only: a cluster of this many nodes (routes between them, one proxy link each,
    /// named `nats-1` …). Default 1.
    #[serde(default)]
    #[schemars(with = "Option<usize>")]
    nodes: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawSystem {
    #[serde(default)]
    #[schemars(with = "Option<RawBuiltin>")]
    builtin: Option<Spanned<RawBuiltin>>,
    /// A user's engine: its argv (see [`command`]).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    command: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    env: std::collections::BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    files: std::collections::BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawIngest>")]
    ingest: Option<Spanned<command::RawIngest>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawReady>")]
    ready: Option<Spanned<command::RawReady>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawStats>")]
    stats: Option<Spanned<command::RawStats>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawWriteKey>")]
    write_key: Option<Spanned<command::RawWriteKey>>,
    #[serde(default)]
    stop_grace: Option<Dur>,
    /// What a command engine declares (the built-in engine's is under `builtin`).
    #[serde(default)]
    #[schemars(with = "Option<Promise>")]
    promise: Option<Spanned<Promise>>,
}

#[derive(Debug, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawBuiltin {
    #[serde(default)]
    order: Option<Order>,
    #[serde(default)]
    promise: Option<Promise>,
    #[serde(default)]
    keepalive: Option<Dur>,
    #[serde(default)]
    answer_timeout: Option<Dur>,
    #[serde(default)]
    window: Option<usize>,
    #[serde(default)]
    refusals: Option<RawRefusals>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRefusals {
    max: u32,
    /// `[first, cap]`, e.g. `[1s, 60s]`.
    backoff: [Dur; 2],
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    rate: Rate,
    duration: Dur,
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    keys: Option<Spanned<u32>>,
    #[serde(default)]
    payload_bytes: Option<usize>,
    /// Record indices (0-based, in generation order) the destination will refuse: their
    /// payload is made larger than the broker's message size limit.
    #[serde(default)]
    poison: Vec<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawFault {
    at: Dur,
    #[serde(default)]
    link: Option<String>,
    #[serde(default)]
    fault: Option<Fault>,
    #[serde(default)]
    direction: Option<Direction>,
    #[serde(default, rename = "for")]
    for_: Option<Dur>,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    action: Option<ProcessAction>,
    #[serde(default)]
    restart_after: Option<Dur>,
    #[serde(default)]
    wipe_data: Option<bool>,
    #[serde(default)]
    latency: Option<Dur>,
    #[serde(default)]
    jitter: Option<Dur>,
    #[serde(default)]
    bytes_per_s: Option<u64>,
    #[serde(default)]
    repeat: Option<u32>,
    #[serde(default)]
    every: Option<Dur>,
    #[serde(default)]
    down_for: Option<Dur>,
    /// `target: broker`: which node — `leader` (where the stream's leader is at that instant)
    /// or a node number from 1.
    #[serde(default)]
    node: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    #[serde(default)]
    lost: Option<u64>,
    #[serde(default)]
    duplicates: Option<u64>,
    #[serde(default)]
    reordered: Option<u64>,
    #[serde(default)]
    ledger: Option<LedgerExpectation>,
    #[serde(default)]
    recovery_within: Option<Dur>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LedgerExpectation {
    Closes,
}

/// A process fault (DESIGN.md §3): `kill` and `stop` for the engine, `restart` for the proxy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ProcessAction {
    /// SIGKILL, then (with `restart_after`) start again on the same data directory.
    Kill,
    /// SIGTERM, then (with `restart_after`) start again.
    Stop,
    /// The proxy: every connection dropped, the port refused for `down_for`, then listening
    /// again on the same port.
    Restart,
    /// A broker in a container: frozen (SIGSTOP-like, `docker pause`), then resumed after
    /// `restart_after`.
    Pause,
}

/// A validated drill: everything the runner needs, nothing it has to check again.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub about: Option<String>,
    pub source: PathBuf,
    pub seed: u64,
    pub destination: Destination,
    /// The built-in engine's settings, and the promise the system under test declares
    /// (`engine.promise`, whichever engine runs).
    pub engine: EngineSpec,
    /// A user's engine, when the scenario gives `system.command`; else the built-in one runs.
    pub command: Option<CommandSpec>,
    pub workload: WorkloadSpec,
    pub faults: Vec<ScheduledFault>,
    pub expect: Expectations,
    pub drain_timeout: Duration,
    pub tags: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Destination {
    pub kind: DestinationKind,
    /// Broker nodes (a NATS cluster when more than 1).
    pub nodes: usize,
    pub runtime: RuntimeChoice,
    /// The MQTT topic, or the NATS subject.
    pub topic: String,
    /// NATS: the stream's duplicate window (always set for `nats` once validated).
    pub duplicate_window: Option<Duration>,
}

impl Destination {
    /// The proxy link in front of this destination's broker is named after its kind.
    pub fn link_name(&self) -> &'static str {
        self.kind.name()
    }

    /// One link per broker node: `nats` for one node, `nats-1`, `nats-2` … for a cluster.
    pub fn link_names(&self) -> Vec<String> {
        if self.nodes <= 1 {
            vec![self.link_name().to_string()]
        } else {
            (1..=self.nodes)
                .map(|n| format!("{}-{n}", self.link_name()))
                .collect()
        }
    }
}

/// Which broker node a process fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerNode {
    /// The node the stream's leader is on at that instant.
    Leader,
    /// Node `n` (from 1).
    Number(usize),
}

/// Settings of the built-in engine under test.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    pub order: Order,
    pub promise: Promise,
    pub keepalive: Duration,
    pub answer_timeout: Duration,
    pub window: usize,
    /// (max counted refusals, first backoff, backoff cap).
    pub refusals: (u32, Duration, Duration),
}

#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub rate_per_s: f64,
    pub duration: Duration,
    pub keys: u32,
    pub payload_bytes: usize,
    /// Indices of records the destination will refuse.
    pub poison: Vec<u64>,
}

impl WorkloadSpec {
    /// The broker's message size limit when a drill has poison records: well above every
    /// ordinary record, well below a poison one.
    pub fn message_limit(&self) -> usize {
        (self.payload_bytes * 4).max(16 * 1024)
    }

    /// How large a poison record's payload is made.
    pub fn poison_bytes(&self) -> usize {
        self.message_limit() + 4096
    }
}

impl WorkloadSpec {
    /// How many records a complete run generates.
    pub fn total_records(&self) -> u64 {
        (self.rate_per_s * self.duration.as_secs_f64()).round() as u64
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledFault {
    pub at: Duration,
    pub what: FaultAction,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    Link {
        link: String,
        spec: FaultSpec,
        /// `for:` — the link heals by itself this long after `at`.
        lasts: Option<Duration>,
    },
    ProxyRestart {
        down_for: Duration,
    },
    Heal {
        link: String,
    },
    Engine {
        action: ProcessAction,
        restart_after: Option<Duration>,
        wipe_data: bool,
    },
    Broker {
        node: BrokerNode,
        action: ProcessAction,
        restart_after: Option<Duration>,
    },
}

/// The longest stretch any one fault keeps the destination out of reach: a link fault until it
/// heals (by `for`, by a later `heal`, or at the end of the drill), a proxy restart's
/// `down_for`, an engine's `restart_after`.
pub fn longest_outage(faults: &[ScheduledFault], drill_ends: Duration) -> Duration {
    faults
        .iter()
        .map(|f| match &f.what {
            FaultAction::Link { lasts: Some(d), .. } => *d,
            FaultAction::Link {
                link, lasts: None, ..
            } => {
                let heal = faults.iter().find(|h| {
                    h.at > f.at && matches!(&h.what, FaultAction::Heal { link: l } if l == link)
                });
                heal.map_or(drill_ends, |h| h.at).saturating_sub(f.at)
            }
            FaultAction::ProxyRestart { down_for } => *down_for,
            FaultAction::Engine { restart_after, .. }
            | FaultAction::Broker { restart_after, .. } => restart_after.unwrap_or_default(),
            FaultAction::Heal { .. } => Duration::ZERO,
        })
        .max()
        .unwrap_or_default()
}

#[derive(Debug, Clone, Default)]
pub struct Expectations {
    pub lost: Option<u64>,
    pub duplicates: Option<u64>,
    pub reordered: Option<u64>,
    pub ledger_closes: bool,
    pub recovery_within: Option<Duration>,
}

/// The JSON Schema of the scenario file, generated from the same types the parser reads.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(RawScenario);
    let mut v = serde_json::to_value(&schema).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("title".to_string(), "drill scenario".into());
    }
    v
}

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Plan, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(path, &text)
}

/// Validates scenario text; `path` is only used to name the file in errors.
pub fn parse(path: &Path, text: &str) -> Result<Plan, ScenarioError> {
    let shown = path.display().to_string();
    // serde_path_to_error names the field (`workload.duration`) a bad value sits in;
    // serde-saphyr's own error keeps the line and column.
    let mut field = String::new();
    let raw: RawScenario = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize::<_, RawScenario>(de).map_err(|e| {
            field = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line() as u32, l.column() as u32))
            .unwrap_or((0, 0));
        let message = plain_message(&e);
        let message = if field.is_empty() || field == "." || message.contains("unknown field") {
            message
        } else {
            format!("field `{field}`: {message}")
        };
        ScenarioError::Invalid {
            path: shown.clone(),
            line,
            column,
            message,
        }
    })?;
    validate(&shown, raw, path)
}

/// serde-saphyr renders a snippet around the error; drill prints `file:line:col: message`, so
/// keep only the message, and name the field when serde named it.
fn plain_message(e: &serde_saphyr::Error) -> String {
    let full = e.to_string();
    let first = full.lines().next().unwrap_or("invalid scenario").trim();
    let message = first
        .strip_prefix("error: ")
        .unwrap_or(first)
        .trim()
        .to_string();
    // Drop a "line X column Y: " prefix or " at line X column Y" suffix: drill prints
    // `file:line:column:` itself.
    let message = match message.strip_prefix("line ") {
        Some(rest) => match rest.split_once(": ") {
            Some((pos, msg)) if pos.contains("column") => msg.to_string(),
            _ => message.clone(),
        },
        None => message,
    };
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message,
    }
}

fn invalid(path: &str, loc: &serde_saphyr::Location, message: String) -> ScenarioError {
    ScenarioError::Invalid {
        path: path.to_string(),
        line: loc.line() as u32,
        column: loc.column() as u32,
        message,
    }
}

/// `system:`: the built-in engine's settings (with its promise folded in), or a command
/// engine (with the promise it declares, carried in `RawBuiltin::promise`).
fn system(
    shown: &str,
    raw: Option<RawSystem>,
    destination: &Destination,
    source: &Path,
    name: &Spanned<String>,
) -> Result<(RawBuiltin, Option<CommandSpec>), ScenarioError> {
    let Some(raw) = raw else {
        return Ok((RawBuiltin::default(), None));
    };
    let Some(argv) = raw.command else {
        let loose = [
            ("env", !raw.env.is_empty()),
            ("files", !raw.files.is_empty()),
            ("ingest", raw.ingest.is_some()),
            ("ready", raw.ready.is_some()),
            ("stats", raw.stats.is_some()),
            ("write_key", raw.write_key.is_some()),
            ("stop_grace", raw.stop_grace.is_some()),
            ("promise", raw.promise.is_some()),
        ];
        if let Some((field, _)) = loose.iter().find(|(_, set)| *set) {
            return Err(invalid(
                shown,
                &name.referenced,
                format!(
                    "field `system.{field}`: goes with `system.command` (a user's engine); the built-in engine takes its settings under `system.builtin`"
                ),
            ));
        }
        return Ok((raw.builtin.map(|b| b.value).unwrap_or_default(), None));
    };
    let anchor = argv
        .first()
        .map(|a| a.referenced)
        .unwrap_or(name.referenced);
    if let Some(b) = &raw.builtin {
        return Err(invalid(
            shown,
            &b.referenced,
            "field `system.builtin`: a system is either `builtin` or `command`, not both"
                .to_string(),
        ));
    }
    let promise = raw.promise.map(|p| p.value);
    let spec = command::validate(
        command::RawCommand {
            command: argv,
            env: raw.env,
            files: raw.files,
            ingest: raw.ingest,
            ready: raw.ready,
            stats: raw.stats,
            write_key: raw.write_key,
            stop_grace: raw.stop_grace,
        },
        &destination.link_names(),
        &command::scenario_dir(source),
        &anchor,
    )
    .map_err(|e| invalid(shown, &e.at, e.message))?;
    let builtin = RawBuiltin {
        promise: Some(promise.unwrap_or(Promise::AtLeastOnce)),
        ..RawBuiltin::default()
    };
    Ok((builtin, Some(spec)))
}

fn validate(shown: &str, raw: RawScenario, source: &Path) -> Result<Plan, ScenarioError> {
    let name = raw.name.value.trim().to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(invalid(
            shown,
            &raw.name.referenced,
            format!(
                "field `name`: `{name}` is not a usable name; use letters, digits, `-`, `_` or `.` (it names the report folder)"
            ),
        ));
    }
    let kind = raw.destination.kind.value;
    if let Some(w) = &raw.destination.duplicate_window
        && kind != DestinationKind::Nats
    {
        return Err(invalid(
            shown,
            &w.referenced,
            "field `destination.duplicate_window`: only a `nats` destination has one".to_string(),
        ));
    }
    let runtime = raw.destination.runtime.unwrap_or(RuntimeChoice::Auto);
    if kind != DestinationKind::Mqtt && runtime == RuntimeChoice::Embedded {
        return Err(invalid(
            shown,
            &raw.destination.kind.referenced,
            format!(
                "field `destination.runtime`: there is no embedded {} broker; use `process` or `auto`",
                kind.name()
            ),
        ));
    }
    let nodes = match &raw.destination.nodes {
        None => 1,
        Some(n) if kind != DestinationKind::Nats || n.value == 0 || n.value > 5 => {
            return Err(invalid(
                shown,
                &n.referenced,
                "field `destination.nodes`: a NATS cluster of 1 to 5 nodes (only `nats` has nodes)"
                    .to_string(),
            ));
        }
        Some(n) => n.value,
    };
    let mut destination = Destination {
        kind,
        nodes,
        runtime,
        topic: raw.destination.topic.unwrap_or_else(|| "drill".to_string()),
        duplicate_window: raw.destination.duplicate_window.as_ref().map(|w| w.value.0),
    };
    let (builtin, command) = system(shown, raw.system, &destination, source, &raw.name)?;
    let engine = EngineSpec {
        order: builtin.order.unwrap_or_default(),
        promise: builtin.promise.unwrap_or(match kind {
            DestinationKind::Nats => Promise::EffectivelyOnce,
            _ => Promise::AtLeastOnce,
        }),
        keepalive: builtin
            .keepalive
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(2)),
        answer_timeout: builtin
            .answer_timeout
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(3)),
        window: builtin.window.unwrap_or(64).max(1),
        refusals: builtin
            .refusals
            .map(|r| {
                (
                    r.max.max(1),
                    r.backoff[0].0,
                    r.backoff[1].0.max(r.backoff[0].0),
                )
            })
            .unwrap_or((10, Duration::from_secs(1), Duration::from_secs(60))),
    };
    let keys = match raw.workload.keys {
        Some(k) if k.value == 0 => {
            return Err(invalid(
                shown,
                &k.referenced,
                "field `workload.keys`: must be at least 1".to_string(),
            ));
        }
        Some(k) => k.value,
        None => 4,
    };
    let workload = WorkloadSpec {
        rate_per_s: raw.workload.rate.0,
        duration: raw.workload.duration.0,
        keys,
        payload_bytes: raw.workload.payload_bytes.unwrap_or(120),
        poison: raw.workload.poison.clone(),
    };
    if let Some(&p) = workload
        .poison
        .iter()
        .find(|&&p| p >= workload.total_records())
    {
        return Err(invalid(
            shown,
            &raw.name.referenced,
            format!(
                "field `workload.poison`: record {p} is past the last of {} records (indices start at 0)",
                workload.total_records()
            ),
        ));
    }
    if kind == DestinationKind::Kafka && !workload.poison.is_empty() {
        return Err(invalid(
            shown,
            &raw.name.referenced,
            "field `workload.poison`: poison records need a destination that refuses one oversized write (`mqtt` or `nats`); remove it for `kafka`".to_string(),
        ));
    }
    let link_names = destination.link_names();
    let links: BTreeSet<&str> = link_names.iter().map(String::as_str).collect();
    let mut faults = Vec::new();
    for (i, spanned) in raw.faults.iter().enumerate() {
        let f = &spanned.value;
        let loc = &spanned.referenced;
        let field = |name: &str| format!("field `faults[{i}].{name}`");
        match (&f.link, &f.target) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    shown,
                    loc,
                    format!(
                        "faults[{i}]: give either `link` (a network fault) or `target` (a process fault), not both"
                    ),
                ));
            }
            (None, None) => {
                return Err(invalid(
                    shown,
                    loc,
                    format!(
                        "faults[{i}]: missing `link` (e.g. link: {}) or `target` (e.g. target: engine)",
                        destination.link_name()
                    ),
                ));
            }
            (Some(link), None) => {
                if !links.contains(link.as_str()) {
                    return Err(invalid(
                        shown,
                        loc,
                        format!(
                            "{}: no link named `{link}`; this scenario has: {}",
                            field("link"),
                            links.iter().copied().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                for (set, name) in [
                    (f.action.is_some(), "action"),
                    (f.restart_after.is_some(), "restart_after"),
                    (f.wipe_data.is_some(), "wipe_data"),
                    (f.down_for.is_some(), "down_for"),
                ] {
                    if set {
                        return Err(invalid(
                            shown,
                            loc,
                            format!("{}: only process faults (`target:`) take it", field(name)),
                        ));
                    }
                }
                let fault = f.fault.ok_or_else(|| {
                    invalid(
                        shown,
                        loc,
                        format!(
                            "{}: missing; one of refuse, reset, swallow, hang, delay, throttle, heal",
                            field("fault")
                        ),
                    )
                })?;
                for (set, name, owner) in [
                    (f.latency.is_some(), "latency", Fault::Delay),
                    (f.jitter.is_some(), "jitter", Fault::Delay),
                    (f.bytes_per_s.is_some(), "bytes_per_s", Fault::Throttle),
                ] {
                    if set && fault != owner {
                        return Err(invalid(
                            shown,
                            loc,
                            format!("{}: only `{}` takes it", field(name), owner.name()),
                        ));
                    }
                }
                let spec = FaultSpec {
                    fault,
                    direction: f.direction.unwrap_or(Direction::Both),
                    latency: f.latency.map(|d| d.0).unwrap_or_default(),
                    jitter: f.jitter.map(|d| d.0).unwrap_or_default(),
                    bytes_per_s: f.bytes_per_s.unwrap_or(0),
                    limit_bytes: 0,
                };
                spec.validate()
                    .map_err(|m| invalid(shown, loc, format!("faults[{i}]: {m}")))?;
                if fault == Fault::Heal {
                    if f.for_.is_some() || f.repeat.is_some() {
                        return Err(invalid(
                            shown,
                            loc,
                            format!("faults[{i}]: a heal has no `for` or `repeat`"),
                        ));
                    }
                    faults.push(ScheduledFault {
                        at: f.at.0,
                        what: FaultAction::Heal { link: link.clone() },
                    });
                    continue;
                }
                let lasts = f.for_.map(|d| d.0);
                // `repeat: N, every: P` makes a flapping link: N outages, one every P.
                let (times, every) = match (f.repeat, f.every) {
                    (None, None) => (1, Duration::ZERO),
                    (Some(n), Some(every)) => {
                        let Some(lasts) = lasts else {
                            return Err(invalid(
                                shown,
                                loc,
                                format!(
                                    "{}: a repeated fault needs `for` (how long each outage lasts)",
                                    field("repeat")
                                ),
                            ));
                        };
                        if n == 0 || every.0 <= lasts {
                            return Err(invalid(
                                shown,
                                loc,
                                format!(
                                    "{}: `every` must be longer than `for`, and `repeat` at least 1 (e.g. for: 2s, every: 4s, repeat: 30)",
                                    field("every")
                                ),
                            ));
                        }
                        (n, every.0)
                    }
                    _ => {
                        return Err(invalid(
                            shown,
                            loc,
                            format!(
                                "faults[{i}]: `repeat` and `every` go together (e.g. for: 2s, every: 4s, repeat: 30)"
                            ),
                        ));
                    }
                };
                for k in 0..times {
                    faults.push(ScheduledFault {
                        at: f.at.0 + every * k,
                        what: FaultAction::Link {
                            link: link.clone(),
                            spec,
                            lasts,
                        },
                    });
                }
            }
            (None, Some(target)) => {
                for (set, name) in [
                    (f.fault.is_some(), "fault"),
                    (f.direction.is_some(), "direction"),
                    (f.for_.is_some(), "for"),
                    (f.latency.is_some(), "latency"),
                    (f.jitter.is_some(), "jitter"),
                    (f.bytes_per_s.is_some(), "bytes_per_s"),
                    (f.repeat.is_some(), "repeat"),
                    (f.every.is_some(), "every"),
                ] {
                    if set {
                        return Err(invalid(
                            shown,
                            loc,
                            format!(
                                "{}: only link faults (`link:`) take it; a process fault uses `action`",
                                field(name)
                            ),
                        ));
                    }
                }
                let action = f.action.ok_or_else(|| {
                    invalid(
                        shown,
                        loc,
                        format!(
                            "{}: missing; kill or stop (engine), restart (proxy)",
                            field("action")
                        ),
                    )
                })?;
                match (target.as_str(), action) {
                    ("engine", ProcessAction::Pause) if command.is_none() => {
                        return Err(invalid(
                            shown,
                            loc,
                            format!(
                                "{}: pausing the built-in engine is not supported; use kill or stop (a user's engine, `system.command`, can be paused)",
                                field("action")
                            ),
                        ));
                    }
                    ("engine", ProcessAction::Pause) if f.restart_after.is_none() => {
                        return Err(invalid(
                            shown,
                            loc,
                            format!(
                                "{}: a paused engine needs `restart_after` (when it is resumed)",
                                field("action")
                            ),
                        ));
                    }
                    (
                        "engine",
                        ProcessAction::Kill | ProcessAction::Stop | ProcessAction::Pause,
                    ) => {
                        if f.down_for.is_some() {
                            return Err(invalid(
                                shown,
                                loc,
                                format!("{}: the engine uses `restart_after`", field("down_for")),
                            ));
                        }
                        faults.push(ScheduledFault {
                            at: f.at.0,
                            what: FaultAction::Engine {
                                action,
                                restart_after: f.restart_after.map(|d| d.0),
                                wipe_data: f.wipe_data.unwrap_or(false),
                            },
                        });
                    }
                    ("proxy", ProcessAction::Restart) => {
                        if f.restart_after.is_some() || f.wipe_data.is_some() {
                            return Err(invalid(
                                shown,
                                loc,
                                format!(
                                    "faults[{i}]: a proxy restart takes `down_for` (how long the port refuses), nothing else"
                                ),
                            ));
                        }
                        faults.push(ScheduledFault {
                            at: f.at.0,
                            what: FaultAction::ProxyRestart {
                                down_for: f.down_for.map(|d| d.0).unwrap_or(Duration::from_secs(1)),
                            },
                        });
                    }
                    (
                        "broker",
                        ProcessAction::Kill | ProcessAction::Stop | ProcessAction::Pause,
                    ) => {
                        let node = match f.node.as_deref() {
                            Some("leader") if destination.nodes > 1 => BrokerNode::Leader,
                            Some(n) => match n.parse::<usize>() {
                                Ok(n) if (1..=destination.nodes).contains(&n) => {
                                    BrokerNode::Number(n)
                                }
                                _ => {
                                    return Err(invalid(
                                        shown,
                                        loc,
                                        format!(
                                            "{}: `{n}`; use `leader` (a cluster's stream leader) or a node number 1..={}",
                                            field("node"),
                                            destination.nodes
                                        ),
                                    ));
                                }
                            },
                            None => BrokerNode::Number(1),
                        };
                        if action == ProcessAction::Pause && f.restart_after.is_none() {
                            return Err(invalid(
                                shown,
                                loc,
                                format!(
                                    "{}: a paused broker needs `restart_after` (when it resumes)",
                                    field("action")
                                ),
                            ));
                        }
                        faults.push(ScheduledFault {
                            at: f.at.0,
                            what: FaultAction::Broker {
                                node,
                                action,
                                restart_after: f.restart_after.map(|d| d.0),
                            },
                        });
                    }
                    (target @ ("engine" | "proxy" | "broker"), action) => {
                        return Err(invalid(
                            shown,
                            loc,
                            format!(
                                "{}: `{}` cannot `{action:?}`; the engine takes kill or stop, a broker kill, stop or pause, the proxy restart",
                                field("action"),
                                target
                            ),
                        ));
                    }
                    (other, _) => {
                        return Err(invalid(
                            shown,
                            loc,
                            format!(
                                "{}: `{other}` is not a target this build can act on; use `engine`, `broker` or `proxy`",
                                field("target")
                            ),
                        ));
                    }
                }
            }
        }
    }
    faults.sort_by_key(|f| f.at);
    if kind == DestinationKind::Nats && destination.duplicate_window.is_none() {
        let drill_ends = workload.duration
            + raw
                .drain_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(60));
        let window =
            longest_outage(&faults, drill_ends) + engine.refusals.2 + 2 * engine.answer_timeout;
        destination.duplicate_window = Some(window.max(Duration::from_secs(120)));
    }
    let expect = raw
        .expect
        .map(|e| Expectations {
            lost: e.lost,
            duplicates: e.duplicates,
            reordered: e.reordered,
            ledger_closes: e.ledger == Some(LedgerExpectation::Closes),
            recovery_within: e.recovery_within.map(|d| d.0),
        })
        .unwrap_or(Expectations {
            lost: Some(0),
            ledger_closes: true,
            ..Expectations::default()
        });
    Ok(Plan {
        name,
        about: raw.about,
        source: source.to_path_buf(),
        seed: raw.seed.unwrap_or(1),
        destination,
        engine,
        command,
        workload,
        faults,
        expect,
        drain_timeout: raw
            .drain_timeout
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(60)),
        tags: raw.tags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
name: t
destination: { kind: mqtt }
workload: { rate: 100/s, duration: 10s }
faults:
  - { at: 2s, link: mqtt, fault: swallow, for: 3s }
  - { at: 4s, target: engine, action: kill, restart_after: 1s }
";

    fn err(text: &str) -> String {
        parse(Path::new("s.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn durations_and_rates() {
        assert_eq!(Dur::parse("2m30s").unwrap().0, Duration::from_secs(150));
        assert_eq!(Dur::parse("500ms").unwrap().0, Duration::from_millis(500));
        assert!(Dur::parse("5").is_err());
        assert!(Dur::parse("-5s").is_err());
        assert!(Dur::parse("5 parsecs").is_err());
        assert_eq!(Rate::parse("6000/m").unwrap().0, 100.0);
        assert!(Rate::parse("-5/s").is_err());
        assert!(Rate::parse("0/s").is_err());
    }

    #[test]
    fn a_good_scenario_becomes_a_plan() {
        let plan = parse(Path::new("s.yaml"), GOOD).unwrap();
        assert_eq!(plan.workload.total_records(), 1000);
        assert_eq!(plan.faults.len(), 2);
        assert!(plan.expect.ledger_closes);
    }

    #[test]
    fn unknown_field_names_file_line_column_and_field() {
        let text = GOOD.replace("fault: swallow", "fualt: swallow");
        let e = err(&text);
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        assert!(e.contains("fualt"), "{e}");
    }

    #[test]
    fn a_nats_destination_gets_a_duplicate_window_longer_than_its_outages() {
        let text = "name: n\ndestination: { kind: nats }\nworkload: { rate: 10/s, duration: 10m }\nfaults:\n  - { at: 10s, link: nats, fault: swallow, direction: downstream, for: 5m }\n";
        let plan = parse(Path::new("n.yaml"), text).unwrap();
        assert_eq!(plan.engine.promise, Promise::EffectivelyOnce);
        // 5 min outage + 60 s backoff cap + twice the 3 s answer timeout.
        assert_eq!(
            plan.destination.duplicate_window,
            Some(Duration::from_secs(300 + 60 + 6))
        );
        let short = text.replace("for: 5m", "for: 5s");
        let plan = parse(Path::new("n.yaml"), &short).unwrap();
        assert_eq!(
            plan.destination.duplicate_window,
            Some(Duration::from_secs(120))
        );
        let e = err(&text.replace("kind: nats }", "kind: nats, runtime: embedded }"));
        assert!(e.contains("no embedded nats broker"), "{e}");
        let e = err(&text
            .replace("kind: nats }", "kind: mqtt, duplicate_window: 1m }")
            .replace("link: nats", "link: mqtt"));
        assert!(e.contains("only a `nats` destination"), "{e}");
        let cluster = text
            .replace("kind: nats }", "kind: nats, nodes: 3 }")
            .replace("link: nats,", "link: nats-2,")
            + "  - { at: 20s, target: broker, node: leader, action: kill, restart_after: 5s }\n";
        let plan = parse(Path::new("n.yaml"), &cluster).unwrap();
        assert_eq!(
            plan.destination.link_names(),
            ["nats-1", "nats-2", "nats-3"]
        );
        assert!(matches!(
            plan.faults[1].what,
            FaultAction::Broker {
                node: BrokerNode::Leader,
                ..
            }
        ));
        let e = err(&cluster.replace("node: leader", "node: 4"));
        assert!(e.contains("node number 1..=3"), "{e}");
        let e = err(&text.replace("kind: nats }", "kind: mqtt, nodes: 3 }"));
        assert!(e.contains("only `nats` has nodes"), "{e}");
        let e = err(&text.replace("kind: nats }", "kind: kafka, runtime: embedded }"));
        assert!(e.contains("no embedded kafka broker"), "{e}");
    }

    #[test]
    fn a_flapping_link_and_a_proxy_restart() {
        let text = "name: f\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 2m }\nfaults:\n  - { at: 10s, link: mqtt, fault: refuse, for: 2s, every: 4s, repeat: 30 }\n  - { at: 5s, target: proxy, action: restart, down_for: 3s }\n  - { at: 1s, link: mqtt, fault: delay, direction: downstream, latency: 100ms, jitter: 10ms }\n";
        let plan = parse(Path::new("f.yaml"), text).unwrap();
        assert_eq!(plan.faults.len(), 32);
        assert_eq!(
            plan.faults.last().unwrap().at,
            Duration::from_secs(10 + 29 * 4)
        );
        assert!(
            matches!(plan.faults[1].what, FaultAction::ProxyRestart { down_for } if down_for == Duration::from_secs(3))
        );
        let e = err(&text.replace("every: 4s", "every: 1s"));
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        let e = err(&text.replace("latency: 100ms, jitter: 10ms", ""));
        assert!(e.contains("`delay` needs a latency"), "{e}");
        let e = err(&text.replace("fault: delay", "fault: swallow"));
        assert!(e.contains("only `delay` takes it"), "{e}");
    }

    #[test]
    fn bad_values_are_located() {
        let e = err(&GOOD.replace("100/s", "-100/s"));
        assert!(e.starts_with("s.yaml:3:"), "{e}");
        assert!(e.contains("greater than zero"), "{e}");
        let e = err(&GOOD.replace("10s", "10 seconds"));
        assert!(e.starts_with("s.yaml:3:"), "{e}");
        let e = err(&GOOD.replace("link: mqtt", "link: kafka"));
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        assert!(e.contains("faults[0].link"), "{e}");
    }
}
