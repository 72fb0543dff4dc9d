//! HTTP: an endpoint drill hosts itself, `destination: { kind: http, topic: /records, dedupe:
//! true }` — the receiving side is the oracle.
//!
//! - **The endpoint** ([`endpoint`]): `POST {topic}` (the path; default `/drill`) with a JSON or
//!   NDJSON body, each line stored as one copy with the instant it arrived; `HEAD {topic}` is
//!   the data-free probe. Its sockets set `TCP_NODELAY`. With `dedupe: true` it stores a write
//!   key once and answers a repeat `200` without storing it.
//! - **Write key**: the request header `key_header` (default `Idempotency-Key`,
//!   docs/src/design.md#rule-1-3). A user's engine names the header it uses with
//!   `system.write_key: { http_header: NAME }`.
//! - **Promise**: `effectively_once` only with `dedupe: true`; an endpoint that stores every
//!   copy keeps `at_least_once`, and declaring more is an invalid scenario.
//! - **Destination faults** (`target: destination`, [`crate::dest::AnswerFault`]): `answer:
//!   503` (any 4xx or 5xx, with `retry_after`) for a window, nothing stored; `answer_after:
//!   30s`, stored at once and answered late. Poison records (`workload.poison`) are answered
//!   `422` while every other write is taken: a real refusal.
//! - **`_bulk`** ([`bulk`]): a topic that ends in `/_bulk` (`topic: /logs/_bulk`) makes the
//!   endpoint Elasticsearch's bulk API: NDJSON action/source pairs, the document `_id` the write
//!   key (stored once; a `create` of an `_id` already there is answered item `409`), and a
//!   `200` with a status per item. The destination fault `reject: { fraction, status }` refuses
//!   that share of the items with `status` inside the `200` — withheld, never stored; the ones
//!   refused for good (400, 413, 422) are expected failed. A user's engine names the key
//!   `write_key: { http_header: _id }`.
//! - **Links**: one plain TCP link named `http` in front of the endpoint, as for every kind.
//! - **Runtimes**: the endpoint runs inside drill (`auto`, `process` and `embedded` all mean
//!   that); a container or a user's endpoint is not this kind's: the oracle must be drill's.

pub mod bulk;
pub mod endpoint;
pub mod sink;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    DestError, Destination, Entry, Kind, Own, Provision, Provisioned, ReadBack, ReaderSpec,
    Running, Runtime, Section, Shape,
};
use serde_saphyr::Spanned;
use crate::located::{Located, at};
use crate::promise::Promise;
use crate::verify::WriteKeyPlace;

/// The header the built-in engine puts each record's write key in, unless `key_header` says
/// another.
pub const KEY_HEADER: &str = "Idempotency-Key";

/// What drill's endpoint can be told to answer: a status or a delay for every request, and
/// `reject: { fraction, status }` inside a `_bulk` answer's items (or whole, on a plain path).
pub(crate) static ANSWERS: super::ScriptedAnswers = super::ScriptedAnswers {
    whole: true,
    reject: super::RejectWords {
        field: "status",
        codes: &[
            (429, false, "429"),
            (500, false, "500"),
            (503, false, "503"),
            (400, true, "400"),
            (413, true, "413"),
            (422, true, "422"),
        ],
    },
    states: &[],
};

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "http",
    sink: &sink::HttpSink,
    fields: <HttpFields as schemars::JsonSchema>::json_schema,
    tls: false,
    external_field: None,
    sasl_mechanisms: &[],
    write_key_field: ("http_header", "string"),
    embedded: true,
    broker_tls: false,
    validate,
    no_terminating_link: None,
    external_tls: false,
    no_remote_link: None,
    starter: super::Starter {
        topic: |d| Some(format!("/{d}")),
        write_key: |k| format!("{{ http_header: {k} }}"),
    },
    bench: None,
    link_bench: None,
    taps: None,
};

/// Where a `_bulk` endpoint keeps each copy's write key: its document `_id`, kept with the copy
/// under this name.
pub const BULK_KEY: &str = "_id";

/// How the endpoint recognises a repeat of a write key, as real APIs do (`dedupe:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// `false`: every copy is stored.
    Off,
    /// `true` or `atomic`: the key is stored with the write, at once; a repeat is answered
    /// `200` and not stored, even while the first is still unanswered.
    Atomic,
    /// `conflict`: as `atomic`, and a write whose key is still in flight (an earlier request
    /// with it unanswered) is answered `409` and not stored.
    Conflict,
    /// `racy`: check, then insert: the key is stored only when the attempt ends (its answer
    /// sent, or the client gone), so copies sent while one is open are all stored (what many
    /// APIs do).
    Racy,
}

impl Dedupe {
    /// Whether a repeat that arrives after the first was answered is recognised.
    pub fn recognises_repeats(self) -> bool {
        self != Dedupe::Off
    }

    pub fn name(self) -> &'static str {
        match self {
            Dedupe::Off => "off",
            Dedupe::Atomic => "atomic",
            Dedupe::Conflict => "conflict",
            Dedupe::Racy => "racy",
        }
    }
}

impl<'de> serde::Deserialize<'de> for Dedupe {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Text {
            Flag(bool),
            Word(String),
        }
        match Text::deserialize(deserializer)? {
            Text::Flag(true) => Ok(Dedupe::Atomic),
            Text::Flag(false) => Ok(Dedupe::Off),
            Text::Word(w) => match w.trim() {
                "atomic" => Ok(Dedupe::Atomic),
                "conflict" => Ok(Dedupe::Conflict),
                "racy" => Ok(Dedupe::Racy),
                "off" | "none" => Ok(Dedupe::Off),
                other => Err(serde::de::Error::custom(format!(
                    "`{other}` is no deduplication: write true (= atomic), false, atomic, conflict or racy"
                ))),
            },
        }
    }
}

impl schemars::JsonSchema for Dedupe {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Dedupe".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [
                { "type": "boolean" },
                { "enum": ["atomic", "conflict", "racy", "off"] }
            ],
            "description": "How the endpoint recognises a repeated write key: true (= atomic), false (stores every copy), atomic, conflict (409 to a key in flight) or racy (check then insert)."
        })
    }
}

/// An HTTP destination: where the endpoint listens and whether it recognises a repeat.
#[derive(Debug, Clone)]
pub struct Http {
    /// The path writes are POSTed to (the scenario's `topic`, with a leading `/`).
    pub path: String,
    pub dedupe: Dedupe,
    /// The header the endpoint reads the write key from (lower case, as HTTP/1.1 compares it).
    pub key_header: String,
}

/// The path the scenario's `topic` names.
pub fn path_of(topic: &str) -> String {
    if topic.starts_with('/') {
        topic.to_string()
    } else {
        format!("/{topic}")
    }
}

own_fields! {
    /// HTTP's own fields of `destination:`.
    struct HttpFields {
        /// How the endpoint recognises a repeated write key: `true` (= `atomic`), `false` (the
        /// default: it stores every copy), `conflict` (a `409` to a key in flight) or `racy`
        /// (check then insert). `effectively_once` needs one that recognises repeats.
        #[schemars(with = "Option<Dedupe>")]
        dedupe: Option<Spanned<Dedupe>>,
        /// The request header that carries the write key (default `Idempotency-Key`).
        #[schemars(with = "Option<String>")]
        key_header: Option<Spanned<String>>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let raw: HttpFields = section.own()?;
    if section.runtime == Runtime::External || section.runtime == Runtime::Container {
        return Err(at(
            section.anchor(),
            "field `destination.runtime`: drill hosts the HTTP endpoint itself (it is the oracle: what it stored is what arrived); leave `runtime` out".to_string(),
        ));
    }
    let key_header = match &raw.key_header {
        None => KEY_HEADER.to_string(),
        Some(h) => {
            let name = h.value.trim();
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty() || !name.chars().all(token) {
                return Err(at(
                    &h.referenced,
                    format!(
                        "field `destination.key_header`: `{}` is not an HTTP header name (letters, digits and -, e.g. Idempotency-Key)",
                        h.value
                    ),
                ));
            }
            name.to_string()
        }
    };
    let topic = section.topic().unwrap_or("drill");
    if topic.contains(['?', '#', ' ']) {
        return Err(at(
            section.anchor(),
            format!(
                "field `destination.topic`: `{topic}` is not a path (no query, fragment or space)"
            ),
        ));
    }
    let path = path_of(topic);
    if bulk::is_bulk(&path) {
        // Elasticsearch's bulk API: a document `_id` is stored once, whatever the header says.
        for (name, given) in [
            ("dedupe", raw.dedupe.as_ref().map(|d| &d.referenced)),
            ("key_header", raw.key_header.as_ref().map(|h| &h.referenced)),
        ] {
            if let Some(span) = given {
                return Err(at(
                    span,
                    format!("field `destination.{name}`: a `_bulk` endpoint (`topic: {path}`) recognises a repeat by its document `_id`, as Elasticsearch does; leave `{name}` out"),
                ));
            }
        }
        return Ok(Own::started(Http {
            path,
            dedupe: Dedupe::Atomic,
            key_header: BULK_KEY.to_string(),
        }));
    }
    Ok(Own::started(Http {
        path,
        dedupe: raw.dedupe.as_ref().map_or(Dedupe::Off, |d| d.value),
        key_header: key_header.to_ascii_lowercase(),
    }))
}

impl Destination for Http {
    fn kind(&self) -> Kind {
        Kind::Http
    }

    fn builtin_promise(&self) -> Promise {
        self.promise_bound()
            .map_or(Promise::EffectivelyOnce, |(p, _)| p)
    }

    fn promise_bound(&self) -> Option<(Promise, &'static str)> {
        (!self.dedupe.recognises_repeats()).then_some((
            Promise::AtLeastOnce,
            "an HTTP endpoint without `dedupe: true` stores every copy (a lost answer means a resend it cannot recognise), so it keeps `at_least_once`",
        ))
    }

    fn refuses_one_write(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn scripted_answers(&self) -> Option<&'static super::ScriptedAnswers> {
        Some(&ANSWERS)
    }

    /// One request at a time: requests in flight together travel on separate connections and
    /// land in any order (see [`sink`]).
    fn default_window(&self) -> usize {
        1
    }

    fn settle(&self, _shape: &Shape) -> Arc<dyn Destination> {
        Arc::new(self.clone())
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        WriteKeyPlace::Meta(self.key_header.clone())
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        let bulk = bulk::is_bulk(&self.path);
        match value.as_str().map(str::trim).filter(|s| !s.is_empty()) {
            Some(name) if bulk && name != BULK_KEY => Err(format!(
                "a `_bulk` endpoint's write key is each document's `_id` (in its action line), not `{name}`: write http_header: _id"
            )),
            Some(name) if self.dedupe.recognises_repeats() && !name.eq_ignore_ascii_case(&self.key_header) => Err(format!(
                "the endpoint recognises a repeat by the header `{}` (`destination.key_header`), so a key in `{name}` would never be recognised: name the same header here, or set `destination.key_header: {name}`",
                self.key_header
            )),
            Some(name) => Ok(WriteKeyPlace::Meta(name.to_ascii_lowercase())),
            None => Err("the request header, e.g. http_header: Idempotency-Key".to_string()),
        }
    }

    fn output_options(&self, cfg: &mut crate::engine::OutputConfig) {
        cfg.topic = self.path.clone();
        if self.key_header != KEY_HEADER.to_ascii_lowercase() && !bulk::is_bulk(&self.path) {
            cfg.key_header = Some(self.key_header.clone());
        }
    }

    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>> {
        endpoint::provision(Arc::new(self.clone()), self, p).boxed()
    }

    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>> {
        async move {
            let Some(store) = endpoint::store_of(at) else {
                return Err(DestError::Reader(
                    "the HTTP endpoint is not running".to_string(),
                ));
            };
            Ok(Box::new(endpoint::Reader::new(store, r)) as Box<dyn ReadBack>)
        }
        .boxed()
    }
}
