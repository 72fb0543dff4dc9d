//! What a plain TCP client observes through a drill link under each fault (DESIGN.md §3).
//! Real sockets on 127.0.0.1: a client, the link, and an echo server that counts what it got.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use drill::proxy::{Direction, Fault, Link, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// An echo server that counts the bytes it received.
struct Echo {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

async fn echo() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    count.fetch_add(n as u64, Ordering::SeqCst);
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Echo { addr, received }
}

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

/// Reads once; `None` if nothing at all arrived within `wait` (no data, no EOF, no reset).
async fn read_within(c: &mut TcpStream, wait: Duration) -> Option<std::io::Result<usize>> {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(wait, c.read(&mut buf)).await.ok()
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn is_reset(r: &Option<std::io::Result<usize>>) -> bool {
    matches!(r, Some(Err(e)) if e.kind() == ErrorKind::ConnectionReset)
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
    // The stream lost bytes, so the heal resets it (DESIGN.md §3).
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
    c.write_all(b"request").await.unwrap();
    wait_for("the request to reach upstream", || {
        up.received.load(Ordering::SeqCst) == before + 7
    })
    .await;
    assert!(
        read_within(&mut c, Duration::from_millis(500))
            .await
            .is_none(),
        "the answer never comes back, the socket stays open"
    );
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
    let mut proxy = Proxy::new();
    let link = link_to(&up).await;
    let listen = link.listen_addr();
    proxy.add(link);
    let cancel = CancellationToken::new();
    let (api, _task) =
        drill::proxy::api::serve(proxy, "127.0.0.1:0".parse().unwrap(), cancel.clone())
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
