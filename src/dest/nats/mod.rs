//! NATS JetStream (nats-server): each record published with `Nats-Msg-Id` = its write key, so
//! the stream's duplicate window turns a resend into `duplicate: true`. Keeps
//! `effectively_once` within the window; the built-in engine declares it unless told
//! otherwise.
//!
//! Its own fields in `destination:`: `stream` (default `DRILL`), `duplicate_window` (default:
//! the longest outage plus the longest backoff and two answer timeouts, at least 2 min) and
//! `nodes` (a cluster of 1 to 5 local servers, one link each: `nats-1` …; a broker fault may
//! name a node or `leader`). `system.write_key: { nats_msg_id: true }` for a user's engine.

pub mod bench;
pub mod broker;
pub mod read;
pub mod sink;
pub mod stream;
pub mod tap;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::running::Place;
use super::{
    DestError, Destination, Entry, Kind, Own, Provision, Provisioned, ReadBack, ReaderSpec,
    Running, Section, Shape,
};
use crate::credentials::Secrets;
use crate::located::{Located, at};
use serde_saphyr::Spanned;
use crate::promise::Promise;
use crate::verify::WriteKeyPlace;

/// The kind's tap for the ids of run `run`.
fn taps(run: &str) -> Arc<dyn crate::proxy::tap::TapMaker> {
    let ids = crate::proxy::tap::IdFinder::new(run);
    Arc::new(tap::NatsTaps::new(ids))
}

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "nats",
    sink: &sink::NatsSink,
    fields: <NatsFields as schemars::JsonSchema>::json_schema,
    tls: true,
    external_field: Some(("servers", "[nats-1:4222, nats-2:4222]")),
    sasl_mechanisms: &[],
    write_key_field: ("nats_msg_id", "boolean"),
    embedded: false,
    broker_tls: true,
    validate,
    no_terminating_link: Some("`links: terminate` is not built for NATS: nats-server speaks its INFO in plain text before the TLS handshake, so a terminating link would have to speak NATS itself; use `links: pass` (the default)"),
    external_tls: true,
    no_remote_link: None,
    starter: super::Starter {
        topic: |d| Some(format!("drill.{d}")),
        write_key: |_| "{ nats_msg_id: true }".to_string(),
    },
    bench: Some(&bench::NatsBench),
    link_bench: None,
    taps: Some(taps),
};

/// A stream's duplicate window when nothing else says: 2 minutes.
pub const STREAM_DEFAULT_WINDOW: Duration = Duration::from_secs(120);

/// A NATS client's options with `secrets` (a user name and password).
pub fn options(secrets: &Secrets) -> async_nats::ConnectOptions {
    match secrets.login() {
        Some((u, p)) => async_nats::ConnectOptions::with_user_and_password(u.into(), p.into()),
        None => async_nats::ConnectOptions::new(),
    }
}

/// `options` over TLS when `tls` is given (drill's CA, and a client certificate under mutual
/// TLS); the server's INFO comes first in plain text, as NATS does, then the handshake.
pub fn with_tls(
    options: async_nats::ConnectOptions,
    tls: Option<&crate::tls::ClientTls>,
) -> async_nats::ConnectOptions {
    match tls {
        Some(t) => options
            .require_tls(true)
            .tls_client_config((*t.rustls()).clone()),
        None => options,
    }
}

/// A reader's options: the credentials and TLS of `access`.
pub fn options_for(access: &crate::verify::Access) -> Result<async_nats::ConnectOptions, String> {
    Ok(with_tls(
        options(&access.secrets),
        access.client_tls()?.as_ref(),
    ))
}

/// A JetStream destination.
#[derive(Debug, Clone)]
pub struct Nats {
    /// The stream that captures the subject.
    pub stream: String,
    /// The stream's duplicate window; `None` until [`Destination::settle`] fills the default.
    pub duplicate_window: Option<Duration>,
    /// Servers: more than one is a cluster (one link each).
    pub nodes: usize,
}

own_fields! {
    /// NATS's own fields of `destination:`.
    struct NatsFields {
        /// The stream's duplicate window (default: the longest outage plus the longest
        /// backoff, at least 2 min).
        #[schemars(with = "Option<crate::units::Dur>")]
        duplicate_window: Option<Spanned<crate::units::Dur>>,
        /// A cluster of this many nodes (routes between them, one proxy link each, named
        /// `nats-1` …). Default 1.
        #[schemars(with = "Option<usize>")]
        nodes: Option<Spanned<usize>>,
        /// The JetStream stream that stores the subject (default `DRILL`).
        #[schemars(with = "Option<String>")]
        stream: Option<Spanned<String>>,
        /// `runtime: external`: the servers (`host:port` each; several make a cluster).
        #[schemars(with = "Option<Vec<String>>")]
        servers: Option<Vec<Spanned<String>>>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let raw: NatsFields = section.own()?;
    let hosts: Vec<_> = raw.servers.iter().flatten().collect();
    let written = raw
        .servers
        .as_ref()
        .map(|s| s.first().map_or(section.anchor(), |h| &h.referenced));
    let external = section.external(written, &hosts)?;
    let mut nodes = match &raw.nodes {
        None => 1,
        Some(n) if n.value == 0 || n.value > 5 => {
            return Err(at(
                &n.referenced,
                "field `destination.nodes`: a NATS cluster of 1 to 5 nodes",
            ));
        }
        Some(n) => n.value,
    };
    if let Some(e) = &external {
        if let Some(n) = &raw.nodes {
            return Err(at(
                &n.referenced,
                "field `destination.nodes`: an external NATS cluster has as many nodes as `servers` lists; leave `nodes` out",
            ));
        }
        if let Some(sixth) = raw.servers.iter().flatten().nth(5) {
            return Err(at(
                &sixth.referenced,
                "field `destination.servers`: at most 5 servers",
            ));
        }
        nodes = e.addresses.len();
    }
    let imp = Arc::new(Nats {
        stream: raw
            .stream
            .as_ref()
            .map_or_else(|| "DRILL".to_string(), |s| s.value.clone()),
        duplicate_window: raw.duplicate_window.as_ref().map(|w| w.value.0),
        nodes,
    });
    Ok(Own { imp, external })
}

impl Nats {
    /// `nats` for one server; `nats-1`, `nats-2` … for a cluster.
    fn link_names_of(&self) -> Vec<String> {
        if self.nodes <= 1 {
            vec!["nats".to_string()]
        } else {
            (1..=self.nodes).map(|n| format!("nats-{n}")).collect()
        }
    }

    /// What the report says of the drill's stream, and whether its duplicate window is long
    /// enough: shorter than the longest outage plus the longest backoff, a record resent after
    /// the outage is stored again (the finding `nats-short-duplicate-window` shows).
    fn stream_note(
        &self,
        subject: &str,
        replicas: usize,
        window: Duration,
        needed: Duration,
    ) -> String {
        let verdict = if window >= needed {
            "at least the longest outage plus the longest backoff".to_string()
        } else {
            format!(
                "SHORTER than the longest outage plus the longest backoff ({} s): a write resent after it is stored again, a duplicate the stream cannot catch",
                needed.as_secs()
            )
        };
        format!(
            "JetStream stream {} on subject `{subject}`: {replicas} replica(s), duplicate window {} s ({verdict})",
            self.stream,
            window.as_secs()
        )
    }
}

impl Destination for Nats {
    fn image(&self) -> Option<(&'static str, &'static str)> {
        Some(broker::IMAGE)
    }

    fn kind(&self) -> Kind {
        Kind::Nats
    }

    fn link_names(&self) -> Vec<String> {
        self.link_names_of()
    }

    fn nodes(&self) -> usize {
        self.nodes
    }

    /// The stream drops a resend it already has (same message id, within its window).
    fn builtin_promise(&self) -> Promise {
        Promise::EffectivelyOnce
    }

    /// A record resent after the longest outage, the longest backoff and two answer timeouts
    /// must still be recognised as a resend. At least 2 min.
    fn settle(&self, shape: &Shape) -> Arc<dyn Destination> {
        let window = self.duplicate_window.unwrap_or_else(|| {
            let w = shape.longest_outage + shape.longest_backoff + 2 * shape.answer_timeout;
            w.max(STREAM_DEFAULT_WINDOW)
        });
        Arc::new(Nats {
            duplicate_window: Some(window),
            ..self.clone()
        })
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        WriteKeyPlace::Meta(read::MSG_ID.to_string())
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        match value.as_bool() {
            Some(true) => Ok(WriteKeyPlace::Meta(read::MSG_ID.to_string())),
            _ => Err(
                "`nats_msg_id: true` (the engine sets Nats-Msg-Id to the write key)".to_string(),
            ),
        }
    }

    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>> {
        broker::provision(self.clone(), p).boxed()
    }

    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>> {
        async move {
            let reader = read::StreamReader::open(
                at.addrs.clone(),
                &self.stream,
                r.t0_wall,
                r.decoder,
                at.access.clone(),
            )
            .await
            .map_err(DestError::Reader)?;
            Ok(Box::new(reader) as Box<dyn ReadBack>)
        }
        .boxed()
    }

    /// The node the stream's leader is on, asked of every live node.
    fn leader<'a>(&'a self, at: &'a Running) -> BoxFuture<'a, Option<usize>> {
        async move {
            let Place::Nodes(nodes) = &at.place else {
                return None;
            };
            for node in nodes.iter().filter(|n| n.process.is_some()) {
                let tls = at.access.client_tls().ok().flatten();
                if let Some(leader) = stream::leader(node.addr, &self.stream, tls.as_ref()).await {
                    return nodes.iter().position(|n| n.name == leader);
                }
            }
            None
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::dest::Node;
    use crate::promise::Promise;
    use crate::scenario::{FaultAction, parse};

    fn err(text: &str) -> String {
        parse(Path::new("s.yaml"), text).unwrap_err().to_string()
    }

    /// The settled destination as its Debug shows it (its fields are the kind's own).
    fn settled(text: &str) -> String {
        format!(
            "{:?}",
            parse(Path::new("n.yaml"), text).unwrap().destination.imp
        )
    }

    #[test]
    fn a_nats_destination_gets_a_duplicate_window_longer_than_its_outages() {
        let text = "name: n\ndestination: { kind: nats }\nworkload: { rate: 10/s, duration: 10m }\nfaults:\n  - { at: 10s, link: nats, fault: swallow, direction: downstream, for: 5m }\n";
        let plan = parse(Path::new("n.yaml"), text).unwrap();
        assert_eq!(plan.engine.promise, Promise::EffectivelyOnce);
        // 5 min outage + 60 s backoff cap + twice the 3 s answer timeout.
        assert!(
            settled(text).contains("duplicate_window: Some(366s)"),
            "{}",
            settled(text)
        );
        let short = text.replace("for: 5m", "for: 5s");
        assert!(
            settled(&short).contains("duplicate_window: Some(120s)"),
            "{}",
            settled(&short)
        );
        let given = text.replace("kind: nats }", "kind: nats, duplicate_window: 10m }");
        assert!(settled(&given).contains("duplicate_window: Some(600s)"));
        let e = err(&text.replace("kind: nats }", "kind: nats, runtime: embedded }"));
        assert!(e.contains("no embedded nats broker"), "{e}");
        let e = err(&text
            .replace("kind: nats }", "kind: mqtt, duplicate_window: 1m }")
            .replace("link: nats", "link: mqtt"));
        assert!(e.contains("only a `nats` destination takes it"), "{e}");
        let cluster = text
            .replace("kind: nats }", "kind: nats, nodes: 3 }")
            .replace("link: nats,", "link: nats-2,")
            + "  - { at: 20s, target: broker, node: leader, action: kill, restart_after: 5s }\n";
        let plan = parse(Path::new("n.yaml"), &cluster).unwrap();
        assert_eq!(
            plan.destination.link_names(),
            ["nats-1", "nats-2", "nats-3"]
        );
        assert!(matches!(
            plan.faults[1].what,
            FaultAction::Broker {
                node: Node::Leader,
                ..
            }
        ));
        let e = err(&cluster.replace("node: leader", "node: 4"));
        assert!(e.contains("node number 1..=3"), "{e}");
        let e = err(&text.replace("kind: nats }", "kind: nats, nodes: 6 }"));
        assert!(e.contains("a NATS cluster of 1 to 5 nodes"), "{e}");
        let e = err(&text.replace("kind: nats }", "kind: mqtt, nodes: 3 }"));
        assert!(
            e.contains("field `destination.nodes`: only a `nats` destination takes it"),
            "{e}"
        );
        let e = err(&text.replace("kind: nats }", "kind: kafka, runtime: embedded }"));
        assert!(e.contains("no embedded kafka broker"), "{e}");
    }

    #[test]
    fn external_servers_make_the_cluster() {
        let ext = "name: x\ndestination: { kind: nats, runtime: external, servers: [a:4222, b:4222], create: true, credentials: { username_env: NATS_USER, password_env: NATS_PASSWORD } }\nworkload: { rate: 10/s, duration: 1m }\n";
        let plan = parse(Path::new("x.yaml"), ext).unwrap();
        let e = plan.destination.external.as_ref().unwrap();
        assert_eq!(plan.destination.imp.nodes(), 2);
        assert_eq!(plan.destination.link_names(), ["nats-1", "nats-2"]);
        assert!(e.create && !e.keep);
        assert_eq!(e.credentials.password_env.as_deref(), Some("NATS_PASSWORD"));
        let servers = "servers: [a:4222, b:4222]";
        for (text, says) in [
            (
                ext.replace(&format!("{servers}, "), ""),
                "needs the broker address",
            ),
            (ext.replace("a:4222", "a"), "is not host:port"),
            (ext.replace(servers, "address: a:4222"), "takes `servers`"),
            (
                ext.replace(", password_env: NATS_PASSWORD", ""),
                "go together",
            ),
            (
                ext.replace("NATS_USER", "s3cret!"),
                "is not an environment variable name",
            ),
            (
                ext.replace(servers, "servers: [a:1, b:1, c:1, d:1, e:1, f:1]"),
                "at most 5 servers",
            ),
            (
                ext.replace("create: true", "create: true, nodes: 2"),
                "leave `nodes` out",
            ),
        ] {
            let e = err(&text);
            assert!(e.contains(says), "{says}: {e}");
        }
        let e = err(
            "name: m\ndestination: { kind: mqtt, address: a:1883 }\nworkload: { rate: 10/s, duration: 1m }\n",
        );
        assert!(e.contains("goes with `runtime: external`"), "{e}");
    }
}
