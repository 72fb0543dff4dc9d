//! A link served by a `drill proxy` on another host, driven over its token-protected API
//! (docs/src/design.md#2-parts: a link may be served by a `drill proxy` / `drill agent`
//! elsewhere).
//!
//! [`RemoteLink::reach`] checks at start that the API answers, accepts the token and has the
//! link. Each fault is one `PUT /links/NAME/fault` under a lease that a keeper task renews
//! (`POST /links/NAME/lease`) while the fault is in force, so a drill that crashes, is killed or
//! loses its network mid-fault leaves nothing applied: the proxy heals the link once renewals
//! stop. [`RemoteLink::close`] heals what this drill applied. Every call's round trip is kept
//! for the report; the link's counters are read back after each call and once a second.
//!
//! It must never apply anything the proxy cannot take back by itself: only faults with a lease,
//! and only those the API knows (no stacked conditions, no certificate faults).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

use super::{Fault, FaultSpec, LinkStatus};

/// How long a fault holds on the remote proxy without a renewal.
pub const LEASE: Duration = Duration::from_secs(5);

/// How long one API call may take before it counts as failed.
const CALL_LIMIT: Duration = Duration::from_secs(5);

/// How long a renewal may take: well inside the lease, so one slow call cannot let it lapse.
const RENEW_LIMIT: Duration = Duration::from_millis(LEASE.as_millis() as u64 / 4);

/// A link on another host's `drill proxy`.
pub struct RemoteLink {
    name: String,
    /// `http://HOST:PORT`, without a trailing slash.
    api: String,
    token: Option<String>,
    http: reqwest::Client,
    /// What the link said last (its listen and upstream addresses, its fault and counters),
    /// with the number of the call that read it: an older read never replaces a newer one.
    status: Mutex<(u64, LinkStatus)>,
    /// The counters when the drill found the link: a proxy outlives drills, and the report
    /// counts only this drill's traffic.
    baseline: Mutex<LinkStatus>,
    /// Numbers the calls, in the order they are sent.
    calls_sent: AtomicU64,
    /// Set when a renewal found the lease gone while a fault was in force: it ended early.
    lease_lost: Mutex<Option<String>>,
    /// The round trip of every call.
    calls: Mutex<Vec<Duration>>,
    /// A fault of this drill is in force: the keeper renews its lease.
    leased: Mutex<bool>,
    /// Errors of calls made in the background (renewals, reads), for the report.
    errors: Mutex<Vec<String>>,
}

/// Why a remote link cannot be used: the token refused or the link missing are bad input
/// (exit 2); an API that does not answer is a drill that could not be set up (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("remote link {name} at {api}: {why}")]
    Invalid {
        name: String,
        api: String,
        why: String,
    },
    #[error("remote link {name} at {api}: {why}")]
    Unreachable {
        name: String,
        api: String,
        why: String,
    },
}

impl RemoteLink {
    /// Reaches the proxy at `api`, with `token`, and finds the link `name` there.
    pub async fn reach(
        name: &str,
        api: &str,
        token: Option<String>,
    ) -> Result<Arc<RemoteLink>, RemoteError> {
        let api = api.trim_end_matches('/').to_string();
        let invalid = |why: String| RemoteError::Invalid {
            name: name.to_string(),
            api: api.clone(),
            why,
        };
        let unreachable = |why: String| RemoteError::Unreachable {
            name: name.to_string(),
            api: api.clone(),
            why,
        };
        let nowhere = SocketAddr::from(([0, 0, 0, 0], 0));
        let http = reqwest::Client::builder()
            .timeout(CALL_LIMIT)
            .build()
            .map_err(|e| unreachable(e.to_string()))?;
        let link = RemoteLink {
            name: name.to_string(),
            api: api.clone(),
            token,
            http,
            status: Mutex::new((0, LinkStatus::idle(name, nowhere, nowhere))),
            baseline: Mutex::new(LinkStatus::idle(name, nowhere, nowhere)),
            calls_sent: AtomicU64::new(0),
            lease_lost: Mutex::new(None),
            calls: Mutex::new(Vec::new()),
            leased: Mutex::new(false),
            errors: Mutex::new(Vec::new()),
        };
        // A link an earlier drill left faulted heals when its lease runs out: wait that long.
        let deadline = Instant::now() + LEASE + Duration::from_secs(1);
        loop {
            let found = link.find(&api, &invalid, &unreachable).await?;
            if found.fault == "pass" {
                *link.baseline.lock().unwrap_or_else(|p| p.into_inner()) = found.clone();
                link.store(0, found);
                return Ok(Arc::new(link));
            }
            if Instant::now() >= deadline {
                return Err(unreachable(format!(
                    "the link is not healed (`{}` in force for {} s): another driver is using it (a fault an earlier drill left would have been healed when its {} s lease ran out)",
                    found.fault,
                    found.since_ms / 1000,
                    LEASE.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The link `name` as `GET /links` shows it now.
    async fn find(
        &self,
        api: &str,
        invalid: &impl Fn(String) -> RemoteError,
        unreachable: &impl Fn(String) -> RemoteError,
    ) -> Result<LinkStatus, RemoteError> {
        let name = &self.name;
        let (_, answer) = self
            .call(self.http.get(format!("{api}/links")))
            .await
            .map_err(|e| unreachable(format!("{e}; check that drill proxy runs there")))?;
        match answer.status() {
            StatusCode::UNAUTHORIZED => {
                return Err(invalid(
                    "the proxy refused the token (401): set the variable token_env names to the proxy's --token".to_string(),
                ));
            }
            s if !s.is_success() => {
                return Err(unreachable(format!("GET /links answered {s}")));
            }
            _ => {}
        }
        let links: Vec<LinkStatus> = answer
            .json()
            .await
            .map_err(|e| unreachable(format!("GET /links: not a drill proxy's answer: {e}")))?;
        links.into_iter().find(|l| l.name == *name).ok_or_else(|| {
            invalid(format!(
                "the proxy has no link named `{name}`; start it with --link {name}=LISTEN,UPSTREAM"
            ))
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the engine connects: the link's listen address on the remote host.
    pub fn listen_addr(&self) -> SocketAddr {
        self.status().listen
    }

    /// Where the remote link forwards to.
    pub fn upstream_addr(&self) -> SocketAddr {
        self.status().upstream
    }

    /// The link as it was last read, its counters counting this drill's traffic only.
    pub fn status(&self) -> LinkStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone();
        let base = self.baseline.lock().unwrap_or_else(|p| p.into_inner());
        let since = |now: &mut u64, then: u64| *now = now.saturating_sub(then);
        since(&mut s.connections_accepted, base.connections_accepted);
        since(&mut s.connections_reset, base.connections_reset);
        since(&mut s.connections_stranded, base.connections_stranded);
        since(&mut s.bytes_upstream, base.bytes_upstream);
        since(&mut s.bytes_downstream, base.bytes_downstream);
        since(
            &mut s.bytes_swallowed_upstream,
            base.bytes_swallowed_upstream,
        );
        since(
            &mut s.bytes_swallowed_downstream,
            base.bytes_swallowed_downstream,
        );
        since(&mut s.bytes_spliced, base.bytes_spliced);
        s
    }

    /// Keeps `status`, read by call number `seq`, unless a later call's read is kept already.
    fn store(&self, seq: u64, status: LinkStatus) {
        let mut kept = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if seq >= kept.0 {
            *kept = (seq, status);
        }
    }

    /// Why the fault in force ended before drill healed it (its lease ran out), once.
    pub fn take_lease_lost(&self) -> Option<String> {
        self.lease_lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The API's description of `spec`, or why the remote API cannot carry it.
    pub fn request(spec: &FaultSpec) -> Result<serde_json::Value, String> {
        let plain = matches!(
            spec.fault,
            Fault::Refuse
                | Fault::Reset
                | Fault::Swallow
                | Fault::Hang
                | Fault::Strand
                | Fault::Delay
                | Fault::Throttle
                | Fault::Loss
                | Fault::Blackhole
                | Fault::Heal
        );
        if !plain || spec.toxicity < 1.0 || spec.expired {
            return Err(format!(
                "a remote link takes refuse, reset, swallow, hang, strand, delay, throttle, loss, blackhole and heal, one at a time; not {}",
                spec.what()
            ));
        }
        Ok(serde_json::json!({
            "fault": spec.fault.name(),
            "direction": spec.direction.name(),
            "latency_ms": spec.latency.as_millis() as u64,
            "jitter_ms": spec.jitter.as_millis() as u64,
            "bytes_per_s": spec.bytes_per_s,
            "loss": spec.loss,
            "lease_ms": LEASE.as_millis() as u64,
        }))
    }

    /// Puts `spec` in force on the remote link, under a lease the keeper renews.
    pub async fn apply(&self, spec: &FaultSpec) -> Result<(), String> {
        if spec.fault == Fault::Heal {
            return self.heal().await;
        }
        let body = Self::request(spec)?;
        let url = format!("{}/links/{}/fault", self.api, self.name);
        // Leased before it is sent: a PUT that lands but whose answer is lost is still healed
        // at the end (a DELETE of a link holding nothing is harmless).
        *self.leased.lock().unwrap_or_else(|p| p.into_inner()) = true;
        let (seq, answer) = self.call(self.http.put(url).json(&body)).await?;
        self.take_status(seq, answer, "PUT fault").await
    }

    /// Heals the remote link.
    pub async fn heal(&self) -> Result<(), String> {
        *self.leased.lock().unwrap_or_else(|p| p.into_inner()) = false;
        let url = format!("{}/links/{}/fault", self.api, self.name);
        let (seq, answer) = self.call(self.http.delete(url)).await?;
        self.take_status(seq, answer, "DELETE fault").await
    }

    /// Reads the link's counters again.
    pub async fn refresh(&self) -> Result<(), String> {
        let (seq, answer) = self
            .call(self.http.get(format!("{}/links", self.api)))
            .await?;
        let links: Vec<LinkStatus> = answer
            .json()
            .await
            .map_err(|e| format!("GET /links: {e}"))?;
        match links.into_iter().find(|l| l.name == self.name) {
            Some(s) => {
                self.store(seq, s);
                Ok(())
            }
            None => Err(format!("the link `{}` is gone from the proxy", self.name)),
        }
    }

    /// Until `cancel`: renews the lease while a fault is in force (each renewal bounded well
    /// inside the lease), and, apart, reads the counters once a second.
    pub fn keep(self: &Arc<Self>, cancel: CancellationToken) {
        let link = self.clone();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(LEASE / 5);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if *link.leased.lock().unwrap_or_else(|p| p.into_inner()) {
                    link.renew().await;
                }
            }
        });
        let link = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Err(e) = link.refresh().await {
                    link.note(e);
                }
            }
        });
    }

    /// One renewal. A lease the proxy no longer holds while drill's fault is in force means
    /// the fault ended early: kept for the runner to say so.
    async fn renew(&self) {
        let url = format!("{}/links/{}/lease", self.api, self.name);
        match self.call(self.http.post(url).timeout(RENEW_LIMIT)).await {
            Ok((_, a)) if a.status().is_success() => {}
            Ok((_, a)) if a.status() == StatusCode::NOT_FOUND => {
                let still = *self.leased.lock().unwrap_or_else(|p| p.into_inner());
                if still {
                    let why = format!(
                        "the remote proxy's lease on link {} ran out while the fault was in force (renewals did not reach it in time): the fault ended early",
                        self.name
                    );
                    self.note(why.clone());
                    *self.lease_lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                }
            }
            Ok((_, a)) => self.note(format!("lease renewal answered {}", a.status())),
            Err(e) => self.note(format!("lease renewal: {e}")),
        }
    }

    /// Heals what this drill left in force (the drill's end, Ctrl-C, a failed start).
    pub async fn close(&self) {
        let leased = *self.leased.lock().unwrap_or_else(|p| p.into_inner());
        if leased && let Err(e) = self.heal().await {
            self.note(format!(
                "could not heal at the end ({e}); the proxy heals it when the lease ({}s) runs out",
                LEASE.as_secs()
            ));
        }
    }

    /// One line for the report: the API, the calls and their round trips, any error.
    pub fn summary(&self) -> String {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
        calls.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (median, max) = match (calls.get(calls.len() / 2), calls.last()) {
            (Some(m), Some(x)) => (ms(*m), ms(*x)),
            _ => (0.0, 0.0),
        };
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = format!(
            "remote link {} on the drill proxy at {} ({} -> {}): {} API calls, round trip median {median:.1} ms, max {max:.1} ms; faults held under a {} s lease",
            self.name,
            self.api,
            self.listen_addr(),
            self.upstream_addr(),
            calls.len(),
            LEASE.as_secs()
        );
        if !errors.is_empty() {
            line.push_str(&format!(
                "; {} calls failed (first: {})",
                errors.len(),
                errors[0]
            ));
        }
        line
    }

    /// Sends `request` with the token, and keeps its round trip; returns the call's number.
    async fn call(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u64, reqwest::Response), String> {
        let request = match &self.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        };
        let seq = self.calls_sent.fetch_add(1, Ordering::SeqCst) + 1;
        let started = Instant::now();
        let answer = request.send().await.map_err(|e| e.to_string());
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(started.elapsed());
        answer.map(|a| (seq, a))
    }

    async fn take_status(
        &self,
        seq: u64,
        answer: reqwest::Response,
        what: &str,
    ) -> Result<(), String> {
        let code = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if !code.is_success() {
            return Err(format!("{what} answered {code}: {}", text.trim()));
        }
        let status: LinkStatus = serde_json::from_str(&text).map_err(|e| format!("{what}: {e}"))?;
        self.store(seq, status);
        Ok(())
    }

    fn note(&self, error: String) {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(error);
    }
}
