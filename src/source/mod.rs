//! Sources the engine reads from, which drill writes: a log file it tails ([`file`]). drill
//! writes each record there itself, and a record counts as held once written (and synced);
//! where the engine is in them is read from `/proc` ([`position`]).

pub mod file;
pub mod position;

pub use crate::scenario::source::SourceAction;
pub use file::{FileSource, SourceAccount};
pub use position::EngineProcs;

use std::collections::BTreeSet;
use std::path::Path;

use crate::scenario::source::{CheckpointSpec, FileSpec};

/// What the file source tells the verdict.
#[derive(Debug, Clone, Default)]
pub struct SourceFacts {
    pub account: SourceAccount,
    /// Where the engine's checkpoint stood after the drain, when the scenario says where it
    /// is (or the built-in engine keeps it).
    pub checkpoint: Option<Checkpoint>,
    /// Why the checkpoint could not be read, when it could not.
    pub checkpoint_unread: Option<String>,
}

/// The engine's checkpoint as read after the drain.
#[derive(Debug, Clone, Default)]
pub struct Checkpoint {
    pub inode: Option<u64>,
    pub offset: u64,
    /// The records it has passed (the source will not give them to the engine again).
    pub passed: BTreeSet<String>,
}

impl SourceFacts {
    /// The source's account, and the engine's checkpoint read from `data_dir`.
    pub fn gather(source: &FileSource, spec: &FileSpec, builtin: bool, data_dir: &Path) -> Self {
        let where_ = match (&spec.checkpoint, builtin) {
            (Some(c), _) => Some(c.clone()),
            (None, true) => Some(FileSpec::builtin_checkpoint()),
            (None, false) => None,
        };
        let mut facts = SourceFacts {
            account: source.account(),
            ..SourceFacts::default()
        };
        let Some(c) = where_ else {
            return facts;
        };
        match read_checkpoint(&data_dir.join(&c.file), &c) {
            Ok((inode, offset)) => match source.passed_by(inode, offset) {
                Some(passed) => {
                    facts.checkpoint = Some(Checkpoint {
                        inode,
                        offset,
                        passed,
                    })
                }
                None => {
                    facts.checkpoint_unread = Some(format!(
                        "the engine's checkpoint names inode {} at offset {offset}, a file drill never wrote",
                        inode.unwrap_or_default()
                    ))
                }
            },
            Err(why) => facts.checkpoint_unread = Some(why),
        }
        facts
    }
}

/// `(inode, offset)` from a JSON checkpoint file, by the spec's pointers.
pub fn read_checkpoint(path: &Path, spec: &CheckpointSpec) -> Result<(Option<u64>, u64), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("the engine's checkpoint {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the engine's checkpoint {}: not JSON: {e}", path.display()))?;
    let number = |pointer: &str| -> Result<u64, String> {
        let at = v.pointer(pointer).ok_or_else(|| {
            format!(
                "the engine's checkpoint {} has nothing at {pointer}",
                path.display()
            )
        })?;
        at.as_u64()
            .or_else(|| at.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| {
                format!(
                    "the engine's checkpoint {}: {pointer} is {at}, not a number",
                    path.display()
                )
            })
    };
    let offset = number(&spec.offset)?;
    let inode = spec.inode.as_deref().map(number).transpose()?;
    Ok((inode, offset))
}
