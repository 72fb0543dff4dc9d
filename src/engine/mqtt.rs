//! The MQTT 5 output: the I/O side of one [`Output`] whose destination is an MQTT broker, QoS 1,
//! the write key in the user property `write-key`. The probe is CONNECT/CONNACK and a
//! PINGREQ/PINGRESP round trip; an idle session is probed every keepalive, and a session silent
//! past the answer timeout is lost (its open attempts end `possibly_sent`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::config::OutputConfig;
use super::journal::{Journal, ToOutput};
use super::output::Output;
use super::session::OutputSide;
use super::stats::publish_stats;
use crate::mqtt::{self, Packet};

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// Connects and probes: CONNECT/CONNACK, then a PINGREQ/PINGRESP round trip. Writes no data.
pub(super) async fn connect_and_probe(
    cfg: &OutputConfig,
    client_id: &str,
) -> Result<mqtt::Session, String> {
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::LocalConnectedFlag) {
        // MUTANT: "connected" once TCP connects: no CONNACK, no PINGRESP round trip.
        return mutant::connect_without_answer(cfg, client_id).await;
    }
    let limit = cfg.answer_timeout.0;
    let secrets = cfg.credentials.read()?;
    let login = crate::brokers::mqtt_login(&secrets);
    let mut session = mqtt::connect_as(cfg.address, client_id, cfg.keepalive.0, limit, login)
        .await
        .map_err(|e| e.to_string())?;
    let probe = async {
        session
            .framed
            .send(Packet::PingReq(mqtt::PingReq))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            match session.framed.next().await {
                Some(Ok(mqtt::Inbound::Packet(Packet::PingResp(_)))) => return Ok(()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("closed during probe".to_string()),
            }
        }
    };
    tokio::time::timeout(limit, probe)
        .await
        .map_err(|_| format!("no PINGRESP within {limit:?}"))??;
    Ok(session)
}

/// The I/O side of one MQTT output. Runs until `cancel` fires or the ingest channel closes.
pub(super) async fn drive_mqtt(
    mut out: Output,
    cfg: OutputConfig,
    index: usize,
    mut rx: mpsc::UnboundedReceiver<ToOutput>,
    mut journal: Journal,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let client_id = cfg
        .client_id
        .clone()
        .unwrap_or_else(|| format!("drill-engine-{}", cfg.name));
    let answer_timeout = cfg.answer_timeout.0;
    let mut said_down = false;
    publish_stats(&shared, index, &out, false);
    loop {
        // The oldest records waiting, in memory before the first send (and for a mutant's
        // "probe").
        journal.refill(&mut out);
        #[cfg(feature = "mutants")]
        let oldest = out.oldest_waiting();
        #[cfg(feature = "mutants")]
        let oldest = oldest.as_deref();
        let mut side = OutputSide {
            out: &mut out,
            index,
            rx: &mut rx,
            journal: &mut journal,
            shared: &shared,
        };
        let (c, id) = (&cfg, client_id.as_str());
        let Some(session) = side
            .connect(&cfg.name, &mut said_down, &cancel, || async move {
                #[cfg(feature = "mutants")]
                if mutant::is(Mutant::ProbeWithOldestRecord)
                    && let Some(record) = oldest
                {
                    // MUTANT: the probe writes data: the oldest waiting record, QoS 0, no
                    // write key (DESIGN.md §1.5).
                    return mutant::probe_with_record(c, id, record).await;
                }
                connect_and_probe(c, id).await
            })
            .await
        else {
            break;
        };
        out.limit_window(
            session
                .connack
                .properties
                .as_ref()
                .and_then(|p| p.receive_max),
        );
        let (mut tx, incoming) = session.framed.split();
        // Every packet already readable arrives as one batch, so a burst of PUBACKs costs one
        // write of delivery marks, not one per record.
        let mut incoming = incoming.ready_chunks(256);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut last_ping = Instant::now();
        let mut ping_out: Option<Instant> = None;
        let mut last_heard = Instant::now();
        publish_stats(&shared, index, &out, true);
        let lost: String = 'conn: loop {
            let now = Instant::now();
            journal.refill(&mut out);
            let sends = out.next_sends(now);
            if !sends.is_empty() {
                let write = async {
                    for p in sends {
                        tx.feed(p).await?;
                    }
                    tx.flush().await
                };
                match tokio::time::timeout(answer_timeout, write).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => break format!("write failed: {e}"),
                    Err(_) => break format!("writes blocked for {answer_timeout:?}"),
                }
            }
            // Wake exactly when a refused record's backoff ends, not on the next tick.
            let due = out.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    let _ = tx.send(Packet::Disconnect(mqtt::Disconnect::new(
                        mqtt::DisconnectReasonCode::NormalDisconnection,
                    ))).await;
                    break "engine stopping".to_string();
                }
                packets = incoming.next() => {
                    let Some(packets) = packets else { break 'conn "connection closed".to_string() };
                    last_heard = Instant::now();
                    for packet in packets {
                        match packet {
                            Ok(mqtt::Inbound::Ack(ack)) => journal.record(out.on_ack(&ack, last_heard)),
                            Ok(mqtt::Inbound::Packet(Packet::PingResp(_))) => ping_out = None,
                            Ok(mqtt::Inbound::Packet(Packet::Disconnect(d))) => {
                                break 'conn format!("broker disconnected: {:?}", d.reason_code)
                            }
                            Ok(_) => {}
                            Err(e) => break 'conn format!("connection error: {e}"),
                        }
                    }
                    journal.write_marks();
                }
                batch = rx.recv() => match batch {
                    Some(m) => journal.take(&shared.data_dir, &mut out, m),
                    None => break "ingest closed".to_string(),
                },
                _ = async { if let Some(d) = due { tokio::time::sleep_until(d).await } }, if due.is_some() => {}
                _ = tick.tick() => {
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::NoKeepalive) {
                        // MUTANT: no PINGREQ, no answer timeout: only a TCP error ends this
                        // session.
                        journal.housekeeping(&out, &shared, index);
                        continue 'conn;
                    }
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::LocalConnectedFlag) {
                        // MUTANT: the flag says connected, so nothing is probed, and an attempt
                        // unanswered for the answer timeout is a refusal (DESIGN.md §1.2).
                        journal.record(out.unanswered_as_refused(answer_timeout, Instant::now()));
                        journal.housekeeping(&out, &shared, index);
                        continue 'conn;
                    }
                    let now = Instant::now();
                    if let Some(sent) = ping_out {
                        if now.duration_since(sent) > answer_timeout {
                            break format!("no PINGRESP within {answer_timeout:?}");
                        }
                    } else {
                        // Probe when idle for a keepalive, or at once when an attempt has waited
                        // half the answer timeout with nothing heard since.
                        let stalled = out.in_flight() > 0
                            && now.duration_since(last_heard) > answer_timeout / 2;
                        if now.duration_since(last_ping) >= cfg.keepalive.0 || stalled {
                            match tokio::time::timeout(answer_timeout, tx.send(Packet::PingReq(mqtt::PingReq))).await {
                                Ok(Ok(())) => { ping_out = Some(now); last_ping = now; }
                                Ok(Err(e)) => break format!("write failed: {e}"),
                                Err(_) => break format!("writes blocked for {answer_timeout:?}"),
                            }
                        }
                    }
                    journal.housekeeping(&out, &shared, index);
                }
            }
        };
        journal.end_session(&mut out, &shared, index, &lost);
        if cancel.is_cancelled() {
            break;
        }
        eprintln!("drill engine: output {}: connection lost: {lost}", cfg.name);
        said_down = true;
    }
    journal.sync();
    publish_stats(&shared, index, &out, false);
}
