//! Sources the engine reads from, as the scenario names them:
//!
//! - `system.ingest: { kind: file, ... }`: a log file drill appends the records to and the
//!   engine tails — its name below `{work_dir}/source/`, how drill rotates it (`rotate:`), and
//!   where the engine keeps its checkpoint (`checkpoint:`);
//! - `system.ingest: { kind: kafka, topic, group }`: a topic on a Kafka-protocol broker drill
//!   starts, which drill produces the records into and the engine consumes in a consumer group;
//! - `system.ingest: { kind: postgres_outbox, table }`: an outbox table in a PostgreSQL drill
//!   starts, which drill inserts the records into and the engine polls, marking what it took.
//!
//! The sources themselves are drill's `source` module's.

use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::located::{Located, at};
use crate::units::Dur;
use serde_saphyr::Location;

/// The folder below the drill's work folder that holds the source file and its rotations.
pub const SOURCE_DIR: &str = "source";

/// The link in front of the server of a source drill starts (a Kafka source's broker, an
/// outbox's PostgreSQL): the engine reads its source through it, and link faults name it
/// (`link: source`).
pub const SOURCE_LINK: &str = "source";

/// `rotate:` as written.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRotate {
    /// `10s` (time) or `64KB` / `1MB` (size of the live file).
    every: String,
    /// `rename` (default: the live file becomes `NAME.1`, a new one is created),
    /// `copytruncate` (copied to `NAME.1`, then cut to zero length; drill writes nothing
    /// between), or `create` (the only one, and the default, for a `path` with a `*`: the next
    /// file is begun under the next number, the old one keeps its name).
    #[serde(default)]
    mode: Option<RotateMode>,
    /// Rotated files kept (`NAME.1` … `NAME.keep`); an older one is deleted. Default 5.
    #[serde(default)]
    keep: Option<u32>,
}

/// `checkpoint:` as written: where a user's engine keeps its read position.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCheckpoint {
    /// The checkpoint file, relative to `{data_dir}`; with `*` in its name, one file per source
    /// file (rsyslog's `imfile-state:*`), each passing only its own file's records. Not with
    /// `from: stats`.
    #[serde(default)]
    file: Option<String>,
    /// `file` (the default) or `stats`: the engine's stats endpoint (`system.stats`, or drill's
    /// own engine's `/stats`), read once the drain is over, before drill stops the engine.
    #[serde(default)]
    from: Option<CheckpointFrom>,
    /// Only `json`.
    #[serde(default)]
    format: Option<String>,
    /// A JSON pointer to the byte offset, e.g. `/offset`.
    offset: String,
    /// A JSON pointer to the file's inode number, e.g. `/inode` (without it the offset is
    /// taken to be in the live file).
    #[serde(default)]
    inode: Option<String>,
}

/// Where the engine keeps its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointFrom {
    File,
    Stats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RotateMode {
    Rename,
    Copytruncate,
    Create,
}

/// When drill rotates the live file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotateEvery {
    Time(Duration),
    Bytes(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotate {
    pub every: RotateEvery,
    pub mode: RotateMode,
    pub keep: u32,
}

/// Where the engine's checkpoint is and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSpec {
    pub at: CheckpointAt,
    pub offset: String,
    pub inode: Option<String>,
}

/// Where the checkpoint is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointAt {
    /// A file (or, with `*`, files) relative to `{data_dir}`.
    File(String),
    /// The engine's stats endpoint, read once the drain is over.
    Stats,
}

impl CheckpointSpec {
    /// Whether the checkpoint is read from the engine's stats endpoint.
    pub fn from_stats(&self) -> bool {
        self.at == CheckpointAt::Stats
    }
}

/// What a source fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceAction {
    Rotate,
    Truncate,
    Delete,
    Stall(Duration),
}

impl SourceAction {
    /// `rotate`, `stall 5s`: as the fault log says it.
    pub fn describe(&self) -> String {
        match self {
            SourceAction::Rotate => "rotate".to_string(),
            SourceAction::Truncate => "truncate".to_string(),
            SourceAction::Delete => "delete (a new file takes its name)".to_string(),
            SourceAction::Stall(d) => {
                format!("stall {} (a line half written)", crate::units::Dur(*d))
            }
        }
    }
}

/// A validated file source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// The live file's name below `{work_dir}/source/`.
    pub name: String,
    pub rotate: Option<Rotate>,
    pub checkpoint: Option<CheckpointSpec>,
}

impl FileSpec {
    /// The checkpoint drill's own engine keeps (`tail-checkpoint.json` in its data folder).
    pub fn builtin_checkpoint() -> CheckpointSpec {
        CheckpointSpec {
            at: CheckpointAt::File("tail-checkpoint.json".to_string()),
            offset: "/offset".to_string(),
            inode: Some("/inode".to_string()),
        }
    }
}

/// A validated Kafka source: the topic drill produces into and the group the engine consumes
/// it in (its committed offsets are the engine's checkpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSourceSpec {
    pub topic: String,
    pub group: String,
}

/// Validates a Kafka source; `here` is `system.ingest`'s place.
pub(super) fn kafka(
    topic: Option<String>,
    group: Option<String>,
    here: &Location,
) -> Result<KafkaSourceSpec, Located> {
    let topic = topic.unwrap_or_else(|| "drill-source".to_string());
    let group = group.unwrap_or_else(|| "drill-engine".to_string());
    for (field, name) in [("topic", &topic), ("group", &group)] {
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty()
            || name.len() > 200
            || !name.chars().all(legal)
            || name == "."
            || name == ".."
        {
            return Err(at(
                here,
                format!(
                    "field `system.ingest.{field}`: `{name}` must be 1 to 200 of a-z A-Z 0-9 . _ - (a Kafka name), e.g. {field}: drill-source"
                ),
            ));
        }
    }
    Ok(KafkaSourceSpec { topic, group })
}

/// A validated outbox source: the table drill inserts the records into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSpec {
    pub table: String,
}

/// Validates an outbox source; `here` is `system.ingest`'s place.
pub(super) fn outbox(table: Option<String>, here: &Location) -> Result<OutboxSpec, Located> {
    let table = table.unwrap_or_else(|| "drill_outbox".to_string());
    let plain = table
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && table
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && table.len() <= 63;
    if !plain {
        return Err(at(
            here,
            format!(
                "field `system.ingest.table`: `{table}` must be a plain SQL name (a-z, 0-9, _, not starting with a digit, at most 63), e.g. table: outbox"
            ),
        ));
    }
    Ok(OutboxSpec { table })
}

/// The fields of `system.ingest` a file source reads.
pub(super) struct RawFile {
    pub path: Option<String>,
    pub format: Option<String>,
    pub rotate: Option<Spanned<RawRotate>>,
    pub checkpoint: Option<Spanned<RawCheckpoint>>,
}

/// Validates a file source; `here` is `system.ingest`'s place.
pub(super) fn file(raw: RawFile, here: &Location) -> Result<FileSpec, Located> {
    let name = raw.path.unwrap_or_else(|| "records.log".to_string());
    if name.is_empty()
        || name.contains('/')
        || name.starts_with('.')
        || name.contains(['?', '['])
        || name.matches('*').count() > 1
    {
        return Err(at(
            here,
            format!(
                "field `system.ingest.path`: `{name}` must be a plain file name (drill writes it into {{work_dir}}/{SOURCE_DIR}/, and rotates it to NAME.1, NAME.2, ...), e.g. path: app.log, or a name with one `*` (app-*.log: drill numbers its files 000001, 000002, ... in place of the `*`)"
            ),
        ));
    }
    let glob = name.contains('*');
    if let Some(f) = raw.format.as_deref()
        && f != "json"
    {
        return Err(at(
            here,
            format!(
                "field `system.ingest.format`: `{f}`; drill writes each record as one JSON line (`json`, the default)"
            ),
        ));
    }
    let rotate = raw.rotate.map(|r| rotate(r, glob)).transpose()?;
    let checkpoint = raw.checkpoint.map(checkpoint).transpose()?;
    Ok(FileSpec {
        name,
        rotate,
        checkpoint,
    })
}

fn rotate(raw: Spanned<RawRotate>, glob: bool) -> Result<Rotate, Located> {
    let here = raw.referenced;
    let r = raw.value;
    let mode = match (r.mode, glob) {
        (None, true) | (Some(RotateMode::Create), true) => RotateMode::Create,
        (None, false) => RotateMode::Rename,
        (Some(RotateMode::Create), false) => {
            return Err(at(
                &here,
                "field `system.ingest.rotate.mode`: `create` begins each file under a new name, and `system.ingest.path` has no `*` for the number; write path: app-*.log, or rotate by rename or copytruncate".to_string(),
            ));
        }
        (Some(m), true) => {
            return Err(at(
                &here,
                format!(
                    "field `system.ingest.rotate.mode`: `{}` with a `*` in `system.ingest.path`; a glob's files each keep their name and rotate by `create` (the default)",
                    if m == RotateMode::Rename {
                        "rename"
                    } else {
                        "copytruncate"
                    }
                ),
            ));
        }
        (Some(m), false) => m,
    };
    let every = parse_every(&r.every)
        .map_err(|m| at(&here, format!("field `system.ingest.rotate.every`: {m}")))?;
    let keep = r.keep.unwrap_or(5);
    if keep == 0 || keep > 100 {
        return Err(at(
            &here,
            "field `system.ingest.rotate.keep`: 1 to 100 rotated files".to_string(),
        ));
    }
    Ok(Rotate { every, mode, keep })
}

/// `10s` or `64KB`, `1MB`, `4096B`.
fn parse_every(text: &str) -> Result<RotateEvery, String> {
    let t = text.trim();
    if let Some(size) = crate::units::Size::parse(t) {
        return match size {
            Ok(crate::units::Size(n)) if n >= 256 => Ok(RotateEvery::Bytes(n)),
            _ => Err(format!(
                "`{text}`: a size of at least 256 bytes, e.g. 64KB or 1MB"
            )),
        };
    }
    match Dur::parse(t) {
        Ok(d) if d.0 >= Duration::from_millis(200) => Ok(RotateEvery::Time(d.0)),
        Ok(_) => Err(format!("`{text}`: at least 200ms between rotations")),
        Err(_) => Err(format!(
            "`{text}` is neither a time (10s) nor a size (64KB, 1MB)"
        )),
    }
}

fn checkpoint(raw: Spanned<RawCheckpoint>) -> Result<CheckpointSpec, Located> {
    let here = raw.referenced;
    let c = raw.value;
    let field =
        |f: &str, m: String| at(&here, format!("field `system.ingest.checkpoint.{f}`: {m}"));
    if let Some(f) = c.format.as_deref()
        && f != "json"
    {
        return Err(field("format", format!("`{f}`; only `json` is read")));
    }
    let place = match (c.from, c.file) {
        (Some(CheckpointFrom::Stats), Some(file)) => {
            return Err(field(
                "file",
                format!(
                    "`{file}` with `from: stats`: the checkpoint is read from the engine's stats endpoint; drop `file` or `from`"
                ),
            ));
        }
        (Some(CheckpointFrom::Stats), None) => CheckpointAt::Stats,
        (_, None) => {
            return Err(field(
                "file",
                "missing; name the engine's checkpoint file inside {data_dir} (file: positions.json), or read it from the engine's stats (from: stats)".to_string(),
            ));
        }
        (_, Some(file)) => CheckpointAt::File(checkpoint_file(file).map_err(|m| field("file", m))?),
    };
    for (name, pointer) in [("offset", Some(&c.offset)), ("inode", c.inode.as_ref())] {
        if let Some(p) = pointer
            && !p.starts_with('/')
        {
            return Err(field(
                name,
                format!("`{p}` is not a JSON pointer; write it as /field or /a/b"),
            ));
        }
    }
    Ok(CheckpointSpec {
        at: place,
        offset: c.offset,
        inode: c.inode,
    })
}

/// A checkpoint file's name: inside `{data_dir}`, a `*` only in the file's own name.
fn checkpoint_file(file: String) -> Result<String, String> {
    if file.is_empty() || file.starts_with('/') || file.split('/').any(|p| p == "..") {
        return Err(format!(
            "`{file}` must be a path inside the engine's data folder ({{data_dir}}), e.g. file: positions.json"
        ));
    }
    if file
        .rsplit_once('/')
        .is_some_and(|(dir, _)| dir.contains('*'))
    {
        return Err(format!(
            "`{file}`: a `*` may stand only in the file's name, not in its folders"
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_is_a_time_or_a_size() {
        assert_eq!(
            parse_every("10s"),
            Ok(RotateEvery::Time(Duration::from_secs(10)))
        );
        assert_eq!(parse_every("64KB"), Ok(RotateEvery::Bytes(65536)));
        assert_eq!(parse_every("1MB"), Ok(RotateEvery::Bytes(1 << 20)));
        assert!(parse_every("100B").unwrap_err().contains("256 bytes"));
        assert!(parse_every("10ms").unwrap_err().contains("200ms"));
        assert!(parse_every("often").unwrap_err().contains("neither"));
    }
}
