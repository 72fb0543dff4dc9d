//! The scenario's `destination:` section: as written ([`RawDestination`]), and validated
//! ([`Spec`]).
//!
//! What every kind shares is read and checked here — the kind, the runtime, the topic, `tls`,
//! and what `runtime: external` shares (`create`, `keep`, `credentials`, the addresses as
//! host:port: [`Section::external`]). The kind's own validator ([`Entry::validate`]) reads its
//! own fields from the same text ([`Section::own`]), where a field neither it nor every kind
//! takes is refused (another kind's naming that kind), and makes its [`Destination`]. Every
//! error names the field and points at its line and column. [`schema`] is `drill schema`'s
//! `destination:`, one shape per kind.

use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::{Destination, Entry, Kind, Runtime};
use crate::credentials::Credentials;
use crate::located::{Located, at};

/// What every kind's `destination:` takes. Not `deny_unknown_fields`: the rest of the section
/// is the kind's own ([`Section::own`]), read again by the kind, where a field neither it nor
/// this struct names is refused with its line and column.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RawDestination {
    #[schemars(with = "Kind")]
    pub kind: Spanned<Kind>,
    /// Where the broker runs: `auto` (default: the best one this machine has), `container`,
    /// `process`, `embedded` (inside drill, where the kind has one) or `external` (one you
    /// run).
    #[serde(default)]
    pub runtime: Option<Runtime>,
    /// The MQTT topic, NATS subject, Kafka topic, HTTP path or PostgreSQL table the records go
    /// to (default `drill`; PostgreSQL: `drill_records`).
    #[serde(default)]
    pub topic: Option<String>,
    /// `runtime: external`: create the Kafka topic or the JetStream stream when it does not
    /// exist (default false: it must exist). What drill created it removes at the end unless
    /// `keep: true`.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub create: Option<Spanned<bool>>,
    /// `runtime: external`: keep what drill created when the drill ends (default false).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub keep: Option<Spanned<bool>>,
    /// `runtime: external`: the names of the environment variables holding the credentials —
    /// never the credentials themselves.
    #[serde(default)]
    #[schemars(with = "Option<RawCredentials>")]
    pub credentials: Option<Spanned<RawCredentials>>,
    /// MQTT, NATS and Kafka: the broker drill starts speaks TLS, with certificates from a CA
    /// drill mints for the drill (`{tls.ca_file}` for a user's engine). `true`, or `{
    /// client_certificates: true }` for mutual TLS, `names: [...]` for more names on the
    /// broker's certificate.
    #[serde(default)]
    #[schemars(with = "Option<RawTls>")]
    pub tls: Option<Spanned<RawTls>>,
}

/// The names of [`RawDestination`]'s fields, which every kind's own fields skip
/// (`own_fields!`, in `dest/mod.rs`).
pub const SHARED_FIELDS: [&str; 7] = [
    "kind",
    "runtime",
    "topic",
    "create",
    "keep",
    "credentials",
    "tls",
];

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

/// What a kind's validator ([`Entry::validate`]) is given: the shared fields, as written and
/// with `runtime` settled, and the scenario's text to read its own fields from.
pub struct Section<'a> {
    pub shared: &'a RawDestination,
    pub runtime: Runtime,
    entry: &'static Entry,
    text: &'a str,
}

/// What a kind's validator makes: its [`Destination`], and the brokers you run when the
/// section says `runtime: external` ([`Section::external`]).
pub struct Own {
    pub imp: Arc<dyn Destination>,
    pub external: Option<External>,
}

impl Own {
    /// A destination drill starts the broker of.
    pub fn started(imp: impl Destination + 'static) -> Own {
        Own {
            imp: Arc::new(imp),
            external: None,
        }
    }
}

impl Section<'_> {
    /// The kind's own fields: `destination:` read again as `F`, made by
    /// `own_fields!` in `dest/mod.rs` (every shared field skipped, any other refused). A
    /// field another kind takes is refused naming the kinds that take it.
    pub fn own<F: serde::de::DeserializeOwned>(&self) -> Result<F, Located> {
        #[derive(Deserialize)]
        struct Doc<F> {
            destination: F,
        }
        crate::located::read::<Doc<F>>(self.text)
            .map(|d| d.destination)
            .map_err(|e| self.refused(e))
    }

    /// Where the section itself was written (its `kind:`), for an error about the section.
    pub fn anchor(&self) -> &Location {
        &self.shared.kind.referenced
    }

    /// The topic as written.
    pub fn topic(&self) -> Option<&str> {
        self.shared.topic.as_deref()
    }

    /// An unknown field that is another kind's, said as such.
    fn refused(&self, mut e: Located) -> Located {
        let Some(field) = e
            .message
            .strip_prefix("unknown field `")
            .and_then(|m| m.split_once('`'))
            .map(|(f, _)| f.to_string())
        else {
            return e;
        };
        if let Some((wanted, _)) = self
            .entry
            .external_field
            .filter(|_| is_external_field(&field))
        {
            e.message = format!(
                "field `destination.{field}`: a `{}` destination takes `{wanted}` (with `runtime: external`)",
                self.entry.name
            );
        } else if let Some(takers) = takers(&field) {
            e.message =
                format!("field `destination.{field}`: only a {takers} destination takes it");
        }
        e
    }

    /// `runtime: external`: the brokers you run, at `hosts` (`host:port` each, the kind's
    /// [`Entry::external_field`], written at `written`), with `create`, `keep` and
    /// `credentials`. Without it none of these may be given.
    pub fn external(
        &self,
        written: Option<&Location>,
        hosts: &[&Spanned<String>],
    ) -> Result<Option<External>, Located> {
        let (wanted, example) = self.entry.external_field.unwrap_or_default();
        if !self.goes_external(written)? {
            return Ok(None);
        }
        if hosts.is_empty() {
            return Err(at(
                self.anchor(),
                format!(
                    "field `destination.{wanted}`: `runtime: external` needs the broker address(es), e.g. {wanted}: {example}"
                ),
            ));
        }
        for a in hosts {
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
        self.made_external(hosts.iter().map(|a| a.value.clone()).collect())
    }

    /// `runtime: external` where the kind's field names no host:port but where to find one
    /// (PostgreSQL's `dsn_env`: the variable holding the connection string), written at
    /// `written`.
    pub fn external_elsewhere(
        &self,
        written: Option<&Location>,
    ) -> Result<Option<External>, Located> {
        let (wanted, example) = self.entry.external_field.unwrap_or_default();
        if !self.goes_external(written)? {
            return Ok(None);
        }
        if written.is_none() {
            return Err(at(
                self.anchor(),
                format!(
                    "field `destination.{wanted}`: `runtime: external` needs the NAME of the environment variable holding the connection string, e.g. {wanted}: {example}"
                ),
            ));
        }
        self.made_external(Vec::new())
    }

    /// Whether the section says `runtime: external`; without it, the external fields (the
    /// kind's, written at `written`, `create`, `keep`, `credentials`) are refused.
    fn goes_external(&self, written: Option<&Location>) -> Result<bool, Located> {
        if self.runtime == Runtime::External {
            return Ok(true);
        }
        let raw = self.shared;
        let extra = written
            .zip(self.entry.external_field)
            .map(|(l, (field, _))| (field, *l))
            .into_iter()
            .chain(raw.create.as_ref().map(|c| ("create", c.referenced)))
            .chain(raw.keep.as_ref().map(|k| ("keep", k.referenced)))
            .chain(
                raw.credentials
                    .as_ref()
                    .map(|c| ("credentials", c.referenced)),
            )
            .next();
        match extra {
            Some((field, loc)) => Err(at(
                &loc,
                format!(
                    "field `destination.{field}`: goes with `runtime: external` (brokers you already run); drill starts its own otherwise"
                ),
            )),
            None => Ok(false),
        }
    }

    fn made_external(&self, addresses: Vec<String>) -> Result<Option<External>, Located> {
        let raw = self.shared;
        Ok(Some(External {
            addresses,
            create: raw.create.as_ref().is_some_and(|c| c.value),
            keep: raw.keep.as_ref().is_some_and(|k| k.value),
            credentials: credentials(raw, self.entry)?,
        }))
    }
}

/// `destination:` → a [`Spec`]: the shared fields, then the kind's own (its validator reads
/// them from `text`, the whole scenario).
pub fn validate(raw: &RawDestination, text: &str) -> Result<Spec, Located> {
    let kind = raw.kind.value;
    let entry = kind.entry();
    if let Some(t) = raw.tls.as_ref().filter(|_| !entry.tls) {
        let takers = takers("tls").unwrap_or_default();
        return Err(at(
            &t.referenced,
            format!("field `destination.tls`: only a {takers} destination takes it"),
        ));
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
    let section = Section {
        shared: raw,
        runtime,
        entry,
        text,
    };
    let own = (entry.validate)(&section)?;
    Ok(Spec {
        kind,
        runtime,
        tls: tls(raw, runtime, own.external.as_ref())?,
        topic: raw.topic.clone().unwrap_or_else(|| "drill".to_string()),
        imp: own.imp,
        external: own.external,
    })
}

/// The JSON Schema of `destination:`: `Destination`, one of a shape per kind
/// (`MqttDestination`, …), each the shared fields and the kind's own, `kind` fixed to its name
/// and nothing else allowed: as strict as [`validate`].
pub fn schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use schemars::JsonSchema;
    let shared = RawDestination::json_schema(g);
    let prefix = format!("#{}/", g.settings().definitions_path);
    let mut shapes = Vec::new();
    for kind in Kind::ALL {
        let entry = kind.entry();
        let mut properties = shared
            .get("properties")
            .and_then(|p| p.as_object())
            .cloned()
            .unwrap_or_default();
        if !entry.tls {
            properties.remove("tls");
        }
        if let Some(p) = (entry.fields)(g)
            .get("properties")
            .and_then(|p| p.as_object())
        {
            properties.extend(p.clone());
        }
        properties.insert(
            "kind".into(),
            serde_json::json!({ "const": entry.name, "description": "The destination kind." }),
        );
        let mut name: String = entry.name.to_uppercase()[..1].to_string();
        name.push_str(&entry.name[1..]);
        let name = format!("{name}Destination");
        g.definitions_mut().insert(
            name.clone(),
            serde_json::json!({
                "description": format!("`destination:` of kind `{}`: the shared fields and its own.", entry.name),
                "type": "object",
                "properties": properties,
                "required": ["kind"],
                "additionalProperties": false,
            }),
        );
        shapes.push(serde_json::json!({ "$ref": format!("{prefix}{name}") }));
    }
    g.definitions_mut().insert(
        "Destination".into(),
        serde_json::json!({
            "description": "Where the records go: one of the kinds, each with the shared fields and its own.",
            "oneOf": shapes,
        }),
    );
    schemars::json_schema!({ "$ref": format!("{prefix}Destination") })
}

/// The fields the kind's own struct names ([`Entry::fields`]).
pub fn own_field_names(entry: &Entry) -> Vec<String> {
    let mut g = schemars::SchemaGenerator::default();
    (entry.fields)(&mut g)
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// `tls:` — on the brokers drill starts, as local processes or in containers (mosquitto, nats-server), with
/// certificates drill mints, or at the links only (Kafka: tansu serves no TLS); or to an MQTT
/// broker you run, with your CA and client certificate. What cannot speak TLS yet is refused
/// here, where it was written.
fn tls(
    raw: &RawDestination,
    runtime: Runtime,
    external: Option<&External>,
) -> Result<Option<TlsSpec>, Located> {
    let Some(t) = &raw.tls else { return Ok(None) };
    let fail = |m: String| Err(at(&t.referenced, format!("field `destination.tls`: {m}")));
    let none = RawTlsWith::default();
    let w = match &t.value {
        RawTls::On(false) => return Ok(None),
        RawTls::On(true) => &none,
        RawTls::With(w) => w,
    };
    if runtime == Runtime::External {
        return given(raw, w, external).or_else(fail);
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
fn given(
    raw: &RawDestination,
    w: &RawTlsWith,
    external: Option<&External>,
) -> Result<Option<TlsSpec>, String> {
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
    let host = external
        .and_then(|e| e.addresses.first())
        .and_then(|a| a.rsplit_once(':').map(|(h, _)| h.to_string()))
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
        .any(|k| k.entry().external_field.is_some_and(|(f, _)| f == field))
}

/// The kinds that take `field` as their own (`tls` among the shared), as `` `a` or `b` ``.
fn takers(field: &str) -> Option<String> {
    let takers: Vec<String> = Kind::ALL
        .iter()
        .filter(|k| {
            let entry = k.entry();
            if field == "tls" {
                entry.tls
            } else {
                own_field_names(entry).iter().any(|f| f == field)
            }
        })
        .map(|k| format!("`{}`", k.name()))
        .collect();
    (!takers.is_empty()).then(|| takers.join(" or "))
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

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;

    use super::*;

    /// `destination: { DEST }` in a scenario, validated: the column of DEST's first field is 16.
    fn check(dest: &str) -> Result<Spec, Located> {
        let text = format!(
            "name: t\ndestination: {{ {dest} }}\nworkload: {{ rate: 10/s, duration: 5s }}\n"
        );
        #[derive(Deserialize)]
        struct Doc {
            destination: RawDestination,
        }
        let doc: Doc = crate::located::read(&text)?;
        validate(&doc.destination, &text)
    }

    #[test]
    fn every_kind_skips_the_shared_fields_and_no_other() {
        let mut g = schemars::SchemaGenerator::default();
        let mut names: Vec<String> = RawDestination::json_schema(&mut g)
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap();
        names.sort();
        let mut shared = SHARED_FIELDS.map(String::from).to_vec();
        shared.sort();
        assert_eq!(
            names, shared,
            "SHARED_FIELDS and own_fields! must name RawDestination's fields"
        );
        let shared_values = [
            ("runtime", "auto"),
            ("topic", "t"),
            ("create", "true"),
            ("keep", "true"),
            ("credentials", "{ username_env: U, password_env: P }"),
            ("tls", "true"),
        ];
        for kind in Kind::ALL {
            for (field, value) in shared_values {
                if let Err(e) = check(&format!("kind: {}, {field}: {value}", kind.name())) {
                    assert!(
                        !e.message.contains("unknown field"),
                        "{kind:?} {field}: {}",
                        e.message
                    );
                }
            }
            let e = check(&format!("kind: {}, topc: t", kind.name()))
                .err()
                .unwrap();
            assert!(
                e.message
                    .starts_with("unknown field `topc`, expected one of"),
                "{}",
                e.message
            );
            assert_eq!(
                (e.at.line(), e.at.column()),
                (2, 24 + kind.name().len() as u64)
            );
        }
    }

    #[test]
    fn a_field_of_another_kind_is_refused_where_it_is_naming_who_takes_it() {
        let mut refused = 0;
        for kind in Kind::ALL {
            let own = own_field_names(kind.entry());
            for other in Kind::ALL {
                for field in own_field_names(other.entry()) {
                    if own.contains(&field) {
                        continue;
                    }
                    let e = check(&format!("kind: {}, {field}: x", kind.name()))
                        .err()
                        .unwrap_or_else(|| panic!("{kind:?} took `{field}`"));
                    assert!(
                        e.message
                            .starts_with(&format!("field `destination.{field}`: "))
                            && (e.message.contains("destination takes it")
                                || e.message.contains("destination takes `")),
                        "{kind:?} {field}: {}",
                        e.message
                    );
                    assert_eq!(
                        (e.at.line(), e.at.column()),
                        (2, 24 + kind.name().len() as u64)
                    );
                    refused += 1;
                }
            }
        }
        assert!(refused > 30, "{refused}");
    }
}
