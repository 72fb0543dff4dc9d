//! Local child processes and ports: what every broker started as a process, and the engine
//! under test, have in common.
//!
//! A child started here dies with drill ([`dies_with_drill`]: the kernel SIGKILLs it when
//! drill's thread that started it exits, even if drill itself is SIGKILLed), listens on a
//! free 127.0.0.1 port ([`free_port`]), and is stopped with SIGTERM then SIGKILL
//! ([`LocalProcess::stop`]). Nothing here knows which program it runs.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A program that did not start, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what} did not start: {why}")]
pub struct StartError {
    pub what: String,
    pub why: String,
}

/// Makes a child die with drill: the kernel sends it SIGKILL when drill's thread that
/// started it exits, even if drill itself is SIGKILLed and gets no chance to clean up.
pub fn dies_with_drill(command: &mut Command) -> &mut Command {
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe; it allocates nothing and touches no lock.
    unsafe { command.pre_exec(|| death_signal(nix::sys::signal::Signal::SIGKILL)) }
}

/// Between fork and exec: the signal the child gets when the thread that forked it exits.
fn death_signal(signal: nix::sys::signal::Signal) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)
}

/// A `std` child told to stop (SIGTERM) when drill's spawning thread exits, however drill
/// ends: `drill explore`'s `drill run` children, which stop as on Ctrl-C (faults healed,
/// brokers and containers removed), so an explore SIGKILLed mid-shrink leaves nothing
/// running on.
pub fn std_stops_with_drill(command: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: as in `dies_with_drill`: only prctl(2) between fork and exec.
    unsafe { command.pre_exec(|| death_signal(nix::sys::signal::Signal::SIGTERM)) }
}

/// A free loopback address ([`free_port`] on 127.0.0.1).
pub fn free_addr() -> std::io::Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], free_port()?)))
}

/// Child processes killed and reaped when this is dropped, however the code that started them
/// ends (a benchmark's brokers, proxies and engines).
#[derive(Default)]
pub struct KillOnDrop(pub Vec<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A free port on 127.0.0.1, for TCP and UDP alike, that no other caller in this process got
/// and no other drill process on this machine holds.
///
/// Not the kernel's pick (`bind(":0")`): that comes from the ephemeral range, where the
/// kernel hands the same port to the next `:0` bind or outgoing connection of any process
/// once it is released — two drills, or two tests, starting side by side then meet on one
/// port. This picks at random below the ephemeral range (`ip_local_port_range`), where the
/// kernel never hands ports out on its own, checks that TCP and UDP both bind there, and
/// hands each port out once per process. Each port handed out is also reserved for this
/// process's whole life in [`reserved_elsewhere`]'s shared lock file: a port free only while
/// its owner is between two lives (an engine SIGKILLed and not yet restarted on the same API
/// port) is not free for another drill — measured in CI, a concurrent test's engine took a
/// killed engine's port, and the drill's workload then fed the wrong engine. A machine whose
/// ephemeral range leaves no room below it falls back to the kernel's pick.
pub fn free_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let (low, high) = below_ephemeral();
    if high > low {
        let span = u32::from(high - low) + 1;
        let start = std::hash::RandomState::new().build_hasher().finish() as u32 % span;
        let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        for i in 0..span.min(2048) {
            // A stride coprime with any span not a multiple of 7919 walks it without repeats.
            let port = low + ((start + i * 7919) % span) as u16;
            if handed.contains(&port) {
                continue;
            }
            let tcp = StdListener::bind(("127.0.0.1", port));
            let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
            if tcp.is_ok() && udp.is_ok() && !reserved_elsewhere(port) {
                handed.insert(port);
                return Ok(port);
            }
        }
    }
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Reserves `port` for this process until it exits; true when another process holds it.
///
/// One file shared by every drill on the machine (`/tmp/drill-ports.lock`), one
/// byte per port, each byte held with an open-file-description lock (`F_OFD_SETLK`): one file
/// descriptor for any number of ports, and the kernel drops the locks when the process ends,
/// however it ends. Where the file cannot be opened nothing is reserved (the per-process
/// set alone, as before).
fn reserved_elsewhere(port: u16) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    use std::os::unix::fs::OpenOptionsExt;
    static FILE: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let file = FILE.get_or_init(|| {
        // One path every drill agrees on, whatever its TMPDIR: /tmp where there is one.
        let dir = Path::new("/tmp");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let path = dir.join("drill-ports.lock");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
            .ok()?;
        // Other users' drills share it: the umask must not narrow the mode.
        let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        Some(file)
    });
    let Some(file) = file else {
        return false;
    };
    fcntl(file, FcntlArg::F_OFD_SETLK(&port_lock(port))).is_err()
}

/// The write lock on `port`'s byte of the shared lock file.
fn port_lock(port: u16) -> nix::libc::flock {
    // SAFETY: `flock` is a plain C struct; all-zero is a valid value to fill in.
    let mut lock: nix::libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = nix::libc::F_WRLCK as _;
    lock.l_whence = nix::libc::SEEK_SET as _;
    lock.l_start = nix::libc::off_t::from(port);
    lock.l_len = 1;
    lock
}

/// The ports [`free_port`] picks from: from 10000 to just below the kernel's ephemeral range
/// (32767 on Linux's default `32768 60999`).
fn below_ephemeral() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (10_000, ephemeral_low.saturating_sub(1))
}

/// A free 127.0.0.1 port for each of `names`, none of them in `taken` nor twice.
pub fn free_ports<'a>(
    names: impl IntoIterator<Item = &'a String>,
    mut taken: std::collections::HashSet<u16>,
) -> std::io::Result<std::collections::BTreeMap<String, u16>> {
    let mut ports = std::collections::BTreeMap::new();
    for name in names {
        let mut port = free_port()?;
        while !taken.insert(port) {
            port = free_port()?;
        }
        ports.insert(name.clone(), port);
    }
    Ok(ports)
}

/// The first `name` found on PATH or in `more` folders.
pub fn find_binary(name: &str, more: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(more.iter().cloned())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// What `LD_LIBRARY_PATH` a program drill runs for the user (an engine's command) gets:
/// `None` to leave it as it is, `Some(None)` to unset it, `Some(Some(p))` to set it to `p`.
/// `cargo run` and `cargo test` put the folders of drill's own build there — among them the
/// librdkafka 2.x its build script made — and an engine linked against the system's older
/// librdkafka (Debian's kcat, rsyslog's omkafka) would load drill's instead, hiding exactly
/// what a drill of it should see. Those folders, inside the cargo target folder drill runs
/// from (the ancestor of its executable holding `CACHEDIR.TAG`), are taken out.
pub fn user_library_path() -> Option<Option<std::ffi::OsString>> {
    let current = std::env::var_os("LD_LIBRARY_PATH")?;
    let exe = std::env::current_exe().ok()?;
    let target = exe.ancestors().find(|d| d.join("CACHEDIR.TAG").is_file())?;
    without_folders_in(&current, target)
}

/// `path` (a `:`-separated list) without the folders inside `target`; `None` when none was.
fn without_folders_in(path: &std::ffi::OsStr, target: &Path) -> Option<Option<std::ffi::OsString>> {
    let all: Vec<PathBuf> = std::env::split_paths(path).collect();
    let kept: Vec<&PathBuf> = all.iter().filter(|p| !p.starts_with(target)).collect();
    if kept.len() == all.len() {
        return None;
    }
    if kept.is_empty() {
        return Some(None);
    }
    std::env::join_paths(kept).ok().map(Some)
}

/// `command` with [`user_library_path`] applied.
pub fn with_user_library_path(command: &mut Command) -> &mut Command {
    match user_library_path() {
        Some(Some(p)) => command.env("LD_LIBRARY_PATH", p),
        Some(None) => command.env_remove("LD_LIBRARY_PATH"),
        None => command,
    }
}

/// `~/.cargo/bin`, where `cargo install` puts programs.
pub fn cargo_bin() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"))
}

/// Waits (at most 10 s) until something accepts TCP connections on `addr`; an error if the
/// child exits first.
pub async fn wait_listening(
    addr: SocketAddr,
    child: &mut Child,
    what: &str,
) -> Result<(), StartError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(StartError {
                what: what.to_string(),
                why: format!("exited with {status}"),
            });
        }
        if Instant::now() > deadline {
            return Err(StartError {
                what: what.to_string(),
                why: format!("nothing listening on {addr} after 10 s"),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first line of `bin ARGS`' output (stdout, then stderr) that contains `needle`.
pub async fn version_line(bin: &Path, args: &[&str], needle: &str) -> Option<String> {
    let out = Command::new(bin).args(args).output().await.ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .find(|l| l.contains(needle))
        .map(|l| l.trim().to_string())
}

/// A local child process drill started (a broker, a broker node).
pub struct LocalProcess {
    child: Option<Child>,
}

impl LocalProcess {
    pub fn new(child: Child) -> LocalProcess {
        LocalProcess { child: Some(child) }
    }

    /// SIGKILL, or SIGTERM then SIGKILL after 5 s.
    pub async fn stop(&mut self, kill: bool) {
        let how = if kill { Signals::KILL } else { Signals::TERM };
        self.signal(how, Duration::from_secs(5)).await;
    }

    /// How it exited, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// SIGKILL to its process group (it leads one), without waiting: for `Drop`.
    pub fn kill_group_now(&self) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// `how.signal` (to its whole process group with `how.group`), then SIGKILL to the same
    /// if it has not exited within `grace`. Returns once it exited.
    pub async fn signal(&mut self, how: Signals, grace: Duration) {
        use nix::sys::signal::{Signal, kill, killpg};
        let Some(mut child) = self.child.take() else {
            return;
        };
        let Some(pid) = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32)) else {
            return;
        };
        let send = |sig: Signal| {
            let _ = if how.group {
                killpg(pid, sig)
            } else {
                kill(pid, sig)
            };
        };
        send(how.signal);
        if how.signal != Signal::SIGKILL && tokio::time::timeout(grace, child.wait()).await.is_ok()
        {
            return;
        }
        send(Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// How a process is told to go: a signal, to the process or to its whole process group (a
/// server whose children must go with it, as PostgreSQL's backends).
#[derive(Debug, Clone, Copy)]
pub struct Signals {
    pub signal: nix::sys::signal::Signal,
    pub group: bool,
}

impl Signals {
    pub const KILL: Signals = Signals {
        signal: nix::sys::signal::Signal::SIGKILL,
        group: false,
    };
    pub const TERM: Signals = Signals {
        signal: nix::sys::signal::Signal::SIGTERM,
        group: false,
    };
}

/// Starts a program that listens on 127.0.0.1: on `port` (one try) or a free port (up to five
/// tries, in case another process takes the port meanwhile). `command(port)` makes its
/// command line; it is made to die with drill and killed when dropped.
pub async fn start_listening(
    what: &str,
    port: Option<u16>,
    mut command: impl FnMut(u16) -> std::io::Result<Command>,
) -> Result<(LocalProcess, SocketAddr), StartError> {
    let fail = |why: String| StartError {
        what: what.to_string(),
        why,
    };
    let mut last_error = String::new();
    for _ in 0..if port.is_some() { 1 } else { 5 } {
        let port = match port {
            Some(p) => p,
            None => free_port().map_err(|e| fail(e.to_string()))?,
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = command(port).map_err(|e| fail(e.to_string()))?;
        cmd.kill_on_drop(true);
        let mut child = dies_with_drill(&mut cmd)
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        match wait_listening(addr, &mut child, what).await {
            Ok(()) => return Ok((LocalProcess::new(child), addr)),
            Err(e) => {
                last_error = e.why;
                let _ = child.kill().await;
            }
        }
    }
    Err(fail(last_error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_program_does_not_get_the_libraries_of_drills_own_build() {
        let target = Path::new("/w/drill/target");
        let path = std::ffi::OsString::from(
            "/w/drill/target/debug/build/rdkafka-sys-1/out/src:/opt/lib:/w/drill/target/debug/deps:/w/drill/targets",
        );
        assert_eq!(
            without_folders_in(&path, target),
            Some(Some("/opt/lib:/w/drill/targets".into()))
        );
        assert_eq!(without_folders_in("/opt/lib".as_ref(), target), None);
        assert_eq!(
            without_folders_in("/w/drill/target/release/deps".as_ref(), target),
            Some(None)
        );
    }

    /// Ports come from below the kernel's ephemeral range, never twice in a process, each one
    /// free for TCP and UDP when handed out — also while the kernel's own picks go on.
    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let (low, high) = below_ephemeral();
        let mut seen = std::collections::HashSet::new();
        let mut kernel = Vec::new();
        for _ in 0..200 {
            let port = free_port().unwrap();
            assert!((low..=high).contains(&port), "{port}");
            assert!(seen.insert(port), "{port} handed out twice");
            StdListener::bind(("127.0.0.1", port)).unwrap();
            std::net::UdpSocket::bind(("127.0.0.1", port)).unwrap();
            kernel.push(StdListener::bind("127.0.0.1:0").unwrap());
        }
        assert!(kernel.iter().all(|k| k.local_addr().unwrap().port() > high));
    }

    /// A port this process handed out is held in the shared lock file: any other open of the
    /// file (another drill process, or here a second open in this one: open-file-description
    /// locks conflict alike; no child is forked, which would inherit the other test's probe
    /// sockets) cannot lock it, even while nothing listens on the port.
    #[test]
    fn a_port_handed_out_is_reserved_against_other_processes() {
        use nix::fcntl::{FcntlArg, fcntl};
        let port = free_port().unwrap();
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/tmp/drill-ports.lock")
            .unwrap();
        assert!(
            fcntl(&other, FcntlArg::F_OFD_SETLK(&port_lock(port))).is_err(),
            "another open of the lock file could take port {port}"
        );
        // A port nobody handed out (below the range picked from) is free to lock.
        assert!(fcntl(&other, FcntlArg::F_OFD_SETLK(&port_lock(5))).is_ok());
    }
}
