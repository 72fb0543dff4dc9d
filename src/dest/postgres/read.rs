//! The postgres read-back: the drill's table, read once the drill ends. Each row is one copy
//! (with `ON CONFLICT DO NOTHING` a repeat stores no row, so an extra row is a real duplicate);
//! ids are found in the payload, the write key is the `write_key` column, and arrivals are
//! timed by `stored_at` (the server's clock, `clock_timestamp()` at insert). A table that
//! cannot be read is a verifier fault, never engine loss.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{DATABASE, WRITE_KEY};
use crate::dest::{ReadBack, ReaderSpec};
use crate::verify::{Decoder, Received};

pub struct Reader {
    addr: SocketAddr,
    table: String,
    decoder: Decoder,
    /// The drill's start as wall time: `stored_at` is read relative to it.
    t0_wall: SystemTime,
}

impl Reader {
    pub fn new(addr: SocketAddr, table: String, r: ReaderSpec) -> Reader {
        Reader {
            addr,
            table,
            decoder: r.decoder,
            t0_wall: r.t0_wall,
        }
    }
}

impl ReadBack for Reader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        async move {
            let query = async {
                let client = super::broker::connect(self.addr, DATABASE).await.ok()?;
                let row = client
                    .query_one(&format!("SELECT count(*) FROM {}", self.table), &[])
                    .await
                    .ok()?;
                usize::try_from(row.get::<_, i64>(0)).ok()
            };
            tokio::time::timeout(Duration::from_secs(2), query)
                .await
                .ok()
                .flatten()
        }
        .boxed()
    }

    fn finish(self: Box<Self>, addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let addr = addrs.first().copied().unwrap_or(self.addr);
            let mut received = Received::default();
            let sql = format!(
                "SELECT {WRITE_KEY}, payload::text, extract(epoch from stored_at)::float8 FROM {} ORDER BY stored_at",
                self.table
            );
            let rows = async {
                let client = super::broker::connect(addr, DATABASE).await?;
                client.query(&sql, &[]).await.map_err(|e| e.to_string())
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
            for row in rows {
                let key: String = row.get(0);
                let payload: Option<String> = row.get(1);
                let stored: f64 = row.get(2);
                let stored = UNIX_EPOCH + Duration::from_secs_f64(stored.max(0.0));
                let at = stored.duration_since(self.t0_wall).unwrap_or_default();
                let meta = |name: &str| (name == WRITE_KEY).then(|| key.clone());
                let payload = payload.unwrap_or_default();
                self.decoder.add(payload.as_bytes(), meta, at, &mut received);
            }
            received
        }
        .boxed()
    }
}
