//! The file-tail input (`tail:` in `engine.yaml`): follows a log file another program appends
//! to, and stores each complete line as a record, as the HTTP ingest does.
//!
//! It follows the file by inode, not by name: once the name points at another file (a
//! `rename` rotation, or a delete and a new file), it finishes the one it has open before it
//! moves to the next newer one (`NAME.k-1`, …, `NAME`). A file cut shorter than where it is
//! (`copytruncate`, a truncation) is read again from its start. A line without its newline yet
//! waits for the rest. A path with a `*` in its file name (`app-*.log`) is a glob: the files
//! matching it are read one after the other in the order of their names (numbered and dated
//! logs sort that way), each finished before the next; a new file is taken up from its start.
//! Its checkpoint (`tail-checkpoint.json` in the data folder: inode and
//! offset) moves only after the writer has synced the lines it covers to the record log
//! (docs/src/design.md#rule-1-1: a checkpoint may pass a record only once the record is safe),
//! written to a temporary file, synced, renamed and the folder synced. After a crash it
//! resumes at the checkpoint: a line stored and not yet checkpointed is read again (a copy),
//! never a line lost.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::writer::{IngestJob, WriterJob};

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// `tail:` in `engine.yaml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TailConfig {
    /// The live file (rotated files are `NAME.1`, `NAME.2`, … beside it), or a glob with one
    /// `*` in the file name (`/var/log/app-*.log`).
    pub path: PathBuf,
}

/// Where the tail is: the file by inode and the offset of the first byte not yet stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct Checkpoint {
    pub inode: u64,
    pub offset: u64,
}

/// The checkpoint as last saved, shared with `/stats` (which only reads it).
#[derive(Debug, Clone, Default)]
pub struct Published(Arc<Mutex<Option<Checkpoint>>>);

impl Published {
    fn set(&self, c: Checkpoint) {
        if let Ok(mut at) = self.0.lock() {
            *at = Some(c);
        }
    }

    /// The checkpoint last saved, or the one resumed from.
    pub fn get(&self) -> Option<Checkpoint> {
        self.0.lock().ok().and_then(|at| *at)
    }
}

/// The checkpoint file in the data folder.
pub const CHECKPOINT_FILE: &str = "tail-checkpoint.json";

/// How much one read takes at most.
const READ_AT_MOST: usize = 1 << 20;
/// How often an idle tail looks again.
const POLL: Duration = Duration::from_millis(20);

/// Starts the tail on a thread of its own; it ends when `cancel` fires.
pub(super) fn spawn(
    config: TailConfig,
    data_dir: PathBuf,
    writer: mpsc::Sender<WriterJob>,
    published: Published,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut tail = Tail::new(config.path, &data_dir, writer);
        tail.published = published;
        if let Some(c) = tail.resume {
            tail.published.set(c);
        }
        while !cancel.is_cancelled() {
            match tail.step() {
                Ok(true) => {}
                Ok(false) => std::thread::sleep(POLL),
                Err(e) => {
                    eprintln!("drill engine: tail: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    })
}

struct Tail {
    live: PathBuf,
    /// Where `live` is a glob: its folder and the name's text before and after the `*`.
    glob: Option<Glob>,
    checkpoint_path: PathBuf,
    writer: mpsc::Sender<WriterJob>,
    open: Option<Open>,
    /// Read at start: where to resume.
    resume: Option<Checkpoint>,
    /// Where `/stats` reads the checkpoint.
    published: Published,
}

struct Open {
    file: File,
    /// Its name when opened (a glob's files are read in name order).
    name: String,
    inode: u64,
    offset: u64,
}

/// A glob's folder and the name's text around its `*`.
struct Glob {
    dir: PathBuf,
    head: String,
    tail: String,
}

impl Glob {
    fn of(path: &Path) -> Option<Glob> {
        let name = path.file_name()?.to_str()?;
        let (head, tail) = name.split_once('*')?;
        Some(Glob {
            dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            head: head.to_string(),
            tail: tail.to_string(),
        })
    }

    /// The files matching, in name order, with their inodes.
    fn files(&self) -> Vec<(String, u64)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<(String, u64)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let fits = name.len() >= self.head.len() + self.tail.len()
                    && name.starts_with(&self.head)
                    && name.ends_with(&self.tail);
                let meta = e.metadata().ok()?;
                (fits && meta.is_file()).then(|| (name, meta.ino()))
            })
            .collect();
        files.sort();
        files
    }
}

impl Tail {
    fn new(live: PathBuf, data_dir: &Path, writer: mpsc::Sender<WriterJob>) -> Tail {
        let checkpoint_path = data_dir.join(CHECKPOINT_FILE);
        let resume = std::fs::read(&checkpoint_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Checkpoint>(&b).ok());
        Tail {
            glob: Glob::of(&live),
            live,
            checkpoint_path,
            writer,
            open: None,
            resume,
            published: Published::default(),
        }
    }

    /// One round: open what to read, store the complete lines there, or move on to the next
    /// file. `Ok(true)` when it did something (look again at once).
    fn step(&mut self) -> Result<bool, String> {
        if self.open.is_none() {
            return self.open_first();
        }
        if self.store_lines()? {
            return Ok(true);
        }
        self.follow()
    }

    /// At start: the checkpoint's file by its inode (the live file or a rotated one), else
    /// the live file from its start.
    fn open_first(&mut self) -> Result<bool, String> {
        if let Some(c) = self.resume {
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::SkipOnRotate) {
                // Follows the name: whatever file is live now, at the old offset.
                self.open = open_at(&self.newest(), c.offset)?;
                if self.open.is_some() {
                    self.resume = None;
                }
                return Ok(self.open.is_some());
            }
            match self.find(c.inode) {
                Some(path) => {
                    self.open = open_at(&path, c.offset)?;
                    self.resume = None;
                    return Ok(true);
                }
                None => eprintln!(
                    "drill engine: tail: the checkpointed file (inode {}) is gone; starting at the oldest file there is",
                    c.inode
                ),
            }
            self.resume = None;
        }
        // The oldest rotated file there is, else the live one; a glob's first by name.
        let first = match &self.glob {
            Some(g) => match g.files().first() {
                Some((name, _)) => g.dir.join(name),
                None => return Ok(false),
            },
            None => self.rotated().pop().unwrap_or_else(|| self.live.clone()),
        };
        self.open = open_at(&first, 0)?;
        Ok(self.open.is_some())
    }

    /// Reads from where it is, stores the complete lines, then moves its checkpoint past
    /// them. `Ok(false)`: no complete line.
    fn store_lines(&mut self) -> Result<bool, String> {
        let Some(open) = self.open.as_mut() else {
            return Ok(false);
        };
        let mut buf = vec![0u8; READ_AT_MOST];
        open.file
            .seek(SeekFrom::Start(open.offset))
            .map_err(|e| e.to_string())?;
        let n = read_some(&mut open.file, &mut buf).map_err(|e| e.to_string())?;
        buf.truncate(n);
        let Some(last) = buf.iter().rposition(|b| *b == b'\n') else {
            return Ok(false);
        };
        buf.truncate(last + 1);
        let taken = buf.len() as u64;
        let lines = lines_of(&buf);
        let after = Checkpoint {
            inode: open.inode,
            offset: open.offset + taken,
        };
        #[cfg(feature = "mutants")]
        let early = mutant::is(Mutant::CheckpointBeforeStore);
        #[cfg(not(feature = "mutants"))]
        let early = false;
        if early {
            // Moves the checkpoint at read time, before the lines are stored.
            self.save(after)?;
        }
        if !lines.is_empty() {
            store_blocking(&self.writer, buf, lines)?;
        }
        if !early {
            self.save(after)?;
        }
        if let Some(open) = self.open.as_mut() {
            open.offset = after.offset;
        }
        Ok(true)
    }

    /// At the end of the open file with nothing new: a file cut shorter is read again from
    /// its start; a file the name no longer points at (of a glob: one a later file follows) is
    /// done, and the next newer one is opened.
    fn follow(&mut self) -> Result<bool, String> {
        let Some(open) = self.open.as_ref() else {
            return Ok(false);
        };
        let len = open.file.metadata().map_err(|e| e.to_string())?.len();
        if len < open.offset {
            let inode = open.inode;
            self.save(Checkpoint { inode, offset: 0 })?;
            if let Some(open) = self.open.as_mut() {
                open.offset = 0;
            }
            return Ok(true);
        }
        let Some(next) = self.next_file(open) else {
            return Ok(false);
        };
        // The name moved on; lines appended to this file before it did are read first (a half
        // line at its end never gets its newline: left behind). Its length is looked at again
        // now: a line written just before the rotation may have come after the look above.
        let len = open.file.metadata().map_err(|e| e.to_string())?.len();
        if len > open.offset && has_a_line(&open.file, open.offset, len)? {
            return Ok(true);
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::SkipOnRotate) {
            // Follows the name and keeps its offset: the new file's first bytes and the old
            // file's unread rest are skipped.
            self.open = open_at(&self.newest(), open.offset)?;
            return Ok(true);
        }
        let Some(next) = open_at(&next, 0)? else {
            // Gone between the look and the open: look again.
            return Ok(false);
        };
        self.save(Checkpoint {
            inode: next.inode,
            offset: 0,
        })?;
        self.open = Some(next);
        Ok(true)
    }

    /// The file to read once the open one is done, when there is one: the file rotated in
    /// after it (the live name no longer its inode), or a glob's next file by name (the same
    /// name made again first).
    fn next_file(&self, open: &Open) -> Option<PathBuf> {
        let Some(g) = &self.glob else {
            let live = std::fs::metadata(&self.live).ok()?;
            return (live.ino() != open.inode).then(|| self.successor(open.inode));
        };
        g.files()
            .into_iter()
            .find(|(name, ino)| *name > open.name || (*name == open.name && *ino != open.inode))
            .map(|(name, _)| g.dir.join(name))
    }

    /// The live file, or a glob's last by name.
    fn newest(&self) -> PathBuf {
        match &self.glob {
            Some(g) => g
                .files()
                .pop()
                .map_or_else(|| self.live.clone(), |(name, _)| g.dir.join(name)),
            None => self.live.clone(),
        }
    }

    /// The rotated files beside the live one, newest first (`NAME.1`, `NAME.2`, …).
    fn rotated(&self) -> Vec<PathBuf> {
        (1..)
            .map(|n| {
                let mut name = self.live.as_os_str().to_owned();
                name.push(format!(".{n}"));
                PathBuf::from(name)
            })
            .take_while(|p| p.exists())
            .collect()
    }

    /// The live file or a rotated one with this inode (a glob's file).
    fn find(&self, inode: u64) -> Option<PathBuf> {
        if let Some(g) = &self.glob {
            let files = g.files();
            let (name, _) = files.iter().find(|(_, ino)| *ino == inode)?;
            return Some(g.dir.join(name));
        }
        std::iter::once(self.live.clone())
            .chain(self.rotated())
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.ino() == inode))
    }

    /// The file rotated in after the one with `inode`: `NAME.k-1` when it is `NAME.k`, the
    /// live file when it is `NAME.1` or gone.
    fn successor(&self, inode: u64) -> PathBuf {
        let rotated = self.rotated();
        match rotated
            .iter()
            .position(|p| std::fs::metadata(p).is_ok_and(|m| m.ino() == inode))
        {
            Some(k) if k > 0 => rotated[k - 1].clone(),
            _ => self.live.clone(),
        }
    }

    /// Writes the checkpoint durably: a temporary file, synced, renamed over the old one,
    /// the folder synced.
    fn save(&self, c: Checkpoint) -> Result<(), String> {
        let text = serde_json::to_vec(&c).map_err(|e| e.to_string())?;
        write_durably(&self.checkpoint_path, &text)?;
        self.published.set(c);
        Ok(())
    }
}

/// Replaces `path` with `bytes` so that a crash leaves the old or the new, never neither: a
/// temporary file, synced, renamed, the folder synced.
pub(super) fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let io = |e: std::io::Error| format!("{}: {e}", tmp.display());
    {
        let mut f = File::create(&tmp).map_err(io)?;
        std::io::Write::write_all(&mut f, bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

/// Hands `body`'s `lines` to the writer and waits until they are stored (synced).
pub(super) fn store_blocking(
    writer: &mpsc::Sender<WriterJob>,
    body: Vec<u8>,
    lines: Vec<Range<usize>>,
) -> Result<(), String> {
    let (reply, answer) = oneshot::channel();
    let job = IngestJob {
        body: bytes::Bytes::from(body),
        lines,
        reply,
    };
    writer
        .blocking_send(WriterJob::Ingest(job))
        .map_err(|_| "the writer is gone".to_string())?;
    answer
        .blocking_recv()
        .map_err(|_| "the writer is gone".to_string())?
        .map(drop)
        .map_err(|e| format!("cannot store: {e}"))
}

/// `path` opened at `offset`, or at its start when it is shorter than that (cut since, as by
/// copytruncate); `Ok(None)` when there is no such file.
fn open_at(path: &Path, offset: u64) -> Result<Option<Open>, String> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let offset = if meta.len() < offset { 0 } else { offset };
    Ok(Some(Open {
        file,
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        inode: meta.ino(),
        offset,
    }))
}

/// Whether the bytes of `file` from `from` to `to` hold a newline.
fn has_a_line(file: &File, from: u64, to: u64) -> Result<bool, String> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (to - from).min(READ_AT_MOST as u64) as usize];
    let n = file.read_at(&mut buf, from).map_err(|e| e.to_string())?;
    Ok(buf[..n].contains(&b'\n'))
}

/// Reads until `buf` is full or the file ends.
fn read_some(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The non-blank lines of `buf` (which ends in a newline), without their newline.
pub(super) fn lines_of(buf: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for line in buf.split_inclusive(|b| *b == b'\n') {
        let trimmed = line.trim_ascii();
        if !trimmed.is_empty() {
            let start = at + (line.len() - line.trim_ascii_start().len());
            out.push(start..start + trimmed.len());
        }
        at += line.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A writer stand-in that stores each job's lines and answers at once.
    fn writer() -> (mpsc::Sender<WriterJob>, std::sync::mpsc::Receiver<String>) {
        let (tx, mut rx) = mpsc::channel::<WriterJob>(16);
        let (lines_tx, lines_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Some(job) = rx.blocking_recv() {
                if let WriterJob::Ingest(j) = job {
                    for r in &j.lines {
                        let _ = lines_tx.send(String::from_utf8_lossy(&j.body[r.clone()]).into());
                    }
                    let _ = j.reply.send(Ok(0..j.lines.len() as u64));
                }
            }
        });
        (tx, lines_rx)
    }

    fn run_until_idle(t: &mut Tail) {
        for _ in 0..100 {
            if !t.step().unwrap() {
                return;
            }
        }
        panic!("the tail never went idle");
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn it_finishes_a_renamed_file_before_the_new_one_and_waits_for_a_half_line() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("app.log");
        let (tx, stored) = writer();
        let mut t = Tail::new(live.clone(), dir.path(), tx.clone());
        append(&live, "a\nb\nhal");
        run_until_idle(&mut t);
        // Rotated while two lines and the rest of a half line were unread.
        append(&live, "f\nc\n");
        std::fs::rename(&live, dir.path().join("app.log.1")).unwrap();
        append(&live, "d\n");
        run_until_idle(&mut t);
        let got: Vec<String> = stored.try_iter().collect();
        assert_eq!(got, ["a", "b", "half", "c", "d"]);
        // The checkpoint is in the new file, past its line.
        let c: Checkpoint =
            serde_json::from_slice(&std::fs::read(dir.path().join(CHECKPOINT_FILE)).unwrap())
                .unwrap();
        assert_eq!(c.inode, std::fs::metadata(&live).unwrap().ino());
        assert_eq!(c.offset, 2);
        // A restart resumes there: nothing read twice.
        append(&live, "e\n");
        let mut again = Tail::new(live.clone(), dir.path(), tx);
        run_until_idle(&mut again);
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["e"]);
    }

    /// The two tail mutants, on the same steps: what each loses.
    #[cfg(feature = "mutants")]
    #[test]
    fn the_tail_mutants_lose_what_they_should() {
        // Down while the file is renamed away: the name-follower skips the old file's rest.
        mutant::set_for_this_thread(Some(Mutant::SkipOnRotate));
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("app.log");
        let (tx, stored) = writer();
        let mut t = Tail::new(live.clone(), dir.path(), tx.clone());
        append(&live, "aaaa\nbbbb\n");
        run_until_idle(&mut t);
        drop(t);
        append(&live, "cccc\n");
        std::fs::rename(&live, dir.path().join("app.log.1")).unwrap();
        append(&live, "d\ne\nf\ng\nh\ni\nj\n");
        let mut again = Tail::new(live.clone(), dir.path(), tx.clone());
        run_until_idle(&mut again);
        let got: Vec<String> = stored.try_iter().collect();
        // Resumed in the new file at the old offset (10): `cccc` and `d`..`h` skipped.
        assert_eq!(got, ["aaaa", "bbbb", "i", "j"]);
        // A glob's next file begun while it was down: the same.
        let dir = tempfile::tempdir().unwrap();
        let glob = dir.path().join("app-*.log");
        let mut t = Tail::new(glob.clone(), dir.path(), tx.clone());
        append(&dir.path().join("app-1.log"), "aaaa\nbbbb\n");
        run_until_idle(&mut t);
        drop(t);
        append(&dir.path().join("app-1.log"), "cccc\n");
        append(&dir.path().join("app-2.log"), "d\ne\nf\ng\nh\ni\nj\n");
        let mut again = Tail::new(glob, dir.path(), tx.clone());
        run_until_idle(&mut again);
        let got: Vec<String> = stored.try_iter().collect();
        assert_eq!(got, ["aaaa", "bbbb", "i", "j"]);
        mutant::set_for_this_thread(None);
    }

    /// A glob's files, one after the other by name, each finished first; files that do not
    /// match are left alone; a restart resumes in the checkpoint's file though older ones
    /// were deleted meanwhile, and a name made again is read from its start.
    #[test]
    fn a_glob_is_read_file_by_file_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = |n: u32| dir.path().join(format!("app-{n:06}.log"));
        let (tx, stored) = writer();
        let mut t = Tail::new(dir.path().join("app-*.log"), dir.path(), tx.clone());
        run_until_idle(&mut t);
        append(&file(1), "a\nb\n");
        append(&dir.path().join("app-000001.log.gz"), "no\n");
        append(&dir.path().join("other.log"), "no\n");
        run_until_idle(&mut t);
        append(&file(1), "c\nhal");
        append(&file(2), "d\n");
        run_until_idle(&mut t);
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
        let c: Checkpoint =
            serde_json::from_slice(&std::fs::read(dir.path().join(CHECKPOINT_FILE)).unwrap())
                .unwrap();
        assert_eq!(c.inode, std::fs::metadata(file(2)).unwrap().ino());
        assert_eq!(c.offset, 2);
        assert_eq!(t.published.get(), Some(c), "/stats says what the file says");
        drop(t);
        append(&file(2), "e\n");
        append(&file(3), "f\n");
        std::fs::remove_file(file(1)).unwrap();
        let mut again = Tail::new(dir.path().join("app-*.log"), dir.path(), tx);
        run_until_idle(&mut again);
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["e", "f"]);
        // The live file deleted and made again under its name: the new one from its start.
        std::fs::remove_file(file(3)).unwrap();
        append(&file(3), "g\n");
        run_until_idle(&mut again);
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["g"]);
    }

    /// Lines appended and the file renamed between a read and the look at the name: read
    /// before the tail moves on.
    #[test]
    fn lines_appended_just_before_a_rename_are_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("app.log");
        let (tx, stored) = writer();
        let mut t = Tail::new(live.clone(), dir.path(), tx);
        append(&live, "a\n");
        run_until_idle(&mut t);
        append(&live, "b\nhal");
        std::fs::rename(&live, dir.path().join("app.log.1")).unwrap();
        append(&live, "c\n");
        // The race: the tail looks at the name before reading again.
        assert!(t.follow().unwrap(), "it must go back to read the old file");
        run_until_idle(&mut t);
        // The half line at the old file's end never got its newline.
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn a_cut_file_is_read_again_from_its_start_and_a_restart_finds_a_rotated_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("app.log");
        let (tx, stored) = writer();
        let mut t = Tail::new(live.clone(), dir.path(), tx.clone());
        append(&live, "one\ntwo\n");
        run_until_idle(&mut t);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&live)
            .unwrap()
            .set_len(0)
            .unwrap();
        append(&live, "x\n");
        run_until_idle(&mut t);
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["one", "two", "x"]);
        // Down while the file is renamed away and a new one written.
        drop(t);
        append(&live, "y\n");
        std::fs::rename(&live, dir.path().join("app.log.1")).unwrap();
        append(&live, "z\n");
        let mut again = Tail::new(live.clone(), dir.path(), tx);
        run_until_idle(&mut again);
        assert_eq!(stored.try_iter().collect::<Vec<_>>(), ["y", "z"]);
    }
}
