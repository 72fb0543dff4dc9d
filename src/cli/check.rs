//! `drill check FILE|DIR...` (validate without starting anything) and `drill schema` (the
//! scenario file's JSON Schema, generated from the types the parser reads).

use std::path::PathBuf;

use crate::scenario;

use super::{INVALID, PASS};

/// One line per file: `ok  FILE  (name)` or the `file:line:column: message` error; exit 2 if
/// any file is invalid.
pub fn check(paths: &[PathBuf]) -> u8 {
    let files = match super::scenario_files(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drill: {e}");
            return INVALID;
        }
    };
    let mut worst = PASS;
    for file in files {
        match scenario::load(&file) {
            Ok(plan) => println!(
                "ok    {}  ({}{})",
                file.display(),
                plan.name,
                if plan.tags.is_empty() {
                    String::new()
                } else {
                    format!("; tags: {}", plan.tags.join(", "))
                }
            ),
            Err(e) => {
                println!("error {e}");
                worst = INVALID;
            }
        }
    }
    worst
}

/// Prints the JSON Schema.
pub fn schema() -> u8 {
    match serde_json::to_string_pretty(&scenario::json_schema()) {
        Ok(text) => {
            use std::io::Write as _;
            // A closed pipe (`drill schema | head`) is not an error worth a panic.
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            PASS
        }
        Err(e) => {
            eprintln!("drill schema: {e}");
            super::INFRASTRUCTURE
        }
    }
}
