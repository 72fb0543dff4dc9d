//! Timelines from a seed, swarm-style: timeline *i* of seed *s* depends on *s* and *i* alone
//! (its own [`Seeded`] stream), so the same seed gives byte-identical timelines however many
//! run at once. Each timeline leaves in a random non-empty subset of the menu's families
//! (swarm testing: a run without some features finds what they would mask), holds one to five
//! faults (three in five timelines one or two), outages log-uniform over 1–30 s, each
//! fault likely to start 0–3 s after the previous one healed or during the drain, and ends
//! healed: every fault has an end, and the scenario's drain reads back after the last. A drain
//! is there only after an outage, so a "drain" fault with no heal after the workload lands in
//! the workload's last 3 s instead (one after everything was delivered meets no traffic).

use super::timeline::{Fault, Menu, Timeline};
use crate::seed::Seeded;

/// The shortest and longest outage, in milliseconds (log-uniform between).
pub const OUTAGE_MS: (u64, u64) = (1_000, 30_000);

/// At most this many faults in a timeline.
pub const MAX_FAULTS: usize = 5;

/// The stream of timeline `i` of `seed`: the two mixed so that nearby seeds and indexes give
/// unrelated streams.
fn stream(seed: u64, i: u64) -> Seeded {
    let mut s = Seeded::new(seed ^ 0x6578_706C_6F72_6521);
    let a = s.next_u64();
    let mut t = Seeded::new(a ^ i.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    t.next_u64();
    t
}

/// A number in `0.0..1.0`.
fn unit(r: &mut Seeded) -> f64 {
    (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Milliseconds log-uniform over `lo..=hi`, to a tenth of a second.
fn log_uniform(r: &mut Seeded, (lo, hi): (u64, u64)) -> u64 {
    let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
    let ms = (a + unit(r) * (b - a)).exp();
    ((ms / 100.0).round() as u64 * 100).clamp(lo, hi)
}

/// Timeline `i` of `seed` for `menu` (no faults when the menu has no choices).
pub fn timeline(seed: u64, i: u64, menu: &Menu) -> Timeline {
    let mut r = stream(seed, i);
    let families = menu.families();
    if families.is_empty() {
        return Timeline::new(Vec::new(), menu.workload_ms);
    }
    // Swarm: each family in with even odds, at least one.
    let mut on: Vec<&str> = families
        .iter()
        .copied()
        .filter(|_| r.below(2) == 0)
        .collect();
    if on.is_empty() {
        on.push(families[r.below(families.len() as u64) as usize]);
    }
    let allowed: Vec<usize> = (0..menu.choices.len())
        .filter(|&c| on.contains(&menu.choices[c].family.as_str()))
        .collect();
    // Three in five timelines hold one or two faults (most failures need few events).
    let count = if r.below(5) < 3 {
        1 + r.below(2) as usize
    } else {
        3 + r.below((MAX_FAULTS - 2) as u64) as usize
    };
    let w = menu.workload_ms.max(2_000);
    let mut faults: Vec<Fault> = Vec::with_capacity(count);
    for n in 0..count {
        let choice = allowed[r.below(allowed.len() as u64) as usize];
        let len_ms = menu.choices[choice]
            .length
            .map(|_| log_uniform(&mut r, OUTAGE_MS));
        let last_heal = faults.iter().map(Fault::end_ms).max();
        let at_ms = match (r.below(10), last_heal) {
            // Just after a heal, when the engine reconnects and drains its backlog.
            (0..=5, Some(heal)) if n > 0 => heal + r.below(3_001),
            // During the drain: after the workload, while an earlier outage's backlog is sent
            // (no backlog, no drain: then in the workload's last 3 s, holding one back).
            (6..=7, Some(heal)) if heal >= w => heal + r.below(1_501),
            (6..=7, _) => w - 3_000.min(w - 1_000) + r.below(3_001),
            // Anywhere in the workload, after its first second.
            _ => 1_000 + r.below(w - 1_000),
        };
        faults.push(Fault {
            at_ms: at_ms / 100 * 100,
            choice,
            len_ms,
        });
    }
    Timeline::new(faults, menu.workload_ms)
}

#[cfg(test)]
mod tests {
    use super::super::timeline::Choice;
    use super::*;

    pub(crate) fn menu() -> Menu {
        let choice = |fields: &str, length: Option<&'static str>, family: &str| Choice {
            fields: fields.into(),
            length,
            family: family.into(),
        };
        Menu {
            choices: vec![
                choice("link: mqtt, fault: refuse", Some("for"), "link refuse"),
                choice(
                    "link: mqtt, fault: swallow, direction: downstream",
                    Some("for"),
                    "link swallow",
                ),
                choice("link: mqtt, fault: swallow", Some("for"), "link swallow"),
                choice("link: mqtt, fault: strand", None, "link strand"),
                choice(
                    "target: engine, action: kill",
                    Some("restart_after"),
                    "engine kill",
                ),
            ],
            workload_ms: 20_000,
        }
    }

    #[test]
    fn one_seed_gives_the_same_timelines_whatever_runs_them() {
        let m = menu();
        let one: Vec<String> = (0..200).map(|i| timeline(7, i, &m).yaml(&m)).collect();
        // Two jobs, each taking every other index, in reverse: the same timelines.
        let jobs: Vec<std::thread::JoinHandle<Vec<(u64, String)>>> = (0..2)
            .map(|j| {
                let m = m.clone();
                std::thread::spawn(move || {
                    (0..200)
                        .rev()
                        .filter(|i| i % 2 == j)
                        .map(|i| (i, timeline(7, i, &m).yaml(&m)))
                        .collect()
                })
            })
            .collect();
        let mut two: Vec<(u64, String)> =
            jobs.into_iter().flat_map(|j| j.join().unwrap()).collect();
        two.sort();
        assert_eq!(one, two.into_iter().map(|(_, y)| y).collect::<Vec<_>>());
        let other: Vec<String> = (0..200).map(|i| timeline(8, i, &m).yaml(&m)).collect();
        assert_ne!(one, other, "another seed, other timelines");
    }

    #[test]
    fn timelines_are_short_swarmed_and_end_healed() {
        let m = menu();
        let all: Vec<Timeline> = (0..2_000).map(|i| timeline(1, i, &m)).collect();
        let short = all.iter().filter(|t| t.faults.len() <= 2).count();
        assert!(short >= 1_000, "{short} of 2000 with at most 2 faults");
        assert!(
            all.iter()
                .all(|t| (1..=MAX_FAULTS).contains(&t.faults.len()))
        );
        // Every outage between 1 and 30 s; instants have none.
        for t in &all {
            for f in &t.faults {
                match (m.choices[f.choice].length, f.len_ms) {
                    (Some(_), Some(len)) => assert!((1_000..=30_000).contains(&len), "{len}"),
                    (None, None) => {}
                    other => panic!("{other:?}"),
                }
            }
        }
        // Log-uniform: about as many outages under 5.5 s (ln-midpoint of 1–30 s) as over.
        let lens: Vec<u64> = all
            .iter()
            .flat_map(|t| t.faults.iter().filter_map(|f| f.len_ms))
            .collect();
        let under = lens.iter().filter(|&&l| l < 5_477).count() as f64 / lens.len() as f64;
        assert!((0.4..0.6).contains(&under), "{under}");
        // Swarm: some timelines leave families out, and every family appears.
        let families_in = |t: &Timeline| {
            let mut f: Vec<&str> = t
                .faults
                .iter()
                .map(|f| m.choices[f.choice].family.as_str())
                .collect();
            f.sort();
            f.dedup();
            f.len()
        };
        assert!(
            all.iter()
                .filter(|t| t.faults.len() >= 4)
                .any(|t| families_in(t) == 1)
        );
        for family in m.families() {
            assert!(all.iter().any(|t| {
                t.faults
                    .iter()
                    .any(|f| m.choices[f.choice].family == family)
            }));
        }
        // Biased to just after a heal and to the drain.
        let after_heal = all
            .iter()
            .flat_map(|t| {
                t.faults.windows(2).filter(|w| {
                    let heal = w[0].end_ms();
                    w[1].at_ms >= heal && w[1].at_ms <= heal + 3_000
                })
            })
            .count();
        let pairs: usize = all.iter().map(|t| t.faults.len().saturating_sub(1)).sum();
        assert!(
            after_heal * 4 >= pairs,
            "{after_heal} of {pairs} within 3 s of a heal"
        );
        let in_drain = all
            .iter()
            .flat_map(|t| t.faults.iter())
            .filter(|f| f.at_ms >= m.workload_ms)
            .count();
        assert!(in_drain > 0);
        // A fault after the workload comes within 3 s of an earlier heal: a drain is there
        // only after an outage, and one after everything was delivered meets no traffic.
        for t in &all {
            for f in t.faults.iter().filter(|f| f.at_ms >= m.workload_ms) {
                assert!(
                    t.faults
                        .iter()
                        .filter(|p| !std::ptr::eq(*p, f))
                        .any(|p| p.end_ms() <= f.at_ms && f.at_ms <= p.end_ms() + 3_000),
                    "{}",
                    t.yaml(&m)
                );
            }
        }
    }
}
