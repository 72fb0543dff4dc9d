//! The engine's durable record log, in segments, and the outputs' delivery marks.
//!
//! # On-disk layout (one data directory per engine)
//!
//! - `engine.id` — the engine's identity, minted once when the directory is first used. Write
//!   keys are `<engine id>-<sequence>`, so a key is never reused, even if the directory is
//!   wiped and the sequence starts again.
//! - `records-<first sequence, 20 digits>.log` — the segments. Each holds append-only frames,
//!   one per accepted record: `[len: u32 LE][crc32 of body: u32 LE][body: len bytes]`, body =
//!   `[seq: u64 LE][flags: u8][the ingested line, as is]`; flag bit 0 marks the last frame of a
//!   batch (one group commit). The write key is not stored per frame: it is `<engine id>-<seq>`,
//!   so `engine.id` is part of the data (17 bytes per record saved, about 8% of the bytes
//!   written for 200-byte records). Sequences are dense: they start
//!   at 0 and increase by one per frame, across segments. The newest segment is the *active*
//!   one; a new segment starts (named after the next sequence) when a batch would be appended
//!   to an active segment already `segment_bytes` long, so a batch never spans two segments.
//!   (Binary, not JSON: the ingested line is itself JSON, and escaping it cost a third of the
//!   write bandwidth at large batches — `drill bench engine`.)
//! - `delivered-<output>-<segment's first sequence>.log` — one `u64 LE` sequence per record of
//!   that segment the output saw confirmed. Marks live and die with their segment.
//!
//! # Invariants
//!
//! - A batch is acknowledged to its source only after its frames are written and
//!   `fdatasync` returned (group commit: every batch waiting at that moment shares one sync).
//!   A new segment's directory entry is synced before the batch that opens it is acknowledged
//!   (a power cut may forget a name whose directory was not fsynced: `dirents: posix`); so
//!   is a new marks file's with the marks, and the journal's files' when they are made.
//! - Whole segments are deleted, oldest first, once every output is past them: each output
//!   publishes the sequence below which it has settled everything (delivered, or set aside in
//!   its failed messages, which keep their own copy), and a segment goes when its last sequence
//!   is below all of them. The active segment is never deleted, so the next sequence survives
//!   even when everything was delivered. The segment file goes first, then its marks: a crash
//!   between the two leaves marks of a missing segment, deleted on the next open.
//! - A batch is all or nothing. Recovery reads every frame; the last batch of the active segment
//!   is kept only if its `end` frame was read and no frame of it is damaged; anything after is
//!   a torn tail, truncated and reported in bytes. Only a never-acknowledged batch can be torn
//!   (acknowledged ones were synced before their answer left), and none of its records survives
//!   half-way: a source that sends the batch again never creates a copy under a second write
//!   key. (The model test in this module found the half-way case.)
//! - Damage *inside* the log (bit rot in an acknowledged frame: a frame that fails its checksum
//!   with intact frames after it, or anywhere in a closed segment) is not a torn tail: recovery
//!   skips past it to the next frame that checks out, keeps every intact record on both sides,
//!   and reports the damage and exactly which sequences were lost (sequences are dense, so a
//!   gap is a loss). The one case that cannot be told apart from a torn write is damage in the
//!   active segment's last batch; it is treated as torn.
//! - A delivery mark is written when its confirmation arrives and synced lazily: a killed
//!   process keeps it (page cache), a power cut may not. A lost mark means the record is sent
//!   again after restart with the same write key — allowed by `at_least_once`, never a loss.
//!
//! # Reading
//!
//! The log is the only copy of a held record: nothing of the backlog is kept in memory.
//! [`RecordLog::recover`] checks every segment on open (one at a time) and returns no records;
//! each output reads its backlog with its own [`LogReader`], oldest first, a bounded chunk at a
//! time and only below the sequence the writer has committed (synced and acknowledged), so a
//! reader never sees a batch still being written. A reader keeps its place between reads; a
//! segment it is reading cannot be deleted under it (an output's settled mark stays at or
//! below its cursor).

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::seqset::SeqSet;

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

const HEADER: usize = 8;
/// A frame larger than this is treated as garbage (a torn length field), not allocated.
const MAX_FRAME: u32 = 64 * 1024 * 1024;
/// Default segment size: large enough that rolling is rare, small enough that a delivered
/// backlog gives its space back soon.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// One accepted record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub seq: u64,
    pub key: String,
    pub data: String,
    /// The first sequence of the segment that holds it (names its delivery-mark file).
    pub segment: u64,
}

const END_OF_BATCH: u8 = 1;

/// Appends one frame body: `[seq][flags][data]`.
fn encode(buf: &mut Vec<u8>, seq: u64, data: &[u8], end: bool) {
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.push(if end { END_OF_BATCH } else { 0 });
    buf.extend_from_slice(data);
}

/// A record's write key: the engine's identity and the record's sequence.
fn write_key(prefix: &str, seq: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let number = digits.format(seq);
    let mut key = String::with_capacity(prefix.len() + number.len());
    key.push_str(prefix);
    key.push_str(number);
    key
}

/// Where a segment's frames belong: its first sequence, and the write-key prefix.
#[derive(Clone, Copy)]
struct Origin<'a> {
    segment: u64,
    key_prefix: &'a str,
}

/// One intact frame, seen in place: its sequence, whether it ends a batch, its size, and where
/// its data lies in the bytes it was read from. Nothing is copied.
#[derive(Debug, Clone, Copy)]
struct FrameView {
    seq: u64,
    end: bool,
    size: usize,
    data: (usize, usize),
}

/// What lies at `at`: an intact frame, too few bytes to tell, or no frame.
enum AtOffset {
    Frame(FrameView),
    /// The bytes end inside the header or body of what may be a frame (`need` bytes from `at`).
    Short {
        need: usize,
    },
    Bad,
}

fn look_at(bytes: &[u8], at: usize) -> AtOffset {
    let Some(header) = bytes.get(at..at + HEADER) else {
        return AtOffset::Short { need: HEADER };
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_FRAME || (len as usize) < 9 {
        return AtOffset::Bad;
    }
    let Some(body) = bytes.get(at + HEADER..at + HEADER + len as usize) else {
        return AtOffset::Short {
            need: HEADER + len as usize,
        };
    };
    #[cfg(feature = "mutants")]
    let crc = if mutant::is(Mutant::TrustTornTail) {
        // MUTANT: a frame whose header and length are there is taken as written: a torn
        // tail's zeros pass for data (docs/src/design.md#1-engine-rules: nothing delivered but
        // what was accepted).
        crc32fast::hash(body)
    } else {
        crc
    };
    if crc32fast::hash(body) != crc || std::str::from_utf8(&body[9..]).is_err() {
        return AtOffset::Bad;
    }
    let seq = u64::from_le_bytes(body[0..8].try_into().unwrap_or([0; 8]));
    AtOffset::Frame(FrameView {
        seq,
        end: body[8] & END_OF_BATCH != 0,
        size: HEADER + len as usize,
        data: (at + HEADER + 9, at + HEADER + len as usize),
    })
}

/// The intact frame at `at`, if there is one.
fn frame_at(bytes: &[u8], at: usize) -> Option<FrameView> {
    match look_at(bytes, at) {
        AtOffset::Frame(f) => Some(f),
        _ => None,
    }
}

impl FrameView {
    /// The record this frame holds, copied out of `bytes`.
    fn record(&self, bytes: &[u8], origin: Origin) -> StoredRecord {
        StoredRecord {
            seq: self.seq,
            key: write_key(origin.key_prefix, self.seq),
            data: String::from_utf8_lossy(&bytes[self.data.0..self.data.1]).into_owned(),
            segment: origin.segment,
        }
    }
}

/// What a segment's bytes turned out to be, in file order.
#[derive(Debug)]
enum Piece {
    Frame {
        at: usize,
        seq: u64,
        end: bool,
    },
    /// Bytes that are no intact frame, up to the next one that is (or the end of the file).
    Gap {
        at: usize,
        len: usize,
    },
}

/// Splits a segment into intact frames and gaps. After a bad frame it looks for the next
/// offset where an intact frame with a higher sequence starts (resync).
fn pieces(bytes: &[u8]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut last: Option<u64> = None;
    let fits = |last: Option<u64>, f: &FrameView| last.is_none_or(|l| f.seq > l);
    while at < bytes.len() {
        if let Some(f) = frame_at(bytes, at).filter(|f| fits(last, f)) {
            last = Some(f.seq);
            out.push(Piece::Frame {
                at,
                seq: f.seq,
                end: f.end,
            });
            at += f.size;
            continue;
        }
        let next =
            (at + 1..bytes.len()).find(|&q| frame_at(bytes, q).is_some_and(|f| fits(last, &f)));
        let to = next.unwrap_or(bytes.len());
        out.push(Piece::Gap { at, len: to - at });
        at = to;
    }
    out
}

/// Bytes of a segment that recovery could not read although they were acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub segment: PathBuf,
    pub offset: u64,
    pub bytes: u64,
}

/// What recovery found when the log was opened.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub records: u64,
    pub segments: usize,
    /// Never-acknowledged bytes cut off the active segment's end.
    pub torn_bytes: u64,
    /// Unreadable acknowledged bytes, and the sequences they held.
    pub damage: Vec<Damage>,
    pub lost: Vec<RangeInclusive<u64>>,
}

impl Recovery {
    pub fn lost_records(&self) -> u64 {
        self.lost.iter().map(|r| r.end() - r.start() + 1).sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("records-{first:020}.log"))
}

fn marks_path(dir: &Path, output: &str, segment: u64) -> PathBuf {
    dir.join(format!("delivered-{output}-{segment:020}.log"))
}

/// The number in `<prefix><20 digits>.log`.
fn numbered(name: &str, prefix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(".log")?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

/// The segments in `dir`, oldest first.
fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let mut firsts: Vec<u64> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| numbered(e.file_name().to_str()?, "records-"))
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

/// A new segment's directory entry made durable (the `no-dir-fsync` mutant leaves it out).
fn sync_new_segment(dir: &Path) -> Result<(), LogError> {
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::NoDirFsync) {
        // MUTANT: the segment's data will be fdatasynced, its name never: a power cut that
        // forgets the entry takes every batch acknowledged in it.
        return Ok(());
    }
    sync_dir(dir)
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// The append side of the record log. Owned by one writer thread.
pub struct RecordLog {
    dir: PathBuf,
    /// First sequences of the closed segments, oldest first.
    closed: VecDeque<u64>,
    active_first: u64,
    active_path: PathBuf,
    file: File,
    /// `<engine id>-`: every write key starts with it.
    key_prefix: String,
    next_seq: u64,
    /// The frames of the batch being appended; kept between batches, so a large batch does
    /// not map and fault in fresh pages every time.
    buf: Vec<u8>,
    /// Length of the active segment up to the last synced frame.
    synced_len: u64,
    segment_bytes: u64,
}

/// In the active segment, the last batch stays only if whole and undamaged: how many of its
/// pieces to keep.
fn whole_batches(all: &[Piece]) -> usize {
    let ends: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, Piece::Frame { end: true, .. }))
        .map(|(i, _)| i)
        .collect();
    match ends.last() {
        None => 0,
        Some(&last) => {
            let start = ends.len().checked_sub(2).map_or(0, |j| ends[j] + 1);
            if all[start..=last]
                .iter()
                .any(|p| matches!(p, Piece::Gap { .. }))
            {
                start
            } else {
                last + 1
            }
        }
    }
}

/// Counts the first `keep` pieces of a segment that starts at sequence `first` into
/// `recovery`: records, sequences missing between frames (lost to damage), unreadable gaps.
/// Returns the sequence after the last frame.
fn account(all: Vec<Piece>, keep: usize, first: u64, path: &Path, recovery: &mut Recovery) -> u64 {
    let mut expected = first;
    for piece in all.into_iter().take(keep) {
        match piece {
            Piece::Frame { seq, .. } => {
                if seq > expected {
                    recovery.lost.push(expected..=seq - 1);
                }
                expected = seq + 1;
                recovery.records += 1;
            }
            Piece::Gap { at, len } => recovery.damage.push(Damage {
                segment: path.to_path_buf(),
                offset: at as u64,
                bytes: len as u64,
            }),
        }
    }
    expected
}

impl RecordLog {
    /// Opens (or creates) the log in `dir`, recovering a torn tail and reading past damage.
    /// Returns every intact record, oldest first: for tests and tools. The engine uses
    /// [`RecordLog::recover`] and reads its backlog with a [`LogReader`].
    pub fn open(
        dir: &Path,
        segment_bytes: u64,
    ) -> Result<(RecordLog, Vec<Arc<StoredRecord>>, Recovery), LogError> {
        let (log, recovery) = RecordLog::recover(dir, segment_bytes)?;
        let mut reader = log.reader();
        let mut records = Vec::new();
        let mut from = log.first_seq();
        loop {
            let mut chunk = Vec::new();
            from = reader.read(from, log.next_seq(), 4096, &mut chunk)?;
            if chunk.is_empty() {
                break;
            }
            records.extend(chunk.into_iter().map(Arc::new));
        }
        Ok((log, records, recovery))
    }

    /// Opens (or creates) the log in `dir`, recovering a torn tail and reading past damage,
    /// one segment at a time: nothing of the records stays in memory.
    pub fn recover(dir: &Path, segment_bytes: u64) -> Result<(RecordLog, Recovery), LogError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::MemoryOnly) {
            // MUTANT: the buffer is as good as memory: what the last run stored is gone
            // (docs/src/design.md#rule-1-8).
            mutant::forget_last_run(dir);
        }
        let key_prefix = format!("{}-", engine_id(dir)?);
        let mut firsts = list_segments(dir)?;
        if firsts.is_empty() {
            File::create(segment_path(dir, 0)).map_err(io_err(dir))?;
            sync_new_segment(dir)?;
            firsts.push(0);
        }
        let mut recovery = Recovery {
            segments: firsts.len(),
            ..Recovery::default()
        };
        let active_first = *firsts.last().unwrap_or(&0);
        let mut active = None;
        for (i, &first) in firsts.iter().enumerate() {
            let path = segment_path(dir, first);
            let is_active = i + 1 == firsts.len();
            let (mut file, bytes) = open_and_read(&path)?;
            let all = pieces(&bytes);
            let keep = if is_active {
                whole_batches(&all)
            } else {
                all.len()
            };
            let cut = all.get(keep).map_or(bytes.len(), |p| match p {
                Piece::Frame { at, .. } | Piece::Gap { at, .. } => *at,
            });
            let expected = account(all, keep, first, &path, &mut recovery);
            if let Some(&next) = firsts.get(i + 1)
                && next > expected
            {
                recovery.lost.push(expected..=next - 1);
            }
            if is_active {
                let torn = (bytes.len() - cut) as u64;
                if torn > 0 {
                    file.set_len(cut as u64).map_err(io_err(&path))?;
                    file.sync_data().map_err(io_err(&path))?;
                }
                recovery.torn_bytes = torn;
                let len = file.seek(SeekFrom::End(0)).map_err(io_err(&path))?;
                active = Some((file, path, len, expected));
            }
        }
        let Some((file, active_path, synced_len, next_seq)) = active else {
            unreachable!("the segment list is never empty here");
        };
        let mut closed: VecDeque<u64> = firsts.into();
        closed.pop_back();
        remove_orphan_marks(dir, closed.front().copied().unwrap_or(active_first))?;
        Ok((
            RecordLog {
                dir: dir.to_path_buf(),
                closed,
                active_first,
                active_path,
                file,
                key_prefix,
                next_seq,
                buf: Vec::new(),
                synced_len,
                segment_bytes: segment_bytes.max(1),
            },
            recovery,
        ))
    }

    /// A reader of this log's records, for one output's backlog.
    pub fn reader(&self) -> LogReader {
        LogReader::new(&self.dir, &self.key_prefix)
    }

    /// `<engine id>-`: a record's write key is this followed by its sequence.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The oldest sequence still on disk (everything below it was settled and deleted).
    pub fn first_seq(&self) -> u64 {
        self.closed.front().copied().unwrap_or(self.active_first)
    }

    /// The sequence the next record will get: also how many records this directory accepted.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn segments(&self) -> usize {
        self.closed.len() + 1
    }

    /// Appends a batch of ingested lines and syncs them. Returns the stored records (with
    /// their freshly minted write keys) only once `fdatasync` has returned. For tests and
    /// tools; the engine appends with [`RecordLog::append_batch`].
    pub fn append(&mut self, lines: Vec<String>) -> Result<Vec<Arc<StoredRecord>>, LogError> {
        let segment = if self.synced_len >= self.segment_bytes {
            self.next_seq
        } else {
            self.active_first
        };
        let seqs = self.append_batch(lines.len(), lines.iter().map(String::as_str))?;
        Ok(seqs
            .zip(lines)
            .map(|(seq, data)| {
                Arc::new(StoredRecord {
                    seq,
                    key: write_key(&self.key_prefix, seq),
                    data,
                    segment,
                })
            })
            .collect())
    }

    /// Appends `count` lines as one batch and syncs them; returns their sequences only once
    /// `fdatasync` has returned. Copies each line once, into the reused frame buffer: nothing
    /// is allocated per record.
    /// Each line must be UTF-8 (the ingest checked it: every line is JSON).
    pub fn append_batch<L: AsRef<[u8]>>(
        &mut self,
        count: usize,
        lines: impl IntoIterator<Item = L>,
    ) -> Result<Range<u64>, LogError> {
        if self.synced_len >= self.segment_bytes {
            self.roll()?;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut seq = self.next_seq;
        for (i, line) in lines.into_iter().take(count).enumerate() {
            let at = buf.len();
            buf.extend_from_slice(&[0u8; HEADER]);
            encode(&mut buf, seq, line.as_ref(), i + 1 == count);
            let body_len = (buf.len() - at - HEADER) as u32;
            let crc = crc32fast::hash(&buf[at + HEADER..]);
            buf[at..at + 4].copy_from_slice(&body_len.to_le_bytes());
            buf[at + 4..at + HEADER].copy_from_slice(&crc.to_le_bytes());
            seq += 1;
        }
        let written = self.file.write_all(&buf).and_then(|_| {
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::AckBeforeFdatasync) {
                // MUTANT: acknowledged from the page cache; the writer thread syncs every
                // couple of seconds (docs/src/design.md#rule-1-8).
                return Ok(());
            }
            let synced = self.file.sync_data();
            #[cfg(feature = "mutants")]
            if synced.is_err() && mutant::is(Mutant::FsyncRetryBelieves) {
                // MUTANT: the retry answers 0 — the kernel marked the pages clean after the
                // failed writeback and will never write them — and is believed.
                return self.file.sync_data();
            }
            synced
        });
        let len = buf.len() as u64;
        if buf.capacity() <= 16 << 20 {
            self.buf = buf;
        }
        if let Err(source) = written {
            // Leave no half batch behind: a later batch must not follow unsynced garbage.
            let _ = self.truncate_to_synced();
            return Err(LogError::Io {
                path: self.active_path.clone(),
                source,
            });
        }
        let first = self.next_seq;
        self.next_seq = seq;
        self.synced_len += len;
        Ok(first..seq)
    }

    /// The write key the record with sequence `seq` gets (tests).
    #[cfg(all(test, feature = "mutants"))]
    pub(super) fn key_for(&self, seq: u64) -> String {
        write_key(&self.key_prefix, seq)
    }

    /// `ack-before-fdatasync`: the sync that `append` left out.
    #[cfg(feature = "mutants")]
    pub(super) fn sync_late(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Closes the active segment (it is synced) and starts the next one at `next_seq`.
    fn roll(&mut self) -> Result<(), LogError> {
        let path = segment_path(&self.dir, self.next_seq);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        sync_new_segment(&self.dir)?;
        self.closed.push_back(self.active_first);
        self.active_first = self.next_seq;
        self.active_path = path;
        self.file = file;
        self.synced_len = 0;
        Ok(())
    }

    /// Deletes every closed segment whose records all lie below `settled_below` (the lowest
    /// of the outputs' settled marks), with its delivery marks. Returns how many went.
    pub fn release(&mut self, settled_below: u64) -> Result<usize, LogError> {
        let mut gone = Vec::new();
        while let Some(&first) = self.closed.front() {
            let next_first = self.closed.get(1).copied().unwrap_or(self.active_first);
            if next_first > settled_below {
                break;
            }
            let path = segment_path(&self.dir, first);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
            self.closed.pop_front();
            gone.push(first);
        }
        if gone.is_empty() {
            return Ok(0);
        }
        sync_dir(&self.dir)?;
        remove_orphan_marks(&self.dir, self.first_seq())?;
        Ok(gone.len())
    }

    /// After a failed append, cut the file back to its last synced frame, so that a later
    /// (acknowledged) batch never lands behind a half-written one.
    fn truncate_to_synced(&mut self) -> io::Result<()> {
        self.file.set_len(self.synced_len)?;
        self.file.seek(SeekFrom::Start(self.synced_len)).map(|_| ())
    }
}

/// How much a [`LogReader`] reads at once.
const READ_CHUNK: usize = 1 << 20;

/// Where a [`LogReader`] stands: in which segment, at which byte, before which sequence.
struct ReadPosition {
    segment: u64,
    file: File,
    /// Offset of the next frame to look at.
    offset: u64,
    /// Every frame before `offset` has a sequence below this.
    next_seq: u64,
}

/// What one read of a segment chunk covers: sequences `from..upto`, at most `max` records
/// in all, and whether the chunk filled the buffer (more may follow in the file).
#[derive(Clone, Copy)]
struct Window {
    from: u64,
    upto: u64,
    max: usize,
    full: bool,
}

/// Where a scan of one chunk stopped: the offset reached, whether the reader is done for this
/// call, and (a frame longer than the chunk) the buffer size it needs.
struct Scanned {
    at: usize,
    stop: bool,
    grow: Option<usize>,
}

/// Takes the records of one chunk (`bytes`, read at `pos`) into `into`, resyncing past
/// damage on the next intact frame with a higher sequence, as recovery did.
fn scan(
    bytes: &[u8],
    pos: &mut ReadPosition,
    w: Window,
    origin: Origin<'_>,
    taken: &mut usize,
    into: &mut Vec<StoredRecord>,
) -> Scanned {
    let mut at = 0;
    let mut stop = false;
    let mut grow = None;
    while at < bytes.len() && *taken < w.max {
        if pos.next_seq >= w.upto {
            // Everything committed is read; what follows may be a batch still being
            // written.
            stop = true;
            break;
        }
        match look_at(bytes, at) {
            AtOffset::Frame(f) if f.seq >= pos.next_seq => {
                if f.seq >= w.upto {
                    stop = true;
                    break;
                }
                if f.seq >= w.from {
                    into.push(f.record(bytes, origin));
                    *taken += 1;
                }
                pos.next_seq = f.seq + 1;
                at += f.size;
            }
            AtOffset::Short { need } if w.full => {
                // The chunk ends inside a frame: read on from it (a bigger chunk if the
                // frame alone is larger than one).
                if at == 0 {
                    grow = Some(need);
                }
                break;
            }
            _ => {
                // Damage (or the end of a closed segment's data): resync on the next
                // intact frame with a higher sequence, as recovery did.
                let next_seq = pos.next_seq;
                match (at + 1..bytes.len()).find(|&q| {
                    frame_at(bytes, q).is_some_and(|f| f.seq >= next_seq && f.seq < w.upto)
                }) {
                    Some(q) => at = q,
                    None if w.full => {
                        at = bytes.len().saturating_sub(MAX_HEADER_SLACK).max(at + 1);
                        break;
                    }
                    None => {
                        at = bytes.len();
                        break;
                    }
                }
            }
        }
    }
    Scanned { at, stop, grow }
}

/// Reads one output's backlog from the record log, oldest first, a bounded chunk at a time:
/// the backlog stays on disk, and only what the output is about to send is in memory.
///
/// It reads only what the writer has committed (every sequence below `upto`, all of it synced
/// before it was acknowledged), so it never sees a half-written batch. It keeps its place
/// between calls (reading on is one `pread` per chunk); asked for a sequence behind its place,
/// it finds it again from the start of its segment. Damage inside the log is skipped the way
/// recovery skips it (resync on the next intact frame with a higher sequence): those sequences
/// were reported lost when the log was opened.
pub struct LogReader {
    dir: PathBuf,
    key_prefix: String,
    at: Option<ReadPosition>,
    buf: Vec<u8>,
}

impl LogReader {
    fn new(dir: &Path, key_prefix: &str) -> LogReader {
        LogReader {
            dir: dir.to_path_buf(),
            key_prefix: key_prefix.to_string(),
            at: None,
            buf: Vec::new(),
        }
    }

    /// Puts the reader at the start of the segment holding `from` (or the oldest segment
    /// after it, if `from` was deleted).
    fn locate(&mut self, from: u64) -> Result<bool, LogError> {
        let firsts = list_segments(&self.dir)?;
        let segment = match firsts.iter().rev().find(|&&f| f <= from) {
            Some(&f) => f,
            None => match firsts.first() {
                Some(&f) => f,
                None => return Ok(false),
            },
        };
        self.open_segment(segment)
    }

    fn open_segment(&mut self, segment: u64) -> Result<bool, LogError> {
        let path = segment_path(&self.dir, segment);
        match File::open(&path) {
            Ok(file) => {
                self.at = Some(ReadPosition {
                    segment,
                    file,
                    offset: 0,
                    next_seq: segment,
                });
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.at = None;
                Ok(false)
            }
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Moves on to the segment after the current one, if there is one.
    fn next_segment(&mut self) -> Result<bool, LogError> {
        let current = self.at.as_ref().map_or(0, |p| p.segment);
        let firsts = list_segments(&self.dir)?;
        match firsts.into_iter().find(|&f| f > current) {
            Some(f) => self.open_segment(f),
            None => Ok(false),
        }
    }

    /// Appends to `into` the records with sequences in `from..upto`, oldest first, at most
    /// `max` of them. Returns the sequence to read from next: one past the last record
    /// returned, or past sequences that turned out to be missing (deleted or damaged).
    pub fn read(
        &mut self,
        from: u64,
        upto: u64,
        max: usize,
        into: &mut Vec<StoredRecord>,
    ) -> Result<u64, LogError> {
        let mut from = from;
        if from >= upto || max == 0 {
            return Ok(from);
        }
        let behind = self.at.as_ref().is_none_or(|p| p.next_seq > from);
        if behind && !self.locate(from)? {
            return Ok(from);
        }
        let mut taken = 0;
        while taken < max {
            let Some(pos) = self.at.as_mut() else {
                break;
            };
            if pos.next_seq >= upto {
                break;
            }
            let want = READ_CHUNK.max(self.buf.len());
            self.buf.resize(want, 0);
            let path = segment_path(&self.dir, pos.segment);
            let got = read_at(&pos.file, &mut self.buf, pos.offset).map_err(io_err(&path))?;
            let bytes = &self.buf[..got];
            let origin = Origin {
                segment: pos.segment,
                key_prefix: &self.key_prefix,
            };
            let window = Window {
                from,
                upto,
                max,
                full: got == want,
            };
            let Scanned { at, stop, grow } = scan(bytes, pos, window, origin, &mut taken, into);
            pos.offset += at as u64;
            from = from.max(pos.next_seq);
            let caught_up = pos.next_seq >= upto;
            if let Some(need) = grow {
                self.buf.resize(need, 0);
                continue;
            }
            if stop || caught_up || taken >= max {
                break;
            }
            if got < want && at >= got {
                // The end of this segment's data.
                if !self.next_segment()? {
                    break;
                }
                if let Some(p) = self.at.as_ref() {
                    from = from.max(p.segment);
                }
            } else if got < want {
                // Stopped short inside the active segment's end: nothing more committed yet.
                break;
            }
        }
        Ok(self.at.as_ref().map_or(from, |p| p.next_seq.max(from)))
    }
}

/// After a bad stretch that reached the end of a full chunk, how far back from the chunk's end
/// the search for the next frame starts again (a frame header may straddle the boundary).
const MAX_HEADER_SLACK: usize = HEADER + 9;

/// Reads at `offset` until `buf` is full or the file ends; returns the bytes read.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Deletes the delivery marks of segments that no longer exist (all below `first`).
fn remove_orphan_marks(dir: &Path, first: u64) -> Result<(), LogError> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("delivered-") {
            continue;
        }
        let Some(segment) = name
            .rsplit_once('-')
            .and_then(|(_, tail)| numbered(tail, ""))
        else {
            continue;
        };
        if segment < first {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Opens (creating if needed) a file for appending after recovery, and reads it whole.
fn open_and_read(path: &Path) -> Result<(File, Vec<u8>), LogError> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io_err(path))?;
    Ok((file, bytes))
}

fn engine_id(dir: &Path) -> Result<String, LogError> {
    let path = dir.join("engine.id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            let mut seed = [0u8; 8];
            File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut seed))
                .map_err(io_err(Path::new("/dev/urandom")))?;
            let id = format!("{:016x}", u64::from_le_bytes(seed));
            let tmp = dir.join("engine.id.tmp");
            let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
            f.write_all(id.as_bytes()).map_err(io_err(&tmp))?;
            f.sync_all().map_err(io_err(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
            sync_dir(dir)?;
            Ok(id)
        }
    }
}

/// The delivery marks of one output: which sequences its destination confirmed, one file
/// per segment.
pub struct DeliveryMarks {
    dir: PathBuf,
    output: String,
    files: BTreeMap<u64, File>,
    /// The bytes of one write, kept between calls: a batch of marks costs no allocation (a
    /// fresh, growing buffer per batch made glibc consolidate its free lists on every call).
    buf: Vec<u8>,
    /// The segments one batch names, kept between calls for the same reason.
    segments: Vec<u64>,
    /// A marks file was created since the last [`DeliveryMarks::sync`]: its name is synced
    /// with the marks.
    new_file: bool,
}

impl DeliveryMarks {
    /// Reads the marks of every segment from `first` on.
    pub fn open(dir: &Path, output: &str, first: u64) -> Result<(DeliveryMarks, SeqSet), LogError> {
        let prefix = format!("delivered-{output}-");
        let mut seen = SeqSet::new();
        for entry in std::fs::read_dir(dir).map_err(io_err(dir))?.flatten() {
            let Some(segment) = entry
                .file_name()
                .to_str()
                .and_then(|n| numbered(n, &prefix))
            else {
                continue;
            };
            if segment < first {
                continue;
            }
            let path = entry.path();
            let (file, bytes) = open_and_read(&path)?;
            let whole = bytes.len() / 8 * 8;
            if whole != bytes.len() {
                file.set_len(whole as u64).map_err(io_err(&path))?;
            }
            for c in bytes[..whole].chunks_exact(8) {
                seen.insert(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
            }
        }
        Ok((
            DeliveryMarks {
                dir: dir.to_path_buf(),
                output: output.to_string(),
                files: BTreeMap::new(),
                buf: Vec::new(),
                segments: Vec::new(),
                new_file: false,
            },
            seen,
        ))
    }

    /// Marks `(segment, seq)` pairs as confirmed: one append per segment named (nearly always
    /// one), the sequences in the order given.
    pub fn mark(&mut self, marks: &[(u64, u64)]) -> Result<(), LogError> {
        self.segments.clear();
        for &(segment, _) in marks {
            if self.segments.last() != Some(&segment) && !self.segments.contains(&segment) {
                self.segments.push(segment);
            }
        }
        self.segments.sort_unstable();
        for i in 0..self.segments.len() {
            let segment = self.segments[i];
            self.buf.clear();
            for &(s, seq) in marks {
                if s == segment {
                    self.buf.extend_from_slice(&seq.to_le_bytes());
                }
            }
            let file = match self.files.entry(segment) {
                std::collections::btree_map::Entry::Occupied(f) => f.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let path = marks_path(&self.dir, &self.output, segment);
                    let file = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .map_err(io_err(&path))?;
                    self.new_file = true;
                    v.insert(file)
                }
            };
            file.write_all(&self.buf).map_err(io_err(&marks_path(
                &self.dir,
                &self.output,
                segment,
            )))?;
        }
        Ok(())
    }

    /// Closes the files of segments below `first` (deleted by the log).
    pub fn forget_below(&mut self, first: u64) {
        self.files = self.files.split_off(&first);
    }

    pub fn sync(&mut self) -> Result<(), LogError> {
        for (segment, file) in &self.files {
            file.sync_data()
                .map_err(io_err(&marks_path(&self.dir, &self.output, *segment)))?;
        }
        if self.new_file {
            sync_dir(&self.dir)?;
            self.new_file = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: u64 = DEFAULT_SEGMENT_BYTES;

    fn lines(n: usize, from: usize) -> Vec<String> {
        (from..from + n).map(|i| format!("{{\"i\":{i}}}")).collect()
    }

    fn seqs(records: &[Arc<StoredRecord>]) -> Vec<u64> {
        records.iter().map(|r| r.seq).collect()
    }

    #[test]
    fn records_survive_reopen_with_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, none, _) = RecordLog::open(dir.path(), BIG).unwrap();
        assert!(none.is_empty());
        let a = log.append(lines(3, 0)).unwrap();
        let b = log.append(lines(2, 3)).unwrap();
        drop(log);
        let (_, all, recovery) = RecordLog::open(dir.path(), BIG).unwrap();
        assert_eq!(recovery.torn_bytes, 0);
        let expected: Vec<_> = a.into_iter().chain(b).collect();
        assert_eq!(all, expected);
        assert_eq!(all[4].seq, 4);
    }

    #[test]
    fn a_torn_tail_is_truncated_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = RecordLog::open(dir.path(), BIG).unwrap();
        log.append(lines(2, 0)).unwrap();
        log.append(lines(3, 2)).unwrap();
        let path = log.active_path.clone();
        drop(log);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        drop(f);
        let (mut log, all, recovery) = RecordLog::open(dir.path(), BIG).unwrap();
        // The torn batch goes whole; the earlier one stays whole.
        assert_eq!(all.len(), 2);
        assert!(recovery.torn_bytes > 0);
        assert!(recovery.damage.is_empty() && recovery.lost.is_empty());
        // The next record takes the torn batch's first sequence; the file is whole again.
        let next = log.append(lines(1, 9)).unwrap();
        assert_eq!(next[0].seq, 2);
        drop(log);
        let (_, all, recovery) = RecordLog::open(dir.path(), BIG).unwrap();
        assert_eq!((all.len(), recovery.torn_bytes), (3, 0));
    }

    #[test]
    fn segments_roll_and_go_once_every_output_is_past_them() {
        let dir = tempfile::tempdir().unwrap();
        // Tiny segments: every batch of 4 starts a new one.
        let (mut log, _, _) = RecordLog::open(dir.path(), 50).unwrap();
        for i in 0..5 {
            log.append(lines(4, i * 4)).unwrap();
        }
        assert_eq!(log.segments(), 5);
        let (mut marks, _) = DeliveryMarks::open(dir.path(), "o", 0).unwrap();
        marks.mark(&[(0, 0), (4, 5)]).unwrap();
        // Settled below 6: only the first segment (0..=3) is wholly below it.
        assert_eq!(log.release(6).unwrap(), 1);
        assert_eq!(log.first_seq(), 4);
        assert!(!segment_path(dir.path(), 0).exists());
        assert!(!marks_path(dir.path(), "o", 0).exists());
        assert!(marks_path(dir.path(), "o", 4).exists());
        // Everything settled: all but the active segment go; sequences go on.
        assert_eq!(log.release(20).unwrap(), 3);
        assert_eq!(log.segments(), 1);
        drop(log);
        let (mut log, all, recovery) = RecordLog::open(dir.path(), 50).unwrap();
        assert_eq!(seqs(&all), vec![16, 17, 18, 19]);
        assert!(recovery.lost.is_empty(), "deleted segments are not losses");
        assert_eq!(log.append(lines(1, 0)).unwrap()[0].seq, 20);
        let (_, seen) = DeliveryMarks::open(dir.path(), "o", log.first_seq()).unwrap();
        assert!(seen.is_empty());
    }

    #[test]
    fn damage_inside_the_log_costs_only_the_damaged_records() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = RecordLog::open(dir.path(), 150).unwrap();
        let mut all = Vec::new();
        for i in 0..6 {
            all.extend(log.append(lines(3, i * 3)).unwrap());
        }
        drop(log);
        // Rot one byte of record 1 (closed segment) and of record 13 (mid active segment).
        let firsts = list_segments(dir.path()).unwrap();
        assert!(firsts.len() >= 2);
        for (segment, seq) in [(firsts[0], 1u64), (*firsts.last().unwrap(), 13)] {
            let path = segment_path(dir.path(), segment);
            let mut bytes = std::fs::read(&path).unwrap();
            let pieces = pieces(&bytes);
            let at = pieces
                .iter()
                .find_map(|p| match p {
                    Piece::Frame { at, seq: s, .. } if *s == seq => Some(*at),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("record {seq} not in segment {segment}"));
            bytes[at + HEADER + 3] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
        }
        let (_, kept, recovery) = RecordLog::open(dir.path(), 150).unwrap();
        assert_eq!(recovery.lost, vec![1..=1, 13..=13]);
        assert_eq!(recovery.damage.len(), 2);
        assert_eq!(recovery.torn_bytes, 0);
        let want: Vec<u64> = (0..18).filter(|s| *s != 1 && *s != 13).collect();
        assert_eq!(seqs(&kept), want);
    }

    #[test]
    fn delivery_marks_drop_a_torn_mark() {
        let dir = tempfile::tempdir().unwrap();
        let (mut marks, none) = DeliveryMarks::open(dir.path(), "o", 0).unwrap();
        assert!(none.is_empty());
        marks.mark(&[(0, 1), (0, 2), (0, 7)]).unwrap();
        marks
            .files
            .get_mut(&0)
            .unwrap()
            .write_all(&[1, 2, 3])
            .unwrap();
        drop(marks);
        let (_, seen) = DeliveryMarks::open(dir.path(), "o", 0).unwrap();
        assert_eq!(seen.iter().collect::<Vec<_>>(), vec![1, 2, 7]);
    }

    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::HashSet;

        #[derive(Debug, Clone)]
        enum Step {
            /// An acknowledged batch: written and synced.
            Append(Vec<String>),
            /// A batch torn by a crash mid-write: only `keep` per mille of its bytes reached
            /// the disk, never acknowledged; `flip` also damages one of those bytes.
            Torn(Vec<String>, u16, bool),
            /// A delivery confirmed for the record at this position (mod count).
            Mark(usize),
            /// Every output settled everything below the record at this position.
            Release(usize),
        }

        fn step() -> impl Strategy<Value = Step> {
            let lines = prop::collection::vec("[a-z0-9 {}:\"]{0,40}", 1..5);
            prop_oneof![
                4 => lines.clone().prop_map(Step::Append),
                2 => (lines, 0u16..1000, any::<bool>()).prop_map(|(l, k, f)| Step::Torn(l, k, f)),
                2 => any::<usize>().prop_map(Step::Mark),
                1 => any::<usize>().prop_map(Step::Release),
            ]
        }

        fn plain(r: &StoredRecord) -> (u64, String, String) {
            (r.seq, r.key.clone(), r.data.clone())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
            /// The log against an in-memory reference, reopened after every step, with segments
            /// small enough to roll every few batches: every acknowledged record not yet
            /// released survives with its sequence and write key, nothing torn ever appears,
            /// released records are gone only below the settled mark, and delivery marks
            /// survive with their segments.
            #[test]
            fn the_log_matches_its_model_across_reopens(steps in prop::collection::vec(step(), 1..25)) {
                let dir = tempfile::tempdir().unwrap();
                let mut model: BTreeMap<u64, StoredRecord> = BTreeMap::new();
                let mut marked: HashSet<u64> = HashSet::new();
                for step in steps {
                    let (mut log, _, _) = RecordLog::open(dir.path(), 120).unwrap();
                    match step {
                        Step::Append(lines) => {
                            for r in log.append(lines).unwrap() {
                                model.insert(r.seq, (*r).clone());
                            }
                        }
                        Step::Torn(lines, keep, flip) => {
                            if log.synced_len >= log.segment_bytes {
                                log.roll().unwrap();
                            }
                            let before = log.synced_len;
                            log.append(lines).unwrap();
                            let path = log.active_path.clone();
                            let after = std::fs::metadata(&path).unwrap().len();
                            let written = after - before;
                            let kept = written * u64::from(keep) / 1000;
                            let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
                            f.set_len(before + kept).unwrap();
                            if flip && kept > 0 {
                                let mut bytes = std::fs::read(&path).unwrap();
                                let at = (before + kept / 2) as usize;
                                bytes[at] ^= 0x5a;
                                std::fs::write(&path, bytes).unwrap();
                            }
                        }
                        Step::Mark(i) => {
                            if !model.is_empty() {
                                let r = model.values().nth(i % model.len()).unwrap();
                                let (mut marks, _) = DeliveryMarks::open(dir.path(), "o", 0).unwrap();
                                marks.mark(&[(r.segment, r.seq)]).unwrap();
                                marked.insert(r.seq);
                            }
                        }
                        Step::Release(i) => {
                            if !model.is_empty() {
                                let below = *model.keys().nth(i % model.len()).unwrap();
                                log.release(below).unwrap();
                                let first = log.first_seq();
                                prop_assert!(first <= below);
                                model.retain(|s, _| *s >= first);
                                marked.retain(|s| *s >= first);
                            }
                        }
                    }
                    drop(log);
                    let (log, records, recovery) = RecordLog::open(dir.path(), 120).unwrap();
                    prop_assert!(recovery.lost.is_empty() && recovery.damage.is_empty());
                    let got: Vec<_> = records.iter().map(|r| plain(r)).collect();
                    let want: Vec<_> = model.values().map(plain).collect();
                    prop_assert_eq!(got, want);
                    let (_, marks) = DeliveryMarks::open(dir.path(), "o", log.first_seq()).unwrap();
                    let marks: HashSet<u64> = marks.iter().collect();
                    prop_assert_eq!(&marks, &marked);
                }
            }
        }
    }
}
