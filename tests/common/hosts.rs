//! Hosts for the tests that reach past one machine: processes started (in a network
//! namespace when given) and killed when dropped, mosquitto, and two network namespaces joined
//! by a veth pair.

use std::net::SocketAddr;

/// The workload, faults and expectation the drills across hosts share: a refusal, a half-open
/// link (answers swallowed) and a SIGKILL of the engine in the middle of it; nothing lost.
pub const CUT_HALF_OPEN_KILL: &str = "workload: { rate: 100/s, duration: 24s, keys: 4 }
faults:
  - { at: 3s, link: mqtt, fault: refuse, for: 4s }
  - { at: 10s, link: mqtt, fault: swallow, direction: downstream, for: 8s }
  - { at: 13s, target: engine, action: kill, restart_after: 2s }
expect: { lost: 0, ledger: closes }
";
use std::time::{Duration, Instant};

/// A process the test started, SIGKILLed when the test ends (its pid, not its group: a
/// `drill` child ends its own children).
pub struct Started(pub std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `argv`, run inside the network namespace `ns` when given (`ip netns exec`).
pub fn command(ns: Option<&str>, argv: &[&str]) -> std::process::Command {
    let mut c = match ns {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns]);
            c.args(argv);
            c
        }
        None => {
            let mut c = std::process::Command::new(argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    c.stdout(std::process::Stdio::null());
    c
}

/// Waits (at most 40 s: a drill's fault comes after its broker, engine and workload started)
/// until `check` holds.
pub fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(40);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An anonymous mosquitto listening on `addr` (in `ns` when given), or `None` outside CI
/// when mosquitto is not installed.
pub fn mosquitto(dir: &std::path::Path, ns: Option<&str>, addr: SocketAddr) -> Option<Started> {
    let Some(bin) = drill::dest::mqtt::broker::mosquitto_path() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI=true and mosquitto is missing: ci/setup.sh installs it"
        );
        println!("skipped: mosquitto is not installed");
        return None;
    };
    let conf = dir.join(format!("mosquitto-{}.conf", addr.port()));
    std::fs::write(
        &conf,
        format!(
            "listener {} {}\nallow_anonymous true\npersistence false\nmax_queued_messages 0\n",
            addr.port(),
            addr.ip()
        ),
    )
    .unwrap();
    let bin = bin.display().to_string();
    let conf = conf.display().to_string();
    let child = command(ns, &[&bin, "-c", &conf])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Started(child);
    until("mosquitto did not listen", || in_ns_connects(ns, addr));
    Some(started)
}

/// Whether something listens on `addr` (seen from `ns`).
pub fn in_ns_connects(ns: Option<&str>, addr: SocketAddr) -> bool {
    match ns {
        None => std::net::TcpStream::connect(addr).is_ok(),
        Some(_) => command(
            ns,
            &[
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port()),
            ],
        )
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success()),
    }
}

/// A free 127.0.0.1 address (`drill::process::free_port`: below the kernel's ephemeral range,
/// never twice in one test).
pub fn free() -> SocketAddr {
    ([127, 0, 0, 1], drill::process::free_port().unwrap()).into()
}

/// Two network namespaces this test makes, joined by a veth pair with addresses from
/// 198.18.0.0/15 (the benchmarking range): "host a" and "host b". Removed when dropped, also
/// when the test fails.
pub struct TwoHosts {
    pub a: String,
    pub b: String,
}

impl TwoHosts {
    pub const A: [u8; 4] = [198, 18, 0, 1];
    pub const B: [u8; 4] = [198, 18, 0, 2];

    /// `None` (after saying why) where namespaces cannot be made; under CI that fails.
    pub fn make() -> Option<TwoHosts> {
        let root = nix::unistd::Uid::effective().is_root();
        let ip = std::process::Command::new("ip").arg("-V").output().is_ok();
        if !root || !ip {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI=true and network namespaces cannot be made here (root: {root}, ip: {ip})"
            );
            println!("skipped: making network namespaces needs root and ip (iproute2)");
            return None;
        }
        let id = std::process::id();
        let hosts = TwoHosts {
            a: format!("drill-a-{id}"),
            b: format!("drill-b-{id}"),
        };
        let (va, vb) = (
            format!("dra{}", id % 100_000),
            format!("drb{}", id % 100_000),
        );
        let ip = |args: &[&str]| {
            let done = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap();
            assert!(done.success(), "ip {}", args.join(" "));
        };
        ip(&["netns", "add", &hosts.a]);
        ip(&["netns", "add", &hosts.b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        for (ns, dev, addr) in [
            (&hosts.a, &va, "198.18.0.1/24"),
            (&hosts.b, &vb, "198.18.0.2/24"),
        ] {
            ip(&["link", "set", dev, "netns", ns]);
            ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        Some(hosts)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}

/// `GET url` (with `token` as the bearer when given), its JSON body, from a blocking test.
pub fn get_json(url: &str, token: Option<&str>) -> serde_json::Value {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut r = reqwest::Client::new().get(url);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send().await.unwrap().json().await.unwrap()
    })
}
