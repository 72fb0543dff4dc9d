//! Brokers the user already runs (`runtime: external`, DESIGN.md §2): drill starts nothing.
//! Here it reaches them, finds the drill's Kafka topic or JetStream stream (or creates it when
//! the scenario allows), notes where the drill's records will begin, and removes afterwards
//! only what it created itself. Every error is one line that says what to do.

use std::net::SocketAddr;
use std::time::Duration;

use crate::scenario::Secrets;

/// How long reaching an external broker may take before the drill gives up.
const REACH: Duration = Duration::from_secs(5);

/// Resolves `address` (`host:port`, from `field`) and opens a TCP connection to it.
pub async fn reach(address: &str, field: &str) -> Result<SocketAddr, String> {
    let resolved = tokio::time::timeout(REACH, tokio::net::lookup_host(address))
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            format!("cannot resolve the external broker `{address}` ({field}); check the name")
        })?;
    match tokio::time::timeout(REACH, tokio::net::TcpStream::connect(resolved)).await {
        Ok(Ok(_)) => Ok(resolved),
        Ok(Err(e)) => Err(format!(
            "cannot reach the external broker at {address} ({resolved}, {field}): {e}; check that it runs and listens there (with runtime: external drill starts nothing)"
        )),
        Err(_) => Err(format!(
            "cannot reach the external broker at {address} ({resolved}, {field}): no answer within {} s; check the address and any firewall",
            REACH.as_secs()
        )),
    }
}

/// The drill's Kafka topic on an external cluster.
#[derive(Debug, Clone)]
pub struct KafkaTopic {
    /// drill created it (and removes it at the end unless told to keep it).
    pub created: bool,
    /// Each partition's end offset now: where the drill's records begin.
    pub offsets: Vec<(i32, i64)>,
}

/// Finds `topic` through `bootstrap`, or creates it (`partitions`, the cluster's default
/// replication) when `create` allows; then reads each partition's end offset.
pub async fn kafka_topic(
    bootstrap: SocketAddr,
    topic: &str,
    partitions: i32,
    create: bool,
    secrets: &Secrets,
) -> Result<KafkaTopic, String> {
    let exists = kafka_partitions(bootstrap, topic, secrets).await?;
    let created = match (exists.is_empty(), create) {
        (false, _) => false,
        (true, false) => {
            return Err(format!(
                "Kafka topic `{topic}` does not exist on the external cluster at {bootstrap}; create it, or set `create: true` so drill creates it (and removes it at the end unless `keep: true`)"
            ));
        }
        (true, true) => {
            create_kafka_topic(bootstrap, topic, partitions, secrets).await?;
            true
        }
    };
    let topic_owned = topic.to_string();
    let secrets = secrets.clone();
    let offsets = tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = super::kafka_config(&bootstrap.to_string(), &secrets)
            .create()
            .map_err(|e| e.to_string())?;
        let metadata = consumer
            .fetch_metadata(Some(&topic_owned), Duration::from_secs(10))
            .map_err(|e| format!("metadata of {topic_owned}: {e}"))?;
        let mut offsets = Vec::new();
        for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (_, high) = consumer
                .fetch_watermarks(&topic_owned, p.id(), Duration::from_secs(10))
                .map_err(|e| format!("end offset of {topic_owned}/{}: {e}", p.id()))?;
            offsets.push((p.id(), high));
        }
        // A reported end offset can be stale (tansu's are): read on from it to partition EOF,
        // so the drill begins after the last record really there. With an accurate one this
        // reads nothing.
        confirm_ends(&bootstrap, &topic_owned, &secrets, &mut offsets)?;
        Ok::<_, String>(offsets)
    })
    .await
    .map_err(|e| e.to_string())??;
    Ok(KafkaTopic { created, offsets })
}

/// Reads each partition from its reported end to EOF and moves the end past any record found.
fn confirm_ends(
    bootstrap: &SocketAddr,
    topic: &str,
    secrets: &Secrets,
    offsets: &mut [(i32, i64)],
) -> Result<(), String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::Message;
    if offsets.is_empty() {
        return Ok(());
    }
    let consumer: BaseConsumer = super::kafka_config(&bootstrap.to_string(), secrets)
        .set("group.id", format!("drill-start-{}", std::process::id()))
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| e.to_string())?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    for (p, o) in offsets.iter() {
        assignment
            .add_partition_offset(topic, *p, rdkafka::Offset::Offset(*o))
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    // Done when every partition said EOF, or (an end offset that is stale may never produce an
    // EOF) when nothing more has come for 2 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut at_eof = std::collections::HashSet::new();
    let mut last_news = std::time::Instant::now();
    while at_eof.len() < offsets.len() && last_news.elapsed() < Duration::from_secs(2) {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "could not find where topic {topic} ends within 60 s (records kept coming)"
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_news = std::time::Instant::now();
                at_eof.remove(&m.partition());
                if let Some(end) = offsets.iter_mut().find(|(p, _)| *p == m.partition()) {
                    end.1 = end.1.max(m.offset() + 1);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_eof.insert(p);
            }
            Some(Err(e)) => return Err(format!("reading {topic} to its end: {e}")),
            None => {}
        }
    }
    Ok(())
}

/// The partitions `topic` has (empty when it does not exist).
async fn kafka_partitions(
    bootstrap: SocketAddr,
    topic: &str,
    secrets: &Secrets,
) -> Result<Vec<i32>, String> {
    let topic = topic.to_string();
    let secrets = secrets.clone();
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = super::kafka_config(&bootstrap.to_string(), &secrets)
            .set("allow.auto.create.topics", "false")
            .create()
            .map_err(|e| e.to_string())?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map_err(|e| {
                format!("the external Kafka cluster at {bootstrap} gave no metadata within 10 s: {e}; check the address and credentials")
            })?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect())
    })
    .await
    .map_err(|e| e.to_string())?
}

async fn create_kafka_topic(
    bootstrap: SocketAddr,
    topic: &str,
    partitions: i32,
    secrets: &Secrets,
) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        super::kafka_config(&bootstrap.to_string(), secrets)
            .create()
            .map_err(|e| e.to_string())?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let mut last = String::new();
    // The cluster's default replication first (-1); a broker that does not take it, 1.
    for replication in [-1, 1] {
        let results = admin
            .create_topics(
                &[NewTopic::new(
                    topic,
                    partitions,
                    TopicReplication::Fixed(replication),
                )],
                &options,
            )
            .await
            .map_err(|e| format!("creating Kafka topic {topic}: {e}"))?;
        match results.into_iter().next() {
            Some(Ok(_)) => return Ok(()),
            Some(Err((_, code))) => last = code.to_string(),
            None => return Ok(()),
        }
    }
    Err(format!(
        "creating Kafka topic {topic} on {bootstrap}: {last}"
    ))
}

/// Removes a topic drill created.
pub async fn delete_kafka_topic(
    bootstrap: SocketAddr,
    topic: &str,
    secrets: &Secrets,
) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        super::kafka_config(&bootstrap.to_string(), secrets)
            .create()
            .map_err(|e| e.to_string())?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .delete_topics(&[topic], &options)
        .await
        .map_err(|e| format!("deleting Kafka topic {topic}: {e}"))?;
    for r in results {
        if let Err((name, code)) = r {
            return Err(format!("deleting Kafka topic {name}: {code}"));
        }
    }
    Ok(())
}

/// The drill's JetStream stream on an external server or cluster.
#[derive(Debug, Clone)]
pub struct NatsStream {
    /// drill created it (and removes it at the end unless told to keep it).
    pub created: bool,
    /// The first sequence the drill's messages will have.
    pub first_sequence: u64,
    /// The stream's duplicate window (the report judges it against the outages).
    pub duplicate_window: Duration,
    pub replicas: usize,
}

/// What a drill's stream should be, when drill creates it.
pub struct StreamWish<'a> {
    pub name: &'a str,
    pub subject: &'a str,
    pub duplicate_window: Duration,
    pub max_message_size: Option<usize>,
    pub replicas: usize,
}

/// Finds the stream through `server`, or creates it when `create` allows; notes where the
/// drill's messages will begin. An existing stream must capture the subject.
pub async fn nats_stream(
    server: SocketAddr,
    wish: StreamWish<'_>,
    create: bool,
    secrets: &Secrets,
) -> Result<NatsStream, String> {
    use async_nats::jetstream;
    let client = super::nats_options(secrets)
        .await?
        .name("drill-provisioner")
        .connection_timeout(REACH)
        .connect(server.to_string())
        .await
        .map_err(|e| format!("cannot connect to the external NATS server at {server}: {e}; check the address and credentials"))?;
    let js = jetstream::new(client);
    match js.get_stream(wish.name).await {
        Ok(mut stream) => {
            let info = stream
                .info()
                .await
                .map_err(|e| format!("stream {}: {e}", wish.name))?;
            let captures = info
                .config
                .subjects
                .iter()
                .any(|s| subject_matches(s, wish.subject));
            if !captures {
                return Err(format!(
                    "JetStream stream `{}` on {server} does not capture subject `{}` (it captures {:?}); name the right stream (destination.stream) or topic",
                    wish.name, wish.subject, info.config.subjects
                ));
            }
            Ok(NatsStream {
                created: false,
                first_sequence: info.state.last_sequence + 1,
                duplicate_window: info.config.duplicate_window,
                replicas: info.config.num_replicas,
            })
        }
        Err(_) if !create => Err(format!(
            "JetStream stream `{}` does not exist on the external server at {server}; create it (capturing `{}`), or set `create: true` so drill creates it (and removes it at the end unless `keep: true`)",
            wish.name, wish.subject
        )),
        Err(_) => {
            let config = jetstream::stream::Config {
                name: wish.name.to_string(),
                subjects: vec![wish.subject.to_string()],
                duplicate_window: wish.duplicate_window,
                max_message_size: wish.max_message_size.map_or(-1, |m| m as i32),
                storage: jetstream::stream::StorageType::File,
                num_replicas: wish.replicas,
                ..Default::default()
            };
            js.create_stream(config)
                .await
                .map_err(|e| format!("creating JetStream stream {} on {server}: {e}", wish.name))?;
            Ok(NatsStream {
                created: true,
                first_sequence: 1,
                duplicate_window: wish.duplicate_window,
                replicas: wish.replicas,
            })
        }
    }
}

/// Removes a stream drill created.
pub async fn delete_nats_stream(
    server: SocketAddr,
    name: &str,
    secrets: &Secrets,
) -> Result<(), String> {
    let client = super::nats_options(secrets)
        .await?
        .name("drill-provisioner")
        .connection_timeout(REACH)
        .connect(server.to_string())
        .await
        .map_err(|e| e.to_string())?;
    async_nats::jetstream::new(client)
        .delete_stream(name)
        .await
        .map(|_| ())
        .map_err(|e| format!("deleting JetStream stream {name}: {e}"))
}

/// Whether NATS subject pattern `pattern` (with `*` and `>`) matches `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::subject_matches;

    #[test]
    fn subjects_match_like_nats() {
        assert!(subject_matches("drill", "drill"));
        assert!(subject_matches("site.*.data", "site.a.data"));
        assert!(subject_matches("site.>", "site.a.b"));
        assert!(!subject_matches("site.>", "site"));
        assert!(!subject_matches("site.*", "site.a.b"));
        assert!(!subject_matches("other", "drill"));
    }
}
