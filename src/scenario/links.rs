//! `links:` — links served by a `drill proxy` on another host instead of by drill itself
//! (DESIGN.md §2), checked before anything starts: `{ mqtt: { remote: "http://HOST:8474",
//! token_env: NAME } }`.
//!
//! A remote link stands for the destination's one link, in front of a broker its host can
//! reach (`runtime: external`). It holds one fault at a time, of those the proxy's API knows;
//! drill applies each under a lease (`proxy::remote`). Whether the proxy answers, takes the
//! token and has the link is found at start (exit 3, or 2 for a refused token or a missing
//! link).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_saphyr::{Location, Spanned};

use super::raw::{RawFault, RawLink};
use super::{FaultAction, ScheduledFault};
use crate::dest::{Kind, Runtime, Spec, TlsSpec};
use crate::located::{Located, at};
use crate::proxy::remote::RemoteLink;

/// A link served elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSpec {
    /// The proxy's control API, `http://HOST:PORT`.
    pub api: String,
    /// The environment variable holding its token (read at start, never kept in the plan).
    pub token_env: Option<String>,
}

impl RemoteSpec {
    /// The token, read from its variable now.
    pub fn token(&self) -> Option<String> {
        self.token_env
            .as_ref()
            .and_then(|name| std::env::var(name).ok())
    }
}

pub(super) fn remote_links(
    raw: &BTreeMap<String, Spanned<RawLink>>,
    destination: &Spec,
    faults: &[ScheduledFault],
    raw_faults: &[Spanned<RawFault>],
    anchor: &Location,
) -> Result<BTreeMap<String, RemoteSpec>, Located> {
    let mut links = BTreeMap::new();
    for (name, spanned) in raw {
        let link = &spanned.value;
        let here = &spanned.referenced;
        let names = destination.link_names();
        if destination.kind == Kind::Kafka || names.len() != 1 {
            return Err(at(
                here,
                format!(
                    "field `links.{name}`: a remote link stands for the destination's one link; a {} destination has {} (a Kafka-aware link or a cluster cannot be served remotely yet)",
                    destination.kind.name(),
                    if destination.kind == Kind::Kafka {
                        "a link per broker".to_string()
                    } else {
                        format!("{}", names.len())
                    }
                ),
            ));
        }
        if names[0] != *name {
            return Err(at(
                here,
                format!(
                    "field `links.{name}`: the destination's link is `{}`",
                    names[0]
                ),
            ));
        }
        let api = link.remote.value.trim().trim_end_matches('/').to_string();
        let url = reqwest::Url::parse(&api).ok().filter(|u| {
            matches!(u.scheme(), "http" | "https") && u.host().is_some() && u.path() == "/"
        });
        if url.is_none() {
            return Err(at(
                &link.remote.referenced,
                format!(
                    "field `links.{name}.remote`: `{}` is not a drill proxy's API address; give http://HOST:PORT",
                    link.remote.value
                ),
            ));
        }
        if destination.runtime != Runtime::External {
            return Err(at(
                &link.remote.referenced,
                format!(
                    "field `links.{name}.remote`: the remote link forwards to a broker its own host must reach, and a broker drill starts listens on this host's loopback only; use `destination.runtime: external` with the broker's address"
                ),
            ));
        }
        if matches!(
            destination.tls,
            Some(TlsSpec::Minted {
                terminate: true,
                ..
            })
        ) {
            return Err(at(
                &link.remote.referenced,
                format!(
                    "field `links.{name}.remote`: a remote link cannot terminate TLS with this drill's CA; leave `tls.links` out"
                ),
            ));
        }
        if let Some(var) = &link.token_env
            && std::env::var(&var.value).map_or(true, |v| v.is_empty())
        {
            return Err(at(
                &var.referenced,
                format!(
                    "field `links.{name}.token_env`: the variable `{}` is not set; export the token the proxy was started with (--token)",
                    var.value
                ),
            ));
        }
        one_fault_at_a_time(name, faults, raw_faults, anchor)?;
        links.insert(
            name.clone(),
            RemoteSpec {
                api,
                token_env: link.token_env.as_ref().map(|v| v.value.clone()),
            },
        );
    }
    Ok(links)
}

/// Every fault on the remote link `name` is one its API knows, and none overlaps another; a
/// proxy restart (which acts on drill's own links) is refused beside a remote link.
fn one_fault_at_a_time(
    name: &str,
    faults: &[ScheduledFault],
    raw_faults: &[Spanned<RawFault>],
    anchor: &Location,
) -> Result<(), Located> {
    let located = |f: &ScheduledFault, why: String| {
        let message = format!("field `faults[{}]`: {why}", f.entry);
        at(
            raw_faults.get(f.entry).map_or(anchor, |r| &r.referenced),
            message,
        )
    };
    // The fault in force: until when (`None`: until a `heal` of the link), and its entry.
    let mut open: Option<(Option<Duration>, usize)> = None;
    let mut in_time: Vec<&ScheduledFault> = faults.iter().collect();
    in_time.sort_by_key(|f| (f.at, f.entry));
    for f in in_time {
        match &f.what {
            FaultAction::Link { link, spec, lasts } if link == name => {
                RemoteLink::request(spec).map_err(|why| located(f, why))?;
                if let Some((until, entry)) = open
                    && until.is_none_or(|u| f.at < u)
                {
                    return Err(located(
                        f,
                        format!(
                            "the remote link {name} holds one fault at a time, and faults[{entry}] is still in force at {}",
                            crate::units::Dur(f.at)
                        ),
                    ));
                }
                open = if spec.fault.instantaneous() {
                    None
                } else {
                    Some((lasts.map(|d| f.at + d), f.entry))
                };
            }
            FaultAction::Heal { link } if link == name => open = None,
            FaultAction::ProxyRestart { .. } => {
                return Err(located(
                    f,
                    format!(
                        "a proxy restart acts on drill's own links, and the link {name} is served remotely"
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}
