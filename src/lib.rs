//! drill proves what a store-and-forward pipeline promises.
//!
//! It starts a real broker, puts a fault proxy in front of it, drives a store-and-forward
//! engine through a scripted outage, reads every record back from the broker and closes a
//! ledger: `held = delivered + waiting + failed + lost`. The parts follow DESIGN.md §2, one
//! module each, data flowing top to bottom: [`scenario`] → [`brokers`] → [`proxy`] →
//! [`engine`] (driven through [`sut`]) ← [`workload`]; [`verify`] reads back, [`report`] judges
//! and writes, [`runner`] plays one drill.

pub mod bench;
pub mod brokers;
pub mod container;
pub mod control;
pub mod engine;
pub mod mqtt;
pub mod powerfs;
pub mod proxy;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod sut;
pub mod verify;
pub mod workload;
