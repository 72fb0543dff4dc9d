//! `system: { command: [...] }`: an engine nobody here wrote, as the scenario describes it —
//! its argv (never a shell), environment, config templates, ingest kind, readiness, optional
//! stats, where it puts its write key, and the promise it declares.
//!
//! This module owns the placeholder language of argv, `env` values and template files:
//! `{ingest}` `{ingest.host}` `{ingest.port}` `{ingest.path}` (a file source's live file)
//! `{ingest.topic}` `{ingest.group}` (a Kafka source's topic and the engine's group, reached at
//! `{link.source}`) `{ingest.table}` `{ingest.dsn}` (an outbox table and a connection string to
//! its database through `{link.source}`) `{link.NAME}` `{link.NAME.host}`
//! `{link.NAME.port}` `{topic}` `{data_dir}` `{work_dir}` `{scenario_dir}` `{port.NAME}` `{run}`,
//! and with `destination.tls` `{tls.ca_file}` (mutual TLS: `{tls.client_cert_file}`,
//! `{tls.client_key_file}`); `{{` and `}}` stand for a literal brace. An unknown placeholder is an invalid
//! scenario. Rendering happens in the runner, once the ports and links exist; validation
//! here makes sure rendering cannot fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::located::{Located, at};
use crate::units::Dur;
use crate::verify::WriteKeyPlace;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIngest {
    #[schemars(with = "IngestKind")]
    kind: Spanned<IngestKind>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    batch: Option<usize>,
    /// `kind: mqtt`: the topic drill publishes to on the engine's listener; `kind: kafka`: the
    /// source topic drill produces into (default `drill-source`).
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    qos: Option<u8>,
    /// `kind: mqtt`: the protocol drill speaks to the engine's listener, `"5"` (the default)
    /// or `"3.1.1"` (what older brokers and bridges take: RabbitMQ's MQTT plugin).
    #[serde(default)]
    version: Option<String>,
    /// `kind: postgres_outbox`: the outbox table (default `drill_outbox`).
    #[serde(default)]
    table: Option<String>,
    /// `kind: kafka`: the consumer group the engine consumes the source topic in (default
    /// `drill-engine`).
    #[serde(default)]
    group: Option<String>,
    /// `kind: file`: `json` (the default, and the only one).
    #[serde(default)]
    format: Option<String>,
    /// `kind: file`: how drill rotates the file.
    #[serde(default)]
    #[schemars(with = "Option<super::source::RawRotate>")]
    rotate: Option<Spanned<super::source::RawRotate>>,
    /// `kind: file`: where the engine keeps its read position.
    #[serde(default)]
    #[schemars(with = "Option<super::source::RawCheckpoint>")]
    checkpoint: Option<Spanned<super::source::RawCheckpoint>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum IngestKind {
    Http,
    Mqtt,
    TcpLines,
    Relp,
    /// drill appends each record as one line to a file the engine tails.
    File,
    /// drill produces each record into a topic on a Kafka-protocol broker it starts; the
    /// engine consumes it in a consumer group.
    Kafka,
    /// drill inserts each record as a row of an outbox table in a PostgreSQL it starts; the
    /// engine polls it and marks what it took.
    PostgresOutbox,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReady {
    #[serde(default)]
    http: Option<String>,
    #[serde(default)]
    tcp: Option<bool>,
    #[serde(default)]
    log: Option<String>,
    /// `http`: which port (`ingest`, the default, or a `{port.NAME}` name).
    #[serde(default)]
    port: Option<String>,
    #[serde(default)]
    within: Option<Dur>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStats {
    path: String,
    #[serde(default)]
    port: Option<String>,
    #[serde(default)]
    waiting: Option<String>,
    #[serde(default)]
    failed: Option<String>,
    #[serde(default)]
    held: Option<String>,
    #[serde(default)]
    delivered: Option<String>,
}

/// `system.write_key`: one field naming the place — `json_field: PATH`, or the destination
/// kind's own (`mqtt_user_property: NAME`, `kafka_header: NAME`, `nats_msg_id: true`; each
/// kind says which in `dest`).
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub(super) struct RawWriteKey(BTreeMap<String, serde_json::Value>);

impl schemars::JsonSchema for RawWriteKey {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RawWriteKey".into()
    }

    /// One property per place: `json_field` and every destination kind's own field.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut properties = serde_json::Map::new();
        properties.insert(
            "json_field".to_string(),
            serde_json::json!({ "type": "string", "description": "a field of the message's JSON (dotted path)" }),
        );
        for kind in crate::dest::Kind::ALL {
            let (field, json_type) = kind.write_key_field();
            let about = format!("a `{}` destination's own place", kind.name());
            properties.insert(
                field.to_string(),
                serde_json::json!({ "type": json_type, "description": about }),
            );
        }
        schemars::json_schema!({
            "type": "object",
            "properties": properties,
            "additionalProperties": false,
            "minProperties": 1,
            "maxProperties": 1
        })
    }
}

/// The raw `system:` fields of a command engine (deserialized in `raw.rs`).
pub(super) struct RawCommand {
    pub command: Vec<Spanned<String>>,
    pub env: BTreeMap<String, Spanned<String>>,
    pub files: BTreeMap<String, Spanned<String>>,
    pub ingest: Option<Spanned<RawIngest>>,
    pub ready: Option<Spanned<RawReady>>,
    pub stats: Option<Spanned<RawStats>>,
    pub write_key: Option<Spanned<RawWriteKey>>,
    pub stop_grace: Option<Dur>,
}

/// A user's engine, validated.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// argv templates; `argv[0] == "drill"` means drill's own executable.
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Template files: name in `{work_dir}` ← template text (read when the scenario was
    /// loaded).
    pub files: Vec<(String, String)>,
    pub ingest: IngestSpec,
    pub ready: Ready,
    pub ready_within: Duration,
    pub stats: Option<StatsSpec>,
    /// Where the engine puts the write key at the destination (`None`: nowhere drill can see).
    pub write_key: Option<WriteKeyPlace>,
    /// Every `{port.NAME}` name used anywhere: drill picks a free port for each.
    pub ports: BTreeSet<String>,
    /// SIGTERM → SIGKILL grace for `stop` and at the end of the drill.
    pub stop_grace: Duration,
}

/// How drill hands records to the engine, and what counts as held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestSpec {
    /// POST NDJSON batches of at most `batch` lines to `path`: 2xx = every line held.
    Http { path: String, batch: usize },
    /// Publish each record to `topic` on the engine's MQTT listener: the PUBACK means held.
    /// `v311`: MQTT 3.1.1 instead of 5 (its PUBACK has no reason code: it always means held).
    Mqtt { topic: String, qos: u8, v311: bool },
    /// Newline-delimited records on a TCP connection: no acknowledgement exists.
    TcpLines,
    /// Each record as an RFC 5424 message on a RELP session to the engine's listener: its
    /// `rsp 200` means held (an engine whose input is syslog, e.g. rsyslog's `imrelp`).
    Relp,
    /// drill appends each record as one JSON line to a file in `{work_dir}/source/` and
    /// fsyncs it: written = held. The engine tails the file.
    File(super::source::FileSpec),
    /// drill produces each record into a source topic on a Kafka-protocol broker it starts
    /// (the broker's acknowledgement = held); the engine consumes it in a consumer group,
    /// through the link `source`.
    Kafka(super::source::KafkaSourceSpec),
    /// drill inserts each record as a row of an outbox table (its commit = held); the engine
    /// polls it through the link `source` and marks (`sent_at`) or deletes what it took.
    PostgresOutbox(super::source::OutboxSpec),
}

impl IngestSpec {
    pub fn name(&self) -> &'static str {
        match self {
            IngestSpec::Http { .. } => "http",
            IngestSpec::Mqtt { .. } => "mqtt",
            IngestSpec::TcpLines => "tcp_lines",
            IngestSpec::Relp => "relp",
            IngestSpec::File(_) => "file",
            IngestSpec::Kafka(_) => "kafka",
            IngestSpec::PostgresOutbox(_) => "postgres_outbox",
        }
    }
}

/// When the engine counts as started (also sent to a `drill agent`, which checks it there).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ready {
    /// `GET path` on the port (`None` = the ingest port) answers 2xx.
    Http { path: String, port: Option<String> },
    /// The ingest port accepts a TCP connection.
    Tcp,
    /// A line of the engine's output matches this regex.
    Log(String),
}

/// Where the engine's own account is, and its field names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSpec {
    pub path: String,
    /// `None` = the ingest port.
    pub port: Option<String>,
    pub waiting: String,
    pub failed: String,
    pub held: Option<String>,
    pub delivered: Option<String>,
}

/// Validates a command engine. `destination` names the links and where its write key may be;
/// `scenario_dir` is
/// where template files are found; `anchor` locates errors that belong to the section as a
/// whole.
pub(super) fn validate(
    raw: RawCommand,
    destination: &crate::dest::Spec,
    scenario_dir: &Path,
    anchor: &serde_saphyr::Location,
) -> Result<CommandSpec, Located> {
    let ingest = match raw.ingest {
        None => {
            return Err(at(
                anchor,
                "field `system.ingest`: missing; say how drill feeds the engine, e.g. ingest: { kind: http, path: /ingest }".to_string(),
            ));
        }
        Some(i) => {
            let here = i.referenced;
            (ingest(i)?, here)
        }
    };
    let (ingest, ingest_at) = ingest;
    let kafka = matches!(ingest, IngestSpec::Kafka(_));
    let outbox = matches!(ingest, IngestSpec::PostgresOutbox(_));
    let mut link_names = destination.link_names();
    if kafka || outbox {
        link_names.push(crate::scenario::source::SOURCE_LINK.to_string());
    }
    let links = &Known {
        links: link_names,
        tls: destination.tls.as_ref().map(|t| t.client_certificates()),
        file: matches!(ingest, IngestSpec::File(_)),
        kafka,
        outbox,
    };
    let mut ports = BTreeSet::new();
    if raw.command.is_empty() {
        return Err(at(
            anchor,
            "field `system.command`: empty; give the engine's argv, e.g. [python3, \"{scenario_dir}/forwarder.py\", --ingest, \"{ingest}\"]".to_string(),
        ));
    }
    for (i, arg) in raw.command.iter().enumerate() {
        check_placeholders(&arg.value, links, &mut ports)
            .map_err(|m| at(&arg.referenced, format!("field `system.command[{i}]`: {m}")))?;
    }
    let mut env = BTreeMap::new();
    for (name, value) in raw.env {
        check_placeholders(&value.value, links, &mut ports)
            .map_err(|m| at(&value.referenced, format!("field `system.env.{name}`: {m}")))?;
        env.insert(name, value.value);
    }
    let files = templates(raw.files, scenario_dir, links, &mut ports)?;
    let (ready, ready_within) = match raw.ready {
        None => (Ready::Tcp, Duration::from_secs(20)),
        Some(r) => ready(r, &ports)?,
    };
    let stats = match raw.stats {
        None => None,
        Some(s) => Some(stats(s, &ports)?),
    };
    if let IngestSpec::File(f) = &ingest
        && f.checkpoint.as_ref().is_some_and(|c| c.from_stats())
        && stats.is_none()
    {
        return Err(at(
            &ingest_at,
            "field `system.ingest.checkpoint.from`: `stats` reads the engine's stats endpoint, and `system.stats` names none; add stats: { path: /stats } (with the engine's field names) or read a checkpoint file".to_string(),
        ));
    }
    let write_key = match raw.write_key {
        None => None,
        Some(w) => Some(write_key(w, destination)?),
    };
    Ok(CommandSpec {
        argv: raw.command.into_iter().map(|a| a.value).collect(),
        env,
        files,
        ingest,
        ready,
        ready_within,
        stats,
        write_key,
        ports,
        stop_grace: raw
            .stop_grace
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(10)),
    })
}

/// `system.stats`: where the engine's own account is (a path on the ingest port or a named
/// one), and its field names.
fn stats(s: Spanned<RawStats>, ports: &BTreeSet<String>) -> Result<StatsSpec, Located> {
    if let Some(p) = &s.value.port
        && !ports.contains(p)
        && p != "ingest"
    {
        return Err(at(
            &s.referenced,
            format!(
                "field `system.stats.port`: `{p}` is not a port the command uses; use `ingest` or a name from a {{port.NAME}} placeholder"
            ),
        ));
    }
    if !s.value.path.starts_with('/') {
        return Err(at(
            &s.referenced,
            "field `system.stats.path`: must start with `/`".to_string(),
        ));
    }
    let s = s.value;
    Ok(StatsSpec {
        path: s.path,
        port: s.port.filter(|p| p != "ingest"),
        waiting: s.waiting.unwrap_or_else(|| "waiting".to_string()),
        failed: s.failed.unwrap_or_else(|| "failed".to_string()),
        held: Some(s.held.unwrap_or_else(|| "held".to_string())),
        delivered: Some(s.delivered.unwrap_or_else(|| "delivered".to_string())),
    })
}

/// `system.files`: template files by plain name, each read now and its placeholders checked.
fn templates(
    raw: BTreeMap<String, Spanned<String>>,
    scenario_dir: &Path,
    links: &Known,
    ports: &mut BTreeSet<String>,
) -> Result<Vec<(String, String)>, Located> {
    let mut files = Vec::new();
    for (name, template) in raw {
        if name.is_empty() || name.contains('/') || name.contains("..") {
            return Err(at(
                &template.referenced,
                format!(
                    "field `system.files`: `{name}` must be a plain file name (it is written into {{work_dir}})"
                ),
            ));
        }
        let source = scenario_dir.join(&template.value);
        let text = std::fs::read_to_string(&source).map_err(|e| {
            at(
                &template.referenced,
                format!(
                    "field `system.files.{name}`: cannot read the template {}: {e}",
                    source.display()
                ),
            )
        })?;
        for (n, line) in text.lines().enumerate() {
            check_placeholders(line, links, ports).map_err(|m| {
                at(
                    &template.referenced,
                    format!(
                        "field `system.files.{name}`: {}:{}: {m}",
                        source.display(),
                        n + 1
                    ),
                )
            })?;
        }
        files.push((name, text));
    }
    Ok(files)
}

/// `system.write_key`: exactly one place — `json_field`, or the destination kind's own field.
fn write_key(
    raw: Spanned<RawWriteKey>,
    destination: &crate::dest::Spec,
) -> Result<WriteKeyPlace, Located> {
    let imp = &destination.imp;
    let (own, _) = destination.kind.write_key_field();
    let fail = |m: String| at(&raw.referenced, format!("field `system.write_key`: {m}"));
    let mut fields = raw.value.0.into_iter();
    let (Some((field, value)), None) = (fields.next(), fields.next()) else {
        return Err(fail(format!(
            "give exactly one of {own} (this `{}` destination's own place) or json_field",
            destination.kind.name()
        )));
    };
    if field == "json_field" {
        return match value.as_str() {
            Some(path) if !path.is_empty() => Ok(WriteKeyPlace::JsonField(path.to_string())),
            _ => Err(fail(
                "json_field: the field's dotted path, e.g. meta.key".to_string(),
            )),
        };
    }
    if field != own {
        return Err(fail(format!(
            "`{field}` is no place a `{}` destination has; use {own} or json_field",
            destination.kind.name()
        )));
    }
    imp.write_key_place(&value)
        .map_err(|m| fail(format!("{own}: {m}")))
}

impl IngestKind {
    fn name(self) -> &'static str {
        match self {
            IngestKind::Http => "http",
            IngestKind::Mqtt => "mqtt",
            IngestKind::TcpLines => "tcp_lines",
            IngestKind::Relp => "relp",
            IngestKind::File => "file",
            IngestKind::Kafka => "kafka",
            IngestKind::PostgresOutbox => "postgres_outbox",
        }
    }

    /// The fields of `system.ingest` this kind takes besides `kind`.
    fn takes(self) -> &'static [&'static str] {
        match self {
            IngestKind::Http => &["path", "batch"],
            IngestKind::Mqtt => &["topic", "qos", "version"],
            IngestKind::TcpLines | IngestKind::Relp => &[],
            IngestKind::File => &["path", "format", "rotate", "checkpoint"],
            IngestKind::Kafka => &["topic", "group"],
            IngestKind::PostgresOutbox => &["table"],
        }
    }
}

/// `system.ingest`: a field its kind does not take is refused first, then each kind's own.
pub(super) fn ingest(raw: Spanned<RawIngest>) -> Result<IngestSpec, Located> {
    let i = raw.value;
    let here = raw.referenced;
    let kind = i.kind.value;
    let given = [
        ("path", i.path.is_some()),
        ("batch", i.batch.is_some()),
        ("topic", i.topic.is_some()),
        ("qos", i.qos.is_some()),
        ("version", i.version.is_some()),
        ("format", i.format.is_some()),
        ("rotate", i.rotate.is_some()),
        ("checkpoint", i.checkpoint.is_some()),
        ("group", i.group.is_some()),
        ("table", i.table.is_some()),
    ];
    if let Some((field, _)) = given
        .iter()
        .find(|(field, set)| *set && !kind.takes().contains(field))
    {
        return Err(at(
            &here,
            format!(
                "field `system.ingest.{field}`: not used by `kind: {}`; remove it",
                kind.name()
            ),
        ));
    }
    match kind {
        IngestKind::File => {
            let raw = super::source::RawFile {
                path: i.path,
                format: i.format,
                rotate: i.rotate,
                checkpoint: i.checkpoint,
            };
            Ok(IngestSpec::File(super::source::file(raw, &here)?))
        }
        IngestKind::Http => {
            let path = i.path.unwrap_or_else(|| "/ingest".to_string());
            if !path.starts_with('/') {
                return Err(at(
                    &here,
                    "field `system.ingest.path`: must start with `/`".to_string(),
                ));
            }
            let batch = i.batch.unwrap_or(50);
            if batch == 0 || batch > 10_000 {
                return Err(at(
                    &here,
                    "field `system.ingest.batch`: 1 to 10000 records per request".to_string(),
                ));
            }
            Ok(IngestSpec::Http { path, batch })
        }
        IngestKind::Mqtt => {
            let qos = i.qos.unwrap_or(1);
            if qos != 1 {
                return Err(at(
                    &here,
                    "field `system.ingest.qos`: drill publishes at QoS 1 (the PUBACK is what \"held\" means); QoS 0 has no answer and QoS 2 is not supported".to_string(),
                ));
            }
            let topic = i.topic.ok_or_else(|| {
                at(
                    &here,
                    "field `system.ingest.topic`: missing; the topic drill publishes to on the engine's listener, e.g. topic: in/drill".to_string(),
                )
            })?;
            if topic.is_empty() || topic.contains(['+', '#']) {
                return Err(at(
                    &here,
                    "field `system.ingest.topic`: a topic name, without wildcards".to_string(),
                ));
            }
            let v311 = match i.version.as_deref().map(str::trim) {
                None | Some("5" | "5.0") => false,
                Some("3.1.1") => true,
                Some(other) => {
                    return Err(at(
                        &here,
                        format!(
                            "field `system.ingest.version`: `{other}`; drill speaks MQTT \"5\" (the default) or \"3.1.1\" (quote it: YAML reads 5 and 3.1 as numbers)"
                        ),
                    ));
                }
            };
            Ok(IngestSpec::Mqtt { topic, qos, v311 })
        }
        IngestKind::TcpLines => Ok(IngestSpec::TcpLines),
        IngestKind::Relp => Ok(IngestSpec::Relp),
        IngestKind::Kafka => Ok(IngestSpec::Kafka(super::source::kafka(
            i.topic, i.group, &here,
        )?)),
        IngestKind::PostgresOutbox => Ok(IngestSpec::PostgresOutbox(super::source::outbox(
            i.table, &here,
        )?)),
    }
}

fn ready(raw: Spanned<RawReady>, ports: &BTreeSet<String>) -> Result<(Ready, Duration), Located> {
    let r = raw.value;
    let here = raw.referenced;
    let within = r.within.map(|d| d.0).unwrap_or(Duration::from_secs(20));
    let chosen = [r.http.is_some(), r.tcp == Some(true), r.log.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if chosen != 1 {
        return Err(at(
            &here,
            "field `system.ready`: give exactly one of http: /path, tcp: true, log: \"regex\""
                .to_string(),
        ));
    }
    if let Some(p) = &r.port
        && (r.http.is_none() || (!ports.contains(p) && p != "ingest"))
    {
        return Err(at(
            &here,
            format!(
                "field `system.ready.port`: `{p}` goes with `http:` and must be `ingest` or a name from a {{port.NAME}} placeholder"
            ),
        ));
    }
    let ready = if let Some(path) = r.http {
        if !path.starts_with('/') {
            return Err(at(
                &here,
                "field `system.ready.http`: a path starting with `/`".to_string(),
            ));
        }
        Ready::Http {
            path,
            port: r.port.filter(|p| p != "ingest"),
        }
    } else if let Some(pattern) = r.log {
        regex_lite::Regex::new(&pattern).map_err(|e| {
            at(
                &here,
                format!("field `system.ready.log`: not a regular expression: {e}"),
            )
        })?;
        Ready::Log(pattern)
    } else {
        Ready::Tcp
    };
    Ok((ready, within))
}

/// One piece of a template: text as is, or a placeholder's name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Name(&'a str),
}

/// Splits a template into text and placeholders; an unclosed `{` is an error.
fn pieces(text: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(['{', '}']) {
        if i > 0 {
            out.push(Piece::Text(&rest[..i]));
        }
        let c = rest.as_bytes()[i] as char;
        let after = &rest[i + 1..];
        if after.starts_with(c) {
            out.push(Piece::Brace(c));
            rest = &after[1..];
        } else if c == '}' {
            out.push(Piece::Brace('}'));
            rest = after;
        } else {
            let end = after.find('}').ok_or_else(|| {
                format!(
                    "`{{` without a closing `}}` in `{text}` (write `{{{{` for a literal brace)"
                )
            })?;
            out.push(Piece::Name(&after[..end]));
            rest = &after[end + 1..];
        }
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

const FIXED: [&str; 9] = [
    "ingest",
    "ingest.host",
    "ingest.port",
    "ingest.path",
    "topic",
    "data_dir",
    "work_dir",
    "scenario_dir",
    "run",
];

/// What the destination lets a user's engine name: its links, and the TLS files when the
/// broker speaks TLS (`Some(true)`: with a client certificate).
struct Known {
    links: Vec<String>,
    tls: Option<bool>,
    /// The engine tails a file drill writes (`{ingest.path}` has a value).
    file: bool,
    /// The engine consumes a source topic (`{ingest.topic}`, `{ingest.group}` have values).
    kafka: bool,
    /// The engine polls an outbox table (`{ingest.table}`, `{ingest.dsn}` have values).
    outbox: bool,
}

/// Checks every placeholder in `text` is known; collects `{port.NAME}` names.
fn check_placeholders(
    text: &str,
    known: &Known,
    ports: &mut BTreeSet<String>,
) -> Result<(), String> {
    let links = &known.links;
    for piece in pieces(text)? {
        let Piece::Name(name) = piece else { continue };
        if name == "ingest.path" && !known.file {
            return Err(
                "`{ingest.path}` is the file drill writes for `ingest: { kind: file }`; this engine's ingest is another kind".to_string(),
            );
        }
        if matches!(name, "ingest.topic" | "ingest.group") {
            if !known.kafka {
                return Err(format!(
                    "`{{{name}}}` is the source topic's (or its group's) of `ingest: {{ kind: kafka }}`; this engine's ingest is another kind"
                ));
            }
            continue;
        }
        if matches!(name, "ingest.table" | "ingest.dsn") {
            if !known.outbox {
                return Err(format!(
                    "`{{{name}}}` is the outbox's of `ingest: {{ kind: postgres_outbox }}`; this engine's ingest is another kind"
                ));
            }
            continue;
        }
        if FIXED.contains(&name) {
            continue;
        }
        match (name, known.tls) {
            ("tls.ca_file", Some(_))
            | ("tls.client_cert_file" | "tls.client_key_file", Some(true)) => continue,
            ("tls.ca_file", None) => {
                return Err(format!(
                    "`{{{name}}}` needs a broker that speaks TLS: `destination.tls: true`"
                ));
            }
            ("tls.client_cert_file" | "tls.client_key_file", _) => {
                return Err(format!(
                    "`{{{name}}}` needs mutual TLS: `destination.tls: {{ client_certificates: true }}`"
                ));
            }
            _ => {}
        }
        if let Some(port) = name.strip_prefix("port.")
            && !port.is_empty()
            && port
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            ports.insert(port.to_string());
            continue;
        }
        if let Some(link) = name.strip_prefix("link.") {
            let base = link
                .strip_suffix(".host")
                .or_else(|| link.strip_suffix(".port"))
                .unwrap_or(link);
            if links.iter().any(|l| l == base) {
                continue;
            }
            return Err(format!(
                "unknown placeholder `{{{name}}}`: this destination's links are {}",
                links
                    .iter()
                    .map(|l| format!("`{{link.{l}}}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        return Err(format!(
            "unknown placeholder `{{{name}}}`; known: {{ingest}} {{ingest.host}} {{ingest.port}} {{ingest.path}} {{ingest.topic}} {{ingest.group}} {{ingest.table}} {{ingest.dsn}} {{link.NAME}} {{link.NAME.host}} {{link.NAME.port}} {{topic}} {{data_dir}} {{work_dir}} {{scenario_dir}} {{port.NAME}} {{run}} {{tls.ca_file}} {{tls.client_cert_file}} {{tls.client_key_file}} (write `{{{{` for a literal brace)"
        ));
    }
    Ok(())
}

/// Renders a template whose placeholders were checked at load time. A name missing from
/// `values` (which validation rules out) is left as written.
pub fn render(text: &str, values: &BTreeMap<String, String>) -> String {
    let Ok(pieces) = pieces(text) else {
        return text.to_string();
    };
    let mut out = String::with_capacity(text.len());
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Brace(c) => out.push(c),
            Piece::Name(n) => match values.get(n) {
                Some(v) => out.push_str(v),
                None => {
                    out.push('{');
                    out.push_str(n);
                    out.push('}');
                }
            },
        }
    }
    out
}

/// The scenario file's folder, for `{scenario_dir}` and template paths.
pub fn scenario_dir(source: &Path) -> PathBuf {
    let dir = source.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> Known {
        Known {
            file: false,
            kafka: false,
            outbox: false,
            links: vec!["mqtt".to_string()],
            tls: None,
        }
    }

    #[test]
    fn known_placeholders_pass_and_ports_are_collected() {
        let mut ports = BTreeSet::new();
        check_placeholders(
            "{ingest} {link.mqtt.port} {port.api} {{literal}} {run}",
            &links(),
            &mut ports,
        )
        .unwrap();
        assert_eq!(ports.into_iter().collect::<Vec<_>>(), vec!["api"]);
    }

    #[test]
    fn unknown_placeholders_and_links_are_named() {
        let mut ports = BTreeSet::new();
        let e = check_placeholders("--x {ingets}", &links(), &mut ports).unwrap_err();
        assert!(e.contains("unknown placeholder `{ingets}`"), "{e}");
        let e = check_placeholders("{link.kafka}", &links(), &mut ports).unwrap_err();
        assert!(e.contains("`{link.mqtt}`"), "{e}");
        let e = check_placeholders("{ingest", &links(), &mut ports).unwrap_err();
        assert!(e.contains("without a closing"), "{e}");
    }

    #[test]
    fn tls_placeholders_need_the_tls_they_name() {
        let mut ports = BTreeSet::new();
        let e = check_placeholders("--ca {tls.ca_file}", &links(), &mut ports).unwrap_err();
        assert!(e.contains("destination.tls: true"), "{e}");
        let tls = Known {
            file: false,
            tls: Some(false),
            ..links()
        };
        check_placeholders("--ca {tls.ca_file}", &tls, &mut ports).unwrap();
        let e = check_placeholders("{tls.client_key_file}", &tls, &mut ports).unwrap_err();
        assert!(e.contains("client_certificates: true"), "{e}");
        let mutual = Known {
            file: false,
            tls: Some(true),
            ..links()
        };
        check_placeholders(
            "{tls.client_cert_file} {tls.client_key_file}",
            &mutual,
            &mut ports,
        )
        .unwrap();
    }

    #[test]
    fn render_substitutes_and_unescapes() {
        let values: BTreeMap<String, String> = [("ingest", "127.0.0.1:9"), ("topic", "t")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            render("{{\"a\": \"{topic}\"}} at {ingest}", &values),
            "{\"a\": \"t\"} at 127.0.0.1:9"
        );
    }
}
