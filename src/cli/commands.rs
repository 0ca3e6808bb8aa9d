//! What each subcommand does and prints.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::args::{Command, DeadLetters, Filter, Outbox};
use super::render::{age, block, cell, or_dash, table};
use super::{exit, Failure, Reply};
use crate::admin::{
    consumer_lag, impossible_lag, Admin, AdminError, DeadLetterFilter, DeadLetterRow,
    EffectsStatus, PartitionLag, Status,
};
use crate::inbox::{InboxConfig, Outcome};
use crate::store::StoredDeadLetter;

/// How long each Kafka request of `status --brokers` may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn run(
    admin: &Admin,
    command: Command,
    config: &InboxConfig,
) -> Result<Reply, Failure> {
    match command {
        Command::Migrate => {
            admin.migrate().await?;
            Ok(Reply::ok(
                "migrations applied\n".into(),
                json!({ "migrated": true }),
            ))
        }
        Command::Status {
            brokers,
            stuck_after,
            #[cfg(feature = "nats")]
            nats_url,
        } => {
            #[cfg(not(feature = "nats"))]
            let nats_url: Option<String> = None;
            status(admin, brokers.as_deref(), nats_url.as_deref(), stuck_after).await
        }
        Command::DeadLetters(DeadLetters::List(filter)) => list(admin, &filter).await,
        Command::DeadLetters(DeadLetters::Show { id, raw }) => show(admin, id, raw).await,
        Command::DeadLetters(DeadLetters::Replay { ids }) => replay(admin, &ids, config).await,
        Command::DeadLetters(DeadLetters::Discard { ids, filter, yes }) => {
            discard(admin, ids, &filter, yes).await
        }
        Command::Outbox(Outbox::Unpark { key, topic, .. }) => {
            let n = admin.unpark(key.as_deref(), topic.as_deref()).await?;
            let what = key.map_or_else(|| "every key".to_owned(), |k| format!("key `{k}`"));
            Ok(Reply {
                text: format!("unparked {n} row(s) of {}\n", cell(&what, 200)),
                json: json!({ "unparked": n }),
                code: if n == 0 { exit::NOT_FOUND } else { exit::OK },
                raw: None,
            })
        }
        Command::Purge {
            older_than,
            batch_size,
        } => {
            let purged = admin.purge(older_than, batch_size).await?;
            Ok(Reply::ok(
                format!(
                    "deleted {} processed inbox row(s) and {} published outbox row(s) older than {}\n",
                    purged.inbox,
                    purged.outbox,
                    age(older_than.as_secs_f64())
                ),
                json!({ "inbox_deleted": purged.inbox, "outbox_deleted": purged.outbox }),
            ))
        }
    }
}

async fn status(
    admin: &Admin,
    brokers: Option<&str>,
    nats_url: Option<&str>,
    stuck_after: Duration,
) -> Result<Reply, Failure> {
    let status = admin.status(stuck_after).await?;
    let mut text = status_text(&status);
    let mut json = status_json(&status);
    text.push_str(&effects_text(&status.effects));
    json["effects"] = effects_json(&status.effects);
    if let Some(brokers) = brokers {
        let groups: Vec<String> = status.groups.iter().map(|g| g.group.clone()).collect();
        let lags = consumer_lag(brokers, &groups, &[], KAFKA_TIMEOUT).await?;
        text.push_str(&lag_text(&lags));
        json["kafka_lag"] = lags
            .iter()
            .map(|l| {
                let hint = impossible_lag(l);
                json!({ "group": l.group, "topic": l.topic, "partition": l.partition,
                        "committed": l.committed, "high_watermark": l.high_watermark,
                        "lag": if hint.is_some() { Value::Null } else { json!(l.lag) },
                        "impossible": hint })
            })
            .collect();
    }
    #[cfg(not(feature = "nats"))]
    let _ = nats_url;
    #[cfg(feature = "nats")]
    if let Some(url) = nats_url {
        let groups: Vec<String> = status.groups.iter().map(|g| g.group.clone()).collect();
        nats_lag(url, &groups, &mut text, &mut json).await?;
    }
    Ok(Reply::ok(text, json))
}

/// The NATS lag table and its JSON (`nats_lag`): per group and partition, its consumer's
/// pending and unacknowledged messages.
#[cfg(feature = "nats")]
async fn nats_lag(
    url: &str,
    groups: &[String],
    text: &mut String,
    json: &mut Value,
) -> Result<(), Failure> {
    let lags = crate::nats::consumer_lag(url, groups, KAFKA_TIMEOUT)
        .await
        .map_err(|e| Failure::new(super::exit::ERROR, e.to_string()))?;
    let rows: Vec<Vec<String>> = lags
        .iter()
        .map(|l| {
            vec![
                cell(&l.group, 40),
                cell(&l.topic, 40),
                l.partition.to_string(),
                l.pending.to_string(),
                l.ack_pending.to_string(),
                l.lag.to_string(),
            ]
        })
        .collect();
    text.push_str("\nNATS LAG\n");
    text.push_str(&table(
        &["GROUP", "TOPIC", "PARTITION", "PENDING", "UNACKED", "LAG"],
        &rows,
    ));
    json["nats_lag"] = lags
        .iter()
        .map(|l| {
            json!({ "group": l.group, "topic": l.topic, "partition": l.partition,
                    "consumer": l.consumer, "pending": l.pending,
                    "ack_pending": l.ack_pending, "lag": l.lag })
        })
        .collect();
    Ok(())
}

/// The lag table; a row whose committed offset is past the end shows `!` for its lag, and its
/// hint below the table.
fn lag_text(lags: &[PartitionLag]) -> String {
    let mut hints = String::new();
    let rows: Vec<Vec<String>> = lags
        .iter()
        .map(|l| {
            let lag = match impossible_lag(l) {
                Some(hint) => {
                    let _ = writeln!(hints, "! {}", cell(&hint, 1000));
                    "!".to_owned()
                }
                None => l.lag.to_string(),
            };
            vec![
                cell(&l.group, 40),
                cell(&l.topic, 40),
                l.partition.to_string(),
                l.committed.to_string(),
                l.high_watermark.to_string(),
                lag,
            ]
        })
        .collect();
    let mut text = String::from("\nKAFKA LAG\n");
    text.push_str(&table(
        &["GROUP", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG"],
        &rows,
    ));
    text.push_str(&hints);
    text
}

fn status_text(s: &Status) -> String {
    let groups: Vec<Vec<String>> = s
        .groups
        .iter()
        .map(|g| {
            vec![
                cell(&g.group, 40),
                g.inbox_rows.to_string(),
                g.processed_last_minute.to_string(),
                g.dead_letters_pending.to_string(),
                (g.dead_letters - g.dead_letters_pending).to_string(),
            ]
        })
        .collect();
    let mut text = String::from("INBOX\n");
    text.push_str(&table(
        &["GROUP", "ROWS", "PROCESSED/1M", "DEAD LETTERS", "REPLAYED"],
        &groups,
    ));
    let o = &s.outbox;
    let oldest = o
        .oldest_unpublished_secs
        .map_or_else(String::new, |secs| format!(", oldest {}", age(secs)));
    let _ = write!(
        text,
        "stuck rows (unprocessed for over {}): {}\n\nOUTBOX\nunpublished: {}{oldest}\nparked: {}\n\
         held behind parked rows of their key (until unparked): {}\n",
        age(s.stuck_after.as_secs_f64()),
        s.stuck,
        o.unpublished,
        o.parked,
        o.held
    );
    let _ = writeln!(text, "scheduled (not due yet): {}", o.scheduled);
    if !o.parked_keys.is_empty() {
        let rows: Vec<Vec<String>> = o
            .parked_keys
            .iter()
            .map(|k| {
                vec![
                    cell(&k.topic, 40),
                    or_dash(k.key.as_deref(), 40),
                    k.rows.to_string(),
                    k.held.to_string(),
                    or_dash(k.parked_at.as_deref(), 20),
                    or_dash(k.last_error.as_deref(), 100),
                ]
            })
            .collect();
        text.push_str(&table(
            &["TOPIC", "KEY", "ROWS", "HELD", "PARKED AT", "LAST ERROR"],
            &rows,
        ));
    }
    text
}

/// The effects section of `status`: one line per group with effects not done, or none.
fn effects_text(effects: &[EffectsStatus]) -> String {
    if effects.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = effects
        .iter()
        .map(|e| {
            vec![
                cell(&e.group, 40),
                e.pending.to_string(),
                e.failed.to_string(),
                e.oldest_pending_secs.map_or_else(|| "-".to_owned(), age),
            ]
        })
        .collect();
    let mut text = String::from("\nEFFECTS (not done yet)\n");
    text.push_str(&table(&["GROUP", "PENDING", "FAILED", "OLDEST"], &rows));
    text
}

fn effects_json(effects: &[EffectsStatus]) -> Value {
    effects
        .iter()
        .map(|e| {
            json!({ "group": e.group, "pending": e.pending, "failed": e.failed,
                    "oldest_pending_secs": e.oldest_pending_secs })
        })
        .collect()
}

fn status_json(s: &Status) -> Value {
    let o = &s.outbox;
    json!({
        "groups": s.groups.iter().map(|g| json!({
            "group": g.group, "inbox_rows": g.inbox_rows,
            "processed_last_minute": g.processed_last_minute,
            "dead_letters": g.dead_letters, "dead_letters_pending": g.dead_letters_pending,
        })).collect::<Vec<_>>(),
        "stuck": s.stuck,
        "stuck_after_secs": s.stuck_after.as_secs(),
        "outbox": {
            "unpublished": o.unpublished,
            "oldest_unpublished_secs": o.oldest_unpublished_secs,
            "parked": o.parked,
            "held": o.held,
            "scheduled": o.scheduled,
            "parked_keys": o.parked_keys.iter().map(|k| json!({
                "topic": k.topic, "key": k.key, "rows": k.rows, "held": k.held,
                "last_error": k.last_error, "parked_at": k.parked_at,
            })).collect::<Vec<_>>(),
        },
    })
}

fn filter_of(f: &Filter) -> DeadLetterFilter {
    DeadLetterFilter::new(f.limit)
        .group(f.group.clone())
        .event_type(f.event_type.clone())
        .since(f.since)
}

fn letter_json(l: &DeadLetterRow) -> Value {
    json!({
        "id": l.id, "group": l.group, "event_id": l.event_id, "event_type": l.event_type,
        "topic": l.topic, "partition": l.partition, "offset": l.offset,
        "attempts": l.attempts, "error": l.error,
        "dead_lettered_at": l.dead_lettered_at, "replayed_at": l.replayed_at,
    })
}

async fn list(admin: &Admin, filter: &Filter) -> Result<Reply, Failure> {
    let letters = admin.dead_letters(&filter_of(filter)).await?;
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|l| {
            vec![
                l.id.to_string(),
                cell(&l.group, 30),
                or_dash(l.event_type.as_deref(), 30),
                or_dash(l.event_id.as_deref(), 36),
                format!("{}/{}@{}", cell(&l.topic, 30), l.partition, l.offset),
                l.attempts.to_string(),
                cell(&l.dead_lettered_at, 20),
                if l.replayed_at.is_some() { "yes" } else { "no" }.to_owned(),
                cell(&l.error, 60),
            ]
        })
        .collect();
    let text = table(
        &[
            "ID",
            "GROUP",
            "EVENT TYPE",
            "EVENT ID",
            "FROM",
            "ATTEMPTS",
            "AT",
            "REPLAYED",
            "ERROR",
        ],
        &rows,
    );
    Ok(Reply::ok(
        text,
        Value::Array(letters.iter().map(letter_json).collect()),
    ))
}

async fn show(admin: &Admin, id: i64, raw: bool) -> Result<Reply, Failure> {
    let (row, stored) = admin.dead_letter(id).await?;
    if raw {
        // The bytes as stored (a `bytea` / `blob`), never decoded or re-encoded.
        return Ok(Reply::raw(stored.delivery.payload.unwrap_or_default()));
    }
    Ok(Reply::ok(
        show_text(&row, &stored),
        show_json(&row, &stored),
    ))
}

/// A header value as it may be printed: secrets (`authorization`, `*password*`, ...) hidden.
fn header_value(name: &str, value: Option<&[u8]>) -> Option<String> {
    let secret = crate::kafka::is_secret_setting(name)
        || name.eq_ignore_ascii_case("authorization")
        || name.to_ascii_lowercase().contains("token");
    value.map(|v| {
        if secret {
            crate::kafka::REDACTED.to_owned()
        } else {
            String::from_utf8_lossy(v).into_owned()
        }
    })
}

/// The payload pretty-printed when it is JSON, as text when it is UTF-8, else in hex.
fn payload_text(payload: Option<&[u8]>) -> String {
    let Some(bytes) = payload else {
        return "(none)".into();
    };
    if serde_json::from_slice::<Value>(bytes).is_ok() {
        if let Ok(text) = std::str::from_utf8(bytes) {
            return indent_json(text);
        }
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => bytes.iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        }),
    }
}

/// Valid JSON `text` indented as `serde_json::to_string_pretty` does, but its keys in the order
/// the producer wrote them (a `Value` would sort them) and its numbers and strings as written.
fn indent_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                out.push(c);
                if matches!(chars.peek(), Some('}' | ']')) {
                    out.extend(chars.next());
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

fn show_text(row: &DeadLetterRow, stored: &StoredDeadLetter) -> String {
    let d = &stored.delivery;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "dead letter {} (group {})",
        row.id,
        cell(&row.group, 80)
    );
    let _ = writeln!(
        text,
        "event id:      {}",
        or_dash(row.event_id.as_deref(), 200)
    );
    let _ = writeln!(
        text,
        "event type:    {}",
        or_dash(row.event_type.as_deref(), 200)
    );
    let _ = writeln!(
        text,
        "from:          {}/{}@{}",
        cell(&d.topic, 200),
        d.partition,
        d.offset
    );
    let key = d.key.as_deref().map(String::from_utf8_lossy);
    let _ = writeln!(text, "key:           {}", or_dash(key.as_deref(), 200));
    let _ = writeln!(text, "attempts:      {}", stored.attempts);
    let _ = writeln!(text, "dead-lettered: {}", row.dead_lettered_at);
    let _ = writeln!(
        text,
        "replayed:      {}",
        or_dash(row.replayed_at.as_deref(), 40)
    );
    let _ = write!(text, "error:\n{}", block(&stored.error));
    text.push_str("headers:\n");
    for (name, value) in &d.headers {
        let value = header_value(name, value.as_deref());
        let _ = writeln!(
            text,
            "  {}: {}",
            cell(name, 80),
            or_dash(value.as_deref(), 500)
        );
    }
    let size = d.payload.as_ref().map_or(0, Vec::len);
    let _ = write!(
        text,
        "payload ({size} bytes):\n{}",
        block(&payload_text(d.payload.as_deref()))
    );
    text
}

fn show_json(row: &DeadLetterRow, stored: &StoredDeadLetter) -> Value {
    let d = &stored.delivery;
    let payload = d.payload.as_deref();
    let mut value = letter_json(row);
    value["key"] = json!(d.key.as_deref().map(String::from_utf8_lossy));
    value["headers"] = d
        .headers
        .iter()
        .map(|(n, v)| json!({ "name": n, "value": header_value(n, v.as_deref()) }))
        .collect();
    value["payload"] = payload
        .and_then(|p| serde_json::from_slice::<Value>(p).ok())
        .unwrap_or(Value::Null);
    value["payload_text"] = json!(payload.map(String::from_utf8_lossy));
    value
}

async fn replay(admin: &Admin, ids: &[i64], config: &InboxConfig) -> Result<Reply, Failure> {
    let (mut text, mut results, mut code) = (String::new(), Vec::new(), exit::OK);
    for &id in ids {
        let (line, result, this) = match admin.replay(id, config.clone()).await {
            Ok(Outcome::Processed { .. } | Outcome::Duplicate) => (
                format!("dead letter {id}: replayed"),
                json!({ "id": id, "replayed": true }),
                exit::OK,
            ),
            Ok(other) => {
                let why = not_replayed(id, &other);
                (
                    cell(&why, 1000),
                    json!({ "id": id, "replayed": false, "outcome": other.label(), "detail": why }),
                    exit::ERROR,
                )
            }
            Err(e @ AdminError::NoHandlers { .. }) => return Err(e.into()),
            Err(e) => {
                let failure = Failure::from(e);
                (
                    format!("dead letter {id}: {}", failure.message),
                    json!({ "id": id, "replayed": false, "error": failure.message }),
                    failure.code,
                )
            }
        };
        let _ = writeln!(text, "{line}");
        results.push(result);
        code = worse(code, this);
    }
    Ok(Reply {
        text,
        json: Value::Array(results),
        code,
        raw: None,
    })
}

/// What became of dead letter `id` when its replay did not process it, as a sentence.
fn not_replayed(id: i64, outcome: &Outcome) -> String {
    match outcome {
        Outcome::DeadLettered { reason, id: again } if *again == id => {
            format!("dead letter {id} was dead-lettered again: {reason}")
        }
        Outcome::DeadLettered { reason, id: again } => {
            format!("dead letter {id} was dead-lettered again, as dead letter {again}: {reason}")
        }
        Outcome::FailedAcknowledged { error } => format!(
            "dead letter {id} failed again, and the acknowledgement strategy drops failures: {error}"
        ),
        Outcome::FailedUnacknowledged { error, attempts } => {
            format!("dead letter {id} failed again ({attempts} attempt(s)): {error}")
        }
        Outcome::DuplicateBusinessKey { key } => format!(
            "dead letter {id} was not run: the group already processed an event with business \
             key `{key}`"
        ),
        Outcome::Skipped { reason } => format!("dead letter {id} was skipped: {reason}"),
        Outcome::Abandoned => {
            format!("dead letter {id} was abandoned before it finished (the command was stopped)")
        }
        Outcome::LeaseLost => format!(
            "dead letter {id} was rolled back: its lease was lost to another worker; try again"
        ),
        other => format!(
            "dead letter {id} was not replayed: its outcome was `{}`",
            other.label()
        ),
    }
}

/// The code of two results together: an error outweighs "not found", which outweighs success.
fn worse(a: u8, b: u8) -> u8 {
    let rank = |c: u8| match c {
        exit::OK => 0,
        exit::NOT_FOUND => 1,
        _ => 2,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

async fn discard(
    admin: &Admin,
    ids: Vec<i64>,
    filter: &Filter,
    yes: bool,
) -> Result<Reply, Failure> {
    if !yes {
        return Err(Failure::new(
            exit::USAGE,
            "discard deletes dead letters for good: add --yes (list them first with `inoutbox dead-letters list`)",
        ));
    }
    let ids = if ids.is_empty() {
        let letters = admin.dead_letters(&filter_of(filter)).await?;
        letters.iter().map(|l| l.id).collect()
    } else {
        ids
    };
    let mut discarded = Vec::new();
    for id in ids {
        if admin.discard(id).await? {
            discarded.push(id);
        }
    }
    let list: Vec<String> = discarded.iter().map(i64::to_string).collect();
    Ok(Reply {
        text: format!(
            "discarded {} dead letter(s): {}\n",
            discarded.len(),
            list.join(" ")
        ),
        json: json!({ "discarded": discarded }),
        code: if discarded.is_empty() {
            exit::NOT_FOUND
        } else {
            exit::OK
        },
        raw: None,
    })
}

#[cfg(test)]
mod tests {
    use super::indent_json;

    #[test]
    fn json_is_indented_with_its_keys_and_numbers_as_written() {
        let text = r#"{"z": 1.50, "a" :[ ], "m":{"q\"}":"a,b:[c]\\"}, "e": {}}"#;
        assert_eq!(
            indent_json(text),
            "{\n  \"z\": 1.50,\n  \"a\": [],\n  \"m\": {\n    \"q\\\"}\": \"a,b:[c]\\\\\"\n  },\n  \"e\": {}\n}"
        );
        assert_eq!(indent_json("[1,2]"), "[\n  1,\n  2\n]");
    }
}
