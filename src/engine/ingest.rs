//! The HTTP API: `POST /ingest` (NDJSON; answered only once the batch is on disk, with its
//! first sequence and count rather than every write key unless asked),
//! `GET /failed`, `POST /failed/replay`, and the disk check that refuses ingest when room runs
//! out (docs/src/design.md#rule-1-10). Never stores anything itself: the writer thread does.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::oneshot;

use super::Shared;
use super::failed::FailedStore;
use super::journal::ToOutput;
use super::output;
use super::writer::{IngestJob, WriterJob};

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

pub(super) fn disk_free(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// Disk is the only limit (docs/src/design.md#rule-1-10): warn once per crossing below the warning
/// level, and below the reserve refuse before storing anything.
pub(super) fn disk_check(shared: &Shared) -> Option<Response> {
    let free = disk_free(&shared.data_dir);
    let low = free < shared.disk.warn_below_bytes;
    if low != shared.disk_warned.swap(low, Ordering::SeqCst) {
        if low {
            eprintln!(
                "drill engine: warning: {free} bytes free on the data directory's disk, below {}; ingest will be refused below {}",
                shared.disk.warn_below_bytes, shared.disk.refuse_below_bytes
            );
        } else {
            eprintln!(
                "drill engine: disk space is back above {} bytes",
                shared.disk.warn_below_bytes
            );
        }
    }
    (free < shared.disk.refuse_below_bytes).then(|| {
        (
            StatusCode::INSUFFICIENT_STORAGE,
            Json(serde_json::json!({"error": format!(
                "disk full: {free} bytes free on {}, below the reserve of {} bytes; nothing was stored and nothing acknowledged; ingest resumes when space returns (nothing stored is ever evicted)",
                shared.data_dir.display(),
                shared.disk.refuse_below_bytes
            )})),
        )
            .into_response()
    })
}

/// The largest ingest request body: larger ones are answered 413 before anything is read.
pub const MAX_INGEST_BODY: usize = 16 * 1024 * 1024;
/// The largest record (one NDJSON line).
pub const MAX_RECORD: usize = 4 * 1024 * 1024;

/// Checks a batch before anything of it is stored: every line one JSON value, none too large.
/// The error names the first bad line (1-based, counting blank lines too).
pub fn check_batch(body: &str) -> Result<Vec<String>, (StatusCode, String)> {
    Ok(check_lines(body)?
        .into_iter()
        .map(|r| body[r].to_string())
        .collect())
}

/// [`check_batch`] without copying: where each record (a non-blank line, trimmed) lies in
/// `body`.
pub fn check_lines(body: &str) -> Result<Vec<Range<usize>>, (StatusCode, String)> {
    let mut lines = Vec::new();
    let mut at = 0;
    for (n, raw) in body.split_inclusive('\n').enumerate() {
        let start_of_line = at;
        at += raw.len();
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if line.len() > MAX_RECORD {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {}: a record of {} bytes, over the limit of {MAX_RECORD} bytes; nothing of this batch was stored",
                    n + 1,
                    line.len()
                ),
            ));
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(line) {
            return Err((
                StatusCode::BAD_REQUEST,
                format!(
                    "line {}: not JSON ({e}); send one JSON record per line (NDJSON); nothing of this batch was stored",
                    n + 1
                ),
            ));
        }
        let start = start_of_line + (raw.len() - raw.trim_start().len());
        lines.push(start..start + line.len());
    }
    Ok(lines)
}

/// The ingest answer: how many records were stored, and their write keys as the first sequence
/// and the key prefix (`<prefix><seq>` for each of `first_seq .. first_seq + accepted`, in the
/// order of the lines), plus the first and last key spelled out. `POST /ingest?write_keys=all`
/// also lists every key (`write_keys`), as earlier versions always did.
fn answer(prefix: &str, seqs: Range<u64>, all_keys: bool) -> serde_json::Value {
    let key = |seq: u64| format!("{prefix}{seq}");
    let mut answer = serde_json::json!({
        "accepted": seqs.end - seqs.start,
        "first_seq": seqs.start,
        "write_key_prefix": prefix,
        "first_key": key(seqs.start),
        "last_key": key(seqs.end.saturating_sub(1).max(seqs.start)),
    });
    if all_keys {
        answer["write_keys"] = seqs.map(key).collect::<Vec<_>>().into();
    }
    answer
}

pub(super) async fn ingest(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            let error = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!(
                    "request body over the limit of {MAX_INGEST_BODY} bytes; send smaller batches; nothing was stored"
                )
            } else {
                format!("{e}; nothing was stored")
            };
            return (status, Json(serde_json::json!({ "error": error }))).into_response();
        }
    };
    // Checked in place: the body is handed to the writer as received, never copied.
    let text = match std::str::from_utf8(&body) {
        Ok(text) => text,
        Err(e) => {
            let error = format!("request body is not UTF-8 ({e}); nothing was stored");
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({ "error": error })),
            )
                .into_response();
        }
    };
    let all_keys = query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|p| p == "write_keys=all"));
    let lines = match check_lines(text) {
        Ok(lines) => lines,
        Err((status, error)) => {
            return (status, Json(serde_json::json!({ "error": error }))).into_response();
        }
    };
    if lines.is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "empty body: send one record per line (NDJSON)"})),
        )
            .into_response();
    }
    'room: {
        let Some(refusal) = disk_check(&shared) else {
            break 'room;
        };
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::EvictOldestWhenFull) {
            // MUTANT: room is made by dropping the oldest waiting records, and the batch is
            // taken (docs/src/design.md#rule-1-10: never evict).
            mutant::evict_oldest(&shared, lines.len());
            break 'room;
        }
        return refusal;
    }
    let (reply, stored) = oneshot::channel();
    if shared
        .ingest
        .send(WriterJob::Ingest(IngestJob { body, lines, reply }))
        .await
        .is_err()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "engine is stopping").into_response();
    }
    match stored.await {
        Ok(Ok(seqs)) => Json(answer(&shared.key_prefix, seqs, all_keys)).into_response(),
        Ok(Err(e)) => (
            StatusCode::INSUFFICIENT_STORAGE,
            Json(serde_json::json!({"error": format!("not stored, nothing acknowledged: {e}")})),
        )
            .into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "engine is stopping").into_response(),
    }
}

/// `GET /failed`: every failed message of every output.
pub(super) async fn failed_list(
    State(shared): State<Arc<Shared>>,
) -> Json<Vec<output::FailedRecord>> {
    let names: Vec<String> = shared
        .outputs
        .lock()
        .map(|o| o.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    Json(
        names
            .iter()
            .flat_map(|n| FailedStore::current(&shared.data_dir, n).into_values())
            .collect(),
    )
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    #[serde(default)]
    key: Option<String>,
}

/// `POST /failed/replay` (`{"key": "..."}` for one, `{}` for all): back on the queue, same
/// write key.
pub(super) async fn failed_replay(
    State(shared): State<Arc<Shared>>,
    body: axum::body::Bytes,
) -> Response {
    let request: ReplayRequest = if body.is_empty() {
        ReplayRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(serde_json::json!({"error": format!("{e}; send {{\"key\":\"...\"}} or {{}}")})),
                )
                    .into_response();
            }
        }
    };
    let senders = shared
        .to_outputs
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    let mut replayed = Vec::new();
    for tx in senders {
        let (reply, answer) = oneshot::channel();
        if tx
            .send(ToOutput::Replay {
                key: request.key.clone(),
                reply,
            })
            .is_ok()
            && let Ok(keys) = answer.await
        {
            replayed.extend(keys);
        }
    }
    Json(serde_json::json!({ "replayed": replayed })).into_response()
}
