//! What an output promises and in which order it delivers (docs/src/design.md#rule-1-7,
//! docs/src/design.md#rule-1-9): the words the engine's config, the scenario and the verdict
//! share.
//!
//! A leaf: it knows nothing of engines, brokers or scenarios.

use serde::{Deserialize, Serialize};

/// What an output promises (docs/src/design.md#rule-1-7). An output may declare only what it can
/// keep.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Promise {
    /// A write may be missing, only when its attempt ended `possibly_sent` or
    /// `sent_unconfirmed`; never a duplicate.
    AtMostOnce,
    /// Nothing missing; an extra copy only after a `possibly_sent` attempt or a crash, and only
    /// carrying the original's write key.
    #[default]
    AtLeastOnce,
    /// Nothing missing and no extra copy, after the destination's own deduplication.
    EffectivelyOnce,
}

impl Promise {
    pub fn name(self) -> &'static str {
        match self {
            Promise::AtMostOnce => "at_most_once",
            Promise::AtLeastOnce => "at_least_once",
            Promise::EffectivelyOnce => "effectively_once",
        }
    }

    /// How much the promise claims: at_most_once < at_least_once < effectively_once.
    pub fn rank(self) -> u8 {
        match self {
            Promise::AtMostOnce => 0,
            Promise::AtLeastOnce => 1,
            Promise::EffectivelyOnce => 2,
        }
    }
}

/// The order an output keeps (docs/src/design.md#rule-1-9).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// A refused write blocks those behind it until it is delivered or set aside.
    #[default]
    InOrder,
    /// Newer writes may overtake a refused one.
    Any,
}
