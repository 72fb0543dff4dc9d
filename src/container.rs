//! The container runtime: brokers as containers, started and removed through testcontainers.
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

use futures::StreamExt;
pub use testcontainers::bollard::Docker;
use testcontainers::core::{ContainerPort, IntoContainerPort};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

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
    let options = testcontainers::bollard::query_parameters::CreateImageOptions {
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
    use testcontainers::bollard::query_parameters::{
        ListContainersOptions, RemoveContainerOptions,
    };
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
            let _ = docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptions {
                        force: true,
                        v: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
    }
}

/// A broker running in a container.
pub struct ContainerBroker {
    container: Option<ContainerAsync<GenericImage>>,
    docker: Docker,
    ready: Ready,
    port: ContainerPort,
    /// Where it listens on this machine (127.0.0.1 and the published port).
    pub addr: SocketAddr,
    pub image: String,
    pub image_id: String,
}

impl ContainerBroker {
    pub fn id(&self) -> Option<&str> {
        self.container.as_ref().map(|c| c.id())
    }

    /// SIGKILL inside the container; it stays, stopped, until [`ContainerBroker::restart`].
    pub async fn kill(&mut self) {
        if let Some(id) = self.id() {
            let _ = self.docker.kill_container(id, None).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; it stays, stopped, until [`ContainerBroker::restart`].
    pub async fn stop(&mut self) {
        if let Some(c) = &self.container {
            let _ = c.stop_with_timeout(Some(10)).await;
        }
    }

    pub async fn pause(&mut self) {
        if let Some(c) = &self.container {
            let _ = c.pause().await;
        }
    }

    pub async fn resume(&mut self) {
        if let Some(c) = &self.container {
            let _ = c.unpause().await;
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
        let inspect = self
            .docker
            .inspect_container(&id, None)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let key = format!("{}/tcp", self.port.as_u16());
        let port = inspect
            .network_settings
            .and_then(|n| n.ports)
            .and_then(|p| p.get(&key).cloned().flatten())
            .and_then(|b| b.into_iter().find_map(|b| b.host_port))
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| fail(format!("no published port for {key} after the restart")))?;
        self.addr = ([127, 0, 0, 1], port).into();
        wait_answers(self.ready, self.addr)
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
        if let Some(c) = self.container.take() {
            let _ = c.rm().await;
        }
    }
}

/// How a broker binary is started inside the container: said by its destination kind.
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
}

/// Whether the broker at an address answers its own protocol (an MQTT CONNECT, a JetStream
/// account-info request, a Kafka metadata request): the kind's readiness check.
pub type Ready = fn(SocketAddr) -> BoxFuture<'static, Result<(), String>>;

/// Waits (at most 60 s) until the broker at `addr` answers its protocol.
async fn wait_answers(ready: Ready, addr: SocketAddr) -> Result<(), String> {
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
    let image = image.as_str();
    let (name, tag) = split_image(image);
    let port = plan.port.tcp();
    let binding = format!("{}/tcp", plan.port);
    let host_port = plan.host_port.map(|p| p.to_string()).unwrap_or_default();
    let mut request = GenericImage::new(name, tag)
        .with_entrypoint(&plan.entrypoint)
        .with_exposed_port(port)
        .with_cmd(plan.args)
        .with_label(LABEL, "1")
        .with_label("drill.run", run)
        .with_startup_timeout(Duration::from_secs(60))
        .with_host_config_modifier(move |host| {
            // Published on loopback only, on a port the engine picks.
            host.publish_all_ports = Some(false);
            host.port_bindings = Some(
                [(
                    binding.clone(),
                    Some(vec![testcontainers::bollard::models::PortBinding {
                        host_ip: Some("127.0.0.1".to_string()),
                        host_port: Some(host_port.clone()),
                    }]),
                )]
                .into_iter()
                .collect(),
            );
        });
    for (k, v) in plan.env {
        request = request.with_env_var(k, v);
    }
    for (path, bytes) in plan.files {
        request = request.with_copy_to(path, bytes);
    }
    let fail = |why: String| StartError {
        what: format!("container {image}"),
        why,
    };
    let container = match request.start().await {
        Ok(c) => c,
        Err(e) => {
            // A container that was created but did not start is not removed by testcontainers.
            remove_labelled(&docker, run).await;
            return Err(fail(e.to_string()));
        }
    };
    let host_port = container
        .get_host_port_ipv4(port)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let addr: SocketAddr = ([127, 0, 0, 1], host_port).into();
    // The published port accepts connections before the broker does (Docker's proxy answers
    // for it): wait for the protocol's own answer.
    if let Err(e) = wait_answers(ready, addr).await {
        let _ = container.rm().await;
        return Err(fail(format!("no answer on {addr} within 60 s: {e}")));
    }
    Ok(ContainerBroker {
        container: Some(container),
        docker,
        ready,
        port,
        addr,
        image: image.to_string(),
        image_id,
    })
}
