//! STUB until the powerfs branch lands.
use std::path::Path;

pub struct PowerFs;
#[derive(Debug, Default, Clone, Copy)]
pub struct CutReport {
    pub files: u64,
    pub writes: u64,
    pub bytes: u64,
}
impl PowerFs {
    pub fn mount(_backing: &Path, _mountpoint: &Path) -> Result<PowerFs, String> {
        Err("not built".into())
    }
    pub fn power_cut(&self) -> CutReport {
        CutReport::default()
    }
    pub fn fill(&self) {}
    pub fn release(&self) {}
    pub fn unsynced_bytes(&self) -> u64 {
        0
    }
    pub fn unmount(self) {}
}
