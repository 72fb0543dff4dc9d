//! The HTTP endpoint drill hosts, and its read-back: the receiving side as the oracle.
//!
//! `POST {path}`: each non-empty line of the body (JSON or NDJSON) is stored as one copy, with
//! the request's headers and the instant it arrived. With `dedupe`, a write key (the
//! `key_header` header) already stored is answered `200` and not stored again — as real APIs
//! do it ([`Dedupe`]): `atomic` (the key stored with the write), `conflict` (and a `409` to a
//! key still in flight) or `racy` (check then insert: the key is stored only when the answer
//! ends — answered, or given up by the client — so copies sent while it is open are all stored).
//!
//! **One open attempt per write key** is judged here: a request that arrives while an earlier
//! request with the same key is unanswered *and its connection still open* is an overlapping
//! attempt, counted by key. An attempt is open from its arrival until its answer is handed to
//! the connection, or until the client closes the connection (hyper then drops the request's
//! future, and with it the attempt's guard): an engine that gave up on an attempt and closed
//! it before resending overlaps nothing. A record (a
//! line) larger than the drill's message limit (a poison record) makes its request answered
//! `422` and not stored, while every other write is taken; the limit is per record, so a
//! batch of many small records is taken whatever its size. `HEAD {path}` answers `200`: the engine's data-free probe.
//!
//! A destination fault ([`AnswerFault`]) changes the answers for a window: a status (nothing
//! stored; a probe gets it too), or a late answer to each write (stored at once, answered
//! after the delay; a probe is answered at once, as a fast front end answers its health check).
//! The listener sets `TCP_NODELAY` on every connection: an answer split across two writes
//! would stall a keep-alive client on Nagle and delayed ACK.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{Dedupe, Http, bulk};
use crate::dest::running::Place;
use crate::dest::{
    AnswerControl, AnswerFault, DestError, Destination, Provision, Provisioned, ReadBack,
    ReaderSpec, Running,
};
use crate::proxy::Link;
use crate::verify::{Decoder, Received};

/// One stored copy: a line of a body, the request's headers, when it arrived.
struct Copy {
    line: Bytes,
    headers: Arc<Vec<(String, String)>>,
    at: Instant,
}

/// What the endpoint holds and how it answers now.
pub struct Store {
    path: String,
    /// The path ends in `/_bulk`: bodies are Elasticsearch `_bulk` requests ([`bulk`]).
    bulk: bool,
    dedupe: Dedupe,
    key_header: String,
    /// Bodies larger than this are answered 422 (poison records).
    message_limit: Option<usize>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    copies: Vec<Copy>,
    /// Write keys stored (with `dedupe`).
    keys: HashSet<String>,
    /// Requests in flight, by write key: arrived, not answered, connection open (their ids).
    open: HashMap<String, Vec<u64>>,
    /// The next request's id.
    next_attempt: u64,
    /// Write keys of requests that arrived while one with the same key was open.
    overlaps: Vec<String>,
    /// Requests answered `409` (`dedupe: conflict`).
    conflicts: u64,
    fault: Option<AnswerFault>,
    /// Records written while a `reject` fault is on (whose turn it is to be refused).
    reject_turn: u64,
    /// Records a `reject` fault refused for good (400, 413, 422): withheld, never stored;
    /// the verdict expects them failed unless a later write stored them.
    refused_by_fault: Vec<Copy>,
    /// `_bulk`: document ids stored.
    docs: HashSet<String>,
    /// Counts for the report: writes answered by a fault, repeats recognised, poison refused.
    by_fault: u64,
    repeats: u64,
    refused: u64,
}

impl Store {
    /// An endpoint's store: writes POSTed to `path`, the write key in `key_header`, repeats
    /// recognised with `dedupe`, bodies over `message_limit` refused (422).
    pub fn new(
        path: &str,
        dedupe: Dedupe,
        key_header: &str,
        message_limit: Option<usize>,
    ) -> Store {
        Store {
            path: path.to_string(),
            bulk: bulk::is_bulk(path),
            dedupe,
            key_header: key_header.to_ascii_lowercase(),
            message_limit,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Every line stored so far, as text.
    pub fn lines(&self) -> Vec<String> {
        self.lock()
            .copies
            .iter()
            .map(|c| String::from_utf8_lossy(&c.line).into_owned())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the endpoint did, for the report's notes.
    pub fn summary(&self) -> String {
        let inner = self.lock();
        format!(
            "HTTP endpoint{}: {} copies stored, {} repeats recognised (dedupe {}), {} writes answered by a destination fault ({} of them refused for good), {} refused (422), {} overlapping attempts, {} answered 409 (a key in flight)",
            if self.bulk { " (_bulk)" } else { "" },
            inner.copies.len(),
            inner.repeats,
            if self.bulk { "by document _id" } else { self.dedupe.name() },
            inner.by_fault,
            inner.refused_by_fault.len(),
            inner.refused,
            inner.overlaps.len(),
            inner.conflicts
        )
    }
}

impl AnswerControl for Store {
    fn set(&self, fault: Option<AnswerFault>) {
        let mut inner = self.lock();
        inner.fault = fault;
        inner.reject_turn = 0;
    }
}

impl Inner {
    /// Under a `reject` fault, the status this record is refused with when it is its turn:
    /// exactly the fault's share of the records, counted in the order they arrive.
    fn rejects_next(&mut self) -> Option<u16> {
        let Some(AnswerFault::Reject {
            code, per_million, ..
        }) = self.fault
        else {
            return None;
        };
        let turn = self.reject_turn;
        self.reject_turn += 1;
        crate::dest::rejects_turn(turn, per_million).then_some(code)
    }

    /// A record a `reject` fault answered `status`: counted, and kept apart when refused for
    /// good.
    fn rejected(&mut self, status: u16, copy: Copy) {
        self.by_fault += 1;
        if matches!(bulk::item_status(status), bulk::ItemStatus::Refused(_)) {
            self.refused_by_fault.push(copy);
        }
    }
}

/// The store of the endpoint a drill runs, from its [`Running`].
pub fn store_of(at: &Running) -> Option<Arc<Store>> {
    match &at.place {
        Place::InProcess(any) => any.downcast_ref::<Hosted>().map(|h| h.store.clone()),
        _ => None,
    }
}

/// The endpoint while it runs; dropping it stops it.
pub struct Hosted {
    store: Arc<Store>,
    stop: CancellationToken,
}

impl Drop for Hosted {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the endpoint on a free 127.0.0.1 port and puts the link in front of it.
pub(super) async fn provision(
    dest: Arc<dyn Destination>,
    http: &Http,
    p: Provision<'_>,
) -> Result<Provisioned, DestError> {
    crate::dest::check_broker_faults(&p.needs, false, 1)?;
    let store = Arc::new(Store::new(
        &http.path,
        http.dedupe,
        &http.key_header,
        p.needs.message_limit,
    ));
    let (addr, stop) = serve(store.clone()).await?;
    let hosted = Hosted {
        store: store.clone(),
        stop,
    };
    let version = if store.bulk {
        format!(
            "drill's HTTP endpoint (Elasticsearch _bulk at POST {}, one copy per document _id)",
            http.path
        )
    } else {
        format!(
            "drill's HTTP endpoint (POST {}, dedupe {})",
            http.path,
            http.dedupe.name()
        )
    };
    let mut running = Running::new(
        dest,
        vec![addr],
        "embedded",
        version,
        Place::InProcess(Box::new(hosted)),
    );
    running.answers = Some(store as Arc<dyn AnswerControl>);
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let link = Link::start(&p.spec.link_name(), any, addr, p.links.clone()).await?;
    Ok(Provisioned {
        links: vec![link],
        running,
        notes: Vec::new(),
    })
}

/// Serves `store` on a free 127.0.0.1 port until the token is cancelled.
pub async fn serve(store: Arc<Store>) -> std::io::Result<(SocketAddr, CancellationToken)> {
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let path = store.path.clone();
    let app = axum::Router::new()
        .route(&path, axum::routing::any(answer))
        .with_state(store);
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stopped.cancelled_owned())
            .await;
    });
    Ok((addr, stop))
}

/// One request: a write (`POST`), a probe (`HEAD`, `GET`), or another method (405).
async fn answer(
    State(store): State<Arc<Store>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arrived = Instant::now();
    let key = (method == Method::POST)
        .then(|| store.key_of(&headers))
        .flatten();
    // Open from now until the answer is handed over, or the client closes the connection
    // (the future is dropped, and the guard with it).
    let mut attempt = key.as_ref().map(|k| Attempt::open(&store, k));
    let fault = store.lock().fault;
    let late = match fault {
        Some(AnswerFault::Status { code, retry_after }) => {
            if method == Method::POST {
                store.lock().by_fault += 1;
            }
            return status(code, retry_after);
        }
        Some(AnswerFault::After(d)) => Some(d),
        Some(AnswerFault::Reject { .. } | AnswerFault::Broker { .. }) | None => None,
    };
    if store.dedupe == Dedupe::Conflict && attempt.as_ref().is_some_and(|a| a.overlapped) {
        store.lock().conflicts += 1;
        return StatusCode::CONFLICT.into_response();
    }
    let result = match method {
        Method::POST if store.bulk => {
            let answer = bulk_write(&store, &headers, body, arrived);
            if let Some(d) = late {
                tokio::time::sleep(d).await;
            }
            return answer;
        }
        Method::POST => store_write(&store, key.as_deref(), &headers, body, arrived),
        Method::HEAD | Method::GET => StatusCode::OK,
        _ => StatusCode::METHOD_NOT_ALLOWED,
    };
    // `racy`: the key is stored only when this attempt ends — answered, or given up by the
    // client — so copies that came while it was open were stored too.
    if store.dedupe == Dedupe::Racy
        && result == StatusCode::OK
        && let Some(a) = attempt.as_mut()
    {
        a.insert_key_at_end = true;
    }
    // Only writes are slow (a slow commit behind a fast front end): the probe is answered at
    // once.
    if let Some(d) = late.filter(|_| method == Method::POST) {
        tokio::time::sleep(d).await;
    }
    drop(attempt);
    result.into_response()
}

/// How long an earlier attempt must still be open after a write with its key arrived for the
/// write to count as overlapping: an engine that closed the earlier attempt just before it
/// resent (its close still crossing the link) overlaps nothing; one that keeps two open does
/// for seconds.
const OVERLAP_GRACE: Duration = Duration::from_millis(250);

/// One request with a write key, open while its guard lives.
struct Attempt {
    store: Arc<Store>,
    key: String,
    id: u64,
    /// Another request with the key was open when this one arrived.
    overlapped: bool,
    /// `racy`: the key goes into the store when the attempt ends.
    insert_key_at_end: bool,
}

impl Attempt {
    /// Opens a request; when others with its key are open, checks [`OVERLAP_GRACE`] later
    /// whether any still is, and counts an overlap if so.
    fn open(store: &Arc<Store>, key: &str) -> Attempt {
        let mut inner = store.lock();
        let id = inner.next_attempt;
        inner.next_attempt += 1;
        let open = inner.open.entry(key.to_string()).or_default();
        let earlier = open.clone();
        open.push(id);
        drop(inner);
        let overlapped = !earlier.is_empty();
        if overlapped {
            let (store, key) = (store.clone(), key.to_string());
            tokio::spawn(async move {
                tokio::time::sleep(OVERLAP_GRACE).await;
                let mut inner = store.lock();
                let still = inner
                    .open
                    .get(&key)
                    .is_some_and(|o| o.iter().any(|a| earlier.contains(a)));
                if still {
                    inner.overlaps.push(key);
                }
            });
        }
        Attempt {
            store: store.clone(),
            key: key.to_string(),
            id,
            overlapped,
            insert_key_at_end: false,
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let mut inner = self.store.lock();
        if self.insert_key_at_end {
            inner.keys.insert(self.key.clone());
        }
        if let Some(open) = inner.open.get_mut(&self.key) {
            open.retain(|a| *a != self.id);
            if open.is_empty() {
                inner.open.remove(&self.key);
            }
        }
    }
}

impl Store {
    fn key_of(&self, headers: &HeaderMap) -> Option<String> {
        headers
            .get(self.key_header.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

fn status(code: u16, retry_after: Option<Duration>) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    match retry_after {
        Some(r) => (code, [("retry-after", r.as_secs().to_string())]).into_response(),
        None => code.into_response(),
    }
}

/// The body's records: its non-empty lines (one for a JSON body, one per line for NDJSON).
fn records(body: &Bytes) -> Vec<Bytes> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (i, b) in body
        .iter()
        .copied()
        .enumerate()
        .chain([(body.len(), b'\n')])
    {
        if b == b'\n' {
            let line = body.slice(start..i);
            start = i + 1;
            if !line.iter().all(u8::is_ascii_whitespace) {
                lines.push(line);
            }
        }
    }
    lines
}

/// Stores one POST's records (or recognises a repeat, or refuses a poison record). A record
/// over the message limit is poison: the request holding it is answered 422 and nothing of it
/// is stored — one answer cannot take some records of a batch and refuse others. The limit is
/// per record, not per body: a batch of many small records is taken.
fn store_write(
    store: &Store,
    key: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
    at: Instant,
) -> StatusCode {
    let lines = records(&body);
    if let Some(limit) = store.message_limit
        && lines.iter().any(|l| l.len() > limit)
    {
        store.lock().refused += 1;
        return StatusCode::UNPROCESSABLE_ENTITY;
    }
    let kept = Arc::new(kept_headers(headers));
    let mut inner = store.lock();
    if let Some(status) = inner.rejects_next() {
        for line in lines {
            let copy = Copy {
                line,
                headers: kept.clone(),
                at,
            };
            inner.rejected(status, copy);
        }
        return StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    }
    if let Some(key) = key {
        let repeat = match store.dedupe {
            Dedupe::Off => false,
            // The key goes in with the write.
            Dedupe::Atomic | Dedupe::Conflict => !inner.keys.insert(key.to_string()),
            // Checked now, stored with the answer (see `answer`).
            Dedupe::Racy => inner.keys.contains(key),
        };
        if repeat {
            inner.repeats += 1;
            return StatusCode::OK;
        }
    }
    for line in lines {
        inner.copies.push(Copy {
            line,
            headers: kept.clone(),
            at,
        });
    }
    StatusCode::OK
}

/// A request's headers, kept with each copy (the decoder reads a write key from them).
fn kept_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect()
}

/// One `_bulk` request ([`bulk`]): each item stored, recognised by its `_id`, refused (poison,
/// or a `reject` fault's turn: withheld, never stored) or answered 400 (an action the endpoint
/// does not take), and the answer `200` with a status per item. A body that is no `_bulk`
/// request is answered 400 whole and nothing of it is stored. Each copy keeps its document
/// `_id` as a header named `_id`, where the decoder reads the write key.
fn bulk_write(store: &Store, headers: &HeaderMap, body: Bytes, at: Instant) -> Response {
    let lines = records(&body);
    let refs: Vec<&[u8]> = lines.iter().map(|l| l.as_ref()).collect();
    let actions = match bulk::read_request(&refs) {
        Ok(a) => a,
        Err(why) => {
            let error = serde_json::json!({
                "error": { "type": "illegal_argument_exception", "reason": why },
                "status": 400
            });
            return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
        }
    };
    let kept = kept_headers(headers);
    let default_index = bulk::index_of(&store.path);
    let mut inner = store.lock();
    let mut items = Vec::with_capacity(actions.len());
    for a in actions {
        let index = a.index.as_deref().unwrap_or(default_index);
        let id = a
            .id
            .clone()
            .unwrap_or_else(|| format!("drill-{}", inner.copies.len()));
        let item = |status| bulk::answer_item(&a.op, index, &id, status);
        let source = match a.source {
            Some(s) if a.op == "create" || a.op == "index" => s,
            _ => {
                items.push(item(400));
                continue;
            }
        };
        let mut with_id = kept.clone();
        with_id.push(("_id".to_string(), id.clone()));
        let copy = Copy {
            line: body.slice_ref(source),
            headers: Arc::new(with_id),
            at,
        };
        if store.message_limit.is_some_and(|l| source.len() > l) {
            inner.refused += 1;
            items.push(item(400));
            continue;
        }
        if let Some(status) = inner.rejects_next() {
            inner.rejected(status, copy);
            items.push(item(status));
            continue;
        }
        if a.id.is_some() && !inner.docs.insert(id.clone()) {
            inner.repeats += 1;
            items.push(item(if a.op == "create" { 409 } else { 200 }));
            continue;
        }
        inner.copies.push(copy);
        items.push(item(201));
    }
    axum::Json(bulk::answer(items)).into_response()
}

/// The read-back: what the endpoint stored, decoded when the drill ends.
pub struct Reader {
    store: Arc<Store>,
    decoder: Decoder,
    t0: Instant,
}

impl Reader {
    pub fn new(store: Arc<Store>, r: ReaderSpec) -> Reader {
        Reader {
            store,
            decoder: r.decoder,
            t0: r.t0,
        }
    }
}

impl ReadBack for Reader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        let n = self.store.lock().copies.len();
        async move { Some(n) }.boxed()
    }

    fn finish(self: Box<Self>, _addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let mut received = Received::default();
            let inner = self.store.lock();
            received.overlapping_keys = Some(inner.overlaps.clone());
            let mut refused = Received::default();
            for copy in &inner.refused_by_fault {
                let meta = |name: &str| header(copy, name);
                let at = copy.at.saturating_duration_since(self.t0);
                self.decoder.add(&copy.line, meta, at, &mut refused);
            }
            received.refused_by_destination =
                refused.arrivals.into_iter().filter_map(|a| a.id).collect();
            for copy in &inner.copies {
                let meta = |name: &str| header(copy, name);
                let at = copy.at.saturating_duration_since(self.t0);
                self.decoder.add(&copy.line, meta, at, &mut received);
            }
            received
        }
        .boxed()
    }
}

/// A header kept with a copy, by name.
fn header(copy: &Copy, name: &str) -> Option<String> {
    copy.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dedupe: Dedupe, limit: Option<usize>) -> Arc<Store> {
        Arc::new(Store::new("/in", dedupe, "Idempotency-Key", limit))
    }

    async fn post(
        client: &reqwest::Client,
        addr: SocketAddr,
        key: &str,
        body: &str,
    ) -> reqwest::Response {
        client
            .post(format!("http://{addr}/in"))
            .header("Idempotency-Key", key)
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Real sockets: NDJSON lines stored one copy each; with dedupe a repeated key is answered
    /// 200 and not stored; a poison body 422; a status fault answers writes and probes and
    /// stores nothing; a late answer stores at once.
    #[tokio::test]
    async fn the_endpoint_stores_recognises_refuses_and_obeys_its_faults() {
        let s = store(Dedupe::Atomic, Some(100));
        let (addr, stop) = serve(s.clone()).await.unwrap();
        let client = reqwest::Client::new();
        assert_eq!(
            post(&client, addr, "k1", "{\"id\":1}\n{\"id\":2}\n")
                .await
                .status(),
            200
        );
        assert_eq!(post(&client, addr, "k1", "{\"id\":1}").await.status(), 200);
        assert_eq!(s.lock().copies.len(), 2, "the repeat is not stored");
        assert_eq!(s.lock().repeats, 1);
        let poison = "x".repeat(101);
        assert_eq!(post(&client, addr, "k2", &poison).await.status(), 422);
        // The limit is per record: a batch of small records over 100 bytes in all is taken,
        // one holding a poison line is refused whole.
        let small = "{\"id\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}\n".repeat(4);
        assert!(small.len() > 100);
        assert_eq!(post(&client, addr, "k5", &small).await.status(), 200);
        assert_eq!(
            post(&client, addr, "k6", &format!("{small}{poison}\n"))
                .await
                .status(),
            422
        );
        assert_eq!(s.lock().copies.len(), 6, "4 small records stored, the poison batch not");
        assert_eq!(s.lock().refused, 2);
        s.set(Some(AnswerFault::Status {
            code: 503,
            retry_after: Some(Duration::from_secs(7)),
        }));
        let r = post(&client, addr, "k3", "{\"id\":3}").await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "7");
        let probe = client
            .head(format!("http://{addr}/in"))
            .send()
            .await
            .unwrap();
        assert_eq!(probe.status(), 503);
        s.set(Some(AnswerFault::After(Duration::from_millis(300))));
        let started = Instant::now();
        let late = post(&client, addr, "k4", "{\"id\":4}");
        let (r, stored_before) = tokio::join!(late, async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            s.lock().copies.len()
        });
        assert_eq!(r.status(), 200);
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(stored_before, 7, "stored before the late answer");
        s.set(None);
        assert_eq!(
            client
                .head(format!("http://{addr}/in"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        stop.cancel();
    }

    /// A raw HTTP/1.1 POST on its own connection, left open (the answer is not read).
    async fn post_raw(addr: SocketAddr, key: &str, id: u32) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let body = format!("{{\"id\":{id}}}");
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /in HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c
    }

    /// Waits until the endpoint has seen `n` requests with their key open (or 2 s).
    async fn until_open(s: &Store, key: &str, n: u32) {
        for _ in 0..200 {
            if s.lock().open.get(key).map_or(0, |o| o.len() as u32) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{key} never had {n} open attempts");
    }

    /// One open attempt per write key, on real sockets: a second request while the first is
    /// unanswered and its connection open is an overlap; one sent after the client closed the
    /// first is not. `conflict` answers the overlap 409; `racy` stores both copies.
    #[tokio::test]
    async fn a_second_attempt_while_the_first_is_open_is_an_overlap() {
        for dedupe in [Dedupe::Atomic, Dedupe::Conflict, Dedupe::Racy] {
            let s = store(dedupe, None);
            let (addr, stop) = serve(s.clone()).await.unwrap();
            s.set(Some(AnswerFault::After(Duration::from_millis(800))));
            // Closed first: the client gave up and hung up before sending again.
            let first = post_raw(addr, "k1", 1).await;
            until_open(&s, "k1", 1).await;
            drop(first);
            for _ in 0..200 {
                if !s.lock().open.contains_key("k1") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(
                !s.lock().open.contains_key("k1"),
                "{dedupe:?}: a closed connection ends the attempt"
            );
            let again = post_raw(addr, "k1", 1).await;
            until_open(&s, "k1", 1).await;
            assert!(s.lock().overlaps.is_empty(), "{dedupe:?}: no overlap");
            // Open first: the second request overlaps it.
            let a = post_raw(addr, "k2", 2).await;
            until_open(&s, "k2", 1).await;
            let b = post_raw(addr, "k2", 2).await;
            tokio::time::sleep(Duration::from_millis(1200)).await;
            assert_eq!(s.lock().overlaps, ["k2"], "{dedupe:?}");
            let stored = |id: &str| {
                s.lines()
                    .iter()
                    .filter(|l| l.contains(&format!("\"id\":{id}")))
                    .count()
            };
            // The resend after the client gave up the first is recognised in every mode
            // (`racy` stored the key when that attempt ended).
            assert_eq!(stored("1"), 1, "{dedupe:?}");
            match dedupe {
                Dedupe::Atomic => assert_eq!(stored("2"), 1),
                Dedupe::Conflict => {
                    assert_eq!((stored("2"), s.lock().conflicts), (1, 1));
                }
                // Check then insert: both requests found the key absent and stored.
                _ => assert_eq!(stored("2"), 2),
            }
            drop((again, a, b));
            stop.cancel();
        }
    }

    /// A `_bulk` endpoint on real sockets: items stored once per `_id` (a repeated `create`
    /// answered 409, a repeated `index` 200, neither stored again), a `reject` fault refusing
    /// exactly its share in arrival order inside a 200 — withheld, the 400s kept apart for the
    /// verdict — a poison item 400, an action it does not take 400, a body that is no `_bulk`
    /// request 400 whole.
    #[tokio::test]
    async fn a_bulk_endpoint_answers_item_by_item() {
        let s = Arc::new(Store::new("/logs/_bulk", Dedupe::Atomic, "_id", Some(100)));
        let (addr, stop) = serve(s.clone()).await.unwrap();
        let client = reqwest::Client::new();
        let bulk = |body: String| {
            let request = client.post(format!("http://{addr}/logs/_bulk")).body(body);
            async move {
                let r = request.send().await.unwrap();
                let status = r.status().as_u16();
                let v: serde_json::Value = r.json().await.unwrap();
                (status, v)
            }
        };
        let items = |v: &serde_json::Value| -> Vec<u64> {
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_object().unwrap().values().next().unwrap()["status"].as_u64().unwrap())
                .collect()
        };
        let pair = |op: &str, id: u32| format!("{{\"{op}\":{{\"_id\":\"k{id}\"}}}}\n{{\"id\":\"r{id}\"}}\n");
        let (status, v) = bulk(format!("{}{}{}", pair("create", 1), pair("index", 2), pair("create", 1))).await;
        assert_eq!((status, items(&v)), (200, vec![201, 201, 409]));
        assert_eq!(v["errors"], true);
        let (_, v) = bulk(pair("index", 2)).await;
        assert_eq!(items(&v), [200]);
        assert_eq!(s.lock().copies.len(), 2, "one copy per _id");
        let poison = format!("{{\"create\":{{\"_id\":\"p\"}}}}\n{}\n{{\"delete\":{{\"_id\":\"k1\"}}}}\n", "x".repeat(101));
        let (_, v) = bulk(poison).await;
        assert_eq!(items(&v), [400, 400], "poison, and an action not taken");
        s.set(Some(AnswerFault::Reject { code: 400, per_million: 250_000, words: &super::super::ANSWERS.reject }));
        let body: String = (10..18).map(|i| pair("create", i)).collect();
        let (status, v) = bulk(body).await;
        assert_eq!(status, 200);
        assert_eq!(items(&v), [201, 201, 201, 400, 201, 201, 201, 400], "every fourth");
        s.set(Some(AnswerFault::Reject { code: 429, per_million: 500_000, words: &super::super::ANSWERS.reject }));
        let (_, v) = bulk(format!("{}{}", pair("create", 20), pair("create", 21))).await;
        assert_eq!(items(&v), [201, 429]);
        s.set(None);
        let (_, v) = bulk(pair("create", 21)).await;
        assert_eq!(items(&v), [201], "the 429 withheld it: stored now, once");
        let refused: Vec<String> = s
            .lock()
            .refused_by_fault
            .iter()
            .map(|c| String::from_utf8_lossy(&c.line).into_owned())
            .collect();
        assert_eq!(refused, ["{\"id\":\"r13\"}", "{\"id\":\"r17\"}"], "the 400s only");
        assert_eq!(s.lock().copies.len(), 2 + 6 + 1 + 1);
        let (status, _) = bulk("{\"create\":{}}\n".to_string()).await;
        assert_eq!(status, 400, "no source line: not a _bulk request");
        assert_eq!(s.lock().copies.len(), 10);
        // A plain POST path takes a `reject` as a status for the whole request.
        let plain = store(Dedupe::Off, None);
        let (paddr, pstop) = serve(plain.clone()).await.unwrap();
        plain.set(Some(AnswerFault::Reject { code: 422, per_million: 500_000, words: &super::super::ANSWERS.reject }));
        let mut codes = Vec::new();
        for i in 0..4 {
            codes.push(post(&client, paddr, &format!("k{i}"), "{\"id\":1}").await.status().as_u16());
        }
        assert_eq!(codes, [200, 422, 200, 422]);
        let inner = plain.lock();
        assert_eq!((inner.copies.len(), inner.refused_by_fault.len()), (2, 2));
        drop(inner);
        stop.cancel();
        pstop.cancel();
    }

    /// Without dedupe every copy is stored.
    #[tokio::test]
    async fn without_dedupe_every_copy_is_stored() {
        let s = store(Dedupe::Off, None);
        let (addr, stop) = serve(s.clone()).await.unwrap();
        let client = reqwest::Client::new();
        for _ in 0..3 {
            assert_eq!(post(&client, addr, "k1", "{\"id\":1}").await.status(), 200);
        }
        assert_eq!(s.lock().copies.len(), 3);
        stop.cancel();
    }
}
