//! The example services, run as a user runs them: the inventory and payments services in the
//! zero-setup mode (SQLite and the in-process Kafka) and on PostgreSQL with a Tansu broker, with
//! the same handlers (one per event, written once for both stores).

mod support;

use std::process::Command;

use support::Broker;

/// Runs the inventory example with `env`; returns its output after checking that it exited 0.
fn run_inventory(env: &[(&str, &str)], args: &[&str]) -> String {
    run_example("inventory", env, args)
}

/// Runs example `name` with `env`; returns its output after checking that it exited 0.
fn run_example(name: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut command = Command::new(support::child::example(name));
    command
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .env_remove("NATS_URL")
        .args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run the example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the {name} example failed ({}): some figure differs from the expected one",
        output.status
    );
    stdout
}

/// What every run must show: the rejected order left the stock as it was (all or nothing),
/// the cancellation gave its stock back, and the chained `StockReserved` events made shipments.
fn assert_the_story(stdout: &str) {
    let line = |start: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?} in:\n{stdout}"))
            .to_owned()
    };
    assert!(line("order B").contains("rejected") && line("order B").ends_with("apple 7, pear 3"));
    assert!(line("order A cancelled").ends_with("apple 5, pear 5"));
    assert!(line("order D").contains("reserved"));
    assert!(line("shipments made from StockReserved").ends_with(" 3"));
    assert!(line("pears left").ends_with(" 0"));
}

#[test]
fn inventory_runs_with_zero_setup() {
    let stdout = run_inventory(&[], &[]);
    assert!(
        stdout.contains("SQLite (") && stdout.contains("in-process Kafka"),
        "zero-setup mode"
    );
    assert_the_story(&stdout);
}

#[test]
fn inventory_runs_on_postgres_and_tansu_with_the_same_handlers() {
    let broker = Broker::start();
    let url = support::database_url();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("KAFKA_BROKERS", broker.brokers.as_str()),
    ];
    let stdout = run_inventory(&env, &["--no-idempotence"]);
    assert!(
        stdout.contains("PostgreSQL") && stdout.contains(&format!("Kafka at {}", broker.brokers)),
        "PostgreSQL + Tansu mode"
    );
    assert_the_story(&stdout);
}

/// What every payments run must show: the cancels that came before their orders were deferred
/// and refunded once, and the eight reviews (effects after commit) ran at once, each once.
fn assert_the_payments(stdout: &str) {
    let figure = |start: &str| -> String {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?} in:\n{stdout}"));
        line.trim_start()[start.len()..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(figure("payments refunded"), "3");
    assert_eq!(figure("of them cancelled before their order"), "2");
    assert_eq!(figure("fraud reviews run (effects after commit)"), "8");
    assert_eq!(figure("of them run more than once"), "0");
    assert_eq!(figure("fraud reviews at once, at most"), "8");
    assert!(
        stdout.contains(
            "inoutbox_inbox_deferred_total{transport=\"kafka\",group=\"payments\",event_type=\"OrderCancelled\"} 2"
        ),
        "the scrape of the ops endpoint counts the two deferrals"
    );
}

#[cfg(feature = "http")]
#[test]
fn payments_runs_with_zero_setup() {
    let stdout = run_example("payments", &[], &["--review-ms", "500"]);
    assert!(stdout.contains("SQLite ("), "zero-setup mode");
    assert_the_payments(&stdout);
}

#[cfg(feature = "http")]
#[test]
fn payments_runs_on_postgres_and_tansu_with_the_same_handlers() {
    let broker = Broker::start();
    let url = support::database_url();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("KAFKA_BROKERS", broker.brokers.as_str()),
    ];
    let stdout = run_example(
        "payments",
        &env,
        &["--no-idempotence", "--review-ms", "500"],
    );
    assert!(stdout.contains("PostgreSQL"), "PostgreSQL + Tansu mode");
    assert_the_payments(&stdout);
}
