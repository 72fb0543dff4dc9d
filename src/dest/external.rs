//! What every kind does with brokers the user already runs (`runtime: external`,
//! docs/src/design.md#2-parts): reach them. Finding or creating the drill's topic or stream, and
//! removing only what drill created, is each kind's (`<kind>/broker.rs`). Every error is one line
//! that says what to do.

use std::net::SocketAddr;
use std::time::Duration;

/// How long reaching an external broker may take before the drill gives up.
pub(crate) const REACH: Duration = Duration::from_secs(5);

/// Resolves `address` (`host:port`, from `field`).
pub async fn resolve(address: &str, field: &str) -> Result<SocketAddr, String> {
    tokio::time::timeout(REACH, tokio::net::lookup_host(address))
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            format!("cannot resolve the external broker `{address}` ({field}); check the name")
        })
}

/// Resolves `address` (`host:port`, from `field`) and opens a TCP connection to it.
pub async fn reach(address: &str, field: &str) -> Result<SocketAddr, String> {
    let resolved = resolve(address, field).await?;
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

/// What the report says of the drill's topic or stream on an external broker.
pub(crate) fn made_or_found(created: bool, keep: bool) -> &'static str {
    match (created, keep) {
        (false, _) => "existed already (drill leaves it as it was)",
        (true, false) => "was created by drill and is removed at the end",
        (true, true) => "was created by drill and kept (`keep: true`)",
    }
}

/// The user's brokers, reached: their addresses as resolved, the credentials read from the
/// environment, and the report's first note.
pub(crate) struct Reached {
    pub servers: Vec<SocketAddr>,
    pub secrets: crate::credentials::Secrets,
    pub note: String,
}

/// Reads the credentials and reaches every address the scenario gives (each error names the
/// field).
pub(crate) async fn reach_all(
    spec: &super::Spec,
    ext: &super::External,
) -> Result<Reached, super::DestError> {
    reach_all_by(spec, ext, Reach::Connect).await
}

/// How drill checks an external receiver is there before the drill.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// A TCP connection opens.
    Connect,
    /// Only its name resolves: a datagram receiver answers nothing, so nothing more can be
    /// checked (the read-back is the only proof it is there).
    Resolve,
}

async fn reach_all_by(
    spec: &super::Spec,
    ext: &super::External,
    how: Reach,
) -> Result<Reached, super::DestError> {
    let field = spec.kind.entry().external_field.map_or("", |(f, _)| f);
    let secrets = ext.credentials.read().map_err(super::DestError::External)?;
    let mut servers = Vec::new();
    for (i, address) in ext.addresses.iter().enumerate() {
        let at = if ext.addresses.len() > 1 {
            format!("destination.{field}[{i}]")
        } else {
            format!("destination.{field}")
        };
        let server = match how {
            Reach::Connect => reach(address, &at).await,
            Reach::Resolve => resolve(address, &at).await,
        };
        servers.push(server.map_err(super::DestError::External)?);
    }
    Ok(Reached {
        servers,
        secrets,
        note: format!(
            "external {} broker(s) at {}: drill started nothing and removes only what it created",
            spec.kind.name(),
            ext.addresses.join(", ")
        ),
    })
}

/// The running side of the user's brokers: nothing to stop; `made` removes what drill created
/// (`None` with `keep: true`, or when it created nothing).
pub(crate) fn running(
    dest: std::sync::Arc<dyn super::Destination>,
    spec: &super::Spec,
    ext: &super::External,
    reached: Reached,
    access: crate::verify::Access,
    made: Option<super::running::Remove>,
) -> super::Running {
    let version = format!(
        "external {} at {}",
        spec.kind.name(),
        ext.addresses.join(", ")
    );
    let made = made.filter(|_| !ext.keep);
    let mut running = super::Running::new(
        dest,
        reached.servers,
        "external",
        version,
        super::running::Place::External { made },
    );
    running.access = crate::verify::Access {
        secrets: reached.secrets,
        ..access
    };
    running
}

/// The user's brokers reached and one link put in front of the first: what a kind with one
/// link (MQTT, syslog) provisions for `runtime: external`. `access` says how the reader reaches
/// the destination beyond its address (a syslog receiver's file). `how`: a stream link to a
/// receiver a connection reaches (`Connect`), or a datagram link to one that answers nothing
/// (`Resolve`: a UDP syslog receiver).
pub(crate) async fn provision_one_link(
    dest: std::sync::Arc<dyn super::Destination>,
    p: &super::Provision<'_>,
    ext: &super::External,
    access: crate::verify::Access,
    how: Reach,
) -> Result<super::Provisioned, super::DestError> {
    let reached = reach_all_by(p.spec, ext, how).await?;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let (name, server, links) = (&p.spec.link_name(), reached.servers[0], p.links.clone());
    let link = match how {
        Reach::Connect => crate::proxy::Link::start(name, any, server, links).await?,
        Reach::Resolve => crate::proxy::Link::start_udp(name, any, server, links).await?,
    };
    let mut notes = vec![reached.note.clone()];
    if how == Reach::Resolve {
        notes.push(format!(
            "UDP: nothing answers a datagram, so drill could not check that a receiver listens at {server}; the records read back from its file are the only proof"
        ));
    }
    Ok(super::Provisioned {
        links: vec![link],
        running: running(dest, p.spec, ext, reached, access, None),
        notes,
    })
}
