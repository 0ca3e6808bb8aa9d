//! Keeping secrets out of `Debug` output, logs and messages: librdkafka settings whose values
//! are credentials, and the password part of URLs.

use std::fmt;

/// What a secret value is shown as.
pub const REDACTED: &str = "***";

/// Fragments of setting names whose values are secret, compared in lowercase: `sasl.password`,
/// `ssl.key.password`, `ssl.keystore.password`, `sasl.oauthbearer.client.secret`,
/// `ssl.key.pem`, `ssl_key`, `sasl.oauthbearer.config`, schema-registry
/// `basic.auth.user.info`, and any other name containing `password`, `secret` or `key.pem`.
const SECRET_FRAGMENTS: &[&str] = &[
    "password",
    "secret",
    "key.pem",
    "ssl_key",
    "ssl.key",
    "oauthbearer.config",
    "sasl.jaas",
    "user.info",
];

/// Whether the value of the librdkafka (or similar) setting `name` is a secret that must never
/// be printed.
///
/// ```
/// use inoutbox::kafka::is_secret_setting;
/// assert!(is_secret_setting("sasl.password"));
/// assert!(is_secret_setting("SSL.Key.Password"));
/// assert!(is_secret_setting("sasl.oauthbearer.client.secret"));
/// assert!(!is_secret_setting("bootstrap.servers"));
/// ```
pub fn is_secret_setting(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_FRAGMENTS.iter().any(|f| name.contains(f))
}

/// The value of setting `name` as it may be shown: [`REDACTED`] for a secret, otherwise the
/// value with any URL password hidden.
pub fn redact_setting(name: &str, value: &str) -> String {
    if is_secret_setting(name) {
        REDACTED.to_owned()
    } else {
        redact_url(value)
    }
}

/// `Debug` of a list of settings with every secret value hidden.
pub(crate) struct Settings<'a>(pub(crate) &'a [(String, String)]);

impl fmt::Debug for Settings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| (k, redact_setting(k, v))))
            .finish()
    }
}

/// `url` with the password (the part between `user:` and `@`) replaced by `***`.
///
/// ```
/// use inoutbox::store::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_secret_setting_is_hidden() {
        for name in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "ssl.key.pem",
            "ssl_key",
            "sasl.oauthbearer.config",
            "basic.auth.user.info",
            "Some.Custom.Secret",
        ] {
            assert_eq!(redact_setting(name, "hunter2"), REDACTED, "{name}");
        }
        assert_eq!(redact_setting("sasl.username", "app"), "app");
        assert_eq!(
            redact_setting("schema.registry.url", "https://u:pw@h/"),
            "https://u:***@h/"
        );
    }
}
