//! A user's engine as a system under test: started from the scenario's argv (never a shell),
//! in a process group of its own, with its output in a log file.
//!
//! Placeholders are rendered once, when the drill knows its ports and links; restarts reuse the
//! same argv, environment and data directory. Signals go to the whole process group: many
//! engines are a wrapper script or run helper children, and a SIGKILL to one PID would leave
//! the rest running. The group is SIGKILLed when the engine is dropped, so nothing it started
//! outlives the drill.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::{Account, AccountSource, SutError};
use crate::scenario::{CommandSpec, Ready, StatsSpec};

/// A user's engine, started from its argv.
pub struct CommandEngine {
    /// The rendered argv; `argv[0]` resolved (`drill` is drill's own executable).
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    work_dir: PathBuf,
    data_dir: PathBuf,
    /// stdout and stderr of every start, appended, with drill's own notes between them.
    log_path: PathBuf,
    ingest: SocketAddr,
    ready: Ready,
    ready_within: Duration,
    /// `GET` this for the engine's account, read with `stats_fields`.
    stats_url: Option<String>,
    stats_fields: Option<StatsSpec>,
    /// Where `ready: { http }` asks.
    ready_url: Option<String>,
    stop_grace: Duration,
    child: Option<Child>,
    /// The process group (the leader's pid) of the running engine.
    group: Option<Pid>,
    http: reqwest::Client,
    /// The engine's wall clock, when a clock fault moves it: every start runs under it.
    clock: Option<crate::clock::FakeClock>,
}

/// Everything [`CommandEngine::start`] needs beyond the scenario's spec.
pub struct Placement<'a> {
    /// The values of every placeholder.
    pub values: &'a BTreeMap<String, String>,
    /// `{port.NAME}` → port.
    pub ports: &'a BTreeMap<String, u16>,
    pub ingest: SocketAddr,
    pub work_dir: &'a Path,
    pub data_dir: &'a Path,
    /// Where the engine's output goes (in the report folder).
    pub log_path: PathBuf,
    /// drill's own executable, for `argv[0] == "drill"`.
    pub drill_exe: &'a Path,
    /// The engine's wall clock, when a clock fault moves it.
    pub clock: Option<crate::clock::FakeClock>,
}

/// The placeholders whose values belong to the host the engine runs on: `{ingest}` (and its
/// `.host`, `.port`), `{data_dir}`, `{work_dir}`, `{port.NAME}`. drill's runner gives them on
/// its host, a `drill agent` on its own.
pub fn host_values(
    ingest: SocketAddr,
    work_dir: &Path,
    data_dir: &Path,
    ports: &BTreeMap<String, u16>,
) -> BTreeMap<String, String> {
    let mut values = BTreeMap::from([
        ("ingest".to_string(), ingest.to_string()),
        ("ingest.host".to_string(), ingest.ip().to_string()),
        ("ingest.port".to_string(), ingest.port().to_string()),
        ("data_dir".to_string(), data_dir.display().to_string()),
        ("work_dir".to_string(), work_dir.display().to_string()),
    ]);
    for (name, port) in ports {
        values.insert(format!("port.{name}"), port.to_string());
    }
    values
}

impl CommandEngine {
    /// Renders the argv, env and template files, then starts the engine and waits until ready.
    pub async fn start(spec: &CommandSpec, at: Placement<'_>) -> Result<CommandEngine, SutError> {
        let render = |t: &str| crate::scenario::command::render(t, at.values);
        for (name, template) in &spec.files {
            let path = at.work_dir.join(name);
            std::fs::write(&path, render(template))
                .map_err(|source| SutError::Config { path, source })?;
        }
        let mut argv: Vec<String> = spec.argv.iter().map(|a| render(a)).collect();
        if argv.first().map(String::as_str) == Some("drill") {
            argv[0] = at.drill_exe.display().to_string();
        }
        if let (Some(_), Some(program)) = (&at.clock, argv.first()) {
            crate::clock::fakeable(program)
                .map_err(|why| SutError::Start(format!("a clock fault cannot act on it: {why}")))?;
        }
        let url_at = |port: &Option<String>, path: &str| {
            let addr = match port {
                Some(name) => SocketAddr::from((
                    [127, 0, 0, 1],
                    at.ports.get(name).copied().unwrap_or(at.ingest.port()),
                )),
                None => at.ingest,
            };
            format!("http://{addr}{path}")
        };
        let ready_url = match &spec.ready {
            Ready::Http { path, port } => Some(url_at(port, path)),
            _ => None,
        };
        let stats_url = spec.stats.as_ref().map(|s| url_at(&s.port, &s.path));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| SutError::Start(e.to_string()))?;
        let mut engine = CommandEngine {
            argv,
            env: spec
                .env
                .iter()
                .map(|(k, v)| (k.clone(), render(v)))
                .collect(),
            work_dir: at.work_dir.to_path_buf(),
            data_dir: at.data_dir.to_path_buf(),
            log_path: at.log_path,
            ingest: at.ingest,
            ready: spec.ready.clone(),
            ready_within: spec.ready_within,
            stats_url,
            stats_fields: spec.stats.clone(),
            ready_url,
            stop_grace: spec.stop_grace,
            child: None,
            group: None,
            http,
            clock: at.clock,
        };
        engine.spawn().await?;
        Ok(engine)
    }

    pub fn ingest_addr(&self) -> SocketAddr {
        self.ingest
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The engine's wall clock, when a clock fault moves it.
    pub fn clock(&self) -> Option<&crate::clock::FakeClock> {
        self.clock.as_ref()
    }

    pub fn gives_account(&self) -> bool {
        self.stats_url.is_some()
    }

    pub fn stop_grace(&self) -> Duration {
        self.stop_grace
    }

    /// One line for the console.
    pub fn describe(&self) -> String {
        format!(
            "command `{}`, ingest {}, log {}",
            self.argv.join(" "),
            self.ingest,
            self.log_path.display()
        )
    }

    /// (Re)starts the engine with the same argv and data directory; waits until ready.
    /// The running engine's process group (its leader's pid).
    pub fn group(&self) -> Option<u32> {
        self.group.map(|g| g.as_raw() as u32)
    }

    pub async fn spawn(&mut self) -> Result<(), SutError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| SutError::Start(format!("{}: {e}", self.log_path.display())))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let err = log
            .try_clone()
            .map_err(|e| SutError::Start(e.to_string()))?;
        let Some((program, args)) = self.argv.split_first() else {
            return Err(SutError::Start("empty command".to_string()));
        };
        let mut command = Command::new(program);
        crate::process::with_user_library_path(&mut command);
        crate::process::dies_with_drill(&mut command)
            .args(args)
            .envs(&self.env)
            .envs(
                self.clock
                    .iter()
                    .flat_map(|c| c.env(self.env.get("LD_PRELOAD").map(String::as_str))),
            )
            .current_dir(&self.work_dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| {
            SutError::Start(format!(
                "cannot run `{program}`: {e}; check the first word of system.command (a program on PATH or a path)"
            ))
        })?;
        let group = child.id().map(|id| Pid::from_raw(id as i32));
        // A start abandoned halfway (its caller gone, e.g. an agent's client that hung up)
        // leaves nothing of the group running.
        let mut abandoned = GroupGuard(group);
        let started = Instant::now();
        loop {
            if self.is_ready(log_start).await {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                if let Some(g) = group {
                    let _ = killpg(g, Signal::SIGKILL);
                }
                return Err(SutError::Start(format!(
                    "`{program}` exited with {status} before it was ready; its last lines: {}",
                    self.tail()
                )));
            }
            if started.elapsed() > self.ready_within {
                if let Some(g) = group {
                    let _ = killpg(g, Signal::SIGKILL);
                }
                let _ = child.wait().await;
                return Err(SutError::Start(format!(
                    "`{program}` was not ready within {:?} ({}); raise system.ready.within or fix the check; its last lines: {}",
                    self.ready_within,
                    self.ready_check(),
                    self.tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        abandoned.0 = None;
        self.child = Some(child);
        self.group = group;
        Ok(())
    }

    fn ready_check(&self) -> String {
        match &self.ready {
            Ready::Http { .. } => format!(
                "GET {} never answered 2xx",
                self.ready_url.as_deref().unwrap_or("")
            ),
            Ready::Tcp => format!("nothing accepted on {}", self.ingest),
            Ready::Log(re) => format!("no output line matched `{re}`"),
        }
    }

    async fn is_ready(&self, log_start: u64) -> bool {
        match &self.ready {
            Ready::Http { .. } => match &self.ready_url {
                Some(url) => self
                    .http
                    .get(url)
                    .timeout(Duration::from_secs(1))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success()),
                None => false,
            },
            Ready::Tcp => tokio::net::TcpStream::connect(self.ingest).await.is_ok(),
            Ready::Log(pattern) => {
                let Ok(re) = regex_lite::Regex::new(pattern) else {
                    return false;
                };
                let text = std::fs::read(&self.log_path).unwrap_or_default();
                let new = text.get(log_start as usize..).unwrap_or_default();
                String::from_utf8_lossy(new).lines().any(|l| re.is_match(l))
            }
        }
    }

    /// The log's last lines, joined for one error line.
    pub fn tail(&self) -> String {
        super::log_tail(&self.log_path)
    }

    /// Whether the engine ended on its own since the last look: `Some(why)` once.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.signal(Signal::SIGKILL);
                self.child = None;
                self.group = None;
                Some(format!(
                    "the engine exited by itself ({status}) during the drill; its last lines: {}",
                    self.tail()
                ))
            }
            _ => None,
        }
    }

    fn signal(&self, signal: Signal) {
        if let Some(g) = self.group {
            let _ = killpg(g, signal);
        }
    }

    /// SIGKILL to the whole group.
    pub async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait().await;
        }
        self.group = None;
    }

    /// SIGTERM to the group, SIGKILL after `grace`; then SIGKILL to whatever of the group is
    /// left (a helper the engine did not stop).
    pub async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(grace, child.wait()).await.is_err()
        {
            self.signal(Signal::SIGKILL);
            let _ = child.wait().await;
        }
        self.signal(Signal::SIGKILL);
        self.group = None;
    }

    /// SIGSTOP / SIGCONT to the group.
    pub fn pause(&self, paused: bool) {
        self.signal(if paused {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        });
    }

    /// The engine's own account from its stats endpoint, if it has one and answers.
    pub async fn account(&self) -> Option<Account> {
        self.account_source().fetch(&self.http).await
    }

    /// Where the account is read, for a sampler that must not borrow the engine.
    pub fn account_source(&self) -> AccountSource {
        AccountSource::stats(&self.stats_url, &self.stats_fields)
    }

    /// Appends drill's own note to the engine's log.
    pub fn note(&self, line: &str) {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
        {
            let _ = writeln!(f, "drill: {line}");
        }
    }
}

/// SIGKILLs a process group when dropped, unless disarmed (`.0 = None`).
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(g) = self.0 {
            let _ = killpg(g, Signal::SIGKILL);
        }
    }
}

impl Drop for CommandEngine {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(Signal::SIGCONT);
            self.signal(Signal::SIGKILL);
        }
    }
}
