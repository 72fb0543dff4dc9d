//! `engine.yaml`: what the engine is told, and the checks that refuse a configuration it could
//! not honour (DESIGN.md §1.7: an output may declare only the promise it can keep). Defaults
//! live here once. Owns no state and starts nothing.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::EngineError;
use super::log;
use crate::scenario::{Credentials, Dur, Order, Promise};

/// `engine.yaml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where the HTTP API (ingest, stats) listens.
    pub listen: SocketAddr,
    /// The durable buffer, attempt journal and failed messages.
    pub data_dir: PathBuf,
    pub outputs: Vec<OutputConfig>,
    /// When room runs low: warn, then refuse new ingest (DESIGN.md §1.10). Nothing stored is
    /// ever evicted.
    #[serde(default)]
    pub disk: DiskLimits,
}

/// Free-space thresholds on the data directory's filesystem, and the record log's segment
/// size, in bytes. Every field has a default.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiskLimits {
    /// Below this, `/stats` says `disk_low` and the engine logs a warning.
    pub warn_below_bytes: u64,
    /// Below this, ingest is refused with HTTP 507 (nothing stored, nothing acknowledged) until
    /// space returns.
    pub refuse_below_bytes: u64,
    /// A new segment of the record log starts once the active one is this long; a segment is
    /// deleted whole once every output is past it.
    pub segment_bytes: u64,
}

impl Default for DiskLimits {
    fn default() -> Self {
        DiskLimits {
            warn_below_bytes: 1 << 30,
            refuse_below_bytes: 64 << 20,
            segment_bytes: log::DEFAULT_SEGMENT_BYTES,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    pub name: String,
    pub kind: OutputKind,
    /// The destination (for a drill: the proxy link in front of the broker).
    pub address: SocketAddr,
    /// More servers of the same destination (the other nodes of a NATS cluster, each through
    /// its own link). The client tries them all; it never learns others from the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_addresses: Vec<SocketAddr>,
    pub topic: String,
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub promise: Promise,
    #[serde(default)]
    pub order: Order,
    /// How often a PINGREQ probes an idle connection.
    #[serde(default = "default_keepalive")]
    pub keepalive: DurText,
    /// How long an unanswered probe, connect or blocked write may last before the connection
    /// is declared lost (its open attempts end `possibly_sent`).
    #[serde(default = "default_answer_timeout")]
    pub answer_timeout: DurText,
    /// Open attempts at once (deliveries in flight). Left out (or 0): the kind's own
    /// ([`OutputKind::default_window`]), as many as the destination takes without harm. An
    /// MQTT broker's Receive Maximum lowers it further.
    #[serde(default)]
    pub window: usize,
    #[serde(default)]
    pub refusals: Option<RefusalConfig>,
    /// Where the destination's credentials are: names of environment variables (read at each
    /// connect), never the secrets themselves — this file is written to disk.
    #[serde(default, skip_serializing_if = "Credentials::is_empty")]
    pub credentials: Credentials,
}

impl OutputConfig {
    /// The window in force: the configured one, or the kind's default.
    pub fn window(&self) -> usize {
        if self.window == 0 {
            self.kind.default_window()
        } else {
            self.window
        }
    }

    /// An MQTT output with every default (at_least_once, in_order, 2 s keepalive, 3 s answer
    /// timeout, 64 open attempts, 10 counted refusals backing off 1 s → 60 s).
    pub fn mqtt(name: &str, address: SocketAddr, topic: &str) -> OutputConfig {
        OutputConfig {
            name: name.to_string(),
            kind: OutputKind::Mqtt,
            address,
            more_addresses: Vec::new(),
            topic: topic.to_string(),
            client_id: None,
            promise: Promise::default(),
            order: Order::default(),
            keepalive: default_keepalive(),
            answer_timeout: default_answer_timeout(),
            window: default_window(),
            refusals: None,
            credentials: Credentials::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// MQTT 5, QoS 1; `topic` is the topic. Keeps `at_least_once`.
    Mqtt,
    /// NATS JetStream; `topic` is the subject a stream captures. Keeps `effectively_once`
    /// within the stream's duplicate window (or `at_least_once`, if declared).
    Nats,
    /// Kafka (idempotent producer); `topic` is the topic. Keeps `at_least_once`.
    Kafka,
}

impl OutputKind {
    /// Deliveries in flight when the config gives no `window`: MQTT's QoS 1 window (further
    /// capped by the broker's Receive Maximum), JetStream publishes awaiting their acks, Kafka
    /// records in the producer's batches. Enough that draining a backlog runs at the speed of
    /// the client library, not of one round trip per window.
    pub fn default_window(self) -> usize {
        match self {
            OutputKind::Mqtt => 1024,
            OutputKind::Nats => 4096,
            OutputKind::Kafka => 16_384,
        }
    }

    /// The strongest promise this kind of output can keep (DESIGN.md §1.7).
    pub fn strongest_promise(self) -> Promise {
        match self {
            OutputKind::Mqtt => Promise::AtLeastOnce,
            OutputKind::Nats => Promise::EffectivelyOnce,
            OutputKind::Kafka => Promise::AtLeastOnce,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalConfig {
    pub max: u32,
    /// `[first, cap]`, e.g. `[1s, 60s]`.
    pub backoff: [DurText; 2],
}

/// A duration as text in the config file (`2s`), parsed with the scenario's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurText(pub Duration);

impl Serialize for DurText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", self.0.as_millis()))
    }
}

impl<'de> Deserialize<'de> for DurText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Dur::deserialize(d).map(|d| DurText(d.0))
    }
}

fn default_keepalive() -> DurText {
    DurText(Duration::from_secs(2))
}
fn default_answer_timeout() -> DurText {
    DurText(Duration::from_secs(3))
}
fn default_window() -> usize {
    64
}

impl EngineConfig {
    pub fn load(path: &Path) -> Result<EngineConfig, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|source| EngineError::ReadConfig {
            path: path.to_path_buf(),
            source,
        })?;
        let config: EngineConfig = serde_saphyr::from_str(&text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!("{}:{}: ", l.line(), l.column()))
                .unwrap_or_default();
            EngineError::Config {
                path: path.to_path_buf(),
                message: format!("{at}{}", e.to_string().lines().next().unwrap_or("invalid")),
            }
        })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), EngineError> {
        let err = |message: String| EngineError::Config {
            path: path.to_path_buf(),
            message,
        };
        if self.outputs.is_empty() {
            return Err(err(
                "`outputs` is empty: give at least one destination".to_string()
            ));
        }
        let mut names = HashSet::new();
        for o in &self.outputs {
            if !names.insert(o.name.as_str()) {
                return Err(err(format!(
                    "output name `{}` is used twice; each output needs its own name (it names its files)",
                    o.name
                )));
            }
            // DESIGN.md §1.7: claiming more than an output can keep is a configuration error.
            let can = o.kind.strongest_promise();
            if o.promise.rank() > can.rank() {
                let why = match o.kind {
                    OutputKind::Mqtt => {
                        "an MQTT 5 QoS 1 output keeps `at_least_once` (a lost PUBACK means a resend)"
                    }
                    OutputKind::Nats => {
                        "a JetStream output keeps `effectively_once` only within the stream's duplicate window"
                    }
                    OutputKind::Kafka => {
                        "a Kafka output keeps `at_least_once` (a new producer session after a crash may add a copy)"
                    }
                };
                return Err(err(format!(
                    "output `{}` declares `{}`, but {why}; declare {} or less",
                    o.name,
                    o.promise.name(),
                    can.name()
                )));
            }
            if o.promise == Promise::AtMostOnce {
                return Err(err(format!(
                    "output `{}` declares `at_most_once`, which this engine does not offer: it never drops a record it could resend; declare {}",
                    o.name,
                    can.name()
                )));
            }
            if o.name.is_empty()
                || !o
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(err(format!(
                    "output name `{}`: use letters, digits, `-` or `_`",
                    o.name
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(outputs: Vec<OutputConfig>) -> EngineConfig {
        EngineConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: "/tmp/x".into(),
            outputs,
            disk: DiskLimits::default(),
        }
    }

    fn output(name: &str, kind: OutputKind, promise: Promise) -> OutputConfig {
        OutputConfig {
            kind,
            promise,
            ..OutputConfig::mqtt(name, "127.0.0.1:1".parse().unwrap(), "t")
        }
    }

    #[test]
    fn an_output_may_declare_only_what_it_can_keep() {
        let path = Path::new("engine.yaml");
        let ok = |o: Vec<OutputConfig>| config(o).validate(path).map_err(|e| e.to_string());
        assert!(ok(vec![output("m", OutputKind::Mqtt, Promise::AtLeastOnce)]).is_ok());
        assert!(
            ok(vec![output(
                "n",
                OutputKind::Nats,
                Promise::EffectivelyOnce
            )])
            .is_ok()
        );
        let e = ok(vec![output(
            "m",
            OutputKind::Mqtt,
            Promise::EffectivelyOnce,
        )])
        .unwrap_err();
        assert!(e.contains("declare at_least_once or less"), "{e}");
        let e = ok(vec![output("n", OutputKind::Nats, Promise::AtMostOnce)]).unwrap_err();
        assert!(e.contains("at_most_once"), "{e}");
        let e = ok(vec![
            output("a", OutputKind::Mqtt, Promise::AtLeastOnce),
            output("a", OutputKind::Nats, Promise::AtLeastOnce),
        ])
        .unwrap_err();
        assert!(e.contains("used twice"), "{e}");
        assert!(ok(vec![]).unwrap_err().contains("empty"));
    }
}
