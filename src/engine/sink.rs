//! What the engine asks of a destination: [`Sink`] (connect, with a data-free probe) and
//! [`Session`] (send, answers, keepalive), and how a build names the kinds it has ([`Sinks`]).
//!
//! The engine's one session loop (`session.rs`) is generic over a [`Sink`]; each destination
//! kind implements it in its own folder (`src/dest/<kind>/sink.rs`), and the build's registry
//! (`dest::SINKS`) is handed to [`run`](super::run). The engine's logic branches on no kind
//! and speaks no protocol: it knows records, attempts and answers. `OutputConfig` carries the
//! few settings only one kind reads (`transport`, `key_header`); every other kind's
//! [`Sink::check`] refuses them.
//!
//! What every implementation must keep (docs/src/design.md#1-engine-rules):
//! - [`Sink::connect`] returns a session only after a round trip that writes nothing (MQTT
//!   CONNACK and PINGRESP, a JetStream account-info answer, a Kafka metadata answer). A failed
//!   connect is an outage: it spends no attempt.
//! - [`Session::send`] puts each attempt on the wire at most once, carrying the record's write
//!   key in the protocol's place. A record the destination refuses before it leaves the
//!   machine (too large for the client) is answered at once as a refusal.
//! - [`Session::answers`] reports what the destination said, per attempt tag, and nothing it
//!   did not say: a lost connection, a timeout or silence is `Err` (the loop ends every open
//!   attempt `possibly_sent`), never a refusal and never a delivery. It must be cancel-safe:
//!   the loop drops it when other work wins.
//! - [`Session::tick`] (every 100 ms) keeps the connection honest: keepalive probes, answer
//!   timeouts.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::OutputConfig;
use super::log::StoredRecord;
use super::output::Answer;
use crate::promise::Promise;

/// Attempts handed to [`Session::send`]: each record with the tag its answer will name.
pub type Attempts = Vec<(u16, Arc<StoredRecord>)>;

/// Answers collected by [`Session::send`] and [`Session::answers`]: the attempt's tag and
/// what the destination said.
pub type Answers = Vec<(u16, Answer)>;

/// What a connect is given.
pub struct Connect<'a> {
    pub cfg: &'a OutputConfig,
    /// The client id / connection name (`drill-engine-<output>` unless configured).
    pub client_id: &'a str,
    /// The oldest record waiting, for the `probe-with-oldest-record` mutant only.
    #[cfg(feature = "mutants")]
    pub oldest: Option<&'a StoredRecord>,
}

/// The open attempts at a tick.
#[derive(Debug, Clone, Copy)]
pub struct Open {
    /// How many attempts await their answer.
    pub in_flight: usize,
    /// How long the oldest of them has waited.
    pub oldest_waited: Option<Duration>,
}

/// What a tick found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick {
    /// The connection is sound as far as can be told.
    Fine,
    /// The connection is to be treated as lost, for this reason.
    Lost(String),
    /// MUTANT `local-connected-flag`: count every attempt unanswered this long as refused.
    #[cfg(feature = "mutants")]
    RefuseUnanswered(Duration),
}

/// A destination the engine can write to: how to reach it, and what it can promise. Every
/// `Sink` is a [`SinkKind`] (the engine's registry entry) by the blanket impl below.
pub trait Sink: Send + Sync + Clone + 'static {
    type Session: Session;

    /// What a lost session is called in the engine's log (`connection`, `producer session`).
    const SESSION: &'static str = "connection";

    /// The strongest promise an output of this kind can keep, and why not more
    /// (docs/src/design.md#rule-1-7: declaring more is a configuration error).
    const PROMISE: (Promise, &'static str);

    /// The strongest promise this output can keep, where its settings decide it (a syslog
    /// output's transport); the kind's [`Sink::PROMISE`] otherwise.
    fn promise_for(&self, _cfg: &OutputConfig) -> (Promise, &'static str) {
        Self::PROMISE
    }

    /// Refuses settings of the output this kind cannot honour (`transport` on a kind that has
    /// one way to reach its destination): what is wrong, in one line.
    fn check(&self, cfg: &OutputConfig) -> Result<(), String> {
        if cfg.key_header.is_some() {
            return Err("`key_header`: only an http output takes it; leave it out".to_string());
        }
        match &cfg.transport {
            Some(t) => Err(format!(
                "`transport: {t}`: this kind has one transport; leave it out"
            )),
            None => Ok(()),
        }
    }

    /// Deliveries in flight when the config gives no `window`: as many as the destination
    /// takes without harm, so draining a backlog runs at the client library's speed.
    const DEFAULT_WINDOW: usize;

    /// Whether the sink speaks TLS when its output has `tls:` (the output's files are read at
    /// each connect, through [`OutputConfig::client_tls`]).
    const TLS: bool = false;

    /// What an output with `tls:` is told when the sink speaks none (`TLS` false): why, and
    /// what to do.
    const NO_TLS: &'static str =
        "`tls`: this engine speaks no TLS to this kind of output yet; leave it out";

    /// Connects and makes one data-free probe round trip (see the module docs).
    fn connect<'a>(
        &'a self,
        to: Connect<'a>,
    ) -> impl Future<Output = Result<Self::Session, String>> + Send + 'a;
}

/// One connected session with a destination.
pub trait Session: Send {
    /// At most this many open attempts at once, when the destination said so (MQTT's Receive
    /// Maximum).
    fn window(&self) -> Option<usize> {
        None
    }

    /// Puts `attempts` on the wire, in order. Refusals that never left the machine go into
    /// `answers`. `Err`: the session is lost (attempts not sent stay open and end
    /// `possibly_sent`).
    fn send(
        &mut self,
        attempts: &mut Attempts,
        answers: &mut Answers,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// Waits for the next answers and appends every one already in (one batch, so a burst
    /// costs one write of delivery marks). `Err` after the answers before the loss: the session
    /// is lost. Cancel-safe.
    fn answers(&mut self, into: &mut Answers) -> impl Future<Output = Result<(), String>> + Send;

    /// Every 100 ms while connected: keepalive probes and answer timeouts.
    fn tick(&mut self, now: Instant, open: Open) -> impl Future<Output = Tick> + Send;

    /// The engine is stopping: say goodbye where the protocol has a way.
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// One destination kind as the engine sees it: its promise, its window, and how to start an
/// output's worker on it.
pub trait SinkKind: Sync {
    /// The strongest promise an output of this kind, with these settings, can keep, and why
    /// not more (docs/src/design.md#rule-1-7: declaring more is a configuration error).
    fn strongest_promise(&self, cfg: &OutputConfig) -> (Promise, &'static str);

    /// Refuses settings the kind cannot honour (see [`Sink::check`]).
    fn check(&self, cfg: &OutputConfig) -> Result<(), String>;

    /// Deliveries in flight when the config gives no `window`: as many as the destination
    /// takes without harm, so draining a backlog runs at the client library's speed.
    fn default_window(&self) -> usize;

    /// Starts the output's worker: the session loop over this kind's sink.
    fn spawn(&self, task: super::session::OutputTask) -> tokio::task::JoinHandle<()>;

    /// One data-free probe, exactly as the worker makes it before (re)connecting.
    fn probe<'a>(
        &'a self,
        cfg: &'a OutputConfig,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

/// The destination kinds a build has, by the name `engine.yaml` gives (`kind: mqtt`).
pub trait Sinks: Sync {
    fn kind(&self, name: &str) -> Option<&dyn SinkKind>;

    /// Every kind's name, for the error that names an unknown one.
    fn names(&self) -> Vec<&'static str>;
}

/// A sink is its kind's registry entry: its promise and window, its worker (the session loop
/// over it), and its probe (a connect, the session dropped).
impl<S: Sink> SinkKind for S {
    fn strongest_promise(&self, cfg: &OutputConfig) -> (Promise, &'static str) {
        self.promise_for(cfg)
    }

    fn check(&self, cfg: &OutputConfig) -> Result<(), String> {
        if cfg.tls.is_some() && !S::TLS {
            return Err(S::NO_TLS.to_string());
        }
        // The CA and client certificate files must parse now, not at the first connect.
        cfg.client_tls().map_err(|why| format!("`tls`: {why}"))?;
        Sink::check(self, cfg)
    }

    fn default_window(&self) -> usize {
        S::DEFAULT_WINDOW
    }

    fn spawn(&self, task: super::session::OutputTask) -> tokio::task::JoinHandle<()> {
        tokio::spawn(task.run(self.clone()))
    }

    fn probe<'a>(
        &'a self,
        cfg: &'a OutputConfig,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            let client_id = format!("drill-probe-{}", cfg.name);
            let to = Connect {
                cfg,
                client_id: &client_id,
                #[cfg(feature = "mutants")]
                oldest: None,
            };
            self.connect(to).await.map(drop)
        })
    }
}
