//! The outbox input (`outbox:` in `engine.yaml`): polls a PostgreSQL outbox table (`id`,
//! `payload`, `sent_at`) and stores each unmarked row's payload as a record, as the HTTP
//! ingest does, then marks the rows (`sent_at`).
//!
//! A row is marked only once it is safe (docs/src/design.md#rule-1-1): a burst is stored and
//! synced by the writer first, then the ids are written to `outbox-stored.json` in the data
//! folder (durably), then marked; the file is emptied once the mark is committed. On start, and
//! after a mark the source link lost, the ids in the file are marked before anything is polled,
//! so a row whose ids were written down is never stored twice; a stop waits for the burst in
//! hand to be written down. Only a crash between the store and that write leaves rows stored
//! and unmarked: they come again (copies, never a loss). It never resumes "after the highest
//! id": a row with a smaller id can commit after a larger one was read, and would be skipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::tail::{lines_of, write_durably};
use super::writer::{IngestJob, WriterJob};

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// `outbox:` in `engine.yaml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// The server (drill gives its link `source`); drill's role and database.
    pub addr: SocketAddr,
    pub table: String,
}

/// The ids stored and not yet marked, in the data folder.
pub const STORED_FILE: &str = "outbox-stored.json";

/// Most rows taken in one poll.
const BURST: i64 = 500;
/// How long an empty poll waits before the next.
const IDLE: Duration = Duration::from_millis(100);
/// How long one statement may take before the connection is given up.
const STATEMENT_LIMIT: Duration = Duration::from_secs(10);

/// Starts the input on the engine's runtime; it ends when `cancel` fires, at a safe point: a
/// burst taken is stored and its ids written down before it looks at `cancel` again.
pub(super) fn spawn(
    config: OutboxConfig,
    data_dir: PathBuf,
    writer: mpsc::Sender<WriterJob>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let stored_path = data_dir.join(STORED_FILE);
        while !cancel.is_cancelled() {
            let session = Session {
                config: &config,
                stored_path: &stored_path,
                writer: &writer,
                cancel: &cancel,
            };
            if let Some(why) = session.run().await {
                eprintln!("drill engine: outbox: {why}");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    })
}

struct Session<'a> {
    config: &'a OutboxConfig,
    stored_path: &'a Path,
    writer: &'a mpsc::Sender<WriterJob>,
    cancel: &'a CancellationToken,
}

impl Session<'_> {
    /// One connection: marks what an earlier one stored, then polls, stores and marks until a
    /// statement fails (returns why) or `cancel` fires (returns `None`).
    async fn run(&self) -> Option<String> {
        let login = crate::dest::postgres::Login::drill();
        let connecting = crate::dest::postgres::broker::connect_owned(self.config.addr, &login);
        let (client, _connection) = tokio::select! {
            _ = self.cancel.cancelled() => return None,
            c = connecting => match c {
                Ok(c) => c,
                Err(e) => return Some(format!("connect: {e}")),
            },
        };
        let table = &self.config.table;
        let poll = format!(
            "SELECT id, payload FROM \"{table}\" WHERE sent_at IS NULL ORDER BY id LIMIT {BURST}"
        );
        let mark = format!("UPDATE \"{table}\" SET sent_at = clock_timestamp() WHERE id = ANY($1)");
        loop {
            let pending = read_stored(self.stored_path.to_path_buf()).await;
            if !pending.is_empty() {
                if let Err(e) = limited(client.execute(&mark, &[&pending])).await {
                    return Some(format!("mark: {e}"));
                }
                if let Err(e) = save(self.stored_path, b"[]".to_vec()).await {
                    return Some(e);
                }
            }
            if self.cancel.is_cancelled() {
                return None;
            }
            let rows = match limited(client.query(&poll, &[])).await {
                Ok(rows) => rows,
                Err(e) => return Some(format!("poll: {e}")),
            };
            if rows.is_empty() {
                tokio::select! {
                    _ = self.cancel.cancelled() => return None,
                    _ = tokio::time::sleep(IDLE) => {}
                }
                continue;
            }
            let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            let mut body = Vec::new();
            for r in &rows {
                body.extend_from_slice(r.get::<_, &str>(1).as_bytes());
                body.push(b'\n');
            }
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::MarkOnPoll) {
                // Marks the rows at poll time, before they are stored.
                if let Err(e) = limited(client.execute(&mark, &[&ids])).await {
                    return Some(format!("mark: {e}"));
                }
            }
            if let Err(e) = self.store(body).await {
                // Not stored, not marked: polled again.
                eprintln!("drill engine: outbox: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let text = serde_json::to_vec(&ids).unwrap_or_default();
            if let Err(e) = save(self.stored_path, text).await {
                return Some(e);
            }
        }
    }

    async fn store(&self, body: Vec<u8>) -> Result<(), String> {
        let lines = lines_of(&body);
        let (reply, answer) = oneshot::channel();
        let job = IngestJob {
            body: bytes::Bytes::from(body),
            lines,
            reply,
        };
        self.writer
            .send(WriterJob::Ingest(job))
            .await
            .map_err(|_| "the writer is gone".to_string())?;
        answer
            .await
            .map_err(|_| "the writer is gone".to_string())?
            .map(drop)
            .map_err(|e| format!("cannot store: {e}"))
    }
}

/// The ids in the stored-not-marked file (none when there is no file), read off the runtime.
async fn read_stored(path: PathBuf) -> Vec<i64> {
    tokio::task::spawn_blocking(move || {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default()
}

/// The stored-not-marked file replaced durably, off the runtime (it fsyncs).
async fn save(path: &Path, bytes: Vec<u8>) -> Result<(), String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || write_durably(&path, &bytes))
        .await
        .map_err(|e| e.to_string())?
}

/// `statement`, given up after [`STATEMENT_LIMIT`].
async fn limited<T>(
    statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(STATEMENT_LIMIT, statement).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {STATEMENT_LIMIT:?}")),
    }
}
