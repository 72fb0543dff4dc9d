//! The mounted power-cut filesystem (feature `powercut`, on by default): a FUSE session over
//! [`State`], mounted with `fuser`, and its unmounting.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, MountOption};
use nix::mount::MntFlags;

use super::ops::{Ops, lock};
use super::state::State;
use super::{Crash, CrashPoint, CutReport};

/// The name the mount carries in /proc/mounts (its source column).
const FS_NAME: &str = "drill-powerfs";

/// A mounted power-cut filesystem. Unmounts on drop.
pub struct PowerFs {
    /// Shared with the FUSE thread.
    state: Arc<Mutex<State>>,
    /// The FUSE session thread; `None` once unmounted.
    session: Option<BackgroundSession>,
    /// Where it is mounted (canonical).
    mountpoint: PathBuf,
}

impl PowerFs {
    /// Mounts `backing` (an existing directory holding the real data) at `mountpoint` (an
    /// existing empty dir). Err(one line saying why and what to do) when FUSE is unavailable
    /// (no /dev/fuse, not permitted, mount failed).
    pub fn mount(backing: &Path, mountpoint: &Path) -> Result<PowerFs, String> {
        let backing = existing_dir(backing, "backing directory")?;
        if let Ok(absolute) = std::path::absolute(mountpoint) {
            clear_dead_mount(&absolute);
        }
        let mountpoint = existing_dir(mountpoint, "mountpoint")?;
        if mountpoint.starts_with(&backing) || backing.starts_with(&mountpoint) {
            return Err(format!(
                "power-cut filesystem: the mountpoint {} and the backing directory {} lie inside \
                 each other; give two separate directories",
                mountpoint.display(),
                backing.display()
            ));
        }
        if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
            return Err(format!(
                "power-cut filesystem unavailable: cannot open /dev/fuse ({e}); load the fuse \
                 module and run drill as root (a container needs --device /dev/fuse \
                 --cap-add SYS_ADMIN), or drop the power-cut and fill_disk faults"
            ));
        }
        let state = Arc::new(Mutex::new(State::new(backing)));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName(FS_NAME.to_string()),
            MountOption::DefaultPermissions,
        ];
        let ops = Ops {
            state: Arc::clone(&state),
        };
        let session = fuser::Session::new(ops, &mountpoint, &config)
            .and_then(fuser::Session::spawn)
            .map_err(|e| {
                format!(
                    "power-cut filesystem unavailable: mounting FUSE at {} failed ({e}); run \
                     drill as root, or install fuse3 (fusermount3) for an unprivileged mount",
                    mountpoint.display()
                )
            })?;
        Ok(PowerFs {
            state,
            session: Some(session),
            mountpoint,
        })
    }

    /// Throws away every write not yet made durable by fsync/fdatasync (on that file).
    /// Returns what was lost. `torn`: each file's unsynced writes land instead, in order, except
    /// the last write's final 512-byte sector, which reads as zeros while the file keeps its
    /// size — a disk that lost power while writing back (a torn tail).
    /// `dirents`: the cut also forgets the creates, removals and renames that model does not
    /// keep (see [`PowerFs::track_dirents`], which must have been called with it or a stricter
    /// one); `None` keeps them all.
    pub fn power_cut(&self, torn: bool, dirents: Option<super::Dirents>) -> CutReport {
        lock(&self.state).power_cut(torn, dirents)
    }

    /// Logs directory changes from now on, so that a cut can forget those `strictest` (the
    /// strictest model any cut will name) does not keep: a removed or replaced file lives on
    /// beside the backing directory (`<backing>.unlinked`) until its change is durable.
    pub fn track_dirents(&self, strictest: super::Dirents) -> Result<(), String> {
        lock(&self.state).track_dirents(strictest).map_err(|e| {
            format!(
                "power-cut filesystem: cannot keep removed files beside the backing directory: {e}"
            )
        })
    }

    /// Directory changes logged and not yet durable, right now.
    pub fn dirents_pending(&self) -> usize {
        lock(&self.state).dirents_pending()
    }

    /// Cuts power by itself at `point`'s operation; then every change fails with EIO until
    /// [`PowerFs::revive`]. [`PowerFs::crash_signal`] wakes whoever waits for it.
    pub fn arm(&self, point: CrashPoint) {
        lock(&self.state).arm(point);
    }

    /// Disarms a crash point; whether it was still waiting (its operation never came).
    pub fn disarm(&self) -> bool {
        lock(&self.state).disarm()
    }

    /// The crash a crash point caused, once (then `None` until the next).
    pub fn take_crash(&self) -> Option<Crash> {
        lock(&self.state).take_crash()
    }

    /// Whether a crash point fired and its crash was not taken yet.
    pub fn has_crash(&self) -> bool {
        lock(&self.state).has_crash()
    }

    /// Notified when a crash point fires.
    pub fn crash_signal(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&lock(&self.state).crashed)
    }

    /// Power back after a crash point: changes are taken again.
    pub fn revive(&self) {
        lock(&self.state).revive();
    }

    /// The disk is full from now on: statfs reports 0 bytes free/available, and a write that
    /// would grow any file's size fails with ENOSPC (overwrites inside a file's current size
    /// still succeed).
    pub fn fill(&self) {
        lock(&self.state).set_full(true);
    }

    /// Space returns (statfs reports the backing filesystem's real numbers again).
    pub fn release(&self) {
        lock(&self.state).set_full(false);
    }

    /// Puts an I/O fault in force on the disk, beside any already in force.
    pub fn inject(&self, fault: super::IoFault) {
        lock(&self.state).inject(fault);
    }

    /// Ends every I/O fault in force.
    pub fn clear_io_faults(&self) {
        lock(&self.state).clear_io_faults();
    }

    /// Ends one I/O fault (the first in force equal to `fault`).
    pub fn remove_io_fault(&self, fault: &super::IoFault) {
        lock(&self.state).remove_io_fault(fault);
    }

    /// What the I/O faults did so far.
    pub fn io_failed(&self) -> super::IoFailed {
        lock(&self.state).io_failed
    }

    /// Bytes written and not yet synced, right now.
    pub fn unsynced_bytes(&self) -> u64 {
        lock(&self.state).unsynced_bytes()
    }

    /// Unmounts (also on Drop). Never leaves a stale mount: a busy mount is detached lazily.
    pub fn unmount(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let lazy = unmount_path(&self.mountpoint);
        // A clean unmount ends the FUSE thread at once; after a lazy one it serves the files
        // still open until they close, and is left to finish on its own.
        let wait = if lazy {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        };
        let deadline = Instant::now() + wait;
        while !session.guard.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if session.guard.is_finished() {
            let _ = session.join();
        } else {
            // Joined when the last file held open closes. Dropping the session now would have
            // fuser unmount the path once more, where by then another mount may sit.
            let _ = std::thread::Builder::new()
                .name("powerfs-reaper".into())
                .spawn(move || session.join());
        }
        if ours_mounted_at(&self.mountpoint) {
            last_resort_unmount(&self.mountpoint);
        }
    }
}

impl std::fmt::Debug for PowerFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerFs")
            .field("mountpoint", &self.mountpoint)
            .field("mounted", &self.session.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn existing_dir(path: &Path, what: &str) -> Result<PathBuf, String> {
    let canonical = path.canonicalize().map_err(|e| {
        format!(
            "power-cut filesystem: {what} {}: {e}; create it first",
            path.display()
        )
    })?;
    if !canonical.is_dir() {
        return Err(format!(
            "power-cut filesystem: {what} {} is not a directory",
            path.display()
        ));
    }
    Ok(canonical)
}

/// Unmounts `mountpoint`: plainly, else (busy) lazily, else (not permitted) through
/// `fusermount3 -u -z`. Returns whether the unmount was lazy.
fn unmount_path(mountpoint: &Path) -> bool {
    match nix::mount::umount2(mountpoint, MntFlags::empty()) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => false,
        Err(nix::errno::Errno::EBUSY) => {
            if nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH).is_err() {
                last_resort_unmount(mountpoint);
            }
            true
        }
        Err(_) => {
            last_resort_unmount(mountpoint);
            true
        }
    }
}

/// `fusermount3 -u -z`, then `umount -l`: for when the unmount syscall is not permitted.
fn last_resort_unmount(mountpoint: &Path) {
    for (program, args) in [("fusermount3", ["-u", "-z"]), ("umount", ["-l", "--"])] {
        let _ = Command::new(program)
            .args(args)
            .arg(mountpoint)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !ours_mounted_at(mountpoint) {
            return;
        }
    }
}

/// A power-cut filesystem left at `mountpoint` by a drill that died (its FUSE server gone, so
/// every access fails with ENOTCONN) is detached, so the new mount does not stack on a corpse.
fn clear_dead_mount(mountpoint: &Path) {
    if !ours_mounted_at(mountpoint) {
        return;
    }
    let dead = matches!(
        std::fs::metadata(mountpoint),
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOTCONN as i32)
    );
    if dead && nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH).is_err() {
        last_resort_unmount(mountpoint);
    }
}

/// Whether /proc/self/mountinfo lists a power-cut filesystem mounted at `mountpoint`.
fn ours_mounted_at(mountpoint: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    table.lines().any(|line| {
        let Some((left, right)) = line.split_once(" - ") else {
            return false;
        };
        let at = left.split(' ').nth(4).map(unescape_mount_path);
        let source = right.split(' ').nth(1);
        at.as_deref() == Some(mountpoint) && source == Some(FS_NAME)
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape_mount_path(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_powerfs_can_live_in_a_task() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<PowerFs>();
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_mount_path(r"/tmp/a\040b\134c"),
            PathBuf::from("/tmp/a b\\c")
        );
        assert_eq!(unescape_mount_path(r"/x\0"), PathBuf::from(r"/x\0"));
    }
}
