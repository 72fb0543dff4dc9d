//! Kafka (tansu here, `apache/kafka` in a container, or the user's cluster): an idempotent
//! producer with no age limit, the write key in the `write-key` header. Keeps `at_least_once`
//! (a new producer session after a crash may add a copy).
//!
//! Its link is Kafka-aware: `kafka`, and a link per broker the cluster names, `kafka-<node
//! id>`, each of which a fault may name. Arrival times are the producer's timestamps, so a
//! delivery during a cut is not judged a bypass. No poison records: a Kafka broker refuses an
//! oversized batch, not one record of it. `system.write_key: { kafka_header: NAME }` for a
//! user's engine.

pub mod bench;
pub mod broker;
mod link_bench;
pub mod read;
pub mod sink;
pub mod tap;
pub mod topic;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    DestError, Destination, Entry, Kind, Own, Provision, Provisioned, ReadBack, ReaderSpec,
    Running, Section, Shape,
};
use crate::credentials::Secrets;
use crate::located::Located;
use crate::verify::WriteKeyPlace;

/// The kind's tap for the ids of run `run`.
fn taps(run: &str) -> Arc<dyn crate::proxy::tap::TapMaker> {
    let ids = crate::proxy::tap::IdFinder::new(run);
    Arc::new(tap::KafkaTaps::new(ids))
}

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "kafka",
    sink: &sink::KafkaSink,
    fields: <KafkaFields as schemars::JsonSchema>::json_schema,
    tls: true,
    external_field: Some(("bootstrap", "[kafka-1:9092, kafka-2:9092]")),
    sasl_mechanisms: &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
    write_key_field: ("kafka_header", "string"),
    embedded: false,
    broker_tls: false,
    validate,
    no_terminating_link: None,
    external_tls: false,
    no_remote_link: Some("a Kafka-aware link per broker"),
    starter: super::Starter {
        topic: |d| Some(format!("drill-{d}")),
        write_key: |k| format!("{{ kafka_header: {k} }}"),
    },
    bench: Some(&bench::KafkaBench),
    link_bench: Some(link_bench::measure),
    taps: Some(taps),
};

/// The header the built-in engine puts the write key in.
pub const WRITE_KEY_HEADER: &str = "write-key";

/// A Kafka client's settings for `bootstrap`, with SASL (over plaintext) when `secrets` give a
/// user name: the Kafka-aware link reads the protocol, so it cannot carry TLS.
pub fn client_config(bootstrap: &str, secrets: &Secrets) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    if let Some((user, password)) = secrets.login() {
        config
            .set("security.protocol", "SASL_PLAINTEXT")
            .set(
                "sasl.mechanism",
                secrets.sasl_mechanism.as_deref().unwrap_or("PLAIN"),
            )
            .set("sasl.username", user)
            .set("sasl.password", password);
    }
    config
}

/// A Kafka destination: nothing of its own beyond what every kind has.
#[derive(Debug, Clone)]
pub struct Kafka;

own_fields! {
    /// Kafka's own field of `destination:`.
    struct KafkaFields {
        /// `runtime: external`: the brokers to bootstrap from (`host:port` each).
        #[schemars(with = "Option<Vec<String>>")]
        bootstrap: Option<Vec<serde_saphyr::Spanned<String>>>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let own: KafkaFields = section.own()?;
    let hosts: Vec<_> = own.bootstrap.iter().flatten().collect();
    let written = own.bootstrap.as_ref().map(|b| b.first().map_or(section.anchor(), |h| &h.referenced));
    Ok(Own {
        imp: Arc::new(Kafka),
        external: section.external(written, &hosts)?,
    })
}

impl Destination for Kafka {
    fn image(&self) -> Option<(&'static str, &'static str)> {
        Some(broker::IMAGE)
    }

    fn kind(&self) -> Kind {
        Kind::Kafka
    }

    /// `kafka`, or one broker's own link, `kafka-<node id>`.
    fn names_a_link(&self, link: &str) -> bool {
        link == "kafka"
            || link
                .strip_prefix("kafka-")
                .is_some_and(|n| n.parse::<i32>().is_ok_and(|n| n >= 0))
    }

    fn other_link_names(&self) -> &'static str {
        " (and `kafka-<node id>`, one broker's own link)"
    }

    fn refuses_one_write(&self) -> Result<(), &'static str> {
        Err(
            "poison records need a destination that refuses one write while it takes the rest (`nats`, `postgres`, `http`, or `mqtt` on mosquitto); remove it for `kafka`",
        )
    }

    fn settle(&self, _shape: &Shape) -> Arc<dyn Destination> {
        Arc::new(self.clone())
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        WriteKeyPlace::Meta(WRITE_KEY_HEADER.to_string())
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        match value.as_str() {
            Some(name) if !name.is_empty() => Ok(WriteKeyPlace::Meta(name.to_string())),
            _ => Err("the header's name, e.g. kafka_header: write-key".to_string()),
        }
    }

    /// Arrival times are the producer's record timestamps.
    fn arrivals_timed_by_destination(&self) -> bool {
        false
    }

    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>> {
        broker::provision(self.clone(), p).boxed()
    }

    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>> {
        let reader = read::TopicReader {
            topic: r.topic,
            t0: r.t0_wall,
            decoder: r.decoder,
            access: at.access.clone(),
        };
        async move { Ok(Box::new(reader) as Box<dyn ReadBack>) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::scenario::parse;

    fn err(text: &str) -> String {
        parse(Path::new("s.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_fault_may_name_one_brokers_link_and_poison_is_refused() {
        let kafka = "name: k\ndestination: { kind: kafka }\nworkload: { rate: 10/s, duration: 1m }\nfaults:\n  - { at: 10s, link: kafka-111, fault: refuse, for: 5s }\n";
        assert!(parse(Path::new("k.yaml"), kafka).is_ok());
        let e = err(&kafka.replace("kafka-111", "kafka-x"));
        assert!(e.contains("kafka-<node id>"), "{e}");
        let e = err(&kafka
            .replace("kind: kafka", "kind: mqtt")
            .replace("kafka-111", "mqtt-1"));
        assert!(
            e.contains("no link named `mqtt-1`") && !e.contains("node id"),
            "{e}"
        );
        let e = err(&kafka.replace("duration: 1m }", "duration: 1m, poison: [3] }"));
        assert!(e.contains("remove it for `kafka`"), "{e}");
        let e = err(
            "name: k\ndestination: { kind: kafka, runtime: external, bootstrap: [a:9092], credentials: { sasl_mechanism: MD5 } }\nworkload: { rate: 10/s, duration: 1m }\n",
        );
        assert!(
            e.contains("one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
            "{e}"
        );
    }
}
