//! The syslog read-back: the file the receiving side writes every message to, one per line,
//! followed from its first byte (so from before the first record). Each whole line is one
//! copy; ids are found anywhere in it, the write key in its `[drill key="…"]` element. A file
//! that cannot be read, or that shrinks (rotated or truncated under the reader), may have lost
//! copies: a verifier fault, never engine loss.

use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::wire::syslog::{SD_ID, SD_PARAM, sd_param};
use crate::dest::ReadBack;
use crate::verify::{Decoder, Received, WriteKeyPlace};

/// The place of the built-in engine's write key: the `drill` SD element's `key` (see
/// [`super::sd_place`]: the SD-ID and the parameter, a space between).
pub fn builtin_place() -> WriteKeyPlace {
    super::sd_place(SD_ID, SD_PARAM)
}

/// How often the file is looked at for new lines.
const POLL: Duration = Duration::from_millis(20);

/// The decoder for drill's own engine: the key where [`crate::wire::syslog::rfc5424`] puts it.
pub fn builtin_decoder() -> Decoder {
    Decoder::builtin(builtin_place())
}

/// Follows one file.
pub struct Reader {
    received: Arc<Mutex<Received>>,
    follower: Arc<Mutex<Follower>>,
    task: tokio::task::JoinHandle<()>,
}

/// Where the reading got to.
struct Follower {
    file: PathBuf,
    offset: u64,
    /// Bytes after the last newline: a line not yet whole.
    partial: Vec<u8>,
    decoder: Decoder,
    t0: Instant,
    /// Lines start with the receiver's own reception time (drill's rsyslog): arrivals are
    /// timed by it, relative to the drill's start as wall time. `None`: by when they were read.
    stamped: Option<SystemTime>,
}

impl Follower {
    /// Reads what was added since the last call. `Err` is a verifier fault.
    fn read_new(&mut self, into: &mut Received) -> Result<(), String> {
        let mut file = match std::fs::File::open(&self.file) {
            Ok(f) => f,
            // Not there yet: the receiver creates it with the first message.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.offset == 0 => {
                return Ok(());
            }
            Err(e) => return Err(format!("{}: {e}", self.file.display())),
        };
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len < self.offset {
            return Err(format!(
                "{} shrank from {} to {len} bytes while it was read: copies may be missing",
                self.file.display(),
                self.offset
            ));
        }
        if len == self.offset {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.offset))
            .map_err(|e| e.to_string())?;
        let mut added = Vec::new();
        file.take(len - self.offset)
            .read_to_end(&mut added)
            .map_err(|e| e.to_string())?;
        self.offset += added.len() as u64;
        self.partial.extend_from_slice(&added);
        let at = self.t0.elapsed();
        let whole = match self.partial.iter().rposition(|&b| b == b'\n') {
            Some(end) => self.partial.drain(..=end).collect::<Vec<u8>>(),
            None => return Ok(()),
        };
        for line in whole.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let (line, at) = match self.stamped {
                Some(t0_wall) => stamped(line, t0_wall, at),
                None => (line, at),
            };
            let text = String::from_utf8_lossy(line);
            let meta = |place: &str| {
                let (id, param) = place.split_once(' ')?;
                sd_param(&text, id, param)
            };
            self.decoder.add(line, meta, at, into);
        }
        Ok(())
    }
}

/// A line led by its reception time: the message after it, and that time relative to
/// `t0_wall` (the read time `read_at` when the stamp is earlier than the drill's start); a line
/// without a readable stamp whole, at `read_at`.
fn stamped(line: &[u8], t0_wall: SystemTime, read_at: Duration) -> (&[u8], Duration) {
    let Some(space) = line.iter().position(|&b| b == b' ') else {
        return (line, read_at);
    };
    let Some(stamp) = std::str::from_utf8(&line[..space]).ok().and_then(rfc3339) else {
        return (line, read_at);
    };
    let at = stamp.duration_since(t0_wall).unwrap_or(read_at);
    (&line[space + 1..], at)
}

/// An RFC 3339 timestamp as rsyslog writes it (`2026-12-03T06:55:01.123456+00:00`, or with
/// `Z`), as wall time; `None` when it is not one.
pub fn rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| text.get(from..to)?.parse::<i64>().ok();
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let mut rest = &text[19..];
    let mut micros = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        let kept: String = fraction[..digits]
            .chars()
            .chain("000000".chars())
            .take(6)
            .collect();
        micros = kept.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest[1..].split_once(':')?;
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros as u64))
}

impl Reader {
    /// Starts following `file` (it may not exist yet) from its first byte, recording arrivals
    /// relative to `t0`: the file of a receiver drill started for this drill.
    pub fn start(
        file: PathBuf,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Reader {
        Reader::start_at(file, 0, decoder, t0, None, cancel)
    }

    /// [`Reader::start`] for a file whose lines start with the receiver's reception time
    /// (drill's own rsyslog): arrivals are timed by it, relative to `t0_wall`.
    pub fn start_stamped(
        file: PathBuf,
        decoder: Decoder,
        (t0, t0_wall): (Instant, SystemTime),
        cancel: CancellationToken,
    ) -> Reader {
        Reader::start_at(file, 0, decoder, t0, Some(t0_wall), cancel)
    }

    /// Starts following the file of a receiver the user runs from where it ends now: what it
    /// held before is not the drill's. `Err` when it cannot be read (the drill cannot start).
    pub fn from_end(
        file: PathBuf,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
    ) -> Result<Reader, String> {
        let len = std::fs::metadata(&file)
            .map_err(|e| {
                format!(
                    "{} (destination.read_back.file): {e}; give a file the receiver writes every message to, readable by drill",
                    file.display()
                )
            })?
            .len();
        let mut head = [0u8; 1];
        std::fs::File::open(&file)
            .and_then(|mut f| f.read(&mut head))
            .map_err(|e| format!("{} (destination.read_back.file): {e}", file.display()))?;
        Ok(Reader::start_at(file, len, decoder, t0, None, cancel))
    }

    fn start_at(
        file: PathBuf,
        offset: u64,
        decoder: Decoder,
        t0: Instant,
        stamped: Option<SystemTime>,
        cancel: CancellationToken,
    ) -> Reader {
        let received = Arc::new(Mutex::new(Received::default()));
        let follower = Arc::new(Mutex::new(Follower {
            file,
            offset,
            partial: Vec::new(),
            decoder,
            t0,
            stamped,
        }));
        let (sink, follow) = (received.clone(), follower.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = cancel.cancelled() => return,
                }
                let (Ok(mut f), Ok(mut r)) = (follow.lock(), sink.lock()) else {
                    return;
                };
                if let Err(fault) = f.read_new(&mut r) {
                    r.verifier_fault = Some(fault);
                    return;
                }
            }
        });
        Reader {
            received,
            follower,
            task,
        }
    }

    /// Stops following and reads what the file holds now.
    pub async fn stop(self) -> Received {
        self.task.abort();
        let _ = self.task.await;
        let mut received =
            std::mem::take(&mut *self.received.lock().unwrap_or_else(|e| e.into_inner()));
        if received.verifier_fault.is_none()
            && let Ok(mut f) = self.follower.lock()
            && let Err(fault) = f.read_new(&mut received)
        {
            received.verifier_fault = Some(fault);
        }
        received
    }
}

/// The file is the destination: its address does not matter to the reader.
impl ReadBack for Reader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        let lines = self.received.lock().map(|r| r.arrivals.len());
        futures::future::ready(lines.ok()).boxed()
    }

    fn finish(self: Box<Self>, _: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        Box::pin(self.stop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::syslog::rfc5424;
    use std::io::Write;

    fn line(run: &str, seq: u64) -> String {
        rfc5424(
            "2026-12-02T15:00:00Z",
            "h",
            Some(&format!("{run}/k0/{seq}#1")),
            &format!("record {run}/k0/{seq}"),
        )
    }

    #[test]
    fn rsyslog_timestamps_read_as_wall_time() {
        let at = |t: &str| rfc3339(t).map(|s| s.duration_since(UNIX_EPOCH).unwrap().as_micros());
        assert_eq!(at("1970-01-01T00:00:01Z"), Some(1_000_000));
        assert_eq!(
            at("2026-12-03T06:55:01.123456+00:00"),
            Some(1_796_280_901_123_456)
        );
        // The same instant written in another zone, and with fewer digits.
        assert_eq!(
            at("2026-12-03T07:55:01.1234+01:00"),
            Some(1_796_280_901_123_400)
        );
        assert_eq!(at("2026-12-03 06:55:01"), None);
        assert_eq!(at("<13>1 - drill"), None);
        // A stamped line: the message after the stamp, timed by it.
        let t0 = rfc3339("2026-12-03T06:55:00Z").unwrap();
        let (rest, when) = stamped(
            b"2026-12-03T06:55:01.500000+00:00 <13>1 - x",
            t0,
            Duration::ZERO,
        );
        assert_eq!(
            (rest, when),
            (&b"<13>1 - x"[..], Duration::from_millis(1500))
        );
        let (rest, when) = stamped(b"unstamped line", t0, Duration::from_secs(9));
        assert_eq!(
            (rest, when),
            (&b"unstamped line"[..], Duration::from_secs(9))
        );
    }

    /// Lines written in pieces, before and after the reader starts, are each read once, whole,
    /// with their keys; a file truncated under the reader is a verifier fault.
    #[tokio::test]
    async fn follows_the_file_line_by_line_and_reports_a_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("received.log");
        let decoder = Decoder::new("r", Some(builtin_place()));
        let reader = Reader::start(
            path.clone(),
            decoder,
            Instant::now(),
            CancellationToken::new(),
        );
        tokio::time::sleep(POLL * 3).await;
        let mut f = std::fs::File::create(&path).unwrap();
        let first = format!("{}\n{}", line("r", 1), line("r", 2));
        let (a, b) = first.split_at(30);
        f.write_all(a.as_bytes()).unwrap();
        f.flush().unwrap();
        tokio::time::sleep(POLL * 3).await;
        f.write_all(b.as_bytes()).unwrap();
        f.write_all(b"\n").unwrap();
        f.flush().unwrap();
        let received = reader.stop().await;
        assert_eq!(received.verifier_fault, None);
        let keys: Vec<_> = received
            .arrivals
            .iter()
            .map(|a| a.write_key.clone().unwrap_or_default())
            .collect();
        assert_eq!(keys, ["r/k0/1#1", "r/k0/2#1"]);
        let ids: Vec<_> = received.arrivals.iter().map(|a| a.id.clone()).collect();
        assert_eq!(
            ids,
            [Some("r/k0/1".to_string()), Some("r/k0/2".to_string())]
        );

        let reader = Reader::start(
            path.clone(),
            builtin_decoder(),
            Instant::now(),
            CancellationToken::new(),
        );
        tokio::time::sleep(POLL * 5).await;
        std::fs::write(&path, "short\n").unwrap();
        tokio::time::sleep(POLL * 5).await;
        let received = reader.stop().await;
        assert!(
            received
                .verifier_fault
                .as_deref()
                .is_some_and(|f| f.contains("shrank")),
            "{:?}",
            received.verifier_fault
        );
    }
}
