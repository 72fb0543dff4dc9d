//! What a plain TCP client observes through a drill link under each fault
//! (docs/src/design.md#3-fault-vocabulary). Real sockets on 127.0.0.1: a client, the link, and an
//! echo server that counts what it got.

use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::{
    Echo, drill_proxy, echo, is_reset, lands_without_answer, link_status, median_rtt, read_within,
    wait_for,
};
use drill::proxy::{Direction, Fault, Link, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

async fn link_to(echo: &Echo) -> Link {
    Link::start(
        "t",
        "127.0.0.1:0".parse().unwrap(),
        echo.addr,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

/// Connects and proves the path works end to end with one echoed message.
async fn established(link: &Link) -> TcpStream {
    let mut c = TcpStream::connect(link.listen_addr()).await.unwrap();
    c.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf))
        .await
        .expect("echo within 5 s")
        .unwrap();
    assert_eq!(&buf, b"hello");
    c
}

#[tokio::test]
async fn refuse_means_nothing_listens_and_existing_connections_are_reset() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut existing = established(&link).await;
    link.apply_settled(Fault::Refuse, Direction::Both).await;
    let err = TcpStream::connect(link.listen_addr()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    let r = read_within(&mut existing, Duration::from_secs(5)).await;
    assert!(is_reset(&r), "existing connection: {r:?}");
    link.apply_settled(Fault::Heal, Direction::Both).await;
    established(&link).await;
}

/// While a link refuses, its port stays taken: a free-port pick never lands on it and a
/// program binding it explicitly is told it is in use (a parallel drill's broker could take a
/// released port, and the link could not listen again). After the heal it is the link's again.
#[tokio::test]
async fn a_refusing_link_holds_its_port() {
    let up = echo().await;
    let link = link_to(&up).await;
    let port = link.listen_addr().port();
    for _ in 0..3 {
        link.apply_settled(Fault::Refuse, Direction::Both).await;
        let err = TcpStream::connect(link.listen_addr()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
        // (A program that sets SO_REUSEADDR itself could still bind it: Linux lets two such
        // sockets share a port while neither listens.)
        let other =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let taken = other.bind(&link.listen_addr().into()).unwrap_err();
        assert_eq!(taken.kind(), ErrorKind::AddrInUse, "{taken}");
        // Every free port the kernel hands out in one pass over its range, and then some.
        let picks = (0..40_000)
            .filter(|_| {
                let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                s.local_addr().unwrap().port() == port
            })
            .count();
        assert_eq!(picks, 0, "a free-port pick got the refusing link's port");
        link.apply_settled(Fault::Heal, Direction::Both).await;
        established(&link).await;
    }
}

#[tokio::test]
async fn links_are_independent() {
    let up = echo().await;
    let a = link_to(&up).await;
    let b = link_to(&up).await;
    let mut on_b = established(&b).await;
    a.apply_settled(Fault::Refuse, Direction::Both).await;
    assert_eq!(
        TcpStream::connect(a.listen_addr())
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::ConnectionRefused
    );
    on_b.write_all(b"still").await.unwrap();
    let mut buf = [0u8; 5];
    on_b.read_exact(&mut buf).await.unwrap();
    established(&b).await;
    assert_eq!(b.status().fault, "pass");
    assert_eq!(a.status().fault, "refuse");
}

#[tokio::test]
async fn reset_resets_new_and_existing_connections_before_any_byte() {
    let up = echo().await;
    let link = link_to(&up).await;
    // An existing connection that never sent a byte.
    let mut quiet = TcpStream::connect(link.listen_addr()).await.unwrap();
    wait_for("the link to accept", || {
        link.status().connections_accepted == 1
    })
    .await;
    link.apply_settled(Fault::Reset, Direction::Both).await;
    let r = read_within(&mut quiet, Duration::from_secs(5)).await;
    assert!(is_reset(&r), "existing quiet connection: {r:?}");
    // A new connection completes its handshake, then is reset at once, with no byte sent.
    let mut fresh = TcpStream::connect(link.listen_addr()).await.unwrap();
    let r = read_within(&mut fresh, Duration::from_secs(5)).await;
    assert!(is_reset(&r), "new connection: {r:?}");
    assert!(link.status().connections_reset >= 2);
}

#[tokio::test]
async fn swallow_never_blocks_the_sender_and_answers_nothing() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut c = established(&link).await;
    let before = up.received.load(Ordering::SeqCst);
    link.apply_settled(Fault::Swallow, Direction::Both).await;
    let chunk = vec![7u8; 1024 * 1024];
    let started = Instant::now();
    for _ in 0..32 {
        tokio::time::timeout(Duration::from_secs(10), c.write_all(&chunk))
            .await
            .expect("a swallowing link never blocks the sender")
            .unwrap();
    }
    println!("32 MiB written into a swallow in {:?}", started.elapsed());
    wait_for("32 MiB swallowed", || {
        link.status().bytes_swallowed_upstream >= 32 * 1024 * 1024
    })
    .await;
    assert_eq!(
        up.received.load(Ordering::SeqCst),
        before,
        "nothing reached upstream"
    );
    assert!(
        read_within(&mut c, Duration::from_millis(500))
            .await
            .is_none(),
        "no answer, no EOF, no reset: the connection stays open"
    );
    // The stream lost bytes, so the heal resets it (docs/src/design.md#3-fault-vocabulary).
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let r = read_within(&mut c, Duration::from_secs(5)).await;
    assert!(is_reset(&r), "after the heal: {r:?}");
}

#[tokio::test]
async fn swallow_downstream_is_a_half_open_link() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut c = established(&link).await;
    link.apply_settled(Fault::Swallow, Direction::Downstream)
        .await;
    let before = up.received.load(Ordering::SeqCst);
    lands_without_answer(&mut c, &up, b"request", Duration::from_millis(500)).await;
    c.write_all(b"again").await.unwrap();
    wait_for("a second request to land", || {
        up.received.load(Ordering::SeqCst) == before + 12
    })
    .await;
    assert_eq!(link.status().bytes_swallowed_downstream, 12);
}

#[tokio::test]
async fn hang_blocks_the_sender_and_the_heal_delivers_held_bytes_in_order() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut c = established(&link).await;
    link.apply_settled(Fault::Hang, Direction::Both).await;
    let before = up.received.load(Ordering::SeqCst);
    // Write without blocking until the kernel says no more; count exactly what was taken.
    let mut written: u64 = 0;
    let pattern = |i: u64| (i % 251) as u8;
    loop {
        let chunk: Vec<u8> = (written..written + 65536).map(pattern).collect();
        match c.try_write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let ready = tokio::time::timeout(Duration::from_millis(500), c.writable()).await;
                if ready.is_err() {
                    break; // blocked: the hang holds the sender
                }
            }
            Err(e) => panic!("write failed: {e}"),
        }
        assert!(
            written < 64 * 1024 * 1024,
            "a hung link must block the sender"
        );
    }
    println!("sender blocked after {written} bytes");
    assert!(
        written < 16 * 1024 * 1024,
        "blocked well before 16 MiB: {written}"
    );
    // Held, not passed on: the upstream got nothing while the link hung both ways.
    assert_eq!(
        up.received.load(Ordering::SeqCst),
        before,
        "a hung link passes nothing upstream"
    );
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let mut got = vec![0u8; written as usize];
    tokio::time::timeout(Duration::from_secs(20), c.read_exact(&mut got))
        .await
        .expect("held bytes flow after the heal")
        .unwrap();
    assert!(
        got.iter().enumerate().all(|(i, b)| *b == pattern(i as u64)),
        "held bytes arrive complete and in order"
    );
}

#[tokio::test]
async fn the_heal_resets_only_connections_that_lost_bytes() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut lossy = established(&link).await;
    let mut intact = established(&link).await;
    link.apply_settled(Fault::Swallow, Direction::Both).await;
    // A connection opened during the swallow, with nothing sent, has no far side yet.
    let mut late = TcpStream::connect(link.listen_addr()).await.unwrap();
    lossy.write_all(b"x").await.unwrap();
    wait_for("one byte swallowed", || {
        link.status().bytes_swallowed_upstream == 1
    })
    .await;
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let r = read_within(&mut lossy, Duration::from_secs(5)).await;
    assert!(is_reset(&r), "lossy: {r:?}");
    for c in [&mut intact, &mut late] {
        c.write_all(b"y").await.unwrap();
        let mut buf = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf))
            .await
            .expect("an intact connection carries on")
            .unwrap();
        assert_eq!(&buf, b"y");
    }
}

#[tokio::test]
async fn the_control_api_applies_and_heals_faults() {
    let up = echo().await;
    let proxy = Proxy::new(CancellationToken::new());
    let link = link_to(&up).await;
    let listen = link.listen_addr();
    proxy.add(link);
    let cancel = CancellationToken::new();
    let (api, _task) = drill::proxy::api::serve(
        proxy,
        "127.0.0.1:0".parse().unwrap(),
        None,
        None,
        cancel.clone(),
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let put = http
        .put(format!("http://{api}/links/t/fault"))
        .body(r#"{"fault":"refuse"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let status: serde_json::Value = put.json().await.unwrap();
    assert_eq!(status["fault"], "refuse");
    let err = TcpStream::connect(listen).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    let links: serde_json::Value = http
        .get(format!("http://{api}/links"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(links[0]["name"], "t");
    assert_eq!(links[0]["fault"], "refuse");
    let del = http
        .delete(format!("http://{api}/links/t/fault"))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    TcpStream::connect(listen)
        .await
        .expect("listening again after the heal");
    let bad = http
        .put(format!("http://{api}/links/t/fault"))
        .body(r#"{"fault":"explode"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("swallow"));
    let missing = http
        .put(format!("http://{api}/links/nope/fault"))
        .body(r#"{"fault":"hang"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    cancel.cancel();
}

#[tokio::test]
async fn swallow_upstream_drops_requests_and_never_blocks() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut c = established(&link).await;
    let before = up.received.load(Ordering::SeqCst);
    link.apply_settled(Fault::Swallow, Direction::Upstream)
        .await;
    let chunk = vec![1u8; 1024 * 1024];
    for _ in 0..16 {
        tokio::time::timeout(Duration::from_secs(10), c.write_all(&chunk))
            .await
            .expect("never blocks")
            .unwrap();
    }
    wait_for("16 MiB swallowed upstream", || {
        link.status().bytes_swallowed_upstream >= 16 * 1024 * 1024
    })
    .await;
    assert_eq!(up.received.load(Ordering::SeqCst), before);
    assert!(
        read_within(&mut c, Duration::from_millis(300))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn hang_upstream_holds_requests_and_hang_downstream_holds_answers() {
    let up = echo().await;
    let link = link_to(&up).await;
    let mut c = established(&link).await;
    // Upstream: the request is held at the proxy; nothing reaches the broker.
    let before = up.received.load(Ordering::SeqCst);
    link.apply_settled(Fault::Hang, Direction::Upstream).await;
    c.write_all(b"held-request").await.unwrap();
    assert!(
        read_within(&mut c, Duration::from_millis(300))
            .await
            .is_none()
    );
    assert_eq!(up.received.load(Ordering::SeqCst), before);
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let mut buf = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"held-request");
    // Downstream: the request lands, the answer is held until the heal.
    link.apply_settled(Fault::Hang, Direction::Downstream).await;
    lands_without_answer(&mut c, &up, b"held-answer", Duration::from_millis(300)).await;
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let mut buf = [0u8; 11];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"held-answer");
}

#[tokio::test]
async fn delay_adds_its_latency_in_each_direction_it_covers() {
    let up = echo().await;
    let link = link_to(&up).await;
    link.seed(7);
    let mut c = established(&link).await;
    let base = median_rtt(&mut c, 20).await;
    for (direction, expected) in [
        (Direction::Upstream, 60u64),
        (Direction::Downstream, 60),
        (Direction::Both, 120),
    ] {
        link.apply_spec_settled(drill::proxy::FaultSpec::delay(
            direction,
            Duration::from_millis(60),
            Duration::from_millis(10),
        ))
        .await;
        let rtt = median_rtt(&mut c, 15).await;
        println!("delay 60ms±10ms {direction:?}: median rtt {rtt:?} (base {base:?})");
        let ms = rtt.as_millis() as u64;
        let jitter = if direction == Direction::Both { 20 } else { 10 };
        assert!(
            ms + jitter >= expected && ms <= expected + jitter + 40,
            "{direction:?}: {ms} ms for {expected} ms"
        );
    }
    link.apply_settled(Fault::Heal, Direction::Both).await;
    assert!(median_rtt(&mut c, 20).await < Duration::from_millis(20));
}

#[tokio::test]
async fn throttle_caps_bytes_per_second_within_ten_percent() {
    let up = echo().await;
    let link = link_to(&up).await;
    let c = established(&link).await;
    let (mut r, mut w) = c.into_split();
    let cap: u64 = 200_000;
    for direction in [Direction::Upstream, Direction::Downstream] {
        link.apply_spec_settled(drill::proxy::FaultSpec::throttle(direction, cap))
            .await;
        let total: usize = 600_000;
        let started = Instant::now();
        let writer = tokio::spawn(async move {
            w.write_all(&vec![9u8; total]).await.unwrap();
            w
        });
        let mut got = vec![0u8; total];
        r.read_exact(&mut got).await.unwrap();
        let took = started.elapsed();
        w = writer.await.unwrap();
        let rate = total as f64 / took.as_secs_f64();
        println!("throttle {cap} B/s {direction:?}: {rate:.0} B/s over {took:?}");
        assert!(
            (rate - cap as f64).abs() <= 0.10 * cap as f64,
            "{direction:?}: {rate:.0} B/s against a cap of {cap}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_answers_in_under_50ms_with_1000_stalled_connections() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    let up = echo().await;
    let proxy = drill_proxy(Some(up.addr)).await;
    // 1,000 clients that write but never read: the echo's answers fill their receive
    // buffers, so the link's writes toward them block — every connection is stalled.
    let mut clients = Vec::new();
    for _ in 0..1000 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let c = socket.connect(proxy.listen).await.unwrap();
        let (r, mut w) = c.into_split();
        let writer = tokio::spawn(async move {
            let _ = w.write_all(&vec![3u8; 512 * 1024]).await;
            w
        });
        clients.push((r, writer));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = link_status(proxy.api).await;
        if s["connections_open"] == 1000
            && s["bytes_downstream"].as_u64().unwrap_or(0) > 1000 * 4096
        {
            break;
        }
        assert!(Instant::now() < deadline, "connections did not stall: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each call three times over: a call slow every time is the proxy (the bound, 50 ms, on its
    // best of three); one slow once is two cores shared with the test's own 1,000 clients (a
    // first `hang` once took 149 ms in CI, its other 20 calls 1-3 ms). No call may take a second:
    // a control plane that waited on the stalled data would wait as long as the stall.
    let http = reqwest::Client::new();
    let url = format!("http://{}/links/t/fault", proxy.api);
    let calls = [
        ("PUT", r#"{"fault":"hang"}"#),
        ("DELETE", ""),
        ("PUT", r#"{"fault":"swallow","direction":"downstream"}"#),
        ("DELETE", ""),
        ("PUT", r#"{"fault":"delay","latency_ms":100}"#),
        ("DELETE", ""),
    ];
    let mut took = vec![Vec::new(); calls.len()];
    for _ in 0..3 {
        for (i, (method, body)) in calls.iter().enumerate() {
            took[i].push(control_call(&http, &url, method, body).await);
        }
    }
    let reset = control_call(&http, &url, "PUT", r#"{"fault":"reset"}"#).await;
    for ((method, body), times) in calls.iter().zip(&took) {
        println!("{method} {body}: {times:?}");
        let best = times.iter().min().unwrap();
        assert!(
            *best < Duration::from_millis(50),
            "{method} {body}: best of three {best:?} ({times:?})"
        );
    }
    println!("PUT reset: {reset:?}");
    let worst = took.iter().flatten().chain([&reset]).max().unwrap();
    assert!(
        *worst < Duration::from_secs(1),
        "slowest control call: {worst:?}"
    );
    // The reset cut all 1,000 stalled connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    while link_status(proxy.api).await["connections_open"] != 0 {
        assert!(
            Instant::now() < deadline,
            "connections still open after the reset"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One control call, answered 200: how long it took.
async fn control_call(http: &reqwest::Client, url: &str, method: &str, body: &str) -> Duration {
    let request = match method {
        "PUT" => http.put(url).body(body.to_string()),
        _ => http.delete(url),
    };
    let t = Instant::now();
    let answer = request.send().await.unwrap();
    let took = t.elapsed();
    assert_eq!(answer.status(), 200, "{method} {body}");
    took
}

/// `strand`: connections open at that instant go silent for good both ways — nothing reaches
/// either end, no FIN and no RST, not even after the heal or when one end closes — while new
/// connections pass. The upstream here is a plain server that reports what its socket saw.
#[tokio::test]
async fn strand_silences_open_connections_for_good_and_new_ones_pass() {
    use tokio::net::TcpListener;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    // Each accepted upstream socket: echo, and report every read's result (bytes, EOF, error).
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel::<(usize, String)>();
    tokio::spawn(async move {
        let mut n = 0usize;
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = events_tx.clone();
            let id = n;
            n += 1;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) => {
                            let _ = tx.send((id, "eof".into()));
                            break;
                        }
                        Ok(k) => {
                            let _ = tx.send((id, format!("{k} bytes")));
                            let _ = s.write_all(&buf[..k]).await;
                        }
                        Err(e) => {
                            let _ = tx.send((id, format!("error {e}")));
                            break;
                        }
                    }
                }
            });
        }
    });
    let link = Link::start(
        "t",
        "127.0.0.1:0".parse().unwrap(),
        upstream,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let mut old = established(&link).await;
    assert_eq!(events.recv().await.unwrap(), (0, "5 bytes".to_string()));

    link.apply_settled(Fault::Strand, Direction::Both).await;
    assert_eq!(
        link.status().fault,
        "pass",
        "a strand leaves the link passing"
    );
    // The stranded connection: writes are taken, nothing reaches the upstream, nothing comes back.
    old.write_all(b"lost in the dark").await.unwrap();
    wait_for("the stranded bytes to be dropped", || {
        link.status().bytes_swallowed_upstream >= 16
    })
    .await;
    assert!(
        read_within(&mut old, Duration::from_millis(500))
            .await
            .is_none(),
        "no answer, no EOF, no reset"
    );
    // A new connection passes.
    let fresh = established(&link).await;
    assert_eq!(events.recv().await.unwrap(), (1, "5 bytes".to_string()));
    // Neither a heal nor another fault's end wakes the stranded connection.
    link.apply_settled(Fault::Delay, Direction::Both).await;
    link.apply_settled(Fault::Heal, Direction::Both).await;
    old.write_all(b"still dark").await.unwrap();
    assert!(
        read_within(&mut old, Duration::from_millis(500))
            .await
            .is_none(),
        "still silent after the heal"
    );
    // The client gives up and closes: the upstream still hears nothing (no FIN, no RST).
    drop(old);
    let quiet = tokio::time::timeout(Duration::from_millis(700), async {
        loop {
            let e = events.recv().await.unwrap();
            if e.0 == 0 {
                return e;
            }
        }
    })
    .await;
    assert!(
        quiet.is_err(),
        "the upstream of a stranded connection heard: {quiet:?}"
    );
    let status = link.status();
    assert_eq!(status.connections_stranded, 1, "{status:?}");
    assert!(status.bytes_swallowed_upstream >= 26, "{status:?}");
    drop(fresh);
}

/// The control API takes `strand` like any fault and refuses a direction for it.
#[tokio::test]
async fn the_control_api_strands_open_connections() {
    let up = echo().await;
    let proxy = drill_proxy(Some(up.addr)).await;
    let mut c = TcpStream::connect(proxy.listen).await.unwrap();
    c.write_all(b"hi").await.unwrap();
    let mut buf = [0u8; 2];
    c.read_exact(&mut buf).await.unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{}/links/t/fault", proxy.api);
    let bad = client
        .put(&url)
        .json(&serde_json::json!({"fault": "strand", "direction": "upstream"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400, "{}", bad.text().await.unwrap());
    let ok = client
        .put(&url)
        .json(&serde_json::json!({"fault": "strand"}))
        .send()
        .await
        .unwrap();
    assert!(ok.status().is_success(), "{}", ok.text().await.unwrap());
    c.write_all(b"x").await.unwrap();
    assert!(
        read_within(&mut c, Duration::from_millis(500))
            .await
            .is_none()
    );
    let status = link_status(proxy.api).await;
    assert_eq!(status["connections_stranded"], 1, "{status}");
    assert_eq!(status["fault"], "pass", "{status}");
}

/// A healed plain link forwards zero-copy (`splice`) and leaves that path the instant a
/// condition arrives: a 64 MiB stream of counting numbers, sent while the link switches between
/// pass-through, delay, throttle and hang every few milliseconds, comes back whole and in order,
/// and most of it went zero-copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_between_zero_copy_and_conditions_under_load_loses_and_reorders_nothing() {
    let up = echo().await;
    let link = link_to(&up).await;
    let c = established(&link).await;
    const WORDS: u64 = 8 * 1024 * 1024;
    let (mut r, mut w) = c.into_split();
    let writer = tokio::spawn(async move {
        let mut chunk = Vec::with_capacity(64 * 1024);
        for n in 0..WORDS {
            chunk.extend_from_slice(&n.to_le_bytes());
            if chunk.len() == 64 * 1024 {
                w.write_all(&chunk).await.unwrap();
                chunk.clear();
            }
        }
        w.write_all(&chunk).await.unwrap();
        w
    });
    let switcher = {
        let link = link.clone();
        tokio::spawn(async move {
            let mut switches = 0u64;
            let conditions = [
                drill::proxy::FaultSpec::delay(
                    Direction::Both,
                    Duration::from_millis(2),
                    Duration::from_millis(1),
                ),
                drill::proxy::FaultSpec::new(Fault::Heal, Direction::Both),
                drill::proxy::FaultSpec::throttle(Direction::Upstream, 50_000_000),
                drill::proxy::FaultSpec::new(Fault::Heal, Direction::Both),
                drill::proxy::FaultSpec::new(Fault::Hang, Direction::Downstream),
                drill::proxy::FaultSpec::new(Fault::Heal, Direction::Both),
            ];
            loop {
                for spec in conditions {
                    link.apply_spec(spec);
                    switches += 1;
                    tokio::time::sleep(Duration::from_millis(7)).await;
                }
                if switches > 100_000 {
                    return switches;
                }
            }
        })
    };
    let mut buf = vec![0u8; 256 * 1024];
    let mut expected = 0u64;
    let mut partial = Vec::new();
    while expected < WORDS {
        let n = tokio::time::timeout(Duration::from_secs(20), r.read(&mut buf))
            .await
            .expect("the stream goes on")
            .unwrap();
        assert!(n > 0, "closed at word {expected}");
        partial.extend_from_slice(&buf[..n]);
        let whole = partial.len() / 8 * 8;
        for word in partial[..whole].chunks_exact(8) {
            let got = u64::from_le_bytes(word.try_into().unwrap());
            assert_eq!(got, expected, "byte stream out of order or with a hole");
            expected += 1;
        }
        partial.drain(..whole);
    }
    switcher.abort();
    let _ = writer.await.unwrap();
    link.apply_settled(Fault::Heal, Direction::Both).await;
    let s = link.status();
    let total = s.bytes_upstream + s.bytes_downstream;
    println!(
        "64 MiB each way under switching: {} of {} bytes forwarded zero-copy ({:.0} %)",
        s.bytes_spliced,
        total,
        100.0 * s.bytes_spliced as f64 / total as f64
    );
    assert!(s.bytes_spliced > 0 && s.bytes_spliced < total, "{s:?}");
}
