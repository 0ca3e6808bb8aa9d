//! The names of txbox's tables, shared by every store.

use crate::ident::{Ident, IdentError, TableName};
use crate::names;

/// The names of txbox's tables. Every name is a validated identifier; set a schema to keep
/// txbox's tables (and tests) apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    /// Inbox rows: `(consumer_group, source, event_id)`.
    pub inbox: TableName,
    /// Failed attempts, kept outside the handler's transaction.
    pub attempts: TableName,
    /// Dead letters.
    pub dead_letters: TableName,
    /// Outbox rows.
    pub outbox: TableName,
    /// Applied migrations.
    pub migrations: TableName,
}

impl Default for Tables {
    fn default() -> Self {
        Self::in_schema(None)
    }
}

fn default_table(schema: Option<&Ident>, name: &str) -> TableName {
    TableName::new(
        schema.cloned(),
        Ident::new(name).expect("default table names are valid"),
    )
}

impl Tables {
    fn in_schema(schema: Option<&Ident>) -> Self {
        Self {
            inbox: default_table(schema, names::INBOX_TABLE),
            attempts: default_table(schema, names::ATTEMPTS_TABLE),
            dead_letters: default_table(schema, names::DEAD_LETTER_TABLE),
            outbox: default_table(schema, names::OUTBOX_TABLE),
            migrations: default_table(schema, names::MIGRATIONS_TABLE),
        }
    }

    /// The default table names inside `schema` (created by [`PgStore::migrate`](crate::PgStore::migrate) if missing).
    pub fn with_schema(schema: &str) -> Result<Self, IdentError> {
        Ok(Self::in_schema(Some(&Ident::new(schema)?)))
    }

    /// The schema the tables live in, if set.
    pub fn schema(&self) -> Option<&Ident> {
        self.inbox.schema()
    }

    fn table(&self, name: &str) -> Result<TableName, IdentError> {
        Ok(TableName::new(self.schema().cloned(), Ident::new(name)?))
    }

    /// The table a migration template names `{name}` (see `store::migrate`).
    pub(crate) fn by_placeholder(&self, name: &str) -> Option<&TableName> {
        match name {
            "inbox" => Some(&self.inbox),
            "attempts" => Some(&self.attempts),
            "dead_letters" => Some(&self.dead_letters),
            "outbox" => Some(&self.outbox),
            "migrations" => Some(&self.migrations),
            _ => None,
        }
    }

    /// Renames the inbox table.
    pub fn inbox(mut self, name: &str) -> Result<Self, IdentError> {
        self.inbox = self.table(name)?;
        Ok(self)
    }

    /// Renames the attempts table.
    pub fn attempts(mut self, name: &str) -> Result<Self, IdentError> {
        self.attempts = self.table(name)?;
        Ok(self)
    }

    /// Renames the dead-letter table.
    pub fn dead_letters(mut self, name: &str) -> Result<Self, IdentError> {
        self.dead_letters = self.table(name)?;
        Ok(self)
    }

    /// Renames the outbox table.
    pub fn outbox(mut self, name: &str) -> Result<Self, IdentError> {
        self.outbox = self.table(name)?;
        Ok(self)
    }

    /// Renames the migrations table.
    pub fn migrations(mut self, name: &str) -> Result<Self, IdentError> {
        self.migrations = self.table(name)?;
        Ok(self)
    }
}
