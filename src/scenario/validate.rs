//! Raw scenario → [`Plan`]: one function per section, each the owner of its section's fields.
//!
//! Sections are checked in the file's order — name, destination, system, workload, faults,
//! expect — each function taking its raw section and what it needs from the ones before, and
//! returning its part of the plan or a [`Located`] error: the line and column of the value, a
//! message that names the field and says what to write instead. Defaults are filled here, once.
//! Nothing here starts anything; the only thing read is a command engine's template files.

use std::fmt::Display;
use std::path::Path;
use std::time::Duration;

use serde_saphyr::{Location, Spanned};

use super::command;
use super::raw::{
    DiskFaultKind, LedgerExpectation, RawBuiltin, RawExpect, RawFault, RawScenario, RawSystem,
    RawWorkload,
};
use super::{
    CommandSpec, EngineSpec, Expectations, FaultAction, Plan, PowerCut, ProcessAction,
    ScheduledFault, longest_outage,
};
use crate::dest::{self, AnswerFault, Node, Spec};
use crate::located::{Located, at};
use crate::powerfs::CrashPoint;
use crate::promise::Promise;
use crate::proxy::{Direction, Fault, FaultSpec};
use crate::units::Bound;
use crate::workload::WorkloadSpec;

/// Checks every section of `raw`, read from `text` (a destination kind reads its own fields
/// from it); `source` is the scenario file (its folder holds a command engine's templates).
/// Errors that belong to no one value point at `name:`.
pub(super) fn validate(mut raw: RawScenario, text: &str, source: &Path) -> Result<Plan, Located> {
    let anchor = raw.name.referenced;
    let name = name(&raw.name)?;
    let mut destination = dest::validate(&raw.destination, text)?;
    let raw_agent = raw
        .system
        .as_mut()
        .map(|s| (s.agent.take(), s.token_env.take()));
    let dir = match &raw.scenario_dir {
        Some(d) => {
            let dir = command::scenario_dir(source).join(d);
            std::fs::canonicalize(&dir).unwrap_or(dir)
        }
        None => command::scenario_dir(source),
    };
    let (engine, command) = system(raw.system, &destination, &dir, &anchor)?;
    if let (Some(c), Some((Some(agent), _))) = (&command, &raw_agent) {
        let why = match c.ingest {
            crate::scenario::IngestSpec::File(_) => Some(
                "a file source is written on drill's host; an engine on an agent's host cannot tail it",
            ),
            crate::scenario::IngestSpec::Kafka(_)
            | crate::scenario::IngestSpec::PostgresOutbox(_) => Some(
                "a source drill starts is reached through the link `source`, which listens on drill's host only",
            ),
            _ => None,
        };
        if let Some(why) = why {
            return Err(at(
                &agent.referenced,
                format!(
                    "field `system.agent`: {why} (run the engine here, or feed it over the network)"
                ),
            ));
        }
    }
    let workload = workload(raw.workload, &destination, &anchor)?;
    let file_source = engine.tail.is_some()
        || matches!(
            command.as_ref().map(|c| &c.ingest),
            Some(crate::scenario::IngestSpec::File(_))
        );
    let source_link = engine.consume.is_some()
        || engine.outbox.is_some()
        || matches!(
            command.as_ref().map(|c| &c.ingest),
            Some(
                crate::scenario::IngestSpec::Kafka(_)
                    | crate::scenario::IngestSpec::PostgresOutbox(_)
            )
        );
    let faults = faults(
        &raw.faults,
        &destination,
        Engines {
            command: command.is_some(),
            file_source,
            source_link,
        },
        workload.duration,
    )?;
    if faults.len() > MAX_FAULTS {
        return Err(at(
            &anchor,
            format!(
                "field `faults`: {} faults once repeats are counted; at most {MAX_FAULTS}",
                faults.len()
            ),
        ));
    }
    clock_reaches(command.as_ref(), &faults, &raw.faults, &dir, &anchor)?;
    let drain_timeout = raw.drain_timeout.map_or(Duration::from_secs(60), |d| d.0);
    // What the destination's own settings depend on (a stream's duplicate window).
    let shape = dest::Shape {
        longest_outage: longest_outage(&faults, workload.duration + drain_timeout),
        longest_backoff: engine.refusals.2,
        answer_timeout: engine.answer_timeout,
    };
    destination.imp = destination.imp.settle(&shape);
    let poison = workload.poison.len() as u64;
    let expect = expect(raw.expect, poison, &destination)?;
    let remote_links =
        super::links::remote_links(&raw.links, &destination, &faults, &raw.faults, &anchor)?;
    let agent = match raw_agent {
        Some((agent, token_env)) => super::links::engine_agent(
            super::links::RawAgent { agent, token_env },
            command.as_ref(),
            &remote_links,
            &faults,
            &raw.faults,
            &anchor,
        )?,
        None => None,
    };
    Ok(Plan {
        name,
        about: raw.about,
        source: source.to_path_buf(),
        dir,
        seed: raw.seed.unwrap_or(1),
        destination,
        engine,
        command,
        workload,
        faults,
        expect,
        drain_timeout,
        tags: raw.tags,
        remote_links,
        agent,
    })
}

/// `name:` names the report folder: letters, digits, `-`, `_` and `.` only.
fn name(raw: &Spanned<String>) -> Result<String, Located> {
    let name = raw.value.trim().to_string();
    let usable = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !usable {
        return Err(at(
            &raw.referenced,
            format!(
                "field `name`: `{name}` is not a usable name; use letters, digits, `-`, `_` or `.` (it names the report folder)"
            ),
        ));
    }
    Ok(name)
}

/// `system:`: the built-in engine with its settings under `builtin`, or a user's engine —
/// `command` and the fields that go with it (checked in `command.rs`) — with the promise it
/// declares. Either way the [`EngineSpec`] carries the promise of the system under test.
fn system(
    raw: Option<RawSystem>,
    destination: &Spec,
    dir: &Path,
    anchor: &Location,
) -> Result<(EngineSpec, Option<CommandSpec>), Located> {
    let Some(raw) = raw else {
        return Ok((builtin(RawBuiltin::default(), destination)?, None));
    };
    let Some(argv) = raw.command else {
        let for_a_command = first_given([
            ("env", !raw.env.is_empty()),
            ("files", !raw.files.is_empty()),
            ("ready", raw.ready.is_some()),
            ("stats", raw.stats.is_some()),
            ("write_key", raw.write_key.is_some()),
            ("stop_grace", raw.stop_grace.is_some()),
            ("promise", raw.promise.is_some()),
        ]);
        if let Some(field) = for_a_command {
            return Err(at(
                anchor,
                format!(
                    "field `system.{field}`: goes with `system.command` (a user's engine); the built-in engine takes its settings under `system.builtin`"
                ),
            ));
        }
        let at_builtin = raw.builtin.as_ref().map_or(*anchor, |b| {
            b.value
                .promise
                .as_ref()
                .map_or(b.referenced, |p| p.referenced)
        });
        let settings = raw.builtin.map(|b| b.value).unwrap_or_default();
        let mut engine = builtin(settings, destination)?;
        if let Some(i) = raw.ingest {
            let where_ = i.referenced;
            match command::ingest(i)? {
                crate::scenario::IngestSpec::File(f) => engine.tail = Some(f),
                crate::scenario::IngestSpec::Kafka(k) => engine.consume = Some(k),
                crate::scenario::IngestSpec::PostgresOutbox(o) => engine.outbox = Some(o),
                other => {
                    return Err(at(
                        &where_,
                        format!(
                            "field `system.ingest`: `kind: {}` goes with `system.command` (a user's engine); the built-in engine takes records over HTTP, tails a file (`kind: file`), consumes a topic (`kind: kafka`) or polls an outbox (`kind: postgres_outbox`)",
                            other.name()
                        ),
                    ));
                }
            }
        }
        within_bound(
            engine.promise,
            destination,
            &at_builtin,
            "system.builtin.promise",
        )?;
        return Ok((engine, None));
    };
    let anchor = argv.first().map_or(*anchor, |a| a.referenced);
    if let Some(b) = &raw.builtin {
        return Err(at(
            &b.referenced,
            "field `system.builtin`: a system is either `builtin` or `command`, not both"
                .to_string(),
        ));
    }
    let spec = command::validate(
        command::RawCommand {
            command: argv,
            env: raw.env,
            files: raw.files,
            ingest: raw.ingest,
            ready: raw.ready,
            stats: raw.stats,
            write_key: raw.write_key,
            stop_grace: raw.stop_grace,
        },
        destination,
        dir,
        &anchor,
    )?;
    // A user's engine has none of the built-in engine's settings; only its promise counts.
    // Undeclared, it is at_least_once, or less where the destination cannot confirm.
    let promise = match &raw.promise {
        Some(p) => {
            within_bound(p.value, destination, &p.referenced, "system.promise")?;
            p.value
        }
        None => match destination.imp.promise_bound() {
            Some((bound, _)) if bound.rank() < Promise::AtLeastOnce.rank() => bound,
            _ => Promise::AtLeastOnce,
        },
    };
    let engine = EngineSpec {
        promise,
        ..builtin(RawBuiltin::default(), destination)?
    };
    Ok((engine, Some(spec)))
}

/// docs/src/design.md#rule-1-7: a promise the destination itself cannot let any engine keep (a
/// receiver that never confirms a write) is a configuration error.
fn within_bound(
    promise: Promise,
    destination: &Spec,
    loc: &Location,
    field: &str,
) -> Result<(), Located> {
    match destination.imp.promise_bound() {
        Some((bound, why)) if promise.rank() > bound.rank() => Err(at(
            loc,
            format!(
                "field `{field}`: `{}`, but {why}; declare {} or less",
                promise.name(),
                bound.name()
            ),
        )),
        _ => Ok(()),
    }
}

/// `system.builtin:`, with its defaults. The promise defaults to what the destination lets the
/// built-in engine keep (`effectively_once` on NATS: the stream drops a resend it already has;
/// `at_least_once` elsewhere).
fn builtin(raw: RawBuiltin, destination: &Spec) -> Result<EngineSpec, Located> {
    let segment_bytes = match raw.segment {
        Some(s) if s.value.0 < 4096 => {
            return Err(at(
                &s.referenced,
                "field `system.builtin.segment`: at least 4KB (a segment holds whole batches)"
                    .to_string(),
            ));
        }
        s => s.map(|s| s.value.0),
    };
    Ok(EngineSpec {
        order: raw.order.unwrap_or_default(),
        promise: raw
            .promise
            .map_or_else(|| destination.imp.builtin_promise(), |p| p.value),
        keepalive: raw.keepalive.map_or(Duration::from_secs(2), |d| d.0),
        answer_timeout: raw.answer_timeout.map_or(Duration::from_secs(3), |d| d.0),
        window: raw.window.map(|w| w.max(1)),
        refusals: raw
            .refusals
            .map_or((10, Duration::from_secs(1), Duration::from_secs(60)), |r| {
                (
                    r.max.max(1),
                    r.backoff[0].0,
                    r.backoff[1].0.max(r.backoff[0].0),
                )
            }),
        segment_bytes,
        tail: None,
        consume: None,
        outbox: None,
    })
}

/// `workload:`: how fast, how long, over how many keys, and which records are poison — each
/// one of the records the drill generates, on a destination that can refuse it.
fn workload(
    raw: RawWorkload,
    destination: &Spec,
    anchor: &Location,
) -> Result<WorkloadSpec, Located> {
    let keys = match raw.keys {
        Some(k) if k.value == 0 || k.value > MAX_KEYS => {
            return Err(at(
                &k.referenced,
                format!("field `workload.keys`: 1 to {MAX_KEYS}"),
            ));
        }
        Some(k) => k.value,
        None => 4,
    };
    // Bounds first: nothing below allocates in proportion to a number from the file before
    // it is checked (the workload keeps every record it generates until the verdict).
    if raw.rate.value.0 > MAX_RATE {
        return Err(at(
            &raw.rate.referenced,
            format!(
                "field `workload.rate`: at most {MAX_RATE}/s (drill generates and reads back every record itself on this machine)"
            ),
        ));
    }
    if raw.duration.value.0 > MAX_DURATION {
        return Err(at(
            &raw.duration.referenced,
            format!(
                "field `workload.duration`: at most {} h",
                MAX_DURATION.as_secs() / 3600
            ),
        ));
    }
    let payload_bytes = match raw.payload_bytes {
        Some(p) if p.value > MAX_PAYLOAD => {
            return Err(at(
                &p.referenced,
                format!("field `workload.payload_bytes`: at most {MAX_PAYLOAD} bytes"),
            ));
        }
        Some(p) => p.value,
        None => 120,
    };
    // Errors about the poison records point at the list itself.
    let poison_at = raw.poison.as_ref().map_or(anchor, |p| &p.referenced);
    let poison = raw
        .poison
        .as_ref()
        .map(|p| p.value.clone())
        .unwrap_or_default();
    if poison.len() > MAX_POISON {
        return Err(at(
            poison_at,
            format!("field `workload.poison`: at most {MAX_POISON} poison records"),
        ));
    }
    let workload = WorkloadSpec {
        rate_per_s: raw.rate.value.0,
        duration: raw.duration.value.0,
        keys,
        payload_bytes,
        poison,
    };
    let total = workload.total_records();
    let bytes = total.saturating_mul(payload_bytes.max(100) as u64);
    if total > MAX_RECORDS || bytes > MAX_WORKLOAD_BYTES {
        return Err(at(
            &raw.rate.referenced,
            format!(
                "field `workload`: rate × duration makes {total} records of {payload_bytes} bytes; at most {MAX_RECORDS} records and {} GiB in all (drill keeps each until the verdict): lower the rate or the duration",
                MAX_WORKLOAD_BYTES >> 30
            ),
        ));
    }
    if let Some(&p) = workload.poison.iter().find(|&&p| p >= total) {
        return Err(at(
            poison_at,
            format!(
                "field `workload.poison`: record {p} is past the last of {total} records (indices start at 0)"
            ),
        ));
    }
    if !workload.poison.is_empty()
        && let Err(why) = destination.imp.refuses_one_write()
    {
        return Err(at(poison_at, format!("field `workload.poison`: {why}")));
    }
    Ok(workload)
}

/// `faults:`, in time order. Each entry is a link fault (`link:`) or a process fault
/// (`target:`); a flapping link fault stands for several. A fault that starts when the
/// workload has ended would meet no traffic: it must say `after_workload: true`.
fn faults(
    raw: &[Spanned<RawFault>],
    destination: &Spec,
    engines: Engines,
    workload_ends: Duration,
) -> Result<Vec<ScheduledFault>, Located> {
    let command_engine = engines.command;
    let mut faults = Vec::new();
    for (i, spanned) in raw.iter().enumerate() {
        let entry = FaultEntry {
            i,
            raw: &spanned.value,
            location: spanned.referenced,
        };
        if entry.raw.at.0 >= workload_ends && entry.raw.after_workload != Some(true) {
            return Err(entry.field(
                "at",
                format!(
                    "{} is when the workload has ended ({}): the fault would meet no traffic; start it earlier, or say `after_workload: true` for a fault during the drain",
                    entry.raw.at, crate::units::Dur(workload_ends)
                ),
            ));
        }
        match (&entry.raw.link, &entry.raw.target) {
            (Some(_), Some(_)) => {
                return Err(entry.whole(
                    "give either `link` (a network fault) or `target` (a process fault), not both",
                ));
            }
            (None, None) => {
                return Err(entry.whole(format!(
                    "missing `link` (e.g. link: {}) or `target` (e.g. target: engine)",
                    destination.link_name()
                )));
            }
            (Some(link), None) => {
                faults.extend(link_fault(&entry, link, destination, engines.source_link)?)
            }
            (None, Some(target)) if target == "destination" => {
                faults.push(destination_fault(&entry, destination, workload_ends)?);
            }
            (None, Some(target)) if target == "source" => {
                faults.push(source_fault(&entry, engines.file_source)?);
            }
            (None, Some(target)) if target == "engine" && entry.raw.disk.is_some() => {
                faults.push(disk_fault(&entry)?);
            }
            (None, Some(target)) if target == "engine" && entry.raw.clock.is_some() => {
                faults.push(clock_fault(&entry)?);
            }
            (None, Some(target)) if target == "broker" && destination.external.is_some() => {
                return Err(entry.field(
                    "target",
                    "broker faults are refused for external brokers: drill did not start them and will not kill, stop or pause them; use a link fault (link: ...) or a managed runtime",
                ));
            }
            (None, Some(target)) => faults.push(process_fault(
                &entry,
                target,
                destination.imp.nodes(),
                command_engine,
            )?),
        }
    }
    faults.sort_by_key(|f| f.at);
    Ok(faults)
}

/// What the system under test is, as far as faults care.
#[derive(Clone, Copy)]
struct Engines {
    /// A user's engine (`system.command`).
    command: bool,
    /// It tails a file drill writes (`system.ingest: { kind: file }`).
    file_source: bool,
    /// It reads its source through the link `source` (`system.ingest: { kind: kafka }` or
    /// `{ kind: postgres_outbox }`).
    source_link: bool,
}

/// `target: source`: `rotate`, `truncate`, `delete` or `stall` (with `for`) the file the engine
/// tails.
fn source_fault(entry: &FaultEntry, file_source: bool) -> Result<ScheduledFault, Located> {
    use crate::scenario::source::SourceAction;
    let f = entry.raw;
    if !file_source {
        return Err(entry.field(
            "target",
            "`source` faults act on the file the engine tails; this scenario has no `system.ingest: { kind: file }`",
        ));
    }
    refuse_fields(
        entry,
        link_fields(f),
        "only link faults (`link:`) take it; a source fault uses `action`",
    )?;
    refuse_fields(
        entry,
        destination_fields(f),
        "only destination faults (`target: destination`) take it",
    )?;
    let process = process_fields(f)
        .into_iter()
        .filter(|(name, _)| *name != "action");
    refuse_fields(
        entry,
        process,
        "a source fault takes `action` (and `for` with `stall`)",
    )?;
    let action = match (f.action, f.for_) {
        (Some(ProcessAction::Stall), Some(d)) => SourceAction::Stall(d.0),
        (Some(ProcessAction::Stall), None) => {
            return Err(entry.field(
                "for",
                "missing; how long the line stays half written, e.g. for: 5s",
            ));
        }
        (
            Some(ProcessAction::Rotate | ProcessAction::Truncate | ProcessAction::Delete),
            Some(_),
        ) => {
            return Err(entry.field("for", "only `stall` takes it"));
        }
        (Some(ProcessAction::Rotate), None) => SourceAction::Rotate,
        (Some(ProcessAction::Truncate), None) => SourceAction::Truncate,
        (Some(ProcessAction::Delete), None) => SourceAction::Delete,
        (other, _) => {
            return Err(entry.field(
                "action",
                format!(
                    "{}the source takes rotate, truncate, delete or stall",
                    other.map_or("missing; ".to_string(), |a| format!("`{}`: ", a.name()))
                ),
            ));
        }
    };
    Ok(ScheduledFault {
        at: f.at.0,
        what: FaultAction::Source(action),
        entry: entry.i,
    })
}

/// One entry of `faults:`: what it says, and where, so that every error about it names
/// `faults[i]` and points at the entry.
struct FaultEntry<'a> {
    i: usize,
    raw: &'a RawFault,
    location: Location,
}

impl FaultEntry<'_> {
    /// An error about one field of the entry.
    fn field(&self, name: &str, message: impl Display) -> Located {
        at(
            &self.location,
            format!("field `faults[{}].{name}`: {message}", self.i),
        )
    }

    /// An error about the entry as a whole.
    fn whole(&self, message: impl Display) -> Located {
        at(&self.location, format!("faults[{}]: {message}", self.i))
    }
}

/// A link fault: `fault` on `link` (both ways unless `direction` says otherwise) from `at`,
/// for a while (`for`), flapping (`repeat`, `every`), or until a later `heal`. Which kinds take
/// `latency`, `jitter`, `bytes_per_s`, `loss`, `for` and `repeat` is [`LinkSetting::taken_by`]'s to say.
fn link_fault(
    entry: &FaultEntry,
    link: &str,
    destination: &Spec,
    source_link: bool,
) -> Result<Vec<ScheduledFault>, Located> {
    let f = entry.raw;
    let the_source = source_link && link == crate::scenario::source::SOURCE_LINK;
    if !destination.imp.names_a_link(link) && !the_source {
        return Err(entry.field(
            "link",
            format!(
                "no link named `{link}`; this scenario has: {}{}",
                destination.link_names().join(", "),
                destination.imp.other_link_names()
            ),
        ));
    }
    refuse_fields(
        entry,
        destination_fields(f),
        "only destination faults (`target: destination`) take it",
    )?;
    let process = process_fields(f)
        .into_iter()
        .filter(|(name, _)| *name != "node");
    refuse_fields(entry, process, "only process faults (`target:`) take it")?;
    // The source link carries a byte stream in plain text, whatever the destination's do.
    let datagrams = !the_source && destination.imp.datagram_links();
    let fault = f.fault.ok_or_else(|| {
        entry.field(
            "fault",
            if datagrams {
                "missing; one of refuse, swallow, delay, loss, blackhole, heal (a datagram link)"
            } else {
                "missing; one of refuse, reset, swallow, hang, delay, throttle, strand, heal"
            },
        )
    })?;
    fits_the_link(fault, datagrams, link).map_err(|m| entry.field("fault", m))?;
    if the_source && fault == Fault::BadCertificate {
        return Err(entry.field(
            "fault",
            "`bad_certificate` needs a link that speaks TLS; the link `source` to drill's source carries plain text".to_string(),
        ));
    }
    fits_the_tls(fault, destination).map_err(|m| entry.field("fault", m))?;
    if f.certificate == Some(super::raw::CertificateChoice::Expired)
        && !matches!(destination.tls, Some(crate::dest::TlsSpec::Minted { .. }))
    {
        return Err(entry.field(
            "certificate",
            "`expired` presents the broker's certificate from the CA drill mints, expired: it needs a broker drill starts (for yours, drill holds no key of your CA); use `other_ca`".to_string(),
        ));
    }
    let taken = LinkSetting::taken_by(fault);
    if let Some(setting) = LinkSetting::ALL
        .into_iter()
        .find(|s| s.given(f) && !taken.contains(s))
    {
        return Err(setting.refused(entry, fault));
    }
    let spec = FaultSpec {
        fault,
        direction: f.direction.unwrap_or(Direction::Both),
        latency: f.latency.map(|d| d.0).unwrap_or_default(),
        jitter: f.jitter.map(|d| d.0).unwrap_or_default(),
        bytes_per_s: f.bytes_per_s.unwrap_or(0),
        loss: f.loss.unwrap_or(0.0),
        expired: f.certificate == Some(super::raw::CertificateChoice::Expired),
        ..FaultSpec::new(fault, Direction::Both)
    };
    spec.validate().map_err(|m| entry.whole(m))?;
    let link = link.to_string();
    if fault == Fault::Heal {
        let what = FaultAction::Heal { link };
        return Ok(vec![ScheduledFault {
            at: f.at.0,
            what,
            entry: entry.i,
        }]);
    }
    if fault.instantaneous() {
        let what = FaultAction::Link {
            link,
            spec,
            lasts: Some(Duration::ZERO),
        };
        return Ok(vec![ScheduledFault {
            at: f.at.0,
            what,
            entry: entry.i,
        }]);
    }
    let lasts = f.for_.map(|d| d.0);
    let (times, every) = flapping(entry, lasts)?;
    Ok((0..times)
        .map(|k| ScheduledFault {
            entry: entry.i,
            at: f.at.0 + every * k,
            what: FaultAction::Link {
                link: link.clone(),
                spec,
                lasts,
            },
        })
        .collect())
}

/// Whether `fault` needs TLS the destination has: `bad_certificate` stands in for the
/// broker's TLS server, so it needs `destination.tls` and a kind whose client speaks first.
fn fits_the_tls(fault: Fault, destination: &Spec) -> Result<(), String> {
    if fault != Fault::BadCertificate {
        return Ok(());
    }
    if destination.tls.is_none() {
        return Err(
            "`bad_certificate` needs a broker that speaks TLS: `destination.tls: true`".to_string(),
        );
    }
    if !destination.imp.tls_at_connect() {
        return Err(format!(
            "`bad_certificate` stands in for a TLS server that speaks first; a {} server speaks in plain text before its handshake, which this link cannot do yet (MQTT can)",
            destination.kind.name()
        ));
    }
    Ok(())
}

/// Whether `fault` means something on `link`, whose destination's links carry datagrams
/// (UDP, [`dest::Destination::datagram_links`]) or byte streams; the message says what the
/// link knows instead.
fn fits_the_link(fault: Fault, datagrams: bool, link: &str) -> Result<(), String> {
    if datagrams && !fault.on_datagrams() {
        return Err(format!(
            "`{}` needs a byte stream, and link `{link}` carries datagrams (UDP); use refuse, swallow, delay, loss, blackhole or heal",
            fault.name()
        ));
    }
    if !datagrams && !fault.on_streams() {
        return Err(format!(
            "`{}` is for datagram (UDP) links, and link `{link}` carries a byte stream; use swallow (or refuse) instead",
            fault.name()
        ));
    }
    Ok(())
}

/// The fields of a link fault that not every kind of fault takes. (`direction` and `every` any
/// kind takes; `every` goes with `repeat`, see [`flapping`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkSetting {
    Latency,
    Jitter,
    BytesPerS,
    Loss,
    Certificate,
    For,
    Repeat,
}

/// Every kind of fault a scenario can write, for [`LinkSetting::refused`] to name the one that
/// takes a setting.
const SCENARIO_FAULTS: [Fault; 11] = [
    Fault::Refuse,
    Fault::BadCertificate,
    Fault::Reset,
    Fault::Swallow,
    Fault::Hang,
    Fault::Delay,
    Fault::Throttle,
    Fault::Strand,
    Fault::Loss,
    Fault::Blackhole,
    Fault::Heal,
];

impl LinkSetting {
    /// In the order they are checked: the first one a fault does not take is reported.
    const ALL: [LinkSetting; 7] = [
        LinkSetting::Latency,
        LinkSetting::Jitter,
        LinkSetting::BytesPerS,
        LinkSetting::Loss,
        LinkSetting::Certificate,
        LinkSetting::For,
        LinkSetting::Repeat,
    ];

    /// Which settings each kind of link fault takes: the one place that says so.
    fn taken_by(fault: Fault) -> &'static [LinkSetting] {
        use LinkSetting::{BytesPerS, Certificate, For, Jitter, Latency, Loss, Repeat};
        match fault {
            // Every chunk arrives `latency` ± `jitter` late; for a while, or flapping.
            Fault::Delay => &[Latency, Jitter, For, Repeat],
            // At most `bytes_per_s` get through; for a while, or flapping.
            Fault::Throttle => &[BytesPerS, For, Repeat],
            // A fraction `loss` of the datagrams is dropped; for a while, or flapping.
            Fault::Loss => &[Loss, For, Repeat],
            // An outage: for a while, flapping, or until a `heal`.
            Fault::Refuse | Fault::Reset | Fault::Swallow | Fault::Hang | Fault::Blackhole => {
                &[For, Repeat]
            }
            // A wrong certificate (`certificate`: whose); for a while, or flapping.
            Fault::BadCertificate => &[Certificate, For, Repeat],
            // Back to pass-through, at once and for good.
            Fault::Heal => &[],
            // At an instant: the connections open then go silent for good.
            Fault::Strand => &[],
            // Only the Toxiproxy-shaped API sets them; a scenario cannot write them.
            Fault::LimitData | Fault::Slicer | Fault::SlowClose => &[],
        }
    }

    fn name(self) -> &'static str {
        match self {
            LinkSetting::Latency => "latency",
            LinkSetting::Jitter => "jitter",
            LinkSetting::BytesPerS => "bytes_per_s",
            LinkSetting::Loss => "loss",
            LinkSetting::Certificate => "certificate",
            LinkSetting::For => "for",
            LinkSetting::Repeat => "repeat",
        }
    }

    fn given(self, f: &RawFault) -> bool {
        match self {
            LinkSetting::Latency => f.latency.is_some(),
            LinkSetting::Jitter => f.jitter.is_some(),
            LinkSetting::BytesPerS => f.bytes_per_s.is_some(),
            LinkSetting::Loss => f.loss.is_some(),
            LinkSetting::Certificate => f.certificate.is_some(),
            LinkSetting::For => f.for_.is_some(),
            LinkSetting::Repeat => f.repeat.is_some(),
        }
    }

    /// The error for a `fault` that was given this setting and does not take it.
    fn refused(self, entry: &FaultEntry, fault: Fault) -> Located {
        match self {
            LinkSetting::For | LinkSetting::Repeat => {
                entry.whole(format!("a {} has no `for` or `repeat`", fault.name()))
            }
            LinkSetting::Latency
            | LinkSetting::Jitter
            | LinkSetting::BytesPerS
            | LinkSetting::Loss
            | LinkSetting::Certificate => {
                let owner = SCENARIO_FAULTS
                    .into_iter()
                    .find(|k| LinkSetting::taken_by(*k).contains(&self))
                    .map_or("another fault", Fault::name);
                entry.field(self.name(), format!("only `{owner}` takes it"))
            }
        }
    }
}

/// `repeat: N, every: P` makes a flapping link: N outages of `for` each, one every P. Without
/// either, a link fault happens once. Returns how many times, and how far apart.
fn flapping(entry: &FaultEntry, lasts: Option<Duration>) -> Result<(u32, Duration), Located> {
    match (entry.raw.repeat, entry.raw.every) {
        (None, None) => Ok((1, Duration::ZERO)),
        (Some(n), Some(every)) => {
            let Some(lasts) = lasts else {
                return Err(entry.field(
                    "repeat",
                    "a repeated fault needs `for` (how long each outage lasts)",
                ));
            };
            if n == 0 || every.0 <= lasts {
                return Err(entry.field(
                    "every",
                    "`every` must be longer than `for`, and `repeat` at least 1 (e.g. for: 2s, every: 4s, repeat: 30)",
                ));
            }
            Ok((n, every.0))
        }
        _ => {
            Err(entry
                .whole("`repeat` and `every` go together (e.g. for: 2s, every: 4s, repeat: 30)"))
        }
    }
}

/// A process fault: `action` on `target` at `at`. The engine, a broker node and the proxy each
/// take their own actions and fields ([`engine_fault`], [`broker_fault`], [`proxy_fault`]).
fn process_fault(
    entry: &FaultEntry,
    target: &str,
    nodes: usize,
    command_engine: bool,
) -> Result<ScheduledFault, Located> {
    let f = entry.raw;
    refuse_fields(
        entry,
        process_fields(f).into_iter().take(2),
        "only a clock fault (`target: engine, clock: jump`) takes it",
    )?;
    refuse_fields(
        entry,
        process_fields(f).into_iter().skip(2).take(6),
        "only a disk fault (`target: engine, disk: io_error | slow`) takes it",
    )?;
    let fills_disk = f.action == Some(ProcessAction::FillDisk);
    let link = link_fields(f)
        .into_iter()
        .chain([("for", f.for_.is_some() && !fills_disk)]);
    refuse_fields(
        entry,
        link,
        "only link faults (`link:`) take it; a process fault uses `action`",
    )?;
    refuse_fields(
        entry,
        destination_fields(f),
        "only destination faults (`target: destination`) take it",
    )?;
    let action = f
        .action
        .ok_or_else(|| {
            entry.field(
                "action",
                "missing; kill, stop, power_cut or fill_disk (engine), kill, stop or pause (broker), restart (proxy)",
            )
        })?;
    let what = match target {
        "engine" => engine_fault(entry, action, command_engine)?,
        "broker" => broker_fault(entry, action, nodes)?,
        "proxy" => proxy_fault(entry, action)?,
        other => {
            return Err(entry.field(
                "target",
                format!(
                    "`{other}` is not a target this build can act on; use `engine`, `broker` or `proxy`"
                ),
            ));
        }
    };
    Ok(ScheduledFault {
        at: f.at.0,
        what,
        entry: entry.i,
    })
}

/// `target: engine, disk: io_error | slow`: `op` on files matching `path` answers `errno`, or
/// answers `delay` late — the `nth` one only, or every one for `for` (or to the end of the
/// drill).
fn disk_fault(entry: &FaultEntry) -> Result<ScheduledFault, Located> {
    let f = entry.raw;
    refuse_fields(
        entry,
        link_fields(f),
        "only link faults (`link:`) take it; a disk fault uses `op`, `path`, `errno`, `nth` or `for`",
    )?;
    refuse_fields(
        entry,
        destination_fields(f)
            .into_iter()
            .chain(process_fields(f).into_iter().take(2))
            .chain(process_fields(f).into_iter().skip(8)),
        "a disk fault takes `op`, `path`, `errno` or `delay`, and `nth` or `for`",
    )?;
    let slow = f.disk == Some(DiskFaultKind::Slow);
    let effect = match (slow, f.delay) {
        (false, None) => {
            crate::powerfs::IoEffect::Error(f.errno.unwrap_or(crate::powerfs::IoErrno::Eio))
        }
        (false, Some(_)) => {
            return Err(entry.field(
                "delay",
                "goes with `disk: slow`; `disk: io_error` answers an error at once",
            ));
        }
        (true, None) => {
            return Err(entry.field(
                "delay",
                "missing; how late a slow operation answers, e.g. delay: 300ms",
            ));
        }
        (true, Some(_)) if f.errno.is_some() => {
            return Err(entry.field(
                "errno",
                "goes with `disk: io_error`; a slow operation succeeds, late",
            ));
        }
        (true, Some(d)) if d.0.is_zero() || d.0 > Duration::from_secs(60) => {
            return Err(entry.field("delay", "between 1ms and 60s"));
        }
        (true, Some(d)) => crate::powerfs::IoEffect::Slow(d.0),
    };
    if slow
        && !matches!(
            f.op,
            None | Some(crate::powerfs::IoOp::Fsync | crate::powerfs::IoOp::Write)
        )
    {
        return Err(entry.field("op", "a slow disk slows `fsync` or `write`"));
    }
    let op = f.op.ok_or_else(|| {
        entry.field(
            "op",
            "missing; the operation that fails: fsync, write, read, open or rename",
        )
    })?;
    let path = f
        .path
        .clone()
        .filter(|p| !p.trim().is_empty())
        .ok_or_else(|| {
            entry.field(
                "path",
                "missing; the files it acts on, a glob over the name, e.g. path: \"*.log\"",
            )
        })?;
    if path.starts_with('/') || path.split('/').any(|p| p == "..") {
        return Err(entry.field(
            "path",
            format!("`{path}` is a glob below the engine's data directory, e.g. \"*.log\" or \"queue/*\""),
        ));
    }
    let nth = match (f.nth, f.for_) {
        (Some(0), _) => {
            return Err(entry.field("nth", "counts from 1 (the first matching operation)"));
        }
        (Some(_), Some(_)) => {
            return Err(entry.field(
                "for",
                "with `nth` only that one operation fails; `for` goes with every matching one failing",
            ));
        }
        (n, _) => n,
    };
    Ok(ScheduledFault {
        at: f.at.0,
        what: FaultAction::Disk {
            fault: crate::powerfs::IoFault {
                op,
                path,
                effect,
                nth,
            },
            lasts: f.for_.map(|d| d.0),
        },
        entry: entry.i,
    })
}

/// `target: engine, clock: jump, by: +2h`: the engine's wall clock steps by `by` (whole
/// seconds, signed) and stays there; `clock: drift, by: +10m, for: 60s`: it gains `by` over
/// `for`, stepped by drill once a second. Its monotonic clock runs on either way.
fn clock_fault(entry: &FaultEntry) -> Result<ScheduledFault, Located> {
    let f = entry.raw;
    let drift = f.clock == Some(super::raw::ClockFaultKind::Drift);
    refuse_fields(
        entry,
        link_fields(f)
            .into_iter()
            .chain(destination_fields(f))
            .chain(process_fields(f).into_iter().skip(2))
            .chain([("for", f.for_.is_some() && !drift)]),
        if drift {
            "a clock drift takes `by` and `for` only"
        } else {
            "a clock jump takes `by` only: the clock stays where the jump put it (a second jump moves it again; `clock: drift` moves it over `for`)"
        },
    )?;
    let by = f.by.as_deref().ok_or_else(|| {
        entry.field(
            "by",
            "missing; how far the engine's wall clock moves, signed: +2h, -10m",
        )
    })?;
    let by_s = signed_seconds(by).map_err(|why| entry.field("by", why))?;
    let over = match (drift, f.for_) {
        (false, _) => None,
        (true, Some(d)) if (2..=3600).contains(&d.0.as_secs()) && d.0.subsec_nanos() == 0 => {
            Some(d.0)
        }
        (true, Some(_)) => {
            return Err(entry.field(
                "for",
                "a drift lasts whole seconds, from 2s to 1h (drill steps the clock once a second; a longer drift is several drifts in a row)",
            ));
        }
        (true, None) => {
            return Err(entry.field(
                "for",
                "missing; how long the clock takes to gain `by`, e.g. `by: +10m, for: 60s`",
            ));
        }
    };
    Ok(ScheduledFault {
        at: f.at.0,
        what: FaultAction::Clock { by_s, over },
        entry: entry.i,
    })
}

/// A clock fault on a user's engine whose program libfaketime cannot reach (static, Go,
/// Python) is refused here, where its first word names it without placeholders; the runner
/// asks again of the rendered command.
fn clock_reaches(
    command: Option<&CommandSpec>,
    faults: &[ScheduledFault],
    raw_faults: &[Spanned<RawFault>],
    dir: &Path,
    anchor: &Location,
) -> Result<(), Located> {
    let Some(f) = faults
        .iter()
        .find(|f| matches!(f.what, FaultAction::Clock { .. }))
    else {
        return Ok(());
    };
    let Some(program) = command.and_then(|c| c.argv.first()) else {
        return Ok(());
    };
    if program.contains('{') || program == "drill" {
        return Ok(());
    }
    let path = match program.contains('/') && !Path::new(program).is_absolute() {
        true => dir.join(program).display().to_string(),
        false => program.clone(),
    };
    crate::clock::fakeable(&path).map_err(|why| {
        at(
            raw_faults.get(f.entry).map_or(anchor, |r| &r.referenced),
            format!(
                "field `faults[{}].clock`: {why}; drill cannot move this engine's clock",
                f.entry
            ),
        )
    })
}

/// `+2h` → 7200, `-10m` → -600: a sign, then a duration in whole seconds, not zero.
fn signed_seconds(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        _ => {
            return Err(format!(
                "`{t}` needs a sign: +2h moves the clock forward, -10m back"
            ));
        }
    };
    let d = crate::units::Dur::parse(rest)?.0;
    if d.is_zero() || d.subsec_nanos() != 0 {
        return Err(format!(
            "`{t}`: whole seconds and not zero, e.g. +2h, -10m, +90s"
        ));
    }
    Ok(sign * d.as_secs() as i64)
}

/// `target: engine`: `kill` or `stop` the engine — or `pause` a user's engine — and start or
/// resume it `restart_after` later (a pause needs it); `wipe_data` removes its data directory.
fn engine_fault(
    entry: &FaultEntry,
    action: ProcessAction,
    command_engine: bool,
) -> Result<FaultAction, Located> {
    let f = entry.raw;
    match action {
        ProcessAction::Kill | ProcessAction::Stop | ProcessAction::PowerCut => {}
        ProcessAction::FillDisk => {
            if f.restart_after.is_some() || f.wipe_data.is_some() || f.down_for.is_some() {
                return Err(entry.whole(
                    "`fill_disk` takes `for` (how long the disk stays full; left out, until the end of the drill), nothing else",
                ));
            }
            return Ok(FaultAction::Engine {
                action,
                restart_after: None,
                wipe_data: false,
                lasts: f.for_.map(|d| d.0),
                power: PowerCut::default(),
            });
        }
        ProcessAction::Pause if !command_engine => {
            return Err(entry.field(
                "action",
                "pausing the built-in engine is not supported; use kill or stop (a user's engine, `system.command`, can be paused)",
            ));
        }
        ProcessAction::Pause if f.restart_after.is_none() => {
            return Err(entry.field(
                "action",
                "a paused engine needs `restart_after` (when it is resumed)",
            ));
        }
        ProcessAction::Pause => {}
        ProcessAction::Restart
        | ProcessAction::Crash
        | ProcessAction::Rotate
        | ProcessAction::Truncate
        | ProcessAction::Delete
        | ProcessAction::Stall => {
            return Err(cannot(entry, "engine", action));
        }
    }
    if f.down_for.is_some() {
        return Err(entry.field("down_for", "the engine uses `restart_after`"));
    }
    Ok(FaultAction::Engine {
        action,
        restart_after: f.restart_after.map(|d| d.0),
        wipe_data: f.wipe_data.unwrap_or(false),
        lasts: None,
        power: power_cut(entry, action)?,
    })
}

/// `torn` and `crash_at`, which only a `power_cut` takes.
fn power_cut(entry: &FaultEntry, action: ProcessAction) -> Result<PowerCut, Located> {
    let f = entry.raw;
    if action != ProcessAction::PowerCut {
        for (name, given) in [
            ("torn", f.torn.is_some()),
            ("dirents", f.dirents.is_some()),
            ("crash_at", f.crash_at.is_some()),
        ] {
            if given {
                return Err(entry.field(name, "only a `power_cut` takes it"));
            }
        }
        return Ok(PowerCut::default());
    }
    let torn = f.torn.unwrap_or(false);
    let dirents = f.dirents;
    let Some(at) = &f.crash_at else {
        return Ok(PowerCut {
            torn,
            dirents,
            crash_at: None,
        });
    };
    let nth = at.nth.unwrap_or(1);
    if nth == 0 {
        return Err(entry.field(
            "crash_at.nth",
            "counts from 1 (the first matching operation)",
        ));
    }
    if at.path.trim().is_empty() {
        return Err(entry.field(
            "crash_at.path",
            "empty; a glob over the file's name, as `*.log`, or `*` for every file",
        ));
    }
    Ok(PowerCut {
        torn,
        dirents,
        crash_at: Some(CrashPoint {
            op: at.op,
            path: at.path.clone(),
            nth,
            torn,
            dirents,
        }),
    })
}

/// `target: broker`: `kill`, `stop` or `pause` one broker node — `node: leader` (where a
/// cluster's stream leader is at that instant) or its number, 1 unless given — and start or
/// resume it `restart_after` later (a pause needs it).
fn broker_fault(
    entry: &FaultEntry,
    action: ProcessAction,
    nodes: usize,
) -> Result<FaultAction, Located> {
    let f = entry.raw;
    match action {
        ProcessAction::Kill | ProcessAction::Stop | ProcessAction::Pause | ProcessAction::Crash => {
        }
        ProcessAction::Restart
        | ProcessAction::PowerCut
        | ProcessAction::FillDisk
        | ProcessAction::Rotate
        | ProcessAction::Truncate
        | ProcessAction::Delete
        | ProcessAction::Stall => {
            return Err(cannot(entry, "broker", action));
        }
    }
    let node = match f.node.as_deref() {
        None => Node::Number(1),
        Some("leader") if nodes > 1 => Node::Leader,
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=nodes).contains(&n) => Node::Number(n),
            _ => {
                return Err(entry.field(
                    "node",
                    format!(
                        "`{n}`; use `leader` (a cluster's stream leader) or a node number 1..={nodes}"
                    ),
                ));
            }
        },
    };
    if action == ProcessAction::Pause && f.restart_after.is_none() {
        return Err(entry.field(
            "action",
            "a paused broker needs `restart_after` (when it resumes)",
        ));
    }
    Ok(FaultAction::Broker {
        node,
        action,
        restart_after: f.restart_after.map(|d| d.0),
    })
}

/// `target: proxy`, `action: restart`: every connection dropped, the port refused for
/// `down_for` (1 s unless given), then listening again on the same port.
fn proxy_fault(entry: &FaultEntry, action: ProcessAction) -> Result<FaultAction, Located> {
    let f = entry.raw;
    match action {
        ProcessAction::Restart => {}
        ProcessAction::Kill
        | ProcessAction::Stop
        | ProcessAction::Crash
        | ProcessAction::Pause
        | ProcessAction::PowerCut
        | ProcessAction::FillDisk
        | ProcessAction::Rotate
        | ProcessAction::Truncate
        | ProcessAction::Delete
        | ProcessAction::Stall => {
            return Err(cannot(entry, "proxy", action));
        }
    }
    if f.restart_after.is_some() || f.wipe_data.is_some() {
        return Err(entry
            .whole("a proxy restart takes `down_for` (how long the port refuses), nothing else"));
    }
    Ok(FaultAction::ProxyRestart {
        down_for: f.down_for.map_or(Duration::from_secs(1), |d| d.0),
    })
}

/// `target: destination`: the endpoint drill hosts answers `answer: STATUS` (with
/// `retry_after`) or `answer_after: DELAY` for `for`. Only a destination drill hosts takes it.
fn destination_fault(
    entry: &FaultEntry,
    destination: &Spec,
    workload_ends: Duration,
) -> Result<ScheduledFault, Located> {
    let f = entry.raw;
    let Some(answers) = destination.imp.scripted_answers() else {
        return Err(entry.field(
            "target",
            format!(
                "a `{}` destination's answers are its broker's own; destination faults (answer, answer_after, reject) need a destination drill answers for or sets: kind http, kind mqtt (reject, on drill's embedded broker), or kind amqp (broker: alarm, nack, queue_deleted)",
                destination.kind.name()
            ),
        ));
    };
    let other = link_fields(f)
        .into_iter()
        .chain(process_fields(f))
        .chain([("link", f.link.is_some())]);
    refuse_fields(
        entry,
        other,
        "a destination fault takes `answer` (with `retry_after`), `answer_after` or `reject`, and `for`",
    )?;
    let lasts = f
        .for_
        .map(|d| d.0)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| entry.field("for", "missing; how long the destination answers so"))?;
    if f.broker.is_some() || !answers.states.is_empty() {
        return broker_state_fault(entry, answers, destination, lasts);
    }
    if let Some(reject) = &f.reject {
        return reject_fault(entry, reject, &answers.reject, lasts);
    }
    if !answers.whole {
        return Err(reject_only(entry, destination, answers));
    }
    let fault = match (&f.answer, &f.answer_after) {
        (Some(code), None) => {
            if !known_error_status(code.value) {
                return Err(at(
                    &code.referenced,
                    format!(
                        "field `faults[{}].answer`: `{}` is not a known HTTP error status; use one such as 503, 429, 500, 404 or 422",
                        entry.i, code.value
                    ),
                ));
            }
            if f.retry_after.is_some() && !matches!(code.value, 429 | 503) {
                return Err(entry.field("retry_after", "goes with `answer: 429` or `answer: 503`"));
            }
            AnswerFault::Status {
                code: code.value,
                retry_after: f.retry_after.map(|d| d.0),
            }
        }
        (None, Some(after)) => {
            if f.retry_after.is_some() {
                return Err(entry.field("retry_after", "goes with `answer: 429` or `answer: 503`"));
            }
            if after.value.0.is_zero() || after.value.0 >= workload_ends {
                return Err(at(
                    &after.referenced,
                    format!(
                        "field `faults[{}].answer_after`: {} is not within the drill's workload ({}); give a delay shorter than it",
                        entry.i,
                        after.value,
                        crate::units::Dur(workload_ends)
                    ),
                ));
            }
            AnswerFault::After(after.value.0)
        }
        (Some(_), Some(_)) => {
            return Err(entry.whole("give `answer` or `answer_after`, not both"));
        }
        (None, None) => {
            return Err(entry.field(
                "answer",
                "missing; e.g. answer: 503 (with retry_after: 10s), answer_after: 30s or reject: { fraction: 0.1, status: 429 }",
            ));
        }
    };
    Ok(ScheduledFault {
        at: f.at.0,
        entry: entry.i,
        what: FaultAction::Answer { fault, lasts },
    })
}

/// The error for `answer` or `answer_after` on a destination that takes `reject` only (MQTT).
fn reject_only(entry: &FaultEntry, destination: &Spec, answers: &dest::ScriptedAnswers) -> Located {
    let f = entry.raw;
    let (field, example) = match (&f.answer, &f.answer_after) {
        (Some(_), _) => ("answer", ""),
        (None, Some(_)) => ("answer_after", ""),
        (None, None) => ("reject", "missing; "),
    };
    entry.field(
        field,
        format!(
            "{example}a `{}` destination takes `reject: {{ fraction, {} }}` only (drill answers some writes, the rest reach the broker)",
            destination.kind.name(),
            answers.reject.field
        ),
    )
}

/// `broker: WORD` of a destination fault: the broker put in one of its kind's states for
/// `for`. Given alone.
fn broker_state_fault(
    entry: &FaultEntry,
    answers: &'static dest::ScriptedAnswers,
    destination: &Spec,
    lasts: Duration,
) -> Result<ScheduledFault, Located> {
    let f = entry.raw;
    let words: Vec<&str> = answers.states.iter().map(|(w, _)| *w).collect();
    let Some(word) = &f.broker else {
        let (field, given) = destination_fields(f)
            .into_iter()
            .find(|(_, given)| *given)
            .unwrap_or(("broker", false));
        let missing = if given { "" } else { "missing; " };
        return Err(entry.field(
            field,
            format!(
                "{missing}a `{}` destination's faults put its broker in a state: `broker:` one of {}",
                destination.kind.name(),
                words.join(", ")
            ),
        ));
    };
    if words.is_empty() {
        return Err(entry.field(
            "broker",
            format!(
                "a `{}` destination has no broker states drill can set; it takes `answer`, `answer_after` or `reject`",
                destination.kind.name()
            ),
        ));
    }
    if let Some((other, _)) = destination_fields(f)
        .into_iter()
        .find(|(n, given)| *given && *n != "broker")
    {
        return Err(entry.field(other, "give `broker` alone, with `for`"));
    }
    let Some(&(state, _)) = answers.states.iter().find(|(w, _)| *w == word.value) else {
        return Err(at(
            &word.referenced,
            format!(
                "field `faults[{}].broker`: `{}` is not a state drill can put this broker in; use one of {}",
                entry.i,
                word.value,
                words.join(", ")
            ),
        ));
    };
    Ok(ScheduledFault {
        at: f.at.0,
        entry: entry.i,
        what: FaultAction::Answer {
            fault: AnswerFault::Broker { state },
            lasts,
        },
    })
}

/// `reject: { fraction, status }` (HTTP) or `reject: { fraction, reason }` (MQTT 5) of a
/// destination fault: "yes, but" — that share of the records refused with the code while the
/// answer says yes. Given alone, with `for`.
fn reject_fault(
    entry: &FaultEntry,
    reject: &Spanned<super::raw::RawReject>,
    words: &'static dest::RejectWords,
    lasts: Duration,
) -> Result<ScheduledFault, Located> {
    let f = entry.raw;
    if let Some(other) = [
        ("answer", f.answer.is_some()),
        ("answer_after", f.answer_after.is_some()),
        ("retry_after", f.retry_after.is_some()),
    ]
    .into_iter()
    .find_map(|(n, given)| given.then_some(n))
    {
        return Err(entry.field(
            other,
            "give `reject` alone: it refuses some records while the answer says yes",
        ));
    }
    let r = &reject.value;
    let field = |name: &str, why: String| {
        at(
            &reject.referenced,
            format!("field `faults[{}].reject.{name}`: {why}", entry.i),
        )
    };
    if !(r.fraction > 0.0 && r.fraction <= 1.0) {
        return Err(field(
            "fraction",
            format!(
                "{} is not a share of the records; give one above 0 and at most 1, e.g. 0.1",
                r.fraction
            ),
        ));
    }
    let codes = |good: bool| {
        let names: Vec<&str> = words
            .codes
            .iter()
            .filter(|c| c.1 == good)
            .map(|c| c.2)
            .collect();
        names.join(", ")
    };
    let known = format!(
        "use {} (rejected for now: resent) or {} (this record refused: counted failed)",
        codes(false),
        codes(true)
    );
    let (given, other) = match words.field {
        "reason" => (r.reason, ("status", r.status.is_some())),
        _ => (r.status, ("reason", r.reason.is_some())),
    };
    if other.1 {
        return Err(field(
            other.0,
            format!(
                "this destination's records are rejected with `{}`; {known}",
                words.field
            ),
        ));
    }
    let Some(code) = given else {
        return Err(field(words.field, format!("missing; {known}")));
    };
    if words.for_good(code).is_none() {
        let shown = match words.field {
            "reason" => format!("0x{code:02X}"),
            _ => code.to_string(),
        };
        return Err(field(
            words.field,
            format!("`{shown}` is not an answer a record is rejected with; {known}"),
        ));
    }
    Ok(ScheduledFault {
        at: f.at.0,
        entry: entry.i,
        what: FaultAction::Answer {
            fault: AnswerFault::Reject {
                code,
                words,
                per_million: ((r.fraction * 1e6).round() as u32).clamp(1, 1_000_000),
            },
            lasts,
        },
    })
}

/// A 4xx or 5xx HTTP status with a name.
fn known_error_status(code: u16) -> bool {
    (400..=599).contains(&code)
        && axum::http::StatusCode::from_u16(code)
            .ok()
            .is_some_and(|s| s.canonical_reason().is_some())
}

/// A process fault whose target does not take its action.
fn cannot(entry: &FaultEntry, target: &str, action: ProcessAction) -> Located {
    entry.field(
        "action",
        format!(
            "`{target}` cannot `{}`; the engine takes kill, stop, power_cut or fill_disk, a broker kill, stop or pause, the proxy restart",
            action.name()
        ),
    )
}

/// `expect:`; left out, nothing may be lost and the ledger must close. Either way, nothing may
/// be lost or left undelivered, `failed` must equal the number of poison records and nothing
/// unexpected may arrive, unless said otherwise (`lost: any`, `undelivered: any` on purpose).
fn expect(
    raw: Option<RawExpect>,
    poison: u64,
    destination: &Spec,
) -> Result<Expectations, Located> {
    let lost_before_sending = match raw.as_ref().and_then(|e| e.lost_before_sending.as_ref()) {
        Some(n) if destination.imp.confirms() => {
            return Err(at(
                &n.referenced,
                format!(
                    "field `expect.lost_before_sending`: a `{}` destination confirms each write, so every missing record counts as lost; use `lost`",
                    destination.kind.name()
                ),
            ));
        }
        Some(n) => Some(n.value),
        None => None,
    };
    Ok(match raw {
        Some(e) => Expectations {
            // On a destination that cannot confirm, both name the records that never left
            // the engine; the stricter bound holds.
            // Left out, nothing may be lost; `lost: any` turns the check off on purpose.
            lost: match (e.lost, lost_before_sending) {
                (Some(Bound::AtMost(a)), Some(b)) => Some(a.min(b)),
                (Some(Bound::Any), b) => b,
                (None, b) => Some(b.unwrap_or(0)),
                (Some(Bound::AtMost(a)), None) => Some(a),
            },
            undelivered: e.undelivered.map_or(Some(0), Bound::limit),
            overlapping_attempts: e.overlapping_attempts.map_or(Some(0), Bound::limit),
            duplicates: e.duplicates,
            reordered: e.reordered,
            ledger_closes: e.ledger == Some(LedgerExpectation::Closes),
            recovery_within: e.recovery_within.map(|d| d.0),
            failed: Some(e.failed.unwrap_or(poison)),
            unexpected: Some(e.unexpected.unwrap_or(0)),
            altered: Some(e.altered.unwrap_or(0)),
            not_accepted: e.not_accepted,
            drain_within: e.drain_within.map(|d| d.0),
            max_copies: e.max_copies,
        },
        None => Expectations {
            lost: Some(0),
            undelivered: Some(0),
            overlapping_attempts: Some(0),
            ledger_closes: true,
            failed: Some(poison),
            unexpected: Some(0),
            altered: Some(0),
            ..Expectations::default()
        },
    })
}

/// Limits that fit the machine (the book, docs/src/verdict.md "Limits"): a number past one is an invalid scenario,
/// checked before anything is allocated for it.
pub const MAX_RATE: f64 = 50_000.0;
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
pub const MAX_KEYS: u32 = 10_000;
pub const MAX_PAYLOAD: usize = 256 * 1024;
pub const MAX_POISON: usize = 1_000;
pub const MAX_RECORDS: u64 = 5_000_000;
pub const MAX_WORKLOAD_BYTES: u64 = 4 << 30;
pub const MAX_FAULTS: usize = 10_000;

/// The first of `fields` (name, given) the scenario gives, in the order listed.
/// The fields only a link fault takes (`for` apart: a full disk and a destination fault take
/// it too).
fn link_fields(f: &RawFault) -> [(&'static str, bool); 9] {
    [
        ("fault", f.fault.is_some()),
        ("direction", f.direction.is_some()),
        ("latency", f.latency.is_some()),
        ("jitter", f.jitter.is_some()),
        ("bytes_per_s", f.bytes_per_s.is_some()),
        ("loss", f.loss.is_some()),
        ("certificate", f.certificate.is_some()),
        ("repeat", f.repeat.is_some()),
        ("every", f.every.is_some()),
    ]
}

/// The fields only a process fault (engine, broker, proxy) takes, a disk fault's among them.
fn process_fields(f: &RawFault) -> [(&'static str, bool); 16] {
    [
        ("clock", f.clock.is_some()),
        ("by", f.by.is_some()),
        ("disk", f.disk.is_some()),
        ("op", f.op.is_some()),
        ("path", f.path.is_some()),
        ("errno", f.errno.is_some()),
        ("nth", f.nth.is_some()),
        ("delay", f.delay.is_some()),
        ("action", f.action.is_some()),
        ("restart_after", f.restart_after.is_some()),
        ("wipe_data", f.wipe_data.is_some()),
        ("down_for", f.down_for.is_some()),
        ("torn", f.torn.is_some()),
        ("dirents", f.dirents.is_some()),
        ("crash_at", f.crash_at.is_some()),
        ("node", f.node.is_some()),
    ]
}

/// The fields only a destination fault takes.
fn destination_fields(f: &RawFault) -> [(&'static str, bool); 5] {
    [
        ("answer", f.answer.is_some()),
        ("answer_after", f.answer_after.is_some()),
        ("retry_after", f.retry_after.is_some()),
        ("reject", f.reject.is_some()),
        ("broker", f.broker.is_some()),
    ]
}

/// An error for the first given of `fields` that the entry's kind of fault does not take.
fn refuse_fields(
    entry: &FaultEntry,
    fields: impl IntoIterator<Item = (&'static str, bool)>,
    why: &str,
) -> Result<(), Located> {
    match fields.into_iter().find(|(_, given)| *given) {
        Some((name, _)) => Err(entry.field(name, why)),
        None => Ok(()),
    }
}

fn first_given<const N: usize>(fields: [(&'static str, bool); N]) -> Option<&'static str> {
    fields
        .into_iter()
        .find(|(_, given)| *given)
        .map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::super::{FaultAction, parse};

    fn err(text: &str) -> String {
        parse(Path::new("s.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_flapping_link_and_a_proxy_restart() {
        let text = "name: f\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 2m }\nfaults:\n  - { at: 10s, link: mqtt, fault: refuse, for: 2s, every: 4s, repeat: 30 }\n  - { at: 5s, target: proxy, action: restart, down_for: 3s }\n  - { at: 1s, link: mqtt, fault: delay, direction: downstream, latency: 100ms, jitter: 10ms }\n";
        let plan = parse(Path::new("f.yaml"), text).unwrap();
        assert_eq!(plan.faults.len(), 32);
        assert_eq!(
            plan.faults.last().unwrap().at,
            Duration::from_secs(10 + 29 * 4)
        );
        assert!(
            matches!(plan.faults[1].what, FaultAction::ProxyRestart { down_for } if down_for == Duration::from_secs(3))
        );
        let e = err(&text.replace("every: 4s", "every: 1s"));
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        let e = err(&text.replace("latency: 100ms, jitter: 10ms", ""));
        assert!(e.contains("`delay` needs a latency"), "{e}");
        let e = err(&text.replace("fault: delay", "fault: swallow"));
        assert!(e.contains("only `delay` takes it"), "{e}");
    }

    #[test]
    fn each_kind_of_link_fault_takes_its_own_settings() {
        let fault = |f: &str| {
            format!(
                "name: k\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1m }}\nfaults:\n  - {{ at: 1s, link: mqtt, {f} }}\n"
            )
        };
        let e = err(&fault("fault: throttle, latency: 1s, bytes_per_s: 10"));
        assert!(
            e.ends_with("field `faults[0].latency`: only `delay` takes it"),
            "{e}"
        );
        let e = err(&fault("fault: delay, latency: 1s, bytes_per_s: 10"));
        assert!(
            e.ends_with("field `faults[0].bytes_per_s`: only `throttle` takes it"),
            "{e}"
        );
        let e = err(&fault("fault: heal, for: 1s"));
        assert!(
            e.ends_with("faults[0]: a heal has no `for` or `repeat`"),
            "{e}"
        );
        let e = err(&fault("fault: heal, jitter: 1s, repeat: 2"));
        assert!(
            e.ends_with("field `faults[0].jitter`: only `delay` takes it"),
            "{e}"
        );
        let e = err(&fault("fault: swallow, wipe_data: true"));
        assert!(
            e.ends_with("field `faults[0].wipe_data`: only process faults (`target:`) take it"),
            "{e}"
        );
        let plan = parse(
            Path::new("k.yaml"),
            &fault("fault: throttle, bytes_per_s: 10, for: 1s, every: 3s, repeat: 2"),
        )
        .unwrap();
        assert_eq!(plan.faults.len(), 2);
    }

    #[test]
    fn a_disk_io_error_takes_op_path_errno_and_nth_or_for() {
        let fault = |f: &str| {
            format!(
                "name: k\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1m }}\nfaults:\n  - {{ at: 1s, target: engine, {f} }}\n"
            )
        };
        let plan = parse(
            Path::new("k.yaml"),
            &fault("disk: io_error, op: fsync, path: \"records-*.log\", nth: 1"),
        )
        .unwrap();
        assert!(plan.needs_powerfs());
        let FaultAction::Disk { fault: f, lasts } = &plan.faults[0].what else {
            panic!("{:?}", plan.faults[0].what)
        };
        assert_eq!(
            (f.op, f.effect, f.nth, *lasts),
            (
                crate::powerfs::IoOp::Fsync,
                crate::powerfs::IoEffect::Error(crate::powerfs::IoErrno::Eio),
                Some(1),
                None
            )
        );
        let err = |f: &str| {
            parse(Path::new("k.yaml"), &fault(f))
                .unwrap_err()
                .to_string()
        };
        for (f, want) in [
            (
                "disk: io_error, path: x",
                "`faults[0].op`: missing; the operation that fails",
            ),
            ("disk: io_error, op: write", "`faults[0].path`: missing"),
            (
                "disk: io_error, op: write, path: /etc/x",
                "is a glob below the engine's data directory",
            ),
            (
                "disk: io_error, op: read, path: x, nth: 0",
                "`faults[0].nth`: counts from 1",
            ),
            (
                "disk: io_error, op: read, path: x, nth: 2, for: 2s",
                "`faults[0].for`: with `nth` only that one",
            ),
            ("disk: io_error, op: read, path: x, errno: EPERM", "EPERM"),
            (
                "disk: io_error, op: read, path: x, restart_after: 1s",
                "`faults[0].restart_after`: a disk fault takes",
            ),
            (
                "action: kill, op: read",
                "`faults[0].op`: only a disk fault",
            ),
            (
                "disk: slow, op: fsync, path: x",
                "`faults[0].delay`: missing; how late",
            ),
            (
                "disk: slow, op: fsync, path: x, delay: 1s, errno: EIO",
                "`faults[0].errno`: goes with `disk: io_error`",
            ),
            (
                "disk: slow, op: rename, path: x, delay: 1s",
                "`faults[0].op`: a slow disk slows `fsync` or `write`",
            ),
            (
                "disk: slow, op: fsync, path: x, delay: 2m",
                "`faults[0].delay`: between 1ms and 60s",
            ),
            (
                "disk: io_error, op: fsync, path: x, delay: 1s",
                "`faults[0].delay`: goes with `disk: slow`",
            ),
            (
                "action: kill, delay: 1s",
                "`faults[0].delay`: only a disk fault",
            ),
        ] {
            let e = err(f);
            assert!(e.contains(want), "{f}: {e}");
        }
        let plan = parse(
            Path::new("k.yaml"),
            &fault("disk: io_error, op: write, path: \"*\", errno: ENOSPC, for: 5s"),
        )
        .unwrap();
        assert!(matches!(
            &plan.faults[0].what,
            FaultAction::Disk { fault, lasts: Some(d) } if fault.nth.is_none() && d.as_secs() == 5
        ));
        let plan = parse(
            Path::new("k.yaml"),
            &fault("disk: slow, op: fsync, path: \"*.log\", delay: 300ms, for: 20s"),
        )
        .unwrap();
        assert!(matches!(
            &plan.faults[0].what,
            FaultAction::Disk { fault, .. }
                if fault.effect == crate::powerfs::IoEffect::Slow(Duration::from_millis(300))
        ));
    }

    #[test]
    fn a_clock_jump_takes_a_signed_whole_number_of_seconds() {
        let fault = |f: &str| {
            format!(
                "name: k\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1m }}\nfaults:\n  - {{ at: 1s, target: engine, {f} }}\n"
            )
        };
        let plan = parse(
            Path::new("k.yaml"),
            &fault("clock: drift, by: \"-10m\", for: 1m"),
        )
        .unwrap();
        assert!(matches!(
            plan.faults[0].what,
            FaultAction::Clock { by_s: -600, over: Some(d) } if d == Duration::from_secs(60)
        ));
        for (by, want) in [("+2h", 7200), ("-10m", -600), ("+1m30s", 90)] {
            let plan = parse(
                Path::new("k.yaml"),
                &fault(&format!("clock: jump, by: \"{by}\"")),
            )
            .unwrap();
            assert!(plan.needs_clock() && !plan.needs_powerfs());
            assert!(
                matches!(plan.faults[0].what, FaultAction::Clock { by_s, over: None } if by_s == want),
                "{by}"
            );
        }
        for (f, want) in [
            ("clock: jump", "`faults[0].by`: missing"),
            ("clock: jump, by: 2h", "needs a sign"),
            ("clock: jump, by: \"+0s\"", "whole seconds and not zero"),
            ("clock: jump, by: \"+1.5s\"", "whole seconds and not zero"),
            (
                "clock: jump, by: \"+2h\", for: 5s",
                "`faults[0].for`: a clock jump takes `by` only",
            ),
            (
                "clock: jump, by: \"+2h\", action: kill",
                "`faults[0].action`: a clock jump takes",
            ),
            ("clock: stop, by: \"+2h\"", "stop"),
            (
                "clock: drift, by: \"+2h\"",
                "`faults[0].for`: missing; how long",
            ),
            ("clock: drift, by: \"+2h\", for: 1s", "from 2s to 1h"),
            ("clock: drift, by: \"+2h\", for: 2h", "from 2s to 1h"),
            ("clock: drift, by: \"+2h\", for: 2500ms", "whole seconds"),
            (
                "action: kill, by: \"+2h\"",
                "`faults[0].by`: only a clock fault",
            ),
        ] {
            let e = parse(Path::new("k.yaml"), &fault(f))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{f}: {e}");
        }
    }

    #[test]
    fn strand_power_cut_and_fill_disk_take_their_own_shapes() {
        let fault = |f: &str| {
            format!(
                "name: k\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1m }}\nfaults:\n  - {{ at: 1s, {f} }}\n"
            )
        };
        // A strand is an instant: no `for`, no direction, no outage to size windows by.
        let plan = parse(Path::new("k.yaml"), &fault("link: mqtt, fault: strand")).unwrap();
        assert!(matches!(
            &plan.faults[0].what,
            FaultAction::Link { lasts: Some(d), .. } if d.is_zero()
        ));
        assert!(!plan.needs_powerfs());
        let e = err(&fault("link: mqtt, fault: strand, for: 5s"));
        assert!(e.ends_with("a strand has no `for` or `repeat`"), "{e}");
        let e = err(&fault("link: mqtt, fault: strand, direction: upstream"));
        assert!(e.contains("acts on whole connections"), "{e}");
        // A power cut is an engine fault, with or without a restart.
        let plan = parse(
            Path::new("k.yaml"),
            &fault("target: engine, action: power_cut, restart_after: 2s"),
        )
        .unwrap();
        assert!(plan.needs_powerfs());
        let e = err(&fault("target: broker, action: power_cut"));
        assert!(e.contains("`broker` cannot `power_cut`"), "{e}");
        // Torn, and at a crash point (nth counts from 1).
        let plan = parse(
            Path::new("k.yaml"),
            &fault("target: engine, action: power_cut, torn: true, crash_at: { op: fdatasync, path: \"*.log\", nth: 3 }"),
        )
        .unwrap();
        let FaultAction::Engine { power, .. } = &plan.faults[0].what else {
            panic!("an engine fault")
        };
        let point = power.crash_at.as_ref().expect("a crash point");
        assert!(power.torn && point.torn);
        assert_eq!(point.describe(), "fdatasync #3 on *.log");
        let e = err(&fault(
            "target: engine, action: power_cut, crash_at: { op: fsync, path: x, nth: 0 }",
        ));
        assert!(e.contains("`faults[0].crash_at.nth`: counts from 1"), "{e}");
        let e = err(&fault(
            "target: engine, action: power_cut, crash_at: { op: rename, path: x }",
        ));
        assert!(e.contains("rename"), "{e}");
        let e = err(&fault("target: engine, action: kill, torn: true"));
        assert!(
            e.contains("`faults[0].torn`: only a `power_cut` takes it"),
            "{e}"
        );
        let e = err(&fault(
            "link: mqtt, fault: refuse, crash_at: { op: write, path: x }",
        ));
        assert!(
            e.contains("`faults[0].crash_at`: only process faults"),
            "{e}"
        );
        // Directory entries: a model on a power cut, the strictest one mounted for the drill.
        let two = format!(
            "{}  - {{ at: 9s, target: engine, action: power_cut, dirents: ext4, restart_after: 1s }}\n",
            fault("target: engine, action: power_cut, dirents: posix, restart_after: 1s")
        );
        let plan = parse(Path::new("k.yaml"), &two).unwrap();
        assert_eq!(plan.dirents(), Some(crate::powerfs::Dirents::Posix));
        let e = err(&fault("target: engine, action: kill, dirents: posix"));
        assert!(
            e.contains("`faults[0].dirents`: only a `power_cut` takes it"),
            "{e}"
        );
        let e = err(&fault("target: engine, action: power_cut, dirents: ntfs"));
        assert!(e.contains("s.yaml:") && e.contains("ntfs"), "{e}");
        let e = err(&fault("link: mqtt, fault: refuse, dirents: posix"));
        assert!(
            e.contains("`faults[0].dirents`: only process faults"),
            "{e}"
        );
        // The record log's segment size, for drills that roll segments often.
        let seg = |size: &str| {
            format!(
                "name: k\ndestination: {{ kind: mqtt }}\nsystem:\n  builtin: {{ segment: {size} }}\nworkload: {{ rate: 10/s, duration: 1m }}\n"
            )
        };
        let plan = parse(Path::new("k.yaml"), &seg("16KB")).unwrap();
        assert_eq!(plan.engine.segment_bytes, Some(16 << 10));
        let e = err(&seg("1KB"));
        assert!(
            e.starts_with("s.yaml:4:") && e.contains("`system.builtin.segment`: at least 4KB"),
            "{e}"
        );
        let e = err(&seg("16"));
        assert!(e.contains("has no unit"), "{e}");
        // A full disk lasts `for`, and takes nothing else.
        let plan = parse(
            Path::new("k.yaml"),
            &fault("target: engine, action: fill_disk, for: 10s"),
        )
        .unwrap();
        assert!(plan.needs_powerfs());
        assert!(matches!(
            &plan.faults[0].what,
            FaultAction::Engine { lasts: Some(d), .. } if *d == Duration::from_secs(10)
        ));
        let e = err(&fault(
            "target: engine, action: fill_disk, restart_after: 2s",
        ));
        assert!(e.contains("`fill_disk` takes `for`"), "{e}");
        let e = err(&fault("target: engine, action: kill, for: 2s"));
        assert!(e.contains("field `faults[0].for`: only link faults"), "{e}");
        let e = err(&fault("target: proxy, action: fill_disk"));
        assert!(e.contains("`proxy` cannot `fill_disk`"), "{e}");
    }

    #[test]
    fn limits_are_located_and_checked_before_anything_is_allocated() {
        let base = |w: &str| format!("name: l\ndestination: {{ kind: mqtt }}\nworkload: {w}\n");
        let e = err(&base("{ rate: 1000000000/s, duration: 100000h }"));
        assert!(
            e.starts_with("s.yaml:3:19: field `workload.rate`: at most 50000/s"),
            "{e}"
        );
        let e = err(&base("{ rate: 10/s, duration: 100000h }"));
        assert!(e.contains("field `workload.duration`: at most 24 h"), "{e}");
        let e = err(&base("{ rate: 10/s, duration: 1m, keys: 20000 }"));
        assert!(e.contains("field `workload.keys`: 1 to 10000"), "{e}");
        let e = err(&base("{ rate: 10/s, duration: 1m, payload_bytes: 300000 }"));
        assert!(
            e.contains("field `workload.payload_bytes`: at most 262144 bytes"),
            "{e}"
        );
        let e = err(&base("{ rate: 50000/s, duration: 1h }"));
        assert!(e.contains("180000000 records"), "{e}");
    }

    #[test]
    fn a_fault_after_the_workload_must_say_so() {
        let text = |extra: &str| {
            format!(
                "name: l\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 5s }}\nfaults:\n  - {{ at: 5s, link: mqtt, fault: swallow, for: 1s{extra} }}\n"
            )
        };
        let e = err(&text(""));
        assert!(
            e.starts_with("s.yaml:5:5: field `faults[0].at`: 5s is when the workload has ended"),
            "{e}"
        );
        assert!(parse(Path::new("s.yaml"), &text(", after_workload: true")).is_ok());
    }

    #[test]
    fn failed_defaults_to_the_poison_records_and_unexpected_to_none() {
        let text = "name: p\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 5s, poison: [3, 7] }\n";
        let plan = parse(Path::new("p.yaml"), text).unwrap();
        assert_eq!(plan.expect.failed, Some(2));
        assert_eq!(plan.expect.unexpected, Some(0));
        let text = "name: p\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 5s }\nexpect: { lost: 0, failed: 1, unexpected: 3, max_copies: 2, drain_within: 5s, not_accepted: 0 }\n";
        let e = parse(Path::new("p.yaml"), text).unwrap().expect;
        assert_eq!(
            (e.failed, e.unexpected, e.max_copies, e.not_accepted),
            (Some(1), Some(3), Some(2), Some(0))
        );
        assert_eq!(e.drain_within, Some(Duration::from_secs(5)));
    }

    /// A destination whose links carry datagrams: the MQTT one, but answering `true` to
    /// `datagram_links` (as syslog's `transport: udp` does), without starting an rsyslog.
    #[derive(Debug)]
    struct OverUdp(std::sync::Arc<dyn crate::dest::Destination>);

    impl crate::dest::Destination for OverUdp {
        fn kind(&self) -> crate::dest::Kind {
            self.0.kind()
        }
        fn datagram_links(&self) -> bool {
            true
        }
        fn settle(
            &self,
            shape: &crate::dest::Shape,
        ) -> std::sync::Arc<dyn crate::dest::Destination> {
            self.0.settle(shape)
        }
        fn builtin_write_key(&self) -> crate::verify::WriteKeyPlace {
            self.0.builtin_write_key()
        }
        fn write_key_place(
            &self,
            value: &serde_json::Value,
        ) -> Result<crate::verify::WriteKeyPlace, String> {
            self.0.write_key_place(value)
        }
        fn provision<'a>(
            &'a self,
            p: crate::dest::Provision<'a>,
        ) -> futures::future::BoxFuture<'a, Result<crate::dest::Provisioned, crate::dest::DestError>>
        {
            self.0.provision(p)
        }
        fn reader<'a>(
            &'a self,
            at: &'a crate::dest::Running,
            r: crate::dest::ReaderSpec,
        ) -> futures::future::BoxFuture<
            'a,
            Result<Box<dyn crate::dest::ReadBack>, crate::dest::DestError>,
        > {
            self.0.reader(at, r)
        }
    }

    /// The faults of `text`'s scenario checked against its destination, its links made to
    /// carry datagrams when `datagrams`.
    fn link_faults_over(text: &str, datagrams: bool) -> Result<usize, crate::located::Located> {
        let raw: super::super::raw::RawScenario = serde_saphyr::from_str(text).unwrap();
        let mut destination = crate::dest::validate(&raw.destination, text).unwrap();
        if datagrams {
            destination.imp = std::sync::Arc::new(OverUdp(destination.imp.clone()));
        }
        super::faults(
            &raw.faults,
            &destination,
            super::Engines {
                command: false,
                file_source: false,
                source_link: false,
            },
            Duration::from_secs(60),
        )
        .map(|f| f.len())
    }

    #[test]
    fn a_datagram_link_refuses_stream_faults_where_they_are_written() {
        let fault = |f: &str| {
            format!(
                "name: u\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1m }}\nfaults:\n  - {{ at: 1s, link: mqtt, fault: swallow, for: 1s }}\n  - {{ at: 5s, link: mqtt, {f} }}\n"
            )
        };
        for stream_only in [
            "fault: reset, for: 1s",
            "fault: hang, direction: upstream, for: 1s",
            "fault: throttle, bytes_per_s: 1000, for: 1s",
            "fault: strand",
        ] {
            let e = link_faults_over(&fault(stream_only), true).unwrap_err();
            assert_eq!((e.at.line(), e.at.column()), (6, 5), "{stream_only}: {e:?}");
            assert!(
                e.message.starts_with("field `faults[1].fault`: `")
                    && e.message
                        .contains("needs a byte stream, and link `mqtt` carries datagrams"),
                "{}",
                e.message
            );
        }
        for datagram in [
            "fault: refuse, for: 1s",
            "fault: swallow, direction: downstream, for: 1s",
            "fault: delay, latency: 100ms, jitter: 10ms, for: 1s",
            "fault: loss, loss: 0.3, direction: upstream, for: 1s",
            "fault: blackhole, for: 1s",
            "fault: heal",
        ] {
            assert_eq!(
                link_faults_over(&fault(datagram), true).unwrap(),
                2,
                "{datagram}"
            );
        }
        // The same destination over streams takes the stream faults and refuses `loss`.
        assert_eq!(
            link_faults_over(&fault("fault: reset, for: 1s"), false).unwrap(),
            2
        );
        let e = link_faults_over(&fault("fault: loss, loss: 0.3, for: 1s"), false).unwrap_err();
        assert_eq!((e.at.line(), e.at.column()), (6, 5), "{e:?}");
    }

    #[test]
    fn loss_and_blackhole_are_refused_on_a_stream_link_located() {
        let fault = |f: &str| {
            format!(
                "name: k\ndestination: {{ kind: mqtt }}\nworkload: {{ rate: 10/s, duration: 1m }}\nfaults:\n  - {{ at: 1s, link: mqtt, {f} }}\n"
            )
        };
        let e = err(&fault("fault: loss, loss: 0.3, for: 1s"));
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        assert!(
            e.ends_with("field `faults[0].fault`: `loss` is for datagram (UDP) links, and link `mqtt` carries a byte stream; use swallow (or refuse) instead"),
            "{e}"
        );
        let e = err(&fault("fault: blackhole, for: 1s"));
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        assert!(e.contains("`blackhole` is for datagram (UDP) links"), "{e}");
        let e = err(&fault("fault: swallow, loss: 0.3, for: 1s"));
        assert!(
            e.ends_with("field `faults[0].loss`: only `loss` takes it"),
            "{e}"
        );
    }

    #[test]
    fn a_loss_needs_a_fraction_and_a_blackhole_no_direction() {
        assert!(super::fits_the_link(crate::proxy::Fault::Loss, true, "u").is_ok());
        let spec = |loss| crate::proxy::FaultSpec::loss(crate::proxy::Direction::Both, loss);
        assert!(spec(0.3).validate().is_ok());
        assert!(spec(1.0).validate().is_ok());
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            let e = spec(bad).validate().unwrap_err();
            assert!(
                e.contains("needs a fraction above 0 and at most 1"),
                "{bad}: {e}"
            );
        }
        let e = crate::proxy::FaultSpec::new(
            crate::proxy::Fault::Blackhole,
            crate::proxy::Direction::Upstream,
        )
        .validate()
        .unwrap_err();
        assert!(e.contains("leave `direction` out"), "{e}");
    }
}
