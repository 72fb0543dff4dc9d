//! The scenario's `destination:` section: as written ([`RawDestination`]), and validated
//! ([`Spec`]).
//!
//! What every kind shares is checked here — the runtime, the topic, `runtime: external` with
//! its addresses, `create`, `keep` and credentials — and a field only some kinds take is
//! refused for the others, by the kind's [`Entry::fields`](super::Entry). Then the kind's own
//! validator makes its [`Destination`]. Every error names the field and points at its line.

use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::{Destination, Entry, Kind, Runtime};
use crate::credentials::Credentials;
use crate::located::{Located, at};
use crate::units::Dur;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDestination {
    #[schemars(with = "Kind")]
    pub kind: Spanned<Kind>,
    #[serde(default)]
    pub runtime: Option<Runtime>,
    #[serde(default)]
    pub topic: Option<String>,
    /// NATS only: the stream's duplicate window (default: the longest outage plus the longest
    /// backoff, at least 2 min).
    #[serde(default)]
    #[schemars(with = "Option<Dur>")]
    pub duplicate_window: Option<Spanned<Dur>>,
    /// NATS only: a cluster of this many nodes (routes between them, one proxy link each,
    /// named `nats-1` …). Default 1.
    #[serde(default)]
    #[schemars(with = "Option<usize>")]
    pub nodes: Option<Spanned<usize>>,
    /// `runtime: external`, Kafka: the brokers to bootstrap from (`host:port` each).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub bootstrap: Option<Vec<Spanned<String>>>,
    /// `runtime: external`, NATS: the servers (`host:port` each; several make a cluster).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub servers: Option<Vec<Spanned<String>>>,
    /// Syslog: how messages reach the receiver, `relp` (default), `tcp` or `udp`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub transport: Option<Spanned<String>>,
    /// Where drill reads what arrived, when it is not drill's own: syslog (`runtime:
    /// external`), the file the receiver writes every message to; postgres, the query that
    /// reads the table a user's engine writes.
    #[serde(default)]
    #[schemars(with = "Option<RawReadBack>")]
    pub read_back: Option<Spanned<RawReadBack>>,
    /// HTTP: how the endpoint recognises a repeated write key: `true` (= `atomic`), `false`
    /// (the default: it stores every copy), `conflict` (a `409` to a key in flight) or `racy`
    /// (check then insert). `effectively_once` needs one that recognises repeats.
    #[serde(default)]
    #[schemars(with = "Option<crate::dest::http::Dedupe>")]
    pub dedupe: Option<Spanned<crate::dest::http::Dedupe>>,
    /// HTTP: the request header that carries the write key (default `Idempotency-Key`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub key_header: Option<Spanned<String>>,
    /// `runtime: external`, PostgreSQL: the NAME of the environment variable holding the
    /// connection string (`postgres://user:password@host:5432/db`) — never the string itself.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub dsn_env: Option<Spanned<String>>,
    /// `runtime: external`, MQTT and syslog: the broker or receiver (`host:port`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub address: Option<Spanned<String>>,
    /// `runtime: external`: create the Kafka topic or the JetStream stream when it does not
    /// exist (default false: it must exist). What drill created it removes at the end unless
    /// `keep: true`.
    #[serde(default)]
    pub create: Option<bool>,
    #[serde(default)]
    pub keep: Option<bool>,
    /// NATS: the JetStream stream that stores the subject (default `DRILL`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub stream: Option<Spanned<String>>,
    /// `runtime: external`: the names of the environment variables holding the credentials —
    /// never the credentials themselves.
    #[serde(default)]
    #[schemars(with = "Option<RawCredentials>")]
    pub credentials: Option<Spanned<RawCredentials>>,
    /// MQTT and NATS: the broker drill starts speaks TLS, with certificates from a CA drill
    /// mints for the drill (`{tls.ca_file}` for a user's engine). `true`, or `{
    /// client_certificates: true }` for mutual TLS, `names: [...]` for more names on the
    /// broker's certificate.
    #[serde(default)]
    #[schemars(with = "Option<RawTls>")]
    pub tls: Option<Spanned<RawTls>>,
}

/// `tls:` of `destination:`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum RawTls {
    On(bool),
    With(RawTlsWith),
}

/// `tls: { … }`.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTlsWith {
    /// Mutual TLS: the broker asks the engine for a certificate from drill's CA
    /// (`{tls.client_cert_file}`, `{tls.client_key_file}`). Default false.
    #[serde(default)]
    pub client_certificates: Option<bool>,
    /// More names (DNS names or IP addresses) on the broker's certificate, beside 127.0.0.1
    /// and localhost.
    #[serde(default)]
    pub names: Option<Vec<String>>,
    /// What drill's links do with TLS: `pass` (default) forwards the ciphertext untouched,
    /// and every fault bites it; `terminate` makes each link a TLS server to the engine (the
    /// drill's CA) and a TLS client to the broker, so the protocol taps read what crosses.
    /// MQTT, and Kafka (whose broker, tansu, serves no TLS: the links speak plain Kafka to it).
    #[serde(default)]
    pub links: Option<LinkMode>,
    /// `runtime: external`: the PEM file of the CA your broker's certificate comes from.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// `runtime: external`, mutual TLS: the PEM file of the client certificate to show.
    #[serde(default)]
    pub client_cert_file: Option<String>,
    /// `runtime: external`, mutual TLS: the NAME of the environment variable holding the
    /// client's private key (the PEM text, or the path of a PEM file) — never the key itself.
    #[serde(default)]
    pub client_key_env: Option<String>,
    /// `runtime: external`: the name your broker's certificate carries (default: the host of
    /// `address`). The engine reaches the broker through drill's link on 127.0.0.1, so the
    /// name is checked against the broker's, not the link's.
    #[serde(default)]
    pub server_name: Option<String>,
}

/// `tls.links:` — what a link does with the TLS it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LinkMode {
    /// The link forwards the ciphertext untouched.
    Pass,
    /// The link is a TLS server to the engine and a TLS client to the broker.
    Terminate,
}

/// What a drill's TLS is to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSpec {
    /// A broker drill starts: drill mints the CA and every certificate.
    Minted {
        /// Mutual TLS.
        client_certificates: bool,
        /// More names on the broker's certificate.
        names: Vec<String>,
        /// The links terminate TLS (`links: terminate`) instead of passing it.
        terminate: bool,
    },
    /// A broker you run: your CA, and your client certificate under mutual TLS.
    Given {
        ca_file: std::path::PathBuf,
        client_cert_file: Option<std::path::PathBuf>,
        client_key_env: Option<String>,
        server_name: String,
    },
}

impl TlsSpec {
    /// Whether a client shows a certificate (mutual TLS).
    pub fn client_certificates(&self) -> bool {
        match self {
            TlsSpec::Minted {
                client_certificates,
                ..
            } => *client_certificates,
            TlsSpec::Given {
                client_cert_file, ..
            } => client_cert_file.is_some(),
        }
    }
}

/// `read_back:`: one of the two, as the kind takes.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawReadBack {
    /// Syslog: a file the receiver writes every message to, one per line, that drill can read
    /// while the drill runs (drill follows it from its end at the start).
    #[serde(default)]
    pub file: Option<String>,
    /// PostgreSQL: a query over the table a user's engine writes (`select * from readings`);
    /// drill finds the ids in any text or JSON column of each row it returns, and times a row
    /// by its `stored_at` column when it has one.
    #[serde(default)]
    pub sql: Option<String>,
}

/// Where an external broker's credentials are: environment variable names.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCredentials {
    #[serde(default)]
    pub username_env: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    /// Kafka: the SASL mechanism (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`; default `PLAIN`).
    #[serde(default)]
    pub sasl_mechanism: Option<String>,
}

/// The fields of `destination:` that only some kinds take ([`Entry::fields`]), with where each
/// was given.
fn kind_fields(raw: &RawDestination) -> [(&'static str, Option<Location>); 12] {
    let kind = raw.kind.referenced;
    [
        (
            "duplicate_window",
            raw.duplicate_window.as_ref().map(|w| w.referenced),
        ),
        ("nodes", raw.nodes.as_ref().map(|n| n.referenced)),
        ("stream", raw.stream.as_ref().map(|s| s.referenced)),
        ("bootstrap", raw.bootstrap.as_ref().map(|_| kind)),
        ("servers", raw.servers.as_ref().map(|_| kind)),
        ("address", raw.address.as_ref().map(|a| a.referenced)),
        ("dsn_env", raw.dsn_env.as_ref().map(|a| a.referenced)),
        ("transport", raw.transport.as_ref().map(|t| t.referenced)),
        ("read_back", raw.read_back.as_ref().map(|r| r.referenced)),
        ("dedupe", raw.dedupe.as_ref().map(|d| d.referenced)),
        ("key_header", raw.key_header.as_ref().map(|k| k.referenced)),
        ("tls", raw.tls.as_ref().map(|t| t.referenced)),
    ]
}

/// A validated `destination:`.
#[derive(Debug, Clone)]
pub struct Spec {
    pub kind: Kind,
    /// Where the broker runs (`auto` picks the best one available).
    pub runtime: Runtime,
    /// The MQTT topic, the NATS subject, the Kafka topic.
    pub topic: String,
    /// `runtime: external`: the user's own brokers.
    pub external: Option<External>,
    /// The broker speaks TLS (`tls:`).
    pub tls: Option<TlsSpec>,
    /// The kind's own settings and everything it knows how to do: the scenario's rules, its
    /// broker, its reader (see [`Destination`]).
    pub imp: Arc<dyn Destination>,
}

impl Spec {
    /// One proxy link per broker node, named after the kind: `mqtt`; `nats-1`, `nats-2` … for
    /// a cluster.
    pub fn link_names(&self) -> Vec<String> {
        self.imp.link_names()
    }

    /// The link the system under test forwards to (the first).
    pub fn link_name(&self) -> String {
        self.link_names().into_iter().next().unwrap_or_default()
    }
}

/// Brokers the user already runs (`runtime: external`): drill starts none, puts its links in
/// front of them, refuses broker faults, and never deletes what it did not create.
#[derive(Debug, Clone)]
pub struct External {
    /// `host:port` each, as written: Kafka's bootstrap list, NATS's servers, MQTT's address.
    pub addresses: Vec<String>,
    /// Create the topic (Kafka) or stream (NATS) when it does not exist.
    pub create: bool,
    /// Keep what drill created when the drill ends (else drill removes it).
    pub keep: bool,
    pub credentials: Credentials,
}

/// What a kind's validator is given besides the raw section: what every kind shares, checked.
pub struct Common {
    pub runtime: Runtime,
    pub external: Option<External>,
}

/// `destination:` → a [`Spec`]: the shared fields, then the kind's own (its validator).
pub fn validate(raw: &RawDestination) -> Result<Spec, Located> {
    let kind = raw.kind.value;
    let entry = kind.entry();
    for (field, given) in kind_fields(raw) {
        if let Some(loc) = given
            && !entry.fields.contains(&field)
            && !is_external_field(field)
        {
            return Err(at(&loc, refused_field(field)));
        }
    }
    let runtime = raw.runtime.unwrap_or(Runtime::Auto);
    if !entry.embedded && runtime == Runtime::Embedded {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.runtime`: there is no embedded {} broker; use `process` or `auto`",
                kind.name()
            ),
        ));
    }
    let common = Common {
        runtime,
        external: external(raw, entry, runtime)?,
    };
    Ok(Spec {
        kind,
        runtime,
        tls: tls(raw, runtime)?,
        topic: raw.topic.clone().unwrap_or_else(|| "drill".to_string()),
        imp: (entry.validate)(raw, &common)?,
        external: common.external,
    })
}

/// `tls:` — on the brokers drill starts, as local processes or in containers (mosquitto, nats-server), with
/// certificates drill mints, or at the links only (Kafka: tansu serves no TLS); or to an MQTT
/// broker you run, with your CA and client certificate. What cannot speak TLS yet is refused
/// here, where it was written.
fn tls(raw: &RawDestination, runtime: Runtime) -> Result<Option<TlsSpec>, Located> {
    let Some(t) = &raw.tls else { return Ok(None) };
    let fail = |m: String| Err(at(&t.referenced, format!("field `destination.tls`: {m}")));
    let none = RawTlsWith::default();
    let w = match &t.value {
        RawTls::On(false) => return Ok(None),
        RawTls::On(true) => &none,
        RawTls::With(w) => w,
    };
    if runtime == Runtime::External {
        return given(raw, w).or_else(fail);
    }
    let yours = [
        ("ca_file", w.ca_file.is_some()),
        ("client_cert_file", w.client_cert_file.is_some()),
        ("client_key_env", w.client_key_env.is_some()),
        ("server_name", w.server_name.is_some()),
    ];
    if let Some((field, _)) = yours.iter().find(|(_, given)| *given) {
        return fail(format!(
            "`{field}` is for a broker you run (`runtime: external`); drill mints its own CA and certificates for the brokers it starts"
        ));
    }
    let names = w.names.clone().unwrap_or_default();
    if let Some(bad) = names.iter().find(|n| {
        n.is_empty()
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'))
    }) {
        return Err(at(
            &t.referenced,
            format!("field `destination.tls.names`: `{bad}` is not a DNS name or IP address"),
        ));
    }
    let terminate = w.links == Some(LinkMode::Terminate);
    if !terminate && !raw.kind.value.entry().broker_tls {
        return fail(format!(
            "the {} broker drill starts serves no TLS (tansu); write `tls: {{ links: terminate }}`: the links speak TLS to the engine and plain {0} to the broker",
            raw.kind.value.name()
        ));
    }
    if let Some(why) = raw
        .kind
        .value
        .entry()
        .no_terminating_link
        .filter(|_| terminate)
    {
        return fail(why.to_string());
    }
    match runtime {
        Runtime::Embedded => fail(
            "drill's embedded MQTT broker serves no TLS; use `runtime: process` (mosquitto)"
                .to_string(),
        ),
        _ => Ok(Some(TlsSpec::Minted {
            client_certificates: w.client_certificates.unwrap_or(false),
            names,
            terminate,
        })),
    }
}

/// `tls:` to a broker you run: your CA file, and your client certificate with the variable
/// that holds its key. MQTT and NATS so far.
fn given(raw: &RawDestination, w: &RawTlsWith) -> Result<Option<TlsSpec>, String> {
    if !raw.kind.value.entry().external_tls {
        return Err(format!(
            "TLS to a {} broker you run is not built yet (MQTT and NATS are); drill speaks TLS to the {0} brokers it starts",
            raw.kind.value.name()
        ));
    }
    if w.client_certificates.is_some() || w.names.is_some() {
        return Err("`client_certificates` and `names` are for brokers drill starts; for yours give `ca_file` (and `client_cert_file` with `client_key_env`)".to_string());
    }
    if w.links == Some(LinkMode::Terminate) {
        return Err("`links: terminate` is for brokers drill starts so far: the link would show the engine a certificate from drill's CA in place of your broker's; use `links: pass` (the default)".to_string());
    }
    let Some(ca_file) = &w.ca_file else {
        return Err("a broker you run needs `ca_file`: the PEM file of the CA its certificate comes from, e.g. tls: { ca_file: /etc/ssl/site-ca.pem }".to_string());
    };
    if w.client_cert_file.is_some() != w.client_key_env.is_some() {
        return Err("mutual TLS needs both `client_cert_file` and `client_key_env` (the NAME of the variable holding the key)".to_string());
    }
    // The name checked: the broker's host as the scenario gives it (MQTT's `address`, the
    // first of NATS's `servers`), since every client reaches it through a link on 127.0.0.1.
    let first = raw
        .address
        .as_ref()
        .or_else(|| raw.servers.as_ref().and_then(|s| s.first()));
    let host = first
        .and_then(|a| a.value.rsplit_once(':').map(|(h, _)| h.to_string()))
        .unwrap_or_default();
    Ok(Some(TlsSpec::Given {
        ca_file: ca_file.into(),
        client_cert_file: w.client_cert_file.as_ref().map(Into::into),
        client_key_env: w.client_key_env.clone(),
        server_name: w.server_name.clone().unwrap_or(host),
    }))
}

fn is_external_field(field: &str) -> bool {
    Kind::ALL
        .iter()
        .any(|k| k.entry().external_field.0 == field)
}

/// A kind-specific field given to a kind that does not take it: which kinds do.
fn refused_field(field: &str) -> String {
    let takers: Vec<String> = Kind::ALL
        .iter()
        .filter(|k| k.entry().fields.contains(&field))
        .map(|k| format!("`{}`", k.name()))
        .collect();
    format!(
        "field `destination.{field}`: only a {} destination takes it",
        takers.join(" or ")
    )
}

/// `runtime: external`: the addresses the kind takes (`bootstrap` for Kafka, `servers` for
/// NATS, `address` for MQTT), `create`, `keep` and `credentials`. Without it none of these may
/// be given.
fn external(
    raw: &RawDestination,
    entry: &Entry,
    runtime: Runtime,
) -> Result<Option<External>, Located> {
    let (wanted, example) = entry.external_field;
    let given: Vec<(&str, Location)> = kind_fields(raw)
        .into_iter()
        .filter(|(f, _)| is_external_field(f))
        .filter_map(|(f, l)| l.map(|l| (f, l)))
        .collect();
    if runtime != Runtime::External {
        let extra = given
            .iter()
            .map(|(f, _)| *f)
            .chain(raw.create.is_some().then_some("create"))
            .chain(raw.keep.is_some().then_some("keep"))
            .chain(raw.credentials.is_some().then_some("credentials"))
            .next();
        if let Some(field) = extra {
            return Err(at(
                &raw.kind.referenced,
                format!(
                    "field `destination.{field}`: goes with `runtime: external` (brokers you already run); drill starts its own otherwise"
                ),
            ));
        }
        return Ok(None);
    }
    if let Some((field, loc)) = given.iter().find(|(f, _)| *f != wanted) {
        return Err(at(
            loc,
            format!(
                "field `destination.{field}`: a `{}` destination takes `{wanted}`",
                raw.kind.value.name()
            ),
        ));
    }
    let addresses: Vec<&Spanned<String>> = match wanted {
        "bootstrap" => raw.bootstrap.iter().flatten().collect(),
        "servers" => raw.servers.iter().flatten().collect(),
        // The address is in the connection string, read from the environment by the kind.
        "dsn_env" if raw.dsn_env.is_some() => {
            return Ok(Some(External {
                addresses: Vec::new(),
                create: raw.create.unwrap_or(false),
                keep: raw.keep.unwrap_or(false),
                credentials: credentials(raw, entry)?,
            }));
        }
        "dsn_env" => Vec::new(),
        _ => raw.address.iter().collect(),
    };
    if addresses.is_empty() && wanted == "dsn_env" {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.dsn_env`: `runtime: external` needs the NAME of the environment variable holding the connection string, e.g. dsn_env: {example}"
            ),
        ));
    }
    if addresses.is_empty() {
        return Err(at(
            &raw.kind.referenced,
            format!(
                "field `destination.{wanted}`: `runtime: external` needs the broker address(es), e.g. {wanted}: {example}"
            ),
        ));
    }
    for a in &addresses {
        let ok = a.value.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(at(
                &a.referenced,
                format!(
                    "field `destination.{wanted}`: `{}` is not host:port (e.g. kafka-1.staging:9092)",
                    a.value
                ),
            ));
        }
    }
    Ok(Some(External {
        addresses: addresses.iter().map(|a| a.value.clone()).collect(),
        create: raw.create.unwrap_or(false),
        keep: raw.keep.unwrap_or(false),
        credentials: credentials(raw, entry)?,
    }))
}

/// `credentials:`: environment variable names (user and password go together); the SASL
/// mechanism only where the kind has one.
fn credentials(raw: &RawDestination, entry: &Entry) -> Result<Credentials, Located> {
    let Some(c) = &raw.credentials else {
        return Ok(Credentials::default());
    };
    let v = &c.value;
    if let Some(m) = &v.sasl_mechanism
        && !entry.sasl_mechanisms.contains(&m.as_str())
    {
        return Err(at(
            &c.referenced,
            format!(
                "field `destination.credentials.sasl_mechanism`: `{m}`; Kafka only, one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
            ),
        ));
    }
    if v.username_env.is_some() != v.password_env.is_some() {
        return Err(at(
            &c.referenced,
            "field `destination.credentials`: `username_env` and `password_env` go together",
        ));
    }
    for name in [&v.username_env, &v.password_env].into_iter().flatten() {
        let usable = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if !usable {
            return Err(at(
                &c.referenced,
                format!(
                    "field `destination.credentials`: `{name}` is not an environment variable name; give the variable's NAME (the secret itself never goes in the file)"
                ),
            ));
        }
    }
    let sasl = !entry.sasl_mechanisms.is_empty() && v.username_env.is_some();
    Ok(Credentials {
        username_env: v.username_env.clone(),
        password_env: v.password_env.clone(),
        sasl_mechanism: v
            .sasl_mechanism
            .clone()
            .or_else(|| sasl.then(|| "PLAIN".to_string())),
        dsn_env: None,
    })
}
