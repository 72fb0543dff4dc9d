//! The engine's PostgreSQL sink: one `INSERT … ON CONFLICT (write_key) DO NOTHING` per record
//! into the output's table (`topic`), the record's data as the `payload` (jsonb), its id, key
//! and seq taken from it.
//!
//! | answer | outcome |
//! |---|---|
//! | the statement completed (a row stored, or none: the key was there) | delivered |
//! | a data or integrity error (SQLSTATE classes 22 and 23: a CHECK violated, bad JSON) | refused and counted |
//! | any other error, a lost connection, silence past the answer timeout | the session ends; open attempts end `possibly_sent` (a commit whose answer was lost may have landed) and spend no attempt |
//!
//! The probe is `SELECT 1` on a new connection (writes nothing). Statements go out on the one
//! connection in the order of their attempts (one worker issues them, tokio-postgres
//! pipelines them), so a key's records land in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::engine::log::StoredRecord;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// The PostgreSQL sink (stateless: the table is the output's `topic`).
#[derive(Clone, Copy)]
pub struct PostgresSink;

/// What one statement came back with: done, or the error's SQLSTATE (if any) and text.
type Reply = Result<(), (Option<String>, String)>;

impl Sink for PostgresSink {
    type Session = PostgresSession;

    const SESSION: &'static str = "database session";

    const PROMISE: (Promise, &'static str) = (
        Promise::EffectivelyOnce,
        "a postgres output keeps `effectively_once`: a resend of a stored write key inserts nothing",
    );

    /// Statements pipelined on the one connection.
    const DEFAULT_WINDOW: usize = 64;

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<PostgresSession, String> {
        let cfg = to.cfg;
        let limit = cfg.answer_timeout.0;
        let session = async {
            let (client, connection) =
                super::broker::connect_owned(cfg.address, &login(cfg)?).await?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| format!("probe: {}", db_message(&e)))?;
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::ProbeWithOldestRecord)
                && let Some(record) = to.oldest
            {
                // MUTANT: the probe writes data: the oldest waiting record under a key of its
                // own (docs/src/design.md#rule-1-5).
                let _ = client
                    .execute(
                        &insert_sql(&cfg.topic),
                        &[&format!("probe-{}", record.seq), &record.data],
                    )
                    .await;
            }
            let insert = client
                .prepare(&insert_sql(&cfg.topic))
                .await
                .map_err(|e| format!("prepare: {}", db_message(&e)))?;
            Ok::<_, String>((client, insert, connection))
        };
        let (client, insert, connection) = tokio::time::timeout(limit, session)
            .await
            .map_err(|_| format!("no answer within {limit:?}"))??;
        let (done, replies) = mpsc::unbounded_channel();
        let (queue, queued) = mpsc::unbounded_channel();
        let client = Arc::new(client);
        let mut worker = JoinSet::new();
        worker.spawn(issue(client.clone(), insert, queued, done));
        Ok(PostgresSession {
            client,
            answer_timeout: limit,
            _worker: worker,
            _connection: connection,
            queue,
            replies,
        })
    }
}

/// Who the engine logs in as: the connection string's user and database when the output has
/// one (read from the environment variable its config names), else drill's own role.
fn login(cfg: &crate::engine::OutputConfig) -> Result<super::Login, String> {
    let secrets = cfg.credentials.read()?;
    match secrets.dsn {
        Some(dsn) => super::Login::parse(&dsn)
            .map(|(login, _)| login)
            .map_err(|e| {
                format!(
                    "{}: {e}",
                    cfg.credentials.dsn_env.as_deref().unwrap_or("dsn_env")
                )
            }),
        None => Ok(super::Login::drill()),
    }
}

/// The server's own words for an error, where it said any.
fn db_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

/// The insert for `table`: `$1` the write key, `$2` the record's JSON.
fn insert_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} (write_key, id, key, seq, payload)
         SELECT $1, p->>'id', p->>'key', (p->>'seq')::bigint, p FROM (SELECT $2::text::jsonb AS p) r
         ON CONFLICT (write_key) DO NOTHING"
    )
}

pub struct PostgresSession {
    client: Arc<tokio_postgres::Client>,
    answer_timeout: Duration,
    /// The one task that issues the statements, in order; dropped (aborted) with the session.
    _worker: JoinSet<()>,
    /// The task that drives the connection: dropped with the session, which closes the
    /// connection, so a statement the engine gave up on is never left open behind its resend
    /// (one open attempt per write key: docs/src/engine.md; tokio-postgres alone kept a
    /// stranded connection open for good).
    _connection: JoinSet<()>,
    queue: mpsc::UnboundedSender<(u16, Arc<StoredRecord>)>,
    replies: mpsc::UnboundedReceiver<(u16, Reply)>,
}

/// Issues each queued attempt's insert in turn — each is on the wire before the next is made
/// (an ordered buffer polls them first in the order they came) — and reports each answer.
async fn issue(
    client: Arc<tokio_postgres::Client>,
    insert: tokio_postgres::Statement,
    queued: mpsc::UnboundedReceiver<(u16, Arc<StoredRecord>)>,
    done: mpsc::UnboundedSender<(u16, Reply)>,
) {
    use futures::StreamExt;
    let attempts =
        futures::stream::unfold(
            queued,
            |mut q| async move { q.recv().await.map(|a| (a, q)) },
        );
    attempts
        .map(|(tag, record)| {
            let (client, insert) = (client.clone(), insert.clone());
            async move {
                let result = client.execute(&insert, &[&record.key, &record.data]).await;
                let reply = result.map(drop).map_err(|e| {
                    let code = e.code().map(|c| c.code().to_string());
                    (code, db_message(&e))
                });
                (tag, reply)
            }
        })
        .buffered(1024)
        .for_each(|answer| {
            let _ = done.send(answer);
            async {}
        })
        .await;
}

/// What a statement's answer means for its attempt; `Err`: the session is lost.
fn classify(reply: Reply) -> Result<Answer, String> {
    match reply {
        Ok(()) => Ok(Answer::Accepted),
        Err((Some(code), why)) if code.starts_with("22") || code.starts_with("23") => {
            Ok(Answer::Refused(format!("SQLSTATE {code}: {why}")))
        }
        Err((Some(code), why)) => Err(format!("SQLSTATE {code}: {why}")),
        Err((None, why)) => Err(why),
    }
}

impl Session for PostgresSession {
    async fn send(
        &mut self,
        attempts: &mut Attempts,
        _answers: &mut Answers,
    ) -> Result<(), String> {
        for attempt in attempts.drain(..) {
            self.queue
                .send(attempt)
                .map_err(|_| "the session's worker is gone".to_string())?;
        }
        Ok(())
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        let Some(first) = self.replies.recv().await else {
            return Err("the session's statements are gone".to_string());
        };
        let mut next = Some(first);
        while let Some((tag, reply)) = next {
            into.push((tag, classify(reply)?));
            next = self.replies.try_recv().ok();
        }
        Ok(())
    }

    async fn tick(&mut self, _now: Instant, open: Open) -> Tick {
        #[cfg(feature = "mutants")]
        if let Some(tick) = mutant::session_tick(self.answer_timeout) {
            return tick;
        }
        if self.client.is_closed() {
            return Tick::Lost("the connection closed".to_string());
        }
        match open.oldest_waited {
            Some(waited) if waited > self.answer_timeout => {
                Tick::Lost(format!("no answer within {:?}", self.answer_timeout))
            }
            _ => Tick::Fine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(code: &str) -> Reply {
        Err((Some(code.to_string()), "why".to_string()))
    }

    /// SQLSTATE classes 22 (data exception: a value the column cannot hold) and 23 (integrity:
    /// a CHECK, a NOT NULL) refuse the record; anything else — a shutdown (57P01), a lost
    /// connection (08006), a full disk (53100), no code at all — says the database is away.
    #[test]
    fn only_data_and_integrity_errors_refuse_a_record() {
        assert!(matches!(classify(Ok(())), Ok(Answer::Accepted)));
        for code in ["22P02", "22001", "22P05", "23514", "23502"] {
            assert!(
                matches!(classify(state(code)), Ok(Answer::Refused(ref w)) if w.contains(code)),
                "{code}"
            );
        }
        for code in ["57P01", "08006", "53100", "40001", "42P01"] {
            assert!(classify(state(code)).is_err(), "{code}");
        }
        assert!(classify(Err((None, "connection reset".to_string()))).is_err());
    }
}
