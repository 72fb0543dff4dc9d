//! drill's integration tests, one binary: each file of tests/ is a module here (its tests are
//! `<file>::<test>` to nextest and to `cargo test --test suite`), and the helpers they share are
//! in tests/common/. tests/fuzz.rs is its own target (Cargo.toml says why).

mod common;

mod agent;
mod amqp;
mod catalogue;
mod clock;
mod command_engine;
mod control_token;
mod diff;
mod drill_run;
mod engine_crash;
mod engine_depth;
mod engine_disk;
mod engine_errors;
mod engine_ingest;
mod engine_kafka;
mod engine_nats;
mod engine_outputs;
mod engine_refusals;
mod examples;
mod explore;
mod external;
mod http;
mod init;
mod kafka_codec;
mod kafka_links;
mod kind_contract;
mod mqtt_answers;
mod no_leftovers;
mod postgres;
mod powerfs;
mod probes_write_nothing;
mod proxy_faults;
mod proxy_udp;
mod remote_links;
mod reports;
mod scenario_schema;
mod shards;
mod sources;
mod syslog;
mod tls;
mod toxiproxy_api;
mod toxiproxy_clients;
mod verdict;
mod version;

/// With `autotests = false` a file added to tests/ is built only if it is a module here (or a
/// `[[test]]` of Cargo.toml): one left out would pass by never running.
#[test]
fn every_file_of_tests_is_built() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let suite = std::fs::read_to_string(root.join("tests/suite.rs")).unwrap();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "rs") || stem == "suite" {
            continue;
        }
        let target = format!("path = \"tests/{stem}.rs\"");
        if !suite.contains(&format!("\nmod {stem};")) && !manifest.contains(&target) {
            missing.push(stem.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{{{}}}.rs: neither a module of tests/suite.rs nor a [[test]] of Cargo.toml",
        missing.join(",")
    );
}
