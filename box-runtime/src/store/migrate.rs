//! Versioned migrations: each backend ships its schema as `.sql` files
//! (`postgres/migrations/`, `sqlite/migrations/`), and this one migrator applies those not yet
//! recorded, in order, in one transaction that excludes concurrent migrators.
//!
//! A migration is identified by `(component, version)` (`("inbox", 1)`, `("outbox", 1)`) and
//! recorded in the migrations table once applied. Table names in the files are written in
//! braces: `{inbox}` is the configured inbox table, `{inbox:processed_idx}` a name derived from
//! it (see [`TableName::derived`](crate::ident::TableName::derived)).
//!
//! Before applying any, the migrator renames tables that an earlier release created under the
//! project's former default names (see [`legacy`](super::legacy)), in the same transaction.

use std::future::Future;

use sqlx::{Database, Executor, IntoArguments};

use super::sql::stmt;
use super::{StoreError, Tables};

/// One schema change of one backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    /// Which part of inoutbox it belongs to (`"inbox"`, `"outbox"`).
    pub(crate) component: &'static str,
    /// Increasing per component.
    pub(crate) version: i32,
    /// What it does.
    pub(crate) description: &'static str,
    /// The SQL template (table names in braces).
    pub(crate) sql: &'static str,
}

/// What differs between backends when migrating: how the migrator excludes others, and the
/// migrations table's DDL.
pub(crate) trait Migrator {
    /// The sqlx database.
    type Db: Database;
    /// The backend's migrations, in the order they apply.
    const MIGRATIONS: &'static [Migration];
    /// Statements opening the exclusive migration transaction (e.g. `BEGIN` and an advisory
    /// lock; `BEGIN IMMEDIATE`).
    fn begin(tables: &Tables) -> Vec<String>;
    /// The `CREATE TABLE IF NOT EXISTS` of the migrations table.
    fn migrations_table(tables: &Tables) -> String;
    /// Renames the tables of the project's first name to today's defaults (see
    /// [`legacy`](super::legacy)) in the open migration transaction; returns the `(old, new)`
    /// names renamed.
    fn rename_legacy(
        conn: &mut <Self::Db as Database>::Connection,
        tables: &Tables,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send;
    /// Adapts a statement the migrator renders (with double-quoted identifiers and `$n`
    /// placeholders) to the backend's syntax; MySQL quotes with backticks and binds `?`.
    fn adapt(sql: String) -> String {
        sql
    }
}

/// Fills the table names into a migration template.
///
/// `{name}` becomes the configured table `name` (`inbox`, `attempts`, `dead_letters`, `outbox`,
/// `migrations`), `{name:suffix}` the derived name `<table>_<suffix>`. Braces that do not hold
/// such a name (e.g. the JSON literal `'{}'`) are kept as they are.
pub(crate) fn render(template: &str, tables: &Tables) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return Ok(out);
        };
        let inner = &after[..close];
        let is_name = !inner.is_empty()
            && inner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
        if !is_name {
            out.push('{');
            rest = after;
            continue;
        }
        let (table, suffix) = match inner.split_once(':') {
            Some((t, s)) => (t, Some(s)),
            None => (inner, None),
        };
        let table = tables
            .by_placeholder(table)
            .ok_or_else(|| format!("unknown table `{table}` in a migration"))?;
        match suffix {
            Some(suffix) => out.push_str(&table.derived(suffix)),
            None => out.push_str(&table.to_string()),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Applies every migration of `M` not yet recorded, on `conn`, inside the exclusive transaction
/// `M::begin` opens. Idempotent, and safe to run from several processes at once.
pub(crate) async fn migrate<M: Migrator>(
    conn: &mut <M::Db as Database>::Connection,
    tables: &Tables,
) -> Result<(), StoreError>
where
    for<'c> &'c mut <M::Db as Database>::Connection: Executor<'c, Database = M::Db>,
    <M::Db as Database>::Arguments: IntoArguments<M::Db>,
    for<'q> &'q str: sqlx::Encode<'q, M::Db> + sqlx::Type<M::Db>,
    for<'q> i32: sqlx::Encode<'q, M::Db> + sqlx::Decode<'q, M::Db> + sqlx::Type<M::Db>,
    for<'q> String: sqlx::Decode<'q, M::Db> + sqlx::Type<M::Db>,
    (String, i32): for<'r> sqlx::FromRow<'r, <M::Db as Database>::Row>,
{
    tables.validate()?;
    for statement in M::begin(tables) {
        sqlx::raw_sql(stmt(statement)).execute(&mut *conn).await?;
    }
    let upgraded = async {
        for (old, new) in M::rename_legacy(&mut *conn, tables).await? {
            tracing::info!(target: "inoutbox::store", %old, %new,
                "table renamed from the project's former default name");
        }
        apply_missing::<M>(&mut *conn, tables).await
    };
    match upgraded.await {
        Ok(()) => {
            sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
            Ok(())
        }
        Err(e) => {
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            Err(e)
        }
    }
}

async fn apply_missing<M: Migrator>(
    conn: &mut <M::Db as Database>::Connection,
    tables: &Tables,
) -> Result<(), StoreError>
where
    for<'c> &'c mut <M::Db as Database>::Connection: Executor<'c, Database = M::Db>,
    <M::Db as Database>::Arguments: IntoArguments<M::Db>,
    for<'q> &'q str: sqlx::Encode<'q, M::Db> + sqlx::Type<M::Db>,
    for<'q> i32: sqlx::Encode<'q, M::Db> + sqlx::Decode<'q, M::Db> + sqlx::Type<M::Db>,
    for<'q> String: sqlx::Decode<'q, M::Db> + sqlx::Type<M::Db>,
    (String, i32): for<'r> sqlx::FromRow<'r, <M::Db as Database>::Row>,
{
    sqlx::raw_sql(stmt(M::adapt(M::migrations_table(tables))))
        .execute(&mut *conn)
        .await?;
    let applied: Vec<(String, i32)> = sqlx::query_as(stmt(M::adapt(format!(
        "SELECT component, version FROM {}",
        tables.migrations
    ))))
    .fetch_all(&mut *conn)
    .await?;
    let record = stmt(M::adapt(format!(
        "INSERT INTO {} (component, version, description) VALUES ($1, $2, $3)",
        tables.migrations
    )));
    for m in M::MIGRATIONS {
        if applied
            .iter()
            .any(|(c, v)| c == m.component && *v == m.version)
        {
            continue;
        }
        let sql = M::adapt(render(m.sql, tables).map_err(StoreError::Migration)?);
        sqlx::raw_sql(stmt(sql)).execute(&mut *conn).await?;
        sqlx::query(record.clone())
            .bind(m.component)
            .bind(m.version)
            .bind(m.description)
            .execute(&mut *conn)
            .await?;
        tracing::info!(target: "inoutbox::store",
            component = m.component,
            version = m.version,
            "inoutbox migration applied"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::render;
    use crate::store::Tables;

    #[test]
    fn fills_tables_and_derived_names_and_keeps_other_braces() {
        let tables = Tables::with_schema("app").unwrap();
        let sql = render(
            "CREATE INDEX {inbox:processed_idx} ON {inbox} (x); DEFAULT '{}'",
            &tables,
        )
        .unwrap();
        assert_eq!(
            sql,
            "CREATE INDEX \"inoutbox_inbox_processed_idx\" ON \"app\".\"inoutbox_inbox\" (x); DEFAULT '{}'"
        );
    }

    #[test]
    fn an_unknown_table_is_an_error() {
        assert!(render("{nope}", &Tables::default()).is_err());
    }

    #[test]
    fn every_derived_name_of_the_migrations_is_validated() {
        let mut templates: Vec<&str> = crate::postgres::MIGRATIONS.iter().map(|m| m.sql).collect();
        #[cfg(feature = "sqlite")]
        templates.extend(crate::sqlite::MIGRATIONS.iter().map(|m| m.sql));
        #[cfg(feature = "mysql")]
        templates.extend(crate::mysql::MIGRATIONS.iter().map(|m| m.sql));
        for sql in templates {
            for part in sql.split('{').skip(1) {
                let inner = part.split('}').next().unwrap_or("");
                if let Some((table, suffix)) = inner.split_once(':') {
                    assert!(
                        crate::store::tables::DERIVED.contains(&(table, suffix)),
                        "`{{{inner}}}` is not in store::tables::DERIVED"
                    );
                }
            }
        }
    }

    #[test]
    fn colliding_or_too_long_table_names_are_rejected() {
        let same = Tables::default().attempts("inoutbox_inbox").unwrap();
        let err = same.validate().unwrap_err().to_string();
        assert!(err.contains("`inoutbox_inbox`"), "{err}");
        let long = Tables::default().inbox(&"i".repeat(63)).unwrap();
        let err = long.validate().unwrap_err().to_string();
        assert!(err.contains("exceeds 63 bytes"), "{err}");
        // a table named like another's index
        let clash = Tables::default()
            .outbox("inoutbox_inbox_processed")
            .unwrap();
        assert!(clash.validate().is_ok());
        let clash = Tables::default()
            .attempts("inoutbox_inbox_processed_idx")
            .unwrap();
        assert!(clash.validate().is_err());
        Tables::default().validate().unwrap();
    }

    #[test]
    fn every_shipped_migration_renders() {
        let tables = Tables::default();
        for m in crate::postgres::MIGRATIONS {
            render(m.sql, &tables).unwrap();
        }
        #[cfg(feature = "sqlite")]
        for m in crate::sqlite::MIGRATIONS {
            render(m.sql, &tables).unwrap();
        }
        #[cfg(feature = "mysql")]
        for m in crate::mysql::MIGRATIONS {
            render(m.sql, &tables).unwrap();
        }
    }
}
