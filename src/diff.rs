//! `drill diff BASE NEW`: what changed between two runs of the same drills — a pull request's
//! reports against main's — read from their `report.json` files.
//!
//! It reads only the fields the design makes a contract (`scenario`, `verdict`, `ledger`,
//! `recovery`: docs/src/design.md#6-interfaces) and `series`, never a rendered line. Per drill,
//! paired by scenario name: the verdict, lost, duplicates beyond the promise, reordered, the
//! recovery after each fault (heal → first delivery), the drain after it (heal → every record
//! accepted before the heal delivered) and the peak delivery rate, each with its change. Margins
//! (`--fail-on recovery+20%,drain+20%,duplicates+0`) turn a change beyond them into a regression;
//! without margins nothing is one. It never judges a drill again: the verdict is the run's own.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What can be compared, and which way is worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Metric {
    /// The run's verdict; pass → fail is worse.
    Verdict,
    Lost,
    /// Held records the engine still held when the drain ended (never delivered).
    Undelivered,
    /// Copies beyond what the promise allows.
    Duplicates,
    Reordered,
    /// Heal → first delivery, per fault (ms).
    Recovery,
    /// Heal → every record accepted before the heal delivered, per fault (ms).
    Drain,
    /// The most records first delivered in one second (records/s): the drain's pace.
    Throughput,
}

impl Metric {
    const ALL: [Metric; 8] = [
        Metric::Verdict,
        Metric::Lost,
        Metric::Undelivered,
        Metric::Duplicates,
        Metric::Reordered,
        Metric::Recovery,
        Metric::Drain,
        Metric::Throughput,
    ];

    /// The name `--fail-on` takes.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Verdict => "verdict",
            Metric::Lost => "lost",
            Metric::Undelivered => "undelivered",
            Metric::Duplicates => "duplicates",
            Metric::Reordered => "reordered",
            Metric::Recovery => "recovery",
            Metric::Drain => "drain",
            Metric::Throughput => "throughput",
        }
    }

    /// Whether a larger number is the worse one (throughput: a smaller one is).
    fn larger_is_worse(self) -> bool {
        self != Metric::Throughput
    }

    fn unit(self) -> &'static str {
        match self {
            Metric::Recovery | Metric::Drain => " ms",
            Metric::Throughput => "/s",
            _ => "",
        }
    }
}

/// How much worse a metric may get before it is a regression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Allowed {
    /// A share of the base value, in percent.
    Percent(f64),
    /// An amount in the metric's own unit (records, ms, records/s).
    Amount(f64),
    /// `verdict`: pass → fail.
    Any,
}

/// One `--fail-on` entry: `recovery+20%`, `duplicates+0`, `throughput-10%`, `verdict`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margin {
    pub metric: Metric,
    pub allowed: Allowed,
}

/// `--fail-on`'s value, comma-separated margins; the error says which entry and why.
pub fn parse_margins(spec: &str) -> Result<Vec<Margin>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_margin)
        .collect()
}

fn parse_margin(entry: &str) -> Result<Margin, String> {
    let names = || {
        Metric::ALL
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let split = entry.find(['+', '-']).unwrap_or(entry.len());
    let (name, rest) = entry.split_at(split);
    let metric = Metric::ALL
        .into_iter()
        .find(|m| m.name() == name)
        .ok_or_else(|| format!("`{entry}`: no metric `{name}`; give one of {}", names()))?;
    if metric == Metric::Verdict {
        return match rest {
            "" => Ok(Margin {
                metric,
                allowed: Allowed::Any,
            }),
            _ => Err(format!(
                "`{entry}`: `verdict` takes no margin (pass → fail is the regression)"
            )),
        };
    }
    let worse = if metric.larger_is_worse() { '+' } else { '-' };
    let Some(amount) = rest.strip_prefix(worse) else {
        return Err(format!(
            "`{entry}`: write `{name}{worse}N%` or `{name}{worse}N` ({} is worse when it {})",
            name,
            if worse == '+' { "grows" } else { "falls" }
        ));
    };
    let (number, percent) = match amount.strip_suffix('%') {
        Some(n) => (n, true),
        None => (amount, false),
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| {
            format!("`{entry}`: `{amount}` is not a margin (a number ≥ 0, `%` for a share)")
        })?;
    Ok(Margin {
        metric,
        allowed: if percent {
            Allowed::Percent(value)
        } else {
            Allowed::Amount(value)
        },
    })
}

/// The fields of `report.json` a diff reads.
#[derive(Debug, Clone, Deserialize)]
pub struct RunReport {
    pub scenario: String,
    pub verdict: String,
    pub ledger: RunLedger,
    #[serde(default)]
    pub recovery: Vec<RunRecovery>,
    #[serde(default)]
    pub series: Vec<RunSecond>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RunLedger {
    pub lost: u64,
    /// After the drain: what the engine still held (never delivered).
    #[serde(default)]
    pub waiting: u64,
    #[serde(default)]
    pub duplicates_beyond_promise: Option<u64>,
    pub duplicates: u64,
    pub reordered: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RunRecovery {
    pub fault: String,
    pub heal_ms: u64,
    pub first_delivery_ms: Option<u64>,
    pub drained_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RunSecond {
    #[serde(default)]
    pub delivered: u64,
}

/// The reports under `path`: a `report.json`, a drill's folder holding one, or a folder of
/// drill folders (`drill run --out DIR`), by scenario name.
pub fn load(path: &Path) -> Result<BTreeMap<String, RunReport>, String> {
    let files: Vec<PathBuf> = if path.is_file() {
        vec![path.to_path_buf()]
    } else if path.join("report.json").is_file() {
        vec![path.join("report.json")]
    } else if path.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| format!("{}: cannot list the folder: {e}", path.display()))?;
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path().join("report.json"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        found
    } else {
        return Err(format!(
            "{}: no such file or folder; give a report.json, a drill's report folder or a folder of them",
            path.display()
        ));
    };
    if files.is_empty() {
        return Err(format!(
            "{}: no report.json in this folder or in its folders (`drill run --out {}` writes them)",
            path.display(),
            path.display()
        ));
    }
    let mut reports = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("{}: cannot read: {e}", file.display()))?;
        let report: RunReport = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a drill report.json: {e}", file.display()))?;
        reports.insert(report.scenario.clone(), report);
    }
    Ok(reports)
}

/// One compared number of one drill.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub metric: Metric,
    /// What it is about: `recovery after link mqtt swallow both`.
    pub label: String,
    pub base: Option<f64>,
    pub new: Option<f64>,
    /// The margin it broke, as written (`recovery+20%`).
    pub regression: Option<String>,
}

impl Row {
    /// The change, as a person reads it: `=`, `+12.5 %`, `−3` (from zero), `new`, `gone`.
    pub fn change(&self) -> String {
        match (self.base, self.new) {
            (Some(b), Some(n)) if (b - n).abs() < f64::EPSILON => "=".into(),
            (Some(0.0), Some(n)) => format!("{n:+}"),
            (Some(b), Some(n)) => format!("{:+.1} %", (n - b) / b * 100.0),
            (None, Some(_)) => "new".into(),
            (Some(_), None) => "gone".into(),
            (None, None) => "".into(),
        }
    }

    fn value(&self, v: Option<f64>) -> String {
        match v {
            None => "—".into(),
            Some(v) if self.metric == Metric::Verdict => {
                if v == 0.0 { "pass" } else { "fail" }.into()
            }
            Some(v) => format!("{}{}", v.round(), self.metric.unit()),
        }
    }
}

/// One drill, present on both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct DrillDiff {
    pub name: String,
    pub rows: Vec<Row>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Diff {
    pub drills: Vec<DrillDiff>,
    /// Drills in BASE only, and in NEW only.
    pub only_base: Vec<String>,
    pub only_new: Vec<String>,
}

impl Diff {
    /// The rows beyond their margins, with their drill.
    pub fn regressions(&self) -> Vec<(&str, &Row)> {
        self.drills
            .iter()
            .flat_map(|d| d.rows.iter().map(move |r| (d.name.as_str(), r)))
            .filter(|(_, r)| r.regression.is_some())
            .collect()
    }
}

/// Compares every drill both sides ran, judging each row against `margins`.
pub fn compare(
    base: &BTreeMap<String, RunReport>,
    new: &BTreeMap<String, RunReport>,
    margins: &[Margin],
) -> Diff {
    let drills = base
        .iter()
        .filter_map(|(name, b)| {
            let n = new.get(name)?;
            let mut rows = rows(b, n);
            for row in &mut rows {
                row.regression = margins
                    .iter()
                    .find(|m| m.metric == row.metric && broke(row, m.allowed))
                    .map(written);
            }
            Some(DrillDiff {
                name: name.clone(),
                rows,
            })
        })
        .collect();
    Diff {
        drills,
        only_base: base
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect(),
        only_new: new
            .keys()
            .filter(|k| !base.contains_key(*k))
            .cloned()
            .collect(),
    }
}

/// The rows of one drill: the verdict and counts, then recovery and drain per fault (the
/// n-th fault of a description paired with the n-th), then the peak delivery rate.
fn rows(base: &RunReport, new: &RunReport) -> Vec<Row> {
    let row = |metric: Metric, label: &str, b: Option<f64>, n: Option<f64>| Row {
        metric,
        label: label.to_string(),
        base: b,
        new: n,
        regression: None,
    };
    let verdict = |r: &RunReport| Some(if r.verdict == "pass" { 0.0 } else { 1.0 });
    let beyond = |r: &RunReport| {
        r.ledger
            .duplicates_beyond_promise
            .unwrap_or(r.ledger.duplicates) as f64
    };
    let mut rows = vec![
        row(Metric::Verdict, "verdict", verdict(base), verdict(new)),
        row(
            Metric::Lost,
            "lost",
            Some(base.ledger.lost as f64),
            Some(new.ledger.lost as f64),
        ),
        row(
            Metric::Undelivered,
            "undelivered",
            Some(base.ledger.waiting as f64),
            Some(new.ledger.waiting as f64),
        ),
        row(
            Metric::Duplicates,
            "duplicates beyond the promise",
            Some(beyond(base)),
            Some(beyond(new)),
        ),
        row(
            Metric::Reordered,
            "reordered",
            Some(base.ledger.reordered as f64),
            Some(new.ledger.reordered as f64),
        ),
    ];
    for (label, b, n) in per_fault(&base.recovery, &new.recovery) {
        let since = |r: Option<&RunRecovery>, at: fn(&RunRecovery) -> Option<u64>| {
            r.and_then(|r| at(r).map(|t| t.saturating_sub(r.heal_ms) as f64))
        };
        rows.push(row(
            Metric::Recovery,
            &format!("recovery after {label}"),
            since(b, |r| r.first_delivery_ms),
            since(n, |r| r.first_delivery_ms),
        ));
        rows.push(row(
            Metric::Drain,
            &format!("drain after {label}"),
            since(b, |r| r.drained_ms),
            since(n, |r| r.drained_ms),
        ));
    }
    let peak = |r: &RunReport| r.series.iter().map(|s| s.delivered).max().map(|p| p as f64);
    rows.push(row(
        Metric::Throughput,
        "peak delivery (records in one second)",
        peak(base),
        peak(new),
    ));
    rows
}

/// The faults of both runs, paired by description and then by order among the same ones
/// (`link mqtt swallow both`, `link mqtt swallow both #2`). What a run found out about a fault,
/// in parentheses (`engine power cut (SIGKILL; 440 unsynced writes …)`), is not part of it.
fn per_fault<'a>(
    base: &'a [RunRecovery],
    new: &'a [RunRecovery],
) -> Vec<(String, Option<&'a RunRecovery>, Option<&'a RunRecovery>)> {
    fn numbered(rs: &[RunRecovery]) -> Vec<(String, &RunRecovery)> {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        rs.iter()
            .map(|r| {
                let fault = r.fault.split(" (").next().unwrap_or(&r.fault);
                let n = seen.entry(fault).or_default();
                *n += 1;
                let label = match *n {
                    1 => fault.to_string(),
                    n => format!("{fault} #{n}"),
                };
                (label, r)
            })
            .collect()
    }
    let (b, n) = (numbered(base), numbered(new));
    let mut out: Vec<_> = b
        .iter()
        .map(|(label, r)| {
            let other = n.iter().find(|(l, _)| l == label).map(|(_, r)| *r);
            (label.clone(), Some(*r), other)
        })
        .collect();
    out.extend(
        n.iter()
            .filter(|(l, _)| !b.iter().any(|(bl, _)| bl == l))
            .map(|(label, r)| (label.clone(), None, Some(*r))),
    );
    out
}

/// Whether `row` got worse by more than `allowed`. A number that was there and is gone (a
/// recovery that never came) is worse by any margin.
fn broke(row: &Row, allowed: Allowed) -> bool {
    let (b, n) = match (row.base, row.new) {
        (Some(b), Some(n)) => (b, n),
        (Some(_), None) => return true,
        _ => return false,
    };
    let worse_by = if row.metric.larger_is_worse() {
        n - b
    } else {
        b - n
    };
    match allowed {
        Allowed::Any => worse_by > 0.0,
        Allowed::Amount(a) => worse_by > a,
        Allowed::Percent(p) => worse_by > b.abs() * p / 100.0,
    }
}

/// A margin as `--fail-on` takes it.
fn written(m: &Margin) -> String {
    let sign = if m.metric.larger_is_worse() { '+' } else { '-' };
    match m.allowed {
        Allowed::Any => m.metric.name().to_string(),
        Allowed::Percent(p) => format!("{}{sign}{p}%", m.metric.name()),
        Allowed::Amount(a) => format!("{}{sign}{a}", m.metric.name()),
    }
}

/// The diff as a terminal table, one block per drill.
pub fn table(diff: &Diff) -> String {
    let mut out = String::new();
    for d in &diff.drills {
        let _ = writeln!(out, "{}", d.name);
        let width = d.rows.iter().map(|r| r.label.len()).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:width$}  {:>10}  {:>10}  {:>9}",
            "", "base", "new", "change"
        );
        for r in &d.rows {
            let flag = r
                .regression
                .as_ref()
                .map(|m| format!("  REGRESSION ({m})"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:width$}  {:>10}  {:>10}  {:>9}{flag}",
                r.label,
                r.value(r.base),
                r.value(r.new),
                r.change()
            );
        }
    }
    out.push_str(&one_side(diff));
    out.push_str(&summary(diff));
    out.push('\n');
    out
}

/// The diff as markdown (a pull request comment, a job summary).
pub fn markdown(diff: &Diff) -> String {
    let mut out = String::from("## drill diff\n\n");
    let _ = writeln!(out, "{}\n", summary(diff));
    for d in &diff.drills {
        let _ = writeln!(
            out,
            "### {}\n\n| | base | new | change |\n|---|---:|---:|---:|",
            d.name
        );
        for r in &d.rows {
            let flag = r
                .regression
                .as_ref()
                .map(|m| format!(" **regression** (`{m}`)"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {}{flag} |",
                r.label,
                r.value(r.base),
                r.value(r.new),
                r.change()
            );
        }
        out.push('\n');
    }
    out.push_str(&one_side(diff));
    out
}

fn one_side(diff: &Diff) -> String {
    let mut out = String::new();
    if !diff.only_base.is_empty() {
        let _ = writeln!(out, "only in base: {}", diff.only_base.join(", "));
    }
    if !diff.only_new.is_empty() {
        let _ = writeln!(out, "only in new: {}", diff.only_new.join(", "));
    }
    out
}

fn summary(diff: &Diff) -> String {
    match diff.regressions().len() {
        0 => format!(
            "{} drill(s) compared; no regression beyond the margins",
            diff.drills.len()
        ),
        n => format!(
            "{} drill(s) compared; {n} regression(s) beyond the margins: {}",
            diff.drills.len(),
            diff.regressions()
                .iter()
                .map(|(d, r)| format!("{d}: {}", r.label))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, verdict: &str, lost: u64, first: u64, drained: u64) -> RunReport {
        RunReport {
            scenario: name.into(),
            verdict: verdict.into(),
            ledger: RunLedger {
                lost,
                waiting: 0,
                duplicates_beyond_promise: Some(0),
                duplicates: 0,
                reordered: 0,
            },
            recovery: vec![RunRecovery {
                fault: "link mqtt strand".into(),
                heal_ms: 8000,
                first_delivery_ms: Some(8000 + first),
                drained_ms: Some(8000 + drained),
            }],
            series: vec![RunSecond { delivered: 100 }, RunSecond { delivered: 400 }],
        }
    }

    fn one(r: RunReport) -> BTreeMap<String, RunReport> {
        BTreeMap::from([(r.scenario.clone(), r)])
    }

    #[test]
    fn margins_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_margins("recovery+20%, duplicates+0,throughput-10%,verdict").unwrap(),
            vec![
                Margin {
                    metric: Metric::Recovery,
                    allowed: Allowed::Percent(20.0)
                },
                Margin {
                    metric: Metric::Duplicates,
                    allowed: Allowed::Amount(0.0)
                },
                Margin {
                    metric: Metric::Throughput,
                    allowed: Allowed::Percent(10.0)
                },
                Margin {
                    metric: Metric::Verdict,
                    allowed: Allowed::Any
                },
            ]
        );
        for (bad, says) in [
            ("recovry+20%", "no metric `recovry`"),
            ("recovery-20%", "recovery+N%"),
            ("throughput+5%", "throughput-N%"),
            ("drain+x", "not a margin"),
            ("verdict+1", "takes no margin"),
        ] {
            let e = parse_margins(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_slower_recovery_beyond_its_margin_is_a_regression_and_within_it_is_not() {
        let base = one(report("strand", "pass", 0, 1000, 2000));
        let new = one(report("strand", "pass", 0, 1300, 2100));
        let margins = parse_margins("recovery+20%,drain+20%").unwrap();
        let d = compare(&base, &new, &margins);
        let regressions = d.regressions();
        assert_eq!(regressions.len(), 1, "{d:#?}");
        assert_eq!(regressions[0].1.label, "recovery after link mqtt strand");
        assert_eq!(regressions[0].1.change(), "+30.0 %");
        assert_eq!(regressions[0].1.regression.as_deref(), Some("recovery+20%"));
        // Without margins, only a report.
        assert!(compare(&base, &new, &[]).regressions().is_empty());
        // A recovery that never came is worse by any margin.
        let mut never = report("strand", "fail", 0, 0, 0);
        never.recovery[0].first_delivery_ms = None;
        let d = compare(
            &base,
            &one(never),
            &parse_margins("recovery+1000%").unwrap(),
        );
        assert_eq!(d.regressions().len(), 1);
    }

    #[test]
    fn counts_and_verdicts_compare_by_amount() {
        let base = one(report("d", "pass", 0, 1000, 2000));
        let new = one(report("d", "fail", 2, 1000, 2000));
        let d = compare(&base, &new, &parse_margins("lost+0,verdict").unwrap());
        let labels: Vec<_> = d
            .regressions()
            .iter()
            .map(|(_, r)| r.label.clone())
            .collect();
        assert_eq!(labels, ["verdict", "lost"]);
        let text = table(&d);
        assert!(text.contains("pass") && text.contains("fail"), "{text}");
        assert!(text.contains("REGRESSION (lost+0)"), "{text}");
        let md = markdown(&d);
        assert!(
            md.contains("| lost | 0 | 2 | +2 **regression** (`lost+0`) |"),
            "{md}"
        );
    }

    #[test]
    fn faults_pair_by_what_they_are_not_by_what_the_run_found() {
        let mut base = report("d", "pass", 0, 500, 700);
        let mut new = report("d", "pass", 0, 900, 700);
        base.recovery[0].fault = "engine power cut (SIGKILL; 440 unsynced writes)".into();
        new.recovery[0].fault = "engine power cut (SIGKILL; 12 unsynced writes)".into();
        let d = compare(&one(base), &one(new), &[]);
        let row = d.drills[0]
            .rows
            .iter()
            .find(|r| r.metric == Metric::Recovery)
            .unwrap();
        assert_eq!(row.label, "recovery after engine power cut");
        assert_eq!((row.base, row.new), (Some(500.0), Some(900.0)));
    }

    #[test]
    fn drills_on_one_side_only_are_listed() {
        let mut base = one(report("a", "pass", 0, 1, 1));
        base.extend(one(report("b", "pass", 0, 1, 1)));
        let new = one(report("a", "pass", 0, 1, 1));
        let d = compare(&base, &new, &[]);
        assert_eq!(d.drills.len(), 1);
        assert_eq!(d.only_base, ["b"]);
        assert!(table(&d).contains("only in base: b"));
    }
}
