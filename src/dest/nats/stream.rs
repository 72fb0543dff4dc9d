//! The drill's JetStream stream: created on a broker drill started ([`create_stream`]), found
//! or created on the user's ([`find_or_create`], [`delete`]), and where its leader is now
//! ([`leader`]). File storage, the subject, the duplicate window, and (for poison records) a
//! per-message size limit the stream enforces by refusing.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::credentials::Secrets;
use crate::dest::external::REACH;
use crate::process::StartError;

/// Creates the JetStream stream a drill writes to: file storage, `subject`, the duplicate
/// window, and (for poison records) a per-message size limit the stream enforces by refusing.
///
/// `replicas` > 1 needs a cluster; a new cluster elects its JetStream leader first, so this
/// retries for up to 30 s.
pub async fn create_stream(
    server: SocketAddr,
    name: &str,
    subject: &str,
    duplicate_window: Duration,
    max_message_size: Option<usize>,
    replicas: usize,
    tls: Option<&crate::tls::ClientTls>,
) -> Result<(), StartError> {
    use async_nats::jetstream;
    let fail = |why: String| StartError {
        what: format!("JetStream stream {name}"),
        why,
    };
    let client = crate::dest::nats::with_tls(async_nats::ConnectOptions::new(), tls)
        .name("drill-provisioner")
        .ignore_discovered_servers()
        .connect(server.to_string())
        .await
        .map_err(|e| fail(e.to_string()))?;
    let js = jetstream::new(client);
    let config = jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![subject.to_string()],
        duplicate_window,
        max_message_size: max_message_size.map_or(-1, |m| m as i32),
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match js.create_stream(config.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(fail(e.to_string())),
        }
    }
}

/// The server name of the node that leads stream `name` now, asked of `server`.
pub async fn leader(
    server: SocketAddr,
    name: &str,
    tls: Option<&crate::tls::ClientTls>,
) -> Option<String> {
    let client = crate::dest::nats::with_tls(async_nats::ConnectOptions::new(), tls)
        .name("drill-provisioner")
        .ignore_discovered_servers()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.to_string())
        .await
        .ok()?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(name).await.ok()?;
    stream.info().await.ok()?.cluster.as_ref()?.leader.clone()
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
pub async fn find_or_create(
    server: SocketAddr,
    wish: StreamWish<'_>,
    create: bool,
    secrets: &Secrets,
    tls: Option<&crate::tls::ClientTls>,
) -> Result<NatsStream, String> {
    use async_nats::jetstream;
    let client = crate::dest::nats::with_tls(crate::dest::nats::options(secrets), tls)
        .name("drill-provisioner")
        .connection_timeout(REACH)
        .connect(server.to_string())
        .await
        .map_err(|e| format!("cannot connect to the external NATS server at {server}: {e}; check the address and credentials"))?;
    let js = jetstream::new(client);
    // A cluster still electing its JetStream leader answers "temporarily unavailable" (503,
    // 10008): asked again until it settles, as a new cluster does within seconds.
    let deadline = Instant::now() + SETTLE;
    let found = loop {
        match js.get_stream(wish.name).await {
            Err(e) if unsettled(&e.to_string()) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => break other,
        }
    };
    match found {
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
            loop {
                match js.create_stream(config.clone()).await {
                    Ok(_) => break,
                    Err(e) if unsettled(&e.to_string()) && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(e) => {
                        return Err(format!(
                            "creating JetStream stream {} on {server}: {e}",
                            wish.name
                        ));
                    }
                }
            }
            Ok(NatsStream {
                created: true,
                first_sequence: 1,
                duplicate_window: wish.duplicate_window,
                replicas: wish.replicas,
            })
        }
    }
}

/// How long an external cluster may take to settle its JetStream leader.
const SETTLE: Duration = Duration::from_secs(30);

/// JetStream's answer while its meta leader is being elected.
fn unsettled(error: &str) -> bool {
    error.contains("10008") || error.contains("temporarily unavailable")
}

/// Removes a stream drill created.
pub async fn delete(
    server: SocketAddr,
    name: &str,
    secrets: &Secrets,
    tls: Option<&crate::tls::ClientTls>,
) -> Result<(), String> {
    let client = crate::dest::nats::with_tls(crate::dest::nats::options(secrets), tls)
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
