//! The runtime of inoutbox: the handler registry, the inbox engine, the outbox and its relay, the
//! PostgreSQL and SQLite backends and the Kafka transport.
//!
//! Users depend on the `inoutbox` facade crate, which re-exports what is public here; see its
//! documentation for the tour and `ARCHITECTURE.md` for the map.

#![deny(missing_docs)]

pub mod admin;
pub mod app;
mod backoff;
mod consumer;
pub mod db;
pub mod effects;
pub mod engine;
mod event;
mod failpoint;
mod handler;
mod ident;
pub mod kafka;
pub mod message;
pub mod names;
pub mod outbox;
pub mod postgres;
pub mod redact;
pub mod relay;
pub mod shutdown;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
mod util;

pub use backoff::Backoff;
pub use consumer::{Consumer, ConsumerBuilder};
pub use event::OutboxEvent;
pub use handler::{ErrorKind, HandlerError, HandlerMode, IntoHandlerError, MessageMeta};

/// What generated code reaches; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::event::{key_string, BusinessKey, KeyField, OutboxEvent};
    pub use crate::handler::event_check::{check_event_type, event_type_mismatch, ConstMessage};
    pub use crate::handler::glue::{
        decode, decode_all, downcast_tx, fail, into_future, meta_param, tx_type_id, HandlerOutput,
        MetaParam, Probe, ProbeFallback,
    };
    pub use crate::handler::{
        registrations, BusinessKeyFn, DispatchTable, HandlerFuture, HandlerRegistration, HandlerTx,
        IntoHandlerError, MessageMeta, RegistryError,
    };
    pub use inventory;
    pub use sqlx::Postgres;
    #[cfg(feature = "sqlite")]
    pub use sqlx::Sqlite;
}

/// Rules on the sources that a compiler does not check.
#[cfg(test)]
mod source_rules {
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("source directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    fn sources(crate_dir: &str) -> Vec<(PathBuf, String)> {
        let mut files = Vec::new();
        rust_files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_dir),
            &mut files,
        );
        files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(&f).expect("source");
                (f, text)
            })
            .collect()
    }

    /// Every log event and span names a `inoutbox::...` target, so `RUST_LOG=inoutbox=debug` (a
    /// filter on the target) shows them all; the default target would be this crate's module path.
    #[test]
    fn every_log_event_has_a_inoutbox_target() {
        let macros = [
            "trace",
            "debug",
            "info",
            "warn",
            "error",
            "event",
            "span",
            "trace_span",
            "debug_span",
            "info_span",
            "warn_span",
            "error_span",
        ];
        let mut missing = Vec::new();
        for (file, text) in sources("src") {
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for m in macros {
                    let call = format!("{m}{}", "!(");
                    for (at, _) in line.match_indices(&call) {
                        let before = line[..at].chars().next_back();
                        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                            continue;
                        }
                        let rest: String = text
                            .lines()
                            .skip(n)
                            .collect::<Vec<_>>()
                            .join(" ")
                            .split_at(at + call.len())
                            .1
                            .trim_start()
                            .to_owned();
                        if !rest.starts_with(concat!("target: \"inoutbox", "::")) {
                            missing.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                        }
                    }
                }
                if line.contains(concat!("#[", "instrument"))
                    && !line.contains("target = \"inoutbox::")
                {
                    missing.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "log events without a `inoutbox::` target:\n{}",
            missing.join("\n")
        );
    }

    /// Doc examples compile as a user's code: they name `inoutbox::`, never this crate.
    #[test]
    fn doc_comments_name_inoutbox_paths_only() {
        let mut found = Vec::new();
        for dir in ["src", "../box-macros/src"] {
            for (file, text) in sources(dir) {
                for (n, line) in text.lines().enumerate() {
                    let t = line.trim_start();
                    let doc = t.starts_with("///") || t.starts_with("//!");
                    if doc
                        && (t.contains(concat!("inoutbox_runtime", "::"))
                            || t.contains(concat!("inoutbox_macros", "::")))
                    {
                        found.push(format!("{}:{}: {}", file.display(), n + 1, t));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "doc comments naming the inner crates:\n{}",
            found.join("\n")
        );
    }
}
