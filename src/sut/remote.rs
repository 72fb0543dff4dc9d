//! A user's engine run by a `drill agent` on another host (`system: { agent: URL, command: … }`),
//! and the words drill and the agent speak about it.
//!
//! drill sends the agent the engine's argv, env and files as templates with the placeholder
//! values only drill knows (links, topic, run); the agent fills in its own (`{ingest}`,
//! `{port.NAME}`, `{data_dir}`, `{work_dir}` on its host), starts the engine there as a
//! [`super::CommandEngine`] and publishes the engine's loopback ports on its own address for
//! this drill (the relay takes connections from the drill's address only). Every control of
//! the engine — start, SIGKILL, SIGTERM, SIGSTOP/SIGCONT, power cut, full disk, emptying its
//! data directory — is one call. The engine is held under a lease a keeper task renews every
//! second: a drill that crashes, is killed or loses its network leaves no engine running on the
//! agent's host (the agent SIGKILLs it and unmounts its power-cut filesystem once renewals
//! stop).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Account, AccountSource, SutError};
use crate::powerfs::CutReport;
use crate::scenario::{Ready, StatsSpec};

/// How long the agent keeps the engine without a renewal.
pub const LEASE: Duration = Duration::from_secs(5);

/// The longest a start may take on the agent beyond the engine's own `ready.within`.
const CALL_SLACK: Duration = Duration::from_secs(10);

/// `PUT /engine`: the engine to run, as templates and drill's placeholder values.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineOrder {
    /// The drill's run id: names the agent's folder, and the holder in a refusal.
    pub run: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Template files: name in `{work_dir}` ← template text.
    pub files: Vec<(String, String)>,
    /// The placeholder values drill knows (`link.*`, `topic`, `run`, …).
    pub values: BTreeMap<String, String>,
    /// Every `{port.NAME}` name: the agent picks a free port for each.
    pub ports: Vec<String>,
    pub ready: Ready,
    pub ready_within_ms: u64,
    pub stop_grace_ms: u64,
    /// Put the data directory on the power-cut filesystem (a `power_cut` or `fill_disk`).
    pub power: bool,
    pub lease_ms: u64,
}

/// The header every call about a held engine carries: the lease its order was given. A call
/// with another lease (a drill whose lease ran out, calling about the next drill's engine) is
/// refused.
pub const LEASE_HEADER: &str = "x-drill-lease";

/// The answer to an [`EngineOrder`]: the engine runs and is ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineSlot {
    /// This drill's hold on the engine: sent with every later call ([`LEASE_HEADER`]).
    pub lease: String,
    /// Where drill sends records (the relay of the engine's ingest port).
    pub ingest: SocketAddr,
    /// The relay of each `{port.NAME}`.
    pub ports: BTreeMap<String, SocketAddr>,
    /// The engine's data directory on the agent's host.
    pub data_dir: PathBuf,
    /// One line: what runs there.
    pub describe: String,
}

/// `GET /engine`: the engine the agent holds, if any.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EngineState {
    /// The run that holds the engine (`None`: the agent holds none).
    pub run: Option<String>,
    pub running: bool,
    /// Why it ended by itself, once it did (cleared by the next start).
    pub exited: Option<String>,
    /// How many times it was started: tells one exit from the next.
    pub starts: u64,
}

/// `POST /engine/act`: one control of the engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "act", rename_all = "snake_case")]
pub enum EngineAct {
    /// (Re)start with the same argv and data directory; answered once ready.
    Start,
    Kill,
    Stop {
        grace_ms: u64,
    },
    Pause,
    Resume,
    /// Throw away what the engine wrote and did not sync (the engine is killed first).
    PowerCut {
        torn: bool,
    },
    FillDisk,
    DiskBack,
    /// Empty the data directory.
    Wipe,
    /// A line in the engine's log.
    Note {
        line: String,
    },
}

/// The answer to an [`EngineAct`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ActDone {
    pub cut: Option<CutReport>,
    /// How many times the engine was started, after the act.
    pub starts: u64,
}

/// Where the engine's agent is and how to reach it.
pub struct AgentAt<'a> {
    /// `http://HOST:PORT`.
    pub api: &'a str,
    pub token: Option<String>,
    /// The engine's stats endpoint, read through the relay.
    pub stats: Option<&'a StatsSpec>,
    /// Where the engine's log is copied at the end (drill's report folder).
    pub log_path: PathBuf,
}

/// A user's engine on an agent's host.
pub struct RemoteEngine {
    api: String,
    token: Option<String>,
    http: reqwest::Client,
    slot: EngineSlot,
    stats_url: Option<String>,
    stats_fields: Option<StatsSpec>,
    stop_grace: Duration,
    ready_within: Duration,
    log_path: PathBuf,
    /// What the keeper read last, and the start whose exit drill already told (or that a
    /// kill ended, or that a restart replaced).
    state: Arc<Mutex<EngineState>>,
    told_exit: u64,
    running: bool,
    /// A kill or stop the agent did not carry out: the drill cannot go on as scripted.
    not_carried_out: Option<String>,
    /// Errors of the keeper's calls (renewals, reads), for the log.
    keeper_errors: Arc<Mutex<Vec<String>>>,
    cancel: CancellationToken,
}

impl RemoteEngine {
    /// Asks the agent to run `order`; returns once the engine is ready there. A refused token,
    /// an agent holding another drill's engine or an engine that did not start are errors.
    pub async fn start(order: EngineOrder, at: AgentAt<'_>) -> Result<RemoteEngine, SutError> {
        let api = at.api.trim_end_matches('/').to_string();
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| SutError::Start(e.to_string()))?;
        let limit = Duration::from_millis(order.ready_within_ms) + CALL_SLACK;
        // An engine an earlier drill left there ends when its lease runs out: wait that long.
        let deadline = std::time::Instant::now() + LEASE + Duration::from_secs(2);
        let sent = loop {
            let request = authorized(http.put(format!("{api}/engine")), &at.token, None)
                .json(&order)
                .timeout(limit);
            let sent = request.send().await;
            let busy = matches!(&sent, Ok(r) if r.status() == reqwest::StatusCode::CONFLICT);
            if !busy || std::time::Instant::now() > deadline {
                break sent;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let slot: EngineSlot = answer(sent, &api, "PUT /engine")
            .await?
            .json()
            .await
            .map_err(|e| SutError::Start(format!("drill agent at {api}: {e}")))?;
        let stats_url = at.stats.map(|s| {
            let addr = match &s.port {
                Some(name) => slot.ports.get(name).copied().unwrap_or(slot.ingest),
                None => slot.ingest,
            };
            format!("http://{addr}{}", s.path)
        });
        let engine = RemoteEngine {
            api,
            token: at.token,
            http,
            slot,
            stats_url,
            stats_fields: at.stats.cloned(),
            stop_grace: Duration::from_millis(order.stop_grace_ms),
            ready_within: Duration::from_millis(order.ready_within_ms),
            log_path: at.log_path,
            state: Arc::new(Mutex::new(EngineState {
                run: Some(order.run.clone()),
                running: true,
                exited: None,
                starts: 1,
            })),
            told_exit: 0,
            running: true,
            not_carried_out: None,
            keeper_errors: Arc::new(Mutex::new(Vec::new())),
            cancel: CancellationToken::new(),
        };
        engine.keep();
        Ok(engine)
    }

    /// Renews the lease and reads the engine's state once a second, until the engine is
    /// released or dropped.
    fn keep(&self) {
        let (http, api, token) = (self.http.clone(), self.api.clone(), self.token.clone());
        let lease = self.slot.lease.clone();
        let (state, errors, cancel) = (
            self.state.clone(),
            self.keeper_errors.clone(),
            self.cancel.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let limit = LEASE / 4;
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let renew = authorized(
                    http.post(format!("{api}/engine/lease")),
                    &token,
                    Some(&lease),
                )
                .timeout(limit)
                .send()
                .await;
                if let Err(why) = status_of(renew) {
                    lock(&errors).push(format!("lease renewal: {why}"));
                }
                let read = authorized(http.get(format!("{api}/engine")), &token, Some(&lease))
                    .timeout(limit)
                    .send()
                    .await;
                match read {
                    Ok(r) if r.status().is_success() => {
                        if let Ok(s) = r.json::<EngineState>().await {
                            *lock(&state) = s;
                        }
                    }
                    Ok(r) => lock(&errors).push(format!("GET /engine: {}", r.status())),
                    Err(e) => lock(&errors).push(format!("GET /engine: {e}")),
                }
            }
        });
    }

    async fn act(&self, act: EngineAct, limit: Duration) -> Result<ActDone, SutError> {
        let what = format!("{act:?}");
        let request = self
            .authorized(self.http.post(format!("{}/engine/act", self.api)))
            .json(&act)
            .timeout(limit);
        answer(request.send().await, &self.api, &what)
            .await?
            .json()
            .await
            .map_err(|e| SutError::Start(format!("drill agent at {}: {what}: {e}", self.api)))
    }

    fn authorized(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        authorized(r, &self.token, Some(&self.slot.lease))
    }

    /// One line for the console.
    pub fn describe(&self) -> String {
        format!("on drill agent {}: {}", self.api, self.slot.describe)
    }

    pub fn ingest_addr(&self) -> SocketAddr {
        self.slot.ingest
    }

    /// The data directory on the agent's host.
    pub fn data_dir(&self) -> &Path {
        &self.slot.data_dir
    }

    pub fn is_running(&self) -> bool {
        self.running
    }

    pub fn stop_grace(&self) -> Duration {
        self.stop_grace
    }

    pub fn gives_account(&self) -> bool {
        self.stats_url.is_some()
    }

    /// (Re)starts it on the agent; returns once ready.
    pub async fn spawn(&mut self) -> Result<(), SutError> {
        let done = self
            .act(EngineAct::Start, self.ready_within + CALL_SLACK)
            .await?;
        // An exit the keeper saw before this start is not this start's.
        self.told_exit = self.told_exit.max(done.starts.saturating_sub(1));
        self.running = true;
        Ok(())
    }

    /// SIGKILL to the engine's process group there. One the agent did not carry out ends the
    /// drill (see [`RemoteEngine::exited`]); the lease still ends the engine.
    pub async fn kill(&mut self) {
        self.ended_by(EngineAct::Kill, CALL_SLACK).await;
    }

    /// SIGTERM, SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        let grace_ms = grace.as_millis() as u64;
        self.ended_by(EngineAct::Stop { grace_ms }, grace + CALL_SLACK)
            .await;
    }

    async fn ended_by(&mut self, act: EngineAct, limit: Duration) {
        let what = format!("{act:?}");
        match self.act(act, limit).await {
            // Whatever this start did before it was ended is not an exit to tell.
            Ok(done) => self.told_exit = self.told_exit.max(done.starts),
            Err(e) if self.running => {
                self.not_carried_out = Some(format!(
                    "the agent did not carry out {what}, so the drill cannot go on as scripted: {e}"
                ));
            }
            Err(e) => lock(&self.keeper_errors).push(e.to_string()),
        }
        self.running = false;
    }

    async fn act_or_note(&self, act: EngineAct, limit: Duration) {
        if let Err(e) = self.act(act, limit).await {
            lock(&self.keeper_errors).push(e.to_string());
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to the engine's process group there.
    pub async fn pause(&self, paused: bool) -> Result<(), SutError> {
        let act = if paused {
            EngineAct::Pause
        } else {
            EngineAct::Resume
        };
        self.act(act, CALL_SLACK).await.map(|_| ())
    }

    /// A disk fault on the engine's data directory there (`PowerCut`, `FillDisk`, `DiskBack`,
    /// `Wipe`); a power cut answers what it threw away.
    pub async fn disk(&self, act: EngineAct) -> Result<Option<CutReport>, SutError> {
        Ok(self.act(act, CALL_SLACK).await?.cut)
    }

    /// `Some(why)` once, when the keeper saw the engine end by itself.
    pub fn exited(&mut self) -> Option<String> {
        if let Some(why) = self.not_carried_out.take() {
            return Some(format!("on drill agent {}: {why}", self.api));
        }
        let s = lock(&self.state).clone();
        if s.run.is_none() && self.running {
            // The agent holds no engine for this drill any more: its lease ran out.
            self.running = false;
            return Some(format!(
                "drill agent at {} no longer holds the engine (its lease ran out: {})",
                self.api,
                lock(&self.keeper_errors)
                    .last()
                    .cloned()
                    .unwrap_or_default()
            ));
        }
        match s.exited {
            Some(why) if s.starts > self.told_exit && self.running => {
                self.told_exit = s.starts;
                self.running = false;
                Some(format!("on drill agent {}: {why}", self.api))
            }
            _ => None,
        }
    }

    /// The engine's account through the relay of its stats port.
    pub fn account_source(&self) -> AccountSource {
        AccountSource::stats(&self.stats_url, &self.stats_fields)
    }

    pub async fn account(&self) -> Option<Account> {
        self.account_source().fetch(&self.http).await
    }

    /// drill's own note in the engine's log there.
    pub async fn note(&self, line: &str) {
        let line = line.to_string();
        self.act_or_note(EngineAct::Note { line }, CALL_SLACK).await;
    }

    /// Ends the engine on the agent (SIGTERM, then SIGKILL), copies its log to drill's report
    /// folder (with the keeper's errors, if any) and gives the agent back.
    pub async fn release(&mut self) {
        self.cancel.cancel();
        let log = self
            .authorized(self.http.get(format!("{}/engine/log", self.api)))
            .timeout(CALL_SLACK)
            .send()
            .await;
        let mut text = match log {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            Ok(r) => format!("drill: the agent's log could not be read: {}\n", r.status()),
            Err(e) => format!("drill: the agent's log could not be read: {e}\n"),
        };
        for e in lock(&self.keeper_errors).iter() {
            text.push_str(&format!("drill: agent call: {e}\n"));
        }
        let _ = std::fs::write(&self.log_path, text);
        let end = self
            .authorized(self.http.delete(format!("{}/engine", self.api)))
            .timeout(self.stop_grace + CALL_SLACK)
            .send()
            .await;
        if let Err(why) = status_of(end) {
            eprintln!(
                "drill: the agent at {} did not end the engine ({why}); its lease ends it within {:?}",
                self.api, LEASE
            );
        }
        self.running = false;
    }
}

impl Drop for RemoteEngine {
    /// Stops renewing: the agent ends the engine once the lease runs out.
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `r` with the agent's token and, for calls about a held engine, its lease.
fn authorized(
    r: reqwest::RequestBuilder,
    token: &Option<String>,
    lease: Option<&str>,
) -> reqwest::RequestBuilder {
    let r = match token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    match lease {
        Some(l) => r.header(LEASE_HEADER, l),
        None => r,
    }
}

fn status_of(r: reqwest::Result<reqwest::Response>) -> Result<(), String> {
    match r {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(r.status().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The response when it is a success; else the agent's own words (its body), or why it did not
/// answer. A refused token is bad input; the rest is an engine that could not be driven.
async fn answer(
    r: reqwest::Result<reqwest::Response>,
    api: &str,
    what: &str,
) -> Result<reqwest::Response, SutError> {
    let r = r.map_err(|e| {
        SutError::Start(format!(
            "drill agent at {api} did not answer {what}: {}",
            without_url(&e)
        ))
    })?;
    if r.status().is_success() {
        return Ok(r);
    }
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    let body = body.trim();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(SutError::Refused(format!(
            "drill agent at {api} refused the token (401); set the variable `system.token_env` names to the agent's --token"
        )));
    }
    Err(SutError::Start(format!(
        "drill agent at {api}: {what}: {status}: {body}"
    )))
}

fn without_url(e: &reqwest::Error) -> String {
    let mut e = format!("{e}");
    if let Some(cut) = e.find(" for url") {
        e.truncate(cut);
    }
    e
}
