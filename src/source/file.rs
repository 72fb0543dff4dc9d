//! The file source: drill appends each record as one JSON line to a live file in
//! `{work_dir}/source/` and fsyncs it before counting it held, rotates the file as logrotate
//! does (`rename`, or `copytruncate` with nothing written between the copy and the cut), and
//! carries out the source faults: `rotate`, `truncate`, `delete` (a new file takes the name)
//! and `stall` (one line written in two `write()` calls, the second `for` later, nothing else
//! written meanwhile). A name with a `*` (`app-*.log`) is a glob the engine follows: drill
//! names each file by putting its number (`000001`, `000002`, …) in place of the `*`, and a
//! rotation (`create`) starts the next file, leaving the old one under its name until it falls
//! off `keep`.
//!
//! Every line's place is kept (its file generation and byte range), so that what drill removes
//! or cuts can be split into what the engine had read and what it had not. The engine's read
//! position is sampled from `/proc` ([`super::position`]): the furthest seen per file
//! generation. A record in a range drill destroyed beyond that position is **destroyed by the
//! source fault** — its own ledger line, never "lost" — unless it reaches the destination
//! anyway (then the engine had read it after all).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::position::{EngineProcs, read_positions};
use crate::scenario::source::{FileSpec, RotateEvery, RotateMode, SourceAction};
use crate::workload::{IngestAnswer, Record};

/// A file drill writes the records to, shared by the workload (which writes) and the
/// timeline (which rotates, cuts and removes).
#[derive(Clone)]
pub struct FileSource {
    inner: Arc<Mutex<Inner>>,
}

/// Where one record's line is: which file generation, which bytes.
#[derive(Debug, Clone)]
struct Span {
    generation: usize,
    start: u64,
    end: u64,
    id: String,
}

struct Inner {
    dir: PathBuf,
    /// The name as the scenario gives it: a plain name, or a glob with one `*`.
    name: String,
    /// The live file's number, where `name` is a glob.
    number: u32,
    mode: RotateMode,
    keep: u32,
    every: Option<RotateEvery>,
    last_rotation: Instant,
    live: File,
    /// The live file's generation (an index into `generations`).
    live_generation: usize,
    live_len: u64,
    dev: u64,
    /// Each file generation's inode, in the order drill created them; a file cut to zero
    /// starts a new generation on the same inode.
    generations: Vec<u64>,
    /// Each generation's file name when it began (a glob's files keep theirs).
    names: Vec<String>,
    /// How many bytes each generation got.
    written: Vec<u64>,
    /// Where each generation is now: `None` once deleted or cut.
    alive: Vec<bool>,
    /// The furthest read position the engine was seen at, per generation.
    read: Vec<u64>,
    spans: Vec<Span>,
    engine: EngineProcs,
    /// A `stall` waiting for the next write.
    stall: Option<Duration>,
    account: SourceAccount,
}

/// What the source did, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceAccount {
    /// Records in a file drill removed or cut before the engine had read them.
    pub destroyed: BTreeSet<String>,
    pub rotations: u32,
    pub truncations: u32,
    pub deletions: u32,
    pub stalls: u32,
    /// Each source event, with the time the caller gave and what it destroyed.
    pub events: Vec<String>,
}

impl FileSource {
    /// Creates `{work}/source/` and the empty live file.
    pub fn create(work: &Path, spec: &FileSpec) -> std::io::Result<FileSource> {
        let dir = work.join(crate::scenario::source::SOURCE_DIR);
        std::fs::create_dir_all(&dir)?;
        let first = numbered(&spec.name, 1);
        let live_path = dir.join(&first);
        let live = open_new(&live_path)?;
        let meta = live.metadata()?;
        sync_dir(&dir)?;
        let (mode, keep, every) = match &spec.rotate {
            Some(r) => (r.mode, r.keep, Some(r.every)),
            None if spec.name.contains('*') => (RotateMode::Create, 5, None),
            None => (RotateMode::Rename, 5, None),
        };
        Ok(FileSource {
            inner: Arc::new(Mutex::new(Inner {
                dir,
                name: spec.name.clone(),
                number: 1,
                mode,
                keep,
                every,
                last_rotation: Instant::now(),
                live,
                live_generation: 0,
                live_len: 0,
                dev: meta.dev(),
                generations: vec![meta.ino()],
                names: vec![first],
                written: vec![0],
                alive: vec![true],
                read: vec![0],
                spans: Vec::new(),
                engine: EngineProcs::default(),
                stall: None,
                account: SourceAccount::default(),
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The live file's path (what `{ingest.path}` names, unless the name is a glob: then the
    /// glob).
    pub fn live_path(&self) -> PathBuf {
        self.lock().live_path()
    }

    /// Which processes are the engine now (it changes at every restart); samples where they
    /// are in the source's files.
    pub fn watch(&self, engine: EngineProcs) {
        let mut s = self.lock();
        s.engine = engine;
        s.sample();
    }

    /// Appends `records` (one JSON line each) and fsyncs; one answer per record: held once
    /// synced. A write that fails leaves what it covered unknown.
    pub async fn write(&self, records: &[Record]) -> Vec<IngestAnswer> {
        let lines: Vec<Vec<u8>> = records
            .iter()
            .map(|r| {
                let mut l = serde_json::to_vec(r).unwrap_or_default();
                l.push(b'\n');
                l
            })
            .collect();
        let stall = self.lock().stall.take();
        if let (Some(pause), Some(first)) = (stall, lines.first()) {
            // One line in two write() calls, the second `pause` later.
            let half = first.len() / 2;
            let begun = {
                let mut s = self.lock();
                s.account.stalls += 1;
                s.append(&first[..half])
                    .map(|start| (start, s.live_generation))
            };
            let Ok((start, generation)) = begun else {
                return vec![IngestAnswer::Unknown; lines.len()];
            };
            tokio::time::sleep(pause).await;
            let mut s = self.lock();
            if s.live_generation != generation {
                // The file was rotated or cut meanwhile: the half line stays where it was.
                return s.write_lines(records, &lines);
            }
            let end = match s.append(&first[half..]) {
                Ok(at) => at + (first.len() - half) as u64,
                Err(_) => return vec![IngestAnswer::Unknown; lines.len()],
            };
            s.spans.push(Span {
                generation,
                start,
                end,
                id: records[0].id.clone(),
            });
            let mut answers = vec![IngestAnswer::Accepted(None)];
            answers.extend(s.write_lines(&records[1..], &lines[1..]));
            return answers;
        }
        self.lock().write_lines(records, &lines)
    }

    /// Carries out a source fault now; says what it did.
    pub fn fault(&self, action: SourceAction) -> std::io::Result<String> {
        let mut s = self.lock();
        s.sample();
        match action {
            SourceAction::Rotate => {
                let mode = s.mode;
                s.rotate(mode)
            }
            SourceAction::Truncate => s.truncate_live("truncated"),
            SourceAction::Delete => s.delete_live(),
            SourceAction::Stall(d) => {
                s.stall = Some(d);
                Ok(format!(
                    "the next line is written in two write() calls, {} apart",
                    crate::units::Dur(d)
                ))
            }
        }
    }

    /// Whether the engine has read to the end of every file of the source it holds open
    /// (sampled now). An engine that holds none open at this instant cannot be told: yes.
    pub fn read_to_end(&self, engine: EngineProcs) -> bool {
        let mut s = self.lock();
        s.engine = engine;
        // Every file it has open, a rotated one too (a rotation right after the last write
        // leaves the live file empty while the old one is being finished). One it closed is
        // done with, read to the end or not: that is the engine's business, counted as lost.
        let open = s.sample();
        open.iter().all(|g| s.read[*g] >= s.written[*g])
    }

    /// Lines of the files still there that end beyond where the engine was last seen in them.
    pub fn unread_records(&self) -> u64 {
        let s = self.lock();
        (0..s.generations.len())
            .filter(|g| s.alive[*g])
            .map(|g| s.unread(g) as u64)
            .sum()
    }

    /// What the source did so far.
    pub fn account(&self) -> SourceAccount {
        self.lock().account.clone()
    }

    /// The ids of the records a checkpoint at `offset` in the file `inode` (the live file's
    /// when `None`) has passed: every record of an earlier file generation, and those of its
    /// own that end at or before the offset. `None` when drill never wrote that inode.
    pub fn passed_by(&self, inode: Option<u64>, offset: u64) -> Option<BTreeSet<String>> {
        let s = self.lock();
        let generation = match inode {
            None => s.live_generation,
            Some(ino) => s.generations.iter().rposition(|i| *i == ino)?,
        };
        Some(
            s.spans
                .iter()
                .filter(|sp| {
                    sp.generation < generation || (sp.generation == generation && sp.end <= offset)
                })
                .map(|sp| sp.id.clone())
                .collect(),
        )
    }
}

impl FileSource {
    /// Whether drill wrote a file with this inode.
    pub fn wrote_inode(&self, inode: u64) -> bool {
        self.lock().generations.contains(&inode)
    }

    /// The ids of the records of the file `inode` (its latest generation) that end at or
    /// before `offset`: what a per-file checkpoint has passed. `None` when drill never wrote
    /// that inode.
    pub fn passed_in(&self, inode: u64, offset: u64) -> Option<BTreeSet<String>> {
        let s = self.lock();
        let generation = s.generations.iter().rposition(|i| *i == inode)?;
        Some(
            s.spans
                .iter()
                .filter(|sp| sp.generation == generation && sp.end <= offset)
                .map(|sp| sp.id.clone())
                .collect(),
        )
    }
}

impl Inner {
    fn live_path(&self) -> PathBuf {
        self.dir.join(&self.names[self.live_generation])
    }

    fn rotated_path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("{}.{n}", self.name))
    }

    /// Reads where the engine is; a position beyond what a generation got is from an engine
    /// that has not yet seen its file cut, and is passed over. The generations it holds open.
    fn sample(&mut self) -> Vec<usize> {
        if self.engine.pid.is_none() && self.engine.group.is_none() {
            return Vec::new();
        }
        let seen = read_positions(self.engine, self.dev);
        let mut open = Vec::new();
        for (ino, pos) in seen {
            let Some(g) = self.generations.iter().rposition(|i| *i == ino) else {
                continue;
            };
            open.push(g);
            if self.alive[g] && pos <= self.written[g] {
                self.read[g] = self.read[g].max(pos);
            }
        }
        open
    }

    /// Appends bytes to the live file and fsyncs; returns where they start.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<u64> {
        let start = self.live_len;
        let done = self
            .live
            .write_all(bytes)
            .and_then(|()| self.live.sync_data());
        if let Err(e) = done {
            // Some of it may be in the file: the offsets go on from what is there.
            self.live_len = self.live.metadata().map_or(self.live_len, |m| m.len());
            self.written[self.live_generation] = self.live_len;
            return Err(e);
        }
        self.live_len += bytes.len() as u64;
        self.written[self.live_generation] = self.live_len;
        Ok(start)
    }

    fn write_lines(&mut self, records: &[Record], lines: &[Vec<u8>]) -> Vec<IngestAnswer> {
        if let Some(RotateEvery::Time(every)) = self.every
            && self.last_rotation.elapsed() >= every
        {
            let mode = self.mode;
            if let Err(e) = self.rotate(mode) {
                eprintln!("drill: cannot rotate the source file: {e}");
            }
        }
        let body: Vec<u8> = lines.concat();
        let Ok(mut at) = self.append(&body) else {
            return vec![IngestAnswer::Unknown; lines.len()];
        };
        for (r, l) in records.iter().zip(lines) {
            let end = at + l.len() as u64;
            self.spans.push(Span {
                generation: self.live_generation,
                start: at,
                end,
                id: r.id.clone(),
            });
            at = end;
        }
        if let Some(RotateEvery::Bytes(n)) = self.every
            && self.live_len >= n
        {
            let mode = self.mode;
            if let Err(e) = self.rotate(mode) {
                eprintln!("drill: cannot rotate the source file: {e}");
            }
        }
        vec![IngestAnswer::Accepted(None); lines.len()]
    }

    /// Lines of `generation` that end beyond where the engine was last seen in it.
    fn unread(&self, generation: usize) -> usize {
        let read = self.read[generation];
        self.spans
            .iter()
            .filter(|sp| sp.generation == generation && sp.end > read)
            .count()
    }

    /// Marks the records of `generation` at or past `from` that the engine had not read as
    /// destroyed; the generation is gone.
    fn destroy(&mut self, generation: usize, from: u64) -> usize {
        self.alive[generation] = false;
        let read = self.read[generation];
        let mut n = 0;
        for sp in self.spans.iter().filter(|sp| sp.generation == generation) {
            if sp.start >= from && sp.end > read && self.account.destroyed.insert(sp.id.clone()) {
                n += 1;
            }
        }
        n
    }

    /// Shifts `NAME.1` … to `NAME.2` …, deleting the one past `keep`; returns what that
    /// destroyed.
    fn shift(&mut self) -> std::io::Result<usize> {
        let mut destroyed = 0;
        let oldest = self.rotated_path(self.keep);
        if let Ok(meta) = std::fs::metadata(&oldest) {
            if let Some(g) = self.generation_of(meta.ino()) {
                destroyed += self.destroy(g, 0);
            }
            std::fs::remove_file(&oldest)?;
        }
        for n in (1..self.keep).rev() {
            let from = self.rotated_path(n);
            if from.exists() {
                std::fs::rename(&from, self.rotated_path(n + 1))?;
            }
        }
        Ok(destroyed)
    }

    fn generation_of(&self, ino: u64) -> Option<usize> {
        let g = self.generations.iter().rposition(|i| *i == ino)?;
        self.alive[g].then_some(g)
    }

    fn rotate(&mut self, mode: RotateMode) -> std::io::Result<String> {
        // Where the engine is, now: a rotation of `every` comes from a write, not the timeline.
        self.sample();
        self.last_rotation = Instant::now();
        self.account.rotations += 1;
        if mode == RotateMode::Create {
            return self.rotate_create();
        }
        let destroyed = self.shift()?;
        let live = self.live_path();
        let first = self.rotated_path(1);
        let what = match mode {
            RotateMode::Rename => {
                let unread = self.unread(self.live_generation);
                std::fs::rename(&live, &first)?;
                self.new_live()?;
                format!(
                    "rotated (rename): {} → {}, {unread} of its lines not yet read by the engine",
                    self.name,
                    file_name(&first)
                )
            }
            RotateMode::Create => unreachable!("a glob's rotation is rotate_create's"),
            RotateMode::Copytruncate => {
                std::fs::copy(&live, &first)?;
                File::open(&first)?.sync_all()?;
                let cut = self.truncate_live("cut after its copy")?;
                format!(
                    "rotated (copytruncate): copied to {}; {cut}",
                    file_name(&first)
                )
            }
        };
        sync_dir(&self.dir)?;
        let what = match destroyed {
            0 => what,
            n => format!(
                "{what}; {} deleted past keep {}, {n} records in it unread",
                file_name(&self.rotated_path(self.keep)),
                self.keep
            ),
        };
        self.account.events.push(what.clone());
        Ok(what)
    }

    /// A glob's rotation: the next-numbered file becomes the live one, the old one stays
    /// under its name; the oldest files beyond `keep` are deleted.
    fn rotate_create(&mut self) -> std::io::Result<String> {
        let old = self.names[self.live_generation].clone();
        let unread = self.unread(self.live_generation);
        self.number += 1;
        let name = numbered(&self.name, self.number);
        let live = open_new(&self.dir.join(&name))?;
        let ino = live.metadata()?.ino();
        self.live = live;
        self.start_generation(ino, name.clone());
        // The files still there besides the live one, oldest first (of a name cut, or deleted
        // and made again, only the latest generation is alive).
        let mut kept: Vec<usize> = (0..self.live_generation)
            .filter(|g| self.alive[*g])
            .collect();
        let mut destroyed = 0;
        let mut gone = Vec::new();
        while kept.len() > self.keep as usize {
            let g = kept.remove(0);
            std::fs::remove_file(self.dir.join(&self.names[g]))?;
            destroyed += self.destroy(g, 0);
            gone.push(self.names[g].clone());
        }
        sync_dir(&self.dir)?;
        let mut what = format!(
            "rotated (create): {name} begun after {old}, {unread} of its lines not yet read by the engine"
        );
        if !gone.is_empty() {
            what.push_str(&format!(
                "; {} deleted past keep {}, {destroyed} records in it unread",
                gone.join(", "),
                self.keep
            ));
        }
        self.account.events.push(what.clone());
        Ok(what)
    }

    /// Cuts the live file to zero length: a new generation on the same inode.
    fn truncate_live(&mut self, why: &str) -> std::io::Result<String> {
        let old = self.live_generation;
        self.live.set_len(0)?;
        // The engine can read no more of what was there: its position now is its last.
        self.sample();
        self.live.sync_all()?;
        let n = self.destroy(old, 0);
        let ino = self.generations[old];
        let name = self.names[old].clone();
        self.start_generation(ino, name);
        self.account.truncations += 1;
        let what = format!("{} {why}: {n} records in it unread", self.names[old]);
        if why == "truncated" {
            self.account.events.push(what.clone());
        }
        Ok(what)
    }

    fn delete_live(&mut self) -> std::io::Result<String> {
        let old = self.live_generation;
        self.sample();
        std::fs::remove_file(self.live_path())?;
        let n = self.destroy(old, 0);
        self.new_live()?;
        sync_dir(&self.dir)?;
        self.account.deletions += 1;
        let reused = if self.generations[self.live_generation] == self.generations[old] {
            " (the new file got the old one's inode)"
        } else {
            ""
        };
        let what = format!(
            "{} deleted and created again{reused}: {n} records in it unread",
            self.names[old]
        );
        self.account.events.push(what.clone());
        Ok(what)
    }

    fn new_live(&mut self) -> std::io::Result<()> {
        let path = self.live_path();
        let live = open_new(&path)?;
        let ino = live.metadata()?.ino();
        self.live = live;
        self.start_generation(ino, file_name(&path));
        Ok(())
    }

    fn start_generation(&mut self, ino: u64, name: String) {
        self.generations.push(ino);
        self.names.push(name);
        self.written.push(0);
        self.alive.push(true);
        self.read.push(0);
        self.live_generation = self.generations.len() - 1;
        self.live_len = 0;
    }
}

/// The file name of a glob's `number`th file (`app-*.log` → `app-000002.log`); a plain name
/// as it is.
fn numbered(name: &str, number: u32) -> String {
    name.replacen('*', &format!("{number:06}"), 1)
}

/// Creates a file for appending (an existing one is cut). O_APPEND: after the file is cut to
/// zero, the next write lands at its new end, not at the old offset behind a hole.
fn open_new(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    file.set_len(0)?;
    Ok(file)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Count of records by generation, for tests.
#[cfg(test)]
fn by_generation(s: &FileSource) -> std::collections::HashMap<usize, usize> {
    let mut out = std::collections::HashMap::new();
    for sp in &s.lock().spans {
        *out.entry(sp.generation).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::source::Rotate;
    use std::io::Read;

    fn records(from: u64, n: u64) -> Vec<Record> {
        (from..from + n)
            .map(|i| Record {
                id: format!("r/k0/{i}"),
                key: "k0".to_string(),
                seq: i,
                index: i,
                pad: "abc".to_string(),
            })
            .collect()
    }

    fn spec(rotate: Option<Rotate>) -> FileSpec {
        FileSpec {
            name: "app.log".to_string(),
            rotate,
            checkpoint: None,
        }
    }

    fn me() -> EngineProcs {
        EngineProcs {
            pid: Some(std::process::id()),
            group: None,
        }
    }

    #[tokio::test]
    async fn what_the_reader_had_not_read_when_the_file_was_cut_is_destroyed() {
        let dir = tempfile::tempdir().unwrap();
        let src = FileSource::create(dir.path(), &spec(None)).unwrap();
        let answers = src.write(&records(0, 10)).await;
        assert!(answers.iter().all(|a| *a == IngestAnswer::Accepted(None)));
        // A reader takes the first 4 lines, and no byte more.
        let text = std::fs::read_to_string(src.live_path()).unwrap();
        let four: usize = text.split_inclusive('\n').take(4).map(str::len).sum();
        let mut reader = File::open(src.live_path()).unwrap();
        let mut buf = vec![0u8; four];
        reader.read_exact(&mut buf).unwrap();
        src.watch(me());
        assert_eq!(src.lock().read[0], four as u64);
        assert!(!src.read_to_end(me()), "6 lines unread");
        drop(reader);
        assert!(src.read_to_end(me()), "no file open: cannot be told");
        let said = src.fault(SourceAction::Truncate).unwrap();
        assert_eq!(src.account().destroyed.len(), 6, "{said}");
        assert!(said.contains("6 records in it unread"), "{said}");
        assert!(!src.account().destroyed.contains("r/k0/3"));
        // New lines go to a new generation from offset 0: the file holds them alone, no hole.
        src.write(&records(10, 2)).await;
        let text = std::fs::read_to_string(src.live_path()).unwrap();
        assert!(text.starts_with("{\"id\":\"r/k0/10\""), "{text:?}");
        assert_eq!(text.lines().count(), 2);
        assert_eq!(by_generation(&src).get(&1), Some(&2));
    }

    #[tokio::test]
    async fn rename_rotation_keeps_the_old_file_until_it_falls_off_keep() {
        let dir = tempfile::tempdir().unwrap();
        let rotate = Rotate {
            every: RotateEvery::Bytes(1 << 30),
            mode: RotateMode::Rename,
            keep: 2,
        };
        let src = FileSource::create(dir.path(), &spec(Some(rotate))).unwrap();
        src.write(&records(0, 3)).await;
        src.fault(SourceAction::Rotate).unwrap();
        src.write(&records(3, 3)).await;
        src.fault(SourceAction::Rotate).unwrap();
        assert!(src.account().destroyed.is_empty());
        let folder = dir.path().join("source");
        let mut text = String::new();
        File::open(folder.join("app.log.2"))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert!(
            text.contains("r/k0/0") && !text.contains("r/k0/3"),
            "{text}"
        );
        // The third rotation deletes app.log.2: its 3 records, never read, are destroyed.
        src.write(&records(6, 3)).await;
        let said = src.fault(SourceAction::Rotate).unwrap();
        assert!(said.contains("3 records in it unread"), "{said}");
        assert_eq!(src.account().destroyed.len(), 3);
        // A checkpoint in the second file at its end has passed the first 6.
        let ino = std::fs::metadata(folder.join("app.log.2")).unwrap().ino();
        let passed = src.passed_by(Some(ino), 1 << 20).unwrap();
        assert_eq!(passed.len(), 6);
        assert_eq!(src.passed_by(Some(1), 0), None);
    }

    /// A glob's files are numbered in place of the `*`; a rotation begins the next, the old
    /// one keeps its name until it falls off `keep`; a delete makes the live name again.
    #[tokio::test]
    async fn a_globs_files_are_numbered_and_the_oldest_fall_off_keep() {
        let dir = tempfile::tempdir().unwrap();
        let spec = FileSpec {
            name: "app-*.log".to_string(),
            rotate: None,
            checkpoint: None,
        };
        let src = FileSource::create(dir.path(), &spec).unwrap();
        let folder = dir.path().join("source");
        assert_eq!(src.live_path(), folder.join("app-000001.log"));
        src.write(&records(0, 3)).await;
        let said = src.fault(SourceAction::Rotate).unwrap();
        assert!(
            said.starts_with("rotated (create): app-000002.log begun after app-000001.log, 3 of its lines not yet read"),
            "{said}"
        );
        src.write(&records(3, 2)).await;
        for _ in 0..4 {
            src.fault(SourceAction::Rotate).unwrap();
        }
        // Live app-000006 and five before it: keep 5, nothing deleted yet.
        assert!(folder.join("app-000001.log").exists());
        assert!(src.account().destroyed.is_empty());
        let said = src.fault(SourceAction::Rotate).unwrap();
        assert!(
            said.ends_with("app-000001.log deleted past keep 5, 3 records in it unread"),
            "{said}"
        );
        assert!(!folder.join("app-000001.log").exists());
        assert_eq!(src.account().destroyed.len(), 3);
        // A checkpoint at the second file's end has passed all five records.
        let ino = std::fs::metadata(folder.join("app-000002.log"))
            .unwrap()
            .ino();
        assert_eq!(src.passed_by(Some(ino), 1 << 20).unwrap().len(), 5);
        // Deleted and made again: the same name, the next generation.
        src.write(&records(5, 1)).await;
        let said = src.fault(SourceAction::Delete).unwrap();
        assert!(
            said.starts_with("app-000007.log deleted and created again"),
            "{said}"
        );
        assert_eq!(src.live_path(), folder.join("app-000007.log"));
        assert_eq!(src.account().destroyed.len(), 4);
    }

    #[tokio::test]
    async fn copytruncate_leaves_the_lines_in_the_copy_and_a_stall_splits_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let rotate = Rotate {
            every: RotateEvery::Bytes(1 << 30),
            mode: RotateMode::Copytruncate,
            keep: 3,
        };
        let src = FileSource::create(dir.path(), &spec(Some(rotate))).unwrap();
        src.write(&records(0, 4)).await;
        src.fault(SourceAction::Rotate).unwrap();
        let folder = dir.path().join("source");
        assert_eq!(std::fs::metadata(folder.join("app.log")).unwrap().len(), 0);
        let copy = std::fs::read_to_string(folder.join("app.log.1")).unwrap();
        assert_eq!(copy.lines().count(), 4);
        // Nobody read the live file: its 4 lines count as destroyed unless they arrive.
        assert_eq!(src.account().destroyed.len(), 4);
        src.fault(SourceAction::Stall(Duration::from_millis(300)))
            .unwrap();
        let t = Instant::now();
        let writer = {
            let src = src.clone();
            tokio::spawn(async move { src.write(&records(4, 2)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let half = std::fs::read_to_string(folder.join("app.log")).unwrap();
        assert!(!half.is_empty() && !half.ends_with('\n'), "{half:?}");
        let answers = writer.await.unwrap();
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!(answers.len(), 2);
        let whole = std::fs::read_to_string(folder.join("app.log")).unwrap();
        assert_eq!(whole.lines().count(), 2);
        assert!(whole.ends_with('\n'));
    }
}
