//! Raw scenario → [`Plan`]: one function per section, each the owner of its section's fields.
//!
//! Sections are checked in the file's order — name, destination, system, workload, faults,
//! expect — each function taking its raw section and what it needs from the ones before, and
//! returning its part of the plan or a [`Located`] error: the line and column of the value, a
//! message that names the field and says what to write instead. Defaults are filled here, once.
//! Nothing here starts anything; the only thing read is a command engine's template files.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::path::Path;
use std::time::Duration;

use serde_saphyr::{Location, Spanned};

use super::command::{self, Located, at};
use super::raw::{
    LedgerExpectation, RawBuiltin, RawDestination, RawExpect, RawFault, RawScenario, RawSystem,
    RawWorkload,
};
use super::{
    BrokerNode, CommandSpec, Credentials, Destination, DestinationKind, EngineSpec, Expectations,
    External, FaultAction, Plan, ProcessAction, Promise, RuntimeChoice, ScheduledFault,
    WorkloadSpec, longest_outage,
};
use crate::proxy::{Direction, Fault, FaultSpec};

/// Checks every section of `raw`; `source` is the scenario file (its folder holds a command
/// engine's templates). Errors that belong to no one value point at `name:`.
pub(super) fn validate(raw: RawScenario, source: &Path) -> Result<Plan, Located> {
    let anchor = raw.name.referenced;
    let name = name(&raw.name)?;
    let mut destination = destination(raw.destination)?;
    let (engine, command) = system(raw.system, &destination, source, &anchor)?;
    let workload = workload(raw.workload, destination.kind, &anchor)?;
    let faults = faults(
        &raw.faults,
        &destination,
        command.is_some(),
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
    let drain_timeout = raw.drain_timeout.map_or(Duration::from_secs(60), |d| d.0);
    if destination.kind == DestinationKind::Nats && destination.duplicate_window.is_none() {
        let drill_ends = workload.duration + drain_timeout;
        destination.duplicate_window = Some(duplicate_window(&faults, drill_ends, &engine));
    }
    let poison = workload.poison.len() as u64;
    Ok(Plan {
        name,
        about: raw.about,
        source: source.to_path_buf(),
        seed: raw.seed.unwrap_or(1),
        destination,
        engine,
        command,
        workload,
        faults,
        expect: expect(raw.expect, poison),
        drain_timeout,
        tags: raw.tags,
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

/// `destination:`: the broker's kind, where it runs and the topic. Only `nats` takes a
/// `duplicate_window` (left out, it is filled once the faults are known: [`duplicate_window`])
/// and `nodes` (a cluster of 1 to 5); only `mqtt` has an embedded broker.
fn destination(raw: RawDestination) -> Result<Destination, Located> {
    let kind = raw.kind.value;
    if let Some(w) = &raw.duplicate_window
        && kind != DestinationKind::Nats
    {
        return Err(at(
            &w.referenced,
            "field `destination.duplicate_window`: only a `nats` destination has one".to_string(),
        ));
    }
    let runtime = raw.runtime.unwrap_or(RuntimeChoice::Auto);
    if kind != DestinationKind::Mqtt && runtime == RuntimeChoice::Embedded {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.runtime`: there is no embedded {} broker; use `process` or `auto`",
                kind.name()
            ),
        ));
    }
    let nodes = match &raw.nodes {
        None => 1,
        Some(n) if kind != DestinationKind::Nats || n.value == 0 || n.value > 5 => {
            return Err(at(
                &n.referenced,
                "field `destination.nodes`: a NATS cluster of 1 to 5 nodes (only `nats` has nodes)"
                    .to_string(),
            ));
        }
        Some(n) => n.value,
    };
    if let Some(stream) = &raw.stream
        && kind != DestinationKind::Nats
    {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.stream` (`{stream}`): only a `nats` destination has a stream"
            ),
        ));
    }
    let stream = raw.stream.clone().unwrap_or_else(|| "DRILL".to_string());
    let external = external(&raw, kind, runtime)?;
    let nodes = match &external {
        Some(e) if kind == DestinationKind::Nats => {
            if let Some(n) = &raw.nodes {
                return Err(at(
                    &n.referenced,
                    "field `destination.nodes`: an external NATS cluster has as many nodes as `servers` lists; leave `nodes` out".to_string(),
                ));
            }
            e.addresses.len()
        }
        _ => nodes,
    };
    Ok(Destination {
        kind,
        nodes,
        runtime,
        topic: raw.topic.unwrap_or_else(|| "drill".to_string()),
        duplicate_window: raw.duplicate_window.map(|w| w.value.0),
        stream,
        external,
    })
}

/// `runtime: external`: the addresses the kind takes (`bootstrap` for Kafka, `servers` for
/// NATS, `address` for MQTT), `create`, `keep` and `credentials`. Without it none of these may
/// be given.
fn external(
    raw: &RawDestination,
    kind: DestinationKind,
    runtime: RuntimeChoice,
) -> Result<Option<External>, Located> {
    let given: [(&str, Option<&serde_saphyr::Location>); 3] = [
        (
            "bootstrap",
            raw.bootstrap.as_ref().map(|_| &raw.kind.referenced),
        ),
        (
            "servers",
            raw.servers.as_ref().map(|_| &raw.kind.referenced),
        ),
        ("address", raw.address.as_ref().map(|a| &a.referenced)),
    ];
    let wanted = match kind {
        DestinationKind::Kafka => "bootstrap",
        DestinationKind::Nats => "servers",
        DestinationKind::Mqtt => "address",
    };
    if runtime != RuntimeChoice::External {
        let extra = given
            .iter()
            .map(|(f, l)| (*f, l.is_some()))
            .chain([
                ("create", raw.create.is_some()),
                ("keep", raw.keep.is_some()),
                ("credentials", raw.credentials.is_some()),
            ])
            .find(|(_, g)| *g);
        if let Some((field, _)) = extra {
            return Err(at(
                &raw.kind.referenced,
                format!(
                    "field `destination.{field}`: goes with `runtime: external` (brokers you already run); drill starts its own otherwise"
                ),
            ));
        }
        return Ok(None);
    }
    if let Some((field, loc)) = given.iter().find(|(f, l)| l.is_some() && *f != wanted) {
        return Err(at(
            loc.unwrap_or(&raw.kind.referenced),
            format!(
                "field `destination.{field}`: a `{}` destination takes `{wanted}`",
                kind.name()
            ),
        ));
    }
    let addresses: Vec<&Spanned<String>> = match kind {
        DestinationKind::Kafka => raw.bootstrap.iter().flatten().collect(),
        DestinationKind::Nats => raw.servers.iter().flatten().collect(),
        DestinationKind::Mqtt => raw.address.iter().collect(),
    };
    if addresses.is_empty() {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.{wanted}`: `runtime: external` needs the broker address(es), e.g. {wanted}: {}",
                match kind {
                    DestinationKind::Mqtt => "broker.site.local:1883",
                    DestinationKind::Nats => "[nats-1:4222, nats-2:4222]",
                    DestinationKind::Kafka => "[kafka-1:9092, kafka-2:9092]",
                }
            ),
        ));
    }
    if kind == DestinationKind::Nats && addresses.len() > 5 {
        return Err(at(
            &addresses[5].referenced,
            "field `destination.servers`: at most 5 servers".to_string(),
        ));
    }
    for a in &addresses {
        let ok = a.value.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(at(
                &a.referenced,
                format!(
                    "field `destination.{wanted}`: `{}` is not host:port (e.g. kafka-1.staging:9092)",
                    a.value
                ),
            ));
        }
    }
    let credentials = match &raw.credentials {
        None => Credentials::default(),
        Some(c) => {
            let v = &c.value;
            let kafka = kind == DestinationKind::Kafka;
            if let Some(m) = &v.sasl_mechanism
                && (!kafka || !["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"].contains(&m.as_str()))
            {
                return Err(at(
                    &c.referenced,
                    format!(
                        "field `destination.credentials.sasl_mechanism`: `{m}`; Kafka only, one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
                    ),
                ));
            }
            if v.username_env.is_some() != v.password_env.is_some() {
                return Err(at(
                    &c.referenced,
                    "field `destination.credentials`: `username_env` and `password_env` go together".to_string(),
                ));
            }
            for name in [&v.username_env, &v.password_env].into_iter().flatten() {
                let usable = !name.is_empty()
                    && name
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
                if !usable {
                    return Err(at(
                        &c.referenced,
                        format!(
                            "field `destination.credentials`: `{name}` is not an environment variable name; give the variable's NAME (the secret itself never goes in the file)"
                        ),
                    ));
                }
            }
            Credentials {
                username_env: v.username_env.clone(),
                password_env: v.password_env.clone(),
                sasl_mechanism: v
                    .sasl_mechanism
                    .clone()
                    .or_else(|| (kafka && v.username_env.is_some()).then(|| "PLAIN".to_string())),
            }
        }
    };
    Ok(Some(External {
        addresses: addresses.iter().map(|a| a.value.clone()).collect(),
        create: raw.create.unwrap_or(false),
        keep: raw.keep.unwrap_or(false),
        credentials,
    }))
}

/// `system:`: the built-in engine with its settings under `builtin`, or a user's engine —
/// `command` and the fields that go with it (checked in `command.rs`) — with the promise it
/// declares. Either way the [`EngineSpec`] carries the promise of the system under test.
fn system(
    raw: Option<RawSystem>,
    destination: &Destination,
    source: &Path,
    anchor: &Location,
) -> Result<(EngineSpec, Option<CommandSpec>), Located> {
    let Some(raw) = raw else {
        return Ok((builtin(RawBuiltin::default(), destination.kind), None));
    };
    let Some(argv) = raw.command else {
        let for_a_command = first_given([
            ("env", !raw.env.is_empty()),
            ("files", !raw.files.is_empty()),
            ("ingest", raw.ingest.is_some()),
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
        let settings = raw.builtin.map(|b| b.value).unwrap_or_default();
        return Ok((builtin(settings, destination.kind), None));
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
        &destination.link_names(),
        &command::scenario_dir(source),
        &anchor,
    )?;
    // A user's engine has none of the built-in engine's settings; only its promise counts.
    let engine = EngineSpec {
        promise: raw.promise.map_or(Promise::AtLeastOnce, |p| p.value),
        ..builtin(RawBuiltin::default(), destination.kind)
    };
    Ok((engine, Some(spec)))
}

/// `system.builtin:`, with its defaults. The promise defaults to what the destination lets the
/// built-in engine keep: `effectively_once` on NATS (the stream drops a resend it already
/// has), `at_least_once` elsewhere.
fn builtin(raw: RawBuiltin, kind: DestinationKind) -> EngineSpec {
    EngineSpec {
        order: raw.order.unwrap_or_default(),
        promise: raw.promise.unwrap_or(match kind {
            DestinationKind::Nats => Promise::EffectivelyOnce,
            _ => Promise::AtLeastOnce,
        }),
        keepalive: raw.keepalive.map_or(Duration::from_secs(2), |d| d.0),
        answer_timeout: raw.answer_timeout.map_or(Duration::from_secs(3), |d| d.0),
        window: raw.window.unwrap_or(64).max(1),
        refusals: raw
            .refusals
            .map_or((10, Duration::from_secs(1), Duration::from_secs(60)), |r| {
                (
                    r.max.max(1),
                    r.backoff[0].0,
                    r.backoff[1].0.max(r.backoff[0].0),
                )
            }),
    }
}

/// `workload:`: how fast, how long, over how many keys, and which records are poison — each
/// one of the records the drill generates, on a destination that can refuse it.
fn workload(
    raw: RawWorkload,
    kind: DestinationKind,
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
    if raw.poison.len() > MAX_POISON {
        return Err(at(
            anchor,
            format!("field `workload.poison`: at most {MAX_POISON} poison records"),
        ));
    }
    let workload = WorkloadSpec {
        rate_per_s: raw.rate.value.0,
        duration: raw.duration.value.0,
        keys,
        payload_bytes,
        poison: raw.poison,
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
            anchor,
            format!(
                "field `workload.poison`: record {p} is past the last of {total} records (indices start at 0)"
            ),
        ));
    }
    if kind == DestinationKind::Kafka && !workload.poison.is_empty() {
        return Err(at(
            anchor,
            "field `workload.poison`: poison records need a destination that refuses one oversized write (`mqtt` or `nats`); remove it for `kafka`".to_string(),
        ));
    }
    Ok(workload)
}

/// `faults:`, in time order. Each entry is a link fault (`link:`) or a process fault
/// (`target:`); a flapping link fault stands for several. A fault that starts when the
/// workload has ended would meet no traffic: it must say `after_workload: true`.
fn faults(
    raw: &[Spanned<RawFault>],
    destination: &Destination,
    command_engine: bool,
    workload_ends: Duration,
) -> Result<Vec<ScheduledFault>, Located> {
    let link_names = destination.link_names();
    let links: BTreeSet<&str> = link_names.iter().map(String::as_str).collect();
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
                    entry.raw.at, super::Dur(workload_ends)
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
            (Some(link), None) => faults.extend(link_fault(&entry, link, &links)?),
            (None, Some(target)) if target == "broker" && destination.external.is_some() => {
                return Err(entry.field(
                    "target",
                    "broker faults are refused for external brokers: drill did not start them and will not kill, stop or pause them; use a link fault (link: ...) or a managed runtime",
                ));
            }
            (None, Some(target)) => faults.push(process_fault(
                &entry,
                target,
                destination.nodes,
                command_engine,
            )?),
        }
    }
    faults.sort_by_key(|f| f.at);
    Ok(faults)
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

/// Whether `link` is one of `links`, or — in front of Kafka, whose link gives every broker a
/// link of its own — one broker's link, `kafka-<node id>`.
fn names_a_link(links: &BTreeSet<&str>, link: &str) -> bool {
    links.contains(link)
        || (links.contains("kafka")
            && link
                .strip_prefix("kafka-")
                .is_some_and(|n| n.parse::<i32>().is_ok_and(|n| n >= 0)))
}

/// A link fault: `fault` on `link` (both ways unless `direction` says otherwise) from `at`,
/// for a while (`for`), flapping (`repeat`, `every`), or until a later `heal`. Which kinds take
/// `latency`, `jitter`, `bytes_per_s`, `for` and `repeat` is [`LinkSetting::taken_by`]'s to say.
fn link_fault(
    entry: &FaultEntry,
    link: &str,
    links: &BTreeSet<&str>,
) -> Result<Vec<ScheduledFault>, Located> {
    let f = entry.raw;
    if !names_a_link(links, link) {
        let kafka = if links.contains("kafka") {
            " (and `kafka-<node id>`, one broker's own link)"
        } else {
            ""
        };
        return Err(entry.field(
            "link",
            format!(
                "no link named `{link}`; this scenario has: {}{kafka}",
                links.iter().copied().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let of_a_process_fault = first_given([
        ("action", f.action.is_some()),
        ("restart_after", f.restart_after.is_some()),
        ("wipe_data", f.wipe_data.is_some()),
        ("down_for", f.down_for.is_some()),
    ]);
    if let Some(name) = of_a_process_fault {
        return Err(entry.field(name, "only process faults (`target:`) take it"));
    }
    let fault = f.fault.ok_or_else(|| {
        entry.field(
            "fault",
            "missing; one of refuse, reset, swallow, hang, delay, throttle, strand, heal",
        )
    })?;
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
        limit_bytes: 0,
    };
    spec.validate().map_err(|m| entry.whole(m))?;
    let link = link.to_string();
    if fault == Fault::Heal {
        let what = FaultAction::Heal { link };
        return Ok(vec![ScheduledFault { at: f.at.0, what }]);
    }
    if fault.instantaneous() {
        let what = FaultAction::Link {
            link,
            spec,
            lasts: Some(Duration::ZERO),
        };
        return Ok(vec![ScheduledFault { at: f.at.0, what }]);
    }
    let lasts = f.for_.map(|d| d.0);
    let (times, every) = flapping(entry, lasts)?;
    Ok((0..times)
        .map(|k| ScheduledFault {
            at: f.at.0 + every * k,
            what: FaultAction::Link {
                link: link.clone(),
                spec,
                lasts,
            },
        })
        .collect())
}

/// The fields of a link fault that not every kind of fault takes. (`direction` and `every` any
/// kind takes; `every` goes with `repeat`, see [`flapping`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkSetting {
    Latency,
    Jitter,
    BytesPerS,
    For,
    Repeat,
}

/// Every kind of fault a scenario can write, for [`LinkSetting::refused`] to name the one that
/// takes a setting.
const SCENARIO_FAULTS: [Fault; 8] = [
    Fault::Refuse,
    Fault::Reset,
    Fault::Swallow,
    Fault::Hang,
    Fault::Delay,
    Fault::Throttle,
    Fault::Strand,
    Fault::Heal,
];

impl LinkSetting {
    /// In the order they are checked: the first one a fault does not take is reported.
    const ALL: [LinkSetting; 5] = [
        LinkSetting::Latency,
        LinkSetting::Jitter,
        LinkSetting::BytesPerS,
        LinkSetting::For,
        LinkSetting::Repeat,
    ];

    /// Which settings each kind of link fault takes: the one place that says so.
    fn taken_by(fault: Fault) -> &'static [LinkSetting] {
        use LinkSetting::{BytesPerS, For, Jitter, Latency, Repeat};
        match fault {
            // Every chunk arrives `latency` ± `jitter` late; for a while, or flapping.
            Fault::Delay => &[Latency, Jitter, For, Repeat],
            // At most `bytes_per_s` get through; for a while, or flapping.
            Fault::Throttle => &[BytesPerS, For, Repeat],
            // An outage: for a while, flapping, or until a `heal`.
            Fault::Refuse | Fault::Reset | Fault::Swallow | Fault::Hang => &[For, Repeat],
            // Back to pass-through, at once and for good.
            Fault::Heal => &[],
            // At an instant: the connections open then go silent for good.
            Fault::Strand => &[],
            // Only the Toxiproxy-shaped API sets it; a scenario cannot write it.
            Fault::LimitData => &[],
        }
    }

    fn name(self) -> &'static str {
        match self {
            LinkSetting::Latency => "latency",
            LinkSetting::Jitter => "jitter",
            LinkSetting::BytesPerS => "bytes_per_s",
            LinkSetting::For => "for",
            LinkSetting::Repeat => "repeat",
        }
    }

    fn given(self, f: &RawFault) -> bool {
        match self {
            LinkSetting::Latency => f.latency.is_some(),
            LinkSetting::Jitter => f.jitter.is_some(),
            LinkSetting::BytesPerS => f.bytes_per_s.is_some(),
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
            LinkSetting::Latency | LinkSetting::Jitter | LinkSetting::BytesPerS => {
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
    let fills_disk = f.action == Some(ProcessAction::FillDisk);
    let of_a_link_fault = first_given([
        ("fault", f.fault.is_some()),
        ("direction", f.direction.is_some()),
        ("for", f.for_.is_some() && !fills_disk),
        ("latency", f.latency.is_some()),
        ("jitter", f.jitter.is_some()),
        ("bytes_per_s", f.bytes_per_s.is_some()),
        ("repeat", f.repeat.is_some()),
        ("every", f.every.is_some()),
    ]);
    if let Some(name) = of_a_link_fault {
        return Err(entry.field(
            name,
            "only link faults (`link:`) take it; a process fault uses `action`",
        ));
    }
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
    Ok(ScheduledFault { at: f.at.0, what })
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
        ProcessAction::Restart => return Err(cannot(entry, "engine", action)),
    }
    if f.down_for.is_some() {
        return Err(entry.field("down_for", "the engine uses `restart_after`"));
    }
    Ok(FaultAction::Engine {
        action,
        restart_after: f.restart_after.map(|d| d.0),
        wipe_data: f.wipe_data.unwrap_or(false),
        lasts: None,
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
        ProcessAction::Kill | ProcessAction::Stop | ProcessAction::Pause => {}
        ProcessAction::Restart | ProcessAction::PowerCut | ProcessAction::FillDisk => {
            return Err(cannot(entry, "broker", action));
        }
    }
    let node = match f.node.as_deref() {
        None => BrokerNode::Number(1),
        Some("leader") if nodes > 1 => BrokerNode::Leader,
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=nodes).contains(&n) => BrokerNode::Number(n),
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
        | ProcessAction::Pause
        | ProcessAction::PowerCut
        | ProcessAction::FillDisk => {
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

/// A NATS stream's duplicate window when the scenario gives none: a record resent after the
/// longest outage, the longest backoff and two answer timeouts must still be recognised as a
/// resend. At least 2 min.
fn duplicate_window(
    faults: &[ScheduledFault],
    drill_ends: Duration,
    engine: &EngineSpec,
) -> Duration {
    let window = longest_outage(faults, drill_ends) + engine.refusals.2 + 2 * engine.answer_timeout;
    window.max(Duration::from_secs(120))
}

/// `expect:`; left out, nothing may be lost and the ledger must close. Either way, `failed`
/// must equal the number of poison records and nothing unexpected may arrive, unless said
/// otherwise.
fn expect(raw: Option<RawExpect>, poison: u64) -> Expectations {
    match raw {
        Some(e) => Expectations {
            lost: e.lost,
            duplicates: e.duplicates,
            reordered: e.reordered,
            ledger_closes: e.ledger == Some(LedgerExpectation::Closes),
            recovery_within: e.recovery_within.map(|d| d.0),
            failed: Some(e.failed.unwrap_or(poison)),
            unexpected: Some(e.unexpected.unwrap_or(0)),
            not_accepted: e.not_accepted,
            drain_within: e.drain_within.map(|d| d.0),
            max_copies: e.max_copies,
        },
        None => Expectations {
            lost: Some(0),
            ledger_closes: true,
            failed: Some(poison),
            unexpected: Some(0),
            ..Expectations::default()
        },
    }
}

/// Limits that fit the machine (README "Limits"): a number past one is an invalid scenario,
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

    use super::super::{BrokerNode, FaultAction, Promise, parse};

    fn err(text: &str) -> String {
        parse(Path::new("s.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_nats_destination_gets_a_duplicate_window_longer_than_its_outages() {
        let text = "name: n\ndestination: { kind: nats }\nworkload: { rate: 10/s, duration: 10m }\nfaults:\n  - { at: 10s, link: nats, fault: swallow, direction: downstream, for: 5m }\n";
        let plan = parse(Path::new("n.yaml"), text).unwrap();
        assert_eq!(plan.engine.promise, Promise::EffectivelyOnce);
        // 5 min outage + 60 s backoff cap + twice the 3 s answer timeout.
        assert_eq!(
            plan.destination.duplicate_window,
            Some(Duration::from_secs(300 + 60 + 6))
        );
        let short = text.replace("for: 5m", "for: 5s");
        let plan = parse(Path::new("n.yaml"), &short).unwrap();
        assert_eq!(
            plan.destination.duplicate_window,
            Some(Duration::from_secs(120))
        );
        let e = err(&text.replace("kind: nats }", "kind: nats, runtime: embedded }"));
        assert!(e.contains("no embedded nats broker"), "{e}");
        let e = err(&text
            .replace("kind: nats }", "kind: mqtt, duplicate_window: 1m }")
            .replace("link: nats", "link: mqtt"));
        assert!(e.contains("only a `nats` destination"), "{e}");
        let cluster = text
            .replace("kind: nats }", "kind: nats, nodes: 3 }")
            .replace("link: nats,", "link: nats-2,")
            + "  - { at: 20s, target: broker, node: leader, action: kill, restart_after: 5s }\n";
        let plan = parse(Path::new("n.yaml"), &cluster).unwrap();
        assert_eq!(
            plan.destination.link_names(),
            ["nats-1", "nats-2", "nats-3"]
        );
        assert!(matches!(
            plan.faults[1].what,
            FaultAction::Broker {
                node: BrokerNode::Leader,
                ..
            }
        ));
        let e = err(&cluster.replace("node: leader", "node: 4"));
        assert!(e.contains("node number 1..=3"), "{e}");
        let e = err(&text.replace("kind: nats }", "kind: mqtt, nodes: 3 }"));
        assert!(e.contains("only `nats` has nodes"), "{e}");
        let e = err(&text.replace("kind: nats }", "kind: kafka, runtime: embedded }"));
        assert!(e.contains("no embedded kafka broker"), "{e}");
    }

    #[test]
    fn kafka_broker_links_and_external_destinations() {
        let kafka = "name: k\ndestination: { kind: kafka }\nworkload: { rate: 10/s, duration: 1m }\nfaults:\n  - { at: 10s, link: kafka-111, fault: refuse, for: 5s }\n";
        assert!(parse(Path::new("k.yaml"), kafka).is_ok());
        let e = err(&kafka.replace("kafka-111", "kafka-x"));
        assert!(e.contains("kafka-<node id>"), "{e}");
        let e = err(&kafka
            .replace("kind: kafka", "kind: mqtt")
            .replace("kafka-111", "mqtt-1"));
        assert!(
            e.contains("no link named `mqtt-1`") && !e.contains("node id"),
            "{e}"
        );

        let ext = "name: x\ndestination: { kind: nats, runtime: external, servers: [a:4222, b:4222], create: true, credentials: { username_env: NATS_USER, password_env: NATS_PASSWORD } }\nworkload: { rate: 10/s, duration: 1m }\n";
        let plan = parse(Path::new("x.yaml"), ext).unwrap();
        let e = plan.destination.external.as_ref().unwrap();
        assert_eq!(plan.destination.nodes, 2);
        assert_eq!(plan.destination.link_names(), ["nats-1", "nats-2"]);
        assert!(e.create && !e.keep);
        assert_eq!(e.credentials.password_env.as_deref(), Some("NATS_PASSWORD"));
        let servers = "servers: [a:4222, b:4222]";
        for (text, says) in [
            (
                ext.replace(&format!("{servers}, "), ""),
                "needs the broker address",
            ),
            (ext.replace("a:4222", "a"), "is not host:port"),
            (ext.replace(servers, "address: a:4222"), "takes `servers`"),
            (
                ext.replace(", password_env: NATS_PASSWORD", ""),
                "go together",
            ),
            (
                ext.replace("NATS_USER", "s3cret!"),
                "is not an environment variable name",
            ),
        ] {
            let e = err(&text);
            assert!(e.contains(says), "{says}: {e}");
        }
        let e = err(
            "name: m\ndestination: { kind: mqtt, address: a:1883 }\nworkload: { rate: 10/s, duration: 1m }\n",
        );
        assert!(e.contains("goes with `runtime: external`"), "{e}");
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
}
