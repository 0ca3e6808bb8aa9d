//! SQLite: renames the tables of the project's first name (see `store::legacy`). `ALTER TABLE
//! .. RENAME` moves a table's indexes with it but keeps their names, and SQLite cannot rename an
//! index: each index named after the table is created again under its new name from the
//! statement SQLite kept. Tables the migrations derive from a table's name (the relay's lease
//! table) are renamed too.

use sqlx::SqliteConnection;

use crate::store::legacy::{self, Rename};
use crate::store::sql::stmt;
use crate::store::{StoreError, Tables};

/// An identifier read from the catalog, quoted for a statement.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn table_exists(conn: &mut SqliteConnection, name: &str) -> Result<bool, StoreError> {
    let found: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(found.is_some())
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
    let mut statements = vec![format!(
        "ALTER TABLE {} RENAME TO {}",
        r.old.name(),
        r.new.name()
    )];
    for (old, new) in r.derived_names() {
        if table_exists(conn, &old).await? {
            statements.push(format!(
                "ALTER TABLE {} RENAME TO {}",
                quote(&old),
                quote(&new)
            ));
        }
    }
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = $1 \
         AND sql IS NOT NULL",
    )
    .bind(r.old.name().as_str())
    .fetch_all(&mut *conn)
    .await?;
    for (name, sql) in indexes {
        let Some(new) = r.derived(&name) else {
            continue;
        };
        statements.push(format!("DROP INDEX {}", quote(&name)));
        statements.push(recreate_index(&sql, &name, &new, r)?);
    }
    for statement in statements {
        sqlx::raw_sql(stmt(statement)).execute(&mut *conn).await?;
    }
    Ok(())
}

/// `CREATE [UNIQUE] INDEX [IF NOT EXISTS] <name> ON <table> ..` as SQLite kept it, with the new
/// index name and table name.
fn recreate_index(sql: &str, name: &str, new: &str, r: &Rename) -> Result<String, StoreError> {
    let on = sql.find(" ON ").ok_or_else(|| unexpected(sql))?;
    let (head, tail) = sql.split_at(on);
    let head = head.trim_end();
    let named = head
        .strip_suffix(&quote(name))
        .or_else(|| head.strip_suffix(name))
        .ok_or_else(|| unexpected(sql))?;
    let tail = tail.trim_start_matches(" ON ").trim_start();
    let old_table = [
        quote(r.old.name().as_str()),
        r.old.name().as_str().to_owned(),
    ]
    .into_iter()
    .find(|t| tail.starts_with(t.as_str()))
    .ok_or_else(|| unexpected(sql))?;
    Ok(format!(
        "{named}{} ON {}{}",
        quote(new),
        r.new.name(),
        &tail[old_table.len()..]
    ))
}

fn unexpected(sql: &str) -> StoreError {
    StoreError::Migration(format!(
        "cannot read the index statement `{sql}` to rename it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_statement_is_rewritten_with_the_new_names() {
        let r = legacy::renames(&Tables::default()).remove(0);
        let (old, new) = (r.old.name().as_str(), r.new.name().as_str());
        let sql = format!(
            "CREATE INDEX \"{old}_processed_idx\" ON \"{old}\" (processed_at) \
             WHERE processed_at IS NOT NULL"
        );
        assert_eq!(
            recreate_index(&sql, &format!("{old}_processed_idx"), "x_idx", &r).unwrap(),
            format!(
                "CREATE INDEX \"x_idx\" ON \"{new}\" (processed_at) WHERE processed_at IS NOT NULL"
            )
        );
        let sql = format!("CREATE UNIQUE INDEX IF NOT EXISTS {old}_k ON {old} (a)");
        assert_eq!(
            recreate_index(&sql, &format!("{old}_k"), "y_k", &r).unwrap(),
            format!("CREATE UNIQUE INDEX IF NOT EXISTS \"y_k\" ON \"{new}\" (a)")
        );
        assert!(recreate_index("CREATE INDEX x", "x", "y", &r).is_err());
    }
}
