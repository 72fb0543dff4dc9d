//! One file's writes that no fsync has made durable yet: the operations in the order they
//! arrived, laid over the backing file's bytes for reads, applied to it in that order by fsync,
//! dropped whole by a power cut. Pure bookkeeping: the only I/O here is [`Pending::apply`], on a
//! backing file the caller opened.
//!
//! **A failed fsync** ([`Pending::fail_sync`]) does what Linux does to the pages it covered:
//! they are marked clean and never written. Reads still show them, a later fsync does not
//! write them and succeeds, and the next power cut loses them. The list keeps them (and, to
//! keep reads in order, every change applied after them) as a "kept" prefix that fsync never
//! applies again.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::SystemTime;

/// A data change that reached the filesystem and not yet the backing file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// `data` at `offset`. Consecutive appends arrive as one op (`calls` counts them) so an
    /// engine that appends in small pieces keeps a short list.
    Write {
        offset: u64,
        data: Vec<u8>,
        calls: u64,
    },
    /// The file's size set to `size`: bytes past it are gone, a grown file reads zeros.
    Truncate { size: u64 },
}

/// What a power cut would throw away for one file, and the overlay reads see meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    ops: Vec<Op>,
    /// `ops[..kept]` are for reads only: changes a failed fsync dropped (never durable) and
    /// changes applied after them (durable already). fsync applies only `ops[kept..]`.
    kept: usize,
    /// Write requests and data bytes a failed fsync dropped: a power cut loses them.
    doomed: (u64, u64),
    /// Write requests and truncates held (a large write(2) may arrive as several requests).
    changes: u64,
    /// Data bytes held (writes only; a truncate carries none).
    bytes: u64,
    /// When the last held change arrived: the file's mtime until it is synced or cut.
    touched: Option<SystemTime>,
}

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// An fsync of this file failed: what it covered is never written, though reads show it
    /// until a power cut; a later fsync leaves it be. Returns (changes, bytes) dropped.
    pub(crate) fn fail_sync(&mut self) -> (u64, u64) {
        let dropped = (self.changes, self.bytes);
        self.doomed.0 += self.changes;
        self.doomed.1 += self.bytes;
        self.kept = self.ops.len();
        self.changes = 0;
        self.bytes = 0;
        dropped
    }

    /// Data bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn touched(&self) -> Option<SystemTime> {
        self.touched
    }

    /// The file's size once every held change lands on a backing file of `base` bytes.
    pub(crate) fn size_over(&self, base: u64) -> u64 {
        self.ops.iter().fold(base, |size, op| match op {
            Op::Write { offset, data, .. } => size.max(offset + data.len() as u64),
            Op::Truncate { size } => *size,
        })
    }

    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        self.changes += 1;
        self.bytes += data.len() as u64;
        self.touched = Some(SystemTime::now());
        let held = self.ops.len() > self.kept;
        if let Some(Op::Write {
            offset: last_offset,
            data: last,
            calls,
        }) = self.ops.last_mut()
            && held
            && *last_offset + last.len() as u64 == offset
        {
            last.extend_from_slice(data);
            *calls += 1;
            return;
        }
        self.ops.push(Op::Write {
            offset,
            data: data.to_vec(),
            calls: 1,
        });
    }

    pub(crate) fn truncate(&mut self, size: u64) {
        self.changes += 1;
        self.touched = Some(SystemTime::now());
        self.ops.push(Op::Truncate { size });
    }

    /// Lays the held changes over `buf`, which holds the backing file's bytes from `offset`
    /// (zeros past the backing file's end). Bytes past the file's size at any point stay zero,
    /// as after a real truncate.
    pub(crate) fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        for op in &self.ops {
            match op {
                Op::Write {
                    offset: at, data, ..
                } => {
                    let from = offset.max(*at);
                    let to = end.min(at + data.len() as u64);
                    if from < to {
                        let dst = (from - offset) as usize..(to - offset) as usize;
                        let src = (from - at) as usize..(to - at) as usize;
                        buf[dst].copy_from_slice(&data[src]);
                    }
                }
                Op::Truncate { size } => {
                    if *size < end {
                        let from = size.saturating_sub(offset) as usize;
                        buf[from..].fill(0);
                    }
                }
            }
        }
    }

    /// Applies the held changes to `file` in order. On an error the changes already applied
    /// are gone from the list and the rest stay held, so a retry carries on where this stopped.
    /// After a failed fsync ([`Pending::fail_sync`]) the applied changes stay in the list for
    /// reads, behind what that fsync dropped.
    pub(crate) fn apply(&mut self, file: &File) -> io::Result<()> {
        let mut done = 0;
        let mut result = Ok(());
        for op in &self.ops[self.kept..] {
            let step = match op {
                Op::Write { offset, data, .. } => file.write_all_at(data, *offset),
                Op::Truncate { size } => file.set_len(*size),
            };
            if let Err(e) = step {
                result = Err(e);
                break;
            }
            done += 1;
        }
        if self.kept == 0 {
            self.ops.drain(..done);
        } else {
            self.kept += done;
        }
        self.recount();
        result
    }

    /// Tears the last held write the way a disk does when power fails mid-write: its final
    /// sector (`sector` bytes, at absolute file offsets) never lands, and reads as zeros; the
    /// file keeps the write's size (the size reached the disk, the sector did not). A write
    /// inside one sector is torn whole. Returns the bytes zeroed (0: no write held).
    pub(crate) fn tear(&mut self, sector: u64) -> u64 {
        let Some(Op::Write { offset, data, .. }) = self.ops[self.kept..]
            .iter_mut()
            .rev()
            .find(|op| matches!(op, Op::Write { .. }))
        else {
            return 0;
        };
        let end = *offset + data.len() as u64;
        if data.is_empty() {
            return 0;
        }
        let from = ((end - 1) / sector * sector).max(*offset);
        let torn = &mut data[(from - *offset) as usize..];
        torn.fill(0);
        torn.len() as u64
    }

    /// Forgets every held change, and what a failed fsync dropped; returns (changes, bytes)
    /// forgotten.
    pub(crate) fn drop_all(&mut self) -> (u64, u64) {
        let lost = (self.changes + self.doomed.0, self.bytes + self.doomed.1);
        *self = Pending::default();
        lost
    }

    fn recount(&mut self) {
        self.changes = 0;
        self.bytes = 0;
        for op in &self.ops[self.kept..] {
            match op {
                Op::Write { data, calls, .. } => {
                    self.changes += calls;
                    self.bytes += data.len() as u64;
                }
                Op::Truncate { .. } => self.changes += 1,
            }
        }
        if self.ops.len() == self.kept && self.doomed == (0, 0) {
            self.touched = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file as a reader sees it: `base` with the held changes over it.
    fn view(base: &[u8], pending: &Pending) -> Vec<u8> {
        let size = pending.size_over(base.len() as u64) as usize;
        let mut buf = vec![0u8; size];
        let n = base.len().min(size);
        buf[..n].copy_from_slice(&base[..n]);
        pending.overlay(0, &mut buf);
        buf
    }

    #[test]
    fn appends_coalesce_and_count_every_call() {
        let mut p = Pending::default();
        p.write(3, b"ab");
        p.write(5, b"cd");
        p.write(7, b"e");
        assert_eq!(p.ops.len(), 1);
        assert_eq!((p.changes, p.bytes()), (3, 5));
        assert_eq!(view(b"xyz", &p), b"xyzabcde");
    }

    #[test]
    fn a_truncate_zeroes_what_lies_past_it_even_when_the_file_grows_again() {
        let mut p = Pending::default();
        p.truncate(2);
        p.write(4, b"Z");
        assert_eq!(view(b"abcdef", &p), b"ab\0\0Z");
        p.truncate(8);
        assert_eq!(view(b"abcdef", &p), b"ab\0\0Z\0\0\0");
    }

    #[test]
    fn an_overwrite_inside_the_file_keeps_its_size() {
        let mut p = Pending::default();
        p.write(1, b"XY");
        assert_eq!(p.size_over(6), 6);
        assert_eq!(view(b"abcdef", &p), b"aXYdef");
    }

    #[test]
    fn overlay_of_a_window_matches_the_whole_view() {
        let mut p = Pending::default();
        p.write(2, b"0123456789");
        p.truncate(7);
        p.write(9, b"!!");
        let whole = view(b"abcdefghijklmnop", &p);
        for from in 0..whole.len() {
            for to in from..=whole.len() {
                let mut buf = b"abcdefghijklmnop"
                    .get(from..to)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default();
                buf.resize(to - from, 0);
                p.overlay(from as u64, &mut buf);
                assert_eq!(buf, whole[from..to], "window {from}..{to}");
            }
        }
    }

    #[test]
    fn apply_writes_in_order_and_empties_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abcdef").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut p = Pending::default();
        p.truncate(2);
        p.write(4, b"Z");
        let expected = view(b"abcdef", &p);
        p.apply(&file).unwrap();
        assert!(p.is_empty());
        assert_eq!((p.changes, p.bytes(), p.touched()), (0, 0, None));
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn a_tear_zeroes_the_last_writes_final_sector_and_keeps_its_size() {
        let mut p = Pending::default();
        p.write(0, &[1; 1000]);
        p.write(2050, &[2; 40]);
        // The last write lies inside one sector: torn whole.
        assert_eq!(p.tear(512), 40);
        let v = view(&[], &p);
        assert_eq!(v.len(), 2090);
        assert!(v[2050..].iter().all(|b| *b == 0));
        assert!(
            v[..1000].iter().all(|b| *b == 1),
            "earlier writes are whole"
        );
        // Across sectors: what lies before the last sector boundary lands.
        let mut p = Pending::default();
        p.write(100, &[3; 1000]);
        assert_eq!(p.tear(512), 1100 - 1024);
        let v = view(&[], &p);
        assert!(v[100..1024].iter().all(|b| *b == 3));
        assert!(v[1024..1100].iter().all(|b| *b == 0));
        assert_eq!(
            Pending::default().tear(512),
            0,
            "nothing held, nothing torn"
        );
    }

    /// Linux after a failed fsync: the writes it covered read back, are never written by a
    /// later fsync (which succeeds), and are gone after a cut; writes after it land, and a
    /// later write over the same bytes wins in reads and on disk.
    #[test]
    fn a_failed_fsync_drops_its_writes_for_good_but_reads_still_show_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abcdef").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut p = Pending::default();
        p.write(6, b"GHIJ");
        assert_eq!(p.fail_sync(), (1, 4));
        assert_eq!(view(b"abcdef", &p), b"abcdefGHIJ");
        p.write(10, b"kl");
        p.write(0, b"A");
        p.write(7, b"h");
        // The retried fsync: only what came after the failure lands.
        p.apply(&file).unwrap();
        let disk = std::fs::read(&path).unwrap();
        assert_eq!(disk, b"Abcdef\0h\0\0kl");
        // Reads: the dropped bytes still show where nothing later wrote over them.
        assert_eq!(view(&disk, &p), b"AbcdefGhIJkl");
        assert!(!p.is_empty(), "what the failure dropped is still to lose");
        // Appends after the failure do not join a kept op.
        p.write(12, b"m");
        assert_eq!((p.changes, p.bytes()), (1, 1));
        assert_eq!(p.drop_all(), (2, 5));
        assert!(p.is_empty());
    }

    #[test]
    fn drop_all_reports_what_it_forgot() {
        let mut p = Pending::default();
        p.write(0, b"abc");
        p.write(3, b"de");
        p.truncate(1);
        assert_eq!(p.drop_all(), (3, 5));
        assert!(p.is_empty());
    }
}
