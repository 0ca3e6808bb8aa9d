//! The command line, as clap reads it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Operate inoutbox's inbox and outbox: status, dead letters, parked rows, purges.
///
/// Exit codes: 0 done; 1 error (database, Kafka, a replay that failed again); 2 usage (bad
/// arguments, `discard` without `--yes`); 3 nothing found or nothing to do; 4 replay needs the
/// application's binary (its handlers).
#[derive(Debug, Parser)]
#[command(name = "inoutbox", version)]
pub(super) struct CommandLine {
    /// The database: `postgres://user:password@host/db`, `sqlite:path`, or (built with the
    /// `mysql` feature) `mysql://user:password@host/db`.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(super) database_url: Option<String>,
    /// The schema of inoutbox's tables (as `inoutbox::Tables::with_schema`; a database on MySQL).
    #[arg(long, global = true)]
    pub(super) schema: Option<String>,
    /// Print JSON for scripts instead of tables.
    #[arg(long, global = true)]
    pub(super) json: bool,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Apply inoutbox's migrations (inbox and outbox tables).
    Migrate,
    /// Per group: inbox rows, processed in the last minute, dead letters; stuck inbox rows;
    /// the outbox: unpublished rows, the oldest one's age, parked rows and their last errors.
    Status {
        /// Also show each group's Kafka lag per partition, asking these brokers.
        #[arg(long)]
        brokers: Option<String>,
        /// (Feature `nats`.) Also show each group's lag per partition on NATS JetStream,
        /// asking this server (`nats://host:4222`).
        #[cfg(feature = "nats")]
        #[arg(long)]
        nats_url: Option<String>,
        /// An inbox row unprocessed for longer than this counts as stuck.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        stuck_after: Duration,
    },
    /// List, show, replay or discard dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
    /// Parked outbox rows.
    #[command(subcommand)]
    Outbox(Outbox),
    /// Delete processed inbox rows and published outbox rows older than a window.
    Purge {
        /// The window: `7d`, `12h`, `30m`, `90s`, `2w`.
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Rows per DELETE statement.
        #[arg(long, default_value_t = 1000)]
        batch_size: u32,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum DeadLetters {
    /// Dead letters, newest first.
    List(#[command(flatten)] Filter),
    /// One dead letter: headers, payload (pretty-printed, its keys in their stored order),
    /// error and attempts.
    Show {
        /// Its id.
        id: i64,
        /// Writes the stored payload bytes alone to stdout, exactly as stored (e.g. `> msg.json`
        /// to send it again or diff it); takes precedence over `--json`.
        #[arg(long)]
        raw: bool,
    },
    /// Run dead letters through their handler again, in the inbox transaction. Needs the
    /// application's binary (`inoutbox::cli::run()`): the standalone `inoutbox` has no handlers.
    Replay {
        /// Their ids.
        #[arg(required = true)]
        ids: Vec<i64>,
    },
    /// Delete dead letters: these ids, or those the filters match.
    Discard {
        /// Their ids (otherwise the filters choose).
        ids: Vec<i64>,
        #[command(flatten)]
        filter: Filter,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Clone, Args)]
pub(super) struct Filter {
    /// Only this consumer group.
    #[arg(long)]
    pub(super) group: Option<String>,
    /// Only this event type.
    #[arg(long)]
    pub(super) event_type: Option<String>,
    /// Only those dead-lettered within this long: `1h`, `2d`, ...
    #[arg(long, value_parser = parse_duration)]
    pub(super) since: Option<Duration>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub(super) limit: u32,
}

#[derive(Debug, Subcommand)]
pub(super) enum Outbox {
    /// Put parked rows back on the relay's path: those of one key, or all.
    Unpark {
        /// The message key.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        key: Option<String>,
        /// Every parked row.
        #[arg(long)]
        all: bool,
        /// Only rows of this topic.
        #[arg(long)]
        topic: Option<String>,
    },
}

/// `7d`, `12h`, `30m`, `90s`, `2w`, `500ms`.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}`: expected a number and a unit, e.g. `7d` or `30m`"))?;
    let secs = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "`{text}`: the unit must be one of ms, s, m, h, d, w"
            ))
        }
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("3y").is_err());
    }
}
