//! Elasticsearch's `_bulk` format, both sides of it: the body the built-in engine writes and
//! the endpoint reads (NDJSON action/source pairs), and the answer the endpoint writes and the
//! engine reads — `200` for the request, with a status per item.
//!
//! A path that ends in `/_bulk` speaks it (`POST /logs/_bulk`, as Elasticsearch and OpenSearch
//! name it). Each item is an action line — `{"create":{"_id":"k"}}` or `{"index":{...}}` — and
//! the record's line after it; the document `_id` is the write key. The answer says, per item,
//! what a real cluster says:
//!
//! | item | status | the engine reads it as |
//! |---|---|---|
//! | stored | 201 (`created`) | delivered |
//! | `index` of an `_id` already stored | 200 (`updated`; no second copy) | delivered |
//! | `create` of an `_id` already stored | 409 (`version_conflict_engine_exception`) | delivered: the document is there |
//! | rejected for now (a destination fault) | 429 (`es_rejected_execution_exception`), 500, 503 | the destination is away: resent, no attempt spent |
//! | refused (a destination fault, a poison record) | 400, 413, 422 | refused and counted |
//!
//! Elasticsearch answers `200` whatever its items say (`errors: true` when one failed): an
//! engine that reads only the top-level status loses every item it was told was rejected.

use serde_json::{Value, json};

/// Whether a path speaks `_bulk`.
pub fn is_bulk(path: &str) -> bool {
    path.ends_with("/_bulk")
}

/// The index a `/{index}/_bulk` path names (`drill` for a bare `/_bulk`).
pub fn index_of(path: &str) -> &str {
    path.strip_suffix("/_bulk")
        .and_then(|p| p.rsplit('/').next())
        .filter(|i| !i.is_empty())
        .unwrap_or("drill")
}

/// One record in a `_bulk` body, as the engine writes it: `create` with the write key as the
/// document `_id` (a repeat is answered 409, never stored twice), then the record's line.
pub fn item(key: &str, data: &[u8], into: &mut Vec<u8>) {
    let action = json!({ "create": { "_id": key } });
    into.extend_from_slice(action.to_string().as_bytes());
    into.push(b'\n');
    into.extend_from_slice(data);
    into.push(b'\n');
}

/// What an item's status means to a writer (the table of the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemStatus {
    /// Stored, or already there (a 409 on `create`).
    Stored,
    /// Rejected for now: 429, 5xx, or another status that says "not now".
    NotNow(u16),
    /// This record refused: 400, 413, 422 and the other 4xx about the record.
    Refused(u16),
}

/// What one item status says, for an item written with `create`.
pub fn item_status(status: u16) -> ItemStatus {
    match status {
        200..=299 | 409 => ItemStatus::Stored,
        408 | 429 | 500..=599 => ItemStatus::NotNow(status),
        _ => ItemStatus::Refused(status),
    }
}

/// The item statuses of a `_bulk` answer, in the order of the request's items. `Err` when the
/// answer is not one (the engine cannot tell what was stored).
pub fn read_answer(body: &[u8]) -> Result<Vec<u16>, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the _bulk answer is no JSON: {e}"))?;
    let items = v
        .get("items")
        .and_then(Value::as_array)
        .ok_or("the _bulk answer has no `items`")?;
    items
        .iter()
        .map(|item| {
            item.as_object()
                .and_then(|o| o.values().next())
                .and_then(|r| r.get("status"))
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| format!("a _bulk answer item without a status: {item}"))
        })
        .collect()
}

/// One action of a `_bulk` request as the endpoint read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action<'a> {
    /// `create`, `index`, `update` or `delete`.
    pub op: String,
    pub id: Option<String>,
    pub index: Option<String>,
    /// The record's line (`None` for a `delete`).
    pub source: Option<&'a [u8]>,
}

/// The actions of a `_bulk` body (its non-empty lines, in pairs but for `delete`). `Err`: the
/// body is not a `_bulk` body, and the whole request is answered 400.
pub fn read_request<'a>(lines: &[&'a [u8]]) -> Result<Vec<Action<'a>>, String> {
    let mut actions = Vec::new();
    let mut rest = lines.iter();
    while let Some(line) = rest.next() {
        let v: Value = serde_json::from_slice(line).map_err(|e| {
            format!(
                "an action line is no JSON ({e}): {}",
                String::from_utf8_lossy(line)
            )
        })?;
        let (op, meta) = v
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next())
            .filter(|(op, _)| matches!(op.as_str(), "create" | "index" | "update" | "delete"))
            .ok_or_else(|| {
                format!("an action line names no create, index, update or delete: {v}")
            })?;
        let text = |name: &str| meta.get(name).and_then(Value::as_str).map(str::to_string);
        let source = if op == "delete" {
            None
        } else {
            Some(
                *rest
                    .next()
                    .ok_or_else(|| format!("the `{op}` action at the end has no source line"))?,
            )
        };
        actions.push(Action {
            op: op.clone(),
            id: text("_id"),
            index: text("_index"),
            source,
        });
    }
    Ok(actions)
}

/// One item of the answer: `{"create": {"_index", "_id", "status", "result" | "error"}}`.
pub fn answer_item(op: &str, index: &str, id: &str, status: u16) -> Value {
    let mut r = json!({ "_index": index, "_id": id, "status": status });
    match status {
        201 => r["result"] = "created".into(),
        200 => r["result"] = "updated".into(),
        _ => {
            let (kind, reason) = match status {
                409 => (
                    "version_conflict_engine_exception",
                    "document already exists",
                ),
                429 => (
                    "es_rejected_execution_exception",
                    "rejected execution (drill's destination fault)",
                ),
                400 if op != "create" && op != "index" => (
                    "illegal_argument_exception",
                    "drill's endpoint takes create and index",
                ),
                413 | 422 | 400 => ("mapper_parsing_exception", "the document was refused"),
                _ => ("exception", "drill's destination fault"),
            };
            r["error"] = json!({ "type": kind, "reason": reason });
        }
    }
    json!({ op: r })
}

/// The whole answer: `took`, `errors` (any item not 2xx), `items`.
pub fn answer(items: Vec<Value>) -> Value {
    let errors = items.iter().any(|i| {
        i.as_object()
            .and_then(|o| o.values().next())
            .and_then(|r| r.get("status"))
            .and_then(Value::as_u64)
            .is_none_or(|s| !(200..300).contains(&s))
    });
    json!({ "took": 0, "errors": errors, "items": items })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_s_body_reads_back_as_the_endpoint_s_actions() {
        let mut body = Vec::new();
        item("k1", br#"{"id":"a"}"#, &mut body);
        item("k2", br#"{"id":"b"}"#, &mut body);
        let lines: Vec<&[u8]> = body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
        let actions = read_request(&lines).unwrap();
        assert_eq!(actions.len(), 2);
        assert_eq!(actions[1].op, "create");
        assert_eq!(actions[1].id.as_deref(), Some("k2"));
        assert_eq!(actions[1].source, Some(&br#"{"id":"b"}"#[..]));
        let d: Vec<&[u8]> = vec![br#"{"delete":{"_id":"x"}}"#, br#"{"index":{}}"#, b"{}"];
        let actions = read_request(&d).unwrap();
        assert_eq!((actions[0].source, actions[1].id.clone()), (None, None));
        assert!(read_request(&[b"{\"create\":{}}"]).is_err(), "no source line");
        assert!(read_request(&[b"{\"upsert\":{}}", b"{}"]).is_err());
        assert!(read_request(&[b"not json"]).is_err());
    }

    #[test]
    fn the_endpoint_s_answer_reads_back_item_by_item() {
        let items = vec![
            answer_item("create", "drill", "k1", 201),
            answer_item("create", "drill", "k2", 429),
            answer_item("create", "drill", "k3", 409),
            answer_item("create", "drill", "k4", 400),
        ];
        let a = answer(items);
        assert_eq!(a["errors"], true);
        let statuses = read_answer(a.to_string().as_bytes()).unwrap();
        assert_eq!(statuses, [201, 429, 409, 400]);
        let read: Vec<ItemStatus> = statuses.into_iter().map(item_status).collect();
        assert_eq!(
            read,
            [
                ItemStatus::Stored,
                ItemStatus::NotNow(429),
                ItemStatus::Stored,
                ItemStatus::Refused(400)
            ]
        );
        assert_eq!(answer(vec![answer_item("index", "i", "k", 201)])["errors"], false);
        assert!(read_answer(b"{}").is_err() && read_answer(b"<html>").is_err());
        assert_eq!((index_of("/logs/_bulk"), index_of("/_bulk")), ("logs", "drill"));
        assert!(is_bulk("/x/_bulk") && !is_bulk("/ingest"));
    }
}
