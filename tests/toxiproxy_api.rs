//! The Toxiproxy-shaped API of `drill proxy`, driven as a Toxiproxy client would, with the
//! same observations as drill's own fault tests: real sockets, a real `drill proxy` process.

use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::{
    Echo, ProxyProcess, drill_proxy, echo, is_reset, lands_without_answer, median_rtt, read_within,
    wait_for,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.http.get(&url),
            "POST" => self.http.post(&url),
            _ => self.http.delete(&url),
        };
        let request = match body {
            Some(b) => request.json(&b),
            None => request,
        };
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// Writes `total` bytes through the echo and reads them back; the rate they came back at.
async fn echo_rate(c: TcpStream, total: usize) -> (f64, TcpStream) {
    let started = Instant::now();
    let (mut r, mut w) = c.into_split();
    let writer = tokio::spawn(async move {
        w.write_all(&vec![5u8; total]).await.unwrap();
        w
    });
    let mut got = vec![0u8; total];
    r.read_exact(&mut got).await.unwrap();
    let rate = total as f64 / started.elapsed().as_secs_f64();
    (rate, r.reunite(writer.await.unwrap()).unwrap())
}

/// `POST /proxies/echo/toxics` with `body`: the status and the answer.
async fn add_toxic(api: &Api, body: Value) -> (u16, Value) {
    api.call("POST", "/proxies/echo/toxics", Some(body)).await
}

async fn ping(c: &mut TcpStream) {
    c.write_all(b"hi").await.unwrap();
    let mut b = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut b))
        .await
        .expect("echo")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toxiproxy_client_drives_drill_links() {
    let up = echo().await;
    let proxy = drill_proxy(None).await;
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://{}", proxy.api),
    };
    let listen = proxy.listen;

    // Create a proxy the Toxiproxy way.
    let (status, created) = api
        .call(
            "POST",
            "/proxies",
            Some(json!({"name": "echo", "listen": listen.to_string(), "upstream": up.addr.to_string()})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["enabled"], true);
    let (_, all) = api.call("GET", "/proxies", None).await;
    assert_eq!(all["echo"]["upstream"], up.addr.to_string());
    let (status, _) = api
        .call(
            "POST",
            "/proxies",
            Some(json!({"name": "echo", "listen": "127.0.0.1:0", "upstream": up.addr.to_string()})),
        )
        .await;
    assert_eq!(status, 409);

    let mut c = TcpStream::connect(listen).await.unwrap();
    ping(&mut c).await;

    // latency → delay.
    let (status, toxic) = add_toxic(
        &api,
        json!({"type": "latency", "attributes": {"latency": 80}}),
    )
    .await;
    assert_eq!(status, 200, "{toxic}");
    assert_eq!(toxic["name"], "latency_downstream");
    assert_eq!(toxic["stream"], "downstream");
    let rtt = median_rtt(&mut c, 9).await;
    assert!(
        rtt >= Duration::from_millis(80) && rtt < Duration::from_millis(130),
        "{rtt:?}"
    );
    // bandwidth (KB/s) → throttle, within 10 %.
    let (status, _) = add_toxic(&api, json!({"name": "slow", "type": "bandwidth", "stream": "upstream", "attributes": {"rate": 100}})).await;
    assert_eq!(status, 200);
    let (rate, c2) = echo_rate(c, 300_000).await;
    let mut c = c2;
    assert!(
        (rate - 100_000.0).abs() <= 10_000.0,
        "{rate:.0} B/s for rate 100 KB/s"
    );
    api.call("DELETE", "/proxies/echo/toxics/slow", None).await;
    ping(&mut c).await;

    // timeout 0 downstream → swallow: the request lands, no answer, the socket stays open.
    let (status, _) = add_toxic(
        &api,
        json!({"type": "timeout", "attributes": {"timeout": 0}}),
    )
    .await;
    assert_eq!(status, 200);
    lands_without_answer(&mut c, &up, b"lost-answer", Duration::from_millis(300)).await;
    api.call("DELETE", "/proxies/echo/toxics/timeout_downstream", None)
        .await;
    // Its answer was swallowed: the heal resets it (a stream with a hole).
    assert!(is_reset(&read_within(&mut c, Duration::from_secs(5)).await));

    // reset_peer → reset.
    let mut c = TcpStream::connect(listen).await.unwrap();
    ping(&mut c).await;
    add_toxic(&api, json!({"type": "reset_peer"})).await;
    assert!(is_reset(&read_within(&mut c, Duration::from_secs(5)).await));
    api.call("DELETE", "/proxies/echo/toxics/reset_peer_downstream", None)
        .await;

    // enabled: false → refuse; true → listening again.
    let mut c = TcpStream::connect(listen).await.unwrap();
    ping(&mut c).await;
    let (status, p) = api
        .call("POST", "/proxies/echo", Some(json!({"enabled": false})))
        .await;
    assert_eq!((status, p["enabled"].clone()), (200, json!(false)));
    assert_eq!(
        TcpStream::connect(listen).await.unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );
    assert!(is_reset(&read_within(&mut c, Duration::from_secs(5)).await));
    api.call("POST", "/proxies/echo", Some(json!({"enabled": true})))
        .await;
    let mut c = TcpStream::connect(listen).await.unwrap();
    ping(&mut c).await;

    // limit_data upstream → exactly that many bytes pass, then the connection is reset.
    let before = up.received.load(Ordering::SeqCst);
    let (status, _) = add_toxic(
        &api,
        json!({"type": "limit_data", "stream": "upstream", "attributes": {"bytes": 10}}),
    )
    .await;
    assert_eq!(status, 200);
    c.write_all(&[7u8; 25]).await.unwrap();
    wait_for("10 bytes to land", || {
        up.received.load(Ordering::SeqCst) == before + 10
    })
    .await;
    let mut buf = [0u8; 64];
    let mut echoed = 0;
    let reset = loop {
        match tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("answer or reset")
        {
            Ok(0) => break false,
            Ok(n) => echoed += n,
            Err(e) => break e.kind() == ErrorKind::ConnectionReset,
        }
    };
    assert!(reset, "reset after the limit (echoed {echoed})");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        up.received.load(Ordering::SeqCst),
        before + 10,
        "no byte past the limit"
    );

    // What drill cannot do exactly is refused, with a reason.
    let (status, _) = api.call("POST", "/reset", None).await;
    assert_eq!(status, 204);
    let (status, err) = add_toxic(&api, json!({"type": "slicer"})).await;
    assert_eq!(status, 400, "a slicer needs its average_size: {err}");
    let (_, toxics) = api.call("GET", "/proxies/echo/toxics", None).await;
    assert_eq!(toxics, json!([]));
    let (status, _) = api.call("DELETE", "/proxies/echo", None).await;
    assert_eq!(status, 204);
    assert_eq!(
        TcpStream::connect(listen).await.unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );
}

/// An echo server behind a Toxiproxy proxy `echo` made through drill's Toxiproxy-shaped API,
/// and a connection through it that has had its first answer.
async fn echo_behind_proxy() -> (Echo, ProxyProcess, Api, TcpStream) {
    let up = echo().await;
    let proxy = drill_proxy(None).await;
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://{}", proxy.api),
    };
    let (status, created) = api
        .call(
            "POST",
            "/proxies",
            Some(json!({"name": "echo", "listen": proxy.listen.to_string(), "upstream": up.addr.to_string()})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let mut c = TcpStream::connect(proxy.listen).await.unwrap();
    ping(&mut c).await;
    (up, proxy, api, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toxics_stack_as_toxiproxy_users_write_them() {
    let (_up, _proxy, api, mut c) = echo_behind_proxy().await;
    let (status, _) = add_toxic(
        &api,
        json!({"type": "latency", "attributes": {"latency": 80}}),
    )
    .await;
    assert_eq!(status, 200);
    // Toxics stack as Toxiproxy users write them ("a slow mobile link"): bandwidth beside the
    // latency, the same stream. Both hold: small pings still take the latency, a bulk
    // transfer comes back at the rate (the latency once on top).
    let (status, toxic) = add_toxic(&api, json!({"name": "slow", "type": "bandwidth", "stream": "downstream", "attributes": {"rate": 100}})).await;
    assert_eq!(status, 200, "{toxic}");
    let (_, toxics) = api.call("GET", "/proxies/echo/toxics", None).await;
    assert_eq!(toxics.as_array().map(Vec::len), Some(2), "{toxics}");
    let rtt = median_rtt(&mut c, 9).await;
    assert!(
        rtt >= Duration::from_millis(80) && rtt < Duration::from_millis(130),
        "stacked: {rtt:?}"
    );
    let (rate, c2) = echo_rate(c, 300_000).await;
    c = c2;
    let expected = 300_000.0 / (3.0 + 0.08);
    println!("stacked latency 80 ms + bandwidth 100 KB/s: rtt {rtt:?}, rate {rate:.0} B/s");
    assert!(
        (rate - expected).abs() <= 0.1 * expected,
        "{rate:.0} B/s for rate 100 KB/s after 80 ms"
    );
    // At most one cut: a timeout stacks beside them, a second cut is refused with the reason.
    let (status, _) = add_toxic(&api, json!({"name": "cut", "type": "timeout", "stream": "upstream", "attributes": {"timeout": 0}})).await;
    assert_eq!(status, 200);
    let (status, err) = add_toxic(&api, json!({"type": "reset_peer"})).await;
    assert_eq!(status, 409, "{err}");
    assert!(err["error"].as_str().unwrap().contains("`cut`"), "{err}");
    let (status, err) = add_toxic(&api, json!({"name": "slow", "type": "latency"})).await;
    assert_eq!(status, 409, "{err}");
    api.call("DELETE", "/proxies/echo/toxics/cut", None).await;
    let (_, toxics) = api.call("GET", "/proxies/echo/toxics", None).await;
    assert_eq!(toxics.as_array().map(Vec::len), Some(2), "{toxics}");
    for name in ["latency_downstream", "slow"] {
        let (status, _) = api
            .call("DELETE", &format!("/proxies/echo/toxics/{name}"), None)
            .await;
        assert_eq!(status, 204);
    }
    assert!(median_rtt(&mut c, 9).await < Duration::from_millis(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slicer_and_slow_close_shape_what_passes() {
    let (_up, _proxy, api, mut c) = echo_behind_proxy().await;
    // slicer: the answer comes back in pieces of 10 bytes, each on its own, 20 ms apart.
    let (status, err) = add_toxic(&api, json!({"type": "slicer", "attributes": {"average_size": 10, "size_variation": 0, "delay": 20000}})).await;
    assert_eq!(status, 200, "{err}");
    let started = Instant::now();
    c.write_all(&[9u8; 50]).await.unwrap();
    let mut pieces = Vec::new();
    let mut buf = [0u8; 64];
    while pieces.iter().sum::<usize>() < 50 {
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("a piece")
            .unwrap();
        assert!(n > 0, "closed after {pieces:?}");
        pieces.push(n);
    }
    let took = started.elapsed();
    println!("slicer 10 bytes / 20 ms: pieces {pieces:?} in {took:?}");
    assert_eq!(pieces, vec![10; 5], "pieces of 10 bytes, read one by one");
    assert!(
        took >= Duration::from_millis(80),
        "4 gaps of 20 ms: {took:?}"
    );
    api.call("DELETE", "/proxies/echo/toxics/slicer_downstream", None)
        .await;

    // slow_close: the broker's end of the stream reaches the client 300 ms late.
    let (status, _) = add_toxic(
        &api,
        json!({"type": "slow_close", "attributes": {"delay": 300}}),
    )
    .await;
    assert_eq!(status, 200);
    ping(&mut c).await;
    let started = Instant::now();
    c.shutdown().await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("the end of the stream")
        .unwrap();
    let took = started.elapsed();
    println!("slow_close 300 ms: end of stream after {took:?}");
    assert_eq!(n, 0);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1000),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toxicity_holds_on_its_share_of_connections() {
    let (_up, proxy, api, _c) = echo_behind_proxy().await;
    let listen = proxy.listen;
    // toxicity 0.5: the latency holds on about half of the connections, each one all the way
    // (drawn once per connection, from the link's seed).
    let (status, err) = add_toxic(
        &api,
        json!({"name": "some", "type": "latency", "toxicity": 0.5, "attributes": {"latency": 60}}),
    )
    .await;
    assert_eq!(status, 200, "{err}");
    let mut slow = 0;
    for _ in 0..40 {
        let mut c = TcpStream::connect(listen).await.unwrap();
        let rtt = median_rtt(&mut c, 3).await;
        let again = median_rtt(&mut c, 3).await;
        let late = |d: Duration| d >= Duration::from_millis(60);
        assert_eq!(
            late(rtt),
            late(again),
            "one draw per connection: {rtt:?} then {again:?}"
        );
        slow += usize::from(late(rtt));
    }
    println!("toxicity 0.5: the latency held on {slow} of 40 connections");
    assert!((10..=30).contains(&slow), "{slow} of 40");
    api.call("DELETE", "/proxies/echo/toxics/some", None).await;
    let (status, err) = add_toxic(
        &api,
        json!({"type": "timeout", "toxicity": 0.5, "attributes": {"timeout": 0}}),
    )
    .await;
    assert_eq!(status, 400, "a cut holds on every connection: {err}");
}
