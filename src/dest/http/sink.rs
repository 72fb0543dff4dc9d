//! The engine's HTTP sink: one `POST {topic}` per record, the record's data as the body, its
//! write key in the `Idempotency-Key` header (or the output's `key_header`).
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | delivered |
//! | 401, 403, 404, 405, 407, 411, 426 | about the request (credentials, address, method, framing), never one record: the destination is away for this engine, as for a 5xx |
//! | another 4xx (400, 409, 413, 422, …) | refused and counted — only while the endpoint takes requests: the probe (`HEAD`), sent right after that answer, answers 2xx. An endpoint that answers its probe 4xx or 5xx too refuses everything, which is not a refusal of a record: the session ends with the record held and no attempt spent |
//! | 5xx, 408, 429, a transport error | the destination is away: the session ends, its open attempts end `possibly_sent` (a 5xx may come from a gateway after the write landed), and **no attempt is spent**; the next session starts with a probe |
//! | no answer within the answer timeout | `possibly_sent` (the tick ends the session) |
//!
//! A topic that ends in `/_bulk` speaks Elasticsearch's bulk API ([`super::bulk`]): the
//! attempts sent together go in one request, each as a `create` with its write key as the
//! document `_id`, and the answer is read **item by item** — a `200` says nothing about any
//! one record: an item 201, or 409 (the document is there already), is delivered; 429, 408
//! or 5xx is "not now": the session ends and the record goes again, no attempt spent; any
//! other 4xx refuses that record (the request's own 200 says the endpoint takes requests, so
//! no probe is needed). A record with a line break cannot go in a `_bulk` body and is refused
//! before it leaves.
//!
//! The probe is `HEAD {topic}` (writes nothing); a 2xx or 3xx, or 404/405 (no `HEAD` route),
//! means the endpoint takes requests — the same rule opens a session and judges a 4xx. Any
//! other answer is an outage: a `Retry-After` on it is waited out (at most 30 s), and after an
//! endpoint was seen taking no requests the next probe waits a second, so an endpoint that
//! answers everything 4xx is asked once a second, not in a tight loop. Each session has its own client and connection pool: a session ended by
//! silence leaves no connection behind to be reused. Requests go one at a time by default
//! (`window: 1`): requests in flight together travel on separate connections and may land in
//! any order, which `in_order` cannot allow.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::bulk;
use crate::engine::OutputConfig;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// The longest `Retry-After` the probe waits out.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(30);

/// After a session ended because the endpoint takes no requests (every write answered 4xx),
/// the next probe waits this long: such an endpoint is away, and is asked once a second.
const PAUSE_WHILE_NOT_TAKING: Duration = Duration::from_secs(1);

/// When each endpoint (by URL) was last seen taking no requests.
static NOT_TAKING: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);

fn not_taking_since(url: &str) -> Option<Instant> {
    let map = NOT_TAKING.lock().unwrap_or_else(|p| p.into_inner());
    map.as_ref().and_then(|m| m.get(url).copied())
}

fn mark_not_taking(url: &str) {
    let mut map = NOT_TAKING.lock().unwrap_or_else(|p| p.into_inner());
    map.get_or_insert_with(HashMap::new)
        .insert(url.to_string(), Instant::now());
}

/// Whether a probe's answer says the endpoint takes requests: 2xx or 3xx, or 404/405 (it has no
/// `HEAD` route, which says nothing against its writes). The same rule for the probe that
/// opens a session and for the probe after a 4xx.
fn takes_requests(status: StatusCode) -> bool {
    status.is_success()
        || status.is_redirection()
        || matches!(status.as_u16(), 404 | 405)
}

/// The HTTP sink (stateless: the path and header are in the output's config).
#[derive(Clone, Copy)]
pub struct HttpSink;

/// What one request came back with: its status, its `Retry-After`, and after a record-level
/// 4xx what the probe sent right after it answered (`None`: no answer).
type Reply = Result<(StatusCode, Option<Duration>, Option<StatusCode>), String>;

/// What came back for one attempt: the answer to its own request, or its item in a `_bulk`
/// answer.
enum Outcome {
    Whole(Reply),
    Item(bulk::ItemStatus),
}

impl Sink for HttpSink {
    type Session = HttpSession;

    const SESSION: &'static str = "HTTP session";

    const PROMISE: (Promise, &'static str) = (
        Promise::EffectivelyOnce,
        "an HTTP output keeps `effectively_once` only where the endpoint recognises a repeated Idempotency-Key",
    );

    /// One request at a time: requests in flight together land in any order.
    const DEFAULT_WINDOW: usize = 1;

    fn check(&self, cfg: &OutputConfig) -> Result<(), String> {
        match &cfg.transport {
            Some(t) => Err(format!(
                "`transport: {t}`: an http output has one transport; leave it out"
            )),
            None => Ok(()),
        }
    }

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<HttpSession, String> {
        let cfg = to.cfg;
        let limit = cfg.answer_timeout.0;
        let client = reqwest::Client::builder()
            .connect_timeout(limit)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(usize::MAX)
            .build()
            .map_err(|e| e.to_string())?;
        let url = format!("http://{}{}", cfg.address, cfg.topic);
        if let Some(at) = not_taking_since(&url) {
            // Asked again at most once a second while it takes nothing.
            tokio::time::sleep(PAUSE_WHILE_NOT_TAKING.saturating_sub(at.elapsed())).await;
        }
        let probe = tokio::time::timeout(limit, client.head(&url).send())
            .await
            .map_err(|_| format!("no answer to the probe (HEAD) within {limit:?}"))?
            .map_err(|e| format!("probe: {e}"))?;
        let status = probe.status();
        if away(status) {
            let wait = retry_after(probe.headers()).map(|d| d.min(RETRY_AFTER_CAP));
            if let Some(d) = wait {
                tokio::time::sleep(d).await;
            }
            return Err(format!("probe answered {status}: the destination is away"));
        }
        if !takes_requests(status) {
            mark_not_taking(&url);
            return Err(format!(
                "probe answered {status}: the endpoint takes no requests"
            ));
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::ProbeWithOldestRecord)
            && let Some(record) = to.oldest
        {
            // MUTANT: the probe writes data: the oldest waiting record, without its write
            // key, its answer not awaited (docs/src/design.md#rule-1-5).
            let _ = client.post(&url).body(record.data.clone()).send().await;
        }
        let (done, replies) = mpsc::unbounded_channel();
        Ok(HttpSession {
            client,
            bulk: bulk::is_bulk(&cfg.topic),
            url,
            key_header: cfg
                .key_header
                .clone()
                .unwrap_or_else(|| super::KEY_HEADER.to_string()),
            answer_timeout: limit,
            requests: JoinSet::new(),
            done,
            replies,
        })
    }
}

/// A status that says the destination is away (not a verdict on the record).
fn away(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// A 4xx about the request itself — its credentials, address, method or framing — which no
/// record's content can cause: every write of this engine gets it, so the destination is away
/// for it, not refusing a record.
fn about_the_request(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 404 | 405 | 407 | 411 | 426)
}

/// Whether a 4xx may be a refusal of the record, to be checked with a probe.
fn about_the_record(status: StatusCode) -> bool {
    status.is_client_error() && !away(status) && !about_the_request(status)
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// One session: a client with its own pool, the requests in flight, their replies.
pub struct HttpSession {
    client: reqwest::Client,
    /// The topic ends in `/_bulk`: one request per send, answered item by item.
    bulk: bool,
    url: String,
    key_header: String,
    answer_timeout: Duration,
    /// Dropped with the session: requests still in flight are abandoned with it.
    requests: JoinSet<()>,
    done: mpsc::UnboundedSender<(u16, Outcome)>,
    replies: mpsc::UnboundedReceiver<(u16, Outcome)>,
}

impl HttpSession {
    /// What one attempt's outcome means: an answer for it, or why the destination is away.
    fn judge(outcome: Outcome) -> Result<Answer, Away> {
        match outcome {
            Outcome::Whole(reply) => HttpSession::classify(reply),
            Outcome::Item(bulk::ItemStatus::Stored) => Ok(Answer::Accepted),
            Outcome::Item(bulk::ItemStatus::Refused(s)) => {
                Ok(Answer::Refused(format!("_bulk item {s}")))
            }
            Outcome::Item(bulk::ItemStatus::NotNow(s)) => Err(Away {
                why: format!("_bulk item {s}: the destination is away"),
                not_taking: false,
            }),
        }
    }

    /// What one reply means: an answer for the attempt, or why the destination is away.
    fn classify(reply: Reply) -> Result<Answer, Away> {
        let gone = |why: String| Away {
            why,
            not_taking: false,
        };
        let not_taking = |why: String| Away {
            why,
            not_taking: true,
        };
        let (status, retry, probe) = reply.map_err(gone)?;
        if status.is_success() {
            return Ok(Answer::Accepted);
        }
        if away(status) {
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::OutageStatusSpendsAttempts) {
                // MUTANT: the destination's "away" answer counted as a refusal of the record
                // (docs/src/design.md#rule-1-2: only a destination's refusal counts).
                return Ok(Answer::Refused(format!("HTTP {status}")));
            }
            let retry = retry.map_or(String::new(), |d| {
                format!(" (Retry-After {}s)", d.as_secs())
            });
            return Err(gone(format!("HTTP {status}{retry}: the destination is away")));
        }
        if status == reqwest::StatusCode::CONFLICT {
            // An API that answers 409 to a key in flight: an earlier attempt of this write is
            // still being worked on there. Neither refused nor delivered: wait, ask again.
            return Err(gone(format!(
                "HTTP {status}: the write key is in flight at the destination; asked again after a probe"
            )));
        }
        if about_the_request(status) {
            return Err(not_taking(format!(
                "HTTP {status}: about the request, not the record — the endpoint takes no write from this engine"
            )));
        }
        match probe {
            Some(p) if takes_requests(p) => Ok(Answer::Refused(format!("HTTP {status}"))),
            Some(p) => Err(not_taking(format!(
                "HTTP {status}, and the probe answered {p}: the endpoint is not taking requests"
            ))),
            None => Err(not_taking(format!(
                "HTTP {status}, and the probe got no answer: the endpoint is not taking requests"
            ))),
        }
    }
}

impl HttpSession {
    /// `_bulk`: every attempt of this send in one request ([`bulk::item`]); each gets its
    /// item's status back, or the request's own answer when it was not a `200` with items.
    fn send_bulk(&mut self, attempts: &mut Attempts, answers: &mut Answers) {
        let mut body = Vec::new();
        let mut tags = Vec::new();
        for (tag, record) in attempts.drain(..) {
            if record.data.contains('\n') {
                let why = "a record with a line break cannot go in a _bulk body".to_string();
                answers.push((tag, Answer::Refused(why)));
                continue;
            }
            bulk::item(&record.key, record.data.as_bytes(), &mut body);
            tags.push(tag);
        }
        if tags.is_empty() {
            return;
        }
        let request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(body);
        let probe = self.client.head(&self.url).timeout(self.answer_timeout / 4);
        let done = self.done.clone();
        self.requests.spawn(async move {
            let whole = |reply: Reply| {
                for tag in &tags {
                    let _ = done.send((*tag, Outcome::Whole(reply.clone())));
                }
            };
            let r = match request.send().await {
                Ok(r) => r,
                Err(e) => return whole(Err(format!("request failed: {e}"))),
            };
            let (status, retry) = (r.status(), retry_after(r.headers()));
            if !status.is_success() {
                let up = if about_the_record(status) {
                    probe.send().await.ok().map(|p| p.status())
                } else {
                    None
                };
                return whole(Ok((status, retry, up)));
            }
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::BulkStatusOnly) {
                // MUTANT: the request's 200 read as every item stored; the items' own
                // statuses are never looked at.
                return whole(Ok((status, retry, None)));
            }
            let body = match r.bytes().await {
                Ok(b) => b,
                Err(e) => return whole(Err(format!("reading the _bulk answer: {e}"))),
            };
            let items = match bulk::read_answer(&body) {
                Ok(items) => items,
                Err(why) => return whole(Err(why)),
            };
            #[cfg(feature = "mutants")]
            let items = mutant::off_by_one(items);
            for (i, tag) in tags.iter().enumerate() {
                let outcome = match items.get(i) {
                    Some(s) => Outcome::Item(bulk::item_status(*s)),
                    None => Outcome::Whole(Err(format!(
                        "the _bulk answer has {} items for {} records",
                        items.len(),
                        tags.len()
                    ))),
                };
                let _ = done.send((*tag, outcome));
            }
        });
    }
}

/// Why a session ends on an answer: the destination is away; `not_taking` when it answered,
/// but takes no requests (the next probe is paced).
struct Away {
    why: String,
    not_taking: bool,
}

impl Session for HttpSession {
    async fn send(
        &mut self,
        attempts: &mut Attempts,
        answers: &mut Answers,
    ) -> Result<(), String> {
        if self.bulk {
            self.send_bulk(attempts, answers);
            return Ok(());
        }
        for (tag, record) in attempts.drain(..) {
            let request = self
                .client
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(self.key_header.as_str(), record.key.as_str())
                .body(record.data.clone());
            let done = self.done.clone();
            // A quarter of the answer timeout, so the probe cannot turn an answered 4xx into
            // silence (`tick` counts the attempt's time to the end of both).
            let probe = self.client.head(&self.url).timeout(self.answer_timeout / 4);
            self.requests.spawn(async move {
                let reply = match request.send().await {
                    Ok(r) if about_the_record(r.status()) => {
                        // Is the endpoint taking requests at all? Its data-free probe, now.
                        let up = probe.send().await.ok().map(|p| p.status());
                        Ok((r.status(), retry_after(r.headers()), up))
                    }
                    Ok(r) => Ok((r.status(), retry_after(r.headers()), None)),
                    Err(e) => Err(format!("request failed: {e}")),
                };
                let _ = done.send((tag, Outcome::Whole(reply)));
            });
        }
        Ok(())
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        let Some((tag, reply)) = self.replies.recv().await else {
            return Err("the session's requests are gone".to_string());
        };
        // Every answer already in is recorded, also after one that ends the session (the
        // other items of a `_bulk` answer were stored or refused all the same).
        let mut away = None;
        let mut next = Some((tag, reply));
        while let Some((tag, reply)) = next {
            match HttpSession::judge(reply) {
                Ok(answer) => into.push((tag, answer)),
                Err(a) => {
                    away.get_or_insert(a);
                }
            }
            next = self.replies.try_recv().ok();
        }
        match away {
            None => Ok(()),
            Some(Away { why, not_taking }) => {
                if not_taking {
                    mark_not_taking(&self.url);
                }
                Err(why)
            }
        }
    }

    async fn tick(&mut self, _now: Instant, open: Open) -> Tick {
        #[cfg(feature = "mutants")]
        if let Some(tick) = mutant::session_tick(self.answer_timeout) {
            return tick;
        }
        match open.oldest_waited {
            Some(waited) if waited > self.answer_timeout => {
                Tick::Lost(format!("no answer within {:?}", self.answer_timeout))
            }
            _ => Tick::Fine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, probe: Option<u16>) -> Reply {
        Ok((
            StatusCode::from_u16(status).unwrap(),
            None,
            probe.map(|p| StatusCode::from_u16(p).unwrap()),
        ))
    }

    /// The answer table of the module's doc: a 4xx refuses the record only when the probe sent
    /// right after it says the endpoint takes requests; a 4xx about the request, a 5xx, 408
    /// and 429 say the destination is away (no attempt spent).
    #[test]
    fn a_4xx_is_a_refusal_only_while_the_endpoint_takes_requests() {
        let classify = HttpSession::classify;
        assert!(matches!(classify(reply(201, None)), Ok(Answer::Accepted)));
        assert!(matches!(classify(reply(422, Some(200))), Ok(Answer::Refused(_))));
        assert!(matches!(classify(reply(400, Some(204))), Ok(Answer::Refused(_))));
        assert!(
            matches!(classify(reply(422, Some(405))), Ok(Answer::Refused(_))),
            "an endpoint without a HEAD route"
        );
        assert!(classify(reply(401, Some(200))).is_err_and(|a| a.not_taking));
        assert!(classify(reply(503, Some(200))).is_err_and(|a| !a.not_taking));
        assert!(classify(reply(422, Some(422))).is_err(), "everything refused");
        assert!(classify(reply(422, Some(503))).is_err());
        assert!(classify(reply(422, None)).is_err(), "the probe got no answer");
        for away in [401, 403, 404, 405, 407, 408, 429, 500, 502, 503] {
            assert!(classify(reply(away, Some(200))).is_err(), "{away}");
        }
        assert!(classify(Err("request failed".to_string())).is_err());
        // A `_bulk` item: stored or already there, refused, or "not now" (the session ends).
        let item = |s| HttpSession::judge(Outcome::Item(bulk::item_status(s)));
        assert!(matches!(item(201), Ok(Answer::Accepted)));
        assert!(matches!(item(409), Ok(Answer::Accepted)), "the document is there");
        assert!(matches!(item(400), Ok(Answer::Refused(_))));
        assert!(matches!(item(413), Ok(Answer::Refused(_))));
        assert!(item(429).is_err_and(|a| !a.not_taking));
        assert!(item(503).is_err_and(|a| !a.not_taking));
        assert!(takes_requests(StatusCode::OK) && takes_requests(StatusCode::METHOD_NOT_ALLOWED));
        assert!(!takes_requests(StatusCode::UNAUTHORIZED) && !takes_requests(StatusCode::UNPROCESSABLE_ENTITY));
        assert!(about_the_record(StatusCode::UNPROCESSABLE_ENTITY));
        assert!(!about_the_record(StatusCode::UNAUTHORIZED));
        assert!(!about_the_record(StatusCode::TOO_MANY_REQUESTS));
    }
}
