//! `links:` — links served by a `drill proxy` on another host instead of by drill itself
//! (docs/src/design.md#2-parts), checked before anything starts:
//! `{ mqtt: { remote: "http://HOST:8474", token_env: NAME } }`; and `system.agent`, a user's
//! engine run by a `drill agent` there.
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
use super::{CommandSpec, FaultAction, ScheduledFault};
use crate::dest::{Runtime, Spec, TlsSpec};
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

/// The raw `system.agent` and `system.token_env`.
pub(super) struct RawAgent {
    pub agent: Option<Spanned<String>>,
    pub token_env: Option<Spanned<String>>,
}

/// `system.agent`: a user's engine on a `drill agent`'s host. It reaches the broker through a
/// link served there (a remote link), its files come from the scenario (the agent has no
/// scenario folder), and the agent's power-cut filesystem takes power cuts and full disks but
/// no crash points.
pub(super) fn engine_agent(
    raw: RawAgent,
    command: Option<&CommandSpec>,
    remote_links: &BTreeMap<String, RemoteSpec>,
    faults: &[ScheduledFault],
    raw_faults: &[Spanned<RawFault>],
    anchor: &Location,
) -> Result<Option<RemoteSpec>, Located> {
    let Some(agent) = raw.agent else {
        return match raw.token_env {
            Some(t) => Err(at(
                &t.referenced,
                "field `system.token_env`: the token of a `drill agent`; it goes with `system.agent`"
                    .to_string(),
            )),
            None => Ok(None),
        };
    };
    let here = &agent.referenced;
    let Some(command) = command else {
        return Err(at(
            here,
            "field `system.agent`: an agent runs a user's engine (`system.command`); to run drill's own engine there, give `command: [drill, engine, --config, \"{work_dir}/engine.yaml\"]` with its `files`".to_string(),
        ));
    };
    let api = api_url(&agent.value).filter(|a| a.starts_with("http://")).ok_or_else(|| {
        at(
            here,
            format!(
                "field `system.agent`: `{}` is not a drill agent's API address; give http://HOST:PORT",
                agent.value
            ),
        )
    })?;
    if remote_links.is_empty() {
        return Err(at(
            here,
            "field `system.agent`: the engine there reaches the broker through a link on its own host; serve the destination's link there too (`drill agent --link`) and name it under `links: { NAME: { remote: URL } }`".to_string(),
        ));
    }
    let templates = command
        .argv
        .iter()
        .chain(command.env.values())
        .chain(command.files.iter().map(|(_, text)| text));
    let here_only = templates.into_iter().find_map(|t| {
        ["{scenario_dir}", "{tls."]
            .into_iter()
            .find(|p| t.contains(p))
    });
    if let Some(placeholder) = here_only {
        return Err(at(
            here,
            format!(
                "field `system.agent`: `{placeholder}…}}` names a file or folder on drill's host, not the agent's; hand the engine what it needs through `system.files`"
            ),
        ));
    }
    if let Some(f) = faults.iter().find(|f| {
        matches!(
            &f.what,
            FaultAction::Disk { .. } | FaultAction::Clock { .. }
        )
    }) {
        let field = match f.what {
            FaultAction::Clock { .. } => "clock",
            _ => "disk",
        };
        return Err(at(
            raw_faults.get(f.entry).map_or(anchor, |r| &r.referenced),
            format!(
                "field `faults[{}].{field}`: {field} faults are not carried out by a drill agent yet; run the engine on drill's host",
                f.entry
            ),
        ));
    }
    for (field, why) in [
        (
            "crash_at",
            "crash points are not carried out by a drill agent yet; cut power at a time (`power_cut` without `crash_at`)",
        ),
        (
            "dirents",
            "a drill agent's power cut forgets no directory entries yet; drop `dirents` or run the engine on drill's host",
        ),
    ] {
        let given = faults.iter().find(|f| match &f.what {
            FaultAction::Engine { power, .. } => match field {
                "crash_at" => power.crash_at.is_some(),
                _ => power.dirents.is_some(),
            },
            _ => false,
        });
        if let Some(f) = given {
            return Err(at(
                raw_faults.get(f.entry).map_or(anchor, |r| &r.referenced),
                format!("field `faults[{}].{field}`: {why}", f.entry),
            ));
        }
    }
    let token_env = match raw.token_env {
        Some(var) if std::env::var(&var.value).map_or(true, |v| v.is_empty()) => {
            return Err(at(
                &var.referenced,
                format!(
                    "field `system.token_env`: the variable `{}` is not set; export the token the agent was started with (--token)",
                    var.value
                ),
            ));
        }
        Some(var) => Some(var.value),
        None => None,
    };
    Ok(Some(RemoteSpec { api, token_env }))
}

/// `http://HOST:PORT` with nothing after it, trimmed of a trailing slash.
fn api_url(given: &str) -> Option<String> {
    let api = given.trim().trim_end_matches('/').to_string();
    reqwest::Url::parse(&api)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some() && u.path() == "/")
        .map(|_| api)
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
        let has = match destination.kind.entry().no_remote_link {
            Some(why) => Some(why.to_string()),
            None if names.len() != 1 => Some(format!("{}", names.len())),
            None => None,
        };
        if let Some(has) = has {
            return Err(at(
                here,
                format!(
                    "field `links.{name}`: a remote link stands for the destination's one link; a {} destination has {has} (a Kafka-aware link or a cluster cannot be served remotely yet)",
                    destination.kind.name(),
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
        let Some(api) = api_url(&link.remote.value) else {
            return Err(at(
                &link.remote.referenced,
                format!(
                    "field `links.{name}.remote`: `{}` is not a drill proxy's API address; give http://HOST:PORT",
                    link.remote.value
                ),
            ));
        };
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
