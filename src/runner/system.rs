//! Starting the system under test, forwarding to the rig's links: the built-in engine (its
//! `engine.yaml` made from the plan) or a user's engine (its placeholders given values:
//! ingest, links, ports, folders).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use super::provision::Rig;
use super::{Options, RunError, say};
use crate::engine::{DurText, EngineConfig, OutputConfig, RefusalConfig};
use crate::process::{free_port, free_ports};
use crate::proxy::Link;
use crate::scenario::{CommandSpec, Plan, RemoteSpec};
use crate::sut::command::{Placement, host_values};
use crate::sut::remote::{AgentAt, EngineOrder};
use crate::sut::{CommandEngine, EngineProcess, RemoteEngine, System};

/// Starts the system under test and waits until it is ready.
pub(super) async fn start_system(
    plan: &Plan,
    options: &Options,
    rig: &Rig,
    work: &Path,
    run_id: &str,
) -> Result<System, RunError> {
    let io = |source| RunError::Io {
        path: work.to_path_buf(),
        source,
    };
    let engine_port = free_port().map_err(io)?;
    let clock = match plan.needs_clock() && plan.agent.is_none() {
        true => Some(crate::clock::FakeClock::new(work).map_err(RunError::Clock)?),
        false => None,
    };
    let system = match (&plan.command, &plan.agent) {
        (Some(spec), Some(agent)) => {
            let engine = remote_engine(plan, spec, agent, rig, work, run_id).await?;
            System::Remote(Box::new(engine))
        }
        (Some(spec), None) => {
            let ingest = SocketAddr::from(([127, 0, 0, 1], engine_port));
            let at = Here {
                ingest,
                clock,
                run_id,
            };
            let engine = command_engine(plan, spec, options, rig, work, at).await?;
            System::Command(Box::new(engine))
        }
        (None, _) => {
            let config = builtin_config(plan, rig, work, engine_port);
            let engine =
                EngineProcess::start_under(&options.engine_exe, config, work, clock).await?;
            System::Builtin(Box::new(engine))
        }
    };
    say(&format!("  engine: {}", system.describe()));
    Ok(system)
}

/// `engine.yaml` for the built-in engine: one output to the destination through its link(s).
fn builtin_config(plan: &Plan, rig: &Rig, work: &Path, port: u16) -> EngineConfig {
    let e = &plan.engine;
    let d = &plan.destination;
    let engine_addr = match (around_the_proxy(), rig.running.addrs.first()) {
        (true, Some(broker)) => *broker,
        _ => rig.engine_addr(),
    };
    let mut output = OutputConfig {
        promise: e.promise,
        order: e.order,
        keepalive: DurText(e.keepalive),
        answer_timeout: DurText(e.answer_timeout),
        window: e.window.unwrap_or_else(|| d.imp.default_window()),
        refusals: Some(RefusalConfig {
            max: e.refusals.0,
            backoff: [DurText(e.refusals.1), DurText(e.refusals.2)],
        }),
        more_addresses: match around_the_proxy() {
            true => rig.running.addrs.iter().skip(1).copied().collect(),
            false => rig.links.iter().skip(1).map(Link::listen_addr).collect(),
        },
        credentials: d
            .external
            .as_ref()
            .map(|x| x.credentials.clone())
            .unwrap_or_default(),
        tls: rig.running.access.tls.clone(),
        ..OutputConfig::new(d.kind.name(), &d.link_name(), engine_addr, &d.topic)
    };
    d.imp.output_options(&mut output);
    EngineConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        data_dir: work.join("engine-data"),
        outputs: vec![output],
        disk: crate::engine::DiskLimits {
            segment_bytes: e
                .segment_bytes
                .unwrap_or(crate::engine::DiskLimits::default().segment_bytes),
            ..Default::default()
        },
        tail: e.tail.as_ref().map(|f| crate::engine::tail::TailConfig {
            path: work.join(crate::scenario::source::SOURCE_DIR).join(&f.name),
        }),
        outbox: e.outbox.as_ref().and_then(|o| {
            let link = rig.source_link.as_ref()?;
            Some(crate::engine::outbox::OutboxConfig {
                addr: link.listen_addr(),
                table: o.table.clone(),
            })
        }),
        consume: e.consume.as_ref().and_then(|k| {
            let link = rig.source_link.as_ref()?;
            Some(crate::engine::consume::ConsumeConfig {
                bootstrap: link.listen_addr().to_string(),
                topic: k.topic.clone(),
                group: k.group.clone(),
            })
        }),
    }
}

/// Test builds (feature `test-hooks`): `DRILL_TEST_ENGINE_AROUND_PROXY` set points drill's
/// engine at the broker itself instead of its links, an engine that goes around the proxy,
/// which every kind's drill must catch (`tests/kind_contract.rs`). Never in a release.
fn around_the_proxy() -> bool {
    cfg!(feature = "test-hooks") && std::env::var_os("DRILL_TEST_ENGINE_AROUND_PROXY").is_some()
}

/// What a user's engine on drill's host starts with beyond the plan.
struct Here<'a> {
    ingest: SocketAddr,
    clock: Option<crate::clock::FakeClock>,
    run_id: &'a str,
}

/// A user's engine: a free port for every `{port.NAME}`, every placeholder's value, started.
async fn command_engine(
    plan: &Plan,
    spec: &CommandSpec,
    options: &Options,
    rig: &Rig,
    work: &Path,
    here: Here<'_>,
) -> Result<CommandEngine, RunError> {
    let Here {
        ingest,
        clock,
        run_id,
    } = here;
    let io = |source| RunError::Io {
        path: work.to_path_buf(),
        source,
    };
    let data_dir = work.join("engine-data");
    std::fs::create_dir_all(&data_dir).map_err(io)?;
    let ports = free_ports(&spec.ports, HashSet::from([ingest.port()])).map_err(io)?;
    let mut values = drill_values(plan, rig, run_id);
    values.insert("scenario_dir".to_string(), plan.dir.display().to_string());
    values.extend(host_values(ingest, work, &data_dir, &ports));
    if let Some(f) = plan.file_source() {
        let live = work.join(crate::scenario::source::SOURCE_DIR).join(&f.name);
        values.insert("ingest.path".to_string(), live.display().to_string());
    }
    if let Some(k) = plan.kafka_source() {
        values.insert("ingest.topic".to_string(), k.topic.clone());
        values.insert("ingest.group".to_string(), k.group.clone());
    }
    if let (Some(o), Some(link)) = (plan.outbox_source(), &rig.source_link) {
        values.insert("ingest.table".to_string(), o.table.clone());
        values.insert(
            "ingest.dsn".to_string(),
            crate::source::OutboxSource::dsn(link.listen_addr()),
        );
    }
    let log_path = work.parent().unwrap_or(work).join("engine.log");
    let _ = std::fs::remove_file(&log_path);
    let engine = CommandEngine::start(
        spec,
        Placement {
            values: &values,
            ports: &ports,
            ingest,
            work_dir: work,
            data_dir: &data_dir,
            log_path,
            drill_exe: &options.engine_exe,
            clock,
        },
    )
    .await?;
    Ok(engine)
}

/// A user's engine on a `drill agent`'s host: the agent gives its own placeholders (ingest,
/// ports, folders there) their values, drill the rest (links, topic, run).
async fn remote_engine(
    plan: &Plan,
    spec: &CommandSpec,
    agent: &RemoteSpec,
    rig: &Rig,
    work: &Path,
    run_id: &str,
) -> Result<RemoteEngine, RunError> {
    // The agent gives the values of its own host; `{scenario_dir}` was refused.
    let values = drill_values(plan, rig, run_id);
    let order = EngineOrder {
        run: run_id.to_string(),
        argv: spec.argv.clone(),
        env: spec.env.clone(),
        files: spec.files.clone(),
        values,
        ports: spec.ports.iter().cloned().collect(),
        ready: spec.ready.clone(),
        ready_within_ms: spec.ready_within.as_millis() as u64,
        stop_grace_ms: spec.stop_grace.as_millis() as u64,
        power: plan.needs_powerfs(),
        lease_ms: crate::sut::remote::LEASE.as_millis() as u64,
    };
    let at = AgentAt {
        api: &agent.api,
        token: agent.token(),
        stats: spec.stats.as_ref(),
        log_path: work.parent().unwrap_or(work).join("engine.log"),
    };
    Ok(RemoteEngine::start(order, at).await?)
}

/// The values of the placeholders drill knows wherever the engine runs: `{topic}`, `{run}`,
/// `{link.NAME}` (and its `.host`, `.port`), and with TLS `{tls.*}`.
fn drill_values(plan: &Plan, rig: &Rig, run_id: &str) -> BTreeMap<String, String> {
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        values.insert(k.to_string(), v);
    };
    set("topic", plan.destination.topic.clone());
    set("run", run_id.to_string());
    let remote = rig
        .remote
        .iter()
        .map(|r| (r.name().to_string(), r.listen_addr()));
    for (name, a) in rig
        .links
        .iter()
        .chain(rig.source_link.as_ref())
        .map(|l| (l.name().to_string(), l.listen_addr()))
        .chain(remote)
    {
        set(&format!("link.{name}"), a.to_string());
        set(&format!("link.{name}.host"), a.ip().to_string());
        set(&format!("link.{name}.port"), a.port().to_string());
    }
    if let Some(tls) = &rig.running.access.tls {
        set("tls.ca_file", tls.ca_file.display().to_string());
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            set("tls.client_cert_file", cert.display().to_string());
            set("tls.client_key_file", key.display().to_string());
        }
    }
    values
}
