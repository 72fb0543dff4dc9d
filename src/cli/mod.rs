//! The `drill` command line, in the library so that the binary is one call (`src/main.rs`):
//! a release build then compiles this code once, with the rest of the library, instead of
//! in a second crate after it (docs/src/build-times.md). `command.rs` parses flags and
//! dispatches, and holds the bodies of the small commands (`list`, `schema`, `proxy`,
//! `agent`, `engine`, `bench`); `run`, `check`, `selftest`, `diff`, `init` and `merge` are
//! modules of their own.

pub mod check;
mod command;
pub mod diff;
pub mod explore;
pub mod init;
pub mod merge;
pub mod run;
pub mod selftest;
pub mod shard;

pub use command::main;

/// Exit codes (docs/src/design.md#6-interfaces).
pub const PASS: u8 = 0;
pub const FAIL: u8 = 1;
pub const INVALID: u8 = 2;
pub const INFRASTRUCTURE: u8 = 3;

/// Scenario files named on the command line: files as given, directories as their `*.yaml` /
/// `*.yml` files (not recursive), sorted. A path that is neither is an error (exit 2).
pub fn scenario_files(paths: &[std::path::PathBuf]) -> Result<Vec<std::path::PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| format!("{}: cannot list the folder: {e}", path.display()))?;
            let mut found: Vec<std::path::PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                })
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(format!(
                    "{}: no scenario files (*.yaml) in this folder",
                    path.display()
                ));
            }
            files.extend(found);
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            return Err(format!(
                "{}: no such file or folder; give scenario files or folders of them",
                path.display()
            ));
        }
    }
    Ok(files)
}
