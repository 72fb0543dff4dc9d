//! The power-cut filesystem on a real FUSE mount: real files, real fsync, real processes.
//! A write is visible at once and gone after a cut unless fsync or fdatasync made it durable;
//! a process started after the cut sees only the synced bytes; renames, readdir and unlink pass
//! through; a filled disk refuses growth with ENOSPC and recovers; an injected fsync error reaches
//! the caller and what it covered is read back yet lost at the next cut; unmount never leaves a
//! mount.
//! Needs /dev/fuse and root: under `CI` their absence fails the test; elsewhere the test says
//! so and skips.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use drill::powerfs::{CrashOp, CrashPoint, CutReport, IoEffect, IoErrno, IoFault, IoOp, PowerFs};

/// A mounted power-cut filesystem over a fresh backing directory. Fields drop in order: the
/// mount goes before the directories under it.
struct Rig {
    fs: PowerFs,
    mnt: tempfile::TempDir,
    backing: tempfile::TempDir,
}

impl Rig {
    fn mnt(&self, name: &str) -> PathBuf {
        self.mnt.path().join(name)
    }

    fn backing(&self, name: &str) -> PathBuf {
        self.backing.path().join(name)
    }
}

/// Mounts a rig, or explains why it cannot: a failure under CI, a skip elsewhere.
fn rig() -> Option<Rig> {
    let unavailable = |why: String| {
        assert!(
            std::env::var_os("CI").is_none(),
            "the power-cut filesystem cannot mount under CI: {why}; CI must run as root with \
             /dev/fuse"
        );
        eprintln!("skipped: {why}; run as root with /dev/fuse (CI does)");
        None
    };
    if !Path::new("/dev/fuse").exists() {
        return unavailable("/dev/fuse does not exist".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return unavailable("not running as root".into());
    }
    let backing = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    match PowerFs::mount(backing.path(), mnt.path()) {
        Ok(fs) => Some(Rig { fs, mnt, backing }),
        Err(why) => unavailable(why),
    }
}

macro_rules! rig_or_skip {
    () => {
        match rig() {
            Some(rig) => rig,
            None => return,
        }
    };
}

fn mounted(at: &Path) -> bool {
    let at = at.to_str().unwrap();
    fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(at))
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// What a fresh process reads: `cat` for the content, `stat` for the size.
fn read_by_new_process(path: &Path) -> (Vec<u8>, u64) {
    let cat = Command::new("cat").arg(path).output().unwrap();
    assert!(cat.status.success(), "cat {}: {:?}", path.display(), cat);
    let stat = Command::new("stat")
        .args(["-c", "%s"])
        .arg(path)
        .output()
        .unwrap();
    let size = String::from_utf8(stat.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (cat.stdout, size)
}

#[test]
fn unsynced_writes_are_read_back_then_lost_in_a_power_cut() {
    let rig = rig_or_skip!();
    let path = rig.mnt("segment-0001.log");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"synced\n").unwrap();
    f.sync_data().unwrap();
    f.write_all(b"lost one\n").unwrap();
    f.write_all(b"lost two\n").unwrap();

    // Read-your-writes, through another handle and through stat.
    assert_eq!(fs::read(&path).unwrap(), b"synced\nlost one\nlost two\n");
    assert_eq!(fs::metadata(&path).unwrap().len(), 25);
    assert_eq!(rig.fs.unsynced_bytes(), 18);
    assert_eq!(
        fs::read(rig.backing("segment-0001.log")).unwrap(),
        b"synced\n"
    );
    drop(f);

    let cut = rig.fs.power_cut(false, None);
    assert_eq!(
        cut,
        CutReport {
            files: 1,
            writes: 2,
            bytes: 18,
            torn: 0,
            entries: 0,
        }
    );
    assert_eq!(fs::read(&path).unwrap(), b"synced\n");
    assert_eq!(fs::metadata(&path).unwrap().len(), 7);
    assert_eq!(rig.fs.unsynced_bytes(), 0);
    assert_eq!(rig.fs.power_cut(false, None), CutReport::default());
}

/// A crash point on the third fdatasync of a `*.log`, torn: the process's third fdatasync(2)
/// fails with EIO, the file on disk holds the first two synced appends whole and the third
/// append but its last sector (zeros, the size kept); nothing changes until power is back.
#[test]
fn a_crash_point_on_the_third_fdatasync_leaves_a_torn_tail() {
    let rig = rig_or_skip!();
    let path = rig.mnt("records-1.log");
    let mut f = File::create(&path).unwrap();
    let mut marks = File::create(rig.mnt("marks")).unwrap();
    rig.fs.arm(CrashPoint {
        op: CrashOp::Fdatasync,
        path: "*.log".to_string(),
        nth: 3,
        torn: true,
        dirents: None,
    });
    for (i, byte) in [b'a', b'b'].into_iter().enumerate() {
        f.write_all(&[byte; 700]).unwrap();
        f.sync_data().unwrap();
        marks.write_all(&[byte]).unwrap();
        marks.sync_data().unwrap(); // not a *.log: not counted
        assert!(rig.fs.take_crash().is_none(), "fdatasync {} of 3", i + 1);
    }
    f.write_all(&[b'c'; 700]).unwrap();
    let err = f
        .sync_data()
        .expect_err("the third fdatasync is where power goes");
    assert_eq!(err.raw_os_error(), Some(nix::libc::EIO));
    let crash = rig.fs.take_crash().expect("the crash point fired");
    assert_eq!((crash.cut.files, crash.cut.torn), (1, 1));
    assert!(f.write_all(b"more").is_err(), "no power: no change");
    drop((f, marks));
    let disk = fs::read(rig.backing("records-1.log")).unwrap();
    assert_eq!(disk.len(), 2100, "the torn append's size reached the disk");
    assert!(disk[..1400].iter().all(|b| *b == b'a' || *b == b'b'));
    // 2100 - 1 = 2099: the last sector begins at 2048.
    assert!(disk[1400..2048].iter().all(|b| *b == b'c'));
    assert!(disk[2048..].iter().all(|b| *b == 0));
    assert_eq!(
        fs::read(&path).unwrap(),
        disk,
        "a reader sees what the disk holds"
    );
    rig.fs.revive();
    OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"d")
        .unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 2101);
}

#[test]
fn fdatasync_makes_a_write_survive_and_a_later_append_does_not() {
    let rig = rig_or_skip!();
    let path = rig.mnt("journal.jsonl");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let acked = b"{\"id\":1}\n".repeat(100);
    f.write_all(&acked).unwrap();
    f.sync_data().unwrap();
    f.write_all(b"{\"id\":2}\n").unwrap();
    assert_eq!(fs::read(rig.backing("journal.jsonl")).unwrap(), acked);
    assert_eq!(fs::metadata(&path).unwrap().len(), acked.len() as u64 + 9);

    let cut = rig.fs.power_cut(false, None);
    assert_eq!((cut.files, cut.writes, cut.bytes), (1, 1, 9));
    assert_eq!(fs::read(&path).unwrap(), acked);
    assert_eq!(fs::read(rig.backing("journal.jsonl")).unwrap(), acked);

    // A truncate is held like a write: synced it stays, unsynced it is undone.
    f.set_len(9).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 9);
    rig.fs.power_cut(false, None);
    assert_eq!(fs::read(&path).unwrap(), acked);
    f.set_len(9).unwrap();
    f.sync_all().unwrap();
    rig.fs.power_cut(false, None);
    assert_eq!(fs::read(&path).unwrap(), b"{\"id\":1}\n");
}

#[test]
fn a_killed_writer_loses_its_unsynced_tail_and_a_new_process_sees_only_synced_bytes() {
    let rig = rig_or_skip!();
    let path = rig.mnt("records.log");
    let script = "import os, sys, time\n\
                  fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n\
                  os.write(fd, b'acked 1\\n')\n\
                  os.fsync(fd)\n\
                  os.write(fd, b'not acked 2\\n')\n\
                  print('ready', flush=True)\n\
                  time.sleep(60)\n";
    let mut writer = Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 on PATH");
    let mut line = String::new();
    BufReader::new(writer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    writer.kill().unwrap(); // SIGKILL
    writer.wait().unwrap();

    // A kill alone loses nothing: the data is where the page cache would have kept it.
    let (content, size) = read_by_new_process(&path);
    assert_eq!(content, b"acked 1\nnot acked 2\n");
    assert_eq!(size, 20);

    let cut = rig.fs.power_cut(false, None);
    assert_eq!((cut.files, cut.bytes), (1, 12));
    let (content, size) = read_by_new_process(&path);
    assert_eq!(content, b"acked 1\n");
    assert_eq!(size, 8);
    assert_eq!(fs::read(rig.backing("records.log")).unwrap(), b"acked 1\n");

    // And the next writer appends after the synced bytes, not after the lost ones.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"acked 3\n").unwrap();
    f.sync_data().unwrap();
    assert_eq!(read_by_new_process(&path).0, b"acked 1\nacked 3\n");
}

#[test]
fn atomic_replace_readdir_mkdir_and_unlink_pass_through() {
    let rig = rig_or_skip!();
    let state = rig.mnt("state.json");
    fs::write(&state, b"{\"v\":1}").unwrap();
    File::open(&state).unwrap().sync_all().unwrap();

    // The atomic-replace pattern: write a temp file, fsync it, rename it over.
    let tmp = rig.mnt("state.json.tmp");
    let mut f = File::create(&tmp).unwrap();
    f.write_all(b"{\"v\":2}").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(names(rig.mnt.path()), ["state.json", "state.json.tmp"]);
    fs::rename(&tmp, &state).unwrap();
    assert_eq!(names(rig.mnt.path()), ["state.json"]);
    assert_eq!(rig.fs.power_cut(false, None), CutReport::default());
    assert_eq!(fs::read(&state).unwrap(), b"{\"v\":2}");
    assert_eq!(fs::read(rig.backing("state.json")).unwrap(), b"{\"v\":2}");

    // Without the fsync the rename survives and the content does not (the ext4 lesson).
    fs::write(&tmp, b"{\"v\":3}").unwrap();
    fs::rename(&tmp, &state).unwrap();
    assert_eq!(fs::read(&state).unwrap(), b"{\"v\":3}");
    assert_eq!(rig.fs.power_cut(false, None).bytes, 7);
    assert_eq!(fs::read(&state).unwrap(), b"");

    // Directories: made, renamed with their files, listed, removed.
    fs::create_dir(rig.mnt("spool")).unwrap();
    fs::write(rig.mnt("spool/a"), b"aaa").unwrap();
    File::open(rig.mnt("spool/a")).unwrap().sync_data().unwrap();
    fs::rename(rig.mnt("spool"), rig.mnt("spool.old")).unwrap();
    assert_eq!(fs::read(rig.mnt("spool.old/a")).unwrap(), b"aaa");
    assert_eq!(names(rig.mnt.path()), ["spool.old", "state.json"]);
    assert_eq!(names(&rig.backing("spool.old")), ["a"]);

    // Unlink drops the file and its unsynced writes.
    fs::write(rig.mnt("spool.old/b"), b"bbbb").unwrap();
    assert_eq!(rig.fs.unsynced_bytes(), 4);
    fs::remove_file(rig.mnt("spool.old/b")).unwrap();
    assert_eq!(rig.fs.unsynced_bytes(), 0);
    fs::remove_file(rig.mnt("spool.old/a")).unwrap();
    fs::remove_dir(rig.mnt("spool.old")).unwrap();
    assert_eq!(names(rig.mnt.path()), ["state.json"]);
    assert_eq!(names(rig.backing.path()), ["state.json"]);
}

/// `dirents: posix` on a real mount: a segment a process created, wrote and fdatasynced is
/// gone for a new process after the cut unless the process fsynced the directory; a rename
/// over a file reverts to the old name; the unlinked file kept beside the backing directory
/// is cleaned up with the mount.
#[test]
fn a_cut_forgets_entries_whose_directory_was_not_fsynced() {
    use drill::powerfs::Dirents;
    let rig = rig_or_skip!();
    rig.fs.track_dirents(Dirents::Posix).unwrap();
    let write_synced = |name: &str, bytes: &[u8]| {
        let mut f = File::create(rig.mnt(name)).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_data().unwrap();
    };
    let sync_dir = || File::open(rig.mnt.path()).unwrap().sync_all().unwrap();

    write_synced("records-1.log", b"acked");
    write_synced("state.tmp", b"new");
    sync_dir();
    write_synced("records-2.log", b"acked too");
    fs::rename(rig.mnt("state.tmp"), rig.mnt("records-1.log")).unwrap();
    assert_eq!(names(rig.mnt.path()), ["records-1.log", "records-2.log"]);
    assert_eq!(rig.fs.dirents_pending(), 2);

    let cut = rig.fs.power_cut(false, Some(Dirents::Posix));
    assert_eq!((cut.entries, cut.writes), (2, 0));
    assert_eq!(names(rig.mnt.path()), ["records-1.log", "state.tmp"]);
    assert_eq!(read_by_new_process(&rig.mnt("records-1.log")).0, b"acked");
    assert_eq!(read_by_new_process(&rig.mnt("state.tmp")).0, b"new");

    // Synced this time: the cut keeps it.
    write_synced("records-2.log", b"acked too");
    sync_dir();
    assert_eq!(rig.fs.power_cut(false, Some(Dirents::Posix)).entries, 0);
    assert_eq!(
        read_by_new_process(&rig.mnt("records-2.log")).0,
        b"acked too"
    );

    // A removal not synced brings the file back; the kept copy lives beside the backing.
    fs::remove_file(rig.mnt("records-2.log")).unwrap();
    let kept = PathBuf::from(format!("{}.unlinked", rig.backing.path().display()));
    assert_eq!(fs::read_dir(&kept).unwrap().count(), 1);
    assert_eq!(rig.fs.power_cut(false, Some(Dirents::Posix)).entries, 1);
    assert_eq!(
        read_by_new_process(&rig.mnt("records-2.log")).0,
        b"acked too"
    );
    let Rig {
        fs: mounted_fs,
        mnt,
        backing,
    } = rig;
    mounted_fs.unmount();
    assert!(!kept.exists(), "{} outlived the mount", kept.display());
    drop((mnt, backing));
}

#[test]
fn a_filled_disk_refuses_growth_with_enospc_until_released() {
    let rig = rig_or_skip!();
    let path = rig.mnt("segment.log");
    let mut f = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"0123456789").unwrap();
    f.sync_data().unwrap();

    rig.fs.fill();
    let full = nix::sys::statvfs::statvfs(rig.mnt.path()).unwrap();
    assert_eq!(full.blocks_available(), 0);
    assert_eq!(full.blocks_free(), 0);
    let refused = f.write_all(b"more").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(28), "{refused}");
    // An overwrite inside the file's size still succeeds.
    let inside = OpenOptions::new().write(true).open(&path).unwrap();
    inside.write_all_at(b"AB", 0).unwrap();
    inside.sync_data().unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"AB23456789");
    // A new file can be made, but not given a byte.
    let refused = fs::write(rig.mnt("new.log"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(28), "{refused}");

    rig.fs.release();
    let real = nix::sys::statvfs::statvfs(rig.backing.path()).unwrap();
    let back = nix::sys::statvfs::statvfs(rig.mnt.path()).unwrap();
    assert!(back.blocks_available() > 0);
    assert_eq!(back.blocks(), real.blocks());
    f.write_all(b"more").unwrap();
    f.sync_data().unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"AB23456789more");
}

#[test]
fn unmount_leaves_no_mount_even_with_files_held_open() {
    // Plain unmount.
    let rig = rig_or_skip!();
    let at = rig.mnt.path().to_path_buf();
    assert!(mounted(&at));
    fs::write(rig.mnt("f"), b"x").unwrap();
    let Rig { fs, mnt, backing } = rig;
    fs.unmount();
    assert!(!mounted(&at), "still mounted after unmount");
    assert!(
        names(mnt.path()).is_empty(),
        "the mountpoint shows its own empty dir again"
    );
    drop((mnt, backing));

    // A writer killed while it held a file open.
    let rig = rig_or_skip!();
    let at = rig.mnt.path().to_path_buf();
    let mut holder = hold_open(&rig.mnt("held"));
    holder.kill().unwrap();
    holder.wait().unwrap();
    let Rig { fs, mnt, backing } = rig;
    fs.unmount();
    assert!(!mounted(&at), "still mounted after unmount (killed holder)");
    drop((mnt, backing));

    // A process still alive and holding a file: the mount is detached at once.
    let rig = rig_or_skip!();
    let at = rig.mnt.path().to_path_buf();
    let mut holder = hold_open(&rig.mnt("held"));
    let Rig { fs, mnt, backing } = rig;
    let started = Instant::now();
    fs.unmount();
    assert!(!mounted(&at), "still mounted after unmount (live holder)");
    eprintln!("unmount with a live holder took {:?}", started.elapsed());
    holder.kill().unwrap();
    holder.wait().unwrap();
    drop((mnt, backing));

    // Drop unmounts too.
    let rig = rig_or_skip!();
    let at = rig.mnt.path().to_path_buf();
    let Rig { fs, mnt, backing } = rig;
    drop(fs);
    assert!(!mounted(&at), "still mounted after drop");
    drop((mnt, backing));
}

/// The environment variable that turns [`helper_mounts_and_waits_to_be_killed`] into a mount
/// held by a process the test can SIGKILL.
const HELPER_AT: &str = "DRILL_POWERFS_HELPER_AT";

/// Not a test of its own: with `DRILL_POWERFS_HELPER_AT=backing:mountpoint` it mounts there,
/// says so and sleeps, to be SIGKILLed like a drill that died. Without it, it does nothing.
#[test]
fn helper_mounts_and_waits_to_be_killed() {
    let Some(at) = std::env::var_os(HELPER_AT) else {
        return;
    };
    let at = at.into_string().unwrap();
    let (backing, mountpoint) = at.split_once(':').unwrap();
    let fs = PowerFs::mount(Path::new(backing), Path::new(mountpoint)).unwrap();
    println!("mounted");
    std::thread::sleep(std::time::Duration::from_secs(60));
    drop(fs);
}

#[test]
fn a_mount_left_dead_by_a_killed_drill_is_cleared_by_the_next_mount() {
    // The rig only proves FUSE works here; the dead mount is made by a child process.
    let Some(rig) = rig() else {
        return;
    };
    let Rig { fs, mnt, backing } = rig;
    fs.unmount();
    let _leave_no_mount = LazyUnmount(mnt.path().to_path_buf());
    let mut drill = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            // Its name in the suite binary (tests/suite.rs): the module, then the test.
            "powerfs::helper_mounts_and_waits_to_be_killed",
            "--nocapture",
        ])
        .env(
            HELPER_AT,
            format!("{}:{}", backing.path().display(), mnt.path().display()),
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(drill.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "mounted" {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "the helper never mounted"
        );
    }
    drill.kill().unwrap();
    drill.wait().unwrap();
    let dead = fs::metadata(mnt.path()).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(107), "ENOTCONN expected: {dead}");

    let fs = PowerFs::mount(backing.path(), mnt.path()).unwrap();
    fs::write(mnt.path().join("alive"), b"yes").unwrap();
    assert_eq!(fs::read(mnt.path().join("alive")).unwrap(), b"yes");
    fs.unmount();
    assert!(
        !mounted(mnt.path()),
        "a mount is left at {}",
        mnt.path().display()
    );
}

/// Should the test fail half way, the dead mount it made does not outlive it.
struct LazyUnmount(PathBuf);

impl Drop for LazyUnmount {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// A shell holding `path` open for append, ready when it said so.
fn hold_open(path: &Path) -> std::process::Child {
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg("exec 3>>\"$1\"; printf unsynced >&3; echo ready; exec sleep 60")
        .arg("sh")
        .arg(path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    holder
}

#[test]
fn the_mount_refuses_a_mountpoint_inside_the_backing_directory() {
    let backing = tempfile::tempdir().unwrap();
    fs::create_dir(backing.path().join("mnt")).unwrap();
    let err = PowerFs::mount(backing.path(), &backing.path().join("mnt"))
        .expect_err("nested directories are refused");
    assert!(err.contains("inside each other"), "{err}");
    let err = PowerFs::mount(&backing.path().join("missing"), backing.path())
        .expect_err("a missing backing directory is refused");
    assert!(err.contains("create it first"), "{err}");
}

#[test]
fn ten_megabytes_in_4k_writes_with_a_sync_every_64k_completes() {
    let rig = rig_or_skip!();
    let path = rig.mnt("bulk.log");
    let chunk: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let started = Instant::now();
    let mut f = File::create(&path).unwrap();
    for i in 0..2560 {
        f.write_all(&chunk).unwrap();
        if (i + 1) % 16 == 0 {
            f.sync_data().unwrap();
        }
    }
    let took = started.elapsed();
    eprintln!("10 MiB in 4 KiB writes, fdatasync every 64 KiB: {took:?}");
    assert_eq!(rig.fs.unsynced_bytes(), 0);
    assert_eq!(
        fs::metadata(rig.backing("bulk.log")).unwrap().len(),
        10 * 1024 * 1024
    );
    let back = fs::read(&path).unwrap();
    assert!(back.chunks(4096).all(|c| c == chunk.as_slice()));
}

/// An fsync error injected on the real mount reaches the process as EIO; the file still reads
/// what it wrote, a retried fsync answers 0 and writes none of it, and the next power cut loses
/// it: an engine that retries and believes is caught by the cut. Other operations answer their
/// injected errno while the fault is in force.
#[test]
fn an_fsync_error_reaches_the_caller_and_a_retry_does_not_make_it_durable() {
    let rig = rig_or_skip!();
    let path = rig.mnt("records.log");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"synced\n").unwrap();
    f.sync_data().unwrap();
    rig.fs.inject(IoFault {
        op: IoOp::Fsync,
        path: "*.log".to_string(),
        effect: IoEffect::Error(IoErrno::Eio),
        nth: Some(1),
    });
    f.write_all(b"doomed\n").unwrap();
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::EIO), "{e}");
    assert_eq!(fs::read(&path).unwrap(), b"synced\ndoomed\n");
    f.sync_all().expect("a retried fsync answers 0");
    assert_eq!(fs::read(rig.backing("records.log")).unwrap(), b"synced\n");
    drop(f);
    let cut = rig.fs.power_cut(false, None);
    assert_eq!((cut.files, cut.bytes), (1, 7));
    assert_eq!(fs::read(&path).unwrap(), b"synced\n");
    let failed = rig.fs.io_failed();
    assert_eq!((failed.fsyncs, failed.bytes_dropped), (1, 7));
    // A write error while in force; the rest of the disk untouched.
    rig.fs.inject(IoFault {
        op: IoOp::Write,
        path: "records.log".to_string(),
        effect: IoEffect::Error(IoErrno::Enospc),
        nth: None,
    });
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    let e = f.write_all(b"more\n").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "{e}");
    fs::write(rig.mnt("other.log"), b"ok").unwrap();
    rig.fs.clear_io_faults();
    f.write_all(b"more\n").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"synced\nmore\n");
}

/// `disk: slow`: an fsync on a matching file answers 300 ms late, from a timer — the
/// filesystem serves FUSE on one thread, and it answers other operations meanwhile (stat,
/// write and read of another file, each measured). After the fault ends, fsync is prompt.
#[test]
fn a_slow_fsync_answers_late_and_the_disk_answers_everything_else_meanwhile() {
    let rig = rig_or_skip!();
    let path = rig.mnt("records.log");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"first\n").unwrap();
    let delay = std::time::Duration::from_millis(300);
    let slow = IoFault {
        op: IoOp::Fsync,
        path: "*.log".to_string(),
        effect: IoEffect::Slow(delay),
        nth: None,
    };
    rig.fs.inject(slow.clone());
    let syncing = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        f.sync_data().unwrap();
        (started.elapsed(), f)
    });
    // While that fsync waits for its answer, other operations answer at once.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let other = rig.mnt("other.dat");
    let mut others = Vec::new();
    for i in 0..10u8 {
        let t = std::time::Instant::now();
        fs::write(&other, [i; 64]).unwrap();
        assert_eq!(fs::read(&other).unwrap(), [i; 64]);
        fs::metadata(&path).unwrap();
        others.push(t.elapsed());
    }
    let (took, mut f) = syncing.join().unwrap();
    let slowest = others.iter().max().unwrap();
    println!(
        "slow fsync answered in {took:?}; a write+read+stat beside it: slowest {slowest:?} of 10"
    );
    assert!(took >= delay, "the fsync answered in {took:?}");
    assert!(
        *slowest < std::time::Duration::from_millis(100),
        "other operations waited for the slow fsync: {others:?}"
    );
    // It took effect when asked: the backing file holds it.
    assert_eq!(fs::read(rig.backing("records.log")).unwrap(), b"first\n");
    assert_eq!(rig.fs.io_failed().delayed, 1);
    rig.fs.remove_io_fault(&slow);
    f.write_all(b"second\n").unwrap();
    let t = std::time::Instant::now();
    f.sync_data().unwrap();
    assert!(
        t.elapsed() < delay,
        "fsync after the fault ended: {:?}",
        t.elapsed()
    );
}
