//! Control planes are not an open door: bound beyond loopback, `drill proxy --api` and the
//! engine's API refuse to start without a token and answer 401 without it. Traffic goes to
//! 127.0.0.1 only, even when the listener is bound to 0.0.0.0.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn status(url: &str, token: Option<&str>) -> Option<u16> {
    let http = reqwest::Client::new();
    let mut request = http.get(url).timeout(Duration::from_secs(2));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    request.send().await.ok().map(|r| r.status().as_u16())
}

async fn until_up(url: &str, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(url, Some(token)).await.is_none() {
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_proxy_api_bound_to_all_addresses_needs_its_token() {
    let port = drill::process::free_port().unwrap();
    let api = format!("0.0.0.0:{port}");
    let refused = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["proxy", "--api", &api])
        .env_remove("DRILL_TOKEN")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs a bearer token"));

    let _proxy = Killed(
        Command::new(env!("CARGO_BIN_EXE_drill"))
            .args(["proxy", "--api", &api, "--token", "s3cret"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}/links");
    until_up(&url, "s3cret").await;
    assert_eq!(status(&url, None).await, Some(401));
    assert_eq!(status(&url, Some("wrong")).await, Some(401));
    assert_eq!(status(&url, Some("s3cret")).await, Some(200));
    // The Toxiproxy-shaped routes are behind the same door.
    let toxiproxy = format!("http://127.0.0.1:{port}/proxies");
    assert_eq!(status(&toxiproxy, None).await, Some(401));
}

#[tokio::test]
async fn an_engine_api_bound_to_all_addresses_needs_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = drill::process::free_port().unwrap();
    let config = dir.path().join("engine.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 0.0.0.0:{port}\ndata_dir: {}\noutputs:\n- {{ name: m, kind: mqtt, address: 127.0.0.1:9, topic: t }}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["engine", "--config"])
        .arg(&config)
        .env_remove("DRILL_TOKEN")
        .output()
        .unwrap();
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("needs a bearer token"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let _engine = Killed(
        Command::new(env!("CARGO_BIN_EXE_drill"))
            .args(["engine", "--config"])
            .arg(&config)
            .env("DRILL_TOKEN", "s3cret")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}/stats");
    until_up(&url, "s3cret").await;
    assert_eq!(status(&url, None).await, Some(401));
    assert_eq!(status(&url, Some("s3cret")).await, Some(200));
}
