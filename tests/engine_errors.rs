//! No swallowed errors where the verdict or durability depends on them, on a real full disk:
//! records stored, then the data directory's filesystem filled to the last byte, then the link
//! healed. Every record is still delivered, and the attempt journal's and delivery marks' failed
//! writes are said on stderr and counted in `/stats.errors` (which a drill's report names).
//! Needs root to mount a tmpfs: under `CI=true` its absence fails the test.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use drill::dest::Runtime;
use drill::engine::{DiskLimits, EngineConfig, OutputConfig};
use drill::proxy::{Direction, Fault, Link};
use drill::sut::EngineProcess;
use tokio_util::sync::CancellationToken;

use crate::common::engine::Tmpfs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_journal_writes_on_a_full_disk_are_counted_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let Some(_disk) = Tmpfs::mount(&disk, "4m") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "mounting a tmpfs failed under CI=true: this test needs root"
        );
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let mut broker =
        drill::dest::mqtt::broker::start_mqtt(Runtime::Process, dir.path(), Default::default())
            .await
            .expect("mosquitto is installed (ci/setup.sh)");
    let link = Link::start(
        "mqtt",
        "127.0.0.1:0".parse().unwrap(),
        broker.addr,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    link.apply_settled(Fault::Refuse, Direction::Both).await;
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: disk.join("data"),
        outputs: vec![OutputConfig::new(
            "mqtt",
            "mqtt",
            link.listen_addr(),
            "t/errors",
        )],
        // No reserve: the disk may fill to the last byte (ingest is done by then).
        disk: DiskLimits {
            warn_below_bytes: 0,
            refuse_below_bytes: 0,
            ..DiskLimits::default()
        },
    };
    let mut engine =
        EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, dir.path())
            .await
            .unwrap();
    let body: String = (0..200)
        .map(|i| format!("{{\"id\":\"r/{i}\"}}\n"))
        .collect();
    let answer = reqwest::Client::new()
        .post(format!("http://{}/ingest", engine.addr()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    // Fill the filesystem: nothing more can be written to the journals.
    let mut filler = std::fs::File::create(disk.join("filler")).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while filler.write_all(&chunk).is_ok() {}
    let mut last = vec![0u8; 1];
    while filler.write_all(&last).is_ok() {
        last.push(0);
    }

    link.apply_settled(Fault::Heal, Direction::Both).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let stats = loop {
        let s = engine.stats().await.unwrap();
        if s.delivered == 200 && s.errors > 0 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "after 30 s: delivered {}, errors {}",
            s.delivered,
            s.errors
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    engine.stop(Duration::from_secs(5)).await;
    let log = std::fs::read_to_string(dir.path().join("engine.log")).unwrap();
    println!(
        "delivered {} with {} failed journal writes",
        stats.delivered, stats.errors
    );
    assert!(
        log.contains("drill engine: error: attempt journal")
            || log.contains("drill engine: error: delivery marks"),
        "{log}"
    );
    broker.stop().await;
}
