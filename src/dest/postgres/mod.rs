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
//! - **Links**: one plain TCP link named `postgres` in front of the server, read by the
//!   PostgreSQL tap ([`tap`]): which records went up, and a record sent again while a statement
//!   carrying it was still unanswered to the engine on an open connection — an *overlapping
//!   attempt*, judged as on HTTP (the key column would hide the copy).
//!
//! - **`runtime: external`**: the user's PostgreSQL, reached with the connection string in the
//!   environment variable `dsn_env` names (never in the file). drill creates its table there
//!   only if none of that name exists, and drops only what it created (`keep: true` keeps it).
//! - **A user's own table** (`read_back: { sql }`): the query drill reads back with; ids are
//!   found in any text or JSON column of its rows, a `stored_at` column times them. drill
//!   creates no table then.
//!
//! - **`runtime: container`**: the official `postgres:15` image (`DRILL_IMAGE_POSTGRES` names
//!   another; `ci/images.sh` builds `drill-local/postgres`), started with drill's own initdb.

pub mod broker;
pub mod read;
pub mod sink;
pub mod tap;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    DestError, Destination, Entry, Kind, Own, Provision, Provisioned, RawReadBack, ReadBack,
    ReaderSpec, Running, Section, Shape,
};
use serde_saphyr::Spanned;
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
    fields: <PostgresFields as schemars::JsonSchema>::json_schema,
    tls: false,
    external_field: Some(("dsn_env", "DATABASE_URL")),
    sasl_mechanisms: &[],
    write_key_field: ("postgres_column", "string"),
    embedded: false,
    broker_tls: false,
    validate,
    no_terminating_link: None,
    external_tls: false,
    no_remote_link: None,
    starter: super::Starter {
        topic: |d| Some(format!("drill_{}", d.replace(['-', '.'], "_"))),
        write_key: |_| format!("{{ postgres_column: {WRITE_KEY} }}"),
    },
    bench: None,
    link_bench: None,
    taps: Some(taps),
};

/// The kind's tap for the ids of run `run`.
fn taps(run: &str) -> Arc<dyn crate::proxy::tap::TapMaker> {
    Arc::new(tap::PostgresTaps {
        ids: crate::proxy::tap::IdFinder::new(run),
    })
}

/// A PostgreSQL destination: the table the records go to, and whose database it is.
#[derive(Debug, Clone)]
pub struct Postgres {
    pub table: String,
    /// `runtime: external`: the user's database.
    pub external: Option<ExternalDb>,
    /// `read_back.sql`: the query over a user's own table (drill creates no table then).
    pub query: Option<String>,
}

/// The user's database: where the connection string is, and what it says.
#[derive(Debug, Clone)]
pub struct ExternalDb {
    /// The environment variable with the connection string.
    pub dsn_env: String,
    pub login: Login,
    /// `host:port`, as the connection string gives it.
    pub address: String,
}

/// Who drill and its engine connect as, and to which database.
#[derive(Clone, PartialEq, Eq)]
pub struct Login {
    pub user: String,
    pub password: Option<String>,
    pub dbname: String,
}

impl std::fmt::Debug for Login {
    /// Never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("dbname", &self.dbname)
            .finish()
    }
}

impl Login {
    /// drill's own server: the role and database it made.
    pub fn drill() -> Login {
        Login {
            user: ROLE.to_string(),
            password: None,
            dbname: DATABASE.to_string(),
        }
    }

    /// A connection string (`postgres://user:password@host:5432/db` or `host=… port=… user=…
    /// dbname=…`): its login and `host:port`. One TCP host; TLS (`sslmode=require`) comes with
    /// drill's TLS links, not yet.
    pub fn parse(dsn: &str) -> Result<(Login, String), String> {
        use tokio_postgres::config::{Host, SslMode};
        let config: tokio_postgres::Config = dsn
            .parse()
            .map_err(|e| format!("not a PostgreSQL connection string ({e}); e.g. postgres://drill:secret@db.site.local:5432/plant"))?;
        let host = match config.get_hosts() {
            [Host::Tcp(host)] => host.clone(),
            [] => {
                return Err(
                    "it names no host; e.g. postgres://drill:secret@db.site.local:5432/plant"
                        .to_string(),
                );
            }
            [Host::Unix(path)] => {
                return Err(format!(
                    "it names a Unix socket ({}); drill's link needs a TCP host:port",
                    path.display()
                ));
            }
            _ => return Err("it names several hosts; give one".to_string()),
        };
        if config.get_ssl_mode() == SslMode::Require {
            return Err("it asks for TLS (sslmode=require); drill's PostgreSQL links are plain TCP for now — use sslmode=disable or prefer on a test database".to_string());
        }
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config
            .get_user()
            .ok_or("it names no user; e.g. postgres://drill:secret@db.site.local:5432/plant")?
            .to_string();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let dbname = config.get_dbname().unwrap_or(&user).to_string();
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Ok((
            Login {
                user,
                password,
                dbname,
            },
            format!("{host}:{port}"),
        ))
    }
}

impl Postgres {
    /// Who drill's reader connects as.
    pub fn login(&self) -> Login {
        self.external
            .as_ref()
            .map_or_else(Login::drill, |e| e.login.clone())
    }
}

/// A plain table name: lower-case letters, digits and `_`, at most 63.
fn plain_name(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
}

own_fields! {
    /// PostgreSQL's own fields of `destination:`.
    struct PostgresFields {
        /// `runtime: external`: the NAME of the environment variable holding the connection
        /// string (`postgres://user:password@host:5432/db`) — never the string itself.
        #[schemars(with = "Option<String>")]
        dsn_env: Option<Spanned<String>>,
        /// `{ sql: QUERY }`: a query over the table a user's engine writes (`select * from
        /// readings`); drill finds the ids in any text or JSON column of each row it returns,
        /// and times a row by its `stored_at` column when it has one.
        #[schemars(with = "Option<RawReadBack>")]
        read_back: Option<Spanned<RawReadBack>>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let raw: PostgresFields = section.own()?;
    let common_external = section.external_elsewhere(raw.dsn_env.as_ref().map(|d| &d.referenced))?;
    let table = section.topic().unwrap_or("drill_records");
    if !plain_name(table) {
        return Err(at(
            section.anchor(),
            format!(
                "field `destination.topic`: `{table}` is not a plain table name (lower-case letters, digits and _, at most 63)"
            ),
        ));
    }
    let query = match &raw.read_back {
        None => None,
        Some(r) => match (&r.value.sql, &r.value.file) {
            (Some(sql), None) if !sql.trim().is_empty() => {
                Some(sql.trim().trim_end_matches(';').to_string())
            }
            _ => {
                return Err(at(
                    &r.referenced,
                    "field `destination.read_back`: a postgres destination is read back with a query over your engine's table, e.g. read_back: { sql: \"select * from readings\" }".to_string(),
                ));
            }
        },
    };
    let external = match (&raw.dsn_env, &common_external) {
        (Some(name), Some(ext)) => {
            if let Some(c) = section
                .shared
                .credentials
                .as_ref()
                .filter(|_| !ext.credentials.is_empty())
            {
                return Err(at(
                    &c.referenced,
                    "field `destination.credentials`: the connection string (dsn_env) carries the user and password; leave `credentials` out".to_string(),
                ));
            }
            let dsn = std::env::var(&name.value).map_err(|_| {
                at(
                    &name.referenced,
                    format!(
                        "field `destination.dsn_env`: the environment variable `{}` is not set; export the connection string (postgres://user:password@host:5432/db) in it before the drill",
                        name.value
                    ),
                )
            })?;
            let (login, address) = Login::parse(&dsn).map_err(|e| {
                at(
                    &name.referenced,
                    format!("field `destination.dsn_env`: `{}`: {e}", name.value),
                )
            })?;
            Some(ExternalDb {
                dsn_env: name.value.clone(),
                login,
                address,
            })
        }
        _ => None,
    };
    Ok(Own {
        imp: Arc::new(Postgres {
            table: table.to_string(),
            external,
            query,
        }),
        external: common_external,
    })
}

impl Destination for Postgres {
    fn image(&self) -> Option<(&'static str, &'static str)> {
        Some(broker::IMAGE)
    }

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
            // A user's table: any column the read-back query returns, by name.
            Some(column) if self.query.is_some() && !column.is_empty() => {
                Ok(WriteKeyPlace::Meta(column.to_string()))
            }
            _ if self.query.is_some() => Err(
                "the column of your read-back query that holds it: postgres_column: NAME"
                    .to_string(),
            ),
            _ => Err(format!(
                "the column drill's table keeps it in: postgres_column: {WRITE_KEY}"
            )),
        }
    }

    fn output_options(&self, cfg: &mut crate::engine::OutputConfig) {
        cfg.topic = self.table.clone();
        if let Some(ext) = &self.external {
            // The engine reads the connection string from its environment: the secret is in
            // no file.
            cfg.credentials.dsn_env = Some(ext.dsn_env.clone());
        }
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
            let source = match &self.query {
                Some(sql) => read::Source::Query(sql.clone()),
                None => read::Source::Table(self.table.clone()),
            };
            let reader = read::Reader::new(at.addrs[0], self.login(), source, r);
            Ok(Box::new(reader) as Box<dyn ReadBack>)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::Login;

    #[test]
    fn a_connection_string_gives_a_login_and_an_address() {
        let (login, at) = Login::parse("postgres://plc:s3cret@db.site.local:6543/plant").unwrap();
        assert_eq!(at, "db.site.local:6543");
        assert_eq!(
            (
                login.user.as_str(),
                login.password.as_deref(),
                login.dbname.as_str()
            ),
            ("plc", Some("s3cret"), "plant")
        );
        assert!(!format!("{login:?}").contains("s3cret"), "Debug hides it");
        let (login, at) = Login::parse("host=10.0.0.5 user=plc dbname=plant").unwrap();
        assert_eq!((at.as_str(), login.password), ("10.0.0.5:5432", None));
        let (login, _) = Login::parse("postgres://plc@db").unwrap();
        assert_eq!(login.dbname, "plc", "PostgreSQL's default: the user's name");
        for (bad, says) in [
            ("postgres://db:5432/plant", "names no user"),
            ("host=/var/run/postgresql user=plc", "Unix socket"),
            ("postgres://plc@a,b/plant", "several hosts"),
            ("postgres://plc@db/plant?sslmode=require", "sslmode=require"),
            ("plc at db", "not a PostgreSQL connection string"),
        ] {
            let e = Login::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
