//! [`Located`]: what is wrong with one value of a scenario file, and where it is (line and
//! column). Every section's validator returns it — the scenario's own and a destination kind's
//! (`dest`) — and `scenario::parse` prints it as `file:line:column: message`. A leaf.

use serde_saphyr::Location;

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
