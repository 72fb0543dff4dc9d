//! AMQP 0-9-1 (RabbitMQ): a durable quorum queue, `destination: { kind: amqp }`.
//!
//! - **The broker** ([`broker`]): Debian's RabbitMQ started by drill as a local process with a
//!   node name, cookie, data folder, ports and `epmd` of its own (the epmd as drill's child).
//! - **The queue**: `topic` names it (default `drill`); drill declares it durable, of type
//!   quorum (a replicated log fsynced before a confirm), before the first record. The built-in
//!   engine publishes to it through the default exchange, `mandatory`, persistent.
//! - **Write key**: the `message_id` property. AMQP has no deduplication: a publish whose
//!   confirm was lost is stored again, so the kind keeps `at_least_once` at most, whatever the
//!   engine declares.
//! - **The reader** ([`read`]): a consumer on the queue from before the first record, straight
//!   from the node; each message timed by its receipt.
//! - **Links**: one plain TCP link named `amqp`.
//! - **The tap**: bodies cross in plain text; the link's tap reads which records left the engine
//!   and went on (`proxy::tap::text`); it reads no confirm yet.
//! - **Not yet**: `runtime: container` and `external`, TLS, a tap that reads confirms and
//!   nacks, a forged `reject` fraction (issue 47).

pub mod broker;
pub mod queue;
pub mod read;
pub mod sink;
pub mod states;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    DestError, Destination, Entry, Kind, Own, Provision, Provisioned, ReadBack, ReaderSpec,
    Running, Section, Shape,
};
use super::Runtime;
use crate::located::{Located, at};
use crate::promise::Promise;
use crate::verify::WriteKeyPlace;

/// Why AMQP keeps `at_least_once` at most.
const NO_DEDUPE: &str = "AMQP has no deduplication: a publish whose confirm was lost is stored again when it is published again";

/// What drill can make its node do: `broker: alarm | nack | queue_deleted` for a while; it
/// forges no answer (`reject` is not built for AMQP).
pub(crate) static ANSWERS: super::ScriptedAnswers = super::ScriptedAnswers {
    whole: false,
    reject: super::RejectWords {
        field: "reason",
        codes: &[],
    },
    states: states::STATES,
};

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "amqp",
    sink: &sink::AmqpSink,
    fields: <AmqpFields as schemars::JsonSchema>::json_schema,
    tls: false,
    external_field: None,
    sasl_mechanisms: &[],
    write_key_field: ("amqp_message_id", "boolean"),
    embedded: false,
    broker_tls: false,
    validate,
    no_terminating_link: None,
    external_tls: false,
    no_remote_link: None,
    starter: super::Starter {
        topic: |d| Some(format!("drill.{d}")),
        write_key: |_| "{ amqp_message_id: true }".to_string(),
    },
    bench: None,
    link_bench: None,
    taps: Some(taps),
};

/// The kind's tap for the ids of run `run`: a message body crosses in plain text, so the tap
/// reads which records left the engine and went on to the node; it reads no confirm yet.
fn taps(run: &str) -> Arc<dyn crate::proxy::tap::TapMaker> {
    Arc::new(crate::proxy::tap::text::TextTaps::new(
        run,
        "AMQP message bodies (publishes; confirms not read)",
    ))
}

/// An AMQP destination: the queue the records go to.
#[derive(Debug, Clone)]
pub struct Amqp {
    pub queue: String,
    pub queue_type: queue::QueueType,
}

own_fields! {
    /// AMQP's own field of `destination:` (`topic` names the queue).
    struct AmqpFields {
        /// The drill's queue: `quorum` (default) or `classic` (where a transient publish is
        /// lost at a restart).
        queue_type: Option<queue::QueueType>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let own: AmqpFields = section.own()?;
    if matches!(
        section.runtime,
        Runtime::External | Runtime::Container | Runtime::Embedded
    ) {
        return Err(at(
            section.anchor(),
            "field `destination.runtime`: amqp runs RabbitMQ as a local process only, for now (container and external are not built yet); leave `runtime` out or write `runtime: process`",
        ));
    }
    Ok(Own {
        imp: Arc::new(Amqp {
            queue: section.topic().unwrap_or("drill").to_string(),
            queue_type: own.queue_type.unwrap_or_default(),
        }),
        external: section.external(None, &[])?,
    })
}

impl Destination for Amqp {
    fn kind(&self) -> Kind {
        Kind::Amqp
    }

    fn promise_bound(&self) -> Option<(Promise, &'static str)> {
        Some((Promise::AtLeastOnce, NO_DEDUPE))
    }

    fn scripted_answers(&self) -> Option<&'static super::ScriptedAnswers> {
        Some(&ANSWERS)
    }

    fn settle(&self, _shape: &Shape) -> Arc<dyn Destination> {
        Arc::new(self.clone())
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        WriteKeyPlace::Meta(read::MESSAGE_ID.to_string())
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        match value {
            serde_json::Value::Bool(true) => Ok(WriteKeyPlace::Meta(read::MESSAGE_ID.to_string())),
            _ => Err(
                "`amqp_message_id: true` (the engine sets the message_id property to the write key)"
                    .to_string(),
            ),
        }
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
            Ok(Box::new(read::QueueReader::start(
                at.addrs[0],
                &self.queue,
                r.decoder,
                r.t0,
                r.cancel,
            )) as Box<dyn ReadBack>)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::dest::AnswerFault;
    use crate::promise::Promise;
    use crate::scenario::{FaultAction, parse};

    const DRILL: &str = "name: a\ndestination: { kind: amqp }\nworkload: { rate: 10/s, duration: 20s }\nfaults:\n  - { at: 4s, target: destination, broker: nack, for: 6s }\n";

    fn err(text: &str) -> String {
        parse(Path::new("a.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn an_amqp_drill_keeps_at_least_once_and_takes_broker_states() {
        let plan = parse(Path::new("a.yaml"), DRILL).unwrap();
        assert_eq!(plan.engine.promise, Promise::AtLeastOnce);
        assert!(matches!(
            plan.faults[0].what,
            FaultAction::Answer {
                fault: AnswerFault::Broker { state: "nack" },
                ..
            }
        ));
        let e = err(&DRILL.replace("broker: nack", "broker: flood"));
        assert!(
            e.contains("`flood` is not a state") && e.contains("alarm, nack, queue_deleted"),
            "{e}"
        );
        let e = err(&DRILL.replace("broker: nack", "answer: 503"));
        assert!(e.contains("`broker:` one of alarm, nack, queue_deleted"), "{e}");
        let e = err(&DRILL.replace("broker: nack", "broker: nack, answer: 503"));
        assert!(e.contains("give `broker` alone"), "{e}");
        let e = err(&DRILL.replace("kind: amqp", "kind: http"));
        assert!(e.contains("has no broker states"), "{e}");
        let e = err(&DRILL.replace("kind: amqp }", "kind: amqp, runtime: container }"));
        assert!(e.contains("as a local process only"), "{e}");
        let e = err(&DRILL.replace("kind: amqp }", "kind: amqp, queue_type: stream }"));
        assert!(e.contains("queue_type"), "{e}");
        let e = err(&DRILL.replace(
            "workload:",
            "system: { builtin: { promise: effectively_once } }\nworkload:",
        ));
        assert!(e.contains("AMQP has no deduplication"), "{e}");
    }
}
