//! `drill init`: a commented starter drill for the user's own engine — the three faults that
//! find most store-and-forward mistakes (a half-open link, a SIGKILL mid-outage, a refused
//! window) — with `drills/README.md` saying how to run it and, with `--ci`, the GitHub
//! workflow. Without flags on a terminal it asks the few questions instead. What it writes is
//! loaded back with the scenario parser before it says done: it passes `drill check`.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use crate::dest::Kind;
use crate::scenario;

use super::{INFRASTRUCTURE, INVALID, PASS};

/// The workflow users copy (the same file `ci/github/drill.yml` the suite lints).
const WORKFLOW: &str = include_str!("../../ci/github/drill.yml");

/// What `drill init` was told.
#[derive(clap::Args)]
pub struct Flags {
    /// Your engine's command line, with placeholders: {ingest}, {link.<destination kind>}
    /// (e.g. {link.mqtt}), {topic}, {data_dir} (quoted as a shell would split it; run without
    /// a shell).
    #[arg(long)]
    pub engine: Option<String>,
    /// How drill hands records to the engine.
    #[arg(long, value_enum)]
    pub ingest: Option<Ingest>,
    /// Where the engine forwards to: a destination kind.
    #[arg(long, value_parser = kind_names())]
    pub destination: Option<String>,
    /// The drill's name (default: from the engine's program).
    #[arg(long)]
    pub name: Option<String>,
    /// The folder the drill goes in.
    #[arg(long, default_value = "drills")]
    pub out: PathBuf,
    /// The engine's account: an HTTP path on its ingest port answering JSON with `waiting`
    /// and `failed`, e.g. /stats.
    #[arg(long)]
    pub stats: Option<String>,
    /// The header, user property or field the engine puts each record's write key in.
    #[arg(long)]
    pub write_key: Option<String>,
    /// Also write .github/workflows/drill.yml.
    #[arg(long)]
    pub ci: bool,
    /// Overwrite files that exist.
    #[arg(long)]
    pub force: bool,
}

/// How drill hands records to the engine (`system.ingest.kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Ingest {
    Http,
    Mqtt,
    // As the scenario spells it (the help shows no comment for it).
    #[value(name = "tcp_lines", alias = "tcp-lines")]
    TcpLines,
}

/// Every destination kind, as `--destination` takes it.
fn kind_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Kind::ALL.iter().map(|k| k.name()))
}

/// `a|b|c` of every destination kind.
fn kinds_listed(sep: &str) -> String {
    Kind::ALL
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(sep)
}

/// Everything the files are made from, every question answered.
struct Answers {
    argv: Vec<String>,
    ingest: Ingest,
    destination: Kind,
    name: String,
    stats: Option<String>,
    write_key: Option<String>,
    ci: bool,
}

pub fn init(flags: Flags) -> u8 {
    let answers = match answers(&flags) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("drill init: {e}");
            return INVALID;
        }
    };
    let scenario_file = flags.out.join(format!("{}.yaml", answers.name));
    let mut files = vec![
        (
            scenario_file.clone(),
            scenario_text(&answers, &scenario_file),
        ),
        (
            flags.out.join("README.md"),
            readme_text(&answers, &flags.out),
        ),
    ];
    if answers.ci {
        files.push((
            PathBuf::from(".github/workflows/drill.yml"),
            WORKFLOW.to_string(),
        ));
    }
    if !flags.force
        && let Some((existing, _)) = files.iter().find(|(path, _)| path.exists())
    {
        eprintln!(
            "drill init: {} exists; nothing was written (--force overwrites)",
            existing.display()
        );
        return INVALID;
    }
    for (path, text) in &files {
        if let Err(e) = write(path, text) {
            eprintln!("drill init: {}: {e}", path.display());
            return INFRASTRUCTURE;
        }
        println!("wrote {}", path.display());
    }
    // What was written must load as `drill run` loads it; a failure here is drill's bug, or
    // an engine command whose placeholders drill does not know.
    match scenario::load(&scenario_file) {
        Ok(_) => {
            println!(
                "\nnext: drill run {}   (a drill takes about {} s)",
                scenario_file.display(),
                DURATION_S + 10
            );
            PASS
        }
        Err(e) => {
            eprintln!("drill init: the scenario written does not load:\n{e}");
            INVALID
        }
    }
}

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}

/// The flags, and on a terminal the questions for what they leave out.
fn answers(flags: &Flags) -> Result<Answers, String> {
    let missing = flags.engine.is_none() || flags.ingest.is_none() || flags.destination.is_none();
    let asking = missing && std::io::stdin().is_terminal();
    if missing && !asking {
        return Err(format!(
            "give --engine \"<command>\", --ingest http|mqtt|tcp_lines and --destination {} (or run it on a terminal to be asked)",
            kinds_listed("|")
        ));
    }
    let mut ask = Asker::new();
    let engine = match &flags.engine {
        Some(e) => e.clone(),
        None => ask.line(
            "Your engine's command; drill fills {ingest} (where it receives records), \
             {link.<destination kind>} (where it forwards), {topic}, {data_dir}\n\
             e.g. ./my-forwarder --listen {ingest} --broker {link.mqtt} --topic {topic} --spool {data_dir}",
            None,
        )?,
    };
    let argv = shlex::split(&engine)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| format!("--engine {engine:?}: not a command (unbalanced quotes?)"))?;
    let ingest = match flags.ingest {
        Some(i) => i,
        None => match ask
            .line(
                "How drill hands records to it: http (NDJSON POSTs), mqtt (publishes to its own listener), tcp_lines",
                Some("http"),
            )?
            .as_str()
        {
            "http" => Ingest::Http,
            "mqtt" => Ingest::Mqtt,
            "tcp_lines" | "tcp-lines" => Ingest::TcpLines,
            other => return Err(format!("ingest {other:?}: one of http, mqtt, tcp_lines")),
        },
    };
    let destination = match &flags.destination {
        Some(d) => d.clone(),
        None => ask.line(
            &format!("Where it forwards: {}", kinds_listed(", ")),
            Some("mqtt"),
        )?,
    };
    let destination = Kind::parse(&destination)
        .ok_or_else(|| format!("destination {destination:?}: one of {}", kinds_listed(", ")))?;
    let name = match &flags.name {
        Some(n) => n.clone(),
        None => name_from(&argv),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "--name {name:?}: letters, digits, '-', '_' and '.' only (it names the report folder)"
        ));
    }
    let link = format!("{{link.{}}}", destination.name());
    if !argv.iter().any(|a| a.contains("{ingest")) {
        eprintln!(
            "drill init: note: the command never says {{ingest}}: drill picks the ingest port, and the engine must listen there"
        );
    }
    if !argv.iter().any(|a| a.contains(&link)) {
        eprintln!(
            "drill init: note: the command never says {link}: an engine that reaches the broker some other way bypasses the fault proxy, and the drill says so"
        );
    }
    if flags.write_key.is_none() {
        eprintln!(
            "drill init: note: no --write-key: drill cannot tell a resend of a record from a second write, so every extra copy the engine delivers counts as a duplicate against its at_least_once promise (expect duplicates: 0). If the engine puts a write key on each record, say where: --write-key NAME, written as `write_key: {}`",
            (destination.entry().starter.write_key)("NAME")
        );
    }
    let ci = flags.ci
        || (asking && ask.yes("Write the GitHub workflow too (.github/workflows/drill.yml)?")?);
    Ok(Answers {
        argv,
        ingest,
        destination,
        name,
        stats: flags.stats.clone(),
        write_key: flags.write_key.clone(),
        ci,
    })
}

/// Questions on the terminal (stderr), answers from stdin.
struct Asker {
    stdin: std::io::StdinLock<'static>,
}

impl Asker {
    fn new() -> Asker {
        Asker {
            stdin: std::io::stdin().lock(),
        }
    }

    fn line(&mut self, question: &str, default: Option<&str>) -> Result<String, String> {
        let mut err = std::io::stderr();
        let shown = default.map(|d| format!(" [{d}]")).unwrap_or_default();
        let _ = write!(err, "{question}{shown}\n> ");
        let _ = err.flush();
        let mut answer = String::new();
        self.stdin
            .read_line(&mut answer)
            .map_err(|e| format!("reading the answer: {e}"))?;
        let answer = answer.trim();
        match (answer.is_empty(), default) {
            (false, _) => Ok(answer.to_string()),
            (true, Some(d)) => Ok(d.to_string()),
            (true, None) => Err("no answer; nothing was written".to_string()),
        }
    }

    fn yes(&mut self, question: &str) -> Result<bool, String> {
        let answer = self.line(question, Some("n"))?;
        Ok(matches!(answer.as_str(), "y" | "Y" | "yes"))
    }
}

/// A name from the engine's program (its script, after an interpreter): `my-forwarder`.
fn name_from(argv: &[String]) -> String {
    const RUNNERS: &[&str] = &[
        "python", "python3", "sh", "bash", "node", "java", "ruby", "perl", "env", "exec", "uv",
        "npx", "deno", "run", "-m", "-jar",
    ];
    let program = argv
        .iter()
        .find(|a| !RUNNERS.contains(&a.as_str()) && !a.starts_with('-'))
        .map(|a| {
            Path::new(a)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let name: String = program
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches('-').to_string();
    if name.is_empty() || name.contains('{') {
        "my-engine".to_string()
    } else {
        name
    }
}

/// The workload's length; the faults are placed inside it.
const DURATION_S: u64 = 60;

fn scenario_text(a: &Answers, file: &Path) -> String {
    let kind = a.destination.name();
    let starter = &a.destination.entry().starter;
    let link = format!("{{link.{kind}}}");
    let file = file.display();
    let argv = a
        .argv
        .iter()
        .map(|s| serde_json::to_string(s).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(", ");
    let (ingest, ready) = match a.ingest {
        Ingest::Http => (
            "{ kind: http, path: /ingest, batch: 50 }   # drill POSTs NDJSON, at most 50 records a body; a 2xx means held",
            "{ tcp: true, within: 20s }                 # or { http: /health } or { log: \"regex\" }",
        ),
        Ingest::Mqtt => (
            "{ kind: mqtt, topic: in/drill }            # drill publishes at QoS 1 to {ingest}; the PUBACK means held",
            "{ tcp: true, within: 20s }                 # or { log: \"regex\" } or { http: /health, port: api }",
        ),
        Ingest::TcpLines => (
            "{ kind: tcp_lines }                        # one line per record on one connection; no acknowledgement",
            "{ tcp: true, within: 20s }                 # or { log: \"regex\" } or { http: /health, port: api }",
        ),
    };
    let stats = match &a.stats {
        Some(path) => format!("  stats: {{ path: {path} }}"),
        None => "  # stats: { path: /stats }                # JSON with `waiting` and `failed`: without it, drill drains\n  #                                          # until arrivals stop for 5 s and counts the rest lost".to_string(),
    };
    let write_key = match &a.write_key {
        Some(name) => format!("  write_key: {}", (starter.write_key)(name)),
        None => format!(
            "  # write_key: {}   # where the engine puts a record's write key.\n  #   Without one drill cannot tell a resend from a second write: every extra copy\n  #   counts as a duplicate against at_least_once (expect duplicates: 0 below).",
            (starter.write_key)("write-key")
        ),
    };
    let name = &a.name;
    let topic = (starter.topic)(name)
        .map(|t| format!(", topic: {t}"))
        .unwrap_or_default();
    format!(
        r#"# A drill for {name}, written by `drill init`. Check it: drill check {file}
# Run it: drill run {file}  (exit 0: every promise kept; 1: one broken; 2: invalid;
# 3: drill could not set up). The report lands in reports/{name}/report.md.
name: {name}
about: >-
  {name} through the three faults that find most store-and-forward mistakes: a half-open
  link (requests vanish, nothing answers), the engine SIGKILLed in the middle of that outage and
  started again on the same data directory, then a refused link. Nothing it acknowledged may be
  lost; copies only within its promise; the ledger closes; delivery back soon after each heal.
tags: [ci]                                    # the workflow runs the drills tagged ci
seed: 1
# drill starts the broker itself: `runtime: auto` runs the {kind} broker as a local process
# when its binary is installed, in a container otherwise; `external` drives one you run.
destination: {{ kind: {kind}, runtime: auto{topic} }}
system:
  # Your engine, started by drill (argv, no shell). drill fills in:
  #   {{ingest}}       127.0.0.1:PORT where the engine must take records in
  #   {link:<13} the fault proxy in front of the broker: forward there, never to the broker
  #   {{topic}}        where drill reads the records back
  #   {{data_dir}}     the engine's own directory, kept across the restart after the kill
  #   {{work_dir}}, {{scenario_dir}}, {{port.NAME}}, {{run}}: see the book's scenario reference
  command: [{argv}]
  ingest: {ingest}
  ready: {ready}
{stats}
{write_key}
  promise: at_least_once                     # what the engine declares: at_most_once,
                                             # at_least_once, or exactly_once
workload: {{ rate: 50/s, duration: {DURATION_S}s, keys: 4 }}
faults:
  # 1. Half-open: the link swallows both ways. The engine must notice silence (a keepalive,
  #    an answer timeout) and hold what it acknowledged, not count it delivered.
  - {{ at: 10s, link: {kind}, fault: swallow, direction: both, for: 20s }}
  # 2. SIGKILL mid-outage, started again 3 s later on the same {{data_dir}}: what it
  #    acknowledged before must survive (a spool on disk, fsynced before the acknowledgement).
  - {{ at: 18s, target: engine, action: kill, restart_after: 3s }}
  # 3. Refused: connects fail at once. An outage, not the broker saying no: nothing may
  #    expire or be dropped for it.
  - {{ at: 40s, link: {kind}, fault: refuse, for: 10s }}
# lost: 0 — nothing acknowledged goes missing. duplicates: 0 — no copy beyond the promise.
# reordered: 0 — per key, in order (drop it if your engine does not promise order).
expect: {{ lost: 0, duplicates: 0, reordered: 0, ledger: closes, recovery_within: 10s }}
"#
    )
}

fn readme_text(a: &Answers, out: &Path) -> String {
    let file = out.join(format!("{}.yaml", a.name));
    let file = file.display();
    let name = &a.name;
    let workflow = if a.ci {
        "`.github/workflows/drill.yml` runs every drill tagged `ci` on each pull request and push to main: the job fails when a drill fails, the job summary shows the verdicts, and the reports are an artifact (`drill-reports`). It installs the drill release pinned at its top (`DRILL_VERSION`) prebuilt from PyPI; set `DRILL_GIT` there to drill's repository for the cached source-build fallback."
    } else {
        "`drill init --ci` writes `.github/workflows/drill.yml`: every drill tagged `ci` on each pull request, the verdicts in the job summary, the reports as an artifact."
    };
    format!(
        r#"# Drills

`{file}` drives **{name}** through a half-open link, a SIGKILL in the middle of that
outage, and a refused link, then reads every record back from the broker and closes the ledger:
`held = delivered + waiting + failed + lost`.

```sh
drill check {out}          # validate, start nothing
drill run {file}   # about {secs} s; exit 0 pass, 1 a promise broken, 2 invalid, 3 set-up failed
```

The verdict is the first line of `reports/{name}/report.md`; under it, every expectation with
what was measured, the ledger, and where each lost record was last seen. `timeline.svg` charts
deliveries against the faults.

To make the drill yours: give `stats` (then drill knows what still waits instead of counting
it lost), give `write_key` (then a resend of the same record is told apart from a second
write), and lengthen the faults to your real outages. CI: {workflow}
"#,
        out = out.display(),
        secs = DURATION_S + 10,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_program_after_its_interpreter() {
        let argv = |s: &str| shlex::split(s).unwrap();
        assert_eq!(
            name_from(&argv("python3 fixtures/forwarder.py --ingest {ingest}")),
            "forwarder"
        );
        assert_eq!(name_from(&argv("./My_Bridge --x")), "my-bridge");
        assert_eq!(name_from(&argv("{work_dir}/run")), "run");
        assert_eq!(name_from(&argv("sh -c 'exec x'")), "exec-x");
        assert_eq!(name_from(&argv("python3 -m")), "my-engine");
    }
}
