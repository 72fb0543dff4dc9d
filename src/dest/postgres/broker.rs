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

use tokio::process::{Child, Command};

use super::{DATABASE, Postgres, ROLE, WRITE_KEY};
use crate::dest::running::Place;
use crate::dest::{DestError, Destination, Provision, Provisioned, Running};
use crate::process::{StartError, dies_with_drill, free_port};
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

/// A running server; dropping it kills it and removes its folder.
pub struct Server {
    pub addr: SocketAddr,
    pub version: String,
    child: Option<Child>,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
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
    crate::dest::check_broker_faults(&p.needs, false, 1)?;
    let server = start().await?;
    create_table(server.addr, &pg.table, p.needs.message_limit).await?;
    let (addr, version) = (server.addr, server.version.clone());
    let running = Running::new(
        dest,
        vec![addr],
        "process",
        version,
        Place::InProcess(Box::new(server)),
    );
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let link = Link::start(&p.spec.link_name(), any, addr, p.links.clone()).await?;
    Ok(Provisioned {
        links: vec![link],
        running,
        notes: Vec::new(),
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
    let dir = tempdir_for(&user)?;
    let cluster = dir.join("data");
    let init = {
        let mut c = Command::new(bin.join("initdb"));
        c.arg("-D").arg(&cluster);
        c.args([
            "-U",
            ROLE,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        as_user(&mut c, &user);
        c.output().await.map_err(|e| fail(e.to_string()))?
    };
    if !init.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        let said = String::from_utf8_lossy(&init.stderr);
        return Err(fail(format!("initdb failed: {}", said.trim())).into());
    }
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::fs::File::create(dir.join("postgres.log"))?;
        let mut c = Command::new(bin.join("postgres"));
        c.arg("-D").arg(&cluster).arg("-p").arg(port.to_string());
        c.arg("-c").arg("listen_addresses=127.0.0.1");
        c.arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()));
        c.args(["-c", "fsync=on", "-c", "max_connections=200"]);
        as_user(&mut c, &user);
        let child = dies_with_drill(&mut c)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        let mut server = Server {
            addr,
            version: String::new(),
            child: Some(child),
            dir: dir.clone(),
        };
        match answers(addr, server.child.as_mut()).await {
            Ok(version) => {
                server.version = version;
                return Ok(server);
            }
            Err(e) => {
                // Dropping the server would remove the folder: take the child out first.
                if let Some(mut child) = server.child.take() {
                    let _ = child.kill().await;
                }
                std::mem::forget(server);
                let said = std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_default();
                last = match said.lines().rfind(|l| !l.trim().is_empty()) {
                    Some(line) => format!("{e} (postgres said: {})", line.trim()),
                    None => e,
                };
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Err(fail(last).into())
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

/// Waits (at most 30 s) until the server answers `SELECT version()`.
async fn answers(addr: SocketAddr, mut child: Option<&mut Child>) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match connect(addr, "postgres").await {
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
                return Err(format!("no answer after 30 s: {e}"));
            }
            Err(_) => {}
        }
        if let Some(c) = child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return Err(format!("postgres exited with {status}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client of database `db` as drill's role; the connection runs on its own task.
pub async fn connect(addr: SocketAddr, db: &str) -> Result<tokio_postgres::Client, String> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(addr.ip().to_string())
        .port(addr.port())
        .user(ROLE)
        .dbname(db)
        .connect_timeout(Duration::from_secs(3));
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(client)
}

/// The drill's database and table (dropped first if a table of that name is there), with a
/// CHECK on the payload's size when the drill has poison records.
pub async fn create_table(
    addr: SocketAddr,
    table: &str,
    message_limit: Option<usize>,
) -> Result<(), DestError> {
    let fail = |e: String| DestError::Reader(format!("creating the table: {e}"));
    let admin = connect(addr, "postgres").await.map_err(fail)?;
    admin
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let client = connect(addr, DATABASE).await.map_err(fail)?;
    let check = message_limit.map_or(String::new(), |limit| {
        format!(", CHECK (octet_length(payload::text) <= {limit})")
    });
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} ({WRITE_KEY} text PRIMARY KEY, id text NOT NULL, key text,
               seq bigint, payload jsonb, stored_at timestamptz DEFAULT clock_timestamp(){check})"
        ))
        .await
        .map_err(|e| fail(e.to_string()))
}
