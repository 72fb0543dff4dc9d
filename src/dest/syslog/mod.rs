//! Syslog destinations (issue 23, in progress): RFC 5424 messages to a real rsyslog over
//! RELP, TCP (octet counting) or UDP.
//!
//! Built so far, and tested against rsyslog 8.2302: the message format with the write key as
//! structured data ([`message`]), the RELP protocol and a client session ([`relp`]), and
//! rsyslog as the receiving side, a local process with drill's own config ([`broker`]). The
//! kind is not registered in [`super::Kind`] yet: its reader, engine sink and scenario fields
//! come next, and until then no scenario can name it.

pub mod broker;
pub mod message;
pub mod read;
pub mod relp;
