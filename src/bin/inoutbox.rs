//! The `inoutbox` command: status, dead letters, parked outbox rows, purges and migrations of a
//! inoutbox database. Replaying dead letters needs the handlers: run it from the application's
//! binary through `inoutbox::cli::run()` (see `docs/operations.md`).

fn main() -> std::process::ExitCode {
    inoutbox::cli::run()
}
