//! Acceptance is durable (docs/src/design.md#rule-1-8): the engine, under steady ingest, is
//! SIGKILLed at 100 random (seeded) instants and restarted on the same data directory each time;
//! after a drain every record it acknowledged is at the broker. Real engine process, real broker,
//! real disk. Segments are small (32 KiB), so the log rolls and deletes delivered segments all the
//! while: a kill can land mid-roll or mid-delete too.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drill::dest::Runtime;
use drill::dest::mqtt::read::Reader;
use drill::engine::{EngineConfig, OutputConfig};
use drill::seed::Seeded;
use drill::sut::EngineProcess;
use drill::verify;
use drill::workload::WorkloadSpec;
use drill::workload::{self, Ingested, Sent};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sigkills_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker =
        drill::dest::mqtt::broker::start_mqtt(Runtime::Auto, dir.path(), Default::default())
            .await
            .unwrap();
    let cancel = CancellationToken::new();
    let t0 = Instant::now();
    let reader = Reader::start(broker.addr, "t/crash", t0, cancel.clone())
        .await
        .unwrap();
    let port = drill::process::free_port().unwrap();
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        data_dir: dir.path().join("engine-data"),
        outputs: vec![OutputConfig::new("mqtt", "mqtt", broker.addr, "t/crash")],
        disk: drill::engine::DiskLimits {
            segment_bytes: 32 * 1024,
            ..Default::default()
        },
    };
    let mut engine = EngineProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_drill")),
        config,
        dir.path(),
    )
    .await
    .unwrap();

    let sent = Arc::new(Mutex::new(Sent::default()));
    let spec = WorkloadSpec {
        rate_per_s: 500.0,
        duration: Duration::from_secs(600),
        keys: 8,
        payload_bytes: 200,
        poison: Vec::new(),
    };
    let workload_cancel = CancellationToken::new();
    let workload = tokio::spawn(workload::drive(
        spec,
        "crash".to_string(),
        3,
        drill::sut::Ingest::new(
            &drill::scenario::IngestSpec::Http {
                path: "/ingest".to_string(),
                batch: usize::MAX,
            },
            engine.addr(),
            "crash",
        )
        .expect("an HTTP client"),
        Instant::now(),
        sent.clone(),
        workload_cancel.clone(),
    ));

    // 100 SIGKILLs, each at a random instant 0–300 ms after the engine answered again.
    let mut rng = Seeded::new(42);
    let kills = 100;
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        engine.kill().await;
        engine.spawn().await.unwrap();
    }
    workload_cancel.cancel();
    let _ = workload.await;

    // Drain: until the engine holds nothing undelivered and has given back delivered segments.
    let deadline = Instant::now() + Duration::from_secs(60);
    let segments_written = std::fs::read_dir(dir.path().join("engine-data"))
        .unwrap()
        .count();
    loop {
        let stats = engine.stats().await.unwrap();
        if stats.waiting == 0 && stats.segments <= 2 {
            println!(
                "drained: held {} = delivered {}; {} segments left on disk",
                stats.held, stats.delivered, stats.segments
            );
            assert_eq!(stats.held, stats.delivered);
            break;
        }
        assert!(Instant::now() < deadline, "no drain: {stats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    engine.stop(Duration::from_secs(5)).await;
    let received = reader.stop().await;
    broker.stop().await;

    let sent = sent.lock().unwrap();
    let r = verify::reconcile(&sent, &received);
    let acked = sent.count(|i| matches!(i, Ingested::Accepted { .. }));
    let last_seq = std::fs::read_dir(dir.path().join("engine-data"))
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("records-")?
                .get(..20)?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    println!(
        "the newest segment starts at sequence {last_seq}: every segment before it was delivered and deleted ({segments_written} files in the data directory before the drain)"
    );
    println!(
        "{kills} SIGKILLs; {acked} records acknowledged, {} delivered, {} missing; {} extra copies ({} with the original write key); {} ingests with a lost answer ({} found); read-back took {:?}",
        r.delivered,
        r.missing,
        r.duplicates,
        r.duplicates_same_key,
        r.ingest_unknown,
        r.recovered,
        t0.elapsed()
    );
    assert!(
        received.verifier_fault.is_none(),
        "{:?}",
        received.verifier_fault
    );
    assert!(acked > 5_000, "steady ingest: {acked} acknowledged");
    assert_eq!(
        r.missing, 0,
        "acknowledged and lost: {:?}",
        r.missing_examples
    );
    assert_eq!(r.delivered, acked);
    assert_eq!(
        r.duplicates_other_key, 0,
        "every resend carries its write key"
    );
    assert_eq!(r.unexpected, 0);
}
