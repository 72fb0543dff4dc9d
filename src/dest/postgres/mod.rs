//! PostgreSQL: a table with a key column, `destination: { kind: postgres }`.
//!
//! - **The database** ([`broker`]): Debian's PostgreSQL (15 here) started by drill as a local
//!   process — `initdb` into a folder of its own, `postgres` on a free 127.0.0.1 port, as the
//!   unprivileged `postgres` user when drill runs as root (PostgreSQL refuses root). fsync stays
//!   on: what the server acknowledged is on disk.
//! - **The table**: drill creates `drill_records(write_key text primary key, id text not null,
//!   key text, seq bigint, payload jsonb, stored_at timestamptz default clock_timestamp())`,
//!   with a CHECK on the payload's size that poison records violate (`topic` names the table;
//!   default `drill_records`).
//! - **Write key**: the `write_key` column. The built-in engine's `INSERT … ON CONFLICT
//!   (write_key) DO NOTHING` keeps `effectively_once`: a resend of a stored record stores
//!   nothing.
//! - **The reader** ([`read`]): the table itself, read once the drill ends (each row one copy,
//!   timed by `stored_at`, the server's own clock).
//! - **Links**: one plain TCP link named `postgres` in front of the server.
//!
//! Not yet (issue 24): a container image, `runtime: external` with a DSN from the environment,
//! a user's own table with a read-back query, and the `crash` broker fault.

pub mod broker;
pub mod read;
pub mod sink;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    Common, DestError, Destination, Entry, Kind, Provision, Provisioned, RawDestination, ReadBack,
    ReaderSpec, Running, Runtime, Shape,
};
use crate::located::{Located, at};
use crate::promise::Promise;
use crate::verify::WriteKeyPlace;

/// The database and role drill's server has, and its engine writes as.
pub const DATABASE: &str = "drill";
pub const ROLE: &str = "drill";

/// The column the write key is in, as the reader names it.
pub const WRITE_KEY: &str = "write_key";

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "postgres",
    sink: &sink::PostgresSink,
    fields: &[],
    external_field: ("address", "db.site.local:5432"),
    sasl_mechanisms: &[],
    write_key_field: ("postgres_column", "string"),
    embedded: false,
    validate,
    bench: None,
    taps: None,
};

/// A PostgreSQL destination: the table the records go to.
#[derive(Debug, Clone)]
pub struct Postgres {
    pub table: String,
}

fn validate(raw: &RawDestination, common: &Common) -> Result<Arc<dyn Destination>, Located> {
    if matches!(common.runtime, Runtime::External | Runtime::Container) {
        return Err(at(
            &raw.kind.referenced,
            "field `destination.runtime`: a postgres destination runs as a local process for now (Debian's postgresql); leave `runtime` out".to_string(),
        ));
    }
    let table = raw.topic.as_deref().unwrap_or("drill_records");
    let ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && s.len() <= 63
    };
    if !ident(table) {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.topic`: `{table}` is not a plain table name (lower-case letters, digits and _, at most 63)"
            ),
        ));
    }
    Ok(Arc::new(Postgres {
        table: table.to_string(),
    }))
}

impl Destination for Postgres {
    fn kind(&self) -> Kind {
        Kind::Postgres
    }

    fn builtin_promise(&self) -> Promise {
        Promise::EffectivelyOnce
    }

    fn settle(&self, _shape: &Shape) -> Arc<dyn Destination> {
        Arc::new(self.clone())
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        WriteKeyPlace::Meta(WRITE_KEY.to_string())
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        match value.as_str() {
            Some(WRITE_KEY) => Ok(WriteKeyPlace::Meta(WRITE_KEY.to_string())),
            _ => Err(format!(
                "the column drill's table keeps it in: postgres_column: {WRITE_KEY}"
            )),
        }
    }

    fn output_options(&self, cfg: &mut crate::engine::OutputConfig) {
        cfg.topic = self.table.clone();
    }

    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>> {
        broker::provision(Arc::new(self.clone()), self, p).boxed()
    }

    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>> {
        async move {
            let addr = at.addrs[0];
            Ok(Box::new(read::Reader::new(addr, self.table.clone(), r)) as Box<dyn ReadBack>)
        }
        .boxed()
    }
}
