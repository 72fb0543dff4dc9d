//! The receiving side of a postgres destination: Debian's PostgreSQL as a local process.
//!
//! `initdb` makes a cluster in a folder of its own under the system's temporary folder (the
//! drill's work folder may not be reachable by the server's user), the server listens on one
//! free 127.0.0.1 port with its socket in that folder, trusts local connections of the role
//! `drill`, and keeps fsync on. When drill runs as root, both run as the `postgres` user
//! (PostgreSQL refuses to run as root). The folder is removed when the server is.
//!
//! The binaries are found in `DRILL_POSTGRES_BIN` (a folder), `/usr/lib/postgresql/<newest>/bin`
//! (Debian), or on PATH.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use nix::sys::signal::Signal;
use tokio::process::Command;

use super::read::Source;
use super::{DATABASE, ExternalDb, Login, Postgres, ROLE, WRITE_KEY};
use crate::dest::running::{Halts, LocalNode, Place};
use crate::dest::{DestError, Destination, Provision, Provisioned, Running, Runtime};
use crate::process::{LocalProcess, Signals, StartError, dies_with_drill, free_port};
use crate::proxy::Link;

/// What to install when PostgreSQL is not found.
pub const MISSING: &str = "PostgreSQL is not installed (looked at DRILL_POSTGRES_BIN, /usr/lib/postgresql/*/bin and PATH); install it (Debian: apt-get install postgresql, or run ci/setup.sh)";

/// The folder with `initdb` and `postgres`.
pub fn find_bin() -> Option<PathBuf> {
    let given = std::env::var_os("DRILL_POSTGRES_BIN").map(PathBuf::from);
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, p)| p);
    let on_path =
        crate::process::find_binary("initdb", &[]).and_then(|p| p.parent().map(Path::to_path_buf));
    [given, debian, on_path]
        .into_iter()
        .flatten()
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
}

/// A cluster's folder and the server's user; dropping the last handle removes the folder.
struct Cluster {
    bin: PathBuf,
    user: Option<nix::unistd::User>,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running server; dropping it kills it (with its backends) and removes its folder.
pub struct Server {
    pub addr: SocketAddr,
    pub version: String,
    process: Option<LocalProcess>,
    cluster: Arc<Cluster>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(p) = &self.process {
            p.kill_group_now();
        }
    }
}

/// The signals each broker fault sends. The server leads its own process group: a kill
/// SIGKILLs it with every backend at once (no backend left holding the shared memory, so it
/// starts again at once, with crash recovery); a stop is a fast shutdown (SIGINT); a crash is
/// an immediate shutdown (SIGQUIT, as `pg_ctl stop -m immediate`: no checkpoint).
pub const HALTS: Halts = Halts {
    kill: Signals {
        signal: Signal::SIGKILL,
        group: true,
    },
    stop: Signals {
        signal: Signal::SIGINT,
        group: false,
    },
    crash: Signals {
        signal: Signal::SIGQUIT,
        group: false,
    },
};

impl Server {
    /// The server as a broker node the drill's broker faults can halt and start again: the
    /// same folder, the same port.
    fn into_node(mut self) -> LocalNode {
        let cluster = self.cluster.clone();
        let what = format!("PostgreSQL ({})", cluster.bin.display());
        LocalNode::restartable(
            "postgres",
            self.addr,
            self.process.take(),
            HALTS,
            what,
            move |port| {
                let cluster = cluster.clone();
                async move { run(&cluster, port).await.map(|(process, _)| process) }.boxed()
            },
        )
    }
}

/// The user the server runs as: `postgres` when drill is root, else drill's own (`None`).
fn server_user() -> Result<Option<nix::unistd::User>, DestError> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name("postgres") {
        Ok(Some(user)) => Ok(Some(user)),
        _ => Err(DestError::Missing(
            "PostgreSQL refuses to run as root and there is no `postgres` user to run it as; install Debian's postgresql (it creates one) or run drill as another user".to_string(),
        )),
    }
}

fn as_user(command: &mut Command, user: &Option<nix::unistd::User>) {
    if let Some(u) = user {
        command.uid(u.uid.as_raw()).gid(u.gid.as_raw());
    }
}

/// Starts the server and puts the link in front of it; creates the drill's table.
pub(super) async fn provision(
    dest: Arc<dyn Destination>,
    pg: &Postgres,
    p: Provision<'_>,
) -> Result<Provisioned, DestError> {
    if let Some(ext) = &pg.external {
        return provision_external(dest, pg, ext, p).await;
    }
    let table = pg.query.is_none().then_some(pg.table.as_str());
    let mut notes = Vec::new();
    let runtime = match p.runtime {
        Runtime::Auto if find_bin().is_some() => Runtime::Process,
        other => other,
    };
    let local = "the local PostgreSQL";
    if let Some(at) = crate::dest::place(IMAGE, local, runtime, &mut notes).await? {
        let container = crate::container::start(
            at,
            launch(),
            p.run_id,
            crate::container::ready(answers_in_container),
        )
        .await?;
        let addr = container.addr;
        create_database(addr, table, p.needs.message_limit).await?;
        let version = version(addr).await;
        let running = Running::new(
            dest,
            vec![addr],
            "container",
            format!("{version} in {}", container.describe()),
            Place::Container(Box::new(container)),
        );
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let link = Link::start(&p.spec.link_name(), any, addr, p.links.clone()).await?;
        return Ok(Provisioned {
            links: vec![link],
            running,
            notes,
        });
    }
    if p.needs.pauses {
        return Err(DestError::ContainerUnavailable(
            "a local PostgreSQL cannot be paused (a container can: --runtime container); kill, stop or crash it".to_string(),
        ));
    }
    let server = start().await?;
    create_database(server.addr, table, p.needs.message_limit).await?;
    let (addr, version) = (server.addr, server.version.clone());
    let running = Running::new(
        dest,
        vec![addr],
        "process",
        version,
        Place::Nodes(vec![server.into_node()]),
    );
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let link = Link::start(&p.spec.link_name(), any, addr, p.links.clone()).await?;
    Ok(Provisioned {
        links: vec![link],
        running,
        notes,
    })
}

/// The image for `runtime: container`: the official one unless `DRILL_IMAGE_POSTGRES` names
/// another (`ci/images.sh` builds `drill-local/postgres` from this machine's binaries).
pub(crate) const IMAGE: (&str, &str) = ("DRILL_IMAGE_POSTGRES", "postgres:15");

/// Inside the container: the cluster made on first start (not again after a restart: a crash
/// leaves it for recovery) trusting drill's role from anywhere (the container's port is
/// published on 127.0.0.1 only), the server on 5432, as the image's `postgres` user (uid 999 in the
/// official image and in drill's). The image's own entrypoint is not used: drill's role and
/// trust come from its own initdb, the same in both images.
fn launch() -> crate::container::Launch {
    let script = format!(
        "D=/tmp/drill-pgdata; [ -s $D/PG_VERSION ] || {{ initdb -D $D -U {ROLE} --auth=trust -E UTF8 --no-sync --no-instructions >/dev/null && echo 'host all all all trust' >> $D/pg_hba.conf; }} && exec postgres -D $D -p 5432 -c listen_addresses='*' -c unix_socket_directories=/tmp -c fsync=on -c max_connections=200"
    );
    crate::container::Launch {
        entrypoint: "/bin/sh".into(),
        args: vec!["-c".into(), script],
        env: vec![
            (
                "PATH".into(),
                "/usr/lib/postgresql/17/bin:/usr/lib/postgresql/16/bin:/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin".into(),
            ),
            ("TZ".into(), "UTC".into()),
        ],
        port: 5432,
        user: Some("999:999".into()),
        ..Default::default()
    }
}

/// The container's readiness: the server answers a query.
fn answers_in_container(
    addr: SocketAddr,
) -> futures::future::BoxFuture<'static, Result<(), String>> {
    async move {
        let client = connect(addr, &admin()).await?;
        client
            .simple_query("SELECT 1")
            .await
            .map(drop)
            .map_err(|e| super::read::message(&e))
    }
    .boxed()
}

/// `PostgreSQL 15.18 (Debian 15.18-1.pgdg120+1)`, or what is known.
async fn version(addr: SocketAddr) -> String {
    let Ok(client) = connect(addr, &admin()).await else {
        return "PostgreSQL".to_string();
    };
    client
        .query_one("SELECT version()", &[])
        .await
        .map(|row| row.get::<_, String>(0))
        .map(|full| full.split(" on ").next().unwrap_or(&full).to_string())
        .unwrap_or_else(|_| "PostgreSQL".to_string())
}

/// The user's database: reached at the connection string's host:port and logged in to; then
/// drill's table made there (only if none of that name exists: drill drops only what it
/// made), or the user's read-back query checked; one link in front.
async fn provision_external(
    dest: Arc<dyn Destination>,
    pg: &Postgres,
    ext: &ExternalDb,
    p: Provision<'_>,
) -> Result<Provisioned, DestError> {
    if p.needs.broker_faults {
        return Err(DestError::Unsupported(
            "broker faults on an external database: drill stops nothing it did not start; use the local process (leave `runtime` out)".to_string(),
        ));
    }
    let server = crate::dest::reach(&ext.address, "destination.dsn_env")
        .await
        .map_err(DestError::External)?;
    let login = &ext.login;
    let client = connect(server, login).await.map_err(|e| {
        DestError::External(format!(
            "cannot log in to {} as `{}`, database `{}` (destination.dsn_env `{}`): {e}",
            ext.address, login.user, login.dbname, ext.dsn_env
        ))
    })?;
    let version = version(server).await;
    let mut made: Option<crate::dest::running::Remove> = None;
    let what = match &pg.query {
        Some(sql) => {
            super::read::statement(&client, &Source::Query(sql.clone()))
                .await
                .map_err(DestError::Invalid)?;
            "drill reads your engine's table with destination.read_back.sql and creates nothing"
                .to_string()
        }
        None => {
            let table = &pg.table;
            let exists: bool = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
                .await
                .map_err(|e| DestError::External(super::read::message(&e)))?
                .get(0);
            if exists {
                return Err(DestError::Invalid(format!(
                    "a table `{table}` exists in database `{}` at {}; drill creates a table of its own and drops only what it created — name another with destination.topic, or read your engine's table with read_back.sql",
                    login.dbname, ext.address
                )));
            }
            create_table(&client, table, p.needs.message_limit).await?;
            if !p.spec.external.as_ref().is_some_and(|e| e.keep) {
                let (login, table) = (login.clone(), table.clone());
                made = Some(Box::new(move || {
                    async move {
                        let client = connect(server, &login).await?;
                        client
                            .batch_execute(&format!("DROP TABLE {table}"))
                            .await
                            .map_err(|e| super::read::message(&e))
                    }
                    .boxed()
                }));
            }
            format!(
                "table `{table}` {}",
                crate::dest::external::made_or_found(true, made.is_none())
            )
        }
    };
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let link = Link::start(&p.spec.link_name(), any, server, p.links.clone()).await?;
    let running = Running::new(
        dest,
        vec![server],
        "external",
        format!("{version} (external, {})", ext.address),
        Place::External { made },
    );
    Ok(Provisioned {
        links: vec![link],
        running,
        notes: vec![format!(
            "external PostgreSQL at {}, database `{}` as `{}`: drill started nothing; {what}",
            ext.address, login.dbname, login.user
        )],
    })
}

/// `initdb`, then the server on a free port; returns once it answers a query.
pub async fn start() -> Result<Server, DestError> {
    let bin = find_bin().ok_or_else(|| DestError::Missing(MISSING.to_string()))?;
    let user = server_user()?;
    let fail = |why: String| StartError {
        what: format!("PostgreSQL ({})", bin.display()),
        why,
    };
    let cluster = Arc::new(Cluster {
        dir: tempdir_for(&user)?,
        bin: bin.clone(),
        user,
    });
    let init = {
        let mut c = Command::new(bin.join("initdb"));
        c.arg("-D").arg(cluster.dir.join("data"));
        c.args([
            "-U",
            ROLE,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        as_user(&mut c, &cluster.user);
        c.output().await.map_err(|e| fail(e.to_string()))?
    };
    if !init.status.success() {
        let said = String::from_utf8_lossy(&init.stderr);
        return Err(fail(format!("initdb failed: {}", said.trim())).into());
    }
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port()?;
        match run(&cluster, port).await {
            Ok((process, version)) => {
                return Ok(Server {
                    addr: ([127, 0, 0, 1], port).into(),
                    version,
                    process: Some(process),
                    cluster,
                });
            }
            Err(e) => last = e,
        }
    }
    Err(fail(last).into())
}

/// The server of `cluster` on `port`, in a process group of its own; once it answers, with
/// its version. Its log is `postgres.log` in the cluster's folder (appended to: a crash and
/// the recovery after it are both there).
async fn run(cluster: &Cluster, port: u16) -> Result<(LocalProcess, String), String> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log_path = cluster.dir.join("postgres.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| e.to_string())?;
    let mut c = Command::new(cluster.bin.join("postgres"));
    c.arg("-D").arg(cluster.dir.join("data"));
    c.arg("-p").arg(port.to_string());
    c.arg("-c").arg("listen_addresses=127.0.0.1");
    c.arg("-c")
        .arg(format!("unix_socket_directories={}", cluster.dir.display()));
    c.args(["-c", "fsync=on", "-c", "max_connections=200"]);
    c.process_group(0);
    as_user(&mut c, &cluster.user);
    let child = dies_with_drill(&mut c)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut process = LocalProcess::new(child);
    match answers(addr, &mut process).await {
        Ok(version) => Ok((process, version)),
        Err(e) => {
            process.signal(HALTS.kill, Duration::ZERO).await;
            Err(crate::dest::running::with_last_line(e, &log_path, "postgres"))
        }
    }
}

/// A folder of its own for the cluster, owned by the server's user.
fn tempdir_for(user: &Option<nix::unistd::User>) -> Result<PathBuf, DestError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drill-postgres-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    if let Some(u) = user {
        nix::unistd::chown(&dir, Some(u.uid), Some(u.gid)).map_err(std::io::Error::from)?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// Waits (at most 60 s: crash recovery replays the WAL first) until the server answers
/// `SELECT version()`.
async fn answers(addr: SocketAddr, process: &mut LocalProcess) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match connect(addr, &admin()).await {
            Ok(client) => {
                let row = client
                    .query_one("SELECT version()", &[])
                    .await
                    .map_err(|e| e.to_string())?;
                let full: String = row.get(0);
                // "PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64-pc-linux-gnu, …"
                let short = full.split(" on ").next().unwrap_or(&full).to_string();
                return Ok(short);
            }
            Err(e) if Instant::now() > deadline => {
                return Err(format!("no answer after 60 s: {e}"));
            }
            Err(_) => {}
        }
        if let Some(status) = process.exited() {
            return Err(format!("postgres exited with {status}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client logged in as `login`; the connection runs on its own task.
pub async fn connect(addr: SocketAddr, login: &Login) -> Result<tokio_postgres::Client, String> {
    let (client, mut connection) = connect_owned(addr, login).await?;
    connection.detach_all();
    Ok(client)
}

/// [`connect`], with the task that drives the connection: dropping the set closes the
/// connection at once, answered or not (tokio-postgres otherwise keeps a connection open while
/// any statement on it waits for its answer, after the client is gone).
pub async fn connect_owned(
    addr: SocketAddr,
    login: &Login,
) -> Result<(tokio_postgres::Client, tokio::task::JoinSet<()>), String> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(addr.ip().to_string())
        .port(addr.port())
        .user(&login.user)
        .dbname(&login.dbname)
        .connect_timeout(Duration::from_secs(3));
    if let Some(password) = &login.password {
        config.password(password);
    }
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| super::read::message(&e))?;
    let mut task = tokio::task::JoinSet::new();
    task.spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// drill's role on its own server's maintenance database.
fn admin() -> Login {
    Login {
        dbname: "postgres".to_string(),
        ..Login::drill()
    }
}

/// drill's database on its own server, and in it the drill's table (dropped first if one of
/// that name is there) — none when a user's engine writes its own (`table: None`).
pub async fn create_database(
    addr: SocketAddr,
    table: Option<&str>,
    message_limit: Option<usize>,
) -> Result<(), DestError> {
    let fail = |e: String| DestError::Reader(format!("creating the database: {e}"));
    let client = connect(addr, &admin()).await.map_err(fail)?;
    client
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let Some(table) = table else {
        return Ok(());
    };
    let client = connect(addr, &Login::drill()).await.map_err(fail)?;
    client
        .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
        .await
        .map_err(|e| fail(e.to_string()))?;
    create_table(&client, table, message_limit).await
}

/// The drill's table: a key column, the record's fields, `stored_at`, and a CHECK on the
/// payload's size when the drill has poison records.
pub async fn create_table(
    client: &tokio_postgres::Client,
    table: &str,
    message_limit: Option<usize>,
) -> Result<(), DestError> {
    let check = message_limit.map_or(String::new(), |limit| {
        format!(", CHECK (octet_length(payload::text) <= {limit})")
    });
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} ({WRITE_KEY} text PRIMARY KEY, id text NOT NULL, key text,
               seq bigint, payload jsonb, stored_at timestamptz DEFAULT clock_timestamp(){check})"
        ))
        .await
        .map_err(|e| {
            DestError::Reader(format!(
                "creating the table {table}: {}",
                super::read::message(&e)
            ))
        })
}
