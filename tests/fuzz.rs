//! Property-based fuzzing on the stable toolchain (proptest): whatever the input, these never
//! panic, and what they accept is what they promise. `ci/fuzz.sh` runs each target for a given
//! time (`PROPTEST_CASES` per round); the suite runs each with proptest's default case count.
//! A failure proptest finds is saved under `proptest-regressions/` and replayed first on every
//! later run: commit it.
//!
//! Targets: the scenario parser (random text, and mutations of every file in `scenarios/`), the
//! engine's NDJSON batch check, the record log's recovery (real segment files truncated and
//! corrupted at random), the MQTT packet decoder, and the JSON of the proxy's control APIs
//! (drill's and the Toxiproxy-shaped one; only fault-setting routes, so nothing binds a port).

use std::path::Path;

use bytes::BytesMut;
use proptest::prelude::*;
use tokio_util::codec::Decoder;

/// `PROPTEST_CASES` when set (ci/fuzz.sh), else `default` (the suite).
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn scenario_texts() -> Vec<String> {
    let mut texts = Vec::new();
    for dir in ["scenarios", "scenarios/examples", "fixtures/broken"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "yaml") {
                texts.push(std::fs::read_to_string(e.path()).unwrap());
            }
        }
    }
    texts
}

/// One mutation of a text: a byte flipped, a span deleted or duplicated, a cut.
fn mutate(text: &str, kind: u8, at: usize, len: usize, byte: u8) -> String {
    let mut b = text.as_bytes().to_vec();
    if b.is_empty() {
        return String::new();
    }
    let at = at % b.len();
    let end = (at + len % 64).min(b.len());
    match kind % 4 {
        0 => b[at] = byte,
        1 => {
            b.drain(at..end);
        }
        2 => {
            let span = b[at..end].to_vec();
            b.splice(at..at, span);
        }
        _ => b.truncate(at),
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #[test]
    fn the_scenario_parser_never_panics_on_random_text(text in "\\PC{0,400}") {
        let _ = drill::scenario::parse(Path::new("fuzz.yaml"), &text);
    }

    #[test]
    fn the_scenario_parser_never_panics_on_mutated_scenarios(
        which in 0usize..64, kind in 0u8..4, at in 0usize..4096, len in 0usize..64, byte in any::<u8>()
    ) {
        let texts = scenario_texts();
        let text = mutate(&texts[which % texts.len()], kind, at, len, byte);
        if let Err(e) = drill::scenario::parse(Path::new("fuzz.yaml"), &text) {
            // Every error is located.
            prop_assert!(e.to_string().starts_with("fuzz.yaml:"), "{}", e);
        }
    }

    #[test]
    fn the_ingest_batch_check_never_panics_and_keeps_only_json(body in "(\\PC{0,40}\n){0,12}") {
        if let Ok(lines) = drill::engine::check_batch(&body) {
            for l in lines {
                prop_assert!(serde_json::from_str::<serde_json::Value>(&l).is_ok());
            }
        }
    }

    #[test]
    fn the_mqtt_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut codec = drill::mqtt::DrillCodec;
        let mut buf = BytesMut::from(&bytes[..]);
        for _ in 0..64 {
            match codec.decode(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break,
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases_or(32), ..ProptestConfig::default() })]

    /// Real segment files written by the log, then cut and corrupted at random: reopening never
    /// panics, and what it recovers is a subset of what was written, in order.
    #[test]
    fn the_log_recovers_from_random_truncation_and_corruption(
        batches in proptest::collection::vec(1usize..6, 1..8),
        cut in any::<u64>(), flips in proptest::collection::vec((any::<u64>(), any::<u8>()), 0..4)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("log");
        let mut written = Vec::new();
        {
            let (mut log, _, _) = drill::engine::log::RecordLog::open(&data, 512).unwrap();
            for (b, n) in batches.iter().enumerate() {
                let lines: Vec<String> = (0..*n).map(|i| format!("{{\"b\":{b},\"i\":{i}}}")).collect();
                written.extend(lines.clone());
                log.append(lines).unwrap();
            }
        }
        let mut segments: Vec<_> = std::fs::read_dir(&data).unwrap().flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("records-")))
            .collect();
        segments.sort();
        let victim = &segments[(cut as usize) % segments.len()];
        let mut bytes = std::fs::read(victim).unwrap();
        if !bytes.is_empty() {
            bytes.truncate((cut as usize) % (bytes.len() + 1));
            for (at, b) in &flips {
                if !bytes.is_empty() {
                    let i = (*at as usize) % bytes.len();
                    bytes[i] ^= b | 1;
                }
            }
        }
        std::fs::write(victim, &bytes).unwrap();
        if let Ok((_, records, _)) = drill::engine::log::RecordLog::open(&data, 512) {
            let mut rest = written.iter();
            for r in records {
                let text = r.data.clone();
                prop_assert!(rest.any(|w| *w == text), "recovered a record never written, or out of order: {text}");
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn call(app: &axum::Router, method: &str, uri: &str, body: Vec<u8>) -> u16 {
    use tower::ServiceExt;
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    app.clone()
        .oneshot(request)
        .await
        .unwrap()
        .status()
        .as_u16()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases_or(128), ..ProptestConfig::default() })]

    /// Random and near-valid JSON to the fault-setting routes: always an HTTP answer (never a
    /// panic, never a 5xx).
    #[test]
    fn the_control_apis_answer_any_json(
        raw in proptest::collection::vec(any::<u8>(), 0..200),
        fault in "(refuse|reset|swallow|hang|delay|throttle|heal|strand|x)",
        direction in "(upstream|downstream|both|sideways)",
        number in any::<i64>(),
        toxic in "(latency|bandwidth|timeout|reset_peer|slow_close|limit_data|x)",
    ) {
        runtime().block_on(async {
            let cancel = tokio_util::sync::CancellationToken::new();
            let proxy = drill::proxy::Proxy::new(cancel.clone());
            proxy.start_link("p", "127.0.0.1:0".parse().unwrap(), "127.0.0.1:9".parse().unwrap()).await.unwrap();
            let app = drill::proxy::api::router(proxy);
            let near = format!("{{\"fault\":\"{fault}\",\"direction\":\"{direction}\",\"latency_ms\":{number},\"bytes_per_s\":{number}}}");
            let toxic_json = format!("{{\"type\":\"{toxic}\",\"stream\":\"{direction}\",\"toxicity\":{number},\"attributes\":{{\"latency\":{number},\"rate\":{number},\"timeout\":{number},\"bytes\":{number}}}}}");
            for (method, uri, body) in [
                ("PUT", "/links/p/fault", raw.clone()),
                ("PUT", "/links/p/fault", near.into_bytes()),
                ("POST", "/proxies/p/toxics", raw.clone()),
                ("POST", "/proxies/p/toxics", toxic_json.clone().into_bytes()),
                ("POST", "/proxies/p/toxics/latency_downstream", toxic_json.into_bytes()),
                ("DELETE", "/links/p/fault", Vec::new()),
            ] {
                let status = call(&app, method, uri, body).await;
                assert!(status < 500, "{method} {uri}: {status}");
            }
            cancel.cancel();
        });
    }
}
