//! The built-in engine as a system under test: `drill engine --config FILE` as a separate OS
//! process (so it can be SIGKILLed), reached over its HTTP ingest and stats API.
//!
//! The child is started with `kill_on_drop`, so it never outlives the drill. Restarts reuse the
//! same config file, data directory and port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use super::SutError;
use crate::engine::{EngineConfig, Stats};

/// The built-in engine running as a child process.
pub struct EngineProcess {
    exe: PathBuf,
    config_path: PathBuf,
    pub config: EngineConfig,
    log_path: PathBuf,
    child: Option<Child>,
    http: reqwest::Client,
    /// The engine's wall clock, when a clock fault moves it: every start runs under it.
    clock: Option<crate::clock::FakeClock>,
}

impl EngineProcess {
    /// Writes `config` next to the data directory and starts `exe engine --config FILE`.
    pub async fn start(
        exe: &Path,
        config: EngineConfig,
        work: &Path,
    ) -> Result<EngineProcess, SutError> {
        EngineProcess::start_under(exe, config, work, None).await
    }

    /// [`EngineProcess::start`], every run of the engine under `clock` (a clock fault's).
    pub async fn start_under(
        exe: &Path,
        config: EngineConfig,
        work: &Path,
        clock: Option<crate::clock::FakeClock>,
    ) -> Result<EngineProcess, SutError> {
        let config_path = work.join("engine.yaml");
        let text = serde_saphyr::to_string(&config).map_err(|e| SutError::Config {
            path: config_path.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        std::fs::write(&config_path, text).map_err(|source| SutError::Config {
            path: config_path.clone(),
            source,
        })?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| SutError::Start(e.to_string()))?;
        let mut engine = EngineProcess {
            exe: exe.to_path_buf(),
            config_path,
            config,
            log_path: work.join("engine.log"),
            child: None,
            http,
            clock,
        };
        engine.spawn().await?;
        Ok(engine)
    }

    pub fn addr(&self) -> SocketAddr {
        self.config.listen
    }

    /// Where the engine's stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// The engine's process id while it runs (for reading its memory in `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The engine's wall clock, when a clock fault moves it.
    pub fn clock(&self) -> Option<&crate::clock::FakeClock> {
        self.clock.as_ref()
    }

    /// (Re)starts the process and waits until `/stats` answers.
    pub async fn spawn(&mut self) -> Result<(), SutError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| SutError::Start(format!("{}: {e}", self.log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| SutError::Start(e.to_string()))?;
        let mut command = Command::new(&self.exe);
        if let Some(clock) = &self.clock {
            command.envs(clock.env(None));
        }
        let mut child = crate::process::dies_with_drill(&mut command)
            .arg("engine")
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SutError::Start(format!("{}: {e}", self.exe.display())))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.stats().await.is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let tail = std::fs::read_to_string(&self.log_path).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                return Err(SutError::Start(format!(
                    "exited with {status}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )));
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err(SutError::Start(format!(
                    "no answer on http://{}/stats after 15 s (log: {})",
                    self.addr(),
                    self.log_path.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: the engine gets no chance to flush anything.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
    }

    pub async fn stats(&self) -> Result<Stats, SutError> {
        let url = format!("http://{}/stats", self.addr());
        let response = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map_err(|e| SutError::Stats(e.to_string()))?;
        response
            .json::<Stats>()
            .await
            .map_err(|e| SutError::Stats(e.to_string()))
    }

    /// Appends a line to the engine's log file (drill's own notes between restarts).
    pub async fn note(&self, line: &str) {
        if let Ok(mut f) = tokio::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .await
        {
            let _ = f.write_all(format!("drill: {line}\n").as_bytes()).await;
        }
    }
}
