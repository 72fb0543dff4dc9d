//! Directory entries a power cut may forget: the log of every create, removal and rename since
//! its directory was made durable, and how to take them back at a cut.
//!
//! A change is carried out on the backing directory at once (the engine sees it), and logged
//! here with what undoing it needs: a removed file and a file a rename replaced live on as a
//! hard link in a folder beside the backing directory (`<backing>.unlinked`), a removed
//! directory as its mode. Which logged changes are durable depends on the [`Dirents`] model:
//!
//! - `posix`: a change is durable once its directory was fsynced (the new parent's, for a
//!   rename), and with it every earlier change to the same names or to names above or below
//!   them (a create the rename moved, the directory a file was renamed into): kinder than
//!   POSIX, which could lose a durable file with its unsynced directory, but no undo then ever
//!   takes a durable name with it.
//! - `ext4`: any fsync or fdatasync, of any file or directory, makes every earlier change
//!   durable: ext4's journal commits them in one transaction. (Its 5-second periodic commit is
//!   left out: a cut keeps only what an fsync committed, the weakest case.)
//!
//! At a cut the changes not yet durable are undone newest first, so each undo finds the names
//! as its change left them: a lost rename takes the old name back (never both, never
//! neither), a lost create disappears with its content, a lost removal brings the file back
//! with what was durable in it. An undo never puts a name back over another (it is then
//! skipped, and not counted). Everything else in the log is durable from then on.
//!
//! While changes are logged, a removed file's space comes back only once its removal is
//! durable, and an open file that was unlinked still counts one link.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::Dirents;

/// One directory change, with what undoing it takes. Paths are below the backing directory;
/// `kept` paths are in the folder beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// create, mknod, mkdir, symlink.
    Made { path: PathBuf },
    /// unlink: the file lives on at `kept`.
    Unlinked { path: PathBuf, kept: PathBuf },
    /// rmdir of an empty directory with this mode.
    Rmdired { path: PathBuf, mode: u32 },
    /// rename; `replaced`: the file it replaced, kept; `exchange`: RENAME_EXCHANGE.
    Renamed {
        from: PathBuf,
        to: PathBuf,
        replaced: Option<Replaced>,
        exchange: bool,
    },
}

/// What a rename replaced at its new name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Replaced {
    File(PathBuf),
    Dir(u32),
}

impl Change {
    /// The names it touches.
    fn names(&self) -> Vec<&Path> {
        match self {
            Change::Made { path }
            | Change::Unlinked { path, .. }
            | Change::Rmdired { path, .. } => {
                vec![path]
            }
            Change::Renamed { from, to, .. } => vec![from, to],
        }
    }

    /// The directory whose fsync makes it durable under `posix`.
    fn dir(&self) -> &Path {
        let name = match self {
            Change::Made { path }
            | Change::Unlinked { path, .. }
            | Change::Rmdired { path, .. } => path,
            Change::Renamed { to, .. } => to,
        };
        name.parent().unwrap_or(Path::new(""))
    }
}

/// What undoing a change did to the names, for the filesystem's inode map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Undone {
    /// The name, and everything below it, no longer exists.
    Gone(PathBuf),
    /// What was at `from` (and below it) is at `to` again.
    Moved { from: PathBuf, to: PathBuf },
    /// `a` and `b` traded places again.
    Swapped(PathBuf, PathBuf),
    /// A name came back with a file or directory no inode stands for yet.
    Back(PathBuf),
}

/// The changes not yet durable under the strictest model a cut of the drill uses, oldest
/// first.
pub(crate) struct DirentLog {
    backing: PathBuf,
    /// `<backing>.unlinked`: removed and replaced files, until their change is durable.
    kept_dir: PathBuf,
    next_kept: u64,
    /// `Posix` keeps changes until their directory is synced; `Ext4` until any fsync.
    strictest: Dirents,
    log: Vec<Change>,
    /// How many of the oldest changes an fsync came after (durable under `ext4`): an fsync
    /// journals everything before it, so they are always a prefix.
    journaled: usize,
}

impl DirentLog {
    pub(crate) fn new(backing: &Path, strictest: Dirents) -> io::Result<DirentLog> {
        let mut name = backing.file_name().unwrap_or_default().to_os_string();
        name.push(".unlinked");
        let kept_dir = backing.with_file_name(name);
        if kept_dir.exists() {
            fs::remove_dir_all(&kept_dir)?;
        }
        fs::create_dir_all(&kept_dir)?;
        Ok(DirentLog {
            backing: backing.to_path_buf(),
            kept_dir,
            next_kept: 0,
            strictest,
            log: Vec::new(),
            journaled: 0,
        })
    }

    /// Changes logged and not yet durable under the strictest model.
    pub(crate) fn pending(&self) -> usize {
        self.log.len()
    }

    fn real(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    /// A new name in the kept folder, linked to the file at `rel` (so its inode outlives an
    /// unlink or a rename over it). `None` when the link cannot be made: the caller then
    /// carries the change out untracked (durable at once), never failing it for this.
    pub(crate) fn keep(&mut self, rel: &Path) -> Option<PathBuf> {
        let kept = self.kept_dir.join(self.next_kept.to_string());
        self.next_kept += 1;
        fs::hard_link(self.real(rel), &kept).ok().map(|()| kept)
    }

    pub(crate) fn record(&mut self, change: Change) {
        self.log.push(change);
    }

    /// An fsync or fdatasync succeeded: ext4's journal has every change so far.
    pub(crate) fn journal(&mut self) {
        self.journaled = self.log.len();
        if self.strictest == Dirents::Ext4 {
            let all: Vec<Change> = self.log.drain(..).collect();
            self.journaled = 0;
            self.settle(all);
        }
    }

    /// Directory `dir` was fsynced: its changes are durable, with every earlier change to a
    /// name they touch or to a name above or below one (a directory made, moved or removed
    /// around them): so no undo ever takes a durable name with it.
    pub(crate) fn dir_synced(&mut self, dir: &Path) {
        self.journal();
        // The names made durable so far, and every directory above them.
        let mut names: HashSet<PathBuf> = HashSet::new();
        let mut above: HashSet<PathBuf> = HashSet::new();
        let mut durable = vec![false; self.log.len()];
        for i in (0..self.log.len()).rev() {
            let change = &self.log[i];
            let related = change.dir() == dir
                || change
                    .names()
                    .iter()
                    .any(|n| above.contains(*n) || n.ancestors().any(|a| names.contains(a)));
            if !related {
                continue;
            }
            durable[i] = true;
            for n in change.names() {
                above.extend(n.ancestors().skip(1).map(Path::to_path_buf));
                names.insert(n.to_path_buf());
            }
        }
        let mut settled = Vec::new();
        let mut kept = Vec::new();
        let mut journaled = 0;
        for (i, (change, durable)) in self.log.drain(..).zip(durable).enumerate() {
            if durable {
                settled.push(change);
            } else {
                journaled += usize::from(i < self.journaled);
                kept.push(change);
            }
        }
        self.log = kept;
        self.journaled = journaled;
        self.settle(settled);
    }

    /// Durable changes need nothing kept for an undo any more.
    fn settle(&self, done: Vec<Change>) {
        for change in done {
            if let Change::Unlinked { kept, .. }
            | Change::Renamed {
                replaced: Some(Replaced::File(kept)),
                ..
            } = change
            {
                let _ = fs::remove_file(kept);
            }
        }
    }

    /// The power is cut: undoes, newest first, every change `model` does not keep, and
    /// settles the rest. Returns what each undo did to the names (in order) and how many
    /// changes were undone.
    pub(crate) fn cut(&mut self, model: Option<Dirents>) -> (Vec<Undone>, u64) {
        let kept_by_model = match model {
            None => self.log.len(),
            Some(Dirents::Posix) => 0,
            Some(Dirents::Ext4) => self.journaled,
        };
        let mut lost = self.log.split_off(kept_by_model.min(self.log.len()));
        let durable: Vec<Change> = self.log.drain(..).collect();
        self.journaled = 0;
        let mut undone = Vec::new();
        let mut count = 0;
        while let Some(change) = lost.pop() {
            let did = self.undo(&change);
            count += u64::from(!did.is_empty());
            undone.extend(did);
            // A kept file an undo could not put back is of no use any more.
            self.settle(vec![change]);
        }
        self.settle(durable);
        (undone, count)
    }

    /// Whether nothing is at `rel` now: an undo never puts a name back over another.
    fn free(&self, rel: &Path) -> bool {
        fs::symlink_metadata(self.real(rel)).is_err()
    }

    /// A directory made again with exactly `mode` (no umask).
    fn make_dir(&self, rel: &Path, mode: u32) -> bool {
        let real = self.real(rel);
        fs::DirBuilder::new().mode(mode).create(&real).is_ok()
            && fs::set_permissions(&real, fs::Permissions::from_mode(mode)).is_ok()
    }

    /// Takes one change back on the backing directory; what it did (empty when it could not:
    /// the name is left as it is and the change was not forgotten).
    fn undo(&self, change: &Change) -> Vec<Undone> {
        match change {
            Change::Made { path } => {
                let real = self.real(path);
                // Nothing durable lies below a directory whose making is undone: a change
                // below it made durable would have made the directory durable too.
                let gone = match fs::symlink_metadata(&real) {
                    Ok(m) if m.is_dir() => fs::remove_dir_all(&real),
                    Ok(_) => fs::remove_file(&real),
                    Err(e) => Err(e),
                };
                gone.map(|()| vec![Undone::Gone(path.clone())])
                    .unwrap_or_default()
            }
            Change::Unlinked { path, kept } => {
                if !self.free(path) || fs::rename(kept, self.real(path)).is_err() {
                    return Vec::new();
                }
                vec![Undone::Back(path.clone())]
            }
            Change::Rmdired { path, mode } => {
                if !self.free(path) || !self.make_dir(path, *mode) {
                    return Vec::new();
                }
                vec![Undone::Back(path.clone())]
            }
            Change::Renamed {
                from,
                to,
                exchange: true,
                ..
            } => nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &self.real(to),
                nix::fcntl::AT_FDCWD,
                &self.real(from),
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            )
            .map(|()| vec![Undone::Swapped(from.clone(), to.clone())])
            .unwrap_or_default(),
            Change::Renamed {
                from, to, replaced, ..
            } => {
                if !self.free(from) || fs::rename(self.real(to), self.real(from)).is_err() {
                    return Vec::new();
                }
                let mut did = vec![Undone::Moved {
                    from: to.clone(),
                    to: from.clone(),
                }];
                let back = match replaced {
                    Some(Replaced::File(kept)) => fs::rename(kept, self.real(to)).is_ok(),
                    Some(Replaced::Dir(mode)) => self.make_dir(to, *mode),
                    None => false,
                };
                if back {
                    did.push(Undone::Back(to.clone()));
                }
                did
            }
        }
    }
}

impl Drop for DirentLog {
    /// The kept files go with the filesystem: nothing can undo a change any more.
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.kept_dir);
    }
}

/// The permission bits of `meta`, for a directory an undo makes again.
pub(crate) fn mode_of(meta: &fs::Metadata) -> u32 {
    meta.permissions().mode() & 0o7777
}
