//! The MQTT tap: which records went up in a PUBLISH, and which the broker's PUBACK confirmed.
//!
//! Upstream, every PUBLISH's ids are read from its body (topic, properties and payload alike:
//! a harness id only ever sits in the payload) and, at QoS 1 or 2, kept under its packet id.
//! Downstream, a PUBACK (MQTT 3.1.1: the packet id alone; MQTT 5: a reason code below 0x80, or
//! none) confirms them. Both versions read alike, so the tap needs no CONNECT.

use crate::proxy::tap::{FramedTaps, Framing, IdFinder, TapId, Write};

/// MQTT's PUBLISH and PUBACK, as a framed tap reads them.
pub struct MqttPublish;

/// Makes MQTT taps that find ids of one run.
pub type MqttTaps = FramedTaps<MqttPublish>;

impl Framing for MqttPublish {
    const PROTOCOL: &'static str = "MQTT PUBLISH/PUBACK";
    /// The packet id.
    type Key = u16;
    type Note = ();

    fn frame_len(b: &[u8]) -> Option<usize> {
        packet_len(b)
    }

    fn write(packet: &[u8], ids: &IdFinder) -> Option<Write<u16, ()>> {
        let (pkid, ids) = publish(packet, ids)?;
        Some(Write {
            ids,
            awaits: pkid.map(|pkid| (pkid, ())),
        })
    }

    fn answers(packet: &[u8]) -> Option<u16> {
        if packet[0] >> 4 != 4 {
            return None;
        }
        let id = body(packet).get(..2)?;
        Some(u16::from_be_bytes([id[0], id[1]]))
    }

    /// MQTT 3.1.1's PUBACK is the packet id alone; MQTT 5's may add a reason code, below 0x80
    /// for success.
    fn stored(packet: &[u8], _: &()) -> bool {
        body(packet).get(2).copied().unwrap_or(0) < 0x80
    }
}

/// The length of the MQTT packet at the start of `b`: the fixed header (type byte, remaining
/// length as a variable byte integer of 1 to 4 bytes) and the rest.
fn packet_len(b: &[u8]) -> Option<usize> {
    let mut len = 0usize;
    for i in 0..4 {
        let byte = *b.get(1 + i)?;
        len |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(1 + i + 1 + len);
        }
    }
    // A fifth length byte is no MQTT: treat as one byte, so the stream moves on.
    Some(1)
}

/// Where the body (after the fixed header) of a whole packet starts.
fn body(packet: &[u8]) -> &[u8] {
    let header = packet
        .iter()
        .skip(1)
        .take(4)
        .position(|b| b & 0x80 == 0)
        .map_or(packet.len(), |i| 2 + i);
    packet.get(header..).unwrap_or_default()
}

/// A PUBLISH's ids, and its packet id at QoS 1 or 2 (`None`: no PUBLISH).
fn publish(packet: &[u8], ids: &IdFinder) -> Option<(Option<u16>, Vec<TapId>)> {
    if packet[0] >> 4 != 3 {
        return None;
    }
    let qos = (packet[0] >> 1) & 3;
    let body = body(packet);
    let found = ids.ids(body);
    let pkid = (qos > 0)
        .then(|| {
            let topic = body
                .get(..2)
                .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
            body.get(2 + topic..4 + topic)
                .map(|id| u16::from_be_bytes([id[0], id[1]]))
        })
        .flatten();
    Some((pkid, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::tap::{TapLog, TapMaker};
    use crate::wire::mqtt::{Packet, PubAck, PubAckReason, publish_with_key};
    use bytes::BytesMut;
    use tokio_util::codec::Encoder;

    fn encode(p: Packet) -> Vec<u8> {
        let mut out = BytesMut::new();
        crate::wire::mqtt::DrillCodec.encode(p, &mut out).unwrap();
        out.to_vec()
    }

    #[test]
    fn publishes_go_up_and_pubacks_confirm_them_however_the_stream_is_cut() {
        let payload = |id: &str| bytes::Bytes::from(format!("{{\"id\":\"{id}\"}}"));
        let mut up = encode(publish_with_key("t", 1, payload("r/k0/0"), "w-1"));
        up.extend(encode(publish_with_key("t", 2, payload("r/k0/1"), "w-2")));
        let ack = |pkid, reason| {
            encode(Packet::PubAck(PubAck {
                pkid,
                reason,
                properties: None,
            }))
        };
        let mut down = ack(1, PubAckReason::Success);
        down.extend(ack(2, PubAckReason::QuotaExceeded));
        for cut in [1, 3, 7, up.len() / 2] {
            let maker = MqttTaps::new(IdFinder::new("r"));
            let log = TapLog::default();
            let mut tap = maker.tap();
            let (a, b) = up.split_at(cut.min(up.len()));
            tap.left(a, &log);
            tap.left(b, &log);
            tap.up(a, &log);
            tap.up(b, &log);
            let (a, b) = down.split_at(cut.min(down.len()));
            tap.down(a, &log);
            tap.down(b, &log);
            let seen = log.seen();
            assert_eq!(seen.sent.len(), 2, "cut at {cut}");
            assert_eq!(seen.left.len(), 2, "cut at {cut}");
            assert!(
                seen.acked.contains(&TapId { key: 0, seq: 0 }),
                "cut at {cut}"
            );
            assert!(
                !seen.acked.contains(&TapId { key: 0, seq: 1 }),
                "a refusal confirms nothing"
            );
            assert_eq!((seen.frames, seen.unreadable), (2, 0));
        }
    }
}
