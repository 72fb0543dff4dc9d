//! Drills split across CI runners: `--shard K/N` (which of N shards this runner takes) and
//! `drill list --shards N` (which shard each drill falls in, to feed a CI matrix).
//!
//! The partition is stable: it depends only on each drill's name and planned length
//! ([`Plan::plays_for`]), never on the order of the files or on the machine. Longest first, each
//! drill goes to the shard with the least planned time so far (ties: the lowest shard), so the
//! shards' lengths stay close; every drill is in exactly one shard for any N.

use std::time::Duration;

use serde::Serialize;

use crate::scenario::Plan;

/// `--shard K/N`: shard K (from 1) of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub k: usize,
    pub n: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("`{s}`: a shard is K/N with 1 ≤ K ≤ N, e.g. --shard 2/3");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (k, n): (usize, usize) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if n == 0 || k == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { k, n })
    }
}

/// The shard (from 1) of each of `drills` (name, planned length) among `n`, in their order.
pub fn partition(drills: &[(String, Duration)], n: usize) -> Vec<usize> {
    let n = n.max(1);
    let mut order: Vec<usize> = (0..drills.len()).collect();
    // Longest first; equal lengths by name, so the result never depends on the files' order.
    order.sort_by(|&a, &b| {
        drills[b]
            .1
            .cmp(&drills[a].1)
            .then_with(|| drills[a].0.cmp(&drills[b].0))
    });
    let mut load = vec![Duration::ZERO; n];
    let mut shard = vec![0; drills.len()];
    for i in order {
        let (least, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(s, l)| (*l, s))
            .unwrap_or((0, &Duration::ZERO));
        load[least] += drills[i].1;
        shard[i] = least + 1;
    }
    shard
}

/// Keeps the plans of `shard`, in their order.
pub fn keep(plans: Vec<Plan>, shard: Shard) -> Vec<Plan> {
    let drills: Vec<(String, Duration)> = plans
        .iter()
        .map(|p| (p.name.clone(), p.plays_for()))
        .collect();
    let of = partition(&drills, shard.n);
    plans
        .into_iter()
        .zip(of)
        .filter(|(_, s)| *s == shard.k)
        .map(|(p, _)| p)
        .collect()
}

/// One line of `drill list`.
#[derive(Debug, Serialize)]
pub struct Listed {
    pub name: String,
    pub file: String,
    pub tags: Vec<String>,
    /// The planned length: the workload, or the last fault if later (seconds).
    pub plays_s: u64,
    /// Its shard among `--shards N` (from 1); 1 without `--shards`.
    pub shard: usize,
}

/// `drill list`: the drills with their planned length and shard.
pub fn list(plans: &[Plan], shards: usize) -> Vec<Listed> {
    let drills: Vec<(String, Duration)> = plans
        .iter()
        .map(|p| (p.name.clone(), p.plays_for()))
        .collect();
    let of = partition(&drills, shards);
    plans
        .iter()
        .zip(of)
        .map(|(p, shard)| Listed {
            name: p.name.clone(),
            file: p.source.display().to_string(),
            tags: p.tags.clone(),
            plays_s: p.plays_for().as_secs(),
            shard,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drills(secs: &[u64]) -> Vec<(String, Duration)> {
        secs.iter()
            .enumerate()
            .map(|(i, s)| (format!("d{i:02}"), Duration::from_secs(*s)))
            .collect()
    }

    #[test]
    fn every_drill_is_in_exactly_one_shard_for_any_n() {
        let d = drills(&[30, 5, 60, 12, 12, 90, 1, 44, 20, 20, 7]);
        for n in 1..=14 {
            let of = partition(&d, n);
            assert_eq!(of.len(), d.len());
            assert!(of.iter().all(|s| (1..=n).contains(s)), "n={n}: {of:?}");
        }
    }

    #[test]
    fn the_partition_ignores_the_order_of_the_files() {
        let d = drills(&[30, 5, 60, 12, 12, 90, 1, 44, 20, 20, 7]);
        let mut reversed = d.clone();
        reversed.reverse();
        let a = partition(&d, 3);
        let mut b = partition(&reversed, 3);
        b.reverse();
        assert_eq!(a, b);
    }

    #[test]
    fn longest_first_keeps_the_shards_close() {
        let d = drills(&[30, 5, 60, 12, 12, 90, 1, 44, 20, 20, 7, 33, 41]);
        let of = partition(&d, 3);
        let mut load = [0u64; 3];
        for (i, s) in of.iter().enumerate() {
            load[s - 1] += d[i].1.as_secs();
        }
        let (min, max) = (*load.iter().min().unwrap(), *load.iter().max().unwrap());
        assert!((max - min) as f64 <= 0.25 * max as f64, "{load:?}");
    }

    #[test]
    fn a_shard_is_k_of_n() {
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard { k: 2, n: 3 }));
        for bad in ["0/3", "4/3", "3", "a/b", "1/0", ""] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains("K/N"), "{bad}: {e}");
        }
    }
}
