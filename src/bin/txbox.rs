//! The `txbox` command: status, dead letters, parked outbox rows, purges and migrations of a
//! txbox database. Replaying dead letters needs the handlers: run it from the application's
//! binary through `txbox::cli::run()` (see `docs/operations.md`).

fn main() -> std::process::ExitCode {
    txbox::cli::run()
}
