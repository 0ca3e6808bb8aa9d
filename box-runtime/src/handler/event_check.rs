//! The build-time check that `#[inbox_handler(event = "...")]` agrees with the event type of the
//! handler's parameter type, run in const evaluation by the generated code.

/// Fails the build (in const evaluation) when `#[inbox_handler(event = "...")]` disagrees with
/// the event type declared by the handler's parameter type. The generated code panics with
/// [`event_type_mismatch`] itself, so that the error shows no frame in here; this is the same
/// check as one call.
#[doc(hidden)]
pub const fn check_event_type(declared: &str, actual: Option<&str>, type_name: &str) {
    if let Some(message) = &event_type_mismatch(declared, actual, type_name) {
        panic!("{}", message.as_str())
    }
}

/// Why `#[inbox_handler(event = "...")]` disagrees with the event type of the parameter's type,
/// or `None` when it agrees (or the type declares none: its own error says why).
#[doc(hidden)]
pub const fn event_type_mismatch(
    declared: &str,
    actual: Option<&str>,
    type_name: &str,
) -> Option<ConstMessage> {
    let actual = match actual {
        // An empty event type is the derive's placeholder after its own error: nothing to add.
        Some(actual) if !actual.is_empty() => actual,
        _ => return None,
    };
    if str_eq(declared, actual) {
        return None;
    }
    Some(ConstMessage::concat(&[
        "`event = \"",
        declared,
        "\"` does not match the event type of `",
        type_name,
        "`, which is \"",
        actual,
        "\": write `event = \"",
        actual,
        "\"`, or take an event type declared with `#[outbox(event_type = \"",
        declared,
        "\")]`",
    ]))
}

/// A message built in const evaluation (at most 1 KiB; longer ones are cut at a character).
#[doc(hidden)]
pub struct ConstMessage {
    buf: [u8; 1024],
    len: usize,
}

impl ConstMessage {
    const fn concat(parts: &[&str]) -> Self {
        let mut buf = [0u8; 1024];
        let mut len = 0;
        let mut part = 0;
        while part < parts.len() {
            let bytes = parts[part].as_bytes();
            let mut i = 0;
            while i < bytes.len() && len < buf.len() {
                buf[len] = bytes[i];
                len += 1;
                i += 1;
            }
            part += 1;
        }
        Self { buf, len }
    }

    /// The message.
    pub const fn as_str(&self) -> &str {
        let (message, _) = self.buf.split_at(self.len);
        match std::str::from_utf8(message) {
            Ok(message) => message,
            Err(error) => {
                let (valid, _) = message.split_at(error.valid_up_to());
                match std::str::from_utf8(valid) {
                    Ok(valid) => valid,
                    Err(_) => "",
                }
            }
        }
    }
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
