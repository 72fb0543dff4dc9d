//! What a UDP client observes through a datagram link under each fault
//! (docs/src/design.md#3-fault-vocabulary). Real sockets on 127.0.0.1 only: clients, the link, and
//! an upstream that records every datagram it got (and from which flow) and echoes it unless told
//! not to.
//!
//! Clients are std sockets in non-blocking mode, polled: a `recv` is then a real system call,
//! so "nothing arrived" and "ECONNREFUSED arrived" are what the kernel says, not what a
//! reactor has noticed so far.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::wait_for;
use drill::proxy::{DatagramCounts, Direction, Fault, FaultSpec, Link, ProxyError};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// Every datagram the upstream got, with the flow (source address) it came from.
type Got = Arc<Mutex<Vec<(SocketAddr, Vec<u8>)>>>;

/// An upstream that records what it got, from whom, and echoes it while `echoing`.
struct Upstream {
    addr: SocketAddr,
    socket: Arc<UdpSocket>,
    got: Got,
    echoing: Arc<AtomicBool>,
}

impl Upstream {
    async fn start() -> Upstream {
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let addr = socket.local_addr().unwrap();
        let got: Got = Arc::default();
        let echoing = Arc::new(AtomicBool::new(true));
        let (s, g, e) = (socket.clone(), got.clone(), echoing.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_535];
            while let Ok((n, from)) = s.recv_from(&mut buf).await {
                g.lock().unwrap().push((from, buf[..n].to_vec()));
                if e.load(Ordering::SeqCst) {
                    let _ = s.send_to(&buf[..n], from).await;
                }
            }
        });
        Upstream {
            addr,
            socket,
            got,
            echoing,
        }
    }

    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    fn payloads(&self) -> Vec<Vec<u8>> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// The source address (the link's flow) the last datagram came from.
    fn last_peer(&self) -> SocketAddr {
        self.got.lock().unwrap().last().unwrap().0
    }
}

async fn link_to(up: &Upstream) -> Link {
    Link::start_udp(
        "u",
        "127.0.0.1:0".parse().unwrap(),
        up.addr,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

/// A client socket `connect`ed to the link (so the kernel reports ICMP errors to it).
fn client(link: &Link) -> StdUdp {
    let c = StdUdp::bind("127.0.0.1:0").unwrap();
    c.connect(link.listen_addr()).unwrap();
    c.set_nonblocking(true).unwrap();
    c
}

/// What one `recv` got within `wait`: a datagram, an error, or `None` for nothing at all.
async fn recv_within(c: &StdUdp, wait: Duration) -> Option<std::io::Result<Vec<u8>>> {
    let deadline = Instant::now() + wait;
    let mut buf = vec![0u8; 65_535];
    loop {
        match c.recv(&mut buf) {
            Ok(n) => return Some(Ok(buf[..n].to_vec())),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Some(Err(e)),
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Nothing waits for `c` right now: no datagram, no ICMP error (a real, non-blocking `recv`).
fn nothing_waiting(c: &StdUdp) -> bool {
    let mut buf = [0u8; 64];
    matches!(c.recv(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

/// Sends `message` and waits (at most 5 s) for it to come back; the round trip's time.
async fn echoed(c: &StdUdp, message: &[u8]) -> Duration {
    let t = Instant::now();
    c.send(message).unwrap();
    match recv_within(c, Duration::from_secs(5)).await {
        Some(Ok(answer)) => assert_eq!(answer, message),
        other => panic!("no echo of {message:?}: {other:?}"),
    }
    t.elapsed()
}

fn counts(link: &Link) -> DatagramCounts {
    link.status()
        .datagrams
        .expect("a datagram link counts datagrams")
}

#[tokio::test]
async fn datagrams_pass_both_ways_for_several_clients_each_on_its_own_flow() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    assert!(link.carries_datagrams());
    let clients: Vec<StdUdp> = (0..5).map(|_| client(&link)).collect();
    let mut bytes = 0;
    for round in 0..20 {
        for (i, c) in clients.iter().enumerate() {
            let message = format!("client {i} round {round}");
            bytes += message.len() as u64;
            // Each client gets its own answer back, never another's.
            echoed(c, message.as_bytes()).await;
        }
    }
    let flows: std::collections::HashSet<SocketAddr> = up
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|(from, _)| *from)
        .collect();
    assert_eq!(
        flows.len(),
        5,
        "one flow (upstream source address) per client"
    );
    assert!(
        flows.iter().all(|f| *f != link.listen_addr()),
        "flows are sockets of their own"
    );
    let s = link.status();
    assert_eq!(
        s.datagrams,
        Some(DatagramCounts {
            upstream: 100,
            downstream: 100,
            dropped_upstream: 0,
            dropped_downstream: 0,
            held: 0,
        })
    );
    assert_eq!((s.bytes_upstream, s.bytes_downstream), (bytes, bytes));
    assert_eq!((s.connections_accepted, s.connections_open), (5, 5));
    assert_eq!(s.fault, "pass");
}

/// `refuse`: the kernel answers each datagram with ICMP port unreachable — a connected sender
/// reads ECONNREFUSED — while the link keeps its port; flows end, and after the heal the
/// same client passes again on a new flow.
#[tokio::test]
async fn refuse_is_answered_with_port_unreachable_and_the_port_stays_held() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    let port = link.listen_addr().port();
    let c = client(&link);
    echoed(&c, b"before").await;
    let mut flow = up.last_peer();
    for round in 1..=3u64 {
        link.apply_settled(Fault::Refuse, Direction::Both).await;
        let before = (up.count(), counts(&link));
        c.send(b"refused?").unwrap();
        match recv_within(&c, Duration::from_secs(2)).await {
            Some(Err(e)) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
            other => panic!("a connected sender of a refused datagram got {other:?}"),
        }
        // An unconnected sender is told nothing (the kernel reports ICMP errors only to
        // connected sockets), and the link never read its datagram either.
        let loose = StdUdp::bind("127.0.0.1:0").unwrap();
        loose.set_nonblocking(true).unwrap();
        loose.send_to(b"refused too", link.listen_addr()).unwrap();
        assert!(
            recv_within(&loose, Duration::from_millis(200))
                .await
                .is_none()
        );
        assert_eq!(
            (up.count(), counts(&link)),
            before,
            "nothing read, nothing sent"
        );
        // The port stays the link's: a plain bind is told it is in use, and no free-port pick
        // in a pass over the kernel's range lands on it.
        let taken = StdUdp::bind(link.listen_addr()).unwrap_err();
        assert_eq!(taken.kind(), ErrorKind::AddrInUse, "{taken}");
        let picks = (0..30_000)
            .filter(|_| {
                let s = StdUdp::bind("127.0.0.1:0").unwrap();
                s.local_addr().unwrap().port() == port
            })
            .count();
        assert_eq!(picks, 0, "a free-port pick got the refusing link's port");
        assert_eq!(link.status().fault, "refuse");
        link.apply_settled(Fault::Heal, Direction::Both).await;
        // The same client socket passes again, on a new flow: the refusal ended the old one.
        echoed(&c, b"after").await;
        assert_ne!(up.last_peer(), flow, "a new flow after the refusal");
        flow = up.last_peer();
        assert_eq!(link.status().connections_reset, round);
        wait_for("the refused flow's end", || {
            link.status().connections_open == 1
        })
        .await;
        assert_eq!(link.listen_addr().port(), port);
    }
}

/// `swallow` drops one direction silently: no ICMP, no answer; the other direction passes.
#[tokio::test]
async fn swallow_drops_each_direction_silently() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    let c = client(&link);
    echoed(&c, b"hello").await;

    link.apply_settled(Fault::Swallow, Direction::Upstream)
        .await;
    for i in 0..10 {
        c.send(format!("up {i}").as_bytes()).unwrap();
    }
    wait_for("10 datagrams dropped upstream", || {
        counts(&link).dropped_upstream == 10
    })
    .await;
    assert_eq!(up.count(), 1, "nothing reached the upstream");
    assert!(nothing_waiting(&c), "no answer and no ICMP error");
    // The other way still passes: the upstream's own datagram reaches the client.
    up.socket.send_to(b"push", up.last_peer()).await.unwrap();
    match recv_within(&c, Duration::from_secs(5)).await {
        Some(Ok(p)) => assert_eq!(p, b"push"),
        other => panic!("downstream under an upstream swallow: {other:?}"),
    }
    link.apply_settled(Fault::Heal, Direction::Both).await;
    echoed(&c, b"healed").await;

    link.apply_settled(Fault::Swallow, Direction::Downstream)
        .await;
    let before = up.count();
    for i in 0..10 {
        c.send(format!("down {i}").as_bytes()).unwrap();
    }
    wait_for("10 answers dropped downstream", || {
        counts(&link).dropped_downstream == 10
    })
    .await;
    assert_eq!(
        up.count(),
        before + 10,
        "every datagram reached the upstream"
    );
    assert!(nothing_waiting(&c), "no answer came back");
    link.apply_settled(Fault::Heal, Direction::Both).await;
    echoed(&c, b"healed again").await;
    let d = counts(&link);
    assert_eq!((d.dropped_upstream, d.dropped_downstream), (10, 10));
    assert_eq!(d.upstream, 1 + 1 + 10 + 1);
}

/// `blackhole` drops both ways, silently, and takes no direction.
#[tokio::test]
async fn blackhole_drops_both_ways_silently() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    let c = client(&link);
    echoed(&c, b"hello").await;
    let flow = up.last_peer();
    link.apply_settled(Fault::Blackhole, Direction::Both).await;
    for i in 0..10 {
        c.send(format!("in {i}").as_bytes()).unwrap();
    }
    up.socket.send_to(b"out", flow).await.unwrap();
    wait_for("both ways dropped", || {
        let d = counts(&link);
        d.dropped_upstream == 10 && d.dropped_downstream == 1
    })
    .await;
    assert_eq!(up.count(), 1, "nothing reached the upstream");
    assert!(nothing_waiting(&c), "no answer and no ICMP error");
    assert!(
        FaultSpec::new(Fault::Blackhole, Direction::Upstream)
            .validate()
            .is_err(),
        "a blackhole takes no direction"
    );
    link.apply_settled(Fault::Heal, Direction::Both).await;
    echoed(&c, b"healed").await;
    assert_eq!(up.last_peer(), flow, "a blackhole keeps the flow");
}

/// Sends `n` numbered datagrams under `loss` of `fraction` in `direction` on a link seeded
/// `seed`; which numbers got through (to the upstream, or back to the client).
async fn survivors(seed: u64, direction: Direction, fraction: f64, n: u32) -> Vec<u32> {
    let up = Upstream::start().await;
    up.echoing
        .store(direction == Direction::Downstream, Ordering::SeqCst);
    let link = link_to(&up).await;
    link.seed(seed);
    let c = client(&link);
    link.apply_spec_settled(FaultSpec::loss(direction, fraction))
        .await;
    assert_eq!(link.status().loss, Some(fraction));
    let mut back = Vec::new();
    let mut buf = [0u8; 16];
    // In batches, each one read (and answered) before the next: no socket buffer overflows,
    // so every datagram missing was the link's choice.
    for batch in 0..n / 50 {
        for i in batch * 50..(batch + 1) * 50 {
            c.send(&i.to_be_bytes()).unwrap();
        }
        let sent = u64::from((batch + 1) * 50);
        wait_for("the batch to be read", || {
            let d = counts(&link);
            match direction {
                Direction::Downstream => d.downstream + d.dropped_downstream == sent,
                _ => d.upstream + d.dropped_upstream == sent,
            }
        })
        .await;
        while let Ok(len) = c.recv(&mut buf) {
            back.push(u32::from_be_bytes(buf[..len].try_into().unwrap()));
        }
    }
    if direction != Direction::Downstream {
        // What the link passed may still be on its way to the upstream's socket (CI saw the
        // last 52 missing under load): every datagram passed must be counted there first.
        wait_for("the upstream to receive what the link passed", || {
            up.count() as u64 == counts(&link).upstream
        })
        .await;
    }
    let d = counts(&link);
    let through: Vec<u32> = match direction {
        Direction::Downstream => {
            assert_eq!(up.count() as u32, n, "the upstream direction lost nothing");
            assert_eq!(back.len() as u64, d.downstream);
            back
        }
        _ => {
            assert_eq!(d.dropped_downstream, 0);
            up.payloads()
                .iter()
                .map(|p| u32::from_be_bytes(p[..4].try_into().unwrap()))
                .collect()
        }
    };
    link.shutdown().await;
    through
}

#[tokio::test]
async fn loss_drops_a_seeded_fraction_the_same_for_the_same_seed() {
    let a = survivors(7, Direction::Upstream, 0.3, 2000).await;
    let lost = 2000 - a.len();
    eprintln!("loss 0.3 upstream, seed 7: {lost} of 2000 lost");
    // 600 expected, σ ≈ 20.5: ±100 is five σ.
    assert!((500..=700).contains(&lost), "{lost} of 2000 lost at 0.3");
    assert!(
        a.windows(2).all(|w| w[0] < w[1]),
        "survivors keep their order"
    );
    assert_eq!(
        a,
        survivors(7, Direction::Upstream, 0.3, 2000).await,
        "the same seed loses the same datagrams"
    );
    assert_ne!(
        a,
        survivors(8, Direction::Upstream, 0.3, 2000).await,
        "another seed, other losses"
    );
    let down = survivors(7, Direction::Downstream, 0.5, 1000).await;
    eprintln!(
        "loss 0.5 downstream, seed 7: {} of 1000 through",
        down.len()
    );
    assert!(
        (400..=600).contains(&down.len()),
        "{} of 1000 answers through at 0.5",
        down.len()
    );
    assert_eq!(down, survivors(7, Direction::Downstream, 0.5, 1000).await);
}

/// `delay` holds each direction by its latency (± jitter), measured per round trip, and never
/// reorders; the heal ends it.
#[tokio::test]
async fn delay_holds_each_direction_by_its_latency_in_order() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    let c = client(&link);
    let mut base = Vec::new();
    for i in 0..20u8 {
        base.push(echoed(&c, &[i]).await);
    }
    base.sort();
    eprintln!("pass-through round trip, median of 20: {:?}", base[10]);
    assert!(
        base[10] < Duration::from_millis(50),
        "pass-through: {base:?}"
    );

    let ms = Duration::from_millis;
    link.apply_spec_settled(FaultSpec::delay(
        Direction::Upstream,
        ms(150),
        Duration::ZERO,
    ))
    .await;
    for i in 0..5u8 {
        let rtt = echoed(&c, &[i]).await;
        eprintln!("delay 150ms upstream: round trip {rtt:?}");
        assert!(
            rtt >= ms(150) && rtt < ms(150 + 600),
            "upstream delay: {rtt:?}"
        );
    }
    link.apply_spec_settled(FaultSpec::delay(Direction::Downstream, ms(200), ms(50)))
        .await;
    for i in 0..5u8 {
        let rtt = echoed(&c, &[i]).await;
        eprintln!("delay 200ms±50ms downstream: round trip {rtt:?}");
        assert!(
            rtt >= ms(150) && rtt < ms(250 + 600),
            "downstream delay: {rtt:?}"
        );
    }
    // Jitter larger than the gap between datagrams: still in order, none lost.
    link.apply_spec_settled(FaultSpec::delay(Direction::Both, ms(100), ms(80)))
        .await;
    let before = up.count();
    for i in 0..50u32 {
        c.send(&i.to_be_bytes()).unwrap();
    }
    wait_for("50 delayed datagrams to arrive", || {
        up.count() == before + 50
    })
    .await;
    let order: Vec<u32> = up.payloads()[before..]
        .iter()
        .map(|p| u32::from_be_bytes(p[..4].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..50).collect::<Vec<_>>(), "never reordered");
    wait_for("50 delayed answers", || {
        counts(&link).downstream == 20 + 10 + 50
    })
    .await;
    let mut answers = Vec::new();
    while let Some(Ok(p)) = recv_within(&c, ms(0)).await {
        answers.push(u32::from_be_bytes(p[..4].try_into().unwrap()));
    }
    assert_eq!(answers, (0..50).collect::<Vec<_>>(), "answers in order too");

    link.apply_settled(Fault::Heal, Direction::Both).await;
    let rtt = echoed(&c, b"healed").await;
    eprintln!("after the heal: round trip {rtt:?}");
    assert!(rtt < ms(100), "after the heal: {rtt:?}");
}

/// A fault that drops a direction is in force from the instant it is published, for the
/// datagrams a `delay` still holds too: none of them leaves after it.
#[tokio::test]
async fn held_datagrams_are_dropped_by_a_swallow_that_follows() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    let c = client(&link);
    echoed(&c, b"hello").await;
    let ms = Duration::from_millis;
    link.apply_spec_settled(FaultSpec::delay(
        Direction::Upstream,
        ms(300),
        Duration::ZERO,
    ))
    .await;
    for i in 0..5u8 {
        c.send(&[i]).unwrap();
    }
    wait_for("5 datagrams held", || counts(&link).held == 5).await;
    link.apply_settled(Fault::Swallow, Direction::Upstream)
        .await;
    wait_for("the 5 held datagrams dropped at their time", || {
        counts(&link).dropped_upstream == 5
    })
    .await;
    assert_eq!(up.count(), 1, "none left after the swallow");
    link.apply_settled(Fault::Heal, Direction::Both).await;
    echoed(&c, b"healed").await;
}

/// Faults that need a stream are refused by a datagram link's apply path, with the reason,
/// and change nothing; `loss` and `blackhole` are refused by a TCP link.
#[tokio::test]
async fn faults_that_need_a_stream_are_refused_and_change_nothing() {
    let up = Upstream::start().await;
    let link = link_to(&up).await;
    let c = client(&link);
    for spec in [
        FaultSpec::new(Fault::Reset, Direction::Both),
        FaultSpec::new(Fault::Hang, Direction::Upstream),
        FaultSpec::throttle(Direction::Both, 1000),
        FaultSpec::limit(Direction::Both, 10),
        FaultSpec::new(Fault::Strand, Direction::Both),
    ] {
        let epoch = link.apply_spec(FaultSpec::new(Fault::Heal, Direction::Both));
        match link.try_apply_spec(spec) {
            Err(ProxyError::FaultRefused { why, .. }) => assert!(
                why.contains(&format!(
                    "`{}` has no meaning on a datagram (UDP) link",
                    spec.fault.name()
                )),
                "{why}"
            ),
            other => panic!("{spec:?} on a datagram link: {other:?}"),
        }
        assert!(link.try_apply_spec_settled(spec).await.is_err(), "{spec:?}");
        // The infallible path refuses it too: the condition stays as it was.
        assert_eq!(link.apply_spec(spec), epoch, "{spec:?}");
        assert_eq!(link.status().fault, "pass");
        echoed(&c, b"still passing").await;
    }

    let tcp = Link::start(
        "t",
        "127.0.0.1:0".parse().unwrap(),
        up.addr,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(!tcp.carries_datagrams());
    assert!(tcp.status().datagrams.is_none());
    for spec in [
        FaultSpec::loss(Direction::Both, 0.5),
        FaultSpec::new(Fault::Blackhole, Direction::Both),
    ] {
        let e = tcp.try_apply_spec(spec).unwrap_err().to_string();
        assert!(e.contains("is for datagram (UDP) links"), "{e}");
        assert_eq!(tcp.status().fault, "pass");
    }
}

/// `drill proxy --link NAME=udp:LISTEN,UPSTREAM` makes a datagram link, and its HTTP API puts
/// datagram faults on it and refuses the stream ones.
#[tokio::test]
async fn drill_proxy_makes_udp_links_and_its_api_applies_datagram_faults() {
    let up = Upstream::start().await;
    let free_udp = StdUdp::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let api = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["proxy", "--api", &api.to_string()])
        .args(["--link", &format!("u=udp:{free_udp},{}", up.addr)])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while reqwest::get(format!("http://{api}/links")).await.is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("drill proxy exited: {status}");
        }
        assert!(Instant::now() < deadline, "drill proxy did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _child = Kill(child);
    let c = StdUdp::bind("127.0.0.1:0").unwrap();
    c.connect(free_udp).unwrap();
    c.set_nonblocking(true).unwrap();
    echoed(&c, b"through drill proxy").await;

    let http = reqwest::Client::new();
    let url = format!("http://{api}/links/u/fault");
    let status = |body: serde_json::Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.put(&url).json(&body).send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (code, s) =
        status(serde_json::json!({"fault": "loss", "loss": 1.0, "direction": "upstream"})).await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(
        (s["fault"].as_str(), s["loss"].as_f64()),
        (Some("loss"), Some(1.0))
    );
    c.send(b"lost").unwrap();
    let dropped = move || async move {
        crate::common::link_status(api).await["datagrams"]["dropped_upstream"].as_u64()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped().await != Some(1) {
        assert!(Instant::now() < deadline, "the datagram was not dropped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.count(), 1);

    for (body, says) in [
        (
            serde_json::json!({"fault": "reset"}),
            "`reset` has no meaning on a datagram (UDP) link",
        ),
        (
            serde_json::json!({"fault": "throttle", "bytes_per_s": 100}),
            "`throttle` has no meaning on a datagram (UDP) link",
        ),
        (
            serde_json::json!({"fault": "loss", "loss": 2.0}),
            "needs a fraction above 0 and at most 1",
        ),
    ] {
        let (code, answer) = status(body.clone()).await;
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains(says), "{answer}");
    }
    // The Toxiproxy-shaped API refuses a toxic with no datagram meaning on it too.
    let r = http
        .post(format!("http://{api}/proxies/u/toxics"))
        .json(&serde_json::json!({"type": "bandwidth", "attributes": {"rate": 10}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = http.delete(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    echoed(&c, b"healed").await;
}
