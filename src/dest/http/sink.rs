//! The engine's HTTP sink: one `POST {topic}` per record, the record's data as the body, its
//! write key in the `Idempotency-Key` header (or the output's `key_header`).
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | delivered |
//! | another 4xx (not 408, not 429) | refused and counted — only while the endpoint takes other writes (it took one in the last minute): one that answers every write 4xx is misconfigured or away, not refusing a record, and the session ends with the record held |
//! | 5xx, 408, 429, a transport error | the destination is away: the session ends, its open attempts end `possibly_sent` (a 5xx may come from a gateway after the write landed), and **no attempt is spent**; the next session starts with a probe |
//! | no answer within the answer timeout | `possibly_sent` (the tick ends the session) |
//!
//! The probe is `HEAD {topic}` (writes nothing); any answer but 5xx, 408 or 429 means the
//! endpoint is there. A `Retry-After` on a probe's answer is waited out (at most 30 s) before
//! the next connect. Each session has its own client and connection pool: a session ended by
//! silence leaves no connection behind to be reused. Requests go one at a time by default
//! (`window: 1`): requests in flight together travel on separate connections and may land in
//! any order, which `in_order` cannot allow.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::engine::OutputConfig;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// The longest `Retry-After` the probe waits out.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(30);

/// A 4xx refuses a record only if the endpoint took a write this recently.
const ACCEPTING_WITHIN: Duration = Duration::from_secs(60);

/// When each endpoint (by URL) last took a write, across sessions.
static LAST_TAKEN: std::sync::Mutex<Option<HashMap<String, Instant>>> = std::sync::Mutex::new(None);

fn taken_now(url: &str) {
    let mut map = LAST_TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    map.get_or_insert_with(HashMap::new)
        .insert(url.to_string(), Instant::now());
}

fn taken_recently(url: &str) -> bool {
    let map = LAST_TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    map.as_ref()
        .and_then(|m| m.get(url))
        .is_some_and(|at| at.elapsed() < ACCEPTING_WITHIN)
}

/// The HTTP sink (stateless: the path and header are in the output's config).
#[derive(Clone, Copy)]
pub struct HttpSink;

/// What one request came back with.
type Reply = Result<(StatusCode, Option<Duration>), String>;

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
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::ProbeWithOldestRecord)
            && let Some(record) = to.oldest
        {
            // MUTANT: the probe writes data: the oldest waiting record, without its write
            // key, its answer not awaited (DESIGN.md §1.5).
            let _ = client.post(&url).body(record.data.clone()).send().await;
        }
        let (done, replies) = mpsc::unbounded_channel();
        Ok(HttpSession {
            client,
            url,
            key_header: cfg
                .key_header
                .clone()
                .unwrap_or_else(|| super::KEY_HEADER.to_string()),
            answer_timeout: limit,
            requests: JoinSet::new(),
            done,
            replies,
            deferred: HashMap::new(),
        })
    }
}

/// A status that says the destination is away (not a verdict on the record).
fn away(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
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
    url: String,
    key_header: String,
    answer_timeout: Duration,
    /// Dropped with the session: requests still in flight are abandoned with it.
    requests: JoinSet<()>,
    done: mpsc::UnboundedSender<(u16, Reply)>,
    replies: mpsc::UnboundedReceiver<(u16, Reply)>,
    /// 4xx answers that came while the endpoint took no write, by tag: refusals only once it
    /// is seen taking writes.
    deferred: HashMap<u16, String>,
}

impl HttpSession {
    /// What one reply means: an answer for the attempt, `Ok(None)` for a 4xx held back until
    /// the endpoint takes a write, or `Err` when the destination is away.
    fn classify(&mut self, tag: u16, reply: Reply) -> Result<Option<Answer>, String> {
        let (status, retry) = reply?;
        if status.is_success() {
            taken_now(&self.url);
            return Ok(Some(Answer::Accepted));
        }
        if away(status) {
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::OutageStatusSpendsAttempts) {
                // MUTANT: the destination's "away" answer counted as a refusal of the record
                // (DESIGN.md §1.2: only a destination's refusal counts).
                return Ok(Some(Answer::Refused(format!("HTTP {status}"))));
            }
            let retry = retry.map_or(String::new(), |d| {
                format!(" (Retry-After {}s)", d.as_secs())
            });
            return Err(format!("HTTP {status}{retry}: the destination is away"));
        }
        let refusal = format!("HTTP {status}");
        if taken_recently(&self.url) {
            return Ok(Some(Answer::Refused(refusal)));
        }
        self.deferred.insert(tag, refusal);
        Ok(None)
    }
}

impl Session for HttpSession {
    async fn send(
        &mut self,
        attempts: &mut Attempts,
        _answers: &mut Answers,
    ) -> Result<(), String> {
        for (tag, record) in attempts.drain(..) {
            let request = self
                .client
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(self.key_header.as_str(), record.key.as_str())
                .body(record.data.clone());
            let done = self.done.clone();
            self.requests.spawn(async move {
                let reply = match request.send().await {
                    Ok(r) => Ok((r.status(), retry_after(r.headers()))),
                    Err(e) => Err(format!("request failed: {e}")),
                };
                let _ = done.send((tag, reply));
            });
        }
        Ok(())
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        let Some((tag, reply)) = self.replies.recv().await else {
            return Err("the session's requests are gone".to_string());
        };
        let mut next = Some((tag, reply));
        while let Some((tag, reply)) = next {
            if let Some(answer) = self.classify(tag, reply)? {
                into.push((tag, answer));
            }
            next = self.replies.try_recv().ok();
        }
        if !self.deferred.is_empty() && taken_recently(&self.url) {
            // Held-back 4xx answers are refusals now that the endpoint takes writes.
            into.extend(
                self.deferred
                    .drain()
                    .map(|(tag, why)| (tag, Answer::Refused(why))),
            );
        }
        Ok(())
    }

    async fn tick(&mut self, _now: Instant, open: Open) -> Tick {
        #[cfg(feature = "mutants")]
        if let Some(tick) = mutant::session_tick(self.answer_timeout) {
            return tick;
        }
        if !self.deferred.is_empty() && open.in_flight == self.deferred.len() {
            // Every write of this session answered 4xx and none taken: the endpoint refuses
            // everything, which is not a refusal of a record.
            return Tick::Lost(format!(
                "every write answered {} and none taken: the endpoint is not taking writes",
                self.deferred.values().next().map_or("", String::as_str)
            ));
        }
        match open.oldest_waited {
            Some(waited) if waited > self.answer_timeout => {
                Tick::Lost(format!("no answer within {:?}", self.answer_timeout))
            }
            _ => Tick::Fine,
        }
    }
}
