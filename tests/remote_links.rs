//! Links driven from another host (issue: past one machine). A fault put on a `drill proxy`
//! with a lease holds only while its driver renews it: a drill that crashes or loses its
//! network mid-fault leaves nothing applied. Real `drill proxy` processes, real sockets.

mod common;

use std::time::{Duration, Instant};

use common::{drill_proxy, echo, link_status};
use serde_json::json;

/// The link's fault as `GET /links` reports it.
async fn fault_on(api: std::net::SocketAddr) -> String {
    link_status(api).await["fault"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A leased fault holds while renewed, is healed by the proxy once renewals stop (not before
/// the lease, and within a generous bound after it), and cannot be renewed after; a fault put
/// after a `DELETE` carries no stale lease.
#[tokio::test]
async fn a_leased_fault_holds_while_renewed_and_heals_when_its_driver_stops() {
    let up = echo().await;
    let proxy = drill_proxy(Some(up.addr)).await;
    let http = reqwest::Client::new();
    let fault = format!("http://{}/links/t/fault", proxy.api);
    let lease = format!("http://{}/links/t/lease", proxy.api);
    let zero = http
        .put(&fault)
        .json(&json!({"fault": "refuse", "lease_ms": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(zero.status().as_u16(), 400);
    let put = http
        .put(&fault)
        .json(&json!({"fault": "refuse", "lease_ms": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    // Renewed every 200 ms for 1.5 s: still in force, well past one lease.
    let renewing = Instant::now();
    let mut last_renewal = renewing;
    while renewing.elapsed() < Duration::from_millis(1500) {
        last_renewal = Instant::now();
        let r = http.post(&lease).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fault_on(proxy.api).await, "refuse");
    assert!(tokio::net::TcpStream::connect(proxy.listen).await.is_err());
    // The driver stops: the proxy heals the link by itself.
    let stopped = Instant::now();
    while fault_on(proxy.api).await != "pass" {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "the lease ran out and the fault is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The proxy took the last renewal after it was sent, so it cannot heal before 600 ms.
    let healed_after = last_renewal.elapsed();
    println!("healed {healed_after:?} after the last renewal was sent (lease 600 ms)");
    assert!(
        healed_after >= Duration::from_millis(600),
        "{healed_after:?}"
    );
    assert!(tokio::net::TcpStream::connect(proxy.listen).await.is_ok());
    let late = http.post(&lease).send().await.unwrap();
    assert_eq!(late.status().as_u16(), 404);
    // DELETE ends the lease with the fault: a fault put later without one stays.
    http.put(&fault)
        .json(&json!({"fault": "refuse", "lease_ms": 300}))
        .send()
        .await
        .unwrap();
    http.delete(&fault).send().await.unwrap();
    http.put(&fault)
        .json(&json!({"fault": "swallow"}))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fault_on(proxy.api).await, "swallow");
}
