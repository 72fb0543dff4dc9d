//! The container runtime: brokers as containers, created, started and removed through the Docker
//! engine's API (bollard).
//!
//! A destination kind says how its broker runs in a container — the image (an official one by
//! default, overridable by `DRILL_IMAGE_<KIND>`: pinned digests, offline mirrors, or the
//! `drill-local/*` images `ci/images.sh` builds from local binaries), the entrypoint, arguments,
//! environment and files ([`Launch`]), and how to tell it answers its protocol ([`Ready`]) — in
//! its own `dest/<kind>/broker.rs`. This module knows no kind: it pulls, starts, publishes,
//! kills, pauses, restarts and removes.
//!
//! Every container carries the labels `drill=1` and `drill.run=<run id>`, publishes its one
//! port on 127.0.0.1 only, and is removed when its [`ContainerBroker`] is stopped or dropped
//! (normal end, error, SIGINT, SIGTERM, panic).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use bollard::query_parameters::{
    CreateImageOptions, KillContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StopContainerOptions, UploadToContainerOptions,
};
use futures::StreamExt;
use futures::future::BoxFuture;

use crate::process::StartError;

/// The label every drill container carries (for finding leftovers: `docker ps -a --filter
/// label=drill`).
pub const LABEL: &str = "drill";

/// The image to run: the environment variable `var`'s override, else the official image.
pub fn image_for(var: &str, official: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| official.to_string())
}

/// A Docker engine that answered a ping, or why not.
pub async fn daemon() -> Result<Docker, String> {
    let docker = Docker::connect_with_defaults().map_err(|e| format!("no Docker engine: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(3), docker.ping()).await {
        Ok(Ok(_)) => Ok(docker),
        Ok(Err(e)) => Err(format!("no Docker engine answers: {e}")),
        Err(_) => Err("no Docker engine answers within 3 s".to_string()),
    }
}

/// The image's id, pulling it first when it is not present; `Err` says why it cannot be had.
pub async fn ensure_image(docker: &Docker, image: &str) -> Result<String, String> {
    if let Ok(found) = docker.inspect_image(image).await {
        return Ok(found.id.unwrap_or_default());
    }
    let (name, tag) = split_image(image);
    let options = CreateImageOptions {
        from_image: Some(name.to_string()),
        tag: Some(tag.to_string()),
        ..Default::default()
    };
    let mut pull = docker.create_image(Some(options), None, None);
    while let Some(step) = pull.next().await {
        if let Err(e) = step {
            return Err(format!("image {image} cannot be pulled: {e}"));
        }
    }
    docker
        .inspect_image(image)
        .await
        .map(|i| i.id.unwrap_or_default())
        .map_err(|e| format!("image {image} is not there after a pull: {e}"))
}

/// `name:tag` (a digest or no tag count as `latest` where there is none).
fn split_image(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, tag),
        _ => (image, "latest"),
    }
}

/// Removes every container labelled `drill.run=<run>` (created or running).
pub async fn remove_labelled(docker: &Docker, run: &str) {
    let filters = [("label".to_string(), vec![format!("drill.run={run}")])]
        .into_iter()
        .collect();
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for c in list {
        if let Some(id) = c.id {
            remove_by_id(docker, &id).await;
        }
    }
}

/// Removes one container, running or not, with its anonymous volumes.
async fn remove_by_id(docker: &Docker, id: &str) {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    let _ = docker.remove_container(id, Some(options)).await;
}

/// A broker running in a container.
pub struct ContainerBroker {
    /// The container's id; `None` once it is removed.
    id: Option<String>,
    docker: Docker,
    ready: Ready,
    /// The port it listens on inside the container, as Docker names it (`1883/tcp`).
    binding: String,
    /// Where it listens on this machine (127.0.0.1 and the published port).
    pub addr: SocketAddr,
    pub image: String,
    pub image_id: String,
}

impl ContainerBroker {
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// SIGKILL inside the container; it stays, stopped, until [`ContainerBroker::restart`].
    pub async fn kill(&mut self) {
        if let Some(id) = self.id() {
            let _ = self
                .docker
                .kill_container(id, None::<KillContainerOptions>)
                .await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; it stays, stopped, until [`ContainerBroker::restart`].
    pub async fn stop(&mut self) {
        if let Some(id) = self.id() {
            let options = StopContainerOptions {
                t: Some(10),
                signal: None,
            };
            let _ = self.docker.stop_container(id, Some(options)).await;
        }
    }

    pub async fn pause(&mut self) {
        if let Some(id) = self.id() {
            let _ = self.docker.pause_container(id).await;
        }
    }

    pub async fn resume(&mut self) {
        if let Some(id) = self.id() {
            let _ = self.docker.unpause_container(id).await;
        }
    }

    /// Starts the (killed or stopped) container again, and waits (at most 60 s) until the
    /// broker answers. Its published port may change: the new address is returned, and the
    /// caller points the proxy link at it.
    pub async fn restart(&mut self) -> Result<SocketAddr, StartError> {
        let fail = |why: String| StartError {
            what: format!("container {}", self.image),
            why,
        };
        let id = self
            .id()
            .ok_or_else(|| fail("the container is gone".to_string()))?
            .to_string();
        self.docker
            .start_container(&id, None)
            .await
            .map_err(|e| fail(e.to_string()))?;
        self.addr = published(&self.docker, &id, &self.binding)
            .await
            .map_err(|e| fail(format!("{e} after the restart")))?;
        wait_answers(&self.ready, self.addr)
            .await
            .map_err(|e| fail(format!("no answer on {} within 60 s: {e}", self.addr)))?;
        Ok(self.addr)
    }

    /// The report's name for it: the image and its short id.
    pub fn describe(&self) -> String {
        let short: String = self
            .image_id
            .trim_start_matches("sha256:")
            .chars()
            .take(12)
            .collect();
        format!("{} (image {short})", self.image)
    }

    /// Removes the container.
    pub async fn remove(&mut self) {
        if let Some(id) = self.id.take() {
            remove_by_id(&self.docker, &id).await;
        }
    }
}

impl Drop for ContainerBroker {
    /// A broker that was not removed (an error, a panic, a cancelled drill) is removed here. The
    /// caller's runtime may be shutting down or be the one this blocks, so the removal runs on
    /// a thread with its own runtime and its own connection to the engine, and is waited for:
    /// when the drill exits, the container is gone.
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let removal = std::thread::Builder::new()
            .name("drill-container-removal".to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let Ok(runtime) = runtime else { return };
                runtime.block_on(async {
                    if let Ok(docker) = Docker::connect_with_defaults() {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(30),
                            remove_by_id(&docker, &id),
                        )
                        .await;
                    }
                });
            });
        if let Ok(removal) = removal {
            let _ = removal.join();
        }
    }
}

/// The host address Docker published the container's `port` on (127.0.0.1 only).
async fn published(docker: &Docker, id: &str, key: &str) -> Result<SocketAddr, String> {
    let inspect = docker
        .inspect_container(id, None)
        .await
        .map_err(|e| e.to_string())?;
    let host_port = inspect
        .network_settings
        .and_then(|n| n.ports)
        .and_then(|p| p.get(key).cloned().flatten())
        .and_then(|b| b.into_iter().find_map(|b| b.host_port))
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| format!("no published port for {key}"))?;
    Ok(([127, 0, 0, 1], host_port).into())
}

/// A tar archive (POSIX ustar) holding `files` at their absolute paths, for an upload to `/`.
/// Docker creates the parent directories. Paths longer than the format's 100 + 155 bytes, or
/// files of 8 GiB and more, are refused.
fn tar_of(files: &[(String, Vec<u8>)]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for (path, bytes) in files {
        let name = path.trim_start_matches('/');
        let (prefix, base) = match name.len() {
            0 => return Err(format!("{path:?} is not a file path")),
            1..=100 => ("", name),
            _ => name
                .char_indices()
                .filter(|&(i, c)| c == '/' && i <= 155 && name.len() - i - 1 <= 100)
                .map(|(i, _)| (&name[..i], &name[i + 1..]))
                .next()
                .ok_or_else(|| format!("{path:?} is too long for a tar header"))?,
        };
        if bytes.len() as u64 >= 8 << 30 {
            return Err(format!("{path:?} is too large for a tar header"));
        }
        let mut header = [0u8; 512];
        let field = |header: &mut [u8; 512], at: usize, value: &[u8]| {
            header[at..at + value.len()].copy_from_slice(value);
        };
        field(&mut header, 0, base.as_bytes());
        // A private key stays readable by its owner only (the broker runs as root inside).
        let mode: &[u8] = if name.ends_with("key.pem") {
            b"0000600\0"
        } else {
            b"0000644\0"
        };
        field(&mut header, 100, mode);
        field(&mut header, 108, b"0000000\0");
        field(&mut header, 116, b"0000000\0");
        field(
            &mut header,
            124,
            format!("{:011o}\0", bytes.len()).as_bytes(),
        );
        field(&mut header, 136, b"00000000000\0");
        field(&mut header, 148, b"        ");
        header[156] = b'0';
        field(&mut header, 257, b"ustar\0");
        field(&mut header, 263, b"00");
        field(&mut header, 345, prefix.as_bytes());
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        field(&mut header, 148, format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(bytes);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    Ok(out)
}

/// Where a broker in a container finds the drill's TLS files ([`tls_files`]).
pub const TLS_CA: &str = "/tmp/drill-tls/ca.pem";
pub const TLS_CERT: &str = "/tmp/drill-tls/server.pem";
pub const TLS_KEY: &str = "/tmp/drill-tls/server-key.pem";

/// The drill's CA, the broker's certificate and its key, as files to copy into a container
/// (at [`TLS_CA`], [`TLS_CERT`], [`TLS_KEY`]). Copied, not bound (a bind needs the engine on
/// this machine); the key is of mode 0600 inside, as outside.
pub fn tls_files(files: &crate::tls::TlsFiles) -> Result<Vec<(String, Vec<u8>)>, std::io::Error> {
    Ok(vec![
        (TLS_CA.to_string(), std::fs::read(&files.ca_file)?),
        (
            TLS_CERT.to_string(),
            std::fs::read(&files.server_cert_file)?,
        ),
        (TLS_KEY.to_string(), std::fs::read(&files.server_key_file)?),
    ])
}

/// How a broker binary is started inside the container: said by its destination kind.
#[derive(Default)]
pub struct Launch {
    pub entrypoint: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Files copied in before it starts: path → contents.
    pub files: Vec<(String, Vec<u8>)>,
    /// The one port it listens on inside the container.
    pub port: u16,
    /// Publish it on this host port (a broker that advertises its own address must know it in
    /// advance); `None`: a port Docker picks.
    pub host_port: Option<u16>,
    /// The port is a UDP one (a datagram receiver); else TCP.
    pub udp: bool,
    /// Folders of this machine bound into the container: host path → container path (a
    /// receiver that writes what it received where drill's reader follows it). Needs the
    /// Docker engine on this machine.
    pub mounts: Vec<(std::path::PathBuf, String)>,
    /// Run as this `uid:gid` (files it writes in a mount belong to drill's user); `None`: the
    /// image's user.
    pub user: Option<String>,
}

impl Launch {
    /// The port as Docker names it: `1883/tcp`, `5140/udp`.
    fn binding(&self) -> String {
        let protocol = if self.udp { "udp" } else { "tcp" };
        format!("{}/{protocol}", self.port)
    }
}

/// Whether the broker at an address answers its own protocol (an MQTT CONNECT, a JetStream
/// account-info request, a Kafka metadata request): the kind's readiness check.
/// A shared closure, so a check may carry what it needs (the TLS a client of the broker trusts).
pub type Ready =
    std::sync::Arc<dyn Fn(SocketAddr) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A kind's readiness check that needs nothing but the address.
pub fn ready(check: fn(SocketAddr) -> BoxFuture<'static, Result<(), String>>) -> Ready {
    std::sync::Arc::new(check)
}

/// Waits (at most 60 s) until the broker at `addr` answers its protocol.
async fn wait_answers(ready: &Ready, addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), ready(addr)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if Instant::now() > deadline => return Err(e),
            Err(_) if Instant::now() > deadline => return Err("no answer".to_string()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Where a broker runs as a container: the engine, the image and its id.
pub struct Placement {
    pub docker: Docker,
    pub image: String,
    pub image_id: String,
}

/// What Docker is asked to create: the image with the plan's entrypoint, arguments and
/// environment, drill's labels, and its one port published on 127.0.0.1 only.
fn create_body(image: &str, plan: &Launch, run: &str) -> ContainerCreateBody {
    let binding = plan.binding();
    let host_port = plan.host_port.map(|p| p.to_string()).unwrap_or_default();
    let binds: Vec<String> = plan
        .mounts
        .iter()
        .map(|(host, inside)| format!("{}:{inside}", host.display()))
        .collect();
    ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec![plan.entrypoint.clone()]),
        cmd: Some(plan.args.clone()),
        env: Some(plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        user: plan.user.clone(),
        labels: Some(
            [(LABEL, "1"), ("drill.run", run)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        exposed_ports: Some(vec![binding.clone()]),
        host_config: Some(HostConfig {
            binds: (!binds.is_empty()).then_some(binds),
            // Published on loopback only, on a port the engine picks (or the one asked for).
            publish_all_ports: Some(false),
            port_bindings: Some(
                [(
                    binding,
                    Some(vec![PortBinding {
                        host_ip: Some("127.0.0.1".to_string()),
                        host_port: Some(host_port),
                    }]),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Starts `plan` from the placement's image (already present), labelled with `run`, its port
/// published on 127.0.0.1. Returns once the broker answers its protocol there (`ready`).
pub async fn start(
    at: Placement,
    plan: Launch,
    run: &str,
    ready: Ready,
) -> Result<ContainerBroker, StartError> {
    let Placement {
        docker,
        image,
        image_id,
    } = at;
    let fail = |why: String| StartError {
        what: format!("container {image}"),
        why,
    };
    let body = create_body(&image, &plan, run);
    let archive = tar_of(&plan.files).map_err(fail)?;
    let id = docker
        .create_container(None, body)
        .await
        .map_err(|e| fail(e.to_string()))?
        .id;
    // From here on the container exists: the broker value removes it on every way out.
    let mut broker = ContainerBroker {
        id: Some(id.clone()),
        docker,
        ready: ready.clone(),
        binding: plan.binding(),
        addr: ([127, 0, 0, 1], 0).into(),
        image: image.clone(),
        image_id,
    };
    let started = async {
        if !plan.files.is_empty() {
            let options = UploadToContainerOptions {
                path: "/".to_string(),
                ..Default::default()
            };
            let body = bollard::body_full(archive.into());
            broker
                .docker
                .upload_to_container(&id, Some(options), body)
                .await
                .map_err(|e| format!("copying files in: {e}"))?;
        }
        broker
            .docker
            .start_container(&id, None)
            .await
            .map_err(|e| e.to_string())?;
        let addr = published(&broker.docker, &id, &plan.binding()).await?;
        // The published port accepts connections before the broker does (Docker's proxy
        // answers for it): wait for the protocol's own answer.
        wait_answers(&ready, addr)
            .await
            .map_err(|e| format!("no answer on {addr} within 60 s: {e}"))?;
        Ok::<_, String>(addr)
    }
    .await;
    match started {
        Ok(addr) => {
            broker.addr = addr;
            Ok(broker)
        }
        Err(why) => {
            broker.remove().await;
            Err(fail(why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tar_of;

    /// The archive is what `tar` reads: the file at its path, its bytes, nothing else.
    #[test]
    fn tar_holds_the_files_at_their_paths() {
        let long = format!("/{}/{}", "d".repeat(120), "f".repeat(90));
        let files = vec![
            (
                "/tmp/drill-mosquitto.conf".to_string(),
                b"listener 1883\n".to_vec(),
            ),
            (long.clone(), vec![7u8; 513]),
        ];
        let archive = tar_of(&files).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        std::fs::write(&path, &archive).unwrap();
        let out = std::process::Command::new("tar")
            .args(["-tvf"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("tmp/drill-mosquitto.conf"), "{listing}");
        assert!(listing.contains(long.trim_start_matches('/')), "{listing}");
        let x = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&path)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(x.success());
        let conf = std::fs::read(dir.path().join("tmp/drill-mosquitto.conf")).unwrap();
        assert_eq!(conf, b"listener 1883\n");
        let big = std::fs::read(dir.path().join(long.trim_start_matches('/'))).unwrap();
        assert_eq!(big, vec![7u8; 513]);
    }

    #[test]
    fn tar_refuses_what_it_cannot_hold() {
        let long = format!("/{}", "x".repeat(300));
        assert!(tar_of(&[(long, Vec::new())]).is_err());
        assert!(tar_of(&[("/".to_string(), Vec::new())]).is_err());
    }
}
