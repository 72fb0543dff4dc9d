//! A fault timeline as `drill explore` makes, runs and shrinks it: concrete faults, each a
//! [`Choice`] of the scenario's [`Menu`] with its start and its length, over a workload of
//! a given length. Pure: a timeline becomes a scenario's `faults:` lines ([`Timeline::yaml`])
//! and nothing here runs anything.

use crate::units::Dur;

/// One kind of fault a scenario allows, as `drill check` takes it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The fault's fields without `at` and its length, as YAML flow fields: `link: mqtt,
    /// fault: swallow, direction: downstream`.
    pub fields: String,
    /// The field that holds its length (`for`, `restart_after`, `down_for`); `None`: an
    /// instant (`strand`).
    pub length: Option<&'static str>,
    /// Its family, what swarm generation leaves in or out of a timeline as one (`link mqtt
    /// refuse`, `engine kill`).
    pub family: String,
}

/// What a scenario allows: every [`Choice`], and its workload's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Menu {
    pub choices: Vec<Choice>,
    /// The base scenario's workload, in milliseconds.
    pub workload_ms: u64,
}

impl Menu {
    /// The families, each once, in the order of the choices.
    pub fn families(&self) -> Vec<&str> {
        let mut families: Vec<&str> = Vec::new();
        for c in &self.choices {
            if !families.contains(&c.family.as_str()) {
                families.push(&c.family);
            }
        }
        families
    }
}

/// One fault of a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fault {
    /// When it starts, from the workload's start.
    pub at_ms: u64,
    /// The index of its [`Choice`] in the menu.
    pub choice: usize,
    /// How long it lasts (`None`: an instant).
    pub len_ms: Option<u64>,
}

impl Fault {
    /// When it is healed: its end, or its instant.
    pub fn end_ms(&self) -> u64 {
        self.at_ms + self.len_ms.unwrap_or(0)
    }
}

/// A timeline: faults in the order they start, over a workload of `workload_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Timeline {
    pub faults: Vec<Fault>,
    pub workload_ms: u64,
}

impl Timeline {
    /// A timeline of `faults` (put in order) over `workload_ms`.
    pub fn new(mut faults: Vec<Fault>, workload_ms: u64) -> Timeline {
        faults.sort();
        Timeline {
            faults,
            workload_ms,
        }
    }

    /// Its size, what shrinking lowers: the number of faults, then their seconds together,
    /// then the workload's length.
    pub fn size(&self) -> (usize, u64, u64) {
        let fault_ms = self.faults.iter().map(|f| f.len_ms.unwrap_or(0)).sum();
        (self.faults.len(), fault_ms, self.workload_ms)
    }

    /// When the last fault is healed (0 without faults).
    pub fn healed_ms(&self) -> u64 {
        self.faults.iter().map(Fault::end_ms).max().unwrap_or(0)
    }

    /// The scenario's `faults:` section: one flow mapping per fault. A fault that starts after
    /// the workload, during the drain, says `after_workload: true`, as `drill check` asks.
    pub fn yaml(&self, menu: &Menu) -> String {
        if self.faults.is_empty() {
            return "faults: []\n".to_string();
        }
        let mut out = String::from("faults:\n");
        for f in &self.faults {
            let choice = &menu.choices[f.choice];
            out.push_str(&format!("  - {{ at: {}, {}", ms(f.at_ms), choice.fields));
            if let (Some(field), Some(len)) = (choice.length, f.len_ms) {
                out.push_str(&format!(", {field}: {}", ms(len)));
            }
            if f.at_ms >= self.workload_ms {
                out.push_str(", after_workload: true");
            }
            out.push_str(" }\n");
        }
        out
    }

    /// In words, one fault a line: `at 3.5 s: link mqtt refuse, for 2 s`.
    pub fn words(&self, menu: &Menu) -> Vec<String> {
        self.faults
            .iter()
            .map(|f| {
                let choice = &menu.choices[f.choice];
                let what = words(&choice.fields);
                match (choice.length, f.len_ms) {
                    (Some(field), Some(len)) => format!(
                        "at {}: {what}, {} {}",
                        seconds(f.at_ms),
                        field.replace('_', " "),
                        seconds(len)
                    ),
                    _ => format!("at {}: {what}", seconds(f.at_ms)),
                }
            })
            .collect()
    }
}

impl Timeline {
    /// A small chart, a row per fault over one time axis of `width` columns from 0 to the
    /// last heal (or the workload's end, whichever is later) plus a second: `█` while the
    /// fault holds, `▌` an instant, the words at the row's end; under them the axis, `|` where
    /// the workload ends.
    pub fn chart(&self, menu: &Menu, width: usize) -> String {
        let end_ms = self.healed_ms().max(self.workload_ms) + 1_000;
        let col = |ms: u64| ((ms as u128 * width as u128 / end_ms as u128) as usize).min(width - 1);
        let mut out = String::new();
        for (f, words) in self.faults.iter().zip(self.words(menu)) {
            let (from, to) = (col(f.at_ms), col(f.end_ms()));
            let row: String = (0..width)
                .map(|c| match f.len_ms {
                    None if c == from => '▌',
                    Some(_) if c >= from && c <= to => '█',
                    _ => '·',
                })
                .collect();
            out.push_str(&format!("{row}  {words}\n"));
        }
        let mut axis: Vec<char> = vec![' '; width];
        for (i, c) in "0 s".chars().enumerate() {
            axis[i] = c;
        }
        axis[col(self.workload_ms)] = '|';
        out.push_str(&format!(
            "{}  (| the workload ends at {} s; the axis runs to {} s)\n",
            axis.into_iter().collect::<String>(),
            self.workload_ms as f64 / 1000.0,
            end_ms as f64 / 1000.0
        ));
        out
    }
}

/// A choice's fields in words: `link: mqtt, fault: swallow, direction: upstream` → `link mqtt
/// swallow upstream`, `target: engine, action: kill` → `engine kill`.
fn words(fields: &str) -> String {
    fields
        .split(", ")
        .map(|kv| match kv.split_once(": ") {
            Some(("fault" | "action" | "direction" | "target", v)) => v.to_string(),
            Some((k, v)) => format!("{} {v}", k.replace('_', " ")),
            None => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Milliseconds in seconds for a reader: `2.7 s`, `18 s`.
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Milliseconds as a scenario writes a duration: `3s`, `3500ms`.
fn ms(ms: u64) -> String {
    Dur(std::time::Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn menu() -> Menu {
        Menu {
            choices: vec![
                Choice {
                    fields: "link: mqtt, fault: refuse".into(),
                    length: Some("for"),
                    family: "link mqtt refuse".into(),
                },
                Choice {
                    fields: "link: mqtt, fault: strand".into(),
                    length: None,
                    family: "link mqtt strand".into(),
                },
            ],
            workload_ms: 20_000,
        }
    }

    #[test]
    fn a_timeline_is_the_faults_section_drill_reads() {
        let t = Timeline::new(
            vec![
                Fault {
                    at_ms: 21_000,
                    choice: 1,
                    len_ms: None,
                },
                Fault {
                    at_ms: 3_500,
                    choice: 0,
                    len_ms: Some(2_000),
                },
            ],
            20_000,
        );
        assert_eq!(
            t.yaml(&menu()),
            "faults:\n  - { at: 3500ms, link: mqtt, fault: refuse, for: 2s }\n  - { at: 21s, link: mqtt, fault: strand, after_workload: true }\n"
        );
        assert_eq!(t.size(), (2, 2_000, 20_000));
        assert_eq!(
            t.words(&menu()),
            [
                "at 3.5 s: link mqtt refuse, for 2 s",
                "at 21 s: link mqtt strand"
            ]
        );
        assert_eq!(t.healed_ms(), 21_000);
        assert_eq!(Timeline::new(vec![], 5_000).yaml(&menu()), "faults: []\n");
        let chart = t.chart(&menu(), 22);
        let rows: Vec<&str> = chart.lines().collect();
        assert_eq!(rows.len(), 3, "{chart}");
        // 22 columns over 22 s: the refusal holds columns 3 to 5, the strand is at 21, the
        // workload ends at 20.
        assert!(
            rows[0].starts_with("···███················  at 3.5 s"),
            "{chart}"
        );
        assert!(
            rows[1].starts_with("·····················▌  at 21 s"),
            "{chart}"
        );
        assert!(
            rows[2].starts_with(
                "0 s                 |   (| the workload ends at 20 s; the axis runs to 22 s)"
            ),
            "{chart}"
        );
    }
}
