//! MQTT brokers a drill starts: `mosquitto` as a local process, drill's own broker embedded
//! in drill (`embedded.rs`) when mosquitto is not installed, mosquitto in a container (`eclipse-mosquitto:2`, or
//! `DRILL_IMAGE_MQTT`), or the user's own broker (`runtime: external`). One plain link in
//! front of it.
//!
//! A broker is configured so that it never drops a record on the verifier's behalf:
//! persistence on, queue and in-flight limits lifted. Poison records need a broker that
//! refuses one oversized write while it accepts the rest: only mosquitto does
//! (`message_size_limit`, an error PUBACK to an MQTT 5 client).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::process::Command;

use super::embedded::Embedded;
use crate::container::{self, Launch};
use crate::dest::external::Reach;
use crate::dest::running::Place;
use crate::dest::{DestError, Destination, Provision, Provisioned, Running, Runtime, place};
use crate::process::{LocalProcess, StartError, dies_with_drill, free_port, wait_listening};
use crate::proxy::Link;

/// The image and the variable that overrides it.
pub(crate) const IMAGE: (&str, &str) = ("DRILL_IMAGE_MQTT", "eclipse-mosquitto:2");

/// Finds the mosquitto binary, if installed.
pub fn mosquitto_path() -> Option<PathBuf> {
    crate::process::find_binary("mosquitto", &["/usr/sbin".into(), "/usr/local/sbin".into()])
}

/// A local MQTT broker drill started.
pub struct LocalMqtt {
    /// Where it listens (the link's upstream; the verifier's address).
    pub addr: SocketAddr,
    /// `process` or `embedded`.
    pub runtime: &'static str,
    /// What ran, e.g. `mosquitto 2.0.11`.
    pub version: String,
    /// The process, when it is one.
    pub process: Option<LocalProcess>,
    /// The broker, when it runs inside drill (dropping it stops it).
    pub embedded: Option<Embedded>,
}

impl LocalMqtt {
    /// Stops it (a process: SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(&mut self) {
        if let Some(p) = self.process.as_mut() {
            p.stop(false).await;
        }
        if let Some(b) = self.embedded.take() {
            b.stop();
        }
    }
}

/// What a broker drill starts must do beyond the plain default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options<'a> {
    /// The broker refuses (per record, with an error PUBACK) any publish whose payload is
    /// larger — how a drill makes poison records. Only mosquitto can do this.
    pub message_limit: Option<usize>,
    /// The listener speaks TLS with these certificates. Only mosquitto can do this.
    pub tls: Option<&'a crate::tls::BrokerTls>,
}

/// Starts an MQTT broker on the chosen runtime (`process`, `embedded`, or `auto`: mosquitto
/// when installed, else embedded); `work` holds its config and store.
pub async fn start_mqtt(
    runtime: Runtime,
    work: &Path,
    options: Options<'_>,
) -> Result<LocalMqtt, DestError> {
    let no_mosquitto = runtime == Runtime::Embedded || mosquitto_path().is_none();
    if options.message_limit.is_some() && no_mosquitto {
        return Err(DestError::Unsupported(
            "poison records need a broker that refuses one oversized write while accepting the rest: mosquitto (runtime process); install it (Debian: apt-get install mosquitto) or remove `workload.poison`".to_string(),
        ));
    }
    if options.tls.is_some() && no_mosquitto {
        return Err(DestError::Unsupported(
            "`destination.tls` needs mosquitto (drill's embedded broker serves no TLS); install it (Debian: apt-get install mosquitto)".to_string(),
        ));
    }
    match runtime {
        Runtime::Embedded => start_embedded().await,
        Runtime::Process | Runtime::External | Runtime::Container => {
            start_mosquitto(work, options).await
        }
        Runtime::Auto => match mosquitto_path() {
            Some(_) => start_mosquitto(work, options).await,
            // `provision` has said so, in its one line on the runtime chosen.
            None => start_embedded().await,
        },
    }
}

/// The provisioning of an MQTT destination: one plain link in front of the broker.
pub(super) async fn provision(
    dest: Arc<dyn Destination>,
    p: Provision<'_>,
) -> Result<Provisioned, DestError> {
    let name = p.spec.link_name();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    if p.needs.answers {
        return provision_answering(dest, &p, &name).await;
    }
    if let Some(ext) = &p.spec.external {
        let access = crate::verify::Access::default();
        return crate::dest::external::provision_one_link(dest, &p, ext, access, Reach::Connect)
            .await;
    }
    let mut notes = Vec::new();
    let local = if p.tls.is_some() || mosquitto_path().is_some() {
        "local mosquitto"
    } else {
        "drill's embedded broker (mosquitto is not installed)"
    };
    let placement = place(IMAGE, local, p.runtime, &mut notes).await?;
    crate::dest::check_broker_faults(&p.needs, placement.is_some(), 1)?;
    let running = match placement {
        Some(at) => {
            let launch = launch(p.needs.message_limit, p.tls)?;
            let check = match p.tls {
                None => container::ready(ready),
                Some(t) => ready_tls(&t.client())?,
            };
            let c = container::start(at, launch, p.run_id, check).await?;
            let version = c.describe();
            let addr = c.addr;
            Running::new(
                dest,
                vec![addr],
                "container",
                version,
                Place::Container(Box::new(c)),
            )
        }
        None => {
            let options = Options {
                message_limit: p.needs.message_limit,
                tls: p.tls,
            };
            let broker = start_mqtt(p.runtime, p.work, options).await?;
            let place = match broker.embedded {
                Some(b) => Place::InProcess(Box::new(b)),
                None => Place::Local(broker.process),
            };
            Running::new(
                dest,
                vec![broker.addr],
                broker.runtime,
                broker.version,
                place,
            )
        }
    };
    let link = Link::start(&name, any, running.addrs[0], p.links.clone()).await?;
    Ok(Provisioned {
        links: vec![link],
        running,
        notes,
    })
}

/// The provisioning of a drill with a destination fault (`reject`): drill's embedded broker,
/// which answers the PUBACKs, whatever is installed.
async fn provision_answering(
    dest: Arc<dyn Destination>,
    p: &Provision<'_>,
    name: &str,
) -> Result<Provisioned, DestError> {
    let unsupported = |why: &str| {
        DestError::Unsupported(format!(
            "a `reject` destination fault needs drill's embedded broker, which answers the PUBACKs itself; {why}"
        ))
    };
    if p.spec.external.is_some() || !matches!(p.runtime, Runtime::Auto | Runtime::Embedded) {
        return Err(unsupported("use runtime auto or embedded"));
    }
    if p.needs.message_limit.is_some() {
        return Err(unsupported(
            "it refuses no oversized write: remove `workload.poison` (a `reject` with reason 0x99 refuses records too)",
        ));
    }
    if p.tls.is_some() {
        return Err(unsupported("it serves no TLS: remove `destination.tls`"));
    }
    crate::dest::check_broker_faults(&p.needs, false, 1)?;
    let broker = start_embedded().await?;
    let embedded = broker.embedded.ok_or_else(|| unsupported("it did not start"))?;
    let rejects = embedded.rejects.clone();
    let mut running = Running::new(
        dest,
        vec![broker.addr],
        broker.runtime,
        broker.version,
        Place::InProcess(Box::new(embedded)),
    );
    running.answers = Some(rejects as Arc<dyn crate::dest::AnswerControl>);
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let link = Link::start(name, any, running.addrs[0], p.links.clone()).await?;
    Ok(Provisioned {
        links: vec![link],
        running,
        notes: vec![
            "drill's embedded broker: a `reject` fault has drill answer the PUBACKs".to_string(),
        ],
    })
}

/// mosquitto in a container: the same limits as a local one.
fn launch(
    message_limit: Option<usize>,
    tls: Option<&crate::tls::BrokerTls>,
) -> Result<Launch, DestError> {
    let mut conf = "listener 1883 0.0.0.0\nallow_anonymous true\nuser root\npersistence true\npersistence_location /tmp/\nmax_queued_messages 0\nmax_queued_bytes 0\nmax_inflight_messages 0\nmax_keepalive 65535\n".to_string();
    if let Some(limit) = message_limit {
        conf.push_str(&format!("message_size_limit {limit}\n"));
    }
    let mut files = Vec::new();
    // TLS in a container: the drill's certificates copied in beside the configuration.
    if let Some(tls) = tls {
        files = crate::container::tls_files(&tls.files)?;
        conf.push_str(&format!(
            "cafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate {}\n",
            crate::container::TLS_CA,
            crate::container::TLS_CERT,
            crate::container::TLS_KEY,
            tls.client_certificates
        ));
    }
    files.push(("/tmp/drill-mosquitto.conf".into(), conf.into_bytes()));
    Ok(Launch {
        entrypoint: "/usr/sbin/mosquitto".into(),
        args: vec!["-c".into(), "/tmp/drill-mosquitto.conf".into()],
        env: Vec::new(),
        files,
        port: 1883,
        host_port: None,
        ..Default::default()
    })
}

/// Whether an MQTT broker that speaks only TLS answers at an address: a TLS CONNECT and its
/// CONNACK, trusting (and showing) what `client` says.
fn ready_tls(client: &crate::tls::TlsConfig) -> Result<container::Ready, DestError> {
    let tls = crate::tls::ClientTls::new(client).map_err(DestError::Invalid)?;
    Ok(std::sync::Arc::new(move |addr| {
        let tls = tls.clone();
        async move {
            let limit = Duration::from_secs(3);
            crate::wire::mqtt::connect_as(addr, "drill-ready", limit, limit, None, Some(&tls))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
        .boxed()
    }))
}

/// Whether an MQTT broker answers at `addr`: CONNECT and its CONNACK.
pub(crate) fn ready(addr: SocketAddr) -> BoxFuture<'static, Result<(), String>> {
    async move {
        let limit = Duration::from_secs(3);
        crate::wire::mqtt::connect(addr, "drill-ready", limit, limit)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
    .boxed()
}

async fn mosquitto_version(bin: &Path) -> String {
    // `mosquitto -h` prints "mosquitto version 2.0.11" on its first line (and exits non-zero).
    crate::process::version_line(bin, &["-h"], "version")
        .await
        .unwrap_or_else(|| "mosquitto (version unknown)".to_string())
}

/// mosquitto's config: a listener on `port` (TLS when asked), persistence in `store`, limits
/// lifted so the broker never drops a record for the verifier (0 = no maximum).
fn mosquitto_conf(port: u16, store: &Path, options: Options) -> String {
    let text = format!(
        "listener {port} 127.0.0.1\n\
         allow_anonymous true\n\
         persistence true\n\
         persistence_location {store}/\n\
         max_queued_messages 0\n\
         max_queued_bytes 0\n\
         max_inflight_messages 0\n\
         max_keepalive 65535\n\
         log_dest file {store}/mosquitto.log\n\
         log_type error\n\
         log_type warning\n\
         log_type notice\n",
        store = store.display()
    );
    // An MQTT 5 client gets a PUBACK with an error reason for an oversized publish; the
    // connection and every other write carry on.
    let text = match options.message_limit {
        Some(limit) => format!("{text}message_size_limit {limit}\n"),
        None => text,
    };
    // The listener's TLS: drill's certificates; under mutual TLS a client must show one from
    // drill's CA.
    let text = match options.tls {
        Some(tls) => format!(
            "{text}cafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate {}\n",
            tls.files.ca_file.display(),
            tls.files.server_cert_file.display(),
            tls.files.server_key_file.display(),
            tls.client_certificates
        ),
        None => text,
    };
    // Started as root, mosquitto switches to user `mosquitto`; that credential change would
    // clear the parent-death signal (and the store dir is drill's). Stay as we are.
    if nix::unistd::Uid::effective().is_root() {
        format!("user root\n{text}")
    } else {
        text
    }
}

async fn start_mosquitto(work: &Path, options: Options<'_>) -> Result<LocalMqtt, DestError> {
    let bin = mosquitto_path().ok_or_else(|| {
        DestError::Missing(
            "mosquitto is not installed (looked for `mosquitto` on PATH and in /usr/sbin); install it (Debian: apt-get install mosquitto) or use --runtime embedded".to_string(),
        )
    })?;
    let store = work.join("mosquitto");
    std::fs::create_dir_all(&store)?;
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let conf = store.join("mosquitto.conf");
        std::fs::write(&conf, mosquitto_conf(port, &store, options))?;
        let mut child = dies_with_drill(&mut Command::new(&bin))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| StartError {
                what: bin.display().to_string(),
                why: e.to_string(),
            })?;
        match wait_listening(addr, &mut child, "mosquitto").await {
            Ok(()) => {
                return Ok(LocalMqtt {
                    addr,
                    runtime: "process",
                    version: mosquitto_version(&bin).await,
                    process: Some(LocalProcess::new(child)),
                    embedded: None,
                });
            }
            Err(e) => {
                let _ = child.kill().await;
                last_error = format!(
                    "{e} (log: {})",
                    std::fs::read_to_string(store.join("mosquitto.log"))
                        .unwrap_or_default()
                        .lines()
                        .last()
                        .unwrap_or("")
                );
            }
        }
    }
    Err(StartError {
        what: "mosquitto".to_string(),
        why: last_error,
    }
    .into())
}

async fn start_embedded() -> Result<LocalMqtt, DestError> {
    let broker = Embedded::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| StartError {
            what: "drill's embedded broker".to_string(),
            why: e.to_string(),
        })?;
    Ok(LocalMqtt {
        addr: broker.addr,
        runtime: "embedded",
        version: format!("{} (in-process)", super::embedded::VERSION),
        process: None,
        embedded: Some(broker),
    })
}

impl From<LocalMqtt> for crate::dest::BenchBroker {
    fn from(b: LocalMqtt) -> Self {
        crate::dest::BenchBroker {
            addr: b.addr,
            version: b.version,
            process: b.process,
        }
    }
}
