//! `engine.yaml`: what the engine is told, and the checks that refuse a configuration it could
//! not honour (docs/src/design.md#rule-1-7: an output may declare only the promise it can keep,
//! which its kind's [`SinkKind`] says). Defaults live here once. Owns no state and starts nothing.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::EngineError;
use super::log;
use super::sink::{SinkKind, Sinks};
use crate::credentials::Credentials;
use crate::promise::{Order, Promise};
use crate::units::Dur;

/// `engine.yaml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where the HTTP API (ingest, stats) listens.
    pub listen: SocketAddr,
    /// The durable buffer, attempt journal and failed messages.
    pub data_dir: PathBuf,
    pub outputs: Vec<OutputConfig>,
    /// When room runs low: warn, then refuse new ingest (docs/src/design.md#rule-1-10). Nothing
    /// stored is ever evicted.
    #[serde(default)]
    pub disk: DiskLimits,
    /// A log file to follow as an input besides the HTTP ingest (`super::tail`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<super::tail::TailConfig>,
    /// A topic to consume as an input besides the HTTP ingest (`super::consume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consume: Option<super::consume::ConsumeConfig>,
    /// An outbox table to poll as an input besides the HTTP ingest (`super::outbox`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<super::outbox::OutboxConfig>,
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
    /// The destination kind: a name the build's [`Sinks`] knows (`mqtt`, `nats`, `kafka`,
    /// `syslog`, `postgres`, `http` in drill's own build).
    pub kind: String,
    /// How the output reaches a destination that has more than one way (`syslog`: `relp`,
    /// `tcp` or `udp`; default `relp`). The transport decides the promise it can keep: only
    /// RELP answers each message. Refused for kinds with one way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// HTTP: the request header that carries each record's write key (default
    /// `Idempotency-Key`). Refused for other kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_header: Option<String>,
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
    /// ([`SinkKind::default_window`]), as many as the destination takes without harm. A
    /// destination's own limit (an MQTT broker's Receive Maximum) lowers it further.
    #[serde(default)]
    pub window: usize,
    #[serde(default)]
    pub refusals: Option<RefusalConfig>,
    /// Where the destination's credentials are: names of environment variables (read at each
    /// connect), never the secrets themselves — this file is written to disk.
    #[serde(default, skip_serializing_if = "Credentials::is_empty")]
    pub credentials: Credentials,
    /// TLS to the destination: the CA file to trust, and a client certificate for mutual TLS.
    /// Left out: plain TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::TlsConfig>,
}

impl OutputConfig {
    /// The window in force: the configured one, or the kind's default.
    pub fn window_with(&self, kind: &dyn SinkKind) -> usize {
        if self.window == 0 {
            kind.default_window()
        } else {
            self.window
        }
    }

    /// An output of `kind` with every default (at_least_once, in_order, 2 s keepalive, 3 s
    /// answer timeout, 64 open attempts, 10 counted refusals backing off 1 s → 60 s).
    pub fn new(kind: &str, name: &str, address: SocketAddr, topic: &str) -> OutputConfig {
        OutputConfig {
            name: name.to_string(),
            kind: kind.to_string(),
            address,
            more_addresses: Vec::new(),
            topic: topic.to_string(),
            transport: None,
            key_header: None,
            client_id: None,
            promise: Promise::default(),
            order: Order::default(),
            keepalive: default_keepalive(),
            answer_timeout: default_answer_timeout(),
            window: default_window(),
            refusals: None,
            credentials: Credentials::default(),
            tls: None,
        }
    }

    /// The client side of TLS when the output has `tls:` (its files read now); `Err` names
    /// the file and what is wrong with it.
    pub fn client_tls(&self) -> Result<Option<crate::tls::ClientTls>, String> {
        self.tls
            .as_ref()
            .map(crate::tls::ClientTls::new)
            .transpose()
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
    /// Reads and checks `engine.yaml`; `sinks` are the destination kinds this build has.
    pub fn load(path: &Path, sinks: &dyn Sinks) -> Result<EngineConfig, EngineError> {
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
        config.validate(path, sinks)?;
        Ok(config)
    }

    /// Refuses what the engine could not honour: no outputs, a name used twice or unusable, an
    /// unknown kind, a promise the kind cannot keep.
    pub fn validate(&self, path: &Path, sinks: &dyn Sinks) -> Result<(), EngineError> {
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
            let Some(kind) = sinks.kind(&o.kind) else {
                return Err(err(format!(
                    "output `{}`: unknown kind `{}`; this build has {}",
                    o.name,
                    o.kind,
                    sinks.names().join(", ")
                )));
            };
            kind.check(o)
                .map_err(|why| err(format!("output `{}`: {why}", o.name)))?;
            // docs/src/design.md#rule-1-7: claiming more than an output can keep is a
            // configuration error.
            let (can, why) = kind.strongest_promise(o);
            if o.promise.rank() > can.rank() {
                return Err(err(format!(
                    "output `{}` declares `{}`, but {why}; declare {} or less",
                    o.name,
                    o.promise.name(),
                    can.name()
                )));
            }
            // at_most_once is what a destination that cannot confirm gives (plain TCP, UDP);
            // where the destination answers, the engine never drops a record it could resend.
            if o.promise == Promise::AtMostOnce && can != Promise::AtMostOnce {
                return Err(err(format!(
                    "output `{}` declares `at_most_once`, which this engine does not offer where the destination answers: it never drops a record it could resend; declare {}",
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

    /// Two kinds made up for the test: one keeps at_least_once, one effectively_once.
    struct Kinds;
    struct Kind(Promise);

    impl SinkKind for Kind {
        fn strongest_promise(&self, _: &OutputConfig) -> (Promise, &'static str) {
            (self.0, "it says so")
        }
        fn check(&self, cfg: &OutputConfig) -> Result<(), String> {
            match &cfg.transport {
                Some(t) if self.0 != Promise::AtMostOnce => Err(format!("`transport: {t}`")),
                _ => Ok(()),
            }
        }
        fn default_window(&self) -> usize {
            8
        }
        fn spawn(&self, _: crate::engine::OutputTask) -> tokio::task::JoinHandle<()> {
            unreachable!("not started in this test")
        }
        fn probe<'a>(
            &'a self,
            _: &'a OutputConfig,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>
        {
            Box::pin(async { Ok(()) })
        }
    }

    static LEAST: Kind = Kind(Promise::AtLeastOnce);
    static EXACTLY: Kind = Kind(Promise::EffectivelyOnce);
    static UNCONFIRMED: Kind = Kind(Promise::AtMostOnce);

    impl Sinks for Kinds {
        fn kind(&self, name: &str) -> Option<&dyn SinkKind> {
            match name {
                "least" => Some(&LEAST),
                "exactly" => Some(&EXACTLY),
                "unconfirmed" => Some(&UNCONFIRMED),
                _ => None,
            }
        }
        fn names(&self) -> Vec<&'static str> {
            vec!["least", "exactly", "unconfirmed"]
        }
    }

    fn config(outputs: Vec<OutputConfig>) -> EngineConfig {
        EngineConfig {
            tail: None,
            consume: None,
            outbox: None,
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: "/tmp/x".into(),
            outputs,
            disk: DiskLimits::default(),
        }
    }

    fn output(name: &str, kind: &str, promise: Promise) -> OutputConfig {
        OutputConfig {
            promise,
            ..OutputConfig::new(kind, name, "127.0.0.1:1".parse().unwrap(), "t")
        }
    }

    #[test]
    fn an_output_may_declare_only_what_it_can_keep() {
        let path = Path::new("engine.yaml");
        let ok = |o: Vec<OutputConfig>| config(o).validate(path, &Kinds).map_err(|e| e.to_string());
        assert!(ok(vec![output("m", "least", Promise::AtLeastOnce)]).is_ok());
        assert!(ok(vec![output("n", "exactly", Promise::EffectivelyOnce)]).is_ok());
        let e = ok(vec![output("m", "least", Promise::EffectivelyOnce)]).unwrap_err();
        assert!(e.contains("declare at_least_once or less"), "{e}");
        let e = ok(vec![output("n", "exactly", Promise::AtMostOnce)]).unwrap_err();
        assert!(e.contains("at_most_once"), "{e}");
        // A destination that cannot confirm keeps at_most_once and nothing more.
        assert!(ok(vec![output("u", "unconfirmed", Promise::AtMostOnce)]).is_ok());
        let e = ok(vec![output("u", "unconfirmed", Promise::AtLeastOnce)]).unwrap_err();
        assert!(e.contains("declare at_most_once or less"), "{e}");
        // A kind's own check refuses what it cannot honour, naming the output.
        let mut t = output("t", "least", Promise::AtLeastOnce);
        t.transport = Some("tcp".into());
        let e = ok(vec![t]).unwrap_err();
        assert!(e.contains("output `t`: `transport: tcp`"), "{e}");
        let e = ok(vec![
            output("a", "least", Promise::AtLeastOnce),
            output("a", "exactly", Promise::AtLeastOnce),
        ])
        .unwrap_err();
        assert!(e.contains("used twice"), "{e}");
        assert!(ok(vec![]).unwrap_err().contains("empty"));
        let e = ok(vec![output("x", "amqp", Promise::AtLeastOnce)]).unwrap_err();
        assert!(
            e.contains("unknown kind `amqp`; this build has least, exactly, unconfirmed"),
            "{e}"
        );
    }
}
