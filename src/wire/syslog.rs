//! Syslog messages as drill writes and reads them: RFC 5424, the write key as structured data
//! (`[drill key="…"]`), and RFC 6587 octet-counting framing for TCP.
//!
//! The key is an SD-PARAM of drill's own SD-ID `drill` (RFC 5424 §6.3.2: an SD-ID without `@`
//! is reserved for IANA; drill's is one a receiver keeps as it is, and rsyslog and syslog-ng
//! both do). The record's id travels in the MSG part as everywhere else (`id=<n>` for the
//! reader's id search).

/// The SD-ID that carries the write key.
pub const SD_ID: &str = "drill";

/// The SD-PARAM whose value is the write key.
pub const SD_PARAM: &str = "key";

/// One RFC 5424 message: facility user (1), severity notice (5), so `<13>`; the key as
/// structured data when there is one, else the NILVALUE `-`.
pub fn rfc5424(timestamp: &str, host: &str, key: Option<&str>, msg: &str) -> String {
    let sd = match key {
        Some(k) => format!("[{SD_ID} {SD_PARAM}=\"{}\"]", escape_param(k)),
        None => "-".to_string(),
    };
    format!("<13>1 {timestamp} {host} drill - - {sd} {msg}")
}

/// An RFC 6587 §3.4.1 octet-counted frame: `LEN SP MSG`, LEN the byte length of MSG.
pub fn octet_counted(message: &str) -> Vec<u8> {
    let mut frame = format!("{} ", message.len()).into_bytes();
    frame.extend_from_slice(message.as_bytes());
    frame
}

/// RFC 5424 §6.3.3: `"`, `\` and `]` in a PARAM-VALUE are escaped with a backslash.
fn escape_param(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '"' | '\\' | ']') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The write key of a received message (the value of `key`, the first and only parameter of
/// the `drill` SD element, as [`rfc5424`] writes it), unescaped; `None` when the message has
/// none.
pub fn key_of(message: &str) -> Option<String> {
    sd_param(message, SD_ID, SD_PARAM)
}

/// The value of parameter `param` in the first SD element `id` of an RFC 5424 message,
/// unescaped (§6.3.3: a backslash escapes `"`, `\` and `]`, and stays before anything else);
/// `None` when there is none. Only the STRUCTURED-DATA part is read: a `[id param="…"]` in the
/// message text, or inside another element's value, is not it.
pub fn sd_param(message: &str, id: &str, param: &str) -> Option<String> {
    let mut chars = structured_data(message)?.chars().peekable();
    while chars.peek() == Some(&'[') {
        chars.next();
        let mut sd_id = String::new();
        while let Some(&c) = chars.peek() {
            if c == ' ' || c == ']' {
                break;
            }
            sd_id.push(c);
            chars.next();
        }
        // SD-PARAMs (` NAME="VALUE"`) until the element's `]`.
        loop {
            match chars.next()? {
                ']' => break,
                ' ' => {}
                first => {
                    let mut name = String::from(first);
                    loop {
                        match chars.next()? {
                            '=' => break,
                            c => name.push(c),
                        }
                    }
                    if chars.next()? != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()? {
                            '\\' => match chars.next()? {
                                c @ ('"' | '\\' | ']') => value.push(c),
                                c => {
                                    value.push('\\');
                                    value.push(c);
                                }
                            },
                            '"' => break,
                            c => value.push(c),
                        }
                    }
                    if sd_id == id && name == param {
                        return Some(value);
                    }
                }
            }
        }
    }
    None
}

/// The STRUCTURED-DATA of an RFC 5424 message and what follows it: after `<PRI>` come VERSION
/// and five header fields (TIMESTAMP HOSTNAME APP-NAME PROCID MSGID), one space after each.
/// `None` for what is not RFC 5424 (an RFC 3164 line has no structured data).
fn structured_data(message: &str) -> Option<&str> {
    let rest = message.strip_prefix('<')?;
    let close = rest.find('>')?;
    if !(1..=3).contains(&close) || !rest[..close].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut rest = &rest[close + 1..];
    let version = &rest[..rest.find(' ')?];
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    for _ in 0..6 {
        rest = &rest[rest.find(' ')? + 1..];
    }
    Some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_key_and_reads_back() {
        let m = rfc5424(
            "2026-12-02T15:00:00.000Z",
            "drill",
            Some("k-1 \"q\" ]\\"),
            "id=7",
        );
        assert_eq!(
            m,
            "<13>1 2026-12-02T15:00:00.000Z drill drill - - [drill key=\"k-1 \\\"q\\\" \\]\\\\\"] id=7"
        );
        assert_eq!(key_of(&m).as_deref(), Some("k-1 \"q\" ]\\"));
    }

    #[test]
    fn no_key_is_the_nil_value_and_reads_as_none() {
        let m = rfc5424("2026-12-02T15:00:00Z", "h", None, "id=1");
        assert_eq!(m, "<13>1 2026-12-02T15:00:00Z h drill - - - id=1");
        assert_eq!(key_of(&m), None);
        assert_eq!(key_of("[drill key=\"unterminated"), None);
        // A `key="…"` elsewhere (another element, the message text) is not the write key.
        assert_eq!(
            key_of("<13>1 - h drill - - [drill x=\"1\"] key=\"no\""),
            None
        );
    }

    #[test]
    fn any_element_and_parameter_can_be_read() {
        let m = r#"<13>1 - h app - - [origin ip="1"][meta@1 seq="3" wk="a\"b"] key="no""#;
        assert_eq!(sd_param(m, "meta@1", "wk").as_deref(), Some("a\"b"));
        assert_eq!(sd_param(m, "meta@1", "seq").as_deref(), Some("3"));
        assert_eq!(sd_param(m, "origin", "ip").as_deref(), Some("1"));
        assert_eq!(sd_param(m, "origin", "wk"), None);
        assert_eq!(sd_param(m, "meta@1", "key"), None);
        // A backslash before anything but `"`, `\` and `]` stays.
        let m = r#"<13>1 - h app - - [drill key="a\b\]"] x"#;
        assert_eq!(key_of(m).as_deref(), Some("a\\b]"));
        // Only the structured data is read: not the message text, not another element's value.
        assert_eq!(key_of(r#"<13>1 - h app - - - [drill key="text"]"#), None);
        let m = r#"<13>1 - h app - - [x v="[drill key=\"no\"]"][drill key="yes"] m"#;
        assert_eq!(key_of(m).as_deref(), Some("yes"));
        // Not RFC 5424 at all.
        assert_eq!(
            key_of(r#"<13>Dec  3 06:00:00 h app: [drill key="no"]"#),
            None
        );
    }

    #[test]
    fn octet_counting_counts_bytes_not_chars() {
        assert_eq!(octet_counted("é"), b"2 \xc3\xa9".to_vec());
    }
}
