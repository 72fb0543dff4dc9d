//! The wire protocols drill speaks and reads itself, one home each: MQTT 5 (its embedded
//! broker, the engine's MQTT output, the MQTT ingest, the link's MQTT tap), RELP (the engine's
//! syslog output, RELP ingest, the probe) and the syslog message (RFC 5424 with drill's
//! structured data, octet counting), and Kafka's frames (the Kafka-aware link's address
//! rewrite and the Kafka tap's Produce reading, one reader for both). Leaves of the crate: nothing here knows a drill, a
//! scenario or a destination kind; the kinds and `sut` import from here, never from each other.

pub mod kafka;
pub mod mqtt;
pub mod mqtt311;
pub mod relp;
pub mod syslog;
