//! An outbox source (`system.ingest: { kind: postgres_outbox, table }`): a table in a
//! PostgreSQL drill starts for the source alone, which drill inserts every record into and the
//! engine polls, marking what it took (`sent_at`) or deleting it.
//!
//! The table: `id bigserial PRIMARY KEY, payload text NOT NULL, sent_at timestamptz`. drill
//! inserts each batch in one transaction straight to the server: its commit is what "held"
//! means. The engine reaches the server only through the link `source` ([`SOURCE_LINK`]), so
//! link faults on `source` cut it off its input while drill goes on inserting. The engine's
//! checkpoint is the table itself: a row marked or deleted has been passed (the engine will not
//! be given it again).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::dest::DestError;
use crate::dest::postgres::broker::{Server, connect, create_database, start};
use crate::dest::postgres::{DATABASE, Login, ROLE};
use crate::proxy::Link;
use crate::scenario::source::{OutboxSpec, SOURCE_LINK};
use crate::workload::{IngestAnswer, Record};

/// How long one look at the unmarked rows may take.
const LOOK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The outbox table, its server and what drill inserted. Cheap to clone.
#[derive(Clone)]
pub struct OutboxSource {
    inner: Arc<Inner>,
}

struct Inner {
    table: String,
    addr: SocketAddr,
    version: String,
    server: tokio::sync::Mutex<Option<Server>>,
    /// drill's own connection (never through the link).
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    /// Each record's row id.
    rows: Mutex<BTreeMap<i64, String>>,
}

impl OutboxSource {
    /// Starts the source's server, its database and table, and the link `source` in front.
    pub async fn start(
        spec: &OutboxSpec,
        cancel: CancellationToken,
    ) -> Result<(OutboxSource, Link), DestError> {
        let server = start().await?;
        let addr = server.addr;
        create_database(addr, None, None).await?;
        let fail = |e: String| DestError::Reader(format!("the outbox table: {e}"));
        let client = connect(addr, &Login::drill()).await.map_err(fail)?;
        client
            .batch_execute(&format!(
                "CREATE TABLE \"{t}\" (id bigserial PRIMARY KEY, payload text NOT NULL, sent_at timestamptz);
                 CREATE INDEX \"{t}_unmarked\" ON \"{t}\" (id) WHERE sent_at IS NULL",
                t = spec.table
            ))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let link = Link::start(SOURCE_LINK, any, addr, cancel).await?;
        let version = server.version.clone();
        Ok((
            OutboxSource {
                inner: Arc::new(Inner {
                    table: spec.table.clone(),
                    addr,
                    version,
                    server: tokio::sync::Mutex::new(Some(server)),
                    client: tokio::sync::Mutex::new(Some(client)),
                    rows: Mutex::new(BTreeMap::new()),
                }),
            },
            link,
        ))
    }

    /// One line for the drill's output and the report.
    pub fn describe(&self) -> String {
        format!(
            "source: outbox table `{}` on {} at {}, polled by the engine through the link `{SOURCE_LINK}`; drill inserts to the server itself",
            self.inner.table, self.inner.version, self.inner.addr
        )
    }

    /// A connection string for a user's engine, through `link` (`{ingest.dsn}`).
    pub fn dsn(link: SocketAddr) -> String {
        format!("postgres://{ROLE}@{link}/{DATABASE}")
    }

    /// Inserts `records` in one transaction, one row each; the commit means held, an error
    /// before it not accepted, a commit without an answer unknown.
    pub async fn write(&self, records: &[Record]) -> Vec<IngestAnswer> {
        let all = |a: IngestAnswer| vec![a; records.len()];
        let mut guard = self.inner.client.lock().await;
        let Some(client) = guard.as_mut() else {
            return all(IngestAnswer::NotAccepted(
                "the outbox is closed".to_string(),
            ));
        };
        let insert = format!(
            "INSERT INTO \"{}\" (payload) VALUES ($1) RETURNING id",
            self.inner.table
        );
        let tx = match client.transaction().await {
            Ok(tx) => tx,
            Err(e) => return all(IngestAnswer::NotAccepted(format!("the outbox: {e}"))),
        };
        let mut ids = Vec::with_capacity(records.len());
        for r in records {
            let payload = serde_json::to_string(r).unwrap_or_default();
            match tx.query_one(&insert, &[&payload]).await {
                Ok(row) => ids.push((row.get::<_, i64>(0), r.id.clone())),
                Err(e) => return all(IngestAnswer::NotAccepted(format!("the outbox: {e}"))),
            }
        }
        if tx.commit().await.is_err() {
            return all(IngestAnswer::Unknown);
        }
        self.lock().extend(ids);
        all(IngestAnswer::Accepted(None))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, String>> {
        self.inner
            .rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The row ids not yet marked (and not deleted).
    async fn unmarked(&self) -> Result<BTreeSet<i64>, String> {
        let guard = self.inner.client.lock().await;
        let client = guard.as_ref().ok_or("the outbox is closed")?;
        let query = format!(
            "SELECT id FROM \"{}\" WHERE sent_at IS NULL",
            self.inner.table
        );
        let rows = tokio::time::timeout(LOOK_LIMIT, client.query(&query, &[]))
            .await
            .map_err(|_| format!("the outbox: no answer within {LOOK_LIMIT:?}"))?
            .map_err(|e| format!("the outbox: {e}"))?;
        Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
    }

    /// Rows not yet marked (nor deleted).
    pub async fn unread(&self) -> Option<u64> {
        self.unmarked().await.ok().map(|left| left.len() as u64)
    }

    /// Whether the engine has marked (or deleted) every row drill inserted.
    pub async fn read_to_end(&self) -> bool {
        self.unmarked().await.is_ok_and(|left| left.is_empty())
    }

    /// The records whose rows the engine marked or deleted, and how many rows are left.
    pub async fn passed(&self) -> Result<(BTreeSet<String>, usize), String> {
        let left = self.unmarked().await?;
        let passed = self
            .lock()
            .iter()
            .filter(|(id, _)| !left.contains(id))
            .map(|(_, record)| record.clone())
            .collect();
        Ok((passed, left.len()))
    }

    /// Stops the source's server.
    pub async fn stop(&self) {
        self.inner.client.lock().await.take();
        self.inner.server.lock().await.take();
    }
}
