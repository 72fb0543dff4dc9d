//! A build without the power-cut filesystem (feature `powercut` off: a platform without FUSE,
//! or `--no-default-features`). [`PowerFs`] cannot exist; mounting says, in one line, what is
//! missing and which build has it, and the drill ends as an infrastructure failure (exit 3).

use std::path::Path;
use std::sync::Arc;

use super::{Crash, CrashPoint, CutReport};

/// What a drill that needs the power-cut filesystem is told by a build without it.
pub const MISSING: &str = "this drill binary was built without the power-cut filesystem \
     (feature `powercut`, Linux with FUSE); use a Linux build that has it: the release archives \
     and wheels for Linux, or `cargo install` with default features (`drill --version` lists a \
     build's features)";

/// Never constructed: no value of it exists in this build.
pub enum PowerFs {}

impl PowerFs {
    pub fn mount(_backing: &Path, _mountpoint: &Path) -> Result<PowerFs, String> {
        Err(MISSING.to_string())
    }
    pub fn power_cut(&self, _torn: bool, _dirents: Option<super::Dirents>) -> CutReport {
        match *self {}
    }
    pub fn track_dirents(&self, _strictest: super::Dirents) -> Result<(), String> {
        match *self {}
    }
    pub fn dirents_pending(&self) -> usize {
        match *self {}
    }
    pub fn arm(&self, _point: CrashPoint) {
        match *self {}
    }
    pub fn disarm(&self) -> bool {
        match *self {}
    }
    pub fn take_crash(&self) -> Option<Crash> {
        match *self {}
    }
    pub fn has_crash(&self) -> bool {
        match *self {}
    }
    pub fn crash_signal(&self) -> Arc<tokio::sync::Notify> {
        match *self {}
    }
    pub fn revive(&self) {
        match *self {}
    }
    pub fn fill(&self) {
        match *self {}
    }
    pub fn release(&self) {
        match *self {}
    }
    pub fn inject(&self, _fault: super::IoFault) {
        match *self {}
    }
    pub fn clear_io_faults(&self) {
        match *self {}
    }
    pub fn remove_io_fault(&self, _fault: &super::IoFault) {
        match *self {}
    }
    pub fn io_failed(&self) -> super::IoFailed {
        match *self {}
    }
    pub fn unsynced_bytes(&self) -> u64 {
        match *self {}
    }
    pub fn unmount(self) {
        match self {}
    }
}

impl std::fmt::Debug for PowerFs {
    fn fmt(&self, _f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}
