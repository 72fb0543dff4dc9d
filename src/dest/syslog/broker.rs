//! The receiving side of a syslog destination: a real rsyslog, started as a local process
//! with a config of drill's own.
//!
//! The config listens on one 127.0.0.1 port with `imrelp`, `imtcp` (octet counting) or
//! `imudp`, and writes every message it receives there, whole (`%rawmsg%`), one per line, to a
//! file in the work folder, each line led by the instant rsyslog received it
//! (`%timegenerated%`, RFC 3339 with microseconds): the file the reader follows, and the
//! arrival times the verdict judges by (the destination's own, not the reader's poll). rsyslog's messages about itself go to
//! another file of that folder (`processInternalMessages`), its pid file and work directory are
//! there too, and it loads no input but the one: the machine's syslog daemon and `/dev/log` are
//! never touched.
//!
//! rsyslogd is found as `DRILL_RSYSLOGD`, on PATH, in `/usr/sbin`, or in the folder
//! `ci/setup.sh` unpacks Debian's `rsyslog` and `rsyslog-relp` into
//! (`~/.cache/drill/rsyslog`, without installing a daemon). An unpacked one is given its
//! module folder (`-M`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::process::Command;

use super::Syslog;
use crate::dest::external::Reach;
use crate::dest::running::Place;
use crate::dest::{DestError, Destination, Provision, Provisioned, Running, Runtime};
use crate::process::{LocalProcess, StartError, dies_with_drill, free_port, version_line};
use crate::proxy::Link;

pub use super::Transport;

impl Transport {
    /// The rsyslog input module for it.
    fn input(self) -> &'static str {
        match self {
            Transport::Tcp => "imtcp",
            Transport::Relp => "imrelp",
            Transport::Udp => "imudp",
        }
    }
}

/// A running rsyslog: what drill reaches it by. The process or container itself is held apart
/// ([`Place`]).
pub struct Rsyslog {
    /// Where it listens (TCP for tcp and relp, UDP for udp).
    pub addr: SocketAddr,
    /// Every message it received, one per line.
    pub received: PathBuf,
    /// Its first `-v` line (`rsyslogd  8.2302.0 (aka 2023.02) …`), or the container's image.
    pub version: String,
}

/// The container image: `DRILL_IMAGE_SYSLOG`, else rsyslog's own (`rsyslog/rsyslog`: Ubuntu
/// with rsyslog's packages; RELP needs its `imrelp` module there). `ci/images.sh` builds
/// `drill-local/rsyslog` from the Debian packages `ci/setup.sh` unpacks.
pub(crate) const IMAGE: (&str, &str) = ("DRILL_IMAGE_SYSLOG", "rsyslog/rsyslog");

/// drill's folder inside the container (bound to the work folder's `rsyslog/`), and the port
/// rsyslog listens on there (above 1024: it runs as drill's user).
const INSIDE: &str = "/drill";
const INSIDE_PORT: u16 = 5140;

/// Starts (or reaches) the receiver and puts the link in front of it: rsyslog as a local
/// process or in a container, or the user's receiver. `auto` takes the local rsyslog when one
/// is installed (it is lighter, and Debian's has RELP), else a container.
pub(super) async fn provision(
    dest: Arc<dyn Destination>,
    syslog: &Syslog,
    p: Provision<'_>,
) -> Result<Provisioned, DestError> {
    let name = p.spec.link_name();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    if let Some(ext) = &p.spec.external {
        let access = crate::verify::Access {
            received_file: syslog.read_back.clone(),
            ..Default::default()
        };
        let how = match syslog.transport {
            Transport::Udp => Reach::Resolve,
            Transport::Relp | Transport::Tcp => Reach::Connect,
        };
        return crate::dest::external::provision_one_link(dest, &p, ext, access, how).await;
    }
    let mut notes = Vec::new();
    if std::env::var_os("DRILL_RSYSLOGD").is_some() && find_rsyslogd().is_none() {
        // Named, and not there: an error, never a reason to run another rsyslog.
        return Err(DestError::Missing(missing()));
    }
    let runtime = match p.runtime {
        Runtime::Auto if find_rsyslogd().is_some() => Runtime::Process,
        other => other,
    };
    let placement = crate::dest::place(IMAGE, "a local rsyslog", runtime, &mut notes).await?;
    crate::dest::check_broker_faults(&p.needs, placement.is_some(), 1)?;
    let folder = p.work.join("rsyslog");
    let (rsyslog, runtime, place) = match placement {
        Some(at) => {
            let (rsyslog, container) =
                start_container(at, syslog.transport, &folder, p.run_id).await?;
            (rsyslog, "container", Place::Container(Box::new(container)))
        }
        None => {
            let (rsyslog, process) = start(syslog.transport, &folder).await?;
            (rsyslog, "process", Place::Local(Some(process)))
        }
    };
    let mut running = Running::new(dest, vec![rsyslog.addr], runtime, rsyslog.version, place);
    running.access.received_file = Some(rsyslog.received);
    let link = match syslog.transport {
        Transport::Udp => Link::start_udp(&name, any, running.addrs[0], p.links.clone()).await?,
        Transport::Relp | Transport::Tcp => {
            Link::start(&name, any, running.addrs[0], p.links.clone()).await?
        }
    };
    Ok(Provisioned {
        links: vec![link],
        running,
        notes,
    })
}

/// What to install when rsyslogd is not found.
pub const MISSING: &str = "rsyslogd is not installed (looked at DRILL_RSYSLOGD, on PATH, in /usr/sbin and in ~/.cache/drill/rsyslog); install it (Debian: apt-get install rsyslog rsyslog-relp, or run ci/setup.sh, which unpacks them into ~/.cache/drill/rsyslog without installing a daemon)";

/// rsyslogd and, for an unpacked one, its module folder. `DRILL_RSYSLOGD`, when set, is the
/// only place looked at: a wrong path there is an error, not a reason to run another rsyslogd.
pub fn find_rsyslogd() -> Option<(PathBuf, Option<PathBuf>)> {
    let bin = match std::env::var_os("DRILL_RSYSLOGD") {
        Some(named) => Some(PathBuf::from(named)).filter(|p| p.is_file())?,
        None => {
            let mut more = vec![PathBuf::from("/usr/sbin")];
            more.extend(
                std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(".cache/drill/rsyslog/usr/sbin")),
            );
            crate::process::find_binary("rsyslogd", &more)?
        }
    };
    // The system's own rsyslogd has its module folder compiled in; an unpacked one is told.
    let modules = module_folder(&bin).filter(|m| !m.starts_with("/usr/lib") && !m.starts_with("/lib"));
    Some((bin, modules))
}

/// `<root>/usr/sbin/rsyslogd` → `<root>/usr/lib/<triplet>/rsyslog`, where its modules are.
fn module_folder(bin: &Path) -> Option<PathBuf> {
    let usr = bin.parent()?.parent()?;
    std::fs::read_dir(usr.join("lib"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("rsyslog"))
        .find(|p| p.join("imtcp.so").is_file())
}

/// Why no rsyslogd was found, naming `DRILL_RSYSLOGD` when it points nowhere.
fn missing() -> String {
    match std::env::var_os("DRILL_RSYSLOGD") {
        Some(named) => format!(
            "DRILL_RSYSLOGD names {}, which is not a file; point it at rsyslogd or unset it. {MISSING}",
            PathBuf::from(named).display()
        ),
        None => MISSING.to_string(),
    }
}

/// The config: one input on `listen`, every message to `received.log` in `work`, rsyslog's own
/// to `rsyslog.log` there.
pub fn config(transport: Transport, listen: SocketAddr, work: &Path) -> String {
    let (address, port) = (listen.ip(), listen.port());
    let input = transport.input();
    format!(
        r#"# Written by drill: one input, every message kept whole, nothing of the machine's logging.
global(workDirectory="{work}" processInternalMessages="on")
module(load="{input}")
template(name="drill_whole" type="string" string="%timegenerated:::date-rfc3339% %rawmsg%\n")
ruleset(name="drill_received") {{
  action(type="omfile" file="{work}/received.log" template="drill_whole" flushOnTXEnd="on" asyncWriting="off")
}}
input(type="{input}" address="{address}" port="{port}" ruleset="drill_received")
action(type="omfile" file="{work}/rsyslog.log")
"#,
        work = work.display()
    )
}

/// Starts rsyslog with `transport` on a free port, its files in `work`. Returns once it
/// listens (TCP, RELP) or has logged its start (UDP, where nothing can be connected to).
pub async fn start(
    transport: Transport,
    work: &Path,
) -> Result<(Rsyslog, LocalProcess), DestError> {
    let (bin, modules) = find_rsyslogd().ok_or_else(|| DestError::Missing(missing()))?;
    if transport == Transport::Relp
        && let Some(m) = module_folder(&bin)
        && !m.join("imrelp.so").is_file()
    {
        return Err(DestError::Missing(format!(
            "{} has no imrelp.so: install rsyslog-relp (Debian)",
            m.display()
        )));
    }
    std::fs::create_dir_all(work)?;
    let fail = |why: String| StartError {
        what: format!("rsyslog ({})", bin.display()),
        why,
    };
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let conf = work.join("rsyslog.conf");
        std::fs::write(&conf, config(transport, addr, work))?;
        let _ = std::fs::remove_file(work.join("rsyslog.log"));
        let mut command = Command::new(&bin);
        command.arg("-n").arg("-f").arg(&conf);
        command.arg("-i").arg(work.join("rsyslog.pid"));
        if let Some(m) = &modules {
            command.arg("-M").arg(m);
        }
        let stderr = std::fs::File::create(work.join("rsyslogd.stderr"))?;
        let mut child = dies_with_drill(&mut command)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        let ready = match transport {
            Transport::Tcp | Transport::Relp => {
                crate::process::wait_listening(addr, &mut child, "rsyslog")
                    .await
                    .map_err(|e| e.to_string())
            }
            Transport::Udp => {
                let log = work.join("rsyslog.log");
                logged_start(&log, || match child.try_wait() {
                    Ok(Some(status)) => {
                        Some(format!("rsyslogd exited with {status} before it started"))
                    }
                    _ => None,
                })
                .await
            }
        };
        match ready {
            Ok(()) => {
                // `rsyslogd  8.2302.0 (aka 2023.02) compiled with:` → `rsyslogd 8.2302.0 (aka 2023.02)`.
                let version = version_line(&bin, &["-v"], "rsyslogd")
                    .await
                    .map(|l| {
                        let l = l.trim_end_matches("compiled with:").trim();
                        l.split_whitespace().collect::<Vec<_>>().join(" ")
                    })
                    .unwrap_or_else(|| "rsyslogd (version unknown)".to_string());
                let rsyslog = Rsyslog {
                    addr,
                    received: work.join("received.log"),
                    version,
                };
                return Ok((rsyslog, LocalProcess::new(child)));
            }
            Err(e) => {
                let _ = child.kill().await;
                let said =
                    std::fs::read_to_string(work.join("rsyslogd.stderr")).unwrap_or_default();
                last_error = match said.lines().rfind(|l| !l.trim().is_empty()) {
                    Some(line) => format!("{e} (rsyslogd said: {})", line.trim()),
                    None => e,
                };
            }
        }
    }
    Err(fail(last_error).into())
}

/// Starts rsyslog in a container from `at`'s image: drill's config and its files in `work`,
/// bound at `/drill`, the input's port published on 127.0.0.1, run as the owner of `work` (the
/// files it writes are the user's). Returns once it answers a RELP open (relp) or has logged
/// its start (tcp, udp: Docker's proxy takes a connection before rsyslog does, and a datagram
/// has no answer). The bind mount needs the Docker engine on this machine.
async fn start_container(
    at: crate::container::Placement,
    transport: Transport,
    work: &Path,
    run_id: &str,
) -> Result<(Rsyslog, crate::container::ContainerBroker), DestError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(work)?;
    let work = std::path::absolute(work)?;
    let owner = std::fs::metadata(&work)?;
    let inside = Path::new(INSIDE);
    let listen = SocketAddr::from(([0, 0, 0, 0], INSIDE_PORT));
    std::fs::write(work.join("rsyslog.conf"), config(transport, listen, inside))?;
    let _ = std::fs::remove_file(work.join("rsyslog.log"));
    let launch = crate::container::Launch {
        entrypoint: "/usr/sbin/rsyslogd".into(),
        args: [
            "-n",
            "-f",
            "/drill/rsyslog.conf",
            "-i",
            "/drill/rsyslog.pid",
        ]
        .map(String::from)
        .to_vec(),
        port: INSIDE_PORT,
        udp: transport == Transport::Udp,
        mounts: vec![(work.clone(), INSIDE.to_string())],
        user: Some(format!("{}:{}", owner.uid(), owner.gid())),
        ..Default::default()
    };
    let ready = match transport {
        Transport::Relp => relp_answers,
        Transport::Tcp | Transport::Udp => answers_nothing,
    };
    let container =
        crate::container::start(at, launch, run_id, crate::container::ready(ready)).await?;
    let log = work.join("rsyslog.log");
    logged_start(&log, || None)
        .await
        .map_err(|why| StartError {
            what: format!("rsyslog in {}", container.describe()),
            why: format!("{why} in {}", log.display()),
        })?;
    let rsyslog = Rsyslog {
        addr: container.addr,
        received: work.join("received.log"),
        version: container.describe(),
    };
    Ok((rsyslog, container))
}

/// Readiness for RELP: a session opens (and is closed).
fn relp_answers(addr: SocketAddr) -> BoxFuture<'static, Result<(), String>> {
    async move {
        let wait = Duration::from_secs(3);
        let session = crate::wire::relp::Session::open(addr, wait)
            .await
            .map_err(|e| e.to_string())?;
        session.close(wait).await.map_err(|e| e.to_string())
    }
    .boxed()
}

/// Readiness where nothing answers (plain TCP and UDP syslog): drill waits for rsyslog's start
/// message instead.
fn answers_nothing(_: SocketAddr) -> BoxFuture<'static, Result<(), String>> {
    async { Ok(()) }.boxed()
}

/// Waits (at most 10 s) for rsyslog's own "start" message in `log`; `gone` says why rsyslog
/// will never write it (it exited).
async fn logged_start(log: &Path, mut gone: impl FnMut() -> Option<String>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains("] start")) {
            return Ok(());
        }
        if let Some(why) = gone() {
            return Err(why);
        }
        if Instant::now() > deadline {
            return Err("no start message after 10 s".to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::syslog::{key_of, octet_counted, rfc5424};
    use crate::wire::relp::{Answer, Reply, Session};

    /// rsyslogd, or (outside CI) `None` after saying why the test does nothing.
    fn have_rsyslogd() -> bool {
        if find_rsyslogd().is_some() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "CI=true and rsyslogd is missing: ci/setup.sh unpacks it"
        );
        println!("skipped: {MISSING}");
        false
    }

    /// Waits (at most 10 s) until `file` holds `n` lines.
    async fn lines(file: &Path, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn message(i: usize) -> String {
        rfc5424(
            "2026-12-02T15:00:00.000Z",
            "drill",
            Some(&format!("run-1/{i}")),
            &format!("id={i}"),
        )
    }

    /// Each transport, against a real rsyslog: the messages land in the file whole, with their
    /// keys, and only they do (rsyslog's own start message goes to its own log).
    #[tokio::test]
    async fn rsyslog_keeps_every_message_whole_on_each_transport() {
        if !have_rsyslogd() {
            return;
        }
        for transport in [Transport::Relp, Transport::Tcp, Transport::Udp] {
            let dir = tempfile::tempdir().unwrap();
            let (rsyslog, mut process) = start(transport, dir.path()).await.unwrap();
            assert!(rsyslog.version.contains("rsyslogd"), "{}", rsyslog.version);
            match transport {
                Transport::Relp => {
                    let wait = Duration::from_secs(5);
                    let mut session = Session::open(rsyslog.addr, wait).await.unwrap();
                    let mut sent = Vec::new();
                    for i in 0..3 {
                        sent.push(session.syslog(&message(i)).await.unwrap());
                    }
                    for txnr in sent {
                        let reply = session.reply().await.unwrap();
                        assert_eq!(
                            reply,
                            Reply::Rsp {
                                txnr,
                                answer: Answer::Taken
                            }
                        );
                    }
                    session.close(wait).await.unwrap();
                }
                Transport::Tcp => {
                    use tokio::io::AsyncWriteExt;
                    let mut s = tokio::net::TcpStream::connect(rsyslog.addr).await.unwrap();
                    for i in 0..3 {
                        s.write_all(&octet_counted(&message(i))).await.unwrap();
                    }
                    s.shutdown().await.unwrap();
                }
                Transport::Udp => {
                    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
                    for i in 0..3 {
                        s.send_to(message(i).as_bytes(), rsyslog.addr)
                            .await
                            .unwrap();
                    }
                }
            }
            // Each line: rsyslog's reception time, a space, the message whole.
            let got: Vec<String> = lines(&rsyslog.received, 3)
                .await
                .iter()
                .map(|l| {
                    let (stamp, message) = l.split_once(' ').unwrap();
                    assert!(crate::dest::syslog::read::rfc3339(stamp).is_some(), "{l}");
                    message.to_string()
                })
                .collect();
            assert_eq!(
                got,
                (0..3).map(message).collect::<Vec<_>>(),
                "{transport:?}"
            );
            let keys: Vec<_> = got.iter().map(|l| key_of(l).unwrap()).collect();
            assert_eq!(keys, ["run-1/0", "run-1/1", "run-1/2"]);
            let own = std::fs::read_to_string(dir.path().join("rsyslog.log")).unwrap();
            assert!(own.contains("] start"), "{own}");
            process.stop(false).await;
        }
    }

    /// A RELP open is a probe that writes nothing: the file stays empty.
    #[tokio::test]
    async fn a_relp_open_writes_nothing() {
        if !have_rsyslogd() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (rsyslog, mut process) = start(Transport::Relp, dir.path()).await.unwrap();
        let wait = Duration::from_secs(5);
        for _ in 0..3 {
            Session::open(rsyslog.addr, wait)
                .await
                .unwrap()
                .close(wait)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let text = std::fs::read_to_string(&rsyslog.received).unwrap_or_default();
        assert_eq!(text, "", "a probe wrote: {text}");
        process.stop(false).await;
    }
}
