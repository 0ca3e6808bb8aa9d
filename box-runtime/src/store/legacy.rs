//! The project's first name, `txbox`, and what of it the database still holds.
//!
//! Releases before the rename created their tables under the default names `txbox_inbox`,
//! `txbox_outbox`, ... . [`migrate`](super::migrate::migrate) renames them to today's defaults
//! (`inoutbox_inbox`, ...), with the indexes, partitions, sequences, triggers and functions
//! named after them, in the migration's own transaction, before it applies the versioned
//! migrations: a database migrated by an earlier release keeps its rows and its recorded
//! migrations. Only a table whose configured name is today's default is looked for under its old
//! name: a table a user named explicitly is never renamed.
//!
//! The advisory-lock namespaces below keep the first name on purpose: an enqueue, a claim on
//! the partitioned inbox and a migrator of either version must take the same locks, so that
//! processes of both versions still exclude each other during a rolling upgrade of services
//! that name their tables explicitly.

use super::{StoreError, Tables};
use crate::ident::{Ident, TableName};
use crate::names;

/// The prefix of the first release's default table names (`txbox_inbox`, ...).
const OLD_PREFIX: &str = "txbox_";

/// The prefix of `hashtext` advisory locks on PostgreSQL (migrations, partitioned claims).
pub(crate) const LOCK_NAMESPACE: &str = "txbox:";
/// The FNV-1a namespace of the per-key enqueue lock on PostgreSQL.
pub(crate) const ENQUEUE_LOCK: &[u8] = b"txbox-enqueue";
/// The FNV-1a namespace of the outbox wake-up lock on PostgreSQL.
pub(crate) const WAKE_LOCK: &[u8] = b"txbox-wake";

/// One table to look for under its first-release name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rename {
    /// The table's role (`inbox`, `outbox`, ...: a placeholder of the migrations).
    pub(crate) role: &'static str,
    /// The first release's default name, in the configured schema.
    pub(crate) old: TableName,
    /// Today's default name, as configured.
    pub(crate) new: TableName,
}

impl Rename {
    /// The new name of an object named after the old table (`txbox_inbox_processed_idx` ->
    /// `inoutbox_inbox_processed_idx`), or `None` when `object` is not named after it.
    pub(crate) fn derived(&self, object: &str) -> Option<String> {
        let rest = object.strip_prefix(self.old.name().as_str())?;
        rest.starts_with('_')
            .then(|| fit(format!("{}{rest}", self.new.name().as_str())))
    }

    /// The names the shipped migrations derive from the old table (`{role:suffix}`): to find
    /// the objects that are not tied to the table in the catalog (the slot function on
    /// PostgreSQL, the relay's lease table on SQLite). Their new names are [`derived`](Self::derived).
    pub(crate) fn derived_names(&self) -> Vec<String> {
        super::tables::DERIVED
            .iter()
            .filter(|(role, _)| *role == self.role)
            .map(|(_, suffix)| format!("{}_{suffix}", self.old.name().as_str()))
            .collect()
    }

    /// The error when both names hold a table: which to keep is the user's decision.
    pub(crate) fn both_exist(&self) -> StoreError {
        StoreError::Config(format!(
            "both `{old}` and `{new}` exist: `{old}` is the {role} table under the project's \
             former default name, which migrate() renames to `{new}`. Move its rows into `{new}` \
             and drop it, or configure the {role} table by name (`Tables::{role}`) to keep \
             using `{old}`",
            old = self.old,
            new = self.new,
            role = self.role,
        ))
    }
}

/// The longest identifier PostgreSQL keeps.
const MAX_IDENT: usize = 63;

/// `name` made to fit [`MAX_IDENT`] bytes: the new prefix is longer than the old, and
/// PostgreSQL's own index names (`<table>_<columns>_idx`) already use every byte. Characters
/// go from before the last `_` (so `_idx`, `_pkey` stay), as PostgreSQL shortens the names it
/// chooses.
fn fit(name: String) -> String {
    let over = name.len().saturating_sub(MAX_IDENT);
    if over == 0 || !name.is_ascii() {
        return name;
    }
    match name.rfind('_') {
        Some(last) if last > over + 1 => format!("{}{}", &name[..last - over], &name[last..]),
        _ => name[..MAX_IDENT].to_owned(),
    }
}

/// The tables of `tables` that have today's default name, each with its first-release name.
pub(crate) fn renames(tables: &Tables) -> Vec<Rename> {
    let defaults = tables.defaults();
    tables
        .roles()
        .into_iter()
        .zip(defaults.roles())
        .filter(|((_, table), (_, default))| table.name() == default.name())
        .filter_map(|((role, table), _)| {
            let base = table.name().as_str().strip_prefix(names::TABLE_PREFIX)?;
            let old = Ident::new(format!("{OLD_PREFIX}{base}")).ok()?;
            Some(Rename {
                role,
                old: TableName::new(table.schema().cloned(), old),
                new: table.clone(),
            })
        })
        .collect()
}

/// The first release's default migrations table in `tables`' schema, when the configured one is
/// today's default: a migrator of that release locks on it, so a current migrator takes its
/// lock too while it may rename.
pub(crate) fn old_migrations_table(tables: &Tables) -> Option<String> {
    renames(tables)
        .into_iter()
        .find(|r| r.role == "migrations")
        .map(|r| r.old.name().as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_table_is_looked_for_under_its_first_name() {
        let found = renames(&Tables::with_schema("app").unwrap());
        let pairs: Vec<(String, String)> = found
            .iter()
            .map(|r| (r.old.to_string(), r.new.to_string()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("inbox", "inbox"),
                ("inbox_attempts", "inbox_attempts"),
                ("dead_letters", "dead_letters"),
                ("outbox", "outbox"),
                ("migrations", "migrations"),
                ("effects", "effects"),
            ]
            .map(|(o, n)| (
                format!("\"app\".\"txbox_{o}\""),
                format!("\"app\".\"inoutbox_{n}\"")
            ))
        );
    }

    /// The lock namespaces are the first release's: changing them would let processes of two
    /// versions take different locks for the same key (`postgres::outbox` pins the ids too).
    #[test]
    fn the_lock_namespaces_keep_the_first_name() {
        assert_eq!(LOCK_NAMESPACE, "txbox:");
        assert_eq!(ENQUEUE_LOCK, b"txbox-enqueue");
        assert_eq!(WAKE_LOCK, b"txbox-wake");
    }

    #[test]
    fn a_table_named_explicitly_is_never_renamed() {
        let tables = Tables::default()
            .inbox("txbox_inbox")
            .unwrap()
            .outbox("orders_outbox")
            .unwrap();
        let roles: Vec<&str> = renames(&tables).iter().map(|r| r.role).collect();
        assert_eq!(
            roles,
            ["attempts", "dead_letters", "migrations", "effects"],
            "the inbox and outbox were named explicitly"
        );
    }

    #[test]
    fn derived_names_follow_the_table_and_nothing_else() {
        let inbox = renames(&Tables::default()).remove(0);
        assert_eq!(
            inbox.derived("txbox_inbox_p20260101").as_deref(),
            Some("inoutbox_inbox_p20260101")
        );
        assert_eq!(inbox.derived("txbox_inboxes"), None);
        assert_eq!(inbox.derived("other_inbox_pkey"), None);
        let long = "txbox_inbox_default_consumer_group_business_key_received_da_idx";
        let fitted = inbox.derived(long).unwrap();
        assert_eq!(
            fitted,
            "inoutbox_inbox_default_consumer_group_business_key_received_idx"
        );
        assert_eq!(fitted.len(), MAX_IDENT);
        assert!(inbox
            .derived_names()
            .contains(&"txbox_inbox_processed_idx".to_owned()));
    }
}
