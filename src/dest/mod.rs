//! Destination kinds, one folder each: `mqtt/`, `nats/`, `kafka/`, `syslog/`, `http/`,
//! `postgres/`, `amqp/`.
//!
//! A kind's folder holds all that is that kind's, as vector's `src/sinks/<name>/` does:
//!
//! | file | what it owns |
//! |---|---|
//! | `<kind>/mod.rs` | the kind's [`Entry`] (its name, own `destination:` fields, external address field, validator, engine sink), its scenario rules and its [`Destination`] impl: links, strongest promise, where its write key travels |
//! | `<kind>/broker.rs` | starting its receiving side on each runtime: a local process, a container ([`crate::container::Launch`]), embedded where one exists, external (reach, find or create, clean up only what drill made) |
//! | `<kind>/read.rs` | the reader: from before the first record, straight from the broker (never through the proxy), decoding ids and write keys |
//! | `<kind>/sink.rs` | the engine's side ([`crate::engine::Sink`]): connect + data-free probe, send, classify each answer into an outcome |
//!
//! This module holds the traits, the shared vocabulary of running brokers ([`Running`],
//! [`ReadBack`]), and [`Kind::entry`]: the one place that maps a kind to its implementation.
//! Outside `src/dest/<kind>/`, no code names a kind: what differs is a field of its [`Entry`].
//!
//! # Adding a destination kind
//!
//! 1. A folder `src/dest/<kind>/` with `mod.rs`, `broker.rs`, `read.rs`, `sink.rs`, and its
//!    client crate in `Cargo.toml`. Its own fields of `destination:` are an `own_fields!` (below)
//!    struct in its `mod.rs`, read by its validator ([`Section::own`]); the shared ones are
//!    [`RawDestination`].
//! 2. One line in the [`kinds!`] list below: the kind's variant and its folder (the
//!    registration; the macro makes the module, the [`Kind`] variant, its place in
//!    [`Kind::ALL`] and its arm of [`Kind::entry`]).
//! 3. What each part must guarantee:
//!    - the validator ([`Entry::validate`]) refuses every field the kind cannot honour, with
//!      its location, and may not claim a promise the kind cannot keep;
//!    - [`Destination::provision`] starts (or reaches) the broker and returns one proxy link
//!      per broker listener the engine must use, each in front of the broker: no engine
//!      traffic may reach the broker around a link;
//!    - [`Destination::reader`] reads every copy from the broker directly, from before the
//!      first record, and reports a reader that may have missed copies as a verifier fault,
//!      never as engine loss;
//!    - the sink's probe writes nothing; an unanswered attempt is `possibly_sent`, never
//!      refused or delivered; a refusal counts only when the destination said no to that one
//!      record.
//! 4. A line in `tests/kind_contract.rs` (it fails until there is one): a drill of drill's
//!    engine on the kind's real broker, answers swallowed then the link refused, that shows
//!    the guarantees of step 3 (read from before the first record, nothing lost, no probe
//!    copy, unanswered attempts `possibly_sent`) and, run again with the engine around the
//!    link, that a bypass is judged; and a probe test in
//!    `tests/probes_write_nothing.rs`.
//! 5. What then runs on it by itself: every catalogue drill whose `destination.kind` names
//!    it, the selftest's mutants on those drills (`drill selftest`), and `drill bench engine`
//!    when the kind's [`Entry::bench`] gives one.

mod bench;
mod external;
mod running;
mod spec;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::engine::{OutputConfig, SinkKind, Sinks};
use crate::located::Located;
use crate::promise::Promise;
use crate::proxy::Link;
use crate::verify::{Decoder, Received, WriteKeyPlace};

pub use bench::{BenchAt, BenchBroker, BenchKind, BenchRun, Done, RawRun, RecordLine};
pub use external::reach;
pub use running::{Halt, Node, Running};
pub use spec::{
    External, Own, RawCredentials, RawDestination, RawReadBack, SHARED_FIELDS, Section, Spec,
    TlsSpec, schema, validate,
};

/// Declares a kind's own fields of `destination:` (`struct NatsFields { stream:
/// Option<Spanned<String>>, … }`), which the kind reads with [`Section::own`]: each field
/// optional (`#[serde(default)]`), any field that neither the kind nor every kind
/// ([`RawDestination`]) takes refused with its line and column, and the shared fields skipped
/// (read by `spec.rs`). The struct's JSON Schema is the kind's part of `drill schema`
/// ([`Entry::fields`]).
macro_rules! own_fields {
    ($(#[$m:meta])* struct $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty,)* }) => {
        $(#[$m])*
        #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fm])* #[serde(default)] pub $field: $ty,)*
            #[serde(default, rename = "kind")]
            #[schemars(skip)]
            _kind: serde::de::IgnoredAny,
            #[serde(default, rename = "runtime")]
            #[schemars(skip)]
            _runtime: serde::de::IgnoredAny,
            #[serde(default, rename = "topic")]
            #[schemars(skip)]
            _topic: serde::de::IgnoredAny,
            #[serde(default, rename = "create")]
            #[schemars(skip)]
            _create: serde::de::IgnoredAny,
            #[serde(default, rename = "keep")]
            #[schemars(skip)]
            _keep: serde::de::IgnoredAny,
            #[serde(default, rename = "credentials")]
            #[schemars(skip)]
            _credentials: serde::de::IgnoredAny,
            #[serde(default, rename = "tls")]
            #[schemars(skip)]
            _tls: serde::de::IgnoredAny,
        }
    };
}

/// Makes the registration from one list of `Variant => folder` lines: the `pub mod`, the
/// [`Kind`] enum, [`Kind::ALL`] in the list's order, and [`Kind::entry`].
macro_rules! kinds {
    ($($variant:ident => $folder:ident,)+) => {
        $(pub mod $folder;)+

        /// A destination kind, as a scenario and `engine.yaml` name it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum Kind {
            $($variant,)+
        }

        impl Kind {
            /// Every kind this build has.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)+];

            /// The kind's implementation: the one place a kind is mapped to it.
            pub fn entry(self) -> &'static Entry {
                match self {
                    $(Kind::$variant => &$folder::ENTRY,)+
                }
            }
        }
    };
}

// The registration: one line per destination kind.
kinds! {
    Mqtt => mqtt,
    Nats => nats,
    Kafka => kafka,
    Syslog => syslog,
    Http => http,
    Postgres => postgres,
    Amqp => amqp,
}

impl Kind {
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// The kind called `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The engine's side of the kind: its sink.
    pub fn sink(self) -> &'static dyn SinkKind {
        self.entry().sink
    }

    /// `system.write_key`'s field for this kind, and its JSON type.
    pub fn write_key_field(self) -> (&'static str, &'static str) {
        self.entry().write_key_field
    }
}

/// A kind's validator: `destination:` → its [`Destination`] (and the brokers you run, with
/// `runtime: external`), its own fields read and checked ([`Section::own`]).
pub type Validate = fn(&Section) -> Result<Own, Located>;

/// The JSON Schema of a kind's own fields (`<its own_fields! struct>::json_schema`).
pub type FieldsSchema = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

/// What a kind registers: its name and the parts nothing else can say for it.
pub struct Entry {
    pub name: &'static str,
    /// The engine's side.
    pub sink: &'static dyn SinkKind,
    /// Its own fields of `destination:`, beyond the shared ones ([`RawDestination`]): the
    /// schema of its `own_fields!` struct.
    pub fields: FieldsSchema,
    /// Whether it takes `tls:` (a shared field: its broker or its links speak TLS).
    pub tls: bool,
    /// `runtime: external`: the field with the broker address(es), and an example value
    /// (`None`: drill always hosts the destination itself).
    pub external_field: Option<(&'static str, &'static str)>,
    /// SASL mechanisms `credentials.sasl_mechanism` may name (none: it takes no mechanism).
    pub sasl_mechanisms: &'static [&'static str],
    /// Whether drill can run its broker inside its own process (`runtime: embedded`).
    pub embedded: bool,
    /// Whether the broker drill starts for this kind serves TLS (mosquitto, nats-server). A
    /// kind that takes `tls` with a broker that does not (Kafka: tansu) speaks TLS at its
    /// links only (`links: terminate`), plain from the links to the broker.
    pub broker_tls: bool,
    /// `system.write_key`'s field for a user's engine on this kind (`mqtt_user_property`,
    /// `kafka_header`, `nats_msg_id`) and its JSON type; the value is the kind's to read
    /// ([`Destination::write_key_place`]).
    pub write_key_field: (&'static str, &'static str),
    /// `destination:` → the kind's [`Destination`], its own fields checked.
    pub validate: Validate,
    /// Why `links: terminate` is not built for the kind (`None`: it is, where it takes `tls`).
    pub no_terminating_link: Option<&'static str>,
    /// Whether drill speaks TLS to a broker of this kind the user runs (`runtime: external`).
    pub external_tls: bool,
    /// Why a `drill proxy` on another host cannot serve the kind's link (`None`: it can, when
    /// the destination has one link).
    pub no_remote_link: Option<&'static str>,
    /// What `drill init` writes for the kind.
    pub starter: Starter,
    /// What `drill bench engine` drains to, when the kind takes part.
    pub bench: Option<&'static dyn BenchKind>,
    /// `drill bench proxy`'s table for the kind's own link style, when it has one (Kafka's
    /// Kafka-aware link).
    pub link_bench: Option<LinkBench>,
    /// The protocol tap for the kind's links, finding the ids of a run (`None`: the kind has
    /// none, and the report says so).
    pub taps: Option<TapsFor>,
}

/// `drill init`'s words for a kind: a topic in the kind's style for a drill called `drill`
/// (`None`: the kind's destination takes no topic), and the `system.write_key` value (a YAML
/// flow value) for a key the engine puts in a place called `name`.
pub struct Starter {
    pub topic: fn(drill: &str) -> Option<String>,
    pub write_key: fn(name: &str) -> String,
}

/// `drill bench proxy`'s table for a kind's own link style: `(drill binary, records per run,
/// runs)` → a markdown table.
pub type LinkBench = fn(&std::path::Path, u64, usize) -> std::io::Result<String>;

/// Makes a kind's protocol tap for the ids of run `run`.
pub type TapsFor = fn(run: &str) -> Arc<dyn crate::proxy::tap::TapMaker>;

/// How a destination drill hosts itself answers for a while: a destination fault
/// (`target: destination`, docs/src/design.md#3-fault-vocabulary), on the timeline like a link
/// fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFault {
    /// Every write and probe answered with this status (`answer: 503`), with `Retry-After`
    /// when given; nothing is stored.
    Status {
        code: u16,
        retry_after: Option<Duration>,
    },
    /// Writes are stored at once and answered this late (`answer_after: 30s`): an engine's
    /// answer timeout ends them `possibly_sent`.
    After(Duration),
    /// "Yes, but" (`reject: { fraction: 0.1, status: 429 }`): this many parts per million of
    /// the records written are refused with `code` while the answer as a whole says yes —
    /// an Elasticsearch `_bulk` answer `200` with per-item errors (a plain POST is answered
    /// `code` whole), an MQTT 5 PUBACK with an error reason (`reason: 0x97`) while the
    /// session carries on. A refused record is withheld: never stored.
    Reject {
        code: u16,
        per_million: u32,
        /// The kind's words for its answers (how `code` is written, whether it refuses the
        /// record for good).
        words: &'static RejectWords,
    },
    /// The broker itself put in a state for a while (`broker: alarm`): one of the kind's
    /// [`ScriptedAnswers::states`], by its word. Its answers are the broker's own.
    Broker { state: &'static str },
}

/// The `reject` words of a kind whose destination drill hosts: the field naming the answer
/// and the answers it takes.
#[derive(Debug, PartialEq, Eq)]
pub struct RejectWords {
    /// `status` (HTTP) or `reason` (MQTT 5).
    pub field: &'static str,
    /// Each answer a record may be rejected with: its code, whether it refuses the record for
    /// good (`false`: "not now", the record goes again), and how the book writes it.
    pub codes: &'static [(u16, bool, &'static str)],
}

impl RejectWords {
    /// How the book writes `code` (`0x97 (quota exceeded)`, `429`).
    pub fn name(&self, code: u16) -> String {
        self.codes
            .iter()
            .find(|(c, ..)| *c == code)
            .map_or_else(|| code.to_string(), |(.., name)| (*name).to_string())
    }

    /// Whether `code` refuses the record for good (`None`: not one of the kind's answers).
    pub fn for_good(&self, code: u16) -> Option<bool> {
        self.codes
            .iter()
            .find(|(c, ..)| *c == code)
            .map(|(_, good, _)| *good)
    }
}

/// What a destination drill hosts can be told to answer (`target: destination` faults).
#[derive(Debug)]
pub struct ScriptedAnswers {
    /// `answer: STATUS` and `answer_after: DELAY`: a status or a delay for every write.
    pub whole: bool,
    pub reject: RejectWords,
    /// `broker: WORD`: the states drill can put the broker in for a while, each with what it
    /// does (AMQP: `alarm`, `nack`, `queue_deleted`).
    pub states: &'static [(&'static str, &'static str)],
}

/// Under a `reject` fault, whether the record of turn `turn` (counted from 0 in arrival order
/// since the fault began) is rejected: exactly `per_million` of every million, spread evenly.
pub fn rejects_turn(turn: u64, per_million: u32) -> bool {
    let p = u64::from(per_million);
    (turn + 1) * p / 1_000_000 > turn * p / 1_000_000
}

impl AnswerFault {
    /// In a few words, for the timeline and the report: `answer 503`, `answer after 30s`.
    pub fn describe(&self) -> String {
        match self {
            AnswerFault::Status {
                code,
                retry_after: Some(r),
            } => format!("answer {code} (Retry-After {}s)", r.as_secs()),
            AnswerFault::Status { code, .. } => format!("answer {code}"),
            AnswerFault::After(d) => format!("answer after {}", crate::units::Dur(*d)),
            AnswerFault::Reject {
                code,
                per_million,
                words,
            } => format!(
                "reject {}% of records with {} {}",
                f64::from(*per_million) / 10_000.0,
                words.field,
                words.name(*code)
            ),
            AnswerFault::Broker { state } => format!("broker {state}"),
        }
    }
}

/// A destination drill hosts, told how to answer: `None` is answering normally again.
pub trait AnswerControl: Send + Sync {
    fn set(&self, fault: Option<AnswerFault>);
}

/// Where a broker runs (docs/src/design.md#2-parts). `auto` picks the best one available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    Auto,
    Container,
    Process,
    Embedded,
    /// Brokers the user already runs, at the addresses the scenario gives (scenario only).
    #[value(skip)]
    External,
}

/// What the rest of the scenario says that the destination's settings depend on.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The longest stretch one fault keeps the destination out of reach.
    pub longest_outage: Duration,
    /// The built-in engine's longest backoff after a refusal.
    pub longest_backoff: Duration,
    /// The built-in engine's answer timeout.
    pub answer_timeout: Duration,
}

/// What a drill needs of its broker beyond the destination's own settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// Refuse (per record) any write larger than this: how a drill makes poison records.
    pub message_limit: Option<usize>,
    /// The scenario kills, stops or pauses the broker.
    pub broker_faults: bool,
    /// … and one of those is a pause (a container's freezer).
    pub pauses: bool,
    /// The longest outage plus the longest backoff: what a resend must survive (a stream's
    /// duplicate window is judged against it).
    pub resend_after: Duration,
    /// A destination fault is on the timeline: drill must answer for the destination (MQTT:
    /// its embedded broker).
    pub answers: bool,
}

/// What provisioning is given.
pub struct Provision<'a> {
    pub spec: &'a Spec,
    pub needs: Needs,
    /// The runtime in force (`--runtime`, else the scenario's).
    pub runtime: Runtime,
    /// The drill's work folder: broker configs and stores go under it.
    pub work: &'a Path,
    /// The drill's run id: containers are labelled with it.
    pub run_id: &'a str,
    /// Cancels every link's tasks.
    pub links: CancellationToken,
    /// The broker is to speak TLS with these certificates (`destination.tls`; minted for the
    /// drill). A kind that takes `tls` serves it or fails with [`DestError::Unsupported`].
    pub tls: Option<&'a crate::tls::BrokerTls>,
    /// What a client of the broker trusts and shows over TLS (the minted CA, or the user's CA
    /// and client certificate for a broker they run): drill's own set-up connections use it.
    pub client_tls: Option<crate::tls::TlsConfig>,
}

/// A provisioned destination: the links in front of it, and its running receiving side.
pub struct Provisioned {
    /// One per broker listener the engine uses; the first is the one it forwards to.
    pub links: Vec<Link>,
    pub running: Running,
    /// What the report should say about how the broker was set up.
    pub notes: Vec<String>,
}

/// Why a destination could not be provisioned or read (exit code 3).
#[derive(Debug, thiserror::Error)]
pub enum DestError {
    /// A program the kind needs is not installed: what to install.
    #[error("{0}")]
    Missing(String),
    #[error("container runtime: {0}")]
    ContainerUnavailable(String),
    /// The scenario asks something this runtime cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The scenario is wrong in a way only the destination could tell (a read-back query that
    /// fails, a table that exists): bad input, exit 2.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Start(#[from] crate::process::StartError),
    #[error("proxy: {0}")]
    Proxy(#[from] crate::proxy::ProxyError),
    /// An external broker could not be reached or used as the scenario says.
    #[error("external broker: {0}")]
    External(String),
    #[error("reader: {0}")]
    Reader(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How the reader is to find records: the drill's decoder and clock.
pub struct ReaderSpec {
    /// The topic, subject or stream's subject the drill writes to.
    pub topic: String,
    pub decoder: Decoder,
    /// The drill's start (monotonic, for live readers).
    pub t0: std::time::Instant,
    /// The drill's start as wall time (for readers that read the broker's own timestamps).
    pub t0_wall: std::time::SystemTime,
    /// Cancels a live reader.
    pub cancel: CancellationToken,
}

/// The read-back of one drill: subscribed (or ready to read) before the first record, straight
/// from the broker.
pub trait ReadBack: Send + Sync {
    /// How many copies have arrived so far, where that can be known without reading them
    /// (`None`: it cannot, e.g. Kafka's reported end offsets are not trusted). Bounded: a
    /// progress line must never wait on a broker that is down.
    fn count(&self) -> BoxFuture<'_, Option<usize>>;

    /// The broker's addresses now, after a step of the timeline (a restarted container may
    /// have come back on another host port): a reader that connects anew for each count
    /// follows them.
    fn moved(&self, _addrs: &[SocketAddr]) {}

    /// Everything that arrived, reading from `addrs` (the broker's addresses now: a restarted
    /// container may have moved).
    fn finish(self: Box<Self>, addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received>;
}

/// One destination kind with its settings, as a scenario configured it: the scenario's rules,
/// its broker, its reader.
pub trait Destination: std::fmt::Debug + Send + Sync {
    fn kind(&self) -> Kind;

    /// The proxy links in front of the broker(s): `mqtt`; `nats-1` … for a cluster.
    fn link_names(&self) -> Vec<String> {
        vec![self.kind().name().to_string()]
    }

    /// Whether this destination's links carry datagrams (UDP, [`Link::start_udp`]) rather than
    /// byte streams. A scenario's link faults are checked against it at parse: a fault that
    /// needs a stream (`reset`, `hang`, `throttle`, `strand`) is refused on datagram links,
    /// and `loss` and `blackhole` on stream links ([`crate::proxy::Fault::on_datagrams`],
    /// [`crate::proxy::Fault::on_streams`]). A kind that answers `true` must provision its
    /// links with [`Link::start_udp`].
    fn datagram_links(&self) -> bool {
        false
    }

    /// Whether a TLS client of this kind starts its handshake the moment it connects (MQTT),
    /// so a link can stand in for the broker's TLS server (`bad_certificate`). NATS does not:
    /// the server speaks first, in plain text.
    fn tls_at_connect(&self) -> bool {
        false
    }

    /// Whether a fault may name `link` (Kafka: also one broker's own link, `kafka-<node id>`).
    fn names_a_link(&self, link: &str) -> bool {
        self.link_names().iter().any(|l| l == link)
    }

    /// What else a link may be called, for the error that lists the links (` (and …)`).
    fn other_link_names(&self) -> &'static str {
        ""
    }

    /// Broker nodes a broker fault may name by number (a cluster's size).
    fn nodes(&self) -> usize {
        1
    }

    /// The promise the built-in engine declares when the scenario says none.
    fn builtin_promise(&self) -> Promise {
        Promise::AtLeastOnce
    }

    /// The strongest promise any engine writing here can keep, where the destination itself
    /// bounds it (a receiver that never confirms a write: `at_most_once`), and why; a scenario
    /// that declares more is invalid. `None`: the engine's output decides.
    fn promise_bound(&self) -> Option<(Promise, &'static str)> {
        None
    }

    /// Whether the destination confirms each write. One that cannot (plain TCP, UDP) is judged
    /// apart: a missing record the engine sent without confirmation is counted as *sent but
    /// not confirmed*, not lost, and the report never says "nothing lost"
    /// (docs/src/design.md#2-parts).
    fn confirms(&self) -> bool {
        true
    }

    /// The built-in engine's output for this destination, adjusted for the kind's settings
    /// (a syslog destination's transport).
    fn output_options(&self, _cfg: &mut OutputConfig) {}

    /// Whether the broker refuses one oversized write while it accepts the rest: poison
    /// records need it. `Err` says what to write instead.
    fn refuses_one_write(&self) -> Result<(), &'static str> {
        Ok(())
    }

    /// The built-in engine's open attempts at once when the scenario gives no `window`.
    fn default_window(&self) -> usize {
        64
    }

    /// What drill can make this destination answer (`target: destination` faults: `answer:
    /// 503`, `answer_after: 30s`, `reject`), where drill hosts it. A kind that answers `Some`
    /// gives [`Running::answers`] whenever the scenario has such a fault.
    fn scripted_answers(&self) -> Option<&'static ScriptedAnswers> {
        None
    }

    /// Settles what depends on the rest of the scenario (NATS: the duplicate window).
    fn settle(&self, shape: &Shape) -> Arc<dyn Destination>;

    /// Where the built-in engine puts the write key.
    fn builtin_write_key(&self) -> WriteKeyPlace;

    /// The place `system.write_key.<field>: value` names; `Err` says what to write.
    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String>;

    /// Whether the reader's arrival times are the destination's own (a JetStream stream's
    /// store time, a subscriber's receipt), so that a record delivered while the link was cut
    /// proves a bypass; Kafka's are the producer's timestamps.
    fn arrivals_timed_by_destination(&self) -> bool {
        true
    }

    /// The broker's container image: the variable naming one and the official one (`None`:
    /// drill runs no broker container for this kind).
    fn image(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Starts (or reaches) the broker and puts the links in front of it.
    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>>;

    /// The reader, subscribed (or ready to read) before the first record.
    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>>;

    /// The node (from 0) that leads the drill's data now, for `node: leader`.
    fn leader<'a>(&'a self, _at: &'a Running) -> BoxFuture<'a, Option<usize>> {
        Box::pin(async { None })
    }
}

/// Where the broker runs: a container ([`crate::container::Placement`]) or `None` for a local
/// process (or the embedded broker). `auto` takes a container when a Docker engine answers and
/// the image is present or can be pulled, and says in one line why not otherwise.
pub async fn place(
    image: (&str, &str),
    local: &str,
    runtime: Runtime,
    notes: &mut Vec<String>,
) -> Result<Option<crate::container::Placement>, DestError> {
    use crate::container;
    let (var, official) = image;
    let image = container::image_for(var, official);
    match runtime {
        Runtime::Process | Runtime::Embedded | Runtime::External => Ok(None),
        Runtime::Container => {
            let docker = container::daemon().await.map_err(|why| {
                DestError::ContainerUnavailable(format!(
                    "{why}; start Docker (or set DOCKER_HOST), or use --runtime process"
                ))
            })?;
            let image_id = container::ensure_image(&docker, &image)
                .await
                .map_err(|why| {
                    DestError::ContainerUnavailable(format!(
                        "{why}; pull it, set {var} to an image you have, or use --runtime process"
                    ))
                })?;
            Ok(Some(container::Placement {
                docker,
                image,
                image_id,
            }))
        }
        Runtime::Auto => {
            // One line, what was chosen and why; the registry's words are for `--runtime
            // container`, which fails with them.
            let why = match container::daemon().await {
                Ok(docker) => match container::ensure_image(&docker, &image).await {
                    Ok(image_id) => {
                        return Ok(Some(container::Placement {
                            docker,
                            image,
                            image_id,
                        }));
                    }
                    Err(_) => format!("Docker has no image {image} and cannot pull it"),
                },
                Err(_) => "no Docker engine answers".to_string(),
            };
            notes.push(format!(
                "runtime auto: using {local}, because {why} (--runtime container says more)"
            ));
            Ok(None)
        }
    }
}

/// Broker faults need a broker drill can kill on its own: a container (a pause, too) or a
/// cluster's node.
pub fn check_broker_faults(needs: &Needs, container: bool, nodes: usize) -> Result<(), DestError> {
    if needs.broker_faults && !container && (nodes < 2 || needs.pauses) {
        return Err(DestError::ContainerUnavailable(
            "broker faults need the container runtime (pause too) or a NATS cluster (kill, stop); use --runtime container".to_string(),
        ));
    }
    Ok(())
}

/// Every kind's sink, by name: what `drill engine` runs with.
pub struct Registry;

/// The destination kinds of this build, for the engine.
pub static SINKS: Registry = Registry;

impl Sinks for Registry {
    fn kind(&self, name: &str) -> Option<&dyn SinkKind> {
        Kind::parse(name).map(Kind::sink)
    }

    fn names(&self) -> Vec<&'static str> {
        Kind::ALL.iter().map(|k| k.name()).collect()
    }
}

/// One data-free probe of an output's destination, exactly as its worker makes it before
/// (re)connecting: MQTT CONNECT + PINGREQ, a JetStream account-info request, a Kafka metadata
/// request. For tests that show a probe writes nothing.
pub async fn probe(cfg: &OutputConfig) -> Result<(), String> {
    let kind = SINKS
        .kind(&cfg.kind)
        .ok_or_else(|| format!("unknown kind `{}`", cfg.kind))?;
    kind.probe(cfg).await
}
