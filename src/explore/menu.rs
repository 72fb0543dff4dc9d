//! The base scenario explore starts from, and its [`Menu`]: every fault of drill's vocabulary
//! that `drill check` accepts on this scenario's links and targets. Nothing is decided here
//! about what a scenario allows: each choice is kept only when the real validator
//! ([`scenario::parse`]) takes it, and every timeline explore runs is the base's text with its
//! `faults:` (and the workload's `duration`) replaced, validated again ([`Base::plan`]).

use std::path::{Path, PathBuf};

use super::generate;
use super::timeline::{Choice, Menu, Timeline};
use crate::scenario::{self, Plan, ScenarioError};
use crate::units::Dur;

/// The base scenario: its text without `faults:`, and what that validates to.
#[derive(Debug, Clone)]
pub struct Base {
    pub path: PathBuf,
    /// The scenario's text with its `faults:` section taken out.
    text: String,
    pub plan: Plan,
    /// The broker runs in a container, where drill can kill and pause it: `runtime:
    /// container`, or `auto` where the caller found a container would be used
    /// ([`Base::broker_in_container`]).
    broker_container: bool,
}

/// Timelines the validator refuses are made again from the next stream, at most this often.
const REMAKES: u64 = 32;

impl Base {
    /// The scenario at `path`, its own faults removed: explore makes its own.
    pub fn load(path: &Path) -> Result<Base, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Base::from_text(path, &text)
    }

    /// As [`Base::load`], from the text of the file at `path`.
    pub fn from_text(path: &Path, text: &str) -> Result<Base, ScenarioError> {
        let text = without_block(text, "faults");
        let plan = scenario::parse(path, &text)?;
        // Every scenario explore writes names the base's folder itself (plan.dir).
        let text = without_block(&text, "scenario_dir");
        let broker_container = plan.destination.runtime == crate::dest::Runtime::Container;
        Ok(Base {
            path: path.to_path_buf(),
            text,
            plan,
            broker_container,
        })
    }

    /// Says whether the broker will run in a container (what `runtime: auto` comes to on this
    /// machine, which only the caller can find out): broker faults are offered only then.
    pub fn broker_in_container(mut self, yes: bool) -> Base {
        self.broker_container = yes;
        self
    }

    /// The scenario text of `timeline` for a file written in the folder `into`: the base's,
    /// with its faults and workload duration, and a `scenario_dir:` leading from `into` back
    /// to the base's folder (so `{scenario_dir}` and `system.files` templates still resolve).
    pub fn scenario(&self, timeline: &Timeline, menu: &Menu, into: &Path) -> String {
        let mut text = with_duration(&self.text, timeline.workload_ms);
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let back = relative(into, &self.plan.dir);
        if back != Path::new(".") {
            text.push_str(&format!(
                "scenario_dir: {}\n",
                serde_json::Value::from(back.display().to_string())
            ));
        }
        text.push_str(&timeline.yaml(menu));
        text
    }

    /// What `timeline` validates to, as `drill run` would read it.
    pub fn plan(&self, timeline: &Timeline, menu: &Menu) -> Result<Plan, ScenarioError> {
        let here = self.path.parent().unwrap_or(Path::new("."));
        scenario::parse(&self.path, &self.scenario(timeline, menu, here))
    }

    /// Every choice of drill's fault vocabulary that the validator takes on this scenario, one
    /// fault at a time.
    pub fn menu(&self) -> Menu {
        let workload_ms = self.plan.workload.duration.as_millis() as u64;
        let mut menu = Menu {
            choices: Vec::new(),
            workload_ms,
        };
        for choice in vocabulary(&self.plan, self.broker_container) {
            let one = Menu {
                choices: vec![choice.clone()],
                workload_ms,
            };
            let fault = super::timeline::Fault {
                at_ms: 1_000,
                choice: 0,
                len_ms: choice.length.map(|_| 2_000),
            };
            if self
                .plan(&Timeline::new(vec![fault], workload_ms), &one)
                .is_ok()
            {
                menu.choices.push(choice);
            }
        }
        menu
    }

    /// Timeline `i` of `seed`: the generator's, made again from the next stream while the
    /// validator refuses it (faults that may not overlap, a drain too short), at most
    /// [`REMAKES`] times; `None` when every remake was refused.
    pub fn timeline(&self, seed: u64, i: u64, menu: &Menu) -> Option<Timeline> {
        (0..REMAKES)
            .map(|k| generate::timeline(seed.wrapping_add(k.wrapping_mul(0x9E37_79B9)), i, menu))
            .find(|t| self.plan(t, menu).is_ok())
    }
}

/// drill's fault vocabulary for `plan`'s links and targets, before the validator prunes it;
/// broker faults only where drill can stop the broker (`broker_container`, or a cluster's
/// node as a process).
fn vocabulary(plan: &Plan, broker_container: bool) -> Vec<Choice> {
    let mut out = Vec::new();
    let mut add = |fields: String, length: Option<&'static str>, family: &str| {
        out.push(Choice {
            fields,
            length,
            family: family.to_string(),
        });
    };
    for link in plan.destination.link_names() {
        let l = format!("link: {link}");
        add(format!("{l}, fault: refuse"), Some("for"), "link refuse");
        add(format!("{l}, fault: reset"), Some("for"), "link reset");
        for d in ["downstream", "upstream", "both"] {
            add(
                format!("{l}, fault: swallow, direction: {d}"),
                Some("for"),
                "link swallow",
            );
        }
        add(format!("{l}, fault: hang"), Some("for"), "link hang");
        add(
            format!("{l}, fault: blackhole"),
            Some("for"),
            "link blackhole",
        );
        add(format!("{l}, fault: strand"), None, "link strand");
        // TLS links only (the validator drops them elsewhere): a certificate from a CA nobody
        // trusts, and the broker's own expired.
        add(
            format!("{l}, fault: bad_certificate"),
            Some("for"),
            "link bad_certificate",
        );
        add(
            format!("{l}, fault: bad_certificate, certificate: expired"),
            Some("for"),
            "link bad_certificate",
        );
        add(
            format!("{l}, fault: delay, direction: downstream, latency: 500ms"),
            Some("for"),
            "link delay",
        );
        add(
            format!("{l}, fault: loss, direction: upstream, loss: 0.3"),
            Some("for"),
            "link loss",
        );
    }
    for action in ["kill", "stop", "power_cut"] {
        add(
            format!("target: engine, action: {action}"),
            Some("restart_after"),
            &format!("engine {action}"),
        );
    }
    add(
        "target: engine, action: power_cut, torn: true".into(),
        Some("restart_after"),
        "engine power_cut",
    );
    add(
        "target: engine, action: fill_disk".into(),
        Some("for"),
        "engine fill_disk",
    );
    for (fields, family) in broker_faults(plan, broker_container) {
        add(fields, Some("restart_after"), &family);
    }
    add(
        "target: proxy, action: restart".into(),
        Some("down_for"),
        "proxy restart",
    );
    add(
        "target: destination, answer: 503".into(),
        Some("for"),
        "destination answer",
    );
    add(
        "target: destination, answer_after: 5s".into(),
        Some("for"),
        "destination answer",
    );
    // The link to a source the engine pulls from (a Kafka topic, an outbox table).
    if plan.kafka_source().is_some() || plan.outbox_source().is_some() {
        let l = format!("link: {}", crate::scenario::source::SOURCE_LINK);
        for (fault, family) in [
            ("refuse", "source link refuse"),
            ("reset", "source link reset"),
            ("hang", "source link hang"),
            ("swallow, direction: both", "source link swallow"),
        ] {
            add(format!("{l}, fault: {fault}"), Some("for"), family);
        }
    }
    // A file the engine tails (the validator drops them elsewhere).
    for action in ["rotate", "truncate", "delete"] {
        add(
            format!("target: source, action: {action}"),
            None,
            &format!("source {action}"),
        );
    }
    add(
        "target: source, action: stall".into(),
        Some("for"),
        "source stall",
    );
    out
}

/// The broker faults drill can carry out on `plan`'s broker, as (fields, family). They need a
/// broker drill can stop on its own: `drill check` takes them, and the run refuses them (exit 3)
/// unless the broker runs in a container (`broker_container`) — or, as processes, is a
/// cluster's node to kill (none paused). The embedded MQTT broker and an external one are no
/// such broker.
fn broker_faults(plan: &Plan, broker_container: bool) -> Vec<(String, String)> {
    let cluster = plan.destination.link_names().len() > 1
        && plan.destination.runtime != crate::dest::Runtime::External;
    ["kill", "crash", "pause"]
        .into_iter()
        .filter(|action| broker_container || (cluster && *action != "pause"))
        .map(|action| {
            (
                format!("target: broker, action: {action}"),
                format!("broker {action}"),
            )
        })
        .collect()
}

/// For a top-level line of a YAML document (not indented, no comment, no sequence item),
/// whether it starts the block of `key`; `None` for a line inside a block.
fn top_key(line: &str, key: &str) -> Option<bool> {
    let top = line
        .chars()
        .next()
        .is_some_and(|c| !c.is_whitespace() && c != '#' && c != '-');
    top.then(|| {
        line.strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
    })
}

/// `text` without the top-level block of `key` (its line and every line under it: indented,
/// blank, a comment or a sequence item).
fn without_block(text: &str, key: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for line in text.split_inclusive('\n') {
        if let Some(is_key) = top_key(line, key) {
            inside = is_key;
        }
        if !inside {
            out.push_str(line);
        }
    }
    out
}

/// The path from the folder `from` to the folder `to` (`..` steps, then down), both taken as
/// the file system has them; `to` itself when `from` cannot be resolved.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (Ok(from), Ok(to)) = (std::fs::canonicalize(from), std::fs::canonicalize(to)) else {
        return to.to_path_buf();
    };
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in from.components().skip(common) {
        out.push("..");
    }
    for c in to.components().skip(common) {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// `text` with the workload's `duration:` set to `ms`.
fn with_duration(text: &str, ms: u64) -> String {
    let duration = Dur(std::time::Duration::from_millis(ms)).to_string();
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    let mut done = false;
    let re = regex_lite::Regex::new(r#"(\bduration:\s*)("[^"]*"|'[^']*'|[^,}\s]+)"#)
        .expect("a valid pattern");
    for line in text.split_inclusive('\n') {
        if let Some(is_key) = top_key(line, "workload") {
            inside = is_key;
        }
        if inside && !done && re.is_match(line) {
            out.push_str(&re.replace(line, |c: &regex_lite::Captures| {
                format!("{}{duration}", &c[1])
            }));
            done = true;
        } else {
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "name: base
# a comment that stays
destination: { kind: mqtt, runtime: process, topic: drill/base }
workload: { rate: 50/s, duration: 20s, keys: 4 }
faults:
  - { at: 3s, link: mqtt, fault: swallow, for: 5s }
- { at: 9s, link: mqtt, fault: refuse, for: 2s }
expect: { lost: 0, duplicates: 0, ledger: closes }
drain_timeout: 60s
";

    fn base() -> Base {
        Base::from_text(Path::new("base.yaml"), BASE).unwrap()
    }

    #[test]
    fn a_scenario_written_elsewhere_leads_back_to_the_bases_folder() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("out/runs");
        std::fs::create_dir_all(&runs).unwrap();
        std::fs::write(dir.path().join("engine.tmpl"), "x").unwrap();
        let text = BASE.to_string() + "scenario_dir: .\n";
        let b = Base::from_text(&dir.path().join("base.yaml"), &text).unwrap();
        let t = Timeline::new(Vec::new(), 20_000);
        let m = b.menu();
        let written = b.scenario(&t, &m, &runs);
        assert!(written.contains("scenario_dir: \"../..\"\n"), "{written}");
        assert_eq!(written.matches("scenario_dir:").count(), 1, "{written}");
        let plan = scenario::parse(&runs.join("0.yaml"), &written).unwrap();
        assert_eq!(plan.dir, std::fs::canonicalize(dir.path()).unwrap());
        // Beside the base: nothing added.
        assert!(!b.scenario(&t, &m, dir.path()).contains("scenario_dir"));
    }

    #[test]
    fn the_base_keeps_everything_but_its_faults() {
        let b = base();
        assert!(b.plan.faults.is_empty());
        assert!(b.text.contains("# a comment that stays"));
        assert!(b.text.contains("expect: { lost: 0"));
        assert!(!b.text.contains("fault: "));
        assert!(with_duration(&b.text, 7_500).contains("duration: 7500ms, keys: 4"));
        let block = "workload:\n  rate: 50/s\n  duration: \"20s\"\nexpect: { drain_within: 9s }\n";
        assert_eq!(
            with_duration(block, 5_000),
            "workload:\n  rate: 50/s\n  duration: 5s\nexpect: { drain_within: 9s }\n"
        );
    }

    #[test]
    fn the_menu_is_what_the_validator_takes_on_the_scenario() {
        let b = base();
        let menu = b.menu();
        let families = menu.families();
        for f in [
            "link refuse",
            "link swallow",
            "link hang",
            "link strand",
            "engine kill",
            "proxy restart",
        ] {
            assert!(families.contains(&f), "{f} missing from {families:?}");
        }
        // A stream link carries no datagram loss, and drill hosts no MQTT broker's answers.
        assert!(!families.contains(&"link loss"), "{families:?}");
        assert!(
            !families.iter().any(|f| f.starts_with("source")),
            "{families:?}"
        );
        // An engine that tails a file takes the source faults.
        let tailing = BASE.replace(
            "workload:",
            "system: { ingest: { kind: file, path: app.log } }\nworkload:",
        );
        let b = Base::from_text(Path::new("base.yaml"), &tailing).unwrap();
        let with_source = b.menu().families().join(", ");
        for f in [
            "source rotate",
            "source truncate",
            "source delete",
            "source stall",
        ] {
            assert!(with_source.contains(f), "{f} missing from {with_source}");
        }
        assert!(
            !families.iter().any(|f| f.starts_with("source link")),
            "{families:?}"
        );
        // An engine that consumes a topic takes faults on its link to the source.
        let consuming = BASE.replace(
            "workload:",
            "system: { ingest: { kind: kafka } }\nworkload:",
        );
        let b = Base::from_text(Path::new("base.yaml"), &consuming).unwrap();
        let with_link = b.menu().families().join(", ");
        for f in [
            "source link refuse",
            "source link hang",
            "source link swallow",
        ] {
            assert!(with_link.contains(f), "{f} missing from {with_link}");
        }
        assert!(!families.contains(&"destination answer"), "{families:?}");
        assert!(!families.contains(&"link bad_certificate"), "{families:?}");
        assert_eq!(menu.workload_ms, 20_000);
        // A TLS link takes the certificate faults.
        let tls = BASE.replace("topic: drill/base }", "topic: drill/base, tls: {} }");
        let b = Base::from_text(Path::new("base.yaml"), &tls).unwrap();
        let choices: Vec<String> = b.menu().choices.into_iter().map(|c| c.fields).collect();
        assert!(
            choices.contains(&"link: mqtt, fault: bad_certificate, certificate: expired".into()),
            "{choices:?}"
        );
        // One broker as a process or embedded cannot be killed or paused by drill (the run
        // would exit 3); in a container it can.
        assert!(
            !families.iter().any(|f| f.starts_with("broker")),
            "{families:?}"
        );
        let embedded = BASE.replace("runtime: process", "runtime: auto");
        let b = Base::from_text(Path::new("base.yaml"), &embedded).unwrap();
        assert!(!b.menu().families().iter().any(|f| f.starts_with("broker")));
        let container = BASE.replace("runtime: process", "runtime: container");
        let b = Base::from_text(Path::new("base.yaml"), &container).unwrap();
        let families = b.menu().families().join(", ");
        let auto = BASE.replace("runtime: process", "runtime: auto");
        let b = Base::from_text(Path::new("base.yaml"), &auto).unwrap();
        let b = b.broker_in_container(true);
        assert_eq!(b.menu().families().join(", "), families);
        for f in ["broker kill", "broker crash", "broker pause"] {
            assert!(families.contains(f), "{f} missing from {families}");
        }
    }

    #[test]
    fn every_timeline_explore_runs_is_one_drill_check_accepts() {
        let b = base();
        let menu = b.menu();
        let mut first_try = 0;
        for i in 0..150 {
            let t = b
                .timeline(3, i, &menu)
                .expect("a valid timeline within the remakes");
            let plan = b.plan(&t, &menu).unwrap();
            assert_eq!(plan.faults.len(), t.faults.len());
            first_try += usize::from(t == generate::timeline(3, i, &menu));
        }
        eprintln!(
            "{} choices in {} families; {first_try} of 150 timelines valid as generated",
            menu.choices.len(),
            menu.families().len()
        );
        assert!(first_try >= 75, "{first_try} of 150 valid as generated");
    }
}
