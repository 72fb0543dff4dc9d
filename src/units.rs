//! The units a scenario writes as text: [`Dur`] (`500ms`, `2m30s`), [`Size`] (`64KB`),
//! [`Rate`] (`100/s`) and an expectation's [`Bound`] (`0`, `12` or `any`).
//!
//! This module owns their spelling — parsing, the JSON Schema pattern `drill schema` shows, and
//! how a duration is printed back. It is a leaf: it knows nothing of scenarios, and a value
//! that does not parse is an error message here, never a default.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

/// A duration written with a unit: `500ms`, `20s`, `5m`, `1h`, or a sum such as `2m30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn parse(text: &str) -> Result<Dur, String> {
        let hint = "write a number with a unit, e.g. 500ms, 20s, 5m or 1h";
        let s = text.trim();
        if s.is_empty() {
            return Err(format!("empty duration: {hint}"));
        }
        if s.starts_with('-') {
            return Err(format!("negative duration `{s}`: {hint}"));
        }
        let mut total = Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| format!("duration `{s}` has no unit: {hint}"))?;
            if digits == 0 {
                return Err(format!("invalid duration `{s}`: {hint}"));
            }
            let number: f64 = rest[..digits]
                .parse()
                .map_err(|_| format!("invalid number in duration `{s}`: {hint}"))?;
            let after = &rest[digits..];
            let unit_len = after
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(after.len());
            let seconds = match &after[..unit_len] {
                "ms" => number / 1000.0,
                "s" => number,
                "m" => number * 60.0,
                "h" => number * 3600.0,
                other => return Err(format!("unknown unit `{other}` in duration `{s}`: {hint}")),
            };
            total += Duration::from_secs_f64(seconds);
            rest = &after[unit_len..];
        }
        Ok(Dur(total))
    }
}

impl schemars::JsonSchema for Dur {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$",
            "description": "A duration with a unit: 500ms, 20s, 5m, 1h, or a sum such as 2m30s."
        })
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(60_000) && ms > 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Dur::parse(&text).map_err(de::Error::custom)
    }
}

/// A size in bytes written with a unit: `4096B`, `64KB`, `1MB` (binary: 1KB = 1024 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    /// The size `text` names, or `None` when it has no size unit (it may be something else:
    /// a rotation's `every` is a size or a time); `Some(Err)` when it has one and is no size.
    pub fn parse(text: &str) -> Option<Result<Size, String>> {
        let t = text.trim();
        [("KB", 1024u64), ("MB", 1 << 20), ("B", 1)]
            .into_iter()
            .find_map(|(suffix, scale)| {
                let n = t.strip_suffix(suffix)?;
                Some(
                    n.trim()
                        .parse::<u64>()
                        .ok()
                        .and_then(|n| n.checked_mul(scale))
                        .map(Size)
                        .ok_or_else(|| {
                            format!("`{text}` is no size: write e.g. 4096B, 64KB or 1MB")
                        }),
                )
            })
    }
}

impl schemars::JsonSchema for Size {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9]+ *(B|KB|MB)$",
            "description": "A size with a unit: 4096B, 64KB, 1MB (1KB = 1024 bytes)."
        })
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Size::parse(&text)
            .unwrap_or_else(|| {
                Err(format!(
                    "`{text}` has no unit: write e.g. 4096B, 64KB or 1MB"
                ))
            })
            .map_err(de::Error::custom)
    }
}

/// Records per second, written `100/s`, `6000/m` or a bare number (per second). Must be > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub f64);

impl Rate {
    pub fn parse(text: &str) -> Result<Rate, String> {
        let hint = "write a positive rate such as 100/s or 6000/m";
        let s = text.trim();
        let (number, per) = match s.split_once('/') {
            Some((n, unit)) => (n.trim(), unit.trim()),
            None => (s, "s"),
        };
        let n: f64 = number
            .parse()
            .map_err(|_| format!("invalid rate `{s}`: {hint}"))?;
        let per_second = match per {
            "s" => n,
            "m" => n / 60.0,
            "h" => n / 3600.0,
            other => return Err(format!("unknown rate unit `/{other}` in `{s}`: {hint}")),
        };
        if !per_second.is_finite() || per_second <= 0.0 {
            return Err(format!("rate `{s}` must be greater than zero: {hint}"));
        }
        Ok(Rate(per_second))
    }
}

impl schemars::JsonSchema for Rate {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Rate".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [
                { "type": "string", "pattern": "^ *[0-9]+(\\.[0-9]+)? *(/ *(s|m|h))? *$" },
                { "type": "number", "exclusiveMinimum": 0 }
            ],
            "description": "Records per unit of time, e.g. 200/s or 600/m (a bare number is per second)."
        })
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            Number(f64),
            Text(String),
        }
        let text = match Text::deserialize(deserializer)? {
            Text::Number(n) => n.to_string(),
            Text::Text(s) => s,
        };
        Rate::parse(&text).map_err(de::Error::custom)
    }
}

/// An expectation's bound on a count: at most `n` (`lost: 0`), or `any` (the check is off, said
/// on purpose: `undelivered: any` for a destination that is unreachable by design).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    AtMost(u64),
    Any,
}

impl Bound {
    /// The bound as a number, `None` for `any`.
    pub fn limit(self) -> Option<u64> {
        match self {
            Bound::AtMost(n) => Some(n),
            Bound::Any => None,
        }
    }
}

impl schemars::JsonSchema for Bound {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Bound".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "const": "any" }
            ],
            "description": "At most this many (0, 12), or `any` to turn the check off on purpose."
        })
    }
}

impl<'de> Deserialize<'de> for Bound {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Text {
            Number(u64),
            Text(String),
        }
        match Text::deserialize(deserializer)? {
            Text::Number(n) => Ok(Bound::AtMost(n)),
            Text::Text(s) if s.trim() == "any" => Ok(Bound::Any),
            Text::Text(s) => Err(de::Error::custom(format!(
                "`{s}` is no bound: write a count (0, 12) or `any`"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_rates() {
        assert_eq!(Dur::parse("2m30s").unwrap().0, Duration::from_secs(150));
        assert_eq!(Dur::parse("500ms").unwrap().0, Duration::from_millis(500));
        assert!(Dur::parse("5").is_err());
        assert!(Dur::parse("-5s").is_err());
        assert!(Dur::parse("5 parsecs").is_err());
        assert_eq!(Rate::parse("6000/m").unwrap().0, 100.0);
        assert!(Rate::parse("-5/s").is_err());
        assert!(Rate::parse("0/s").is_err());
    }
}
