//! The drill's Kafka topic: created on a broker drill started ([`create_topic`]), found or
//! created on the user's cluster ([`find_or_create`], with each partition's end offset confirmed
//! by reading on: where the drill's records begin), and removed when drill made it
//! ([`delete`]).

use std::net::SocketAddr;
use std::time::Duration;

use crate::credentials::Secrets;
use crate::process::StartError;

/// Creates a Kafka topic with `partitions` partitions, through `bootstrap` (the broker's
/// advertised address answers the metadata, so that must be reachable from here).
pub async fn create_topic(
    bootstrap: SocketAddr,
    topic: &str,
    partitions: i32,
) -> Result<(), StartError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let fail = |why: String| StartError {
        what: format!("Kafka topic {topic}"),
        why,
    };
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap.to_string())
        .create()
        .map_err(|e| fail(e.to_string()))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
    for r in results {
        if let Err((name, code)) = r
            && code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
        {
            return Err(fail(format!("{name}: {code}")));
        }
    }
    Ok(())
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
pub async fn find_or_create(
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
        let consumer: BaseConsumer =
            crate::dest::kafka::client_config(&bootstrap.to_string(), &secrets)
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
    let consumer: BaseConsumer = crate::dest::kafka::client_config(&bootstrap.to_string(), secrets)
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
        let consumer: BaseConsumer = crate::dest::kafka::client_config(&bootstrap.to_string(), &secrets)
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
        crate::dest::kafka::client_config(&bootstrap.to_string(), secrets)
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
pub async fn delete(bootstrap: SocketAddr, topic: &str, secrets: &Secrets) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        crate::dest::kafka::client_config(&bootstrap.to_string(), secrets)
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
