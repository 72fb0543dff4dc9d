//! A power-cut filesystem: drill mounts the engine's data directory through it, so that a
//! "power cut" can throw away every write the engine has not made durable — what a SIGKILL
//! alone never does, because the page cache survives the process. The same filesystem plays a
//! full disk (`fill_disk`, docs/src/design.md#3-fault-vocabulary). It is a FUSE passthrough of a
//! backing directory (Jepsen's LazyFS is the model), run by `fuser` on a thread of drill's own.
//!
//! **Writes are held, not applied.** A `write`, and a truncate (setattr size, open with
//! `O_TRUNC`, a growing `fallocate`), is kept in memory, in order, per file; the backing file is
//! untouched. Reads, `stat` sizes and mtimes show the backing content with the held changes laid
//! over it (read-your-writes). `fsync` or `fdatasync` on a file applies that file's held changes
//! to the backing file in order and then fdatasyncs (fsyncs) the backing file: from then on they
//! are durable. `close` makes nothing durable. [`PowerFs::power_cut`] drops every held change of
//! every file; afterwards reads show exactly what was synced. Held data lives in RAM, which is
//! fine for drills (tens of MB).
//!
//! **Metadata is durable at once, unless a cut names a model.** create, mkdir, mknod, symlink,
//! unlink, rmdir, rename, chmod, chown and utimes go straight to the backing directory and
//! survive a cut. A real power cut can also lose a directory entry nobody fsynced (a new file, a
//! rename): after [`PowerFs::track_dirents`] the names' changes are logged (`dirents.rs`), and a
//! cut given a [`Dirents`] model undoes, newest first, those the model does not keep — a lost
//! rename takes the old name back. Modes, owners and times stay durable at once. Inodes follow their file
//! across renames (held changes included: a temp file renamed over another before its fsync
//! loses its content in a cut, as on ext4); an unlink drops the file's held changes. Hard links
//! are refused (EPERM).
//!
//! **The kernel must not hide a cut.** Entry and attribute TTLs are 0 and every file is opened
//! with direct I/O, so no page cache keeps data the filesystem threw away: a process started
//! after the cut reads the backing content. Processes that keep a file open across a cut may
//! still append at a stale size, so drill kills the engine before it cuts. Programs that mmap
//! their files are out of scope (shared writable mappings of direct-I/O files are refused or
//! bypass this model).
//!
//! **Full disk.** After [`PowerFs::fill`], statfs reports 0 bytes free and available, and a write
//! that would grow a file fails with ENOSPC (the part of a write inside the file's current size
//! is taken, a short write, as a real full disk does), and so does a growing `fallocate`;
//! overwrites inside a file still succeed, as do fsyncs of writes taken before.
//! [`PowerFs::release`] gives the space back.
//!
//! **Mounting.** As root `fuser` mounts with mount(2) directly (about a millisecond); otherwise
//! through the `fusermount3` helper; no libfuse is linked. Only the mounting user may enter the
//! mount (no `allow_other`), so the engine runs as drill's user; the kernel checks file modes
//! (`default_permissions`). [`PowerFs::unmount`] (and `Drop`) never leaves a mount behind: it
//! unmounts, and when a process still holds a file there, detaches lazily (the files stay
//! usable until closed, served by the FUSE thread, which ends after the last close). It blocks
//! for milliseconds. A drill that is itself SIGKILLed leaves a
//! dead mount ("Transport endpoint is not connected"); the next [`PowerFs::mount`] at that
//! path clears it. This module must never touch anything outside the backing directory and
//! the mountpoint.

#[cfg(not(feature = "powercut"))]
mod absent;
#[cfg(feature = "powercut")]
mod dirents;
#[cfg(feature = "powercut")]
mod mount;
#[cfg(feature = "powercut")]
mod ops;
#[cfg(feature = "powercut")]
mod pending;
#[cfg(feature = "powercut")]
mod state;

use std::path::Path;
use std::time::Instant;

#[cfg(not(feature = "powercut"))]
pub use absent::PowerFs;
#[cfg(feature = "powercut")]
pub use mount::PowerFs;

/// What a power cut threw away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CutReport {
    /// Files that had changes not yet synced.
    pub files: u64,
    /// Write requests and truncates dropped (a large write(2) may have arrived as several
    /// requests, consecutive appends count one each).
    pub writes: u64,
    /// Data bytes dropped (torn: zeroed).
    pub bytes: u64,
    /// Writes torn: the rest of their file landed, their last sector did not.
    pub torn: u64,
    /// Directory changes (creates, removals, renames) the cut forgot: `dirents:` of the cut.
    #[serde(default)]
    pub entries: u64,
}

/// Which directory changes survive a power cut (`dirents:` of a `power_cut`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Dirents {
    /// Only those whose directory was fsynced afterwards (the weakest model POSIX allows).
    Posix,
    /// Those any fsync came after (what ext4's journal keeps in practice).
    Ext4,
}

impl Dirents {
    pub fn name(self) -> &'static str {
        match self {
            Dirents::Posix => "posix",
            Dirents::Ext4 => "ext4",
        }
    }
}

/// What injected I/O faults did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoFailed {
    /// Operations answered with an injected error.
    pub operations: u64,
    /// Of them, fsyncs (and fdatasyncs).
    pub fsyncs: u64,
    /// Unsynced write requests and their data bytes the failed fsyncs dropped: reads showed
    /// them until a power cut, no later fsync wrote them.
    pub writes_dropped: u64,
    pub bytes_dropped: u64,
    /// Operations whose answer a `slow` fault held back.
    pub delayed: u64,
}

/// An operation a crash point counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CrashOp {
    Write,
    Fsync,
    Fdatasync,
}

impl CrashOp {
    pub fn name(self) -> &'static str {
        match self {
            CrashOp::Write => "write",
            CrashOp::Fsync => "fsync",
            CrashOp::Fdatasync => "fdatasync",
        }
    }
}

/// Where power is cut (LazyFS's crash points): at the `nth` `op` on a file whose path matches
/// `path`, counted from when it is armed. The operation does not take effect; the cut throws
/// away every unsynced write (`torn`: tears them, see [`PowerFs::power_cut`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashPoint {
    pub op: CrashOp,
    /// A glob (`*`, `?`) over the file's name, or over its path below the data directory when
    /// it holds a `/`.
    pub path: String,
    pub nth: u64,
    pub torn: bool,
    /// The directory changes the cut forgets (none without a model).
    pub dirents: Option<Dirents>,
}

impl CrashPoint {
    /// Whether the file at `rel` (below the data directory) is one the point counts.
    pub fn matches(&self, rel: &Path) -> bool {
        let text = if self.path.contains('/') {
            rel.to_string_lossy()
        } else {
            rel.file_name().unwrap_or_default().to_string_lossy()
        };
        glob(self.path.as_bytes(), text.as_bytes())
    }

    /// `fdatasync #3 on *.log`.
    pub fn describe(&self) -> String {
        format!("{} #{} on {}", self.op.name(), self.nth, self.path)
    }
}

/// An operation an injected I/O error fails (`op:` of a `disk: io_error` fault). `fsync` is
/// fsync and fdatasync alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IoOp {
    Fsync,
    Write,
    Read,
    Open,
    Rename,
}

impl IoOp {
    pub fn name(self) -> &'static str {
        match self {
            IoOp::Fsync => "fsync",
            IoOp::Write => "write",
            IoOp::Read => "read",
            IoOp::Open => "open",
            IoOp::Rename => "rename",
        }
    }
}

/// The error an injected I/O fault answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum IoErrno {
    Eio,
    Enospc,
    Erofs,
}

impl IoErrno {
    pub fn name(self) -> &'static str {
        match self {
            IoErrno::Eio => "EIO",
            IoErrno::Enospc => "ENOSPC",
            IoErrno::Erofs => "EROFS",
        }
    }
}

/// I/O faults injected on the engine's disk (Chaos Mesh's IOChaos is the model): `op` on a
/// file whose path matches `path` (as a [`CrashPoint`]'s) has the fault's [`IoEffect`] — only
/// the `nth` such operation from when it is injected, or every one while it is in force. A
/// failed `fsync` does what Linux does: the writes it covered are never written, reads still
/// show them, a retried fsync succeeds, and the next power cut loses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoFault {
    pub op: IoOp,
    pub path: String,
    pub effect: IoEffect,
    pub nth: Option<u64>,
}

/// What an I/O fault does to the operations it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoEffect {
    /// `disk: io_error`: the operation fails with this error.
    Error(IoErrno),
    /// `disk: slow`: the operation takes effect at once and its answer comes this much later,
    /// from a timer: the filesystem answers other operations meanwhile.
    Slow(std::time::Duration),
}

impl IoFault {
    /// Whether the file at `rel` (below the data directory) is one the fault acts on.
    pub fn matches(&self, rel: &Path) -> bool {
        let text = if self.path.contains('/') {
            rel.to_string_lossy()
        } else {
            rel.file_name().unwrap_or_default().to_string_lossy()
        };
        glob(self.path.as_bytes(), text.as_bytes())
    }

    /// `fsync on records-*.log fails with EIO (its #1 from now)`, `fsync on *.log answers
    /// 300 ms late`.
    pub fn describe(&self) -> String {
        let which = match self.nth {
            Some(n) => format!(" (its #{n} from now)"),
            None => String::new(),
        };
        let does = match self.effect {
            IoEffect::Error(errno) => format!("fails with {}", errno.name()),
            IoEffect::Slow(d) => format!("answers {} ms late", d.as_millis()),
        };
        format!("{} on {} {does}{which}", self.op.name(), self.path)
    }
}

/// `*` matches any run of bytes, `?` one byte, anything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

/// A crash point that fired: when, which, and what the cut threw away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    pub at: Instant,
    pub point: CrashPoint,
    pub cut: CutReport,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_match_names_or_paths_by_glob() {
        let point = |path: &str| CrashPoint {
            op: CrashOp::Fdatasync,
            path: path.to_string(),
            nth: 1,
            torn: false,
            dirents: None,
        };
        let log = Path::new("data/records-00000000000000000000.log");
        assert!(point("*.log").matches(log));
        assert!(point("records-*").matches(log));
        assert!(point("data/*.log").matches(log));
        assert!(!point("*.jnl").matches(log));
        assert!(!point("delivered-*").matches(log));
        assert!(point("records-????????????????????.log").matches(log));
        assert!(point("*").matches(Path::new("engine.id")));
    }
}
