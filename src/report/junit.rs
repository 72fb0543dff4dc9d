//! JUnit XML for drill reports, for CI systems that read test results (GitHub Actions
//! annotations, GitLab, Jenkins).
//!
//! This module owns one mapping and nothing else: a scenario becomes a `<testsuite>`, each of
//! its expectations a `<testcase classname="drill.<scenario>">`, and an expectation that did not
//! hold a `<failure type="expectation">` naming what was expected and what was found. A verdict
//! that failed with no failing expectation (the verifier faulted, the drill was inconclusive)
//! still shows as failing, as a testcase named `verdict`; a scenario with no expectations gets
//! one passing `verdict` testcase so that no suite is empty. Counts (`tests`, `failures`) are
//! computed by the writer from the testcases, never supplied.
//!
//! It never judges: whether a case held and whether the verdict passed are decided by the
//! verdict (`report::judge`) and taken as given here, even where they disagree (a passing
//! verdict with a failing case is rendered as it is). It never touches the file system, the
//! clock or the exit code: [`render`] returns the document and the caller writes it.
//!
//! The XML is written by the `quick-junit` crate (nextest's JUnit writer), which escapes
//! attribute values and text and drops characters XML 1.0 cannot carry (control characters and
//! ANSI escapes).

use std::time::Duration;

use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};

/// The classname prefix of every testcase: `drill.<scenario>`.
const CLASSNAME_PREFIX: &str = "drill.";

/// The name of the testcase that stands for the verdict itself, when no expectation carries it.
const VERDICT_CASE: &str = "verdict";

/// One expectation of a scenario, as the verdict judged it.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The expectation's name, e.g. `lost == 0`; becomes the testcase name.
    pub name: String,
    /// What the scenario expected, as text (e.g. `0`).
    pub expected: String,
    /// What the drill found, as text (e.g. `17`).
    pub actual: String,
    /// Whether the expectation held.
    pub ok: bool,
}

/// One scenario's result: a `<testsuite>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    /// The scenario's name; becomes the suite name and, prefixed by `drill.`, the classname.
    pub name: String,
    /// The one-line verdict a person reads first (e.g. `FAIL: 17 records lost`).
    pub headline: String,
    /// Whether the verdict as a whole passed.
    pub verdict_pass: bool,
    /// How long the drill ran, in seconds; omitted from the XML if negative or not finite.
    pub time_s: f64,
    /// Where the human report (`report.md`) was written, if it was.
    pub report_md: Option<String>,
    /// The expectations, in the order the scenario declares them.
    pub cases: Vec<Case>,
    /// Notes from the verdict (why it is inconclusive, what the verifier reported, …).
    pub notes: Vec<String>,
}

/// Renders every suite into one `<testsuites name="drill">` document (XML declaration
/// included). Fails only if the XML writer fails, with its message.
pub fn render(suites: &[Suite]) -> Result<String, String> {
    let mut report = Report::new("drill");
    let mut total = Duration::ZERO;
    for suite in suites {
        let time = seconds(suite.time_s);
        if let Some(t) = time {
            total += t;
        }
        report.add_test_suite(test_suite(suite, time));
    }
    report.set_time(total);
    report
        .to_string()
        .map_err(|e| format!("cannot write JUnit XML: {e}"))
}

fn test_suite(suite: &Suite, time: Option<Duration>) -> TestSuite {
    let classname = format!("{CLASSNAME_PREFIX}{}", suite.name);
    let mut ts = TestSuite::new(suite.name.as_str());
    if let Some(t) = time {
        ts.set_time(t);
    }

    ts.add_property(Property::new("drill.headline", suite.headline.as_str()));
    ts.add_property(Property::new(
        "drill.verdict",
        if suite.verdict_pass { "pass" } else { "fail" },
    ));
    if let Some(path) = &suite.report_md {
        ts.add_property(Property::new("drill.report", path.as_str()));
    }
    ts.set_system_out(system_out(suite));

    for case in &suite.cases {
        let status = if case.ok {
            TestCaseStatus::success()
        } else {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(one_line(&format!(
                "expected {}, got {}",
                case.expected, case.actual
            )))
            .set_type("expectation")
            .set_description(format!(
                "{}\n{}: expected {}, actual {}{}",
                suite.headline,
                case.name,
                case.expected,
                case.actual,
                report_line(suite)
            ));
            s
        };
        let mut tc = TestCase::new(case.name.as_str(), status);
        tc.set_classname(classname.as_str());
        ts.add_test_case(tc);
    }

    let any_case_failed = suite.cases.iter().any(|c| !c.ok);
    if !suite.verdict_pass && !any_case_failed {
        // The verdict failed but no expectation says why: the failure must still show.
        let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
        let mut text = suite.headline.clone();
        for note in &suite.notes {
            text.push('\n');
            text.push_str(note);
        }
        text.push_str(&report_line(suite));
        s.set_message(one_line(&suite.headline))
            .set_type("verdict")
            .set_description(text);
        let mut tc = TestCase::new(VERDICT_CASE, s);
        tc.set_classname(classname.as_str());
        ts.add_test_case(tc);
    } else if suite.cases.is_empty() {
        // Passing verdict, nothing to list: one passing testcase so the suite is not empty.
        let mut tc = TestCase::new(VERDICT_CASE, TestCaseStatus::success());
        tc.set_classname(classname.as_str());
        ts.add_test_case(tc);
    }
    ts
}

/// The suite's `<system-out>`: headline, report path, notes, one per line.
fn system_out(suite: &Suite) -> String {
    let mut out = suite.headline.clone();
    out.push_str(&report_line(suite));
    for note in &suite.notes {
        out.push_str("\nnote: ");
        out.push_str(note);
    }
    out.push('\n');
    out
}

fn report_line(suite: &Suite) -> String {
    match &suite.report_md {
        Some(path) => format!("\nreport: {path}"),
        None => String::new(),
    }
}

/// Attribute values are normalised by XML parsers (a newline becomes a space); make that
/// explicit so the message reads the same everywhere.
fn one_line(s: &str) -> String {
    s.split(['\r', '\n'])
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn seconds(s: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(s).ok()
}

/// The JUnit view of one drill: a suite, a case per expectation.
pub fn suite(report: &crate::report::Report, report_md: &std::path::Path) -> Suite {
    Suite {
        name: report.scenario.clone(),
        headline: format!("{} — {}", report.verdict.word(), report.headline),
        verdict_pass: report.verdict.is_pass(),
        time_s: report.duration_ms as f64 / 1000.0,
        report_md: Some(report_md.display().to_string()),
        cases: report
            .expectations
            .iter()
            .map(|x| Case {
                name: x.name.clone(),
                expected: x.expected.clone(),
                actual: x.actual.clone(),
                ok: x.ok,
            })
            .collect(),
        notes: report.notes.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(name: &str, expected: &str, actual: &str, ok: bool) -> Case {
        Case {
            name: name.into(),
            expected: expected.into(),
            actual: actual.into(),
            ok,
        }
    }

    fn passing() -> Suite {
        Suite {
            name: "kafka-outage".into(),
            headline: "PASS: ledger closed, 20000 held, 20000 delivered".into(),
            verdict_pass: true,
            time_s: 62.5,
            report_md: Some("reports/kafka-outage/report.md".into()),
            cases: vec![
                case("lost == 0", "0", "0", true),
                case("duplicates <= 0", "<= 0", "0", true),
            ],
            notes: vec![],
        }
    }

    fn failing() -> Suite {
        Suite {
            name: r#"mqtt <bridge> & "naive""#.into(),
            headline: r#"FAIL: 17 lost <after> restart & "resend""#.into(),
            verdict_pass: false,
            time_s: 30.25,
            report_md: Some("reports/mqtt/report.md".into()),
            cases: vec![
                case("lost == 0", "0", "17", false),
                case("p99 < 5s", "< 5s", "1.2s", true),
                case(r#"dup <key> & "id""#, "<= 0", "3 > 0", false),
            ],
            notes: vec!["engine restarted twice".into()],
        }
    }

    fn parse(xml: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(xml).expect("well-formed XML")
    }

    fn attr<'a>(n: roxmltree::Node<'a, '_>, name: &str) -> &'a str {
        n.attribute(name)
            .unwrap_or_else(|| panic!("{} has no {name}", n.tag_name().name()))
    }

    fn children<'a, 'i>(
        n: roxmltree::Node<'a, 'i>,
        tag: &'static str,
    ) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
        n.children().filter(move |c| c.has_tag_name(tag))
    }

    #[test]
    fn passing_and_failing_suites() {
        let xml = render(&[passing(), failing()]).unwrap();
        let doc = parse(&xml);
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "testsuites");
        assert_eq!(attr(root, "tests"), "5");
        assert_eq!(attr(root, "failures"), "2");
        assert_eq!(attr(root, "errors"), "0");
        assert_eq!(attr(root, "time"), "92.750");

        let suites: Vec<_> = children(root, "testsuite").collect();
        assert_eq!(suites.len(), 2);

        let pass = suites[0];
        assert_eq!(attr(pass, "name"), "kafka-outage");
        assert_eq!(attr(pass, "tests"), "2");
        assert_eq!(attr(pass, "failures"), "0");
        assert_eq!(attr(pass, "time"), "62.500");
        for tc in children(pass, "testcase") {
            assert_eq!(attr(tc, "classname"), "drill.kafka-outage");
            assert_eq!(children(tc, "failure").count(), 0);
        }
        let out = children(pass, "system-out").next().unwrap().text().unwrap();
        assert!(out.contains("PASS: ledger closed"));
        assert!(out.contains("reports/kafka-outage/report.md"));

        let fail = suites[1];
        // Escaping: the parser gives back exactly what went in.
        assert_eq!(attr(fail, "name"), r#"mqtt <bridge> & "naive""#);
        assert_eq!(attr(fail, "tests"), "3");
        assert_eq!(attr(fail, "failures"), "2");
        let cases: Vec<_> = children(fail, "testcase").collect();
        assert_eq!(
            cases.len(),
            3,
            "no verdict case when a case carries the failure"
        );
        assert_eq!(
            attr(cases[0], "classname"),
            r#"drill.mqtt <bridge> & "naive""#
        );
        assert_eq!(attr(cases[2], "name"), r#"dup <key> & "id""#);

        let f = children(cases[0], "failure").next().unwrap();
        assert_eq!(attr(f, "message"), "expected 0, got 17");
        assert_eq!(attr(f, "type"), "expectation");
        let text = f.text().unwrap();
        assert!(text.contains(r#"FAIL: 17 lost <after> restart & "resend""#));
        assert!(text.contains("expected 0, actual 17"));
        assert_eq!(children(cases[1], "failure").count(), 0);
        let f = children(cases[2], "failure").next().unwrap();
        assert_eq!(attr(f, "message"), "expected <= 0, got 3 > 0");

        let props: Vec<_> = children(fail, "properties")
            .flat_map(|p| children(p, "property"))
            .map(|p| (attr(p, "name"), attr(p, "value")))
            .collect();
        assert!(props.contains(&(
            "drill.headline",
            r#"FAIL: 17 lost <after> restart & "resend""#
        )));
        assert!(props.contains(&("drill.verdict", "fail")));
        assert!(props.contains(&("drill.report", "reports/mqtt/report.md")));
        let out = children(fail, "system-out").next().unwrap().text().unwrap();
        assert!(out.contains(r#"FAIL: 17 lost <after> restart & "resend""#));
        assert!(out.contains("note: engine restarted twice"));
    }

    #[test]
    fn failed_verdict_without_failing_case_adds_failing_verdict_case() {
        let mut s = passing();
        s.verdict_pass = false;
        s.headline = "INCONCLUSIVE: verifier faulted".into();
        s.notes = vec!["reader: connection refused".into(), "second note".into()];
        let xml = render(&[s]).unwrap();
        let doc = parse(&xml);
        let suite = children(doc.root_element(), "testsuite").next().unwrap();
        assert_eq!(attr(suite, "tests"), "3");
        assert_eq!(attr(suite, "failures"), "1");
        let verdict = children(suite, "testcase")
            .find(|c| attr(*c, "name") == "verdict")
            .unwrap();
        assert_eq!(attr(verdict, "classname"), "drill.kafka-outage");
        let f = children(verdict, "failure").next().unwrap();
        assert_eq!(attr(f, "message"), "INCONCLUSIVE: verifier faulted");
        assert_eq!(attr(f, "type"), "verdict");
        let text = f.text().unwrap();
        assert!(text.contains("INCONCLUSIVE: verifier faulted"));
        assert!(text.contains("reader: connection refused"));
        assert!(text.contains("second note"));
    }

    #[test]
    fn zero_cases() {
        let mut s = passing();
        s.cases.clear();
        let xml = render(std::slice::from_ref(&s)).unwrap();
        let doc = parse(&xml);
        let suite = children(doc.root_element(), "testsuite").next().unwrap();
        assert_eq!(attr(suite, "tests"), "1");
        assert_eq!(attr(suite, "failures"), "0");
        let tc = children(suite, "testcase").next().unwrap();
        assert_eq!(attr(tc, "name"), "verdict");
        assert_eq!(children(tc, "failure").count(), 0);

        s.verdict_pass = false;
        let xml = render(&[s]).unwrap();
        let doc = parse(&xml);
        let suite = children(doc.root_element(), "testsuite").next().unwrap();
        assert_eq!(attr(suite, "tests"), "1");
        assert_eq!(attr(suite, "failures"), "1");
    }

    #[test]
    fn odd_inputs() {
        // No suites: still one well-formed document.
        let doc_xml = render(&[]).unwrap();
        let doc = parse(&doc_xml);
        assert_eq!(attr(doc.root_element(), "tests"), "0");

        // A time that is not a duration is left out; control characters are dropped; a
        // multi-line value stays one line in the message and whole in the text.
        let mut s = failing();
        s.time_s = f64::NAN;
        s.cases = vec![case("a\u{1b}[31mred\u{7}", "x\ny", "z", false)];
        let xml = render(&[s]).unwrap();
        let doc = parse(&xml);
        let suite = children(doc.root_element(), "testsuite").next().unwrap();
        assert_eq!(suite.attribute("time"), None);
        let tc = children(suite, "testcase").next().unwrap();
        assert_eq!(attr(tc, "name"), "ared");
        let f = children(tc, "failure").next().unwrap();
        assert_eq!(attr(f, "message"), "expected x y, got z");
        assert!(f.text().unwrap().contains("expected x\ny, actual z"));
    }
}
