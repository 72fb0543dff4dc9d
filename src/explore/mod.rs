//! `drill explore` (issue 44, being built): find a fault timeline nobody scripted that makes a
//! drill fail, and shrink it to the smallest drill that still fails the same way.
//!
//! Built so far, pure and unit-tested against synthetic oracles:
//!
//! | module | what it owns |
//! |---|---|
//! | [`timeline`] | a timeline: concrete faults, each a [`Choice`] of the scenario's [`Menu`] with its start and length; its `faults:` YAML |
//! | [`generate`] | timeline *i* of a seed: swarm-style, short, outages log-uniform over 1–30 s, biased to just after a heal and the drain, deterministic per (seed, i) |
//! | [`shrink`] | the shrinker: passes to a fixpoint, accepting only the same signature, new signatures kept as findings, flaky failures not shrunk, unresolved runs never a pass |
//!
//! Not built yet: the menu read from a scenario, the command, running and judging each
//! timeline with `drill run`'s runner, the report (docs/src/design.md marks explore planned).

pub mod generate;
pub mod menu;
pub mod shrink;
pub mod timeline;

pub use timeline::{Choice, Fault, Menu, Timeline};
