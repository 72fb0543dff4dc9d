//! The states drill puts its RabbitMQ node in for a while (`{ target: destination, broker:
//! WORD, for: D }`), each the broker's own behaviour, nothing forged:
//!
//! - `alarm`: a memory alarm (`rabbitmqctl set_vm_memory_high_watermark 0`): RabbitMQ sends
//!   `connection.blocked` to every publishing connection and stops reading from it until the
//!   alarm clears (the watermark back to 0.4);
//! - `nack`: a policy on the drill's queue (`max-length: 0`, `overflow: reject-publish`): every
//!   publish is answered `basic.nack`, stored nowhere, until the policy is cleared;
//! - `queue_deleted`: the drill's queue deleted — under a moment's alarm, once it is empty, so
//!   no stored message goes with it — and declared again at the heal: meanwhile a publish to
//!   it is unroutable (a `mandatory` one comes back `312 NO_ROUTE` or nacked; without
//!   `mandatory` it is confirmed and dropped).
//!
//! The steps run in order on a task of their own; each takes a moment (`rabbitmqctl` about a
//! second, `queue_deleted` about three), so the state begins that much after the timeline's
//! instant.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::QueueDeleteOptions;
use tokio::sync::mpsc;

use super::Amqp;
use super::broker::Cluster;
use crate::dest::{AnswerControl, AnswerFault};

/// The words `broker:` takes on an amqp destination, and what each does.
pub const STATES: &[(&str, &str)] = &[
    (
        "alarm",
        "a memory alarm: publishers blocked (connection.blocked) until it clears",
    ),
    (
        "nack",
        "every publish nacked (a reject-publish policy with max-length 0)",
    ),
    (
        "queue_deleted",
        "the drill's queue deleted, declared again at the heal: publishes unroutable",
    ),
];

/// The node's states, set in order by a task of their own.
pub struct BrokerStates {
    steps: mpsc::UnboundedSender<Option<&'static str>>,
}

impl BrokerStates {
    pub fn start(cluster: Arc<Cluster>, addr: SocketAddr, amqp: Amqp) -> BrokerStates {
        let (steps, mut rx) = mpsc::unbounded_channel::<Option<&'static str>>();
        tokio::spawn(async move {
            let mut now: Option<&'static str> = None;
            while let Some(step) = rx.recv().await {
                let done = match (step, now) {
                    (Some(state), _) => enter(&cluster, addr, &amqp, state).await,
                    (None, Some(state)) => leave(&cluster, addr, &amqp, state).await,
                    (None, None) => Ok(()),
                };
                if let Err(why) = done {
                    eprintln!("drill: amqp broker {}: {why}", step.or(now).unwrap_or(""));
                }
                now = step;
            }
        });
        BrokerStates { steps }
    }
}

impl AnswerControl for BrokerStates {
    fn set(&self, fault: Option<AnswerFault>) {
        let step = match fault {
            Some(AnswerFault::Broker { state }) => Some(state),
            None => None,
            Some(_) => return,
        };
        let _ = self.steps.send(step);
    }
}

/// The policy that nacks every publish to the drill's queue.
const NACK_POLICY: &str = "drill-nack";

/// `^name$` with the name's regex characters escaped.
fn exactly(queue: &str) -> String {
    let mut pattern = String::from("^");
    for c in queue.chars() {
        if !c.is_ascii_alphanumeric() && c != '_' && c != '-' {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('$');
    pattern
}

async fn enter(cluster: &Cluster, addr: SocketAddr, amqp: &Amqp, state: &str) -> Result<(), String> {
    let queue = amqp.queue.as_str();
    match state {
        "alarm" => cluster
            .ctl(&["set_vm_memory_high_watermark", "0"])
            .await
            .map(drop),
        "nack" => cluster
            .ctl(&[
                "set_policy",
                NACK_POLICY,
                &exactly(queue),
                r#"{"max-length":0,"overflow":"reject-publish"}"#,
                "--apply-to",
                "queues",
                "--priority",
                "100",
            ])
            .await
            .map(drop),
        "queue_deleted" => delete_when_empty(cluster, addr, queue).await,
        other => Err(format!("no such state `{other}`")),
    }
}

async fn leave(cluster: &Cluster, addr: SocketAddr, amqp: &Amqp, state: &str) -> Result<(), String> {
    match state {
        "alarm" => cluster
            .ctl(&["set_vm_memory_high_watermark", "0.4"])
            .await
            .map(drop),
        "nack" => cluster.ctl(&["clear_policy", NACK_POLICY]).await.map(drop),
        "queue_deleted" => super::queue::declare(addr, &amqp.queue, amqp.queue_type).await,
        other => Err(format!("no such state `{other}`")),
    }
}

/// Deletes the queue once it holds nothing, with no publish on its way: a memory alarm first
/// stops RabbitMQ reading from every publishing connection, the reader (not a publisher) takes
/// what the queue still has, and once the queue has stayed empty for 300 ms it is deleted and
/// the alarm cleared. The publishes held back meanwhile reach the broker after the queue is
/// gone. The delete says how many messages went with it (none, unless a publish slipped past
/// the alarm); drill says so. Gives up after 10 s, leaving the queue.
async fn delete_when_empty(cluster: &Cluster, addr: SocketAddr, queue: &str) -> Result<(), String> {
    cluster.ctl(&["set_vm_memory_high_watermark", "0"]).await?;
    let deleted = delete_once_empty(addr, queue).await;
    let cleared = cluster.ctl(&["set_vm_memory_high_watermark", "0.4"]).await;
    deleted?;
    cleared.map(drop)
}

async fn delete_once_empty(addr: SocketAddr, queue: &str) -> Result<(), String> {
    let connection = super::queue::connect(addr).await?;
    let started = Instant::now();
    let mut empty_since: Option<Instant> = None;
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(10) {
        match super::queue::count(&connection, queue).await {
            Ok(0) if empty_since.is_some_and(|t| t.elapsed() >= Duration::from_millis(300)) => {
                let channel = connection
                    .create_channel()
                    .await
                    .map_err(|e| e.to_string())?;
                let destroyed = channel
                    .queue_delete(queue.into(), QueueDeleteOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = connection.close(200, "drill: deleted".into()).await;
                return match destroyed {
                    0 => Ok(()),
                    n => Err(format!(
                        "{n} message(s) stored after drill's count went with the queue: they count as lost, not by the engine's doing"
                    )),
                };
            }
            Ok(0) => {
                empty_since.get_or_insert_with(Instant::now);
            }
            Ok(n) => {
                empty_since = None;
                last = format!("{n} messages in it");
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = connection.close(200, "drill: not deleted".into()).await;
    Err(format!(
        "the queue was never empty within 10 s, so drill left it ({last})"
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_policy_pattern_names_the_queue_alone() {
        assert_eq!(super::exactly("drill.contract"), "^drill\\.contract$");
        assert_eq!(super::exactly("q_1-a"), "^q_1-a$");
    }
}
