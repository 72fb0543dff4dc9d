//! Kafka's wire, read once for drill: a frame (a 4-byte big-endian length, then the bytes), a
//! request's header (api key, version, correlation id), the broker addresses in the three
//! answers that carry them (Metadata, FindCoordinator, DescribeCluster, every version, flexible
//! and not), what a Produce answer says of its batches, and an ApiVersions answer without the
//! tagged fields older clients cannot read. The Kafka-aware link
//! (`proxy::kafka`) rewrites addresses with it; the Kafka tap (`dest::kafka::tap`) reads
//! Produce requests and answers with it. A leaf: it knows Kafka's encodings and nothing of a
//! drill.

pub const METADATA: i16 = 3;
pub const FIND_COORDINATOR: i16 = 10;
pub const DESCRIBE_CLUSTER: i16 = 60;

/// A broker address as an answer carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kafka answer (api key {api_key} v{version}): {what} at byte {at}")]
pub struct Malformed {
    pub api_key: i16,
    pub version: i16,
    pub what: &'static str,
    pub at: usize,
}

/// Whether `api_key` at `version` uses the flexible (compact) encoding, body and header alike.
pub fn flexible(api_key: i16, version: i16) -> bool {
    match api_key {
        METADATA => version >= 9,
        FIND_COORDINATOR => version >= 3,
        DESCRIBE_CLUSTER => true,
        _ => false,
    }
}

/// Answers this module rewrites.
pub fn carries_brokers(api_key: i16) -> bool {
    matches!(api_key, METADATA | FIND_COORDINATOR | DESCRIBE_CLUSTER)
}

/// ApiVersions, the first request of every connection.
pub const API_VERSIONS: i16 = 18;

/// Answers the Kafka-aware link holds and may rewrite: those naming brokers, and ApiVersions
/// from version 3 on (flexible), whose trailing tagged fields [`trim_api_versions`] drops.
pub fn rewritten(api_key: i16, version: i16) -> bool {
    carries_brokers(api_key) || (api_key == API_VERSIONS && version >= 3)
}

/// An ApiVersions answer (v3 and later: flexible body, response header v0) without its
/// trailing tagged fields (SupportedFeatures, FinalizedFeatures …), `None` when it has none or
/// reports an error. librdkafka up to 2.0 (Debian bookworm's, under kcat, rsyslog's omkafka
/// and syslog-ng) fails on those tansu sends with "ApiVersionRequest failed: Local: Read
/// underflow"; no client needs them to produce or consume. Every other byte is kept.
pub fn trim_api_versions(version: i16, frame: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
    let mut c = Cursor::new(frame, API_VERSIONS, version);
    c.i32()?; // correlation id (ApiVersions answers keep header v0)
    if c.i16()? != 0 {
        return Ok(None);
    }
    for _ in 0..c.array_len(true)? {
        c.take(6, "truncated api key range")?;
        c.tagged_fields()?;
    }
    c.i32()?; // throttle_time_ms
    let tags_at = c.at;
    c.tagged_fields()?;
    if c.at != frame.len() {
        return Err(c.fail("bytes after the tagged fields"));
    }
    if frame[tags_at] == 0 {
        return Ok(None);
    }
    let mut out = frame[..tags_at].to_vec();
    out.push(0);
    Ok(Some(out))
}

/// A read position in one answer (the frame without its length prefix).
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    api_key: i16,
    version: i16,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`, which belong to `api_key` at `version` (for errors).
    pub(crate) fn new(bytes: &'a [u8], api_key: i16, version: i16) -> Cursor<'a> {
        Cursor {
            bytes,
            at: 0,
            api_key,
            version,
        }
    }

    fn fail(&self, what: &'static str) -> Malformed {
        Malformed {
            api_key: self.api_key,
            version: self.version,
            what,
            at: self.at,
        }
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.fail(what));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(crate) fn i8(&mut self) -> Result<i8, Malformed> {
        Ok(self.take(1, "truncated int8")?[0] as i8)
    }

    pub(crate) fn i16(&mut self) -> Result<i16, Malformed> {
        let b = self.take(2, "truncated int16")?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, Malformed> {
        let b = self.take(4, "truncated int32")?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn uvarint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for shift in (0..35).step_by(7) {
            let b = self.take(1, "truncated varint")?[0];
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail("varint longer than 5 bytes"))
    }

    /// A string's bytes; `None` for a null one.
    pub(crate) fn string(&mut self, flexible: bool) -> Result<Option<&'a str>, Malformed> {
        let len = if flexible {
            match self.uvarint()? {
                0 => return Ok(None),
                n => (n - 1) as usize,
            }
        } else {
            match self.i16()? {
                -1 => return Ok(None),
                n if n < 0 => return Err(self.fail("negative string length")),
                n => n as usize,
            }
        };
        let b = self.take(len, "truncated string")?;
        std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| self.fail("string not UTF-8"))
    }

    pub(crate) fn array_len(&mut self, flexible: bool) -> Result<usize, Malformed> {
        let n = if flexible {
            (self.uvarint()? as i64) - 1
        } else {
            i64::from(self.i32()?)
        };
        // A null array is read as empty; a length longer than the bytes left is malformed.
        let n = n.max(0) as usize;
        if n > self.bytes.len() - self.at {
            return Err(self.fail("array longer than the answer"));
        }
        Ok(n)
    }

    pub(crate) fn tagged_fields(&mut self) -> Result<(), Malformed> {
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.take(size, "truncated tagged field")?;
        }
        Ok(())
    }

    /// One broker's host and port, where they are.
    fn endpoint(&mut self, node_id: i32, flexible: bool) -> Result<Endpoint, Malformed> {
        let start = self.at;
        let host = self
            .string(flexible)?
            .ok_or_else(|| self.fail("null host"))?
            .to_string();
        let port = self.i32()?;
        Ok(Endpoint {
            span: (start, self.at),
            broker: BrokerAddress {
                node_id,
                host,
                port,
            },
        })
    }
}

/// A host and port inside an answer: the bytes `span` encode them.
struct Endpoint {
    span: (usize, usize),
    broker: BrokerAddress,
}

/// Every broker address in one answer (the frame after its length prefix: response header,
/// then body), where it is. Fields after the last address are not read.
fn endpoints(api_key: i16, version: i16, frame: &[u8]) -> Result<Vec<Endpoint>, Malformed> {
    let flex = flexible(api_key, version);
    let mut c = Cursor::new(frame, api_key, version);
    c.i32()?; // correlation id
    if flex {
        c.tagged_fields()?; // response header v1
    }
    let mut found = Vec::new();
    match api_key {
        METADATA => {
            if version >= 3 {
                c.i32()?; // throttle_time_ms
            }
            for _ in 0..c.array_len(flex)? {
                let node = c.i32()?;
                found.push(c.endpoint(node, flex)?);
                if version >= 1 {
                    c.string(flex)?; // rack
                }
                if flex {
                    c.tagged_fields()?;
                }
            }
        }
        FIND_COORDINATOR if version < 4 => {
            if version >= 1 {
                c.i32()?; // throttle_time_ms
            }
            c.i16()?; // error_code
            if version >= 1 {
                c.string(flex)?; // error_message
            }
            let node = c.i32()?;
            found.push(c.endpoint(node, flex)?);
        }
        FIND_COORDINATOR => {
            c.i32()?; // throttle_time_ms
            for _ in 0..c.array_len(true)? {
                c.string(true)?; // key
                let node = c.i32()?;
                found.push(c.endpoint(node, true)?);
                c.i16()?; // error_code
                c.string(true)?; // error_message
                c.tagged_fields()?;
            }
        }
        DESCRIBE_CLUSTER => {
            c.i32()?; // throttle_time_ms
            c.i16()?; // error_code
            c.string(true)?; // error_message
            if version >= 1 {
                c.i8()?; // endpoint_type
            }
            c.string(true)?; // cluster_id
            c.i32()?; // controller_id
            for _ in 0..c.array_len(true)? {
                let node = c.i32()?;
                found.push(c.endpoint(node, true)?);
                c.string(true)?; // rack
                if version >= 2 {
                    c.i8()?; // is_fenced
                }
                c.tagged_fields()?;
            }
        }
        _ => {}
    }
    Ok(found)
}

/// The broker addresses one answer carries, each with the bytes that encode its host and port.
pub fn located(
    api_key: i16,
    version: i16,
    frame: &[u8],
) -> Result<Vec<(BrokerAddress, std::ops::Range<usize>)>, Malformed> {
    Ok(endpoints(api_key, version, frame)?
        .into_iter()
        .map(|e| (e.broker, e.span.0..e.span.1))
        .collect())
}

/// The broker addresses one answer carries.
pub fn brokers(api_key: i16, version: i16, frame: &[u8]) -> Result<Vec<BrokerAddress>, Malformed> {
    Ok(endpoints(api_key, version, frame)?
        .into_iter()
        .map(|e| e.broker)
        .collect())
}

/// `frame` with every broker address `to` gives a new (host, port) for replaced; every other
/// byte as it was. A coordinator-not-available answer (node -1, empty host) is left alone.
pub fn rewrite(
    api_key: i16,
    version: i16,
    frame: &[u8],
    mut to: impl FnMut(&BrokerAddress) -> Option<(String, i32)>,
) -> Result<Vec<u8>, Malformed> {
    let flex = flexible(api_key, version);
    let mut out = Vec::with_capacity(frame.len() + 64);
    let mut copied = 0;
    for e in endpoints(api_key, version, frame)? {
        if e.broker.node_id < 0 || e.broker.host.is_empty() {
            continue;
        }
        let Some((host, port)) = to(&e.broker) else {
            continue;
        };
        out.extend_from_slice(&frame[copied..e.span.0]);
        if flex {
            put_uvarint(&mut out, host.len() as u64 + 1);
        } else {
            out.extend_from_slice(&(host.len() as i16).to_be_bytes());
        }
        out.extend_from_slice(host.as_bytes());
        out.extend_from_slice(&port.to_be_bytes());
        copied = e.span.1;
    }
    out.extend_from_slice(&frame[copied..]);
    Ok(out)
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Produce, the request that carries records.
pub const PRODUCE: i16 = 0;

/// The length of the frame at the start of `b`, its 4-byte prefix included (`None`: fewer than
/// 4 bytes so far). A negative length reads as an empty frame, so the stream moves on.
pub fn frame_len(b: &[u8]) -> Option<usize> {
    let n = i32::from_be_bytes(b.get(..4)?.try_into().ok()?);
    Some(4 + usize::try_from(n).unwrap_or(0))
}

/// A request's header: the api key, its version and the correlation id its answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub version: i16,
    pub correlation: i32,
}

/// The header of a request (the frame after its length prefix).
pub fn request_header(request: &[u8]) -> Result<RequestHeader, Malformed> {
    let mut c = Cursor::new(request, -1, -1);
    Ok(RequestHeader {
        api_key: c.i16()?,
        version: c.i16()?,
        correlation: c.i32()?,
    })
}

/// An answer's correlation id (the frame after its length prefix).
pub fn correlation(answer: &[u8]) -> Result<i32, Malformed> {
    Cursor::new(answer, -1, -1).i32()
}

/// Whether a Produce answer (the frame after its length prefix) at the request's `version` says
/// every partition stored its batch: false when one names an error or none is named.
pub fn produce_stored(answer: &[u8], version: i16) -> Result<bool, Malformed> {
    let flexible = version >= 9;
    let mut c = Cursor::new(answer, PRODUCE, version);
    c.i32()?; // correlation id
    if flexible {
        c.tagged_fields()?;
    }
    let mut any = false;
    for _ in 0..c.array_len(flexible)? {
        c.string(flexible)?; // topic
        for _ in 0..c.array_len(flexible)? {
            c.i32()?; // partition index
            if c.i16()? != 0 {
                return Ok(false);
            }
            any = true;
            c.take(8, "truncated base offset")?;
            if version >= 2 {
                c.take(8, "truncated log append time")?;
            }
            if version >= 5 {
                c.take(8, "truncated log start offset")?;
            }
            if version >= 8 {
                for _ in 0..c.array_len(flexible)? {
                    c.i32()?; // batch index
                    c.string(flexible)?; // record error message
                    if flexible {
                        c.tagged_fields()?;
                    }
                }
                c.string(flexible)?; // error message
            }
            if flexible {
                c.tagged_fields()?;
            }
        }
        if flexible {
            c.tagged_fields()?;
        }
    }
    Ok(any)
}

#[cfg(test)]
pub(crate) mod test_frames {
    use super::put_uvarint;

    fn string(out: &mut Vec<u8>, s: &str, flex: bool) {
        if flex {
            put_uvarint(out, s.len() as u64 + 1);
        } else {
            out.extend_from_slice(&(s.len() as i16).to_be_bytes());
        }
        out.extend_from_slice(s.as_bytes());
    }

    /// A Metadata answer with two brokers and one topic, as a broker would encode it.
    pub(crate) fn metadata(version: i16) -> Vec<u8> {
        let flex = version >= 9;
        let mut f = 77i32.to_be_bytes().to_vec();
        if flex {
            f.push(0);
        }
        if version >= 3 {
            f.extend_from_slice(&0i32.to_be_bytes());
        }
        if flex {
            put_uvarint(&mut f, 3);
        } else {
            f.extend_from_slice(&2i32.to_be_bytes());
        }
        for (node, host, port) in [
            (1i32, "broker-one.example", 9092i32),
            (2, "10.0.0.2", 19092),
        ] {
            f.extend_from_slice(&node.to_be_bytes());
            string(&mut f, host, flex);
            f.extend_from_slice(&port.to_be_bytes());
            if version >= 1 {
                if flex {
                    f.push(0); // null rack
                    // one tagged field, kept as is
                    f.extend_from_slice(&[1, 5, 2, 0xAB, 0xCD]);
                } else {
                    f.extend_from_slice(&(-1i16).to_be_bytes());
                }
            }
        }
        f.extend_from_slice(b"...the rest: cluster id, controller, topics...");
        f
    }
}

#[cfg(test)]
mod tests {
    use super::test_frames::metadata;
    use super::*;

    #[test]
    fn metadata_in_every_version_rewrites_only_the_addresses() {
        for version in 0..=13 {
            let frame = metadata(version);
            let found = brokers(METADATA, version, &frame).unwrap();
            assert_eq!(found.len(), 2, "v{version}");
            assert_eq!(found[0].host, "broker-one.example");
            assert_eq!(found[1].port, 19092);
            let new = rewrite(METADATA, version, &frame, |b| {
                Some(("127.0.0.1".into(), 40000 + b.node_id))
            })
            .unwrap();
            let after = brokers(METADATA, version, &new).unwrap();
            assert_eq!(after[0].host, "127.0.0.1");
            assert_eq!(after[1].port, 40002);
            assert_eq!(after[1].node_id, 2);
            assert!(new.ends_with(b"...the rest: cluster id, controller, topics..."));
            // The same addresses back give the original bytes.
            let back = rewrite(METADATA, version, &new, |b| {
                Some((
                    found[(b.node_id - 1) as usize].host.clone(),
                    found[(b.node_id - 1) as usize].port,
                ))
            })
            .unwrap();
            assert_eq!(back, frame, "v{version}");
        }
    }

    /// An ApiVersions v3 answer: two api key ranges (the second with a tagged field of its
    /// own, kept), then `tags` as the answer's trailing tagged fields.
    fn api_versions(error: i16, tags: &[u8]) -> Vec<u8> {
        let mut f = 5i32.to_be_bytes().to_vec();
        f.extend_from_slice(&error.to_be_bytes());
        f.push(3);
        f.extend_from_slice(&[0, 0, 0, 0, 0, 9, 0]);
        f.extend_from_slice(&[0, 18, 0, 0, 0, 3, 1, 7, 1, 0xEE]);
        f.extend_from_slice(&0i32.to_be_bytes());
        f.extend_from_slice(tags);
        f
    }

    #[test]
    fn an_api_versions_answer_loses_its_trailing_tagged_fields_and_nothing_else() {
        // Four tagged fields as tansu sends them (SupportedFeatures … ZkMigrationReady).
        let tags = [4, 0, 1, 1, 1, 1, 0, 2, 1, 1, 3, 1, 0];
        let frame = api_versions(0, &tags);
        let trimmed = trim_api_versions(3, &frame).unwrap().unwrap();
        assert_eq!(trimmed, api_versions(0, &[0]));
        // None to drop, an error answer, or bytes it cannot read: left alone.
        assert_eq!(trim_api_versions(3, &trimmed).unwrap(), None);
        assert_eq!(
            trim_api_versions(3, &api_versions(35, &tags)).unwrap(),
            None
        );
        for cut in 4..frame.len() {
            assert!(trim_api_versions(3, &frame[..cut]).is_err(), "cut at {cut}");
        }
        assert!(rewritten(API_VERSIONS, 3) && !rewritten(API_VERSIONS, 2));
    }

    #[test]
    fn a_truncated_answer_is_malformed_not_a_panic() {
        let frame = metadata(9);
        for cut in 0..40 {
            let _ = brokers(METADATA, 9, &frame[..cut]);
        }
        assert!(brokers(METADATA, 9, &frame[..20]).is_err());
    }
}
