//! The postgres read-back, once the drill ends: drill's table, or the query a user's engine's
//! table is read with. Each row is one copy (with `ON CONFLICT DO NOTHING` a repeat stores no
//! row, so an extra row is a real duplicate). A table that cannot be read is a verifier fault,
//! never engine loss.
//!
//! - **drill's table**: ids in the payload, the write key in the `write_key` column, each row
//!   timed by `stored_at` (the server's clock, `clock_timestamp()` at insert).
//! - **a query** (`read_back.sql`): each row as one JSON object (`to_jsonb`), so ids are found
//!   in any column, and a column named as the write key's place is read by name. A row is timed
//!   by its `stored_at` column when the query returns one, else by when it was read (the
//!   report's recovery times then say nothing). A row with no id of this drill is someone
//!   else's (a user's table may hold other rows) and is left out.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{Login, WRITE_KEY};
use crate::dest::{ReadBack, ReaderSpec};
use crate::verify::{Decoder, Received};

/// What is read.
#[derive(Debug, Clone)]
pub enum Source {
    /// drill's own table.
    Table(String),
    /// A user's query (`read_back.sql`).
    Query(String),
}

pub struct Reader {
    /// Where the server is now (a container restarted by a broker fault may have moved).
    addr: std::sync::Mutex<SocketAddr>,
    login: Login,
    source: Source,
    decoder: Decoder,
    /// The drill's start as wall time: `stored_at` is read relative to it.
    t0_wall: SystemTime,
}

impl Reader {
    pub fn new(addr: SocketAddr, login: Login, source: Source, r: ReaderSpec) -> Reader {
        Reader {
            addr: std::sync::Mutex::new(addr),
            login,
            source,
            decoder: r.decoder,
            t0_wall: r.t0_wall,
        }
    }
}

/// The column types an id can be in: text of any kind, and JSON.
pub fn holds_text(t: &tokio_postgres::types::Type) -> bool {
    use tokio_postgres::types::Type;
    [
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::JSON,
        Type::JSONB,
        Type::XML,
    ]
    .contains(t)
}

/// The statement that reads `source`: its rows as (write key or NULL, the row's text, epoch
/// seconds of `stored_at` or NULL). For a query, its columns are checked first: `Err` says
/// why it cannot be read.
pub async fn statement(client: &tokio_postgres::Client, source: &Source) -> Result<String, String> {
    match source {
        Source::Table(table) => Ok(format!(
            "SELECT {WRITE_KEY}, payload::text, extract(epoch from stored_at)::float8 FROM {table} ORDER BY stored_at"
        )),
        Source::Query(sql) => {
            let prepared = client.prepare(sql).await.map_err(|e| {
                format!(
                    "the read-back query (destination.read_back.sql) fails: {}",
                    message(&e)
                )
            })?;
            let columns = prepared.columns();
            if !columns.iter().any(|c| holds_text(c.type_())) {
                let listed: Vec<String> = columns
                    .iter()
                    .map(|c| format!("{} ({})", c.name(), c.type_()))
                    .collect();
                return Err(format!(
                    "the read-back query (destination.read_back.sql) returns no text or JSON column an id could be in ({}); select the column your engine stores the record in",
                    if listed.is_empty() {
                        "no columns".to_string()
                    } else {
                        listed.join(", ")
                    }
                ));
            }
            let stamped = columns.iter().any(|c| {
                c.name() == "stored_at"
                    && [
                        tokio_postgres::types::Type::TIMESTAMPTZ,
                        tokio_postgres::types::Type::TIMESTAMP,
                    ]
                    .contains(c.type_())
            });
            let at = if stamped {
                "extract(epoch from q.stored_at)::float8"
            } else {
                "NULL::float8"
            };
            Ok(format!(
                "SELECT NULL::text, to_jsonb(q)::text, {at} FROM ({sql}) q"
            ))
        }
    }
}

/// The server's own words for an error, where it said any.
pub fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

impl ReadBack for Reader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        async move {
            let counted = match &self.source {
                Source::Table(table) => format!("SELECT count(*) FROM {table}"),
                Source::Query(sql) => format!("SELECT count(*) FROM ({sql}) q"),
            };
            let addr = *self.addr.lock().unwrap_or_else(|e| e.into_inner());
            let query = async {
                let client = super::broker::connect(addr, &self.login).await.ok()?;
                let row = client.query_one(&counted, &[]).await.ok()?;
                usize::try_from(row.get::<_, i64>(0)).ok()
            };
            tokio::time::timeout(Duration::from_secs(2), query)
                .await
                .ok()
                .flatten()
        }
        .boxed()
    }

    fn moved(&self, addrs: &[SocketAddr]) {
        if let Some(now) = addrs.first() {
            *self.addr.lock().unwrap_or_else(|e| e.into_inner()) = *now;
        }
    }

    fn finish(self: Box<Self>, addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let last = *self.addr.lock().unwrap_or_else(|e| e.into_inner());
            let addr = addrs.first().copied().unwrap_or(last);
            let mut received = Received::default();
            let rows = async {
                let client = super::broker::connect(addr, &self.login).await?;
                let sql = statement(&client, &self.source).await?;
                client.query(&sql, &[]).await.map_err(|e| message(&e))
            };
            let rows = match tokio::time::timeout(Duration::from_secs(60), rows).await {
                Ok(Ok(rows)) => rows,
                Ok(Err(e)) => {
                    received.verifier_fault = Some(format!("reading the table: {e}"));
                    return received;
                }
                Err(_) => {
                    received.verifier_fault =
                        Some("reading the table: no answer within 60 s".to_string());
                    return received;
                }
            };
            let read_at = SystemTime::now()
                .duration_since(self.t0_wall)
                .unwrap_or_default();
            let query = matches!(self.source, Source::Query(_));
            for row in rows {
                let key: Option<String> = row.get(0);
                let text: Option<String> = row.get(1);
                let stored: Option<f64> = row.get(2);
                let at = stored.map_or(read_at, |s| {
                    let stored = UNIX_EPOCH + Duration::from_secs_f64(s.max(0.0));
                    stored.duration_since(self.t0_wall).unwrap_or_default()
                });
                let text = text.unwrap_or_default();
                if query && !self.decoder.has_run_id(text.as_bytes()) {
                    continue;
                }
                let object = query
                    .then(|| serde_json::from_str::<serde_json::Value>(&text).ok())
                    .flatten();
                let meta = |name: &str| match &object {
                    Some(o) => o.get(name).map(|v| match v {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    }),
                    None => (name == WRITE_KEY).then(|| key.clone()).flatten(),
                };
                self.decoder.add(text.as_bytes(), meta, at, &mut received);
            }
            received
        }
        .boxed()
    }
}
