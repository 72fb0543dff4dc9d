//! `drill explore` (issue 44, being built): find a fault timeline nobody scripted that makes a
//! drill fail, and shrink it to the smallest drill that still fails the same way. The command
//! (`cli/explore.rs`) runs the timelines as `drill run` children; what is here is pure and
//! unit-tested against synthetic oracles and reports:
//!
//! | module | what it owns |
//! |---|---|
//! | [`timeline`] | a timeline: concrete faults, each a [`Choice`] of the scenario's [`Menu`] with its start and length; its `faults:` YAML |
//! | [`generate`] | timeline *i* of a seed: swarm-style, short, outages log-uniform over 1–30 s, biased to just after a heal and the drain, deterministic per (seed, i) |
//! | [`shrink`] | the shrinker: passes to a fixpoint, accepting only the same signature, new signatures kept as findings, flaky failures not shrunk, unresolved runs never a pass |
//! | [`menu`] | the base scenario without its faults, and every fault the validator takes on it |
//! | [`judge`] | a run's exit code and `report.json` → passes, fails {checks}, or unresolved |
//!
//! Not built yet (docs/src/design.md#8-explore): novelty guidance, the nightly job.

pub mod generate;
pub mod judge;
pub mod menu;
pub mod shrink;
pub mod timeline;

pub use timeline::{Choice, Fault, Menu, Timeline};
