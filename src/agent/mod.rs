//! `drill agent`: a `drill proxy` that also runs one engine on its host for a drill elsewhere
//! (DESIGN.md §2, "past one machine"). It owns the engine's side of `sut::remote`: the slot
//! one drill holds under a lease, the engine's folders on this host, the power-cut filesystem
//! under its data directory, and the relays that publish the engine's loopback ports to that
//! drill.
//!
//! API beside the proxy's, behind the same token: `PUT /engine` (an [`EngineOrder`]: start it
//! and answer once ready), `POST /engine/act` (an [`EngineAct`]), `POST /engine/lease`,
//! `GET /engine` (an [`EngineState`]), `GET /engine/log`, `DELETE /engine` (stop it and give the
//! slot back). One engine at a time: an order while another drill holds the slot is a 409.
//! Once renewals stop for a lease, the agent SIGKILLs the engine's process group, gives back
//! the disk space and unmounts the power-cut filesystem: nothing a drill started outlives it.

mod relay;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use crate::powerfs::PowerFs;
use crate::process::free_port;
use crate::scenario::{CommandSpec, IngestSpec};
use crate::sut::command::Placement;
use crate::sut::remote::{ActDone, EngineAct, EngineOrder, EngineSlot, EngineState};
use crate::sut::{CommandEngine, SutError};

/// How often the agent looks for a lease that ran out and an engine that ended by itself.
const WATCH: Duration = Duration::from_millis(100);

/// The longest lease an engine may be held under.
const LEASE_MAX: Duration = Duration::from_secs(3600);

/// The engine a drill holds here.
struct Slot {
    run: String,
    engine: CommandEngine,
    /// The power-cut filesystem under the data directory, when the order asked for one.
    disk: Option<PowerFs>,
    /// This run's folder (`engine.log`, `work/`, `engine-data/`).
    folder: PathBuf,
    /// Ends the relays.
    relays: CancellationToken,
}

impl Slot {
    /// Stops the engine (SIGTERM, SIGKILL after `grace`), gives the disk space back, unmounts
    /// and ends the relays.
    async fn end(mut self, grace: Duration) {
        self.engine.stop(grace).await;
        self.relays.cancel();
        if let Some(disk) = self.disk.take() {
            disk.release();
            disk.unmount();
        }
    }
}

/// The agent's engine side, shared by its handlers and its watcher.
#[derive(Clone)]
pub struct Agent {
    slot: Arc<tokio::sync::Mutex<Option<Slot>>>,
    /// What `GET /engine` answers, kept apart from the slot so a long start never blocks it.
    state: Arc<Mutex<EngineState>>,
    /// How long the lease lasts and when it runs out; `None` while no drill holds the slot
    /// or while the order is being started.
    lease: Arc<Mutex<Option<(Duration, Instant)>>>,
    /// Where each run's folder goes.
    work: PathBuf,
    /// drill's own executable, for `argv[0] == "drill"`.
    exe: PathBuf,
    /// The runtime the relays run on (the data path's, not the control plane's).
    data: tokio::runtime::Handle,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an order was not carried out: the status and one line.
type Refusal = (StatusCode, String);

fn problem(status: StatusCode, message: String) -> Response {
    (status, format!("{message}\n")).into_response()
}

impl Agent {
    /// An agent keeping its runs' folders under `work`, relaying on `data`.
    pub fn new(work: PathBuf, data: tokio::runtime::Handle) -> Result<Agent, String> {
        std::fs::create_dir_all(&work)
            .map_err(|e| format!("drill agent: cannot make --work {}: {e}", work.display()))?;
        let exe = std::env::current_exe()
            .map_err(|e| format!("drill agent: cannot find its own executable: {e}"))?;
        Ok(Agent {
            slot: Arc::default(),
            state: Arc::default(),
            lease: Arc::default(),
            work,
            exe,
            data,
        })
    }

    /// The engine routes, to merge with the proxy's before the token guard.
    pub fn router(self) -> Router {
        Router::new()
            .route("/engine", put(order).get(state).delete(end))
            .route("/engine/act", post(act))
            .route("/engine/lease", post(renew))
            .route("/engine/log", get(log))
            .with_state(self)
    }

    /// Ends an engine whose lease ran out, and notes one that ended by itself, until `cancel`.
    pub async fn watch(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(WATCH) => {}
            }
            let lapsed = lock(&self.lease).is_some_and(|(_, until)| until <= Instant::now());
            if lapsed {
                let mut slot = self.slot.lock().await;
                // Renewed meanwhile (a call that waited for the slot): keep it.
                if lock(&self.lease).is_some_and(|(_, until)| until > Instant::now()) {
                    continue;
                }
                if let Some(s) = slot.take() {
                    eprintln!(
                        "drill agent: the lease on run {}'s engine ran out (its drill stopped renewing it): SIGKILLed",
                        s.run
                    );
                    s.end(Duration::ZERO).await;
                }
                *lock(&self.lease) = None;
                *lock(&self.state) = EngineState::default();
                continue;
            }
            if let Ok(mut slot) = self.slot.try_lock()
                && let Some(s) = slot.as_mut()
                && let Some(why) = s.engine.exited()
            {
                let mut state = lock(&self.state);
                state.running = false;
                state.exited = Some(why);
            }
        }
        if let Some(s) = self.slot.lock().await.take() {
            s.end(Duration::from_secs(5)).await;
        }
    }

    /// A fresh folder for `run` under the work folder.
    fn folder(&self, run: &str) -> Result<PathBuf, String> {
        let name: String = run
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let folder = self.work.join(name.trim_start_matches('.'));
        if folder.exists() {
            std::fs::remove_dir_all(&folder)
                .map_err(|e| format!("cannot empty {}: {e}", folder.display()))?;
        }
        for dir in ["work", "engine-data", "engine-data.disk"] {
            std::fs::create_dir_all(folder.join(dir))
                .map_err(|e| format!("cannot make {}: {e}", folder.join(dir).display()))?;
        }
        Ok(folder)
    }

    /// Starts what `o` orders, for the drill at `peer`.
    async fn start(&self, o: &EngineOrder, peer: IpAddr) -> Result<(Slot, EngineSlot), Refusal> {
        let bad = |why: String| (StatusCode::BAD_REQUEST, why);
        let failed = |why: String| (StatusCode::UNPROCESSABLE_ENTITY, why);
        let host: IpAddr = o
            .host
            .trim_matches(['[', ']'])
            .parse()
            .map_err(|_| bad(format!("host `{}` is not an IP address", o.host)))?;
        let folder = self.folder(&o.run).map_err(failed)?;
        let (work, data) = (folder.join("work"), folder.join("engine-data"));
        let disk = if o.power {
            Some(PowerFs::mount(&folder.join("engine-data.disk"), &data).map_err(failed)?)
        } else {
            None
        };
        let io = |e: std::io::Error| failed(format!("no free port: {e}"));
        let ingest = SocketAddr::from(([127, 0, 0, 1], free_port().map_err(io)?));
        let mut ports = BTreeMap::new();
        for name in &o.ports {
            let mut port = free_port().map_err(io)?;
            while port == ingest.port() || ports.values().any(|p| *p == port) {
                port = free_port().map_err(io)?;
            }
            ports.insert(name.clone(), port);
        }
        let mut values = o.values.clone();
        values.insert("ingest".into(), ingest.to_string());
        values.insert("ingest.host".into(), ingest.ip().to_string());
        values.insert("ingest.port".into(), ingest.port().to_string());
        values.insert("data_dir".into(), data.display().to_string());
        values.insert("work_dir".into(), work.display().to_string());
        for (name, port) in &ports {
            values.insert(format!("port.{name}"), port.to_string());
        }
        let spec = CommandSpec {
            argv: o.argv.clone(),
            env: o.env.clone(),
            files: o.files.clone(),
            ingest: IngestSpec::TcpLines,
            ready: o.ready.clone(),
            ready_within: Duration::from_millis(o.ready_within_ms),
            stats: None,
            write_key: None,
            ports: o.ports.iter().cloned().collect::<BTreeSet<_>>(),
            stop_grace: Duration::from_millis(o.stop_grace_ms),
        };
        let placement = Placement {
            values: &values,
            ports: &ports,
            ingest,
            work_dir: &work,
            data_dir: &data,
            log_path: folder.join("engine.log"),
            drill_exe: &self.exe,
        };
        let engine = CommandEngine::start(&spec, placement)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let relays = CancellationToken::new();
        let relay = |to: u16| {
            relay::start(
                &self.data,
                SocketAddr::new(host, 0),
                SocketAddr::from(([127, 0, 0, 1], to)),
                peer,
                relays.clone(),
            )
            .map_err(|e| failed(format!("cannot publish port {to} on {host}: {e}")))
        };
        let published = relay(ingest.port())?;
        let answer = EngineSlot {
            ingest: published,
            ports: ports
                .iter()
                .map(|(n, p)| Ok((n.clone(), relay(*p)?)))
                .collect::<Result<_, Refusal>>()?,
            data_dir: data,
            describe: format!(
                "{}; published for this drill on {published}",
                engine.describe()
            ),
        };
        let slot = Slot {
            run: o.run.clone(),
            engine,
            disk,
            folder,
            relays,
        };
        Ok((slot, answer))
    }
}

async fn order(
    State(a): State<Agent>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Json(o): Json<EngineOrder>,
) -> Response {
    let lease = Duration::from_millis(o.lease_ms);
    if lease.is_zero() || lease > LEASE_MAX {
        return problem(
            StatusCode::BAD_REQUEST,
            format!("lease_ms must be 1..={}", LEASE_MAX.as_millis()),
        );
    }
    let mut slot = a.slot.lock().await;
    if let Some(held) = slot.as_ref() {
        return problem(
            StatusCode::CONFLICT,
            format!(
                "this agent runs the engine of drill run {} (its lease ends it once that drill stops renewing)",
                held.run
            ),
        );
    }
    match a.start(&o, peer.ip()).await {
        Ok((started, answer)) => {
            eprintln!(
                "drill agent: run {}: {} (for {})",
                o.run,
                answer.describe,
                peer.ip()
            );
            *slot = Some(started);
            *lock(&a.lease) = Some((lease, Instant::now() + lease));
            *lock(&a.state) = EngineState {
                run: Some(o.run.clone()),
                running: true,
                exited: None,
                starts: 1,
            };
            Json(answer).into_response()
        }
        Err((status, why)) => problem(status, why),
    }
}

async fn act(State(a): State<Agent>, Json(act): Json<EngineAct>) -> Response {
    let mut guard = a.slot.lock().await;
    let Some(slot) = guard.as_mut() else {
        return problem(StatusCode::NOT_FOUND, "no engine runs here".to_string());
    };
    match carry_out(slot, act, &a.state).await {
        Ok(done) => Json(done).into_response(),
        Err(e) => problem(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
    }
}

/// One control of the engine in `slot`; `state` follows.
async fn carry_out(
    slot: &mut Slot,
    act: EngineAct,
    state: &Mutex<EngineState>,
) -> Result<ActDone, SutError> {
    let no_disk = || {
        SutError::Start(
            "the engine's data directory is not on the power-cut filesystem here (the order asked for none)"
                .to_string(),
        )
    };
    let mut done = ActDone::default();
    let running = match act {
        EngineAct::Start => {
            slot.engine.spawn().await?;
            let mut s = lock(state);
            s.starts += 1;
            s.exited = None;
            true
        }
        EngineAct::Kill => {
            slot.engine.kill().await;
            false
        }
        EngineAct::Stop { grace_ms } => {
            slot.engine.stop(Duration::from_millis(grace_ms)).await;
            false
        }
        EngineAct::Pause | EngineAct::Resume => {
            slot.engine.pause(matches!(act, EngineAct::Pause));
            slot.engine.is_running()
        }
        EngineAct::PowerCut { torn } => {
            let disk = slot.disk.as_ref().ok_or_else(no_disk)?;
            // The engine dies first: a process holding a file open across the cut would keep
            // writing at the size the kernel remembers.
            slot.engine.kill().await;
            done.cut = Some(disk.power_cut(torn));
            false
        }
        EngineAct::FillDisk | EngineAct::DiskBack => {
            let disk = slot.disk.as_ref().ok_or_else(no_disk)?;
            if matches!(act, EngineAct::FillDisk) {
                disk.fill();
            } else {
                disk.release();
            }
            slot.engine.is_running()
        }
        EngineAct::Wipe => {
            empty(slot.engine.data_dir()).map_err(|e| SutError::Start(e.to_string()))?;
            slot.engine.is_running()
        }
        EngineAct::Note { line } => {
            slot.engine.note(&line);
            slot.engine.is_running()
        }
    };
    lock(state).running = running;
    Ok(done)
}

/// Removes everything inside `dir`.
fn empty(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

async fn renew(State(a): State<Agent>) -> Response {
    let mut lease = lock(&a.lease);
    match lease.as_mut() {
        Some((length, until)) => {
            *until = Instant::now() + *length;
            StatusCode::NO_CONTENT.into_response()
        }
        None => problem(
            StatusCode::NOT_FOUND,
            "no engine is held here under a lease (it ran out, or none was ordered)".to_string(),
        ),
    }
}

async fn state(State(a): State<Agent>) -> Json<EngineState> {
    Json(lock(&a.state).clone())
}

async fn log(State(a): State<Agent>) -> Response {
    let slot = a.slot.lock().await;
    let Some(s) = slot.as_ref() else {
        return problem(StatusCode::NOT_FOUND, "no engine runs here".to_string());
    };
    match std::fs::read(s.engine.log_path()) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn end(State(a): State<Agent>) -> Response {
    let Some(s) = a.slot.lock().await.take() else {
        return StatusCode::NO_CONTENT.into_response();
    };
    *lock(&a.lease) = None;
    *lock(&a.state) = EngineState::default();
    let grace = s.engine.stop_grace();
    let folder = s.folder.clone();
    s.end(grace).await;
    let _ = std::fs::remove_dir_all(folder);
    StatusCode::NO_CONTENT.into_response()
}
