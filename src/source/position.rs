//! Where the engine is in the files it reads: the `pos` of every file descriptor the engine's
//! processes hold open for reading, from `/proc/<pid>/fdinfo`, by inode. Linux only; an engine
//! on another host, or one that has a file closed, shows nothing.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Which processes are the engine: its leader, and (for a user's engine started in a process
/// group of its own) every process of that group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineProcs {
    pub pid: Option<u32>,
    pub group: Option<u32>,
}

/// For each inode of `dev` that one of the engine's processes has open for reading: the
/// furthest read position among its descriptors.
pub fn read_positions(procs: EngineProcs, dev: u64) -> HashMap<u64, u64> {
    let mut out = HashMap::new();
    for pid in pids(procs) {
        let fd_dir = format!("/proc/{pid}/fd");
        let Ok(entries) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::metadata(entry.path()) else {
                continue;
            };
            if !meta.is_file() || meta.dev() != dev {
                continue;
            }
            let fd = entry.file_name();
            let info = Path::new("/proc")
                .join(pid.to_string())
                .join("fdinfo")
                .join(&fd);
            let Some((pos, flags)) = std::fs::read_to_string(info).ok().and_then(|t| fdinfo(&t))
            else {
                continue;
            };
            // O_WRONLY: a writer (drill's own, if it were in the group) reads nothing.
            if flags & 0o3 == 0o1 {
                continue;
            }
            let at = out.entry(meta.ino()).or_insert(0);
            *at = (*at).max(pos);
        }
    }
    out
}

/// `pos:` and `flags:` (octal) of an fdinfo text.
fn fdinfo(text: &str) -> Option<(u64, u64)> {
    let mut pos = None;
    let mut flags = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("pos:") {
            pos = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("flags:") {
            flags = u64::from_str_radix(v.trim(), 8).ok();
        }
    }
    Some((pos?, flags?))
}

/// The engine's processes: the leader, and every process whose group is the engine's.
fn pids(procs: EngineProcs) -> Vec<u32> {
    let mut out: Vec<u32> = procs.pid.into_iter().collect();
    let Some(group) = procs.group else {
        return out;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if Some(pid) == procs.pid {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if process_group(&stat) == Some(group) {
            out.push(pid);
        }
    }
    out
}

/// The process group in a `/proc/<pid>/stat` line: the third field after the command name
/// (which is in parentheses and may hold spaces).
fn process_group(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn fdinfo_and_stat_are_read() {
        assert_eq!(
            fdinfo("pos:\t120\nflags:\t0100002\nmnt_id:\t29\n"),
            Some((120, 0o100002))
        );
        assert_eq!(fdinfo("flags:\t02\n"), None);
        assert_eq!(process_group("42 (a b) c) S 1 4242 4242 0"), Some(4242));
    }

    #[test]
    fn a_reader_in_this_process_is_seen_at_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![b'x'; 1000]).unwrap();
        let mut reader = std::fs::File::open(&path).unwrap();
        let mut buf = [0u8; 300];
        reader.read_exact(&mut buf).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let seen = read_positions(
            EngineProcs {
                pid: Some(std::process::id()),
                group: None,
            },
            meta.dev(),
        );
        assert_eq!(seen.get(&meta.ino()), Some(&300));
    }
}
