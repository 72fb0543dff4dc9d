//! What a drill checks, by name: [`Check`] (one per expectation row of a report) and
//! [`Signature`] (how a deliberately broken engine must fail those checks to count as caught).
//!
//! A leaf: the report writes checks, the engine's mutants name their signatures, the selftest
//! matches one against the other — none of them reads another's words. A signature is a check
//! *and its sense*: `recovery: none` (no delivery at all after a heal) is not `recovery: late`
//! (a delivery that came, but after the bound), so a slow machine cannot fake a catch.

use serde::{Deserialize, Serialize};

/// What an expectation checks, whatever its row is titled (`lost beyond at_most_once`,
/// `recovery after link mqtt swallow both`): the name tools match on (`report.json`'s
/// `expectations[].check`), so nothing has to read a row's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    Lost,
    /// Held records the engine still holds when the drain ends: never delivered.
    Undelivered,
    Unexpected,
    Altered,
    Failed,
    NotAccepted,
    MaxCopies,
    Drain,
    Duplicates,
    Reordered,
    Ledger,
    Recovery,
    /// A write that arrived while an earlier attempt with its write key was still open.
    OverlappingAttempts,
}

/// How a mutant must fail a drill to be caught: a failed expectation of one check, in one
/// sense. Written in `selftest.json` and the matrix by its [`Signature::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Signature {
    /// Records neither delivered, held nor failed.
    #[serde(rename = "lost")]
    Lost,
    /// Held records the engine still held when the drain ended.
    #[serde(rename = "undelivered")]
    Undelivered,
    /// Copies beyond what the declared promise allows.
    #[serde(rename = "duplicates")]
    Duplicates,
    /// Copies beyond the promise, some without the original's write key.
    #[serde(rename = "keyless_copies")]
    KeylessCopies,
    /// Records set aside as failed that the destination never refused (or too few).
    #[serde(rename = "failed")]
    Failed,
    #[serde(rename = "reordered")]
    Reordered,
    /// A record delivered with other bytes than were sent.
    #[serde(rename = "altered")]
    Altered,
    /// Data at the destination the engine never accepted.
    #[serde(rename = "unexpected")]
    Unexpected,
    /// No delivery at all after a heal (not a late one).
    #[serde(rename = "recovery: none")]
    RecoveryNone,
    /// A second attempt for a write key while the first was open (judged where drill is the
    /// destination, HTTP, and at a link whose tap pairs statements with answers, PostgreSQL).
    #[serde(rename = "overlapping_attempts")]
    OverlappingAttempts,
}

impl Signature {
    /// The check whose failed row can carry this signature.
    pub fn check(self) -> Check {
        match self {
            Signature::Lost => Check::Lost,
            Signature::Undelivered => Check::Undelivered,
            Signature::Duplicates | Signature::KeylessCopies => Check::Duplicates,
            Signature::Failed => Check::Failed,
            Signature::Reordered => Check::Reordered,
            Signature::Altered => Check::Altered,
            Signature::Unexpected => Check::Unexpected,
            Signature::RecoveryNone => Check::Recovery,
            Signature::OverlappingAttempts => Check::OverlappingAttempts,
        }
    }

    /// `lost`, `keyless_copies`, `recovery: none`.
    pub fn name(self) -> &'static str {
        match self {
            Signature::Lost => "lost",
            Signature::Undelivered => "undelivered",
            Signature::Duplicates => "duplicates",
            Signature::KeylessCopies => "keyless_copies",
            Signature::Failed => "failed",
            Signature::Reordered => "reordered",
            Signature::Altered => "altered",
            Signature::Unexpected => "unexpected",
            Signature::RecoveryNone => "recovery: none",
            Signature::OverlappingAttempts => "overlapping_attempts",
        }
    }

    /// Whether a failed row of [`Signature::check`] shows this signature: its count (`None`
    /// for a recovery that never came) and, for copies, how many carried no original write key.
    /// The count a catch reports, or `None` when the row does not match.
    pub fn matches(self, count: Option<u64>, keyless: u64) -> Option<Option<u64>> {
        match self {
            Signature::RecoveryNone => count.is_none().then_some(None),
            Signature::KeylessCopies => (keyless > 0).then_some(Some(keyless)),
            _ => Some(count),
        }
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_recovery_is_not_recovery_none() {
        // A row "recovery after link mqtt strand: 6000 ms (expected ≤ 5000 ms)": late.
        assert_eq!(Signature::RecoveryNone.matches(Some(6000), 0), None);
        // "no delivery": none.
        assert_eq!(Signature::RecoveryNone.matches(None, 0), Some(None));
    }

    #[test]
    fn keyless_copies_need_a_copy_without_the_original_key() {
        assert_eq!(Signature::KeylessCopies.matches(Some(4), 0), None);
        assert_eq!(Signature::KeylessCopies.matches(Some(4), 3), Some(Some(3)));
        assert_eq!(Signature::Lost.matches(Some(202), 0), Some(Some(202)));
    }

    #[test]
    fn names_round_trip_through_json() {
        for s in [
            Signature::Lost,
            Signature::Undelivered,
            Signature::Duplicates,
            Signature::KeylessCopies,
            Signature::Failed,
            Signature::Reordered,
            Signature::Altered,
            Signature::Unexpected,
            Signature::RecoveryNone,
            Signature::OverlappingAttempts,
        ] {
            let v = serde_json::to_value(s).unwrap();
            assert_eq!(v, serde_json::json!(s.name()));
            assert_eq!(serde_json::from_value::<Signature>(v).unwrap(), s);
        }
    }
}
