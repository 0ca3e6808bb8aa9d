//! SQLite: renames the tables of the project's first name (see `store::legacy`). `ALTER TABLE
//! .. RENAME` moves a table's indexes with it (rewriting their statements to name the new
//! table) but keeps their names, and SQLite cannot rename an index: each index named after the
//! table is dropped and created again, under its new name, from the statement SQLite kept.
//! Tables the migrations derive from a table's name (the relay's lease table) are renamed too.

use sqlx::SqliteConnection;

use crate::ident::quote_name;
use crate::store::legacy::{self, Rename};
use crate::store::sql::stmt;
use crate::store::{StoreError, Tables};

async fn table_exists(conn: &mut SqliteConnection, name: &str) -> Result<bool, StoreError> {
    let found: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(found.is_some())
}

async fn run(conn: &mut SqliteConnection, statement: String) -> Result<(), StoreError> {
    sqlx::raw_sql(stmt(statement)).execute(&mut *conn).await?;
    Ok(())
}

/// Renames, in `conn`'s open transaction, every default table of `tables` that exists only under
/// its first-release name; returns the pairs renamed, as `(old, new)`.
pub(super) async fn rename(
    conn: &mut SqliteConnection,
    tables: &Tables,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut renamed = Vec::new();
    for r in legacy::renames(tables) {
        if !table_exists(conn, r.old.name().as_str()).await? {
            continue;
        }
        if table_exists(conn, r.new.name().as_str()).await? {
            return Err(r.both_exist());
        }
        rename_one(conn, &r).await?;
        renamed.push((r.old.to_string(), r.new.to_string()));
    }
    Ok(renamed)
}

async fn rename_one(conn: &mut SqliteConnection, r: &Rename) -> Result<(), StoreError> {
    run(
        conn,
        format!("ALTER TABLE {} RENAME TO {}", r.old.name(), r.new.name()),
    )
    .await?;
    for old in r.derived_names() {
        let Some(new) = r.derived(&old) else {
            continue;
        };
        if table_exists(conn, &old).await? {
            let statement = format!(
                "ALTER TABLE {} RENAME TO {}",
                quote_name(&old),
                quote_name(&new)
            );
            run(conn, statement).await?;
        }
    }
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = $1 \
         AND sql IS NOT NULL",
    )
    .bind(r.new.name().as_str())
    .fetch_all(&mut *conn)
    .await?;
    for (name, sql) in indexes {
        let Some(new) = r.derived(&name) else {
            continue;
        };
        let create = renamed_index(&sql, &name, &new)?;
        run(conn, format!("DROP INDEX {}", quote_name(&name))).await?;
        run(conn, create).await?;
    }
    Ok(())
}

/// `CREATE [UNIQUE] INDEX [IF NOT EXISTS] <name> ON ..` as SQLite kept it, with the index's new
/// name: the first occurrence of the name is the index's own (quoted or not, the quotes stay).
fn renamed_index(sql: &str, name: &str, new: &str) -> Result<String, StoreError> {
    match sql.contains(name) {
        true => Ok(sql.replacen(name, new, 1)),
        false => Err(StoreError::Migration(format!(
            "cannot find the index name `{name}` in `{sql}` to rename it"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_statement_is_rewritten_with_the_new_name() {
        let sql = "CREATE INDEX \"a_processed_idx\" ON \"b\" (processed_at) \
                   WHERE processed_at IS NOT NULL";
        assert_eq!(
            renamed_index(sql, "a_processed_idx", "c_processed_idx").unwrap(),
            "CREATE INDEX \"c_processed_idx\" ON \"b\" (processed_at) WHERE processed_at IS NOT NULL"
        );
        let sql = "CREATE UNIQUE INDEX IF NOT EXISTS a_k ON b (a_k)";
        assert_eq!(
            renamed_index(sql, "a_k", "c_k").unwrap(),
            "CREATE UNIQUE INDEX IF NOT EXISTS c_k ON b (a_k)"
        );
        assert!(renamed_index("CREATE INDEX x ON y (z)", "a_k", "c_k").is_err());
    }
}
