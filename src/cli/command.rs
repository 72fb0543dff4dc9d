//! The `drill` command line: its flags (`run`, `selftest`, `diff`, `init`, `check`, `schema`,
//! `engine`, `proxy`, `bench`) and the dispatch to each command's body.
//!
//! Exit codes (docs/src/design.md#6-interfaces): 0 every expectation held, 1 an expectation
//! failed, 2 invalid input (scenario, flags), 3 infrastructure failure (a broker or the engine
//! could not start).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::dest::Runtime;
use crate::engine;
use crate::proxy::Proxy;

#[derive(Parser)]
#[command(
    name = "drill",
    version = env!("DRILL_BUILD"),
    about = "Proves what a store-and-forward pipeline promises."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one or more drills and write their reports.
    Run {
        /// Scenario files (YAML), or folders of them.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only scenarios with one of these tags (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// Where reports go: DIR/<scenario name>/report.{md,json}.
        #[arg(long, default_value = "reports")]
        out: PathBuf,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Override the scenario's broker runtime.
        #[arg(long, value_enum)]
        runtime: Option<Runtime>,
        /// Run only shard K of N (e.g. 2/3): a stable split of the selected drills, balanced by
        /// their planned length (`drill list --shards N` shows it), for CI runners in parallel.
        #[arg(long, value_name = "K/N")]
        shard: Option<super::shard::Shard>,
    },
    /// List the drills with their planned length and, with --shards N, the shard each falls
    /// in (to feed a CI matrix).
    List {
        /// Scenario files or folders (default: scenarios/).
        #[arg(default_value = "scenarios")]
        files: Vec<PathBuf>,
        /// Only scenarios with one of these tags (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// Split them into this many shards.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
        shards: u16,
        /// JSON instead of a table: [{name, file, tags, plays_s, shard}], then each shard's total.
        #[arg(long)]
        json: bool,
    },
    /// Put the reports of drills run apart (`drill run --shard K/N` on several runners) back
    /// together: one summary, one junit.xml, an index report.md; exit code the worst drill's,
    /// 3 when a shard or a drill's report is missing.
    Merge {
        /// The output folders of the runs to merge (each a `drill run --out`).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where the merged run goes (each drill's folder, summary.md, report.md, junit.xml).
        #[arg(long, default_value = "reports/merged")]
        out: PathBuf,
    },
    /// Run every test-only mutant of the built-in engine against the catalogue and print
    /// mutant × drill → caught / missed (builds with the `mutants` feature only).
    Selftest {
        /// Scenario files or folders (default: scenarios/).
        #[arg(default_value = "scenarios")]
        files: Vec<PathBuf>,
        /// Only scenarios with one of these tags (repeatable), e.g. --tag ci.
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// Where results go: DIR/selftest/{selftest.md,selftest.json} and each drill's report.
        #[arg(long, default_value = "reports")]
        out: PathBuf,
        /// Drills run side by side (each with its own brokers and ports).
        #[arg(long, default_value_t = 3)]
        jobs: usize,
        /// Run every cell; by default a mutant's row stops at its first catch.
        #[arg(long)]
        full: bool,
        /// Only this mutant (repeatable).
        #[arg(long = "mutant")]
        mutants: Vec<String>,
        /// Only the correct engine (the false-alarm check; any build).
        #[arg(long, conflicts_with = "mutants")]
        no_mutants: bool,
        /// Override every scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Only shard K of N of the mutant × drill cells (e.g. 2/3); `drill merge` puts the
        /// shards' matrices back together and says which mutants no shard caught.
        #[arg(long, value_name = "K/N")]
        shard: Option<super::shard::Shard>,
    },
    /// Compare two runs' reports (a pull request's against main's): verdict, lost, duplicates
    /// beyond the promise, reordered, recovery and drain per fault, peak delivery, with the change.
    Diff(super::diff::Flags),
    /// Run generated fault timelines over a scenario (its faults replaced) until one fails,
    /// save it as failing-N.yaml, shrink it to minimal-N.yaml, and write explore.md.
    Explore(super::explore::Flags),
    /// Write a commented starter drill for your own engine (a half-open link, a SIGKILL
    /// mid-outage, a refused link), drills/README.md and with --ci the GitHub workflow. Without
    /// flags on a terminal it asks.
    Init(super::init::Flags),
    /// Validate scenario files (or folders of them) without starting anything.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the scenario file's JSON Schema (for editors).
    Schema,
    /// Run the built-in store-and-forward engine, or manage its Failed messages.
    Engine {
        /// The engine's config file (engine.yaml).
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(subcommand)]
        action: Option<EngineAction>,
    },
    /// Measure: `drill bench proxy` prints a healed link's cost against direct and haproxy.
    Bench {
        #[arg(value_enum)]
        what: BenchTarget,
        /// Bytes per bulk stream.
        #[arg(long, default_value_t = 2 * 1024 * 1024 * 1024)]
        bytes: u64,
        /// 1-byte round trips per path.
        #[arg(long, default_value_t = 20_000)]
        pings: usize,
        /// Bulk runs per path (the median is shown).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Records per run on the Kafka produce path (`proxy`; needs tansu).
        #[arg(long, default_value_t = 200_000)]
        kafka_records: u64,
    },
    /// Run fault-proxy links standalone with an HTTP control API.
    Proxy(ProxyFlags),
    /// `drill proxy` that also runs one engine on this host for a drill on another
    /// (`system: { agent: URL, command: … }`): start, SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
    /// power cut and full disk on its data directory, under a lease the drill renews.
    Agent {
        #[command(flatten)]
        proxy: ProxyFlags,
        /// Where each drill's engine gets its folder (work/, engine-data/, engine.log).
        #[arg(long, default_value = "drill-agent")]
        work: PathBuf,
    },
}

/// What `drill proxy` and `drill agent` are given.
#[derive(clap::Args)]
struct ProxyFlags {
    /// NAME=LISTEN_ADDR,UPSTREAM_ADDR (repeatable), e.g. mqtt=127.0.0.1:21883,127.0.0.1:1883.
    /// NAME=udp:LISTEN_ADDR,UPSTREAM_ADDR makes a datagram (UDP) link, e.g.
    /// syslog=udp:127.0.0.1:2514,127.0.0.1:514: it knows refuse, swallow, delay, loss,
    /// blackhole and heal. TCP links can also be created later through the Toxiproxy-shaped
    /// `POST /proxies`.
    #[arg(long = "link")]
    links: Vec<String>,
    /// NAME=LISTEN_ADDR,UPSTREAM_ADDR (repeatable): a Kafka-aware link in front of a Kafka
    /// bootstrap broker. It rewrites the broker addresses in Metadata, FindCoordinator and
    /// DescribeCluster answers so every broker is reached through a link of its own,
    /// NAME-<node id>; a fault on NAME is in force on all of them. It also drops the trailing
    /// tagged fields of ApiVersions answers, which librdkafka 2.0 and older cannot read.
    #[arg(long = "kafka-link")]
    kafka_links: Vec<String>,
    /// Where the control API listens.
    #[arg(long, default_value = "127.0.0.1:8474")]
    api: SocketAddr,
    /// Bearer token every API request must carry (or DRILL_TOKEN); required when --api is
    /// not a loopback address.
    #[arg(long)]
    token: Option<String>,
    /// Forward healed links through drill's own buffers instead of zero-copy (splice):
    /// what `drill bench proxy` compares the zero-copy path with.
    #[arg(long)]
    copy_only: bool,
}

#[derive(Subcommand)]
enum EngineAction {
    /// Records set aside after their last counted refusal.
    Failed {
        #[command(subcommand)]
        what: FailedAction,
    },
}

#[derive(Subcommand)]
enum FailedAction {
    /// List them, with the destination's error text (asks the running engine).
    List {
        #[arg(long)]
        config: PathBuf,
    },
    /// Put them back on their output's queue with the same write key.
    Replay {
        #[arg(long)]
        config: PathBuf,
        /// Only this write key.
        #[arg(long)]
        key: Option<String>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BenchTarget {
    /// A healed link vs direct vs haproxy.
    Proxy,
    /// Durable ingest vs raw write + fdatasync.
    Engine,
}

use super::{INFRASTRUCTURE, INVALID, PASS};

/// Parses the command line, runs the command, and returns its exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { INVALID } else { PASS });
        }
    };
    // `drill proxy` runs on one thread, like haproxy: a wakeup never crosses threads, which
    // keeps the latency a link adds low (measured by `drill bench proxy`).
    let runtime = match &cli.command {
        Command::Proxy(_) | Command::Agent { .. } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("drill: cannot start the async runtime: {e}");
            return ExitCode::from(INFRASTRUCTURE);
        }
    };
    ExitCode::from(runtime.block_on(dispatch(cli.command)))
}

/// `drill explore`, which runs on a blocking thread, until it ends or a signal comes; then it
/// exits at once: each `drill run` child gets SIGTERM as its parent-death signal and heals and
/// cleans up as on Ctrl-C, and what explore saved (failing-N.yaml, explore.json) is on disk.
async fn explore(flags: super::explore::Flags, cancel: CancellationToken) -> u8 {
    let work = tokio::task::spawn_blocking(move || super::explore::run(flags));
    tokio::select! {
        code = work => code.unwrap_or(super::INFRASTRUCTURE),
        () = cancel.cancelled() => {
            eprintln!("drill explore: interrupted; its drills stop with it and clean up, failing-N.yaml and explore.json stay as written");
            std::process::exit(i32::from(super::INFRASTRUCTURE));
        }
    }
}

/// Cancels `token` on SIGINT or SIGTERM, so every child is stopped before drill exits.
fn cancel_on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        token.cancel();
    });
}

async fn dispatch(command: Command) -> u8 {
    let cancel = CancellationToken::new();
    cancel_on_signals(cancel.clone());
    match command {
        Command::Run {
            files,
            tags,
            out,
            seed,
            runtime,
            shard,
        } => {
            let flags = super::run::Flags {
                paths: files,
                out,
                seed,
                runtime,
                tags,
                shard,
            };
            super::run::run(flags, cancel).await
        }
        Command::Merge { dirs, out } => super::merge::merge(&dirs, &out),
        Command::List {
            files,
            tags,
            shards,
            json,
        } => super::run::list(&files, &tags, usize::from(shards), json),
        Command::Selftest {
            files,
            tags,
            out,
            jobs,
            full,
            mutants,
            no_mutants,
            seed,
            shard,
        } => {
            let flags = super::selftest::Flags {
                paths: files,
                tags,
                out,
                jobs,
                full,
                mutants,
                no_mutants,
                seed,
                shard,
            };
            super::selftest::run(flags, cancel).await
        }
        Command::Diff(flags) => super::diff::run(flags),
        Command::Explore(flags) => explore(flags, cancel).await,
        Command::Init(flags) => super::init::init(flags),
        Command::Check { files } => super::check::check(&files),
        Command::Schema => super::check::schema(),
        Command::Engine {
            config,
            action: None,
        } => run_engine(config, cancel).await,
        Command::Engine {
            action: Some(EngineAction::Failed { what }),
            ..
        } => failed(what).await,
        Command::Proxy(flags) => proxy_with_token(flags, None, cancel).await,
        Command::Agent { proxy, work } => {
            match crate::agent::Agent::new(work, tokio::runtime::Handle::current()) {
                Ok(agent) => proxy_with_token(proxy, Some(agent), cancel).await,
                Err(e) => {
                    eprintln!("{e}");
                    INFRASTRUCTURE
                }
            }
        }
        Command::Bench {
            what,
            bytes,
            pings,
            runs,
            kafka_records,
        } => {
            let options = crate::bench::Options {
                bytes,
                pings: pings.max(10),
                runs: runs.max(1),
                kafka_records,
            };
            bench(what, options).await
        }
    }
}

/// `drill engine --config FILE`: the built-in engine with this build's destination kinds.
async fn run_engine(config: Option<PathBuf>, cancel: CancellationToken) -> u8 {
    let Some(config) = config else {
        eprintln!("drill engine: give --config FILE (the engine's engine.yaml)");
        return INVALID;
    };
    let config = match engine::EngineConfig::load(&config, &crate::dest::SINKS) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drill engine: {e}");
            return INVALID;
        }
    };
    match engine::run(config, &crate::dest::SINKS, cancel).await {
        Ok(()) => PASS,
        Err(e) => {
            eprintln!("drill engine: {e}");
            INFRASTRUCTURE
        }
    }
}

/// `drill bench proxy|engine`: prints the table of ratios it measured.
async fn bench(what: BenchTarget, options: crate::bench::Options) -> u8 {
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("drill bench: cannot find my own executable");
        return INFRASTRUCTURE;
    };
    let measured = tokio::task::spawn_blocking(move || match what {
        BenchTarget::Proxy => crate::bench::proxy(&exe, options),
        BenchTarget::Engine => {
            let dir = std::env::current_dir().unwrap_or_else(|_| std::env::temp_dir());
            let options = crate::bench::EngineOptions::from_env();
            crate::bench::engine(&exe, &dir, options)
        }
    })
    .await;
    match measured {
        Ok(Ok(table)) => {
            println!("{table}");
            PASS
        }
        Ok(Err(e)) => {
            eprintln!("drill bench: {e}");
            INFRASTRUCTURE
        }
        Err(e) => {
            eprintln!("drill bench: {e}");
            INFRASTRUCTURE
        }
    }
}

/// `drill engine failed list|replay`: asks the running engine (its address is in its config).
async fn failed(what: FailedAction) -> u8 {
    let (config, replay_key, replay) = match what {
        FailedAction::List { config } => (config, None, false),
        FailedAction::Replay { config, key } => (config, key, true),
    };
    let config = match engine::EngineConfig::load(&config, &crate::dest::SINKS) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drill engine failed: {e}");
            return INVALID;
        }
    };
    let http = reqwest::Client::new();
    let base = format!("http://{}", config.listen);
    // An engine bound beyond loopback wants its token (DRILL_TOKEN) on every request.
    let bearer = std::env::var("DRILL_TOKEN").unwrap_or_default();
    let answer = if replay {
        let body = serde_json::json!({ "key": replay_key });
        http.post(format!("{base}/failed/replay"))
            .bearer_auth(&bearer)
            .json(&body)
            .send()
            .await
    } else {
        http.get(format!("{base}/failed"))
            .bearer_auth(&bearer)
            .send()
            .await
    };
    let value: serde_json::Value = match answer {
        Ok(a) => match a.json().await {
            Ok(v) => v,
            Err(e) => {
                eprintln!("drill engine failed: unreadable answer from {base}: {e}");
                return INFRASTRUCTURE;
            }
        },
        Err(e) => {
            eprintln!(
                "drill engine failed: the engine does not answer on {base} ({e}); is it running?"
            );
            return INFRASTRUCTURE;
        }
    };
    if replay {
        let keys = value["replayed"].as_array().cloned().unwrap_or_default();
        println!("replayed {} record(s), same write keys:", keys.len());
        for k in keys {
            println!("  {}", k.as_str().unwrap_or_default());
        }
    } else {
        let list = value.as_array().cloned().unwrap_or_default();
        println!("{} failed message(s)", list.len());
        for f in list {
            println!(
                "  {}  output {}  {} refusals  {}",
                f["key"].as_str().unwrap_or_default(),
                f["output"].as_str().unwrap_or_default(),
                f["refusals"],
                f["error"].as_str().unwrap_or_default()
            );
        }
    }
    PASS
}

/// One `--link` / `--kafka-link` value: `NAME=LISTEN,UPSTREAM`, or `NAME=udp:LISTEN,UPSTREAM`
/// for a datagram link. `(name, datagrams, listen, upstream)`.
fn link_spec(spec: &str) -> Option<(String, bool, SocketAddr, SocketAddr)> {
    let (name, addrs) = spec.split_once('=')?;
    let (datagrams, addrs) = match addrs.strip_prefix("udp:") {
        Some(rest) => (true, rest),
        None => (false, addrs),
    };
    let (listen, upstream) = addrs.split_once(',')?;
    Some((
        name.to_string(),
        datagrams,
        listen.parse().ok()?,
        upstream.parse().ok()?,
    ))
}

/// Starts every link the command line names, saying where each listens; `Err` is the exit code.
async fn start_links(proxy: &Proxy, specs: &[(String, bool)]) -> Result<(), u8> {
    for (spec, kafka_aware) in specs {
        let parsed = link_spec(spec).filter(|(_, datagrams, ..)| !(*kafka_aware && *datagrams));
        let Some((name, datagrams, listen, upstream)) = parsed else {
            eprintln!(
                "drill proxy: --{}link {spec}: expected NAME=LISTEN_ADDR,UPSTREAM_ADDR, e.g. mqtt=127.0.0.1:21883,127.0.0.1:1883{}",
                if *kafka_aware { "kafka-" } else { "" },
                if *kafka_aware {
                    ""
                } else {
                    " (NAME=udp:LISTEN_ADDR,UPSTREAM_ADDR for UDP)"
                }
            );
            return Err(INVALID);
        };
        let started = if *kafka_aware {
            proxy.start_kafka_link(&name, listen, upstream).await
        } else if datagrams {
            proxy.start_udp_link(&name, listen, upstream).await
        } else {
            proxy.start_link(&name, listen, upstream).await
        };
        match started {
            Ok(link) => println!(
                "link {name}: {}{} -> {upstream}",
                if datagrams { "udp " } else { "" },
                link.listen_addr()
            ),
            Err(e) => {
                eprintln!("drill proxy: {e}");
                return Err(INFRASTRUCTURE);
            }
        }
    }
    Ok(())
}

/// `drill proxy`: the API's token checked first (a token is required off loopback).
/// `drill proxy`, or with `agent` `drill agent`: the token checked, the links started.
async fn proxy_with_token(
    flags: ProxyFlags,
    agent: Option<crate::agent::Agent>,
    cancel: CancellationToken,
) -> u8 {
    crate::proxy::zero_copy(!flags.copy_only);
    let specs = flags
        .links
        .into_iter()
        .map(|l| (l, false))
        .chain(flags.kafka_links.into_iter().map(|l| (l, true)))
        .collect();
    match crate::control::token_for(flags.api, flags.token) {
        Ok(token) => proxy(specs, flags.api, token, agent, cancel).await,
        Err(e) => {
            eprintln!("drill proxy: {e}");
            INVALID
        }
    }
}

async fn proxy(
    specs: Vec<(String, bool)>,
    api: SocketAddr,
    token: Option<String>,
    agent: Option<crate::agent::Agent>,
    cancel: CancellationToken,
) -> u8 {
    let with_engine = agent.is_some();
    let proxy = Proxy::new(cancel.clone());
    if let Err(code) = start_links(&proxy, &specs).await {
        return code;
    }
    // The control plane gets its own thread and runtime: data flow on this one can never
    // delay a fault being applied or healed.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let control = {
        let (proxy, cancel) = (proxy.clone(), cancel.clone());
        std::thread::Builder::new()
            .name("drill-control".to_string())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // The agent's engine is started from this thread: it dies with it.
                    let (more, watcher) = match agent {
                        Some(agent) => (
                            Some(agent.clone().router()),
                            Some(tokio::spawn(agent.watch(cancel.clone()))),
                        ),
                        None => (None, None),
                    };
                    match crate::proxy::api::serve(proxy, api, token, more, cancel).await {
                        Ok((bound, handle)) => {
                            let _ = ready_tx.send(Ok(bound));
                            let _ = handle.await;
                            if let Some(w) = watcher {
                                let _ = w.await;
                            }
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })
    };
    let control = match control {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drill proxy: cannot start the control thread: {e}");
            return INFRASTRUCTURE;
        }
    };
    match ready_rx.await {
        Ok(Ok(bound)) => println!(
            "control API on http://{bound} (GET /links, PUT|DELETE /links/NAME/fault; Toxiproxy-shaped /proxies{})",
            if with_engine {
                "; the engine: PUT|GET|DELETE /engine, POST /engine/act, /engine/lease"
            } else {
                ""
            }
        ),
        Ok(Err(e)) => {
            eprintln!("drill proxy: cannot serve the control API on {api}: {e}");
            return INFRASTRUCTURE;
        }
        Err(_) => {
            eprintln!("drill proxy: the control thread stopped");
            return INFRASTRUCTURE;
        }
    }
    cancel.cancelled().await;
    let _ = tokio::task::spawn_blocking(move || control.join()).await;
    proxy.shutdown().await;
    PASS
}
