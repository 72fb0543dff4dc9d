//! Property-based fuzzing on the stable toolchain (proptest): whatever the input, these never
//! panic, and what they accept is what they promise. `ci/fuzz.sh` runs each target for a given
//! time (`PROPTEST_CASES` per round; `ci/test.sh` gives all of them 3 minutes); the suite runs
//! each with proptest's default case count. A failure proptest finds is saved in
//! `tests/fuzz.proptest-regressions` and replayed first on every later run: commit it.
//!
//! Targets: the scenario parser (random text, and mutations of every file in `scenarios/`), the
//! engine's NDJSON batch check, the record log's recovery (real segment files cut short and
//! corrupted at random, judged frame by frame against what was written), the MQTT decoder
//! (random bytes, and packets built from their structure and cut anyhow), the MQTT tap against
//! a model of the session, the syslog tap against the ids written, the PostgreSQL tap's
//! overlapping attempts against a model of a pipelined session, and the JSON of the proxy's control APIs (drill's and the
//! Toxiproxy-shaped one; only fault-setting routes, so nothing binds a port).

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
        let mut codec = drill::wire::mqtt::DrillCodec;
        let mut buf = BytesMut::from(&bytes[..]);
        for _ in 0..64 {
            match codec.decode(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Packets built from their structure, encoded, cut into chunks anyhow: the decoder gives
    /// back exactly the packets, in order (a PUBACK as its packet id and reason code).
    #[test]
    fn the_mqtt_decoder_reads_back_packets_cut_anyhow(
        items in proptest::collection::vec(mqtt_item(), 1..24),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let wire: Vec<u8> = items.iter().flat_map(encode).collect();
        let mut codec = drill::wire::mqtt::DrillCodec;
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        for chunk in chunks(&wire, &cuts) {
            buf.extend_from_slice(chunk);
            while let Some(inbound) = codec.decode(&mut buf).map_err(|e| TestCaseError::fail(format!("{e:?}")))? {
                decoded.push(inbound);
            }
        }
        prop_assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
        prop_assert_eq!(decoded.len(), items.len());
        for (item, inbound) in items.iter().zip(&decoded) {
            match (item, inbound) {
                (MqttItem::Ack { pkid, reason }, drill::wire::mqtt::Inbound::Ack(ack)) => {
                    prop_assert_eq!((ack.pkid, ack.code), (*pkid, reason_code(*reason)));
                }
                (item, drill::wire::mqtt::Inbound::Packet(p)) => prop_assert_eq!(&packet(item), p),
                (item, other) => prop_assert!(false, "{item:?} came back as {other:?}"),
            }
        }
    }

    /// The MQTT tap, fed the engine's side and the broker's side cut into chunks anyhow, notes
    /// exactly the ids a model of the session says went up and were acknowledged.
    #[test]
    fn the_mqtt_tap_notes_exactly_what_crossed(
        items in proptest::collection::vec(mqtt_item(), 1..24),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        use drill::proxy::tap::{TapLog, TapMaker};
        let (up, down): (Vec<&MqttItem>, Vec<&MqttItem>) =
            items.iter().partition(|i| !matches!(i, MqttItem::Ack { .. }));
        let up_wire: Vec<u8> = up.iter().flat_map(|i| encode(i)).collect();
        let down_wire: Vec<u8> = down.iter().flat_map(|i| encode(i)).collect();
        let maker = drill::dest::mqtt::tap::MqttTaps::new(drill::proxy::tap::IdFinder::new(RUN));
        let log = TapLog::default();
        let mut tap = maker.tap();
        for chunk in chunks(&up_wire, &cuts) {
            tap.left(chunk, &log);
            tap.up(chunk, &log);
        }
        for chunk in chunks(&down_wire, &cuts) {
            tap.down(chunk, &log);
        }
        // The model: a QoS 1 PUBLISH waits under its packet id (a later one with the same id
        // takes its place); a PUBACK below 0x80 confirms what waits under its id.
        let (mut sent, mut acked, mut waiting) = (Vec::new(), Vec::new(), std::collections::HashMap::new());
        let (mut frames, mut unreadable) = (0u64, 0u64);
        for item in &up {
            if let MqttItem::Publish { qos1, pkid, ids, .. } = item {
                frames += 1;
                unreadable += u64::from(ids.is_empty());
                sent.extend(ids.iter().copied());
                if *qos1 {
                    waiting.insert(*pkid, ids.clone());
                }
            }
        }
        for item in &down {
            if let MqttItem::Ack { pkid, reason } = item
                && let Some(ids) = waiting.remove(pkid)
                && reason_code(*reason) < 0x80
            {
                acked.extend(ids);
            }
        }
        let seen = log.seen();
        let as_set = |v: &[(u32, u64)]| v.iter().copied().collect::<std::collections::BTreeSet<_>>();
        let of = |ids: Vec<drill::proxy::tap::TapId>| ids.into_iter().map(|t| (t.key, t.seq)).collect::<std::collections::BTreeSet<_>>();
        prop_assert_eq!(of(seen.sent.keys().copied().collect()), as_set(&sent));
        prop_assert_eq!(of(seen.left.iter().copied().collect()), as_set(&sent));
        prop_assert_eq!(of(seen.acked.iter().copied().collect()), as_set(&acked));
        prop_assert_eq!((seen.frames, seen.unreadable), (frames, unreadable));
    }
}

/// The run the structured MQTT targets' ids belong to.
const RUN: &str = "fuzz";

/// One MQTT packet, as a strategy builds it.
#[derive(Debug, Clone)]
enum MqttItem {
    /// A PUBLISH whose payload carries `ids` (with a decoy that is no id: a leading zero).
    Publish {
        qos1: bool,
        pkid: u16,
        topic: String,
        ids: Vec<(u32, u64)>,
        write_key: Option<String>,
        filler: Vec<u8>,
    },
    Ack {
        pkid: u16,
        reason: u8,
    },
    Ping,
}

fn mqtt_item() -> impl Strategy<Value = MqttItem> {
    let publish = (
        any::<bool>(),
        1u16..=u16::MAX,
        "[a-e/]{1,20}",
        proptest::collection::vec((0u32..1000, any::<u64>()), 0..4),
        proptest::option::of("[a-z0-9-]{1,30}"),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(
            |(qos1, pkid, topic, ids, write_key, filler)| MqttItem::Publish {
                qos1,
                pkid: if qos1 { pkid } else { 0 },
                topic,
                ids,
                write_key,
                // Bytes that cannot start an id: the tap must find ids around them, not in them.
                filler: filler.into_iter().map(|b| b & 0x3f).collect(),
            },
        );
    let ack = (1u16..=u16::MAX, 0u8..9).prop_map(|(pkid, reason)| MqttItem::Ack { pkid, reason });
    prop_oneof![6 => publish, 3 => ack, 1 => Just(MqttItem::Ping)]
}

/// The reason codes a PUBACK carries, by index.
fn reason(i: u8) -> drill::wire::mqtt::PubAckReason {
    use drill::wire::mqtt::PubAckReason::*;
    [
        Success,
        NoMatchingSubscribers,
        UnspecifiedError,
        ImplementationSpecificError,
        NotAuthorized,
        TopicNameInvalid,
        PacketIdentifierInUse,
        QuotaExceeded,
        PayloadFormatInvalid,
    ][usize::from(i) % 9]
}

fn reason_code(i: u8) -> u8 {
    [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99][usize::from(i) % 9]
}

fn packet(item: &MqttItem) -> drill::wire::mqtt::Packet {
    use drill::wire::mqtt::{Packet, PingReq, PubAck, Publish, QoS};
    match item {
        MqttItem::Publish {
            qos1,
            pkid,
            topic,
            ids,
            write_key,
            filler,
        } => {
            let mut payload = filler.clone();
            for (k, s) in ids {
                payload.extend_from_slice(
                    format!("{{\"id\":\"{RUN}/k{k}/{s}\",\"x\":\"{RUN}/k0{k}/{s}\"}}").as_bytes(),
                );
            }
            let qos = if *qos1 {
                QoS::AtLeastOnce
            } else {
                QoS::AtMostOnce
            };
            match write_key {
                Some(key) if *qos1 => {
                    drill::wire::mqtt::publish_with_key(topic, *pkid, payload.into(), key)
                }
                _ => {
                    let mut p = Publish::new(topic.as_str(), qos, payload, None);
                    p.pkid = *pkid;
                    Packet::Publish(p)
                }
            }
        }
        MqttItem::Ack { pkid, reason: r } => Packet::PubAck(PubAck {
            pkid: *pkid,
            reason: reason(*r),
            properties: None,
        }),
        MqttItem::Ping => Packet::PingReq(PingReq),
    }
}

fn encode(item: &MqttItem) -> Vec<u8> {
    use tokio_util::codec::Encoder;
    let mut out = BytesMut::new();
    drill::wire::mqtt::DrillCodec
        .encode(packet(item), &mut out)
        .unwrap();
    out.to_vec()
}

/// `bytes` cut at the given points (taken modulo its length), in order.
fn chunks<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.windows(2).map(|w| &bytes[w[0]..w[1]]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases_or(32), ..ProptestConfig::default() })]

    /// Real segment files written by the log, then one cut short and corrupted at random:
    /// reopening always succeeds; every record of another segment, and every batch that ends
    /// before the first damaged byte, is recovered; no record whose frame was damaged or cut
    /// comes back, nothing comes back out of order, and the active segment's last batch comes
    /// back whole or not at all.
    #[test]
    fn the_log_recovers_every_record_before_the_damage_and_invents_none(
        batches in proptest::collection::vec(1usize..6, 1..10),
        victim in any::<usize>(), cut in any::<u64>(),
        flips in proptest::collection::vec((any::<u64>(), any::<u8>()), 0..4)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("log");
        // Each record's frame: its segment, its byte range there, and its batch.
        let mut written: Vec<(drill::engine::log::StoredRecord, std::ops::Range<u64>, usize)> = Vec::new();
        {
            let (mut log, _, _) = drill::engine::log::RecordLog::open(&data, 512).unwrap();
            for (b, n) in batches.iter().enumerate() {
                let lines: Vec<String> = (0..*n).map(|i| format!("{{\"b\":{b},\"i\":{i}}}")).collect();
                for r in log.append(lines).unwrap() {
                    let start = written.iter().rev().find(|(w, _, _)| w.segment == r.segment).map_or(0, |(_, at, _)| at.end);
                    let end = start + 8 + 8 + 1 + r.data.len() as u64;
                    written.push(((*r).clone(), start..end, b));
                }
            }
        }
        let segment_of = |first: u64| data.join(format!("records-{first:020}.log"));
        let mut segments: Vec<u64> = written.iter().map(|(r, _, _)| r.segment).collect();
        segments.dedup();
        let victim = segments[victim % segments.len()];
        let path = segment_of(victim);
        let mut bytes = std::fs::read(&path).unwrap();
        prop_assert_eq!(Some(bytes.len() as u64), written.iter().filter(|(r, _, _)| r.segment == victim).map(|(_, at, _)| at.end).max());
        bytes.truncate((cut as usize) % (bytes.len() + 1));
        let intact = bytes.clone();
        for (at, b) in &flips {
            if !bytes.is_empty() {
                let i = (*at as usize) % bytes.len();
                bytes[i] ^= b | 1;
            }
        }
        // Damaged: the cut, and every byte that differs now (two equal flips of one byte undo
        // each other, and that byte is intact again).
        let mut damaged: Vec<u64> = vec![bytes.len() as u64];
        damaged.extend((0..bytes.len()).filter(|&i| bytes[i] != intact[i]).map(|i| i as u64));
        let first_damage = *damaged.iter().min().unwrap();
        std::fs::write(&path, &bytes).unwrap();

        let recovered = drill::engine::log::RecordLog::open(&data, 512);
        prop_assert!(recovered.is_ok(), "the log did not reopen: {:?}", recovered.err());
        let (_, records, _) = recovered.unwrap();
        let by_seq: std::collections::HashMap<u64, &drill::engine::log::StoredRecord> =
            records.iter().map(|r| (r.seq, r.as_ref())).collect();
        prop_assert!(records.windows(2).all(|w| w[0].seq < w[1].seq), "out of order");
        let active = *segments.last().unwrap();
        let last_batch = written.last().unwrap().2;
        for (w, at, batch) in &written {
            let hit = w.segment == victim
                && (at.end > bytes.len() as u64 || damaged.iter().any(|d| at.contains(d)));
            let batch_end = written.iter().filter(|(_, _, b)| b == batch).map(|(_, at, _)| at.end).max().unwrap_or(at.end);
            let before = w.segment != victim || batch_end <= first_damage;
            match by_seq.get(&w.seq) {
                Some(r) => {
                    prop_assert_eq!((&r.data, &r.key), (&w.data, &w.key), "seq {} came back changed", w.seq);
                    prop_assert!(!hit, "seq {} came back from a damaged frame", w.seq);
                }
                None => prop_assert!(!before, "seq {} (batch {batch}) lay before the damage and was lost", w.seq),
            }
        }
        // The active segment's last batch: whole or not at all.
        let tail: Vec<bool> = written.iter().filter(|(w, _, b)| w.segment == active && *b == last_batch)
            .map(|(w, _, _)| by_seq.contains_key(&w.seq)).collect();
        prop_assert!(tail.iter().all(|k| *k) || tail.iter().all(|k| !*k), "the last batch came back in part: {tail:?}");
        // Nothing comes back that was never written.
        prop_assert!(records.iter().all(|r| written.iter().any(|(w, _, _)| w.seq == r.seq)));
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
        fault in "(refuse|reset|swallow|hang|delay|throttle|heal|strand|loss|blackhole|x)",
        direction in "(upstream|downstream|both|sideways)",
        number in any::<i64>(),
        toxic in "(latency|bandwidth|timeout|reset_peer|slow_close|limit_data|x)",
    ) {
        runtime().block_on(async {
            let cancel = tokio_util::sync::CancellationToken::new();
            let proxy = drill::proxy::Proxy::new(cancel.clone());
            proxy.start_link("p", "127.0.0.1:0".parse().unwrap(), "127.0.0.1:9".parse().unwrap()).await.unwrap();
            proxy.start_udp_link("u", "127.0.0.1:0".parse().unwrap(), "127.0.0.1:9".parse().unwrap()).await.unwrap();
            let app = drill::proxy::api::router(proxy);
            let near = format!("{{\"fault\":\"{fault}\",\"direction\":\"{direction}\",\"latency_ms\":{number},\"bytes_per_s\":{number}}}");
            let near_loss = format!("{{\"fault\":\"{fault}\",\"direction\":\"{direction}\",\"loss\":{number}}}");
            let toxic_json = format!("{{\"type\":\"{toxic}\",\"stream\":\"{direction}\",\"toxicity\":{number},\"attributes\":{{\"latency\":{number},\"rate\":{number},\"timeout\":{number},\"bytes\":{number}}}}}");
            for (method, uri, body) in [
                ("PUT", "/links/p/fault", raw.clone()),
                ("PUT", "/links/p/fault", near.clone().into_bytes()),
                ("PUT", "/links/p/fault", near_loss.clone().into_bytes()),
                ("PUT", "/links/u/fault", raw.clone()),
                ("PUT", "/links/u/fault", near.into_bytes()),
                ("PUT", "/links/u/fault", near_loss.into_bytes()),
                ("POST", "/proxies/u/toxics", toxic_json.clone().into_bytes()),
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

/// One step of a PostgreSQL session as the engine's link sees it: a statement carrying record
/// `fuzz/k0/<id>` (Bind, Execute, Sync), or the server's answer to the oldest open one reaching
/// the engine (BindComplete, CommandComplete, ReadyForQuery).
#[derive(Debug, Clone)]
enum PgStep {
    Send(u64),
    Answer,
}

fn pg_typed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases_or(64), ..ProptestConfig::default() })]

    /// The syslog tap, fed octet-counted messages cut anyhow (and between them bytes that
    /// hold no id of this run), notes exactly the ids written: never a prefix of one as an id
    /// of its own, none twice.
    #[test]
    fn the_syslog_tap_notes_exactly_the_ids_written(
        ids in proptest::collection::vec((0u32..1000, any::<u64>()), 0..24),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
        cuts in proptest::collection::vec(any::<usize>(), 0..24),
    ) {
        use drill::proxy::tap::{TapLog, TapMaker};
        let mut wire = Vec::new();
        for (key, seq) in &ids {
            let msg = format!("<13>1 - h drill - - [drill key=\"w\"] {{\"id\":\"{RUN}/k{key}/{seq}\"}}");
            wire.extend(drill::wire::syslog::octet_counted(&msg));
            // Noise that is no id of this run (no `fuzz/` in it).
            wire.extend(noise.iter().map(|b| if b.is_ascii_alphanumeric() { b'.' } else { *b }));
        }
        let maker = drill::dest::syslog::tap::taps(RUN);
        let log = TapLog::default();
        let mut tap = maker.tap();
        for chunk in chunks(&wire, &cuts) {
            tap.left(chunk, &log);
            tap.up(chunk, &log);
        }
        let seen = log.seen();
        let written: std::collections::BTreeSet<(u32, u64)> = ids.iter().copied().collect();
        let of = |v: Vec<drill::proxy::tap::TapId>| v.into_iter().map(|t| (t.key, t.seq)).collect::<std::collections::BTreeSet<_>>();
        prop_assert_eq!(of(seen.left.iter().copied().collect()), written.clone());
        prop_assert_eq!(of(seen.sent.keys().copied().collect()), written);
    }

    /// The PostgreSQL tap, fed a session's steps with each side cut anyhow, counts as
    /// overlapping exactly the records a model says went again while a statement carrying them
    /// was open (answers reach the engine oldest first); garbage on any side never panics it.
    #[test]
    fn the_postgres_tap_finds_exactly_the_overlapping_attempts(
        steps in proptest::collection::vec(prop_oneof![(0u64..6).prop_map(PgStep::Send), Just(PgStep::Answer)], 0..40),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        garbage in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        use drill::proxy::tap::{TapLog, TapMaker};
        let maker = drill::dest::postgres::tap::PostgresTaps { ids: drill::proxy::tap::IdFinder::new(RUN) };
        let log = TapLog::default();
        let mut tap = maker.tap();
        let startup = {
            let body = b"\0\x03\0\0user\0drill\0\0";
            let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
            m.extend_from_slice(body);
            m
        };
        for chunk in chunks(&startup, &cuts) {
            tap.left(chunk, &log);
        }
        tap.delivered(&pg_typed(b'Z', b"I"), &log);
        // The model: statements open oldest first; an answer with none open is not sent.
        let mut open: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
        let mut overlapping: Vec<u64> = Vec::new();
        for step in &steps {
            match step {
                PgStep::Send(id) => {
                    if open.contains(id) && !overlapping.contains(id) {
                        overlapping.push(*id);
                    }
                    open.push_back(*id);
                    let mut m = pg_typed(b'B', format!("\0s\0\0\0\0\x01\0\0\0\x09{RUN}/k0/{id}").as_bytes());
                    m.extend(pg_typed(b'E', b"\0\0\0\0\0"));
                    m.extend(pg_typed(b'S', b""));
                    for chunk in chunks(&m, &cuts) {
                        tap.left(chunk, &log);
                        tap.up(chunk, &log);
                    }
                }
                PgStep::Answer => {
                    if open.pop_front().is_none() {
                        continue;
                    }
                    let mut m = pg_typed(b'2', b"");
                    m.extend(pg_typed(b'C', b"INSERT 0 1\0"));
                    m.extend(pg_typed(b'Z', b"I"));
                    for chunk in chunks(&m, &cuts) {
                        tap.delivered(chunk, &log);
                    }
                }
            }
        }
        let seen: Vec<u64> = log.seen().overlapping.iter().map(|t| t.seq).collect();
        prop_assert_eq!(seen, overlapping);
        // Garbage after it all, on every side, then the end: no panic, nothing left open.
        tap.left(&garbage, &log);
        tap.up(&garbage, &log);
        tap.down(&garbage, &log);
        tap.delivered(&garbage, &log);
        tap.ended(&log);
        prop_assert!(log.seen().open.is_empty());
    }
}
