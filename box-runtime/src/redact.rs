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

/// `url` with its secrets replaced by `***`: the password of its user information (everything
/// between the first `:` after `scheme://` and the last `@`, so a password with an unencoded
/// `/`, `?`, `#`, `:` or `@` is hidden whole), and the value of every query parameter whose
/// name is a secret ([`is_secret_setting`]: `password=`, `sslpassword=`, ...; up to the next
/// `&name=`, so an unencoded `&` or `#` in it is hidden too). Text that is no URL is returned
/// as it is, except for secret parameters after a `?`.
///
/// ```
/// use inoutbox::store::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("postgres://app:a/b?c#d@db/x"), "postgres://app:***@db/x");
/// assert_eq!(redact_url("postgres://app@db/x?password=s3cret&sslmode=require"),
///            "postgres://app@db/x?password=***&sslmode=require");
/// assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
/// ```
pub fn redact_url(url: &str) -> String {
    let mut shown = String::with_capacity(url.len());
    let mut at = 0;
    for (start, end) in UrlParts::of(url).merged() {
        shown.push_str(&url[at..start]);
        shown.push_str(REDACTED);
        at = end;
    }
    shown.push_str(&url[at..]);
    shown
}

/// The secrets [`redact_url`] hides in `url`, as written and, where they differ, percent-decoded
/// (a driver may quote either): for hiding them in any text that may quote them (the
/// `inoutbox` command's output) with [`hide_secrets`].
pub fn url_secrets(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    for (start, end) in UrlParts::of(url).secrets {
        let raw = &url[start..end];
        if raw.is_empty() {
            continue;
        }
        secrets.push(raw.to_owned());
        let decoded = percent_decode(raw);
        if decoded != raw {
            secrets.push(decoded);
        }
    }
    secrets
}

/// `text` with every occurrence of each of `secrets` of at least 4 bytes replaced by
/// [`REDACTED`], longest first (shorter ones would mangle ordinary words more than they hide).
pub fn hide_secrets(text: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| s.len() >= 4).collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.to_owned();
    for secret in secrets {
        text = text.replace(secret.as_str(), REDACTED);
    }
    text
}

/// Where the secrets of a URL are: byte ranges, in order.
struct UrlParts {
    secrets: Vec<(usize, usize)>,
}

impl UrlParts {
    fn of(url: &str) -> Self {
        let mut secrets = Vec::new();
        let mut query_from = 0;
        if let Some(scheme_end) = url.find("://") {
            let rest = scheme_end + 3;
            query_from = rest;
            // The last `@` ends the user information: a password may hold any character.
            if let Some(at) = url[rest..].rfind('@').map(|i| rest + i) {
                if let Some(colon) = url[rest..at].find(':').map(|i| rest + i) {
                    secrets.push((colon + 1, at));
                }
            }
        }
        // From every `?`: the first may be inside a password, and the query start after it
        // (hiding more is safe, less is not).
        for (q, _) in url[query_from..].match_indices('?') {
            secrets.extend(secret_params(url, query_from + q + 1));
        }
        secrets.sort_unstable();
        Self { secrets }
    }

    /// The secrets' ranges with overlapping ones joined.
    fn merged(&self) -> Vec<(usize, usize)> {
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.secrets.len());
        for &(start, end) in &self.secrets {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }
}

/// The value ranges of secret parameters in the query that starts at `from`: a value runs to
/// the next `&` that starts another `name=` (or the end).
fn secret_params(url: &str, from: usize) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut starts = vec![from];
    starts.extend(
        url[from..]
            .match_indices('&')
            .map(|(i, _)| from + i + 1)
            .filter(|&i| starts_param(&url[i..])),
    );
    for (n, &start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).map_or(url.len(), |next| next - 1);
        let param = &url[start..end];
        if let Some(eq) = param.find('=') {
            if is_secret_setting(&percent_decode(&param[..eq])) {
                found.push((start + eq + 1, end));
            }
        }
    }
    found
}

/// Whether `text` starts with `name=`, a name of letters, digits, `_`, `-`, `.` or `%`.
fn starts_param(text: &str) -> bool {
    let name_len = text
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || b"_-.%".contains(b))
        .count();
    name_len > 0 && text[name_len..].starts_with('=')
}

/// `text` with `%XX` escapes decoded (invalid ones and invalid UTF-8 left as they are).
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
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

    #[test]
    fn every_form_of_a_url_password_is_hidden() {
        for (url, shown) in [
            ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
            ("postgres://u:p/w@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:p?w@h/db?sslmode=require",
                "postgres://u:***@h/db?sslmode=require",
            ),
            ("postgres://u:p#w@h:5432/db", "postgres://u:***@h:5432/db"),
            ("postgres://u:p@w:x@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u@h/db?password=pw",
                "postgres://u@h/db?password=***",
            ),
            (
                "postgres://h/db?sslmode=require&password=p&w#x&user=u",
                "postgres://h/db?sslmode=require&password=***&user=u",
            ),
            (
                "postgres://h/db?sslpassword=k&sslmode=require",
                "postgres://h/db?sslpassword=***&sslmode=require",
            ),
            (
                "postgres://u@h/db?password=x@y",
                "postgres://u@h/db?password=***",
            ),
            ("postgres://u:p?password=q@h/db", "postgres://u:***"),
            // A `?` in the password before the query's own secret parameter.
            (
                "postgres://:A?A=A@a?password=A",
                "postgres://:***@a?password=***",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            (
                "postgres://h:5432/db?sslmode=require",
                "postgres://h:5432/db?sslmode=require",
            ),
            ("sqlite:/tmp/x.db", "sqlite:/tmp/x.db"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn the_secrets_of_a_url_are_hidden_in_any_text() {
        let secrets = url_secrets("postgres://app:s3cr%2Ft!@db/x?sslpassword=k3y-k3y");
        assert_eq!(secrets, ["s3cr%2Ft!", "s3cr/t!", "k3y-k3y"]);
        assert_eq!(
            hide_secrets("auth failed for s3cr/t! and k3y-k3y", &secrets),
            "auth failed for *** and ***"
        );
    }

    mod shapes {
        use proptest::prelude::*;

        use super::super::redact_url;

        /// A secret: upper-case letters with any of the characters a password may hold
        /// unencoded between them (`=` left out of query values, where it would start a new
        /// parameter); nothing else in the URL is upper case.
        fn secret(specials: &'static str) -> impl Strategy<Value = String> {
            let piece = (
                "[A-Z]{1,3}",
                proptest::sample::select(specials.chars().collect::<Vec<_>>()),
            )
                .prop_map(|(letters, special)| format!("{letters}{special}"));
            (proptest::collection::vec(piece, 0..5), "[A-Z]{1,3}")
                .prop_map(|(pieces, last)| format!("{}{last}", pieces.concat()))
        }

        /// A URL, its host, and whether its only `@` (if any) ends its user information.
        fn url() -> impl Strategy<Value = (String, String, bool)> {
            let scheme = proptest::sample::select(vec!["postgres", "postgresql", "mysql", "redis"]);
            let user = proptest::option::of("[a-z0-9_.-]{0,8}");
            let password = proptest::option::of(secret("/?#@:&=%! "));
            let host = "[a-z0-9-]{1,8}(\\.[a-z]{2,4})?(:[0-9]{1,5})?(,[a-z]{1,4}:[0-9]{2})?";
            let path = proptest::option::of("/[a-z0-9_]{0,8}");
            let name = proptest::sample::select(vec![
                "sslmode",
                "application_name",
                "options",
                "password",
                "sslpassword",
            ]);
            let value = "[a-z0-9@/:%._-]{0,8}";
            let params = proptest::collection::vec((name, value, secret("/?#@:&%! ")), 0..4);
            (scheme, user, password, host, path, params).prop_map(
                |(scheme, user, password, host, path, params)| {
                    let with_user = user.is_some() || password.is_some();
                    let userinfo = match (user, password) {
                        (None, None) => String::new(),
                        (Some(user), None) => format!("{user}@"),
                        (user, Some(password)) => {
                            format!("{}:{password}@", user.unwrap_or_default())
                        }
                    };
                    let query: Vec<String> = params
                        .into_iter()
                        .map(|(name, value, secret)| {
                            if name.contains("password") {
                                format!("{name}={secret}")
                            } else {
                                format!("{name}={value}")
                            }
                        })
                        .collect();
                    let mut url =
                        format!("{scheme}://{userinfo}{host}{}", path.unwrap_or_default());
                    if !query.is_empty() {
                        url = format!("{url}?{}", query.join("&"));
                    }
                    let clear = url.matches('@').count() == usize::from(with_user);
                    (url, host, clear)
                },
            )
        }

        proptest! {
            #[test]
            fn no_part_of_a_secret_survives_redaction((url, host, clear) in url()) {
                let shown = redact_url(&url);
                prop_assert!(
                    !shown.bytes().any(|b| b.is_ascii_uppercase()),
                    "{url} shown as {shown}"
                );
                // Without an `@` in a password or a value, the host is still shown.
                if clear {
                    prop_assert!(shown.contains(&host), "{url} shown as {shown}: the host is lost");
                }
            }
        }
    }
}
