//! The `drill` binary: the command line is `drill::cli` (exit codes in
//! docs/src/design.md#6-interfaces).

use std::process::ExitCode;

/// mimalloc, not glibc's malloc. The engine allocates on one thread what another frees (tokio's
/// workers take turns with a task; librdkafka's threads free what the producer was given), and
/// glibc then takes its slow path on nearly every allocation: a third of the engine's CPU
/// while draining a backlog to Kafka, by `perf` (docs/src/engine.md, "What durability costs"). Without
/// transparent huge pages (`no_thp`), which would make a small heap's RSS jump in 2 MB steps.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    drill::cli::main()
}
