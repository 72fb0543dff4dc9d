//! The engine's ingest refuses bad input before storing anything: a body over the limit and a
//! record over the limit get 413 with the limit, a line that is not JSON gets 400 naming the
//! line, and nothing of a refused batch is held.

use std::time::Duration;

use drill::engine::{EngineConfig, MAX_INGEST_BODY, MAX_RECORD, OutputConfig};
use drill::sut::EngineProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_refused_whole_with_the_line_or_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: dir.path().join("data"),
        // A destination that refuses every connection: ingest alone is under test.
        outputs: vec![OutputConfig::new(
            "mqtt",
            "nowhere",
            "127.0.0.1:9".parse().unwrap(),
            "t",
        )],
        disk: Default::default(),
    };
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_drill"));
    let mut engine = EngineProcess::start(&exe, config, dir.path())
        .await
        .unwrap();
    let url = format!("http://{}/ingest", engine.addr());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let post = |body: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let r = http.post(&url).body(body).send().await.unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            (status, v["error"].as_str().unwrap_or("").to_string())
        }
    };

    let (status, error) =
        post("{\"id\":\"a\"}\n\n{\"id\": broken\n{\"id\":\"c\"}\n".to_string()).await;
    assert_eq!(status, 400, "{error}");
    assert!(error.starts_with("line 3: not JSON"), "{error}");

    let big = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(MAX_RECORD));
    let (status, error) = post(format!("{{\"id\":\"a\"}}\n{big}")).await;
    assert_eq!(status, 413, "{error}");
    assert!(
        error.contains(&format!("line 2: a record of {} bytes", big.len() - 1)),
        "{error}"
    );
    assert!(error.contains(&MAX_RECORD.to_string()), "{error}");

    let line = format!("{{\"pad\":\"{}\"}}\n", "y".repeat(1000));
    let body = line.repeat(MAX_INGEST_BODY / line.len() + 10);
    let (status, error) = post(body).await;
    assert_eq!(status, 413, "{error}");
    assert!(error.contains(&MAX_INGEST_BODY.to_string()), "{error}");

    assert_eq!(
        engine.stats().await.unwrap().held,
        0,
        "nothing of a refused batch is held"
    );
    let (status, _) = post("{\"id\":\"ok\"}\n".to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(engine.stats().await.unwrap().held, 1);
    engine.stop(Duration::from_secs(5)).await;
}
