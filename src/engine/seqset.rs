//! A set of record sequences kept as ranges: what an output must remember about records it has
//! not read from the log yet (settled before a restart, or lost to damage) costs a few bytes per
//! *run* of sequences, not per record. Delivery marks come in long runs (a drained backlog is
//! one range), so a backlog of millions settles into a handful of ranges.
//!
//! Owns no I/O; never allocates per member.

use std::collections::BTreeMap;
use std::ops::Range;

/// Sequences as disjoint, non-adjacent half-open ranges `start → end`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqSet {
    ranges: BTreeMap<u64, u64>,
    len: u64,
}

impl SeqSet {
    pub fn new() -> SeqSet {
        SeqSet::default()
    }

    /// How many sequences are members.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many ranges hold them (the memory it costs).
    pub fn ranges(&self) -> usize {
        self.ranges.len()
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.ranges
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, &end)| seq < end)
    }

    pub fn insert(&mut self, seq: u64) {
        self.insert_range(seq..seq + 1);
    }

    /// Adds every sequence of `range`, merging with the ranges it touches.
    pub fn insert_range(&mut self, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        let (mut start, mut end) = (range.start, range.end);
        // A range starting at or before `start` that reaches it absorbs the new one's start.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
            self.ranges.remove(&s);
            self.len -= e - s;
        }
        // Ranges starting inside (or right at the end of) the new one are absorbed.
        while let Some((&s, &e)) = self.ranges.range(start..=end).next() {
            end = end.max(e);
            self.ranges.remove(&s);
            self.len -= e - s;
        }
        self.ranges.insert(start, end);
        self.len += end - start;
    }

    /// Forgets every member below `seq`.
    pub fn remove_below(&mut self, seq: u64) {
        while let Some((&s, &e)) = self.ranges.first_key_value() {
            if s >= seq {
                break;
            }
            self.ranges.remove(&s);
            self.len -= e - s;
            if e > seq {
                self.ranges.insert(seq, e);
                self.len += e - seq;
                break;
            }
        }
    }

    /// Every member, in order (tests and small sets only).
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|(&s, &e)| s..e)
    }
}

impl FromIterator<u64> for SeqSet {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        let mut set = SeqSet::new();
        for seq in iter {
            set.insert(seq);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn runs_merge_into_one_range() {
        let mut s = SeqSet::new();
        for seq in (0..1000).rev() {
            s.insert(seq);
        }
        assert_eq!((s.len(), s.ranges()), (1000, 1));
        s.remove_below(10);
        assert_eq!(
            (s.len(), s.ranges(), s.contains(9), s.contains(10)),
            (990, 1, false, true)
        );
    }

    proptest! {
        /// Against a `BTreeSet`: same members, same count, after inserts and prunes.
        #[test]
        fn matches_a_plain_set(ops in prop::collection::vec((0u64..200, 0u64..6, any::<bool>()), 1..200)) {
            let mut s = SeqSet::new();
            let mut model = BTreeSet::new();
            for (at, n, prune) in ops {
                if prune && n == 0 {
                    s.remove_below(at);
                    model.retain(|&x| x >= at);
                } else {
                    s.insert_range(at..at + n);
                    model.extend(at..at + n);
                }
                prop_assert_eq!(s.len(), model.len() as u64);
                prop_assert_eq!(s.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
                for x in 0..210 {
                    prop_assert_eq!(s.contains(x), model.contains(&x));
                }
            }
        }
    }
}
