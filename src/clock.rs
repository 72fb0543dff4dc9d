//! The engine's wall clock, which drill can move for the engine's processes alone: a clock
//! fault (`{ target: engine, clock: jump, by: +2h }`).
//!
//! Through libfaketime, preloaded into the engine (`LD_PRELOAD`), reading its offset from a
//! file drill rewrites (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`: a running process
//! follows each rewrite). Only the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC=1`): no
//! real monotonic clock runs backwards, and an engine's timers and timeouts run on it. Files'
//! times are left alone (`NO_FAKE_STAT=1`).
//!
//! Measured limits ([`fakeable`] refuses such engines with the reason): a statically linked
//! program and a Go program never load the preloaded library, so their clock does not move;
//! Python 3.11's `time.sleep` fails under libfaketime once the monotonic clock is left alone
//! (`clock_nanosleep` on `CLOCK_MONOTONIC` answers EINVAL).
//!
//! This module owns the offset file and the environment; the runner says when to jump.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where Debian (and most distributions) put libfaketime.
const LIBFAKETIME: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// libfaketime's library, where it is installed: its thread-safe build (`libfaketimeMT`)
/// where there is one, since engines are multi-threaded. With the plain build a
/// `backoff-by-wall-clock` engine escaped a ten-minute jump back twice under load (once in
/// CI's selftest): a single read of the unmoved clock ends its stall. The suspected cause is
/// the plain build's unlocked re-reading of the offset file; with the thread-safe one, five such
/// engines side by side beside a correct one were all caught.
pub fn libfaketime() -> Option<PathBuf> {
    LIBFAKETIME
        .iter()
        .flat_map(|p| {
            [
                p.replace("libfaketime.so.1", "libfaketimeMT.so.1"),
                p.to_string(),
            ]
        })
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The engine's wall clock: an offset from the real one, in whole seconds.
#[derive(Debug)]
pub struct FakeClock {
    lib: PathBuf,
    file: PathBuf,
    offset_s: Mutex<i64>,
}

impl FakeClock {
    /// A clock at offset 0, its file in `work`. Fails when libfaketime is not installed.
    pub fn new(work: &Path) -> Result<FakeClock, String> {
        let lib = libfaketime().ok_or_else(|| {
            format!(
                "a clock fault moves the engine's wall clock through libfaketime, which is not installed (looked for {}); on Debian: apt-get install faketime",
                LIBFAKETIME[0]
            )
        })?;
        let clock = FakeClock {
            lib,
            file: work.join("engine-clock"),
            offset_s: Mutex::new(0),
        };
        clock
            .write(0)
            .map_err(|e| format!("{}: {e}", clock.file.display()))?;
        Ok(clock)
    }

    /// What the engine's processes are started with. `preload` is the engine's own
    /// `LD_PRELOAD`, if it has one: libfaketime goes first.
    pub fn env(&self, preload: Option<&str>) -> Vec<(String, String)> {
        let lib = self.lib.display().to_string();
        vec![
            (
                "LD_PRELOAD".to_string(),
                match preload.filter(|p| !p.is_empty()) {
                    Some(theirs) => format!("{lib}:{theirs}"),
                    None => lib,
                },
            ),
            (
                "FAKETIME_TIMESTAMP_FILE".to_string(),
                self.file.display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".to_string(), "1".to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
            ("NO_FAKE_STAT".to_string(), "1".to_string()),
        ]
    }

    /// Moves the engine's wall clock by `by_s` seconds (forward or back) from where it is;
    /// returns the offset from the real clock now.
    pub fn jump(&self, by_s: i64) -> std::io::Result<i64> {
        let mut offset = self.offset_s.lock().unwrap_or_else(|e| e.into_inner());
        let to = *offset + by_s;
        self.write(to)?;
        *offset = to;
        Ok(to)
    }

    /// The offset from the real clock, in seconds.
    pub fn offset_s(&self) -> i64 {
        *self.offset_s.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the offset whole (a temporary file renamed over the old): a process reading it
    /// at any moment sees the old offset or the new, never half a line.
    fn write(&self, offset_s: i64) -> std::io::Result<()> {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_s:+}\n"))?;
        std::fs::rename(&tmp, &self.file)
    }
}

/// Whether libfaketime can move `program`'s clock (a path, or a name looked up on `PATH`):
/// `Err` says why not. A program that cannot be found or read is let be (the start says why).
pub fn fakeable(program: &str) -> Result<(), String> {
    let Some(path) = resolve(program) else {
        return Ok(());
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with("python") {
        return Err(python(program));
    }
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    if let Some(first) = bytes.strip_prefix(b"#!") {
        let line = first.split(|b| *b == b'\n').next().unwrap_or_default();
        if String::from_utf8_lossy(line).contains("python") {
            return Err(python(program));
        }
        return Ok(());
    }
    match elf_kind(&bytes) {
        Some(Elf::Static) => Err(format!(
            "`{program}` is statically linked: it never loads libfaketime, so drill cannot move its clock"
        )),
        Some(Elf::Go) => Err(format!(
            "`{program}` is a Go program: Go reads the clock without the C library, so libfaketime cannot move it"
        )),
        _ => Ok(()),
    }
}

fn python(program: &str) -> String {
    format!(
        "`{program}` runs on Python: under libfaketime with the monotonic clock left alone, Python 3.11's time.sleep fails (clock_nanosleep on CLOCK_MONOTONIC: EINVAL), so drill cannot move its wall clock alone"
    )
}

fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .and_then(|p| std::fs::canonicalize(&p).ok().or(Some(p)))
}

#[derive(Debug, PartialEq, Eq)]
enum Elf {
    Dynamic,
    Static,
    Go,
}

/// A 64-bit little-endian ELF executable's kind: Go (a `.go.buildinfo` section), dynamic (it
/// has an interpreter, `PT_INTERP`) or static. `None` for anything else.
fn elf_kind(bytes: &[u8]) -> Option<Elf> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    let u16_at =
        |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?) as usize);
    let u32_at =
        |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize);
    let u64_at =
        |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?) as usize);
    let (shoff, shsize, shnum, shstrndx) =
        (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    let names = u64_at(shoff + shstrndx * shsize + 0x18);
    let go = (0..shnum).any(|i| {
        let name = u32_at(shoff + i * shsize).zip(names).map(|(n, at)| at + n);
        name.and_then(|at| bytes.get(at..at + 14)) == Some(b".go.buildinfo\0".as_slice())
    });
    if go {
        return Some(Elf::Go);
    }
    let (phoff, phsize, phnum) = (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?);
    let interp = (0..phnum).any(|i| u32_at(phoff + i * phsize) == Some(3));
    Some(if interp { Elf::Dynamic } else { Elf::Static })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_programs_are_fakeable_and_python_is_not() {
        assert_eq!(fakeable("sh"), Ok(()));
        let own = std::env::current_exe().unwrap();
        assert_eq!(
            elf_kind(&std::fs::read(&own).unwrap()),
            Some(Elf::Dynamic),
            "{}",
            own.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("engine.py");
        std::fs::write(&script, "#!/usr/bin/env python3\nprint(1)\n").unwrap();
        let why = fakeable(&script.display().to_string()).unwrap_err();
        assert!(why.contains("Python 3.11's time.sleep fails"), "{why}");
        assert!(fakeable("python3").is_err() || resolve("python3").is_none());
    }

    #[test]
    fn a_static_elf_is_refused() {
        // The smallest 64-bit little-endian ELF header with no program headers: static.
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        assert_eq!(elf_kind(&header), Some(Elf::Static));
        // One section (index 1) named `.go.buildinfo`, its names in section 1's bytes.
        let mut go = header.clone();
        let names_at = go.len();
        go.extend_from_slice(b"\0.go.buildinfo\0");
        let shoff = go.len();
        go[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        go[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        go[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        go[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        let mut section = vec![0u8; 64];
        section[..4].copy_from_slice(&1u32.to_le_bytes());
        section[0x18..0x20].copy_from_slice(&(names_at as u64).to_le_bytes());
        go.extend_from_slice(&[0u8; 64]);
        go.extend_from_slice(&section);
        assert_eq!(elf_kind(&go), Some(Elf::Go));
    }

    #[test]
    fn jumps_add_up_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let clock = FakeClock {
            lib: PathBuf::from("/lib/libfaketime.so.1"),
            file: dir.path().join("engine-clock"),
            offset_s: Mutex::new(0),
        };
        assert_eq!(clock.jump(7200).unwrap(), 7200);
        assert_eq!(clock.jump(-600).unwrap(), 6600);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("engine-clock")).unwrap(),
            "+6600\n"
        );
        let env = clock.env(Some("/x.so"));
        assert_eq!(env[0].1, "/lib/libfaketime.so.1:/x.so");
    }
}
