//! drill proves what a store-and-forward pipeline promises.
//!
//! It starts a real broker, puts a fault proxy in front of it, drives a store-and-forward
//! engine through a scripted outage, reads every record back from the broker and closes a
//! ledger: `held = delivered + waiting + failed + lost`. The parts follow
//! docs/src/design.md#2-parts, data flowing top to bottom: [`scenario`] (YAML → `Plan`) →
//! [`runner`] (one drill: [`dest`] provisions the destination kind's broker and [`proxy`] links,
//! [`sut`] starts the engine — [`engine`], or the user's — [`workload`] feeds it, the kind's
//! reader reads back) → [`report`] (judge the runner's facts, render them); [`diff`] compares two
//! runs' reports. Leaf modules carry the words they share: [`promise`], [`units`],
//! [`credentials`], [`seed`], [`located`], [`process`].

pub mod agent;
pub mod bench;
pub mod check;
pub mod cli;
pub mod clock;
pub mod container;
pub mod control;
pub mod credentials;
pub mod dest;
pub mod diff;
pub mod engine;
pub mod explore;
pub mod located;
pub mod powerfs;
pub mod process;
pub mod promise;
pub mod proxy;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod seed;
pub mod source;
pub mod sut;
pub mod tls;
pub mod units;
pub mod verify;
pub mod wire;
pub mod workload;
