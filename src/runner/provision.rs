//! Provisioning: the destination's receiving side and the proxy links in front of it, as one
//! [`Rig`] with one teardown.
//!
//! What to start and how is the destination kind's (`Destination::provision`, in
//! `src/dest/<kind>/broker.rs`): a local process, a container, a cluster, or the user's own
//! brokers. The runner only says what the drill needs of it ([`Needs`]) and what came up.
//! Nothing here knows about the system under test.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{RunError, Tapped, say};
use crate::dest::{Needs, Provision, Provisioned, Running, Runtime};
use crate::proxy::remote::{RemoteError, RemoteLink};
use crate::proxy::tap::{TapId, TapLog, Tapping};
use crate::proxy::{Link, LinkStatus};
use crate::scenario::{FaultAction, Plan, ProcessAction, longest_outage};

/// Everything a drill started outside the system under test.
pub struct Rig {
    /// The link the system under test forwards to (the first of `links`).
    pub link: Link,
    /// Every proxy link, one per broker listener, named after the destination kind.
    pub links: Vec<Link>,
    /// The destination's receiving side: what the broker faults act on and the reader reads.
    pub running: Running,
    /// What the report should say about how the broker was set up.
    pub notes: Vec<String>,
    /// The links' tap: its protocol, its log, the run's id, whether it pairs answers.
    tap: Option<(&'static str, Arc<TapLog>, String, bool)>,
    /// Cancels every link's tasks.
    link_cancel: CancellationToken,
    /// The link served by a `drill proxy` on another host (`links:`), in place of drill's own:
    /// then `links` is empty and `link` is drill's own link, stopped.
    pub remote: Option<Arc<RemoteLink>>,
    /// Stops the remote link's keeper (its own: stopping drill's links cancels theirs).
    remote_cancel: CancellationToken,
    /// The link in front of the server of a source drill starts (`source`: a Kafka source's
    /// broker, an outbox's PostgreSQL), when the engine reads from one:
    /// link faults name it like the destination's, nothing else about the destination applies.
    pub source_link: Option<Link>,
}

impl Rig {
    /// Starts the broker and its links for `plan`, and says what it started.
    pub async fn provision(
        plan: &Plan,
        runtime: Runtime,
        work: &Path,
        run_id: &str,
        seed: u64,
        cancel: &CancellationToken,
    ) -> Result<Rig, RunError> {
        let link_cancel = cancel.child_token();
        let spec = &plan.destination;
        let broker_tls = spec.kind.entry().broker_tls;
        let tls = match &spec.tls {
            Some(t) => Some(DrillTls::prepare(t, work, run_id, broker_tls)?),
            None => None,
        };
        let provision = Provision {
            spec,
            needs: needs(plan),
            runtime,
            work,
            run_id,
            links: link_cancel.clone(),
            tls: tls.as_ref().and_then(|t| t.broker.as_ref()),
            client_tls: tls.as_ref().map(|t| t.client.clone()),
        };
        let Provisioned {
            links,
            mut running,
            mut notes,
        } = spec.imp.provision(provision).await?;
        if let Some(t) = &tls {
            running.access.tls = Some(t.client.clone());
            notes.push(t.note.clone());
        }
        // The expired certificate a link presents for `bad_certificate` with `certificate:
        // expired`: the broker's own from the drill's CA (a CA drill mints only).
        if let Some(files) = tls.as_ref().and_then(|t| t.minted.as_ref()) {
            let expired = crate::tls::server::expired(files).map_err(RunError::Verifier)?;
            for l in &links {
                l.set_expired(expired.clone());
            }
        }
        let terminate = tls.as_ref().and_then(|t| t.terminate.clone());
        if let Some(t) = &terminate {
            for l in &links {
                l.terminate(t.clone());
            }
        }
        let ciphertext = tls.is_some() && terminate.is_none();
        let Some(link) = links.first().cloned() else {
            return Err(RunError::Verifier(format!(
                "the {} destination made no link",
                spec.kind.name()
            )));
        };
        // Every link read by the kind's protocol tap, into one log. A link that carries TLS
        // untouched (`pass`) carries ciphertext: no tap can read it; a terminating one reads
        // the plaintext between its two TLS sides.
        let taps = spec.kind.entry().taps.filter(|_| !ciphertext);
        let tap = taps.map(|taps| {
            let maker = taps(run_id);
            let log = Arc::new(TapLog::default());
            let tapping = Tapping {
                maker: maker.clone(),
                log: log.clone(),
            };
            for l in &links {
                l.set_tap(tapping.clone());
            }
            (
                maker.protocol(),
                log,
                run_id.to_string(),
                maker.pairs_answers(),
            )
        });
        let mut rig = Rig {
            link,
            links,
            running,
            notes,
            tap,
            link_cancel,
            remote: None,
            remote_cancel: cancel.child_token(),
            source_link: None,
        };
        if let Some((name, at)) = plan.remote_links.iter().next()
            && let Err(e) = rig.serve_remotely(name, at).await
        {
            rig.teardown().await;
            return Err(e);
        }
        rig.say_provisioned(seed);
        Ok(rig)
    }

    /// Hands the link `name` to the `drill proxy` `at` names: reached and checked first (so a
    /// failure leaves drill's own link in place for the teardown), then drill's own link steps
    /// aside — nothing may reach the broker through it — and the remote link is kept.
    async fn serve_remotely(
        &mut self,
        name: &str,
        at: &crate::scenario::RemoteSpec,
    ) -> Result<(), RunError> {
        let remote = RemoteLink::reach(name, &at.api, at.token())
            .await
            .map_err(|e| {
                RunError::Broker(match e {
                    RemoteError::Invalid { .. } => crate::dest::DestError::Invalid(e.to_string()),
                    RemoteError::Unreachable { .. } => {
                        crate::dest::DestError::External(e.to_string())
                    }
                })
            })?;
        for l in std::mem::take(&mut self.links) {
            l.shutdown().await;
        }
        self.tap = None;
        remote.keep(self.remote_cancel.clone());
        self.remote = Some(remote);
        Ok(())
    }

    /// The link called `name`: one of the destination's, or the source's.
    pub fn link_named(&self, name: &str) -> Option<&Link> {
        self.links
            .iter()
            .chain(self.source_link.as_ref())
            .find(|l| l.name() == name)
    }

    /// Where the engine forwards to: the remote link's listen address, or drill's first link.
    pub fn engine_addr(&self) -> std::net::SocketAddr {
        match &self.remote {
            Some(r) => r.listen_addr(),
            None => self.link.listen_addr(),
        }
    }

    /// The link the engine forwards to, as last read (a Kafka-aware link's whole family).
    pub fn link_status(&self) -> LinkStatus {
        match &self.remote {
            Some(r) => r.status(),
            None => self.link.family_status(),
        }
    }

    /// Whether `name` is one of a Kafka-aware link's broker links through which nothing at all
    /// crossed in the whole drill (no connection accepted, no byte up), or one no metadata
    /// ever named: a cut of it met nothing, whatever the records did. False for every other
    /// link (a link the engine is pointed at is judged by the records).
    pub fn carried_nothing(&self, name: &str) -> bool {
        if self.links.iter().any(|l| l.name() == name) {
            return false;
        }
        let Some(head) = self
            .links
            .iter()
            .find(|l| l.is_kafka_aware() && name.starts_with(&format!("{}-", l.name())))
        else {
            return false;
        };
        match head.members().into_iter().find(|m| m.name() == name) {
            Some(m) => {
                let s = m.status();
                s.connections_accepted == 0 && s.bytes_upstream == 0
            }
            None => true,
        }
    }

    /// How many links stand between the engine and the broker.
    pub fn link_count(&self) -> usize {
        self.links.len() + usize::from(self.remote.is_some())
    }

    /// Says what was started and where every link points.
    fn say_provisioned(&self, seed: u64) {
        let r = &self.running;
        let at = r.addrs.first().map(ToString::to_string).unwrap_or_default();
        say(&format!("  broker: {} ({}) on {at}", r.version, r.runtime));
        for note in &self.notes {
            say(&format!("  {note}"));
        }
        for l in &self.links {
            l.seed(seed);
            say(&format!(
                "  proxy link {}: {} -> {}",
                l.name(),
                l.listen_addr(),
                l.upstream_addr()
            ));
        }
        if let Some(r) = &self.remote {
            say(&format!(
                "  remote link {}: {} -> {} (a drill proxy elsewhere; faults under a {} s lease)",
                r.name(),
                r.listen_addr(),
                r.upstream_addr(),
                crate::proxy::remote::LEASE.as_secs()
            ));
        }
    }

    /// What the links' tap saw, times relative to `t0` (the drill's start).
    pub fn tapped(&self, t0: Instant) -> Option<Tapped> {
        let (protocol, log, run, pairs) = self.tap.as_ref()?;
        let seen = log.seen();
        let name = |id: TapId| id.name(run);
        let ms = |at: Instant| at.saturating_duration_since(t0).as_millis() as u64;
        Some(Tapped {
            protocol,
            left: seen.left.into_iter().map(name).collect(),
            sent: seen
                .sent
                .into_iter()
                .map(|(id, at)| (name(id), ms(at)))
                .collect(),
            acked: seen.acked.into_iter().map(name).collect(),
            unreadable: seen.unreadable,
            frames: seen.frames,
            pairs_answers: *pairs,
            overlapping: seen.overlapping.into_iter().map(name).collect(),
            link: (self.links.len() == 1).then(|| self.links[0].name().to_string()),
        })
    }

    /// Stops every broker process, container and proxy link the drill started, and removes
    /// what it created on the user's brokers.
    pub async fn teardown(&mut self) {
        if let Some(r) = &self.remote {
            // Heal what this drill left in force (after Ctrl-C too); were this to fail, the
            // proxy heals it once the lease runs out.
            r.close().await;
        }
        self.remote_cancel.cancel();
        for l in self.links.iter().chain(self.source_link.as_ref()) {
            l.shutdown().await;
        }
        if let Some(said) = self.running.stop().await {
            say(&format!("  {said}"));
        }
        self.link_cancel.cancel();
    }
}

/// What the drill needs of its broker: a per-record size limit for poison records, whether
/// it kills or pauses the broker, and how long a resend must be recognised after.
fn needs(plan: &Plan) -> Needs {
    let broker = |pause: bool| {
        plan.faults.iter().any(|f| {
            matches!(f.what, FaultAction::Broker { action, .. } if !pause || action == ProcessAction::Pause)
        })
    };
    Needs {
        message_limit: (!plan.workload.poison.is_empty()).then(|| plan.workload.message_limit()),
        broker_faults: broker(false),
        pauses: broker(true),
        resend_after: longest_outage(&plan.faults, plan.workload.duration) + plan.engine.refusals.2,
        answers: plan
            .faults
            .iter()
            .any(|f| matches!(f.what, FaultAction::Answer { .. })),
    }
}

/// The drill's TLS: what the broker drill starts serves (if it starts one), what every client
/// of the broker trusts and shows, and the report's line about it.
struct DrillTls {
    broker: Option<crate::tls::BrokerTls>,
    client: crate::tls::TlsConfig,
    /// The links' TLS sides when they terminate TLS (`links: terminate`).
    terminate: Option<Arc<crate::proxy::terminate::Terminate>>,
    /// The files of the CA drill minted (`None`: the user's CA).
    minted: Option<crate::tls::TlsFiles>,
    note: String,
}

impl DrillTls {
    /// A CA minted for a broker drill starts, or the user's CA and client certificate for one
    /// they run (its key from the variable they named), checked before anything starts: a
    /// file that does not parse is bad input (exit 2), an unset variable is found at start
    /// like a credential (exit 3).
    fn prepare(
        spec: &crate::dest::TlsSpec,
        work: &Path,
        run_id: &str,
        broker_tls: bool,
    ) -> Result<DrillTls, RunError> {
        use crate::dest::{DestError, TlsSpec};
        use crate::tls::client::Given;
        const PASS: &str = "the links pass the ciphertext untouched, so no protocol tap reads it";
        const TERMINATE: &str = "the links terminate TLS (a TLS server to the engine with a certificate from the same CA, a TLS client to the broker), so the protocol tap reads what crosses";
        let dir = work.join("tls");
        match spec {
            TlsSpec::Minted {
                client_certificates,
                names,
                terminate,
            } => {
                let broker = crate::tls::BrokerTls::mint(&dir, run_id, names, *client_certificates)
                    .map_err(RunError::Verifier)?;
                let asks = if *client_certificates {
                    ", and asks every client for a certificate from it"
                } else {
                    ""
                };
                let (terminate, links) = if *terminate {
                    let t = crate::proxy::terminate::Terminate::in_front_of(&broker, broker_tls)
                        .map_err(RunError::Verifier)?;
                    (Some(Arc::new(t)), TERMINATE)
                } else {
                    (None, PASS)
                };
                let ca = broker.files.ca_file.display();
                let note = if broker_tls {
                    format!(
                        "TLS: the broker speaks only TLS, with certificates from a CA minted for this drill ({ca}){asks}; {links}"
                    )
                } else {
                    format!(
                        "TLS: the engine speaks TLS to the links, with certificates from a CA minted for this drill ({ca}){asks}; the broker serves no TLS, so the links speak plain to it and the protocol tap reads what crosses"
                    )
                };
                Ok(DrillTls {
                    note,
                    client: broker.client(),
                    minted: Some(broker.files.clone()),
                    broker: broker_tls.then_some(broker),
                    terminate,
                })
            }
            TlsSpec::Given {
                ca_file,
                client_cert_file,
                client_key_env,
                server_name,
            } => {
                let client = crate::tls::client::given(
                    &dir,
                    ca_file,
                    client_cert_file.as_deref(),
                    client_key_env.as_deref(),
                    server_name,
                )
                .map_err(|e| {
                    RunError::Broker(match e {
                        Given::Unset(m) => DestError::External(format!("destination.tls: {m}")),
                        Given::Bad(m) => DestError::Invalid(format!("destination.tls: {m}")),
                    })
                })?;
                let shows = if client.cert_file.is_some() {
                    ", showing your client certificate"
                } else {
                    ""
                };
                Ok(DrillTls {
                    note: format!(
                        "TLS: drill and the engine trust your CA ({}) and check the name `{server_name}`{shows}; {PASS}",
                        ca_file.display()
                    ),
                    client,
                    broker: None,
                    terminate: None,
                    minted: None,
                })
            }
        }
    }
}
