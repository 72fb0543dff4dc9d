//! Sources the engine reads from, which drill writes: a log file it tails ([`file`]), a Kafka
//! topic it consumes ([`kafka`]) or an outbox table it polls ([`outbox`]). drill writes each
//! record there itself, and a record counts as held once written and synced (a file),
//! acknowledged by the broker (a topic) or committed (a row); where the engine is in a file is
//! read from `/proc` ([`position`]), in a topic from its group's committed offset, in an outbox
//! from the rows it marked.

pub mod file;
pub mod kafka;
pub mod outbox;
pub mod position;

pub use crate::scenario::source::SourceAction;
pub use file::{FileSource, SourceAccount};
pub use kafka::KafkaSource;
pub use outbox::OutboxSource;
pub use position::EngineProcs;

/// The source a drill writes the records to, when the engine reads from one.
#[derive(Clone)]
pub enum Source {
    File(FileSource),
    Kafka(KafkaSource),
    Outbox(OutboxSource),
}

impl Source {
    /// The file, when the source is one (source faults act on it).
    pub fn file(&self) -> Option<&FileSource> {
        match self {
            Source::File(f) => Some(f),
            Source::Kafka(_) | Source::Outbox(_) => None,
        }
    }

    /// Whether the engine has read everything drill wrote: to the end of every file it holds
    /// open, its group committed to the topic's end, or no row is left unmarked.
    pub async fn read_to_end(&self, procs: EngineProcs) -> bool {
        match self {
            Source::File(f) => f.read_to_end(procs),
            Source::Kafka(k) => k.read_to_end().await,
            Source::Outbox(o) => o.read_to_end().await,
        }
    }

    /// Records the source holds that the engine has not read (a file, by its last seen read
    /// positions) or not passed (a topic's committed offset, an outbox's marks), for the chart.
    pub async fn unread(&self) -> Option<u64> {
        match self {
            Source::File(f) => Some(f.unread_records()),
            Source::Kafka(k) => k.unread().await,
            Source::Outbox(o) => o.unread().await,
        }
    }

    /// What the source knows after the drain: its account and the engine's checkpoint (a file
    /// source's is read where the scenario says, or where drill's own engine keeps it;
    /// `stats` is what the engine's stats endpoint said once the drain was over).
    pub async fn facts(
        &self,
        plan: &crate::scenario::Plan,
        data_dir: &Path,
        stats: Option<Result<serde_json::Value, String>>,
    ) -> SourceFacts {
        match (self, plan.file_source()) {
            (Source::File(f), Some(spec)) => {
                SourceFacts::gather(f, spec, plan.command.is_none(), data_dir, stats)
            }
            (Source::Kafka(k), _) => SourceFacts::gather_kafka(k).await,
            (Source::Outbox(o), _) => SourceFacts::gather_outbox(o).await,
            (Source::File(_), None) => SourceFacts::default(),
        }
    }

    /// Stops what the source started (a Kafka source's broker, an outbox's server).
    pub async fn stop(&self) {
        match self {
            Source::Kafka(k) => k.stop().await,
            Source::Outbox(o) => o.stop().await,
            Source::File(_) => {}
        }
    }
}

use std::collections::BTreeSet;
use std::path::Path;

use crate::scenario::source::{CheckpointAt, CheckpointSpec, FileSpec};

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
    /// Where it stood, in words: `inode 1234 offset 5678`, or one such per checkpoint file.
    pub said: String,
    /// The records it has passed (the source will not give them to the engine again).
    pub passed: BTreeSet<String>,
}

impl SourceFacts {
    /// The source's account, and the engine's checkpoint read from `data_dir` (or from
    /// `stats`, the engine's stats as read once the drain was over, where the spec says so).
    pub fn gather(
        source: &FileSource,
        spec: &FileSpec,
        builtin: bool,
        data_dir: &Path,
        stats: Option<Result<serde_json::Value, String>>,
    ) -> Self {
        let where_ = match (&spec.checkpoint, builtin) {
            (Some(c), _) => Some(c.clone()),
            (None, true) => Some(FileSpec::builtin_checkpoint()),
            (None, false) => None,
        };
        let mut facts = SourceFacts {
            account: source.account(),
            ..SourceFacts::default()
        };
        if let Some(c) = where_ {
            let read = match (&c.at, stats) {
                (CheckpointAt::Stats, Some(Ok(v))) => stats_checkpoint(source, &c, &v),
                (CheckpointAt::Stats, Some(Err(why))) => Err(why),
                (CheckpointAt::Stats, None) => {
                    Err("the engine's stats were not read after the drain".to_string())
                }
                (CheckpointAt::File(file), _) => checkpoint(source, file, &c, data_dir),
            };
            match read {
                Ok(read) => facts.checkpoint = Some(read),
                Err(why) => facts.checkpoint_unread = Some(why),
            }
        }
        facts
    }
}

impl SourceFacts {
    /// A Kafka source's checkpoint: the group's committed offset.
    pub async fn gather_kafka(source: &KafkaSource) -> Self {
        let mut facts = SourceFacts::default();
        match source.committed().await {
            Ok(Some(at)) => {
                facts.checkpoint = Some(Checkpoint {
                    said: format!("committed offset {at}"),
                    passed: source.passed_by(at),
                });
            }
            Ok(None) => facts.checkpoint_unread = Some("the group never committed".to_string()),
            Err(why) => facts.checkpoint_unread = Some(why),
        }
        facts
    }
}

impl SourceFacts {
    /// An outbox's checkpoint: the rows the engine marked or deleted.
    pub async fn gather_outbox(source: &OutboxSource) -> Self {
        let mut facts = SourceFacts::default();
        match source.passed().await {
            Ok((passed, left)) => {
                facts.checkpoint = Some(Checkpoint {
                    said: format!("{} rows marked or deleted, {left} left", passed.len()),
                    passed,
                });
            }
            Err(why) => facts.checkpoint_unread = Some(why),
        }
        facts
    }
}

/// The checkpoint in the engine's stats (inode and offset, by the spec's pointers): every
/// record of an earlier file and of its own up to the offset passed.
fn stats_checkpoint(
    source: &FileSource,
    c: &CheckpointSpec,
    stats: &serde_json::Value,
) -> Result<Checkpoint, String> {
    let (inode, offset) = pointers(stats, c, "in the engine's stats")?;
    passed_at(source, inode, offset).map(|mut read| {
        read.said.push_str(" (from the engine's stats)");
        read
    })
}

/// What a checkpoint at `offset` in the file with `inode` (the live file without one) passed.
fn passed_at(source: &FileSource, inode: Option<u64>, offset: u64) -> Result<Checkpoint, String> {
    let passed = source.passed_by(inode, offset).ok_or_else(|| {
        format!(
            "the engine's checkpoint names inode {} at offset {offset}, a file drill never wrote",
            inode.unwrap_or_default()
        )
    })?;
    let said = match inode {
        Some(ino) => format!("inode {ino} offset {offset}"),
        None => format!("offset {offset} in the live file"),
    };
    Ok(Checkpoint { said, passed })
}

/// One checkpoint file (inode and offset: every record of an earlier file and of its own up to
/// the offset passed), or, where `file` is a pattern with `*`, one file per source file (each
/// passes only its own file's records up to its offset; the inode from its JSON, or the first
/// number in its name that is an inode drill wrote: rsyslog's `imfile-state:<inode>:<hash>`).
fn checkpoint(
    source: &FileSource,
    file: &str,
    c: &CheckpointSpec,
    data_dir: &Path,
) -> Result<Checkpoint, String> {
    if !file.contains('*') {
        let (inode, offset) = read_checkpoint(&data_dir.join(file), c)?;
        return passed_at(source, inode, offset);
    }
    let (folder, pattern) = match file.rsplit_once('/') {
        Some((f, p)) => (data_dir.join(f), p.to_string()),
        None => (data_dir.to_path_buf(), file.to_string()),
    };
    let mut names: Vec<String> = std::fs::read_dir(&folder)
        .map_err(|e| format!("the engine's checkpoints {}: {e}", folder.display()))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| matches(&pattern, n))
        .collect();
    names.sort();
    let mut read = Checkpoint::default();
    let mut said = Vec::new();
    let mut unreadable = 0;
    for name in &names {
        // One half written or of another shape does not hide the others.
        let Ok((inode, offset)) = read_checkpoint(&folder.join(name), c) else {
            unreadable += 1;
            continue;
        };
        let inode = inode.or_else(|| {
            name.split(|ch: char| !ch.is_ascii_digit())
                .filter_map(|n| n.parse::<u64>().ok())
                .find(|n| source.wrote_inode(*n))
        });
        let Some(ino) = inode else { continue };
        if let Some(passed) = source.passed_in(ino, offset) {
            read.passed.extend(passed);
            said.push(format!("inode {ino} offset {offset}"));
        }
    }
    if said.is_empty() {
        return Err(format!(
            "no checkpoint file matching {} in {} names a file drill wrote",
            pattern,
            folder.display()
        ));
    }
    read.said = said.join(", ");
    if unreadable > 0 {
        read.said.push_str(&format!(
            " ({unreadable} matching files unreadable, passed over)"
        ));
    }
    Ok(read)
}

/// `*` matches any run of characters; anything else itself.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            name.starts_with(head)
                && (head.len()..=name.len())
                    .any(|i| name.is_char_boundary(i) && matches(rest, &name[i..]))
        }
    }
}

/// `(inode, offset)` from a JSON checkpoint file, by the spec's pointers.
pub fn read_checkpoint(path: &Path, spec: &CheckpointSpec) -> Result<(Option<u64>, u64), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("the engine's checkpoint {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the engine's checkpoint {}: not JSON: {e}", path.display()))?;
    pointers(&v, spec, &path.display().to_string())
}

/// `(inode, offset)` at the spec's pointers in `v`; `where_` names it in an error.
fn pointers(
    v: &serde_json::Value,
    spec: &CheckpointSpec,
    where_: &str,
) -> Result<(Option<u64>, u64), String> {
    let number = |pointer: &str| -> Result<u64, String> {
        let at = v
            .pointer(pointer)
            .ok_or_else(|| format!("the engine's checkpoint {where_} has nothing at {pointer}"))?;
        at.as_u64()
            .or_else(|| at.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| {
                format!("the engine's checkpoint {where_}: {pointer} is {at}, not a number")
            })
    };
    let offset = number(&spec.offset)?;
    let inode = spec.inode.as_deref().map(number).transpose()?;
    Ok((inode, offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Record;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_star_matches_any_run() {
        assert!(matches("imfile-state:*", "imfile-state:123:abc"));
        assert!(matches("*.json", "a.json") && !matches("*.json", "a.json.tmp"));
        assert!(matches("a*b*c", "a-b--c") && !matches("a*b*c", "a-c"));
        assert!(!matches("state", "state2"));
    }

    /// rsyslog's way: one state file per source file, the inode in its name.
    #[tokio::test]
    async fn per_file_checkpoints_pass_only_their_own_files_records() {
        let work = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let spec = FileSpec {
            name: "app.log".to_string(),
            rotate: None,
            checkpoint: Some(CheckpointSpec {
                at: CheckpointAt::File("imfile-state:*".to_string()),
                offset: "/curr_offs".to_string(),
                inode: None,
            }),
        };
        let src = FileSource::create(work.path(), &spec).unwrap();
        let records = |from: u64| -> Vec<Record> {
            (from..from + 4)
                .map(|i| Record {
                    id: format!("r/k0/{i}"),
                    key: "k0".to_string(),
                    seq: i,
                    index: i,
                    pad: String::new(),
                })
                .collect()
        };
        src.write(&records(0)).await;
        let old = std::fs::metadata(src.live_path()).unwrap().ino();
        let line = std::fs::read_to_string(src.live_path())
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .len()
            + 1;
        src.fault(SourceAction::Rotate).unwrap();
        src.write(&records(4)).await;
        let new = std::fs::metadata(src.live_path()).unwrap().ino();
        // The old file read 2 lines, the new one all 4.
        std::fs::write(
            data.path().join(format!("imfile-state:{old}:ab12")),
            format!("{{\"curr_offs\": {}}}", 2 * line),
        )
        .unwrap();
        std::fs::write(
            data.path().join(format!("imfile-state:{new}:cd34")),
            "{\"curr_offs\": 100000}",
        )
        .unwrap();
        let facts = SourceFacts::gather(&src, &spec, false, data.path(), None);
        let c = facts
            .checkpoint
            .unwrap_or_else(|| panic!("{:?}", facts.checkpoint_unread));
        let passed: Vec<&str> = c.passed.iter().map(String::as_str).collect();
        assert_eq!(
            passed,
            ["r/k0/0", "r/k0/1", "r/k0/4", "r/k0/5", "r/k0/6", "r/k0/7"]
        );
        assert!(
            c.said.contains(&format!("inode {old} offset {}", 2 * line)),
            "{}",
            c.said
        );
    }
}
