//! Helpers the integration tests share (tests/suite.rs), one definition each: `run` drives the
//! drill binary and reads what a run left, `engine` drives drill's engine (ingest, stats, the
//! attempts journal), `hosts` makes hosts for the remote tests; here, for the proxy tests, a
//! counting echo server, timing, and `drill proxy` as a separate process.
#![allow(dead_code)]

pub mod engine;
pub mod hosts;
pub mod run;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server that counts the bytes it received.
pub struct Echo {
    pub addr: SocketAddr,
    pub received: Arc<AtomicU64>,
}

pub async fn echo() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    count.fetch_add(n as u64, Ordering::SeqCst);
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Echo { addr, received }
}

/// Reads once; `None` if nothing at all arrived within `wait` (no data, no EOF, no reset).
pub async fn read_within(c: &mut TcpStream, wait: Duration) -> Option<std::io::Result<usize>> {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(wait, c.read(&mut buf)).await.ok()
}

pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn is_reset(r: &Option<std::io::Result<usize>>) -> bool {
    matches!(r, Some(Err(e)) if e.kind() == ErrorKind::ConnectionReset)
}

/// Median round trip of `n` 1-byte ping-pongs.
pub async fn median_rtt(c: &mut TcpStream, n: usize) -> Duration {
    let mut rtts = Vec::with_capacity(n);
    let mut b = [0u8; 1];
    for _ in 0..n {
        let t = Instant::now();
        c.write_all(b"p").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        rtts.push(t.elapsed());
    }
    rtts.sort();
    rtts[n / 2]
}

/// `drill proxy` as a user runs it: its own process, its own runtime.
pub struct ProxyProcess {
    pub child: std::process::Child,
    pub listen: SocketAddr,
    pub api: SocketAddr,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `drill proxy` with one link `t` to `upstream` (or no link at all).
pub async fn drill_proxy(upstream: Option<SocketAddr>) -> ProxyProcess {
    let free = || -> SocketAddr { ([127, 0, 0, 1], drill::process::free_port().unwrap()).into() };
    let (listen, api) = (free(), free());
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_drill"));
    command.args(["proxy", "--api", &api.to_string()]);
    if let Some(upstream) = upstream {
        command.args(["--link", &format!("t={listen},{upstream}")]);
    }
    let child = command.stdout(std::process::Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reqwest::get(format!("http://{api}/links")).await.is_err() {
        assert!(Instant::now() < deadline, "drill proxy did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ProxyProcess { child, listen, api }
}

pub async fn link_status(api: SocketAddr) -> serde_json::Value {
    let answer = reqwest::get(format!("http://{api}/links"))
        .await
        .unwrap_or_else(|e| panic!("GET http://{api}/links: {e:?}"));
    let status = answer.status();
    let links: serde_json::Value = answer
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET http://{api}/links answered {status}, not JSON: {e:?}"));
    links[0].clone()
}

/// Sends `request` and checks the half-open shape: every byte reaches the upstream, and
/// nothing at all (no answer, no EOF, no reset) comes back within `quiet`.
pub async fn lands_without_answer(c: &mut TcpStream, up: &Echo, request: &[u8], quiet: Duration) {
    let before = up.received.load(Ordering::SeqCst);
    c.write_all(request).await.unwrap();
    let want = before + request.len() as u64;
    wait_for("the request to reach upstream", || {
        up.received.load(Ordering::SeqCst) == want
    })
    .await;
    assert!(
        read_within(c, quiet).await.is_none(),
        "the answer never comes back, the socket stays open"
    );
}
