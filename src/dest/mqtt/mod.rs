//! MQTT 5 (mosquitto, or drill's own broker embedded in drill): QoS 1, the write key in the user property
//! `write-key`. Keeps `at_least_once` (a lost PUBACK means a resend). One plain link, named
//! `mqtt`; its own field in `destination:` is `address` (`runtime: external`); `system.write_key: { mqtt_user_property:
//! NAME }` for a user's engine.

pub mod bench;
pub mod broker;
pub mod embedded;
pub mod read;
pub mod sink;
pub mod tap;

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
    Arc::new(tap::MqttTaps::new(ids))
}

/// What drill's embedded broker can be told to answer: `reject: { fraction, reason }`, a PUBACK
/// with that reason code for the share of QoS 1 publishes, withheld from every subscriber.
pub(crate) static ANSWERS: super::ScriptedAnswers = super::ScriptedAnswers {
    whole: false,
    reject: super::RejectWords {
        field: "reason",
        codes: &[
            (0x97, false, "0x97 (quota exceeded)"),
            (0x80, true, "0x80 (unspecified error)"),
            (0x83, true, "0x83 (implementation specific error)"),
            (0x87, true, "0x87 (not authorized)"),
            (0x90, true, "0x90 (topic name invalid)"),
            (0x99, true, "0x99 (payload format invalid)"),
        ],
    },
    states: &[],
};

/// The kind's registration.
pub static ENTRY: Entry = Entry {
    name: "mqtt",
    sink: &sink::MqttSink,
    fields: <MqttFields as schemars::JsonSchema>::json_schema,
    tls: true,
    external_field: Some(("address", "broker.site.local:1883")),
    sasl_mechanisms: &[],
    write_key_field: ("mqtt_user_property", "string"),
    embedded: true,
    broker_tls: true,
    validate,
    no_terminating_link: None,
    external_tls: true,
    no_remote_link: None,
    starter: super::Starter {
        topic: |d| Some(format!("drill/{d}")),
        write_key: |k| format!("{{ mqtt_user_property: {k} }}"),
    },
    bench: Some(&bench::MqttBench),
    link_bench: None,
    taps: Some(taps),
};

/// An MQTT login from `secrets`, if they give one.
pub fn login(secrets: &Secrets) -> Option<crate::wire::mqtt::Login> {
    secrets
        .login()
        .map(|(u, p)| crate::wire::mqtt::Login::new(u.to_string(), p.to_string()))
}

/// An MQTT destination: nothing of its own beyond what every kind has.
#[derive(Debug, Clone)]
pub struct Mqtt;

own_fields! {
    /// MQTT's own field of `destination:`.
    struct MqttFields {
        /// `runtime: external`: the broker (`host:port`).
        #[schemars(with = "Option<String>")]
        address: Option<serde_saphyr::Spanned<String>>,
    }
}

fn validate(section: &Section) -> Result<Own, Located> {
    let own: MqttFields = section.own()?;
    let written = own.address.as_ref().map(|a| &a.referenced);
    Ok(Own {
        imp: Arc::new(Mqtt),
        external: section.external(written, &own.address.iter().collect::<Vec<_>>())?,
    })
}

impl Destination for Mqtt {
    fn image(&self) -> Option<(&'static str, &'static str)> {
        Some(broker::IMAGE)
    }

    fn kind(&self) -> Kind {
        Kind::Mqtt
    }

    fn scripted_answers(&self) -> Option<&'static super::ScriptedAnswers> {
        Some(&ANSWERS)
    }

    fn settle(&self, _shape: &Shape) -> Arc<dyn Destination> {
        Arc::new(self.clone())
    }

    fn tls_at_connect(&self) -> bool {
        true
    }

    fn builtin_write_key(&self) -> WriteKeyPlace {
        WriteKeyPlace::Meta(crate::wire::mqtt::WRITE_KEY_PROPERTY.to_string())
    }

    fn write_key_place(&self, value: &serde_json::Value) -> Result<WriteKeyPlace, String> {
        match value.as_str() {
            Some(name) if !name.is_empty() => Ok(WriteKeyPlace::Meta(name.to_string())),
            _ => {
                Err("the name of the user property, e.g. mqtt_user_property: write-key".to_string())
            }
        }
    }

    fn provision<'a>(&'a self, p: Provision<'a>) -> BoxFuture<'a, Result<Provisioned, DestError>> {
        broker::provision(Arc::new(self.clone()), p).boxed()
    }

    fn reader<'a>(
        &'a self,
        at: &'a Running,
        r: ReaderSpec,
    ) -> BoxFuture<'a, Result<Box<dyn ReadBack>, DestError>> {
        async move {
            let tls = at.access.client_tls().map_err(DestError::Reader)?;
            let rejects = match &at.place {
                super::running::Place::InProcess(any) => any
                    .downcast_ref::<embedded::Embedded>()
                    .map(|b| b.rejects.clone()),
                _ => None,
            };
            let (decoder, t0) = (r.decoder.clone(), r.t0);
            let reader = read::Reader::start_as(
                at.addrs[0],
                &r.topic,
                r.decoder,
                r.t0,
                r.cancel,
                login(&at.access.secrets),
                tls.as_ref(),
            )
            .await
            .map_err(|e| DestError::Reader(e.to_string()))?;
            Ok(match rejects {
                Some(rejects) => Box::new(read::WithRejects {
                    reader,
                    rejects,
                    decoder,
                    t0,
                }) as Box<dyn ReadBack>,
                None => Box::new(reader) as Box<dyn ReadBack>,
            })
        }
        .boxed()
    }
}
