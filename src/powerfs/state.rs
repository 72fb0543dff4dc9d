//! The filesystem's state and every operation on it, without FUSE: which inode is which path
//! under the backing directory, each file's [`Pending`] changes, the listings of open
//! directories, and whether the disk is "full". The FUSE adapter (`ops.rs`) only unpacks a
//! request, calls one method here under the lock and replies; so this is where the semantics of
//! the module doc live, and they are tested here on a plain directory.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{
    DirBuilderExt, DirEntryExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;

use super::dirents::{self, Change, DirentLog, Replaced, Undone};
use super::pending::Pending;
use super::{Crash, CrashOp, CrashPoint, CutReport, Dirents, IoFailed, IoFault, IoOp};

/// The sector a torn write is torn at: the smallest unit a disk writes whole.
const SECTOR: u64 = 512;

/// The root directory's inode number (FUSE's fixed one).
pub(crate) const ROOT: u64 = 1;

/// The filesystem, as the FUSE thread and [`super::PowerFs`] share it behind one mutex.
pub(crate) struct State {
    /// The real directory; every path below is relative to it.
    backing: PathBuf,
    /// Every inode the kernel may name, and every inode still holding pending changes.
    nodes: HashMap<u64, Node>,
    /// The inverse of `Node::path` for inodes that still have a name.
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    /// Open directories' entries, snapshotted at opendir so readdir offsets stay stable.
    listings: HashMap<u64, Vec<Listed>>,
    next_listing: u64,
    /// `fill()`: no byte of new space from now on.
    full: bool,
    /// A crash point waiting for its operation, with the matching operations seen so far.
    armed: Option<(CrashPoint, u64)>,
    /// The crash a crash point caused, until the owner takes it.
    crash: Option<Crash>,
    /// Power is off (a crash point fired): every change fails with EIO until revived.
    dead: bool,
    /// I/O faults in force, with the matching operations each has seen.
    io_faults: Vec<(IoFault, u64)>,
    /// Operations an I/O fault failed, and the unsynced writes failed fsyncs dropped.
    pub(crate) io_failed: IoFailed,
    /// Woken when a crash point fires.
    pub(crate) crashed: std::sync::Arc<tokio::sync::Notify>,
    /// Directory changes a cut may forget, when a cut of the drill forgets any.
    dirents: Option<DirentLog>,
}

/// One inode.
#[derive(Default)]
struct Node {
    /// Its path relative to the backing directory; `None` once unlinked or replaced by a rename
    /// (it may still be open).
    path: Option<PathBuf>,
    /// The kernel's lookup count: the node may be forgotten when it reaches 0.
    lookups: u64,
    /// Open file handles on it.
    opens: u64,
    /// The backing file, held while the file is open (so an unlinked open file keeps working).
    file: Option<File>,
    /// Data changes not yet made durable.
    pending: Pending,
}

/// One directory entry as readdir hands it out.
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    pub(crate) ino: u64,
    pub(crate) kind: FileType,
    pub(crate) name: OsString,
}

/// The requested changes of a setattr.
#[derive(Default)]
pub(crate) struct AttrChange {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<TimeOrNow>,
    pub(crate) mtime: Option<TimeOrNow>,
}

/// statfs numbers, in the order FUSE's reply takes them.
pub(crate) struct Space {
    pub(crate) blocks: u64,
    pub(crate) bfree: u64,
    pub(crate) bavail: u64,
    pub(crate) files: u64,
    pub(crate) ffree: u64,
    pub(crate) bsize: u32,
    pub(crate) namelen: u32,
    pub(crate) frsize: u32,
}

/// Who asked: new files and directories belong to the caller, as on a real filesystem.
#[derive(Clone, Copy)]
pub(crate) struct Caller {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

fn errno(e: io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
}

fn nix_errno(e: nix::errno::Errno) -> Errno {
    Errno::from_i32(e as i32)
}

fn time_of(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = nsecs.clamp(0, 999_999_999) as u32;
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::new(0, nsecs)
    }
}

fn timespec(t: Option<TimeOrNow>) -> TimeSpec {
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
        Some(TimeOrNow::SpecificTime(t)) => {
            TimeSpec::from_duration(t.duration_since(UNIX_EPOCH).unwrap_or_default())
        }
    }
}

/// The attributes a reader sees: the backing file's, with the pending changes' size and mtime.
fn attr_of(ino: u64, meta: &Metadata, pending: &Pending) -> FileAttr {
    let kind = FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile);
    let size = if kind == FileType::RegularFile {
        pending.size_over(meta.len())
    } else {
        meta.len()
    };
    let blocks = if pending.is_empty() {
        meta.blocks()
    } else {
        meta.blocks().max(size.div_ceil(512))
    };
    let mtime = time_of(meta.mtime(), meta.mtime_nsec());
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks,
        atime: time_of(meta.atime(), meta.atime_nsec()),
        mtime: pending.touched().map_or(mtime, |t| t.max(mtime)),
        ctime: time_of(meta.ctime(), meta.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        blksize: meta.blksize() as u32,
        flags: 0,
    }
}

/// Opens a backing file for the filesystem's own reads and writes: read-write when allowed,
/// read-only otherwise (a held write then fails at fsync, as on a read-only disk).
fn open_backing(path: &Path) -> io::Result<File> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => Ok(f),
        Err(e) if matches!(e.raw_os_error(), Some(13 | 30 | 1)) => File::open(path),
        Err(e) => Err(e),
    }
}

/// Where `path` lands when `from` is renamed to `to`: `None` when it is not `from` or below it.
fn moved(path: &Path, from: &Path, to: &Path) -> Option<PathBuf> {
    let rest = path.strip_prefix(from).ok()?;
    // `join("")` would add a trailing slash, which names a directory.
    Some(if rest.as_os_str().is_empty() {
        to.to_path_buf()
    } else {
        to.join(rest)
    })
}

/// Reads `buf.len()` bytes at `offset`, leaving zeros past the end of the file.
fn read_upto(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl State {
    pub(crate) fn new(backing: PathBuf) -> State {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                path: Some(PathBuf::new()),
                lookups: 1,
                ..Node::default()
            },
        );
        let mut by_path = HashMap::new();
        by_path.insert(PathBuf::new(), ROOT);
        State {
            backing,
            nodes,
            by_path,
            next_ino: ROOT + 1,
            listings: HashMap::new(),
            next_listing: 1,
            full: false,
            armed: None,
            crash: None,
            dead: false,
            io_faults: Vec::new(),
            io_failed: IoFailed::default(),
            crashed: std::sync::Arc::new(tokio::sync::Notify::new()),
            dirents: None,
        }
    }

    /// Logs directory changes from now on, so that a cut can forget those `strictest` (the
    /// strictest model any cut will use) does not keep.
    pub(crate) fn track_dirents(&mut self, strictest: Dirents) -> io::Result<()> {
        if self.dirents.is_some() {
            return Ok(());
        }
        self.dirents = Some(DirentLog::new(&self.backing, strictest)?);
        Ok(())
    }

    /// Directory changes logged and not yet durable.
    pub(crate) fn dirents_pending(&self) -> usize {
        self.dirents.as_ref().map_or(0, DirentLog::pending)
    }

    fn log_change(&mut self, change: Change) {
        if let Some(log) = &mut self.dirents {
            log.record(change);
        }
    }

    /// Cuts power at the `nth` matching operation from now on.
    pub(crate) fn arm(&mut self, point: CrashPoint) {
        self.armed = Some((point, 0));
    }

    /// Disarms; whether a crash point was still waiting.
    pub(crate) fn disarm(&mut self) -> bool {
        self.armed.take().is_some()
    }

    /// Whether a crash point fired and its crash was not taken yet.
    pub(crate) fn has_crash(&self) -> bool {
        self.crash.is_some()
    }

    /// The crash a crash point caused, once.
    pub(crate) fn take_crash(&mut self) -> Option<Crash> {
        self.crash.take()
    }

    /// Power back after a crash point fired: changes are taken again.
    pub(crate) fn revive(&mut self) {
        self.dead = false;
    }

    /// EIO while the power is off.
    fn alive(&self) -> Result<(), Errno> {
        if self.dead { Err(Errno::EIO) } else { Ok(()) }
    }

    /// Counts `op` on file `ino` against the armed crash point; at its `nth`, cuts power
    /// (before the operation takes effect) and answers EIO, as a disk that lost power does.
    fn crash_point(&mut self, ino: u64, op: CrashOp) -> Result<(), Errno> {
        self.alive()?;
        let path = self.nodes.get(&ino).and_then(|n| n.path.as_deref());
        let Some((point, seen)) = &self.armed else {
            return Ok(());
        };
        if point.op != op || !path.is_some_and(|p| point.matches(p)) {
            return Ok(());
        }
        let seen = seen + 1;
        let Some((point, _)) = self.armed.take() else {
            return Ok(());
        };
        if seen < point.nth {
            self.armed = Some((point, seen));
            return Ok(());
        }
        let cut = self.power_cut(point.torn, point.dirents);
        self.dead = true;
        self.crash = Some(Crash {
            at: std::time::Instant::now(),
            point,
            cut,
        });
        self.crashed.notify_one();
        Err(Errno::EIO)
    }

    /// Puts an I/O fault in force (beside any already in force).
    pub(crate) fn inject(&mut self, fault: IoFault) {
        self.io_faults.push((fault, 0));
    }

    /// Ends every I/O fault in force.
    pub(crate) fn clear_io_faults(&mut self) {
        self.io_faults.clear();
    }

    /// Ends one I/O fault (the first in force equal to `fault`).
    pub(crate) fn remove_io_fault(&mut self, fault: &IoFault) {
        if let Some(i) = self.io_faults.iter().position(|(f, _)| f == fault) {
            self.io_faults.remove(i);
        }
    }

    /// Counts `op` on the file at `rel` against the I/O faults in force; the error of the
    /// first that fails it.
    fn io_fault(&mut self, rel: Option<&Path>, op: IoOp) -> Result<(), Errno> {
        let Some(rel) = rel else { return Ok(()) };
        for (fault, seen) in &mut self.io_faults {
            let super::IoEffect::Error(errno) = fault.effect else {
                continue;
            };
            if fault.op != op || !fault.matches(rel) {
                continue;
            }
            *seen += 1;
            if fault.nth.is_none_or(|n| n == *seen) {
                self.io_failed.operations += 1;
                return Err(match errno {
                    super::IoErrno::Eio => Errno::EIO,
                    super::IoErrno::Enospc => Errno::ENOSPC,
                    super::IoErrno::Erofs => Errno::from_i32(nix::errno::Errno::EROFS as i32),
                });
            }
        }
        Ok(())
    }

    /// How long the answer to `op` on file `ino` is held back by the `slow` faults in force
    /// (the longest, when several match); counted against their `nth`.
    pub(crate) fn delay_on(&mut self, ino: u64, op: IoOp) -> Option<std::time::Duration> {
        let rel = self.nodes.get(&ino).and_then(|n| n.path.clone())?;
        let mut longest = None;
        for (fault, seen) in &mut self.io_faults {
            let super::IoEffect::Slow(delay) = fault.effect else {
                continue;
            };
            if fault.op != op || !fault.matches(&rel) {
                continue;
            }
            *seen += 1;
            if fault.nth.is_none_or(|n| n == *seen) {
                longest = longest.max(Some(delay));
            }
        }
        if longest.is_some() {
            self.io_failed.delayed += 1;
        }
        longest
    }

    /// The I/O fault check for file `ino`.
    fn io_fault_on(&mut self, ino: u64, op: IoOp) -> Result<(), Errno> {
        let rel = self.nodes.get(&ino).and_then(|n| n.path.clone());
        self.io_fault(rel.as_deref(), op)
    }

    pub(crate) fn set_full(&mut self, full: bool) {
        self.full = full;
    }

    pub(crate) fn unsynced_bytes(&self) -> u64 {
        self.nodes.values().map(|n| n.pending.bytes()).sum()
    }

    /// Forgets every pending change of every file; `torn`: each file's pending changes land
    /// instead, in order, but for the last write's final sector, which reads as zeros (a disk
    /// that lost power while writing the file back). Unlinked files' changes are dropped.
    /// `dirents`: the cut also forgets the directory changes that model does not keep (see
    /// [`super::dirents`]); without one every change made so far stays.
    pub(crate) fn power_cut(&mut self, torn: bool, dirents: Option<Dirents>) -> CutReport {
        let mut report = CutReport::default();
        let backing = self.backing.clone();
        for node in self.nodes.values_mut() {
            if node.pending.is_empty() {
                continue;
            }
            report.files += 1;
            if torn && let Some(rel) = node.path.as_deref() {
                let zeroed = node.pending.tear(SECTOR);
                report.torn += u64::from(zeroed > 0);
                report.bytes += zeroed;
                let landed = match &node.file {
                    Some(file) => node.pending.apply(file),
                    None => open_backing(&backing.join(rel)).and_then(|f| node.pending.apply(&f)),
                };
                if landed.is_ok() {
                    continue;
                }
            }
            let (writes, bytes) = node.pending.drop_all();
            report.writes += writes;
            report.bytes += bytes;
        }
        if let Some(log) = &mut self.dirents {
            let (undone, entries) = log.cut(dirents);
            report.entries = entries;
            for u in undone {
                self.follow(u);
            }
        }
        let idle: Vec<u64> = self.nodes.keys().copied().collect();
        for ino in idle {
            self.evict_if_idle(ino);
        }
        report
    }

    /// The inode map after a cut undid a directory change.
    fn follow(&mut self, undone: Undone) {
        match undone {
            Undone::Gone(path) | Undone::Back(path) => self.detach_tree(&path),
            Undone::Moved { from, to } => {
                self.detach_tree(&to);
                self.remap(|p| moved(p, &from, &to));
            }
            Undone::Swapped(a, b) => self.remap(|p| moved(p, &a, &b).or_else(|| moved(p, &b, &a))),
        }
    }

    /// [`Self::detach`] of `rel` and every name below it.
    fn detach_tree(&mut self, rel: &Path) {
        let below: Vec<PathBuf> = self
            .by_path
            .keys()
            .filter(|p| p.starts_with(rel))
            .cloned()
            .collect();
        for p in below {
            self.detach(&p);
        }
    }

    fn real(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn rel(&self, ino: u64) -> Result<&Path, Errno> {
        self.node(ino)?.path.as_deref().ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        if name.as_bytes().contains(&b'/') || name == ".." || name == "." {
            return Err(Errno::EINVAL);
        }
        Ok(self.rel(parent)?.join(name))
    }

    /// The inode for `rel`, made if new; counts one kernel lookup.
    fn intern(&mut self, rel: PathBuf) -> u64 {
        let ino = match self.by_path.get(&rel) {
            Some(&ino) => ino,
            None => {
                let ino = self.next_ino;
                self.next_ino += 1;
                self.by_path.insert(rel.clone(), ino);
                self.nodes.insert(
                    ino,
                    Node {
                        path: Some(rel),
                        ..Node::default()
                    },
                );
                ino
            }
        };
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups += 1;
        }
        ino
    }

    /// Drops a node nobody can reach any more: not the root, forgotten by the kernel, not open,
    /// and with nothing pending that its name could still lead to.
    fn evict_if_idle(&mut self, ino: u64) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        let idle = ino != ROOT
            && node.lookups == 0
            && node.opens == 0
            && (node.pending.is_empty() || node.path.is_none());
        if !idle {
            return;
        }
        if let Some(node) = self.nodes.remove(&ino)
            && let Some(path) = node.path
            && self.by_path.get(&path) == Some(&ino)
        {
            self.by_path.remove(&path);
        }
    }

    /// The name `rel` is gone (unlink, rmdir, replaced by a rename): its inode loses its path
    /// and its pending changes, and lives on only while open.
    fn detach(&mut self, rel: &Path) {
        let Some(ino) = self.by_path.remove(rel) else {
            return;
        };
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.path = None;
            node.pending.drop_all();
        }
        self.evict_if_idle(ino);
    }

    /// Renames every node whose path `remap` maps to a new one (a moved directory takes its
    /// descendants along).
    fn remap(&mut self, remap: impl Fn(&Path) -> Option<PathBuf>) {
        let moved: Vec<(u64, PathBuf, PathBuf)> = self
            .nodes
            .iter()
            .filter_map(|(&ino, node)| {
                let old = node.path.as_ref()?;
                remap(old).map(|new| (ino, old.clone(), new))
            })
            .collect();
        for (ino, old, _) in &moved {
            if self.by_path.get(old) == Some(ino) {
                self.by_path.remove(old);
            }
        }
        for (ino, _, new) in moved {
            self.by_path.insert(new.clone(), ino);
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = Some(new);
            }
        }
    }

    pub(crate) fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.node(ino)?;
        let meta = match (&node.file, &node.path) {
            (Some(file), _) => file.metadata(),
            (None, Some(rel)) => fs::symlink_metadata(self.real(rel)),
            (None, None) => return Err(Errno::ENOENT),
        }
        .map_err(errno)?;
        Ok(attr_of(ino, &meta, &node.pending))
    }

    fn chown_to(&self, rel: &Path, caller: Caller) -> Result<(), Errno> {
        if nix::unistd::geteuid().is_root() && (caller.uid != 0 || caller.gid != 0) {
            std::os::unix::fs::lchown(self.real(rel), Some(caller.uid), Some(caller.gid))
                .map_err(errno)?;
        }
        Ok(())
    }

    pub(crate) fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let rel = self.child(parent, name)?;
        fs::symlink_metadata(self.real(&rel)).map_err(errno)?;
        let ino = self.intern(rel);
        self.attr(ino)
    }

    pub(crate) fn forget(&mut self, ino: u64, lookups: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(lookups);
        }
        self.evict_if_idle(ino);
    }

    pub(crate) fn setattr(&mut self, ino: u64, change: AttrChange) -> Result<FileAttr, Errno> {
        self.alive()?;
        let rel = self.node(ino)?.path.clone();
        let real = rel.as_deref().map(|r| self.real(r));
        let node = self.node(ino)?;
        if let Some(mode) = change.mode {
            let perms = fs::Permissions::from_mode(mode & 0o7777);
            match (&node.file, &real) {
                (Some(file), _) => file.set_permissions(perms),
                (None, Some(real)) => fs::set_permissions(real, perms),
                (None, None) => return Err(Errno::ENOENT),
            }
            .map_err(errno)?;
        }
        if change.uid.is_some() || change.gid.is_some() {
            match (&node.file, &real) {
                (Some(file), _) => std::os::unix::fs::fchown(file, change.uid, change.gid),
                (None, Some(real)) => std::os::unix::fs::lchown(real, change.uid, change.gid),
                (None, None) => return Err(Errno::ENOENT),
            }
            .map_err(errno)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            let (atime, mtime) = (timespec(change.atime), timespec(change.mtime));
            match (&node.file, &real) {
                (Some(file), _) => nix::sys::stat::futimens(file, &atime, &mtime),
                (None, Some(real)) => nix::sys::stat::utimensat(
                    nix::fcntl::AT_FDCWD,
                    real,
                    &atime,
                    &mtime,
                    UtimensatFlags::NoFollowSymlink,
                ),
                (None, None) => return Err(Errno::ENOENT),
            }
            .map_err(nix_errno)?;
        }
        if let Some(size) = change.size {
            if self.attr(ino)?.kind != FileType::RegularFile {
                return Err(Errno::EINVAL);
            }
            self.node_mut(ino)?.pending.truncate(size);
        }
        self.attr(ino)
    }

    pub(crate) fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let target = fs::read_link(self.real(self.rel(ino)?)).map_err(errno)?;
        Ok(target.into_os_string().into_encoded_bytes())
    }

    pub(crate) fn mknod(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        self.alive()?;
        let rel = self.child(parent, name)?;
        let kind = SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits());
        let perm = Mode::from_bits_truncate(mode & 0o7777);
        nix::sys::stat::mknod(&self.real(&rel), kind, perm, u64::from(rdev)).map_err(nix_errno)?;
        self.chown_to(&rel, caller)?;
        self.log_change(Change::Made { path: rel.clone() });
        let ino = self.intern(rel);
        self.attr(ino)
    }

    pub(crate) fn mkdir(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        self.alive()?;
        let rel = self.child(parent, name)?;
        fs::DirBuilder::new()
            .mode(mode & 0o7777)
            .create(self.real(&rel))
            .map_err(errno)?;
        self.chown_to(&rel, caller)?;
        self.log_change(Change::Made { path: rel.clone() });
        let ino = self.intern(rel);
        self.attr(ino)
    }

    pub(crate) fn symlink(
        &mut self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        self.alive()?;
        let rel = self.child(parent, name)?;
        std::os::unix::fs::symlink(target, self.real(&rel)).map_err(errno)?;
        self.chown_to(&rel, caller)?;
        self.log_change(Change::Made { path: rel.clone() });
        let ino = self.intern(rel);
        self.attr(ino)
    }

    pub(crate) fn unlink(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        self.alive()?;
        let rel = self.child(parent, name)?;
        let real = self.real(&rel);
        // While directory changes are logged, the file lives on, linked beside the backing
        // directory, until its removal is durable (not a directory: unlink(2) refuses one
        // with EISDIR, and so does remove_file below). Where no link can be made the removal
        // is durable at once; it never fails for want of one.
        let is_file = fs::symlink_metadata(&real).is_ok_and(|m| !m.is_dir());
        let kept = match &mut self.dirents {
            Some(log) if is_file => log.keep(&rel),
            _ => None,
        };
        let Some(kept) = kept else {
            fs::remove_file(&real).map_err(errno)?;
            self.detach(&rel);
            return Ok(());
        };
        if let Err(e) = fs::remove_file(&real) {
            let _ = fs::remove_file(&kept);
            return Err(errno(e));
        }
        self.log_change(Change::Unlinked {
            path: rel.clone(),
            kept,
        });
        self.detach(&rel);
        Ok(())
    }

    pub(crate) fn rmdir(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        self.alive()?;
        let rel = self.child(parent, name)?;
        let mode = fs::symlink_metadata(self.real(&rel)).map_or(0o755, |m| dirents::mode_of(&m));
        fs::remove_dir(self.real(&rel)).map_err(errno)?;
        self.log_change(Change::Rmdired {
            path: rel.clone(),
            mode,
        });
        self.detach(&rel);
        Ok(())
    }

    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        self.alive()?;
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        self.io_fault(Some(&from), IoOp::Rename)?;
        let (real_from, real_to) = (self.real(&from), self.real(&to));
        let exchange = flags & nix::fcntl::RenameFlags::RENAME_EXCHANGE.bits() != 0;
        // What the rename replaces is kept for an undo; where it cannot be (no link could be
        // made), the rename is durable at once.
        let mut tracked = self.dirents.is_some() && !exchange && from != to;
        let replaced = match (&mut self.dirents, tracked) {
            (Some(log), true) => match fs::symlink_metadata(&real_to) {
                Ok(m) if m.is_dir() => Some(Replaced::Dir(dirents::mode_of(&m))),
                Ok(_) => {
                    let kept = log.keep(&to);
                    tracked = kept.is_some();
                    kept.map(Replaced::File)
                }
                Err(_) => None,
            },
            _ => None,
        };
        tracked |= exchange && from != to;
        let done = if flags == 0 {
            fs::rename(&real_from, &real_to).map_err(errno)
        } else {
            Self::rename_with(&real_from, &real_to, flags)
        };
        if let Err(e) = done {
            if let Some(Replaced::File(kept)) = &replaced {
                let _ = fs::remove_file(kept);
            }
            return Err(e);
        }
        if from == to {
            return Ok(());
        }
        if tracked {
            self.log_change(Change::Renamed {
                from: from.clone(),
                to: to.clone(),
                replaced,
                exchange,
            });
        }
        if exchange {
            self.remap(|p| moved(p, &from, &to).or_else(|| moved(p, &to, &from)));
        } else {
            self.detach(&to);
            self.remap(|p| moved(p, &from, &to));
        }
        Ok(())
    }

    /// renameat2 with `flags` (RENAME_NOREPLACE, RENAME_EXCHANGE).
    fn rename_with(real_from: &Path, real_to: &Path, flags: u32) -> Result<(), Errno> {
        let flags = nix::fcntl::RenameFlags::from_bits(flags).ok_or(Errno::EINVAL)?;
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            real_from,
            nix::fcntl::AT_FDCWD,
            real_to,
            flags,
        )
        .map_err(nix_errno)
    }

    /// Opens file `ino`; its handle is the inode itself.
    pub(crate) fn open(&mut self, ino: u64) -> Result<(), Errno> {
        self.io_fault_on(ino, IoOp::Open)?;
        let real = self.node(ino)?.path.as_deref().map(|r| self.real(r));
        let node = self.node_mut(ino)?;
        if node.file.is_none() {
            let real = real.ok_or(Errno::ENOENT)?;
            node.file = Some(open_backing(&real).map_err(errno)?);
        }
        node.opens += 1;
        Ok(())
    }

    pub(crate) fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        self.alive()?;
        const O_EXCL: i32 = 0o200;
        const O_TRUNC: i32 = 0o1000;
        let rel = self.child(parent, name)?;
        self.io_fault(Some(&rel), IoOp::Open)?;
        let real = self.real(&rel);
        let existed = fs::symlink_metadata(&real).is_ok();
        let mut options = OpenOptions::new();
        options
            .read(true)
            .write(true)
            .create(true)
            .mode(mode & 0o7777);
        if flags & O_EXCL != 0 {
            options.create_new(true);
        }
        let file = options.open(&real).map_err(errno)?;
        if !existed {
            self.chown_to(&rel, caller)?;
            self.log_change(Change::Made { path: rel.clone() });
        }
        let ino = self.intern(rel);
        let node = self.node_mut(ino)?;
        node.opens += 1;
        let file = node.file.get_or_insert(file);
        if existed && flags & O_TRUNC != 0 {
            let base = file.metadata().map_err(errno)?.len();
            if node.pending.size_over(base) > 0 {
                node.pending.truncate(0);
            }
        }
        self.attr(ino)
    }

    pub(crate) fn release(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.opens = node.opens.saturating_sub(1);
            if node.opens == 0 {
                node.file = None;
            }
        }
        self.evict_if_idle(ino);
    }

    pub(crate) fn read(&mut self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.io_fault_on(ino, IoOp::Read)?;
        let node = self.node(ino)?;
        let file = node.file.as_ref().ok_or(Errno::EBADF)?;
        let base = file.metadata().map_err(errno)?.len();
        let end = node.pending.size_over(base);
        if offset >= end {
            return Ok(Vec::new());
        }
        let len = (end - offset).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; len];
        if offset < base {
            let n = ((base - offset) as usize).min(len);
            read_upto(file, offset, &mut buf[..n]).map_err(errno)?;
        }
        node.pending.overlay(offset, &mut buf);
        Ok(buf)
    }

    /// Holds a write. On a full disk only the part inside the file's current size is taken
    /// (a short write), and a write wholly past it fails with ENOSPC.
    pub(crate) fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        self.crash_point(ino, CrashOp::Write)?;
        self.io_fault_on(ino, IoOp::Write)?;
        let full = self.full;
        let node = self.node_mut(ino)?;
        let file = node.file.as_ref().ok_or(Errno::EBADF)?;
        let mut take = data.len();
        if full {
            let size = node
                .pending
                .size_over(file.metadata().map_err(errno)?.len());
            if offset + data.len() as u64 > size {
                if offset >= size {
                    return Err(Errno::ENOSPC);
                }
                take = (size - offset) as usize;
            }
        }
        node.pending.write(offset, &data[..take]);
        Ok(take as u32)
    }

    /// Makes file `ino` durable: its pending changes land on the backing file in order, then
    /// the backing file is fdatasynced (fsynced when `datasync` is false).
    pub(crate) fn fsync(&mut self, ino: u64, datasync: bool) -> Result<(), Errno> {
        let op = if datasync {
            CrashOp::Fdatasync
        } else {
            CrashOp::Fsync
        };
        self.crash_point(ino, op)?;
        if let Err(e) = self.io_fault_on(ino, IoOp::Fsync) {
            // What Linux does after a failed writeback: the pages are marked clean, never
            // written, and the error is said once.
            let (writes, bytes) = self.node_mut(ino)?.pending.fail_sync();
            self.io_failed.fsyncs += 1;
            self.io_failed.writes_dropped += writes;
            self.io_failed.bytes_dropped += bytes;
            return Err(e);
        }
        let real = self.node(ino)?.path.as_deref().map(|r| self.real(r));
        let node = self.node_mut(ino)?;
        let opened;
        let file = match (&node.file, real) {
            (Some(file), _) => file,
            (None, Some(real)) => {
                opened = open_backing(&real).map_err(errno)?;
                &opened
            }
            (None, None) => return Ok(()),
        };
        node.pending.apply(file).map_err(errno)?;
        if datasync {
            file.sync_data()
        } else {
            file.sync_all()
        }
        .map_err(errno)?;
        if let Some(log) = &mut self.dirents {
            log.journal();
        }
        Ok(())
    }

    pub(crate) fn fsyncdir(&mut self, ino: u64) -> Result<(), Errno> {
        self.alive()?;
        let rel = self.rel(ino)?.to_path_buf();
        File::open(self.real(&rel))
            .and_then(|d| d.sync_all())
            .map_err(errno)?;
        if let Some(log) = &mut self.dirents {
            log.dir_synced(&rel);
        }
        Ok(())
    }

    pub(crate) fn fallocate(
        &mut self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        self.alive()?;
        if mode != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let full = self.full;
        let size = self.attr(ino)?.size;
        let end = offset.saturating_add(length);
        if end > size {
            if full {
                return Err(Errno::ENOSPC);
            }
            self.node_mut(ino)?.pending.truncate(end);
        }
        Ok(())
    }

    pub(crate) fn opendir(&mut self, ino: u64) -> Result<u64, Errno> {
        let rel = self.rel(ino)?.to_path_buf();
        let parent = rel
            .parent()
            .and_then(|p| self.by_path.get(p).copied())
            .unwrap_or(ROOT);
        let mut listing = vec![
            Listed {
                ino,
                kind: FileType::Directory,
                name: ".".into(),
            },
            Listed {
                ino: parent,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        for entry in fs::read_dir(self.real(&rel)).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            let name = entry.file_name();
            let kind = entry
                .file_type()
                .ok()
                .and_then(FileType::from_std)
                .unwrap_or(FileType::RegularFile);
            let ino = self
                .by_path
                .get(&rel.join(&name))
                .copied()
                .unwrap_or_else(|| entry.ino());
            listing.push(Listed { ino, kind, name });
        }
        let fh = self.next_listing;
        self.next_listing += 1;
        self.listings.insert(fh, listing);
        Ok(fh)
    }

    /// The entries of open directory `fh` from index `offset` on.
    pub(crate) fn readdir(&self, fh: u64, offset: u64) -> Result<Vec<Listed>, Errno> {
        let listing = self.listings.get(&fh).ok_or(Errno::EBADF)?;
        Ok(listing
            .iter()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .cloned()
            .collect())
    }

    pub(crate) fn releasedir(&mut self, fh: u64) {
        self.listings.remove(&fh);
    }

    /// The backing filesystem's numbers, or no free block at all once full.
    pub(crate) fn statfs(&self) -> Result<Space, Errno> {
        let st = nix::sys::statvfs::statvfs(&self.backing).map_err(nix_errno)?;
        let (bfree, bavail) = if self.full {
            (0, 0)
        } else {
            (st.blocks_free(), st.blocks_available())
        };
        Ok(Space {
            blocks: st.blocks(),
            bfree,
            bavail,
            files: st.files(),
            ffree: st.files_free(),
            bsize: st.block_size() as u32,
            namelen: st.name_max() as u32,
            frsize: st.fragment_size() as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::powerfs::{CrashOp, CrashPoint, IoFailed, IoFault, IoOp};

    const ME: Caller = Caller { uid: 0, gid: 0 };

    fn state() -> (tempfile::TempDir, State) {
        let dir = tempfile::tempdir().unwrap();
        let state = State::new(dir.path().to_path_buf());
        (dir, state)
    }

    fn read_all(state: &mut State, ino: u64) -> Vec<u8> {
        state.read(ino, 0, 1 << 20).unwrap()
    }

    fn fault(op: IoOp, path: &str, errno: crate::powerfs::IoErrno, nth: Option<u64>) -> IoFault {
        IoFault {
            op,
            path: path.to_string(),
            effect: crate::powerfs::IoEffect::Error(errno),
            nth,
        }
    }

    /// Linux after a failed fsync: the error is said once, reads still show the writes it
    /// covered, a retried fsync succeeds and writes nothing of them, and a cut loses them;
    /// writes after it are synced as ever.
    #[test]
    fn a_failed_fsync_drops_its_writes_and_a_retry_succeeds_without_them() {
        use crate::powerfs::IoErrno::Eio;
        let (dir, mut s) = state();
        let ino = s.create(ROOT, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, b"safe").unwrap();
        s.fsync(ino, true).unwrap();
        s.inject(fault(IoOp::Fsync, "f", Eio, Some(1)));
        s.write(ino, 4, b"lost").unwrap();
        assert!(s.fsync(ino, true).unwrap_err() == Errno::EIO);
        assert_eq!(read_all(&mut s, ino), b"safelost");
        s.fsync(ino, false).unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"safe");
        s.write(ino, 8, b"more").unwrap();
        s.fsync(ino, true).unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"safe\0\0\0\0more");
        assert_eq!(read_all(&mut s, ino), b"safelostmore");
        let cut = s.power_cut(false, None);
        assert_eq!((cut.files, cut.writes, cut.bytes), (1, 1, 4));
        assert_eq!(read_all(&mut s, ino), b"safe\0\0\0\0more");
        assert_eq!(
            s.io_failed,
            IoFailed {
                delayed: 0,
                operations: 1,
                fsyncs: 1,
                writes_dropped: 1,
                bytes_dropped: 4
            }
        );
    }

    /// Each operation fails on the files its path matches while the fault is in force, and
    /// nothing it refused happened.
    #[test]
    fn io_faults_fail_their_operation_on_matching_files_only() {
        use crate::powerfs::IoErrno::{Eio, Enospc, Erofs};
        let (dir, mut s) = state();
        let log = s
            .create(ROOT, "a.log".as_ref(), 0o644, 0, ME)
            .unwrap()
            .ino
            .0;
        let other = s
            .create(ROOT, "b.txt".as_ref(), 0o644, 0, ME)
            .unwrap()
            .ino
            .0;
        s.write(log, 0, b"x").unwrap();
        s.inject(fault(IoOp::Write, "*.log", Enospc, None));
        s.inject(fault(IoOp::Read, "*.log", Eio, None));
        s.inject(fault(IoOp::Open, "*.log", Eio, None));
        s.inject(fault(IoOp::Rename, "*.log", Erofs, None));
        assert!(s.write(log, 1, b"y").unwrap_err() == Errno::ENOSPC);
        assert!(
            s.write(log, 1, b"y").unwrap_err() == Errno::ENOSPC,
            "every one"
        );
        assert!(s.read(log, 0, 10).unwrap_err() == Errno::EIO);
        assert!(s.open(log).unwrap_err() == Errno::EIO);
        assert!(
            s.create(ROOT, "c.log".as_ref(), 0o644, 0, ME).unwrap_err() == Errno::EIO,
            "a create is an open"
        );
        assert!(!dir.path().join("c.log").exists());
        assert!(
            s.rename(ROOT, "a.log".as_ref(), ROOT, "z.log".as_ref(), 0)
                .unwrap_err()
                == Errno::from_i32(nix::errno::Errno::EROFS as i32)
        );
        assert!(dir.path().join("a.log").exists());
        s.write(other, 0, b"fine").unwrap();
        assert_eq!(read_all(&mut s, other), b"fine");
        assert_eq!(s.io_failed.operations, 6);
        s.clear_io_faults();
        s.write(log, 1, b"y").unwrap();
        assert_eq!(read_all(&mut s, log), b"xy");
        // `nth`: only that one, counted from the injection.
        s.inject(fault(IoOp::Write, "a.log", Eio, Some(2)));
        s.write(log, 2, b"1").unwrap();
        assert!(s.write(log, 3, b"2").unwrap_err() == Errno::EIO);
        s.write(log, 3, b"3").unwrap();
        assert_eq!(read_all(&mut s, log), b"xy13");
    }

    #[test]
    fn unsynced_writes_are_read_back_and_lost_in_a_cut() {
        let (dir, mut s) = state();
        let ino = s.create(ROOT, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, b"hello").unwrap();
        assert_eq!(read_all(&mut s, ino), b"hello");
        assert_eq!(s.attr(ino).unwrap().size, 5);
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"");
        assert_eq!(s.unsynced_bytes(), 5);
        let cut = s.power_cut(false, None);
        assert_eq!((cut.files, cut.writes, cut.bytes), (1, 1, 5));
        assert_eq!(read_all(&mut s, ino), b"");
        assert_eq!(s.attr(ino).unwrap().size, 0);
    }

    #[test]
    fn a_torn_cut_lands_the_unsynced_writes_but_the_last_sector() {
        let (dir, mut s) = state();
        let ino = s.create(ROOT, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, &[7; 600]).unwrap();
        s.fsync(ino, true).unwrap();
        s.write(ino, 600, &[8; 1000]).unwrap();
        let cut = s.power_cut(true, None);
        assert_eq!(
            (cut.files, cut.torn, cut.writes, cut.bytes),
            (1, 1, 0, 1600 - 1536)
        );
        let on_disk = fs::read(dir.path().join("f")).unwrap();
        assert_eq!(on_disk.len(), 1600, "the size reached the disk");
        assert!(on_disk[..600].iter().all(|b| *b == 7));
        assert!(on_disk[600..1536].iter().all(|b| *b == 8));
        assert!(
            on_disk[1536..].iter().all(|b| *b == 0),
            "the last sector did not"
        );
        assert_eq!(read_all(&mut s, ino), on_disk);
    }

    #[test]
    fn a_crash_point_cuts_power_at_its_nth_operation_and_refuses_changes_until_revived() {
        let (dir, mut s) = state();
        let log = s
            .create(ROOT, "a.log".as_ref(), 0o644, 0, ME)
            .unwrap()
            .ino
            .0;
        let other = s
            .create(ROOT, "marks".as_ref(), 0o644, 0, ME)
            .unwrap()
            .ino
            .0;
        s.arm(CrashPoint {
            op: CrashOp::Fdatasync,
            path: "*.log".to_string(),
            nth: 2,
            torn: false,
            dirents: None,
        });
        s.write(log, 0, b"one").unwrap();
        s.fsync(log, true).unwrap();
        s.write(other, 0, b"m").unwrap();
        s.fsync(other, true).unwrap(); // not a *.log: not counted
        s.fsync(log, false).unwrap(); // fsync, not fdatasync: not counted
        s.write(log, 3, b"two").unwrap();
        assert_eq!(
            s.fsync(log, true),
            Err(Errno::EIO),
            "the second fdatasync of a *.log"
        );
        let crash = s.take_crash().expect("it fired");
        assert_eq!(crash.cut.bytes, 3);
        assert_eq!(fs::read(dir.path().join("a.log")).unwrap(), b"one");
        assert_eq!(s.write(log, 3, b"x"), Err(Errno::EIO), "no power");
        assert_eq!(s.unlink(ROOT, "marks".as_ref()), Err(Errno::EIO));
        assert!(!s.disarm(), "a fired point is no longer armed");
        s.revive();
        s.write(log, 3, b"three").unwrap();
        s.fsync(log, true).unwrap();
        assert_eq!(fs::read(dir.path().join("a.log")).unwrap(), b"onethree");
        assert!(s.take_crash().is_none(), "taken once");
    }

    #[test]
    fn fsync_lands_the_writes_and_a_cut_keeps_them() {
        let (dir, mut s) = state();
        let ino = s.create(ROOT, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, b"durable").unwrap();
        s.fsync(ino, true).unwrap();
        s.write(ino, 7, b" not").unwrap();
        assert_eq!(s.power_cut(false, None).bytes, 4);
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"durable");
        assert_eq!(read_all(&mut s, ino), b"durable");
    }

    #[test]
    fn pending_changes_follow_the_inode_through_a_rename_and_die_with_an_unlink() {
        let (dir, mut s) = state();
        fs::create_dir(dir.path().join("d")).unwrap();
        let d = s.lookup(ROOT, "d".as_ref()).unwrap().ino.0;
        let ino = s.create(d, "tmp".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, b"x").unwrap();
        s.release(ino);
        s.rename(ROOT, "d".as_ref(), ROOT, "e".as_ref(), 0).unwrap();
        s.rename(d, "tmp".as_ref(), d, "final".as_ref(), 0).unwrap();
        assert_eq!(s.lookup(d, "final".as_ref()).unwrap().ino.0, ino);
        // Closed, so fsync reaches the file by its new path.
        s.fsync(ino, true).unwrap();
        assert_eq!(fs::read(dir.path().join("e/final")).unwrap(), b"x");
        s.open(ino).unwrap();
        s.write(ino, 1, b"y").unwrap();
        s.unlink(d, "final".as_ref()).unwrap();
        assert_eq!(s.unsynced_bytes(), 0);
    }

    #[test]
    fn a_rename_moves_the_path_itself_and_everything_below_it() {
        let (a, b) = (Path::new("a"), Path::new("b/c"));
        assert_eq!(moved(Path::new("a"), a, b), Some(PathBuf::from("b/c")));
        assert_eq!(
            moved(Path::new("a/x/y"), a, b),
            Some(PathBuf::from("b/c/x/y"))
        );
        assert_eq!(moved(Path::new("ab"), a, b), None);
        assert_eq!(moved(Path::new(""), a, b), None);
    }

    #[test]
    fn a_full_disk_refuses_growth_but_not_overwrites() {
        let (_dir, mut s) = state();
        let ino = s.create(ROOT, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, b"abcd").unwrap();
        s.set_full(true);
        assert_eq!(s.statfs().unwrap().bavail, 0);
        assert_eq!(s.write(ino, 4, b"e"), Err(Errno::ENOSPC));
        assert_eq!(s.write(ino, 2, b"XYZ"), Ok(2));
        assert_eq!(s.write(ino, 0, b"A"), Ok(1));
        assert_eq!(read_all(&mut s, ino), b"AbXY");
        s.set_full(false);
        assert_eq!(s.write(ino, 4, b"e"), Ok(1));
    }

    /// A state logging directory changes for `model`, with a file `name` holding `durable`
    /// made durable (written, fsynced, its directory fsynced).
    fn tracking(model: Dirents) -> (tempfile::TempDir, State) {
        let (dir, mut s) = state();
        s.track_dirents(model).unwrap();
        (dir, s)
    }

    fn made(s: &mut State, name: &str, bytes: &[u8]) -> u64 {
        let ino = s.create(ROOT, name.as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(ino, 0, bytes).unwrap();
        s.fsync(ino, true).unwrap();
        s.release(ino);
        ino
    }

    fn listed(dir: &tempfile::TempDir) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// posix: a file created, written and fdatasynced is gone after a cut unless its
    /// directory was fsynced; a later directory fsync keeps it.
    #[test]
    fn posix_forgets_a_synced_file_whose_directory_was_not_synced() {
        let (dir, mut s) = tracking(Dirents::Posix);
        made(&mut s, "records-1.log", b"acked");
        let cut = s.power_cut(false, Some(Dirents::Posix));
        assert_eq!(cut.entries, 1);
        assert!(listed(&dir).is_empty());

        made(&mut s, "records-2.log", b"acked");
        s.fsyncdir(ROOT).unwrap();
        made(&mut s, "records-3.log", b"later");
        assert_eq!(s.power_cut(false, Some(Dirents::Posix)).entries, 1);
        assert_eq!(listed(&dir), ["records-2.log"]);
        assert_eq!(
            fs::read(dir.path().join("records-2.log")).unwrap(),
            b"acked"
        );
    }

    /// ext4: the file's own fsync commits its entry (the journal commits every change so
    /// far); only a change no fsync came after is forgotten.
    #[test]
    fn ext4_keeps_what_any_fsync_came_after() {
        let (dir, mut s) = tracking(Dirents::Ext4);
        made(&mut s, "a", b"1");
        let ino = s.create(ROOT, "b".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.release(ino);
        let cut = s.power_cut(false, Some(Dirents::Ext4));
        assert_eq!(cut.entries, 1);
        assert_eq!(listed(&dir), ["a"]);
    }

    /// A rename over a file, not synced: the cut puts the old file back at the name and the
    /// new one back at its temporary name — never both at one name, never neither.
    #[test]
    fn a_lost_rename_reverts_to_the_old_name() {
        let (dir, mut s) = tracking(Dirents::Posix);
        made(&mut s, "state", b"old");
        s.fsyncdir(ROOT).unwrap();
        made(&mut s, "state.tmp", b"new");
        s.rename(ROOT, "state.tmp".as_ref(), ROOT, "state".as_ref(), 0)
            .unwrap();
        assert_eq!(fs::read(dir.path().join("state")).unwrap(), b"new");
        assert_eq!(s.dirents_pending(), 2);
        assert_eq!(s.power_cut(false, Some(Dirents::Posix)).entries, 2);
        assert_eq!(listed(&dir), ["state"]);
        assert_eq!(fs::read(dir.path().join("state")).unwrap(), b"old");

        // The same rename with its directory synced stays.
        made(&mut s, "state.tmp", b"new");
        s.rename(ROOT, "state.tmp".as_ref(), ROOT, "state".as_ref(), 0)
            .unwrap();
        s.fsyncdir(ROOT).unwrap();
        assert_eq!(s.power_cut(false, Some(Dirents::Posix)).entries, 0);
        assert_eq!(fs::read(dir.path().join("state")).unwrap(), b"new");
        assert_eq!(s.dirents_pending(), 0);
    }

    /// An unlink not synced brings the file back with its durable content; a chain of changes
    /// to one name (create, rename, unlink) is undone whole, newest first.
    #[test]
    fn a_lost_unlink_brings_the_file_back_and_chains_undo_newest_first() {
        let (dir, mut s) = tracking(Dirents::Posix);
        made(&mut s, "kept", b"durable");
        s.fsyncdir(ROOT).unwrap();
        s.unlink(ROOT, "kept".as_ref()).unwrap();
        made(&mut s, "a", b"x");
        s.rename(ROOT, "a".as_ref(), ROOT, "b".as_ref(), 0).unwrap();
        s.unlink(ROOT, "b".as_ref()).unwrap();
        assert!(listed(&dir).is_empty());
        assert_eq!(s.power_cut(false, Some(Dirents::Posix)).entries, 4);
        assert_eq!(listed(&dir), ["kept"]);
        assert_eq!(fs::read(dir.path().join("kept")).unwrap(), b"durable");
        // A cut without a model keeps every change, and nothing is logged after it.
        s.unlink(ROOT, "kept".as_ref()).unwrap();
        assert_eq!(s.power_cut(false, None).entries, 0);
        assert!(listed(&dir).is_empty());
    }

    /// Syncing a directory makes an earlier change to the same names durable with it: a file
    /// created in one directory and renamed into another that is synced stays.
    #[test]
    fn a_synced_rename_keeps_the_create_it_moved() {
        let (dir, mut s) = tracking(Dirents::Posix);
        let sub = s.mkdir(ROOT, "sub".as_ref(), 0o755, ME).unwrap().ino.0;
        s.fsyncdir(ROOT).unwrap();
        made(&mut s, "f", b"x");
        s.rename(ROOT, "f".as_ref(), sub, "f".as_ref(), 0).unwrap();
        s.fsyncdir(sub).unwrap();
        assert_eq!(s.power_cut(false, Some(Dirents::Posix)).entries, 0);
        assert_eq!(fs::read(dir.path().join("sub/f")).unwrap(), b"x");
    }

    /// What the review found (posix): a file renamed into a new directory that was synced
    /// keeps the directory's making; a create inside a directory later moved away and replaced
    /// by another never takes the replacement's durable file; an unlink in a directory moved
    /// away never brings the file back into a new directory of the old name.
    #[test]
    fn no_undo_takes_a_durable_name_with_it() {
        let (dir, mut s) = tracking(Dirents::Posix);
        made(&mut s, "a", b"durable");
        s.fsyncdir(ROOT).unwrap();
        let sub = s.mkdir(ROOT, "sub".as_ref(), 0o755, ME).unwrap().ino.0;
        s.rename(ROOT, "a".as_ref(), sub, "a".as_ref(), 0).unwrap();
        s.fsyncdir(sub).unwrap();
        s.power_cut(false, Some(Dirents::Posix));
        assert_eq!(fs::read(dir.path().join("sub/a")).unwrap(), b"durable");

        let (dir, mut s) = tracking(Dirents::Posix);
        let x = s.mkdir(ROOT, "x".as_ref(), 0o755, ME).unwrap().ino.0;
        let f = s.create(x, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.write(f, 0, b"x's").unwrap();
        s.fsync(f, true).unwrap();
        s.release(f);
        s.fsyncdir(x).unwrap();
        let d = s.mkdir(ROOT, "d".as_ref(), 0o755, ME).unwrap().ino.0;
        s.fsyncdir(ROOT).unwrap();
        let lost = s.create(d, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.release(lost);
        s.rename(ROOT, "d".as_ref(), ROOT, "e".as_ref(), 0).unwrap();
        s.rename(ROOT, "x".as_ref(), ROOT, "d".as_ref(), 0).unwrap();
        s.fsyncdir(ROOT).unwrap();
        s.power_cut(false, Some(Dirents::Posix));
        assert_eq!(fs::read(dir.path().join("d/f")).unwrap(), b"x's");

        let (dir, mut s) = tracking(Dirents::Posix);
        let d = s.mkdir(ROOT, "d".as_ref(), 0o755, ME).unwrap().ino.0;
        s.fsyncdir(ROOT).unwrap();
        let f = s.create(d, "f".as_ref(), 0o644, 0, ME).unwrap().ino.0;
        s.release(f);
        s.fsyncdir(d).unwrap();
        s.unlink(d, "f".as_ref()).unwrap();
        s.rename(ROOT, "d".as_ref(), ROOT, "e".as_ref(), 0).unwrap();
        s.mkdir(ROOT, "d".as_ref(), 0o700, ME).unwrap();
        s.fsyncdir(ROOT).unwrap();
        s.power_cut(false, Some(Dirents::Posix));
        assert!(!dir.path().join("d/f").exists());
        assert!(!dir.path().join("e/f").exists());
    }

    /// Syncing a directory after thousands of changes in it stays cheap (it runs under the
    /// filesystem's lock): 20 000 creates and one fsync of their directory well under a second
    /// even in a debug build.
    #[test]
    fn syncing_a_directory_after_many_changes_is_not_quadratic() {
        let (_dir, mut s) = tracking(Dirents::Posix);
        let sub = s.mkdir(ROOT, "many".as_ref(), 0o755, ME).unwrap().ino.0;
        for i in 0..20_000 {
            s.log_change(Change::Made {
                path: PathBuf::from(format!("many/{i}")),
            });
        }
        let started = std::time::Instant::now();
        s.fsyncdir(sub).unwrap();
        // The directory's own making goes with them: a durable name below it needs it.
        assert_eq!(s.dirents_pending(), 0);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
