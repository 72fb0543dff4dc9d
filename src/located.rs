//! [`Located`]: what is wrong with one value of a scenario file, and where it is (line and
//! column). Every section's validator returns it — the scenario's own and a destination kind's
//! (`dest`) — and `scenario::parse` prints it as `file:line:column: message`. [`read`] turns
//! YAML text into a section's raw type with the same kind of error. A leaf.

use serde::de::DeserializeOwned;
use serde_saphyr::Location;
#[cfg(doc)]
use serde_saphyr::Spanned;

/// One error in a scenario file: where, and what (naming the field, saying what to write).
#[derive(Debug, Clone)]
pub struct Located {
    pub at: Location,
    pub message: String,
}

/// A [`Located`] error at `location`.
pub fn at(location: &Location, message: impl Into<String>) -> Located {
    Located {
        at: *location,
        message: message.into(),
    }
}

/// Reads YAML `text` as a `T`. An error keeps serde-saphyr's line and column
/// ([`Location::UNKNOWN`] when it has none) and names the field a bad value sits in
/// (serde_path_to_error's path, `workload.duration`, without the `.value` a [`Spanned`]
/// adds), unless serde's message names it already
/// (an unknown field).
pub fn read<T: DeserializeOwned>(text: &str) -> Result<T, Located> {
    let mut field = String::new();
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
            // A value kept with its place (`Spanned`) adds a `.value` of its own.
            field = e.path().to_string().replace(".value", "");
            e.into_inner()
        })
    })
    .map_err(|e| {
        let message = plain_message(&e);
        let message = if field.is_empty() || field == "." || message.contains("unknown field") {
            message
        } else {
            format!("field `{field}`: {message}")
        };
        Located {
            at: e.location().unwrap_or(Location::UNKNOWN),
            message,
        }
    })
}

/// serde-saphyr renders a snippet around the error; drill prints `file:line:col: message`, so
/// keep only the message.
fn plain_message(e: &serde_saphyr::Error) -> String {
    let full = e.to_string();
    let first = full.lines().next().unwrap_or("invalid scenario").trim();
    let message = first
        .strip_prefix("error: ")
        .unwrap_or(first)
        .trim()
        .to_string();
    // Drop a "line X column Y: " prefix or " at line X column Y" suffix: drill prints
    // `file:line:column:` itself.
    let message = match message.strip_prefix("line ") {
        Some(rest) => match rest.split_once(": ") {
            Some((pos, msg)) if pos.contains("column") => msg.to_string(),
            _ => message.clone(),
        },
        None => message,
    };
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message,
    }
}
