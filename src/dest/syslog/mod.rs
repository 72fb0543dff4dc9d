//! Syslog: RFC 5424 messages to a real rsyslog over RELP, plain TCP (octet counting, RFC 6587)
//! or UDP, `destination: { kind: syslog, transport: relp | tcp | udp }` (default `relp`).
//!
//! - **Write key**: structured data of drill's own SD-ID, `[drill key="…"]`
//!   (docs/src/design.md#rule-1-3); the record's id travels in the message text. A user's engine
//!   names its own element with `system.write_key: { syslog_sd: { id: ID, param: NAME } }`.
//! - **Promise**: only RELP answers each message (`rsp 200`), so only `relp` keeps
//!   `at_least_once`; over `tcp` the operating system takes the bytes and that is all anyone
//!   will ever know, and over `udp` not even that, so both keep `at_most_once`. Declaring more
//!   is an invalid scenario. For those two the report says "none lost before sending" and counts
//!   what was sent but never confirmed apart from what was lost ([`Destination::confirms`]).
//! - **Receiving side**: rsyslog as a local process with drill's own config ([`broker`]), or
//!   the user's (`runtime: external`: `address` plus `read_back: { file: PATH }`, the file the
//!   user's receiver writes every message to, one per line). The reader follows that file
//!   ([`read`]).
//! - **Links**: one link named `syslog`: a plain TCP link for `relp` and `tcp`, a datagram link
//!   for `udp` (refuse, swallow, delay, loss, blackhole; a fault that needs a stream is an
//!   invalid scenario, located).

pub mod broker;
pub mod read;
pub mod sink;
pub mod tap;

use std::path::PathBuf;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    DestError, Destination, Entry, Kind, Own, Provision, Provisioned, RawReadBack, ReadBack,
    ReaderSpec, Running, Section, Shape,
};
use serde_saphyr::Spanned;
use crate::engine::OutputConfig;
use crate::located::{Located, at};
use crate::promise::Promise;
use crate::verify::WriteKeyPlace;

/// How messages reach the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP with octet counting: the OS takes the bytes; nothing answers.
    Tcp,
    /// RELP: each message numbered and answered.
    Relp,
    /// One datagram per message: nothing answers, nothing is retransmitted.
    Udp,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::Relp, Transport::Tcp, Transport::Udp];

    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Relp => "relp",
            Transport::Udp => "udp",
        }
    }

    pub fn parse(name: &str) -> Option<Transport> {
        Transport::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The strongest promise a transport lets an engine keep, and why not more.
pub fn transport_promise(t: Transport) -> (Promise, &'static str) {
    match t {
        Transport::Relp => (
            Promise::AtLeastOnce,
            "syslog over RELP keeps `at_least_once` (a lost rsp means a resend, and the receiver cannot tell a repeat)",
        ),
        Transport::Tcp => (
            Promise::AtMostOnce,
            "syslog over plain TCP keeps only `at_most_once` (the receiver never confirms a message: what the OS took when a connection dies silently is gone, and a resend cannot be told from a new write)",
        ),
        Transport::Udp => (
            Promise::AtMostOnce,
            "syslog over UDP keeps only `at_most_once` (nothing confirms or retransmits a datagram)",
        ),
    }
}

/// The place of the built-in engine's write key, as the reader looks it up: the SD-ID and the
/// parameter, a space between (a space is in no SD-NAME).
pub fn sd_place(id: &str, param: &str) -> WriteKeyPlace {
    WriteKeyPlace::Meta(format!("{id} {param}"))
}

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "syslog",
    sink: &sink::SyslogSink,
    fields: <SyslogFields as schemars::JsonSchema>::json_schema,
    tls: false,
    external_field: Some(("address", "logs.site.local:2514")),
    sasl_mechanisms: &[],
    write_key_field: ("syslog_sd", "object"),
    embedded: false,
    broker_tls: false,
    validate,
    no_terminating_link: None,
    external_tls: false,
    no_remote_link: None,
    starter: super::Starter {
        topic: |_| None,
        write_key: |k| format!("{{ syslog_sd: {{ id: drill, param: {k} }} }}"),
    },
    bench: None,
    link_bench: None,
    taps: Some(taps),
};

/// The kind's tap for the ids of run `run`.
fn taps(run: &str) -> Arc<dyn crate::proxy::tap::TapMaker> {
    Arc::new(tap::taps(run))
}

/// A syslog destination: its transport and, for a receiver the user runs, the file it writes.
#[derive(Debug, Clone)]
pub struct Syslog {
    pub transport: Transport,
    /// `runtime: external`: the receiver's file.
    pub read_back: Option<PathBuf>,
}

own_fields! {
    /// Syslog's own fields of `destination:`.
    struct SyslogFields {
        /// How messages reach the receiver, `relp` (default), `tcp` or `udp`.
        #[schemars(with = "Option<String>")]
        transport: Option<Spanned<String>>,
        /// `runtime: external`: the receiver (`host:port`).
        #[schemars(with = "Option<String>")]
        address: Option<Spanned<String>>,
        /// `runtime: external`: `{ file: PATH }`, a file the receiver writes every message
        /// to, one per line, that drill can read while the drill runs (drill follows it from
        /// its end at the start).
        #[schemars(with = "Option<RawReadBack>")]
        read_back: Option<Spanned<RawReadBack>>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let raw: SyslogFields = section.own()?;
    let written = raw.address.as_ref().map(|a| &a.referenced);
    let external = section.external(written, &raw.address.iter().collect::<Vec<_>>())?;
    let transport = match &raw.transport {
        None => Transport::Relp,
        Some(t) => Transport::parse(&t.value).ok_or_else(|| {
            at(
                &t.referenced,
                format!(
                    "field `destination.transport`: `{}`; a syslog destination takes relp, tcp or udp",
                    t.value
                ),
            )
        })?,
    };
    let read_back = match (&raw.read_back, &external) {
        (Some(r), None) => {
            return Err(at(
                &r.referenced,
                "field `destination.read_back`: goes with `runtime: external` (a receiver you run); drill reads its own rsyslog's file otherwise".to_string(),
            ));
        }
        (Some(r), Some(_)) => match (&r.value.file, &r.value.sql) {
            (Some(file), None) => Some(PathBuf::from(file)),
            _ => {
                return Err(at(
                    &r.referenced,
                    "field `destination.read_back`: a syslog receiver is read from a file, e.g. read_back: { file: /var/log/drill/received.log }".to_string(),
                ));
            }
        },
        (None, Some(_)) => {
            return Err(at(
                section.anchor(),
                "field `destination.read_back`: an external syslog receiver needs a file drill can read, e.g. read_back: { file: /var/log/drill/received.log } (one message per line)".to_string(),
            ));
        }
        (None, None) => None,
    };
    Ok(Own {
        imp: Arc::new(Syslog {
            transport,
            read_back,
        }),
        external,
    })
}

impl Destination for Syslog {
    fn image(&self) -> Option<(&'static str, &'static str)> {
        Some(broker::IMAGE)
    }

    fn kind(&self) -> Kind {
        Kind::Syslog
    }

    fn builtin_promise(&self) -> Promise {
        transport_promise(self.transport).0
    }

    fn promise_bound(&self) -> Option<(Promise, &'static str)> {
        Some(transport_promise(self.transport))
    }

    fn confirms(&self) -> bool {
        self.transport == Transport::Relp
    }

    fn datagram_links(&self) -> bool {
        self.transport == Transport::Udp
    }

    fn refuses_one_write(&self) -> Result<(), &'static str> {
        Err(
            "rsyslog refuses no message: imrelp answers `200 OK` to every syslog frame whatever becomes of it (librelp's scsyslog.c), and an oversized frame is truncated or ends the session, never refused alone; leave `workload.poison` out",
        )
    }

    fn settle(&self, _shape: &Shape) -> Arc<dyn Destination> {
        Arc::new(self.clone())
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        sd_place(crate::wire::syslog::SD_ID, crate::wire::syslog::SD_PARAM)
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        let field = |name: &str| {
            value
                .get(name)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
        };
        let valid = |s: &str| !s.contains([' ', '=', ']', '"']);
        match (field("id"), field("param")) {
            (Some(id), Some(param)) if valid(id) && valid(param) => Ok(sd_place(id, param)),
            _ => Err(
                "the structured data element and parameter, e.g. syslog_sd: { id: drill, param: key } for [drill key=\"…\"]"
                    .to_string(),
            ),
        }
    }

    fn output_options(&self, cfg: &mut OutputConfig) {
        cfg.transport = Some(self.transport.name().to_string());
    }

    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>> {
        broker::provision(Arc::new(self.clone()), self, p).boxed()
    }

    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>> {
        async move {
            let file = at.access.received_file.clone().ok_or_else(|| {
                DestError::Reader("the syslog receiver gave no file to read".to_string())
            })?;
            let reader = match self.read_back {
                Some(_) => read::Reader::from_end(file, r.decoder, r.t0, r.cancel)
                    .map_err(DestError::External)?,
                None => read::Reader::start_stamped(file, r.decoder, (r.t0, r.t0_wall), r.cancel),
            };
            Ok(Box::new(reader) as Box<dyn ReadBack>)
        }
        .boxed()
    }
}
