//! The `inoutbox` command, and the way to run it from an application's own binary.
//!
//! The standalone binary (`cargo install inoutbox --features cli`, or `cargo run --features cli
//! --bin inoutbox`) does everything but replay: replaying a dead letter runs its handler, and
//! only the application's binary has its `#[inbox_handler]`s linked in. So the application
//! gives its binary the same command line:
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! fn main() -> ExitCode {
//!     // `myservice inoutbox dead-letters replay 42` runs the command with this binary's handlers.
//!     if std::env::args().nth(1).as_deref() == Some("inoutbox") {
//!         return inoutbox::cli::run_from(std::env::args().skip(1));
//!     }
//!     // ... the service itself ...
//!     ExitCode::SUCCESS
//! }
//! ```
//!
//! Every subcommand prints a table for people, or JSON with `--json`, and ends with one of the
//! [`exit`] codes. The database comes from `--database-url` or `DATABASE_URL`; passwords are
//! never printed.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use inoutbox_runtime::redact::{hide_secrets, url_secrets};
use serde_json::{json, Value};

use crate::admin::{Admin, AdminError};
use crate::inbox::{InboxConfig, RetryPolicy};

mod args;
mod commands;
mod render;

use args::CommandLine;

/// The exit codes of the `inoutbox` command; scripts may rely on them.
pub mod exit {
    /// Done.
    pub const OK: u8 = 0;
    /// An error: the database or Kafka failed, or a replayed letter failed again.
    pub const ERROR: u8 = 1;
    /// Bad arguments, or a destructive command without `--yes`.
    pub const USAGE: u8 = 2;
    /// Nothing found or nothing to do: no such dead letter, none matched, no parked row,
    /// already replayed.
    pub const NOT_FOUND: u8 = 3;
    /// Replay needs the handlers: run it from the application's binary (`inoutbox::cli::run()`).
    pub const NEEDS_HANDLERS: u8 = 4;
}

/// The command line with settings of the application: how replayed letters are handled.
#[derive(Debug, Clone)]
#[must_use]
pub struct Cli {
    config: InboxConfig,
}

impl Default for Cli {
    fn default() -> Self {
        // A replay runs the handler once: a letter that fails again is dead-lettered again
        // at once, rather than after the usual backoff.
        let mut config = InboxConfig::default();
        config.retry = RetryPolicy::no_retries();
        Self { config }
    }
}

/// Runs the command on this process's arguments; returns the exit code for `main`.
pub fn run() -> ExitCode {
    Cli::default().run()
}

/// Runs the command on `args` (the first is the program's name, as in `std::env::args()`).
pub fn run_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::default().run_from(args)
}

impl Cli {
    /// Default settings: a replay runs the handler once, with the default [`InboxConfig`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The inbox configuration replays run with (the event id header, the retries, ...): give
    /// the one the application's consumer uses.
    pub fn inbox_config(mut self, config: InboxConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs the command on this process's arguments.
    pub fn run(self) -> ExitCode {
        self.run_from(std::env::args_os())
    }

    /// Runs the command on `args` on a runtime of its own (not from inside a tokio runtime:
    /// use [`execute`](Self::execute) there).
    pub fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        match runtime {
            Ok(runtime) => runtime.block_on(self.execute(args)),
            Err(e) => {
                eprintln!("error: cannot start a runtime: {e}");
                ExitCode::from(exit::ERROR)
            }
        }
    }

    /// Runs the command on `args` inside the caller's tokio runtime.
    pub async fn execute<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let line = match CommandLine::try_parse_from(args) {
            Ok(line) => line,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(exit::USAGE));
            }
        };
        let secrets = line
            .database_url
            .as_deref()
            .map(url_secrets)
            .unwrap_or_default();
        let json = line.json;
        let result = self.dispatch(line).await;
        let (code, out) = match result {
            Ok(Reply {
                raw: Some(bytes),
                code,
                ..
            }) => return write_raw(&bytes, code),
            Ok(reply) => (
                reply.code,
                if json {
                    pretty(&reply.json)
                } else {
                    reply.text
                },
            ),
            Err(failure) => {
                eprintln!("error: {}", hide_secrets(&failure.message, &secrets));
                let out = if json {
                    pretty(&json!({ "error": failure.message, "exit_code": failure.code }))
                } else {
                    String::new()
                };
                (failure.code, out)
            }
        };
        print!("{}", hide_secrets(&out, &secrets));
        ExitCode::from(code)
    }

    async fn dispatch(&self, line: CommandLine) -> Result<Reply, Failure> {
        let Some(url) = line.database_url.as_deref() else {
            return Err(Failure::new(
                exit::USAGE,
                "no database: give --database-url or set DATABASE_URL",
            ));
        };
        let admin = Admin::connect(url, line.schema.as_deref()).await?;
        commands::run(&admin, line.command, &self.config).await
    }
}

/// What a command printed and how it ended.
struct Reply {
    text: String,
    json: Value,
    code: u8,
    /// Bytes written to stdout as they are, instead of the text or JSON.
    raw: Option<Vec<u8>>,
}

impl Reply {
    fn ok(text: String, json: Value) -> Self {
        Self {
            text,
            json,
            code: exit::OK,
            raw: None,
        }
    }

    /// `bytes`, written to stdout exactly.
    fn raw(bytes: Vec<u8>) -> Self {
        Self {
            raw: Some(bytes),
            ..Self::ok(String::new(), Value::Null)
        }
    }
}

/// Why a command failed, and its exit code.
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code,
        }
    }
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        let code = match &e {
            AdminError::NotFound(_) | AdminError::AlreadyReplayed(_) => exit::NOT_FOUND,
            AdminError::NoHandlers { .. } => exit::NEEDS_HANDLERS,
            _ => exit::ERROR,
        };
        Self::new(code, e.to_string())
    }
}

/// Writes `bytes` to stdout as they are; the exit code is `code`, or an error if stdout fails.
fn write_raw(bytes: &[u8], code: u8) -> ExitCode {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: cannot write the payload to stdout: {e}");
            ExitCode::from(exit::ERROR)
        }
    }
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_password_of_the_url_is_hidden_in_what_the_command_prints() {
        for (url, password) in [
            (
                "postgres://app:s3cr3t!@db:5432/x?sslmode=require",
                "s3cr3t!",
            ),
            ("postgres://app:s3/cr?3t#@db:5432/x", "s3/cr?3t#"),
            ("postgres://app:s3%2Fcr3t@db:5432/x", "s3/cr3t"),
            (
                "postgres://app@db:5432/x?sslmode=require&password=s3cr3t!",
                "s3cr3t!",
            ),
        ] {
            let secrets = url_secrets(url);
            let printed = hide_secrets(&format!("failed: {password} for app@db"), &secrets);
            assert_eq!(printed, "failed: *** for app@db", "{url}");
        }
        assert!(url_secrets("postgres://app@db/x").is_empty());
        assert!(url_secrets("sqlite:/tmp/x.db").is_empty());
    }
}
