//! Where each lost record was last seen, by the links' protocol tap: it *never left the engine*
//! (the link never read it from the engine), it *left but no answer came back* (the engine sent
//! it; the broker never confirmed it — the link swallowed it, or the broker did not answer), or
//! *the broker acknowledged it and does not have it* (a broker that lost what it confirmed).
//! Pure: it reads what the runner recorded.

use serde::Serialize;

use super::Ledger;
use super::recovery::first_arrivals;
use crate::runner::Facts;

/// The lost records by where they were last seen.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LastSeen {
    /// The tap that saw them (`MQTT PUBLISH/PUBACK`).
    pub tap: String,
    /// Records accepted and not at the destination (the lost ones, and any the engine still
    /// holds: see `note`).
    pub missing: u64,
    pub never_left: Class,
    pub no_answer: Class,
    pub broker_lost: Class,
    /// Why the classes count more than `lost`, when they do.
    pub note: Option<String>,
}

/// One class: how many, and the first few ids.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Class {
    pub count: u64,
    pub first: Vec<String>,
}

/// How many ids a class shows.
const FIRST: usize = 5;

impl Class {
    fn add(&mut self, id: &str) {
        self.count += 1;
        if self.first.len() < FIRST {
            self.first.push(id.to_string());
        }
    }
}

/// The lost records' classes, when something was lost and the links were tapped.
pub fn last_seen(facts: &Facts, ledger: &Ledger) -> Option<LastSeen> {
    if ledger.lost == 0 {
        return None;
    }
    let tapped = facts.tapped.as_ref()?;
    let arrived = first_arrivals(&facts.received);
    let mut seen = LastSeen {
        tap: tapped.protocol.to_string(),
        missing: 0,
        never_left: Class::default(),
        no_answer: Class::default(),
        broker_lost: Class::default(),
        note: None,
    };
    for (r, _, _) in facts.sent.accepted() {
        let id = r.id.as_str();
        if arrived.contains_key(id) {
            continue;
        }
        seen.missing += 1;
        if tapped.acked.contains(id) {
            seen.broker_lost.add(id);
        } else if tapped.left.contains(id) || tapped.sent.contains_key(id) {
            seen.no_answer.add(id);
        } else {
            seen.never_left.add(id);
        }
    }
    let held = ledger.waiting + ledger.failed;
    if held > 0 {
        seen.note = Some(format!(
            "{held} of the {} records missing at the destination are still held by the engine (waiting or failed): the classes count every missing record",
            seen.missing
        ));
    }
    if tapped.unreadable > 0 {
        let more = format!(
            "the tap could not read {} of {} data frames (compressed, or not this drill's records): a record counted as never having left may have gone up in one",
            tapped.unreadable, tapped.frames
        );
        seen.note = Some(match seen.note.take() {
            Some(n) => format!("{n}; {more}"),
            None => more,
        });
    }
    Some(seen)
}
