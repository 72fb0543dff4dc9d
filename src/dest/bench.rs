//! What `drill bench engine` needs of a destination kind ([`BenchKind`], given by the kind's
//! `bench.rs`), and what the kinds' raw clients share.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::DestError;

/// A broker a benchmark started, local and plain: where it listens, what it is.
pub struct BenchBroker {
    pub addr: SocketAddr,
    pub version: String,
    pub process: Option<crate::process::LocalProcess>,
}

/// The makings of a record a raw client sends: its line, from its number and size.
pub type RecordLine = fn(u64, usize) -> String;

/// Where a benchmark's broker starts: its folder, a free port it may take, and the link's
/// address (for a broker that tells clients where to connect).
pub struct BenchAt<'a> {
    pub dir: &'a Path,
    pub port: u16,
    pub advertise: SocketAddr,
}

/// One run of a benchmark: who (`engine` or `raw`) in which round, against which broker,
/// through which link.
#[derive(Clone, Copy)]
pub struct BenchRun<'a> {
    pub broker: SocketAddr,
    pub via: SocketAddr,
    pub who: &'a str,
    pub round: usize,
}

/// What a raw client sends: `records` lines (`line`, `bytes` each) to `topic` at `addr`,
/// `window` in flight.
pub struct RawRun {
    pub addr: SocketAddr,
    pub topic: String,
    pub records: u64,
    pub bytes: usize,
    pub window: usize,
    pub line: RecordLine,
}

/// What `drill bench engine` needs of a kind to measure the engine's drain against the kind's
/// raw client library: a local broker, a fresh topic (or stream) per run, and the raw client.
pub trait BenchKind: Sync {
    /// Starts a local broker.
    fn start<'a>(&'a self, at: BenchAt<'a>) -> BoxFuture<'a, Result<BenchBroker, DestError>>;

    /// A fresh topic, subject or stream for one run, named apart from every other.
    fn fresh<'a>(&'a self, run: BenchRun<'a>) -> BoxFuture<'a, Result<String, String>>;

    /// Frees what [`BenchKind::fresh`] made (`topic`), once its run is measured.
    fn done_with<'a>(&'a self, run: BenchRun<'a>, topic: &'a str) -> BoxFuture<'a, Done>;

    /// The kind's own client library sending the run's records, each with a write key; how
    /// long it took.
    fn raw_client(&self, run: RawRun) -> BoxFuture<'static, Result<Duration, String>>;
}

/// What freeing a benchmark's topic came to.
pub type Done = Result<(), String>;

/// The write key the raw clients carry, shaped like the engine's.
pub(crate) fn raw_key(i: u64) -> String {
    format!("0123456789abcdef-{i}")
}

/// Runs `client` on a runtime of its own, like the engine's (not on the bench's thread, which
/// serves the link: in the engine's turn the link has that thread to itself, so it has here
/// too).
pub(crate) fn on_own_runtime<F>(client: F) -> BoxFuture<'static, Result<Duration, String>>
where
    F: std::future::Future<Output = Result<Duration, String>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let sent = tokio::runtime::Runtime::new()
            .map_err(|e| e.to_string())
            .and_then(|runtime| runtime.block_on(client));
        let _ = tx.send(sent);
    });
    async move {
        rx.await
            .map_err(|_| "the raw client's thread ended without an answer".to_string())?
    }
    .boxed()
}
