//! PostgreSQL: renames the tables of the project's first name (see `store::legacy`) with
//! everything named after them: indexes (and with them the primary-key constraints), the
//! partitions of a partitioned inbox and their indexes, owned sequences, triggers, and the
//! functions the migrations derive from a table's name.

use sqlx::{PgConnection, Row};

use crate::ident::quote_name as quote;
use crate::store::legacy::{self, Rename};
use crate::store::migrate::render;
use crate::store::sql::stmt;
use crate::store::{StoreError, Tables};

/// The relations that belong to a table (`$1`, its oid), with their kind for `ALTER`: its
/// partitions (at any depth), their indexes and its sequences.
const OWNED: &str = "\
WITH RECURSIVE tree(oid) AS (
    SELECT $1::oid
    UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid
)
SELECT 'TABLE' AS kind, c.oid <> $1::oid AS child, n.nspname::text AS schema, c.relname::text AS name
    FROM tree t JOIN pg_class c ON c.oid = t.oid JOIN pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT 'INDEX', true, n.nspname::text, c.relname::text
    FROM tree t JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class c ON c.oid = x.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT 'SEQUENCE', true, n.nspname::text, c.relname::text
    FROM tree t JOIN pg_depend d ON d.refobjid = t.oid AND d.refclassid = 'pg_class'::regclass
    JOIN pg_class c ON c.oid = d.objid AND c.relkind = 'S' JOIN pg_namespace n ON n.oid = c.relnamespace";

/// The oid of the table `name` (as configured: quoted, maybe schema-qualified), if it exists.
async fn table_oid(conn: &mut PgConnection, name: &str) -> Result<Option<i64>, StoreError> {
    let row = sqlx::query(
        "SELECT c.oid::int8 FROM pg_class c WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')",
    )
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|row| row.get(0)))
}

/// Renames, in `conn`'s open transaction, every default table of `tables` that exists only under
/// its first-release name; returns the pairs renamed, as `(old, new)`.
pub(super) async fn rename(
    conn: &mut PgConnection,
    tables: &Tables,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut renamed = Vec::new();
    for r in legacy::renames(tables) {
        let Some(oid) = table_oid(conn, &r.old.to_string()).await? else {
            continue;
        };
        if table_oid(conn, &r.new.to_string()).await?.is_some() {
            return Err(r.both_exist());
        }
        rename_one(conn, &r, oid, tables).await?;
        renamed.push((r.old.to_string(), r.new.to_string()));
    }
    Ok(renamed)
}

async fn rename_one(
    conn: &mut PgConnection,
    r: &Rename,
    oid: i64,
    tables: &Tables,
) -> Result<(), StoreError> {
    let owned = sqlx::query(OWNED).bind(oid).fetch_all(&mut *conn).await?;
    let schema: String = owned
        .iter()
        .find(|row| !row.get::<bool, _>("child"))
        .map(|row| row.get("schema"))
        .ok_or_else(|| StoreError::Migration(format!("{} vanished while renaming", r.old)))?;
    let table = format!("{}.{}", quote(&schema), quote(r.new.name().as_str()));
    let mut statements = vec![format!("ALTER TABLE {} RENAME TO {}", r.old, r.new.name())];
    for row in owned.iter().filter(|row| row.get::<bool, _>("child")) {
        let name: String = row.get("name");
        if let Some(new) = r.derived(&name) {
            let kind: String = row.get("kind");
            let schema: String = row.get("schema");
            statements.push(format!(
                "ALTER {kind} {}.{} RENAME TO {}",
                quote(&schema),
                quote(&name),
                quote(&new)
            ));
        }
    }
    let triggers: Vec<String> = sqlx::query_scalar(
        "SELECT tgname::text FROM pg_trigger WHERE tgrelid = $1::oid AND NOT tgisinternal",
    )
    .bind(oid)
    .fetch_all(&mut *conn)
    .await?;
    for trigger in triggers {
        if let Some(new) = r.derived(&trigger) {
            statements.push(format!(
                "ALTER TRIGGER {} ON {table} RENAME TO {}",
                quote(&trigger),
                quote(&new)
            ));
        }
    }
    let functions: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, p.proname::text FROM pg_proc p JOIN pg_namespace n \
         ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = ANY($2) AND p.pronargs = 0",
    )
    .bind(&schema)
    .bind(r.derived_names())
    .fetch_all(&mut *conn)
    .await?;
    let order_function = format!("{}_order", r.old.name().as_str());
    let mut names_its_table = false;
    for (function, name) in functions {
        if let Some(new) = r.derived(&name) {
            statements.push(format!(
                "ALTER FUNCTION {function} RENAME TO {}",
                quote(&new)
            ));
            names_its_table |= name == order_function;
        }
    }
    if names_its_table {
        // The outbox's commit trigger function names its table since migration outbox v6:
        // defined again (its current definition) for the new name. Where it predates v6, v6
        // runs again after the rename and defines the same.
        statements
            .push(render(super::outbox::ORDER_FUNCTION, tables).map_err(StoreError::Migration)?);
    }
    for statement in statements {
        sqlx::raw_sql(stmt(statement)).execute(&mut *conn).await?;
    }
    Ok(())
}

/// The statements `begin` adds: the lock a first-release migrator takes, so that one running
/// now waits for the rename (or the rename for it).
pub(super) fn lock_old_migrator(tables: &Tables) -> Option<String> {
    legacy::old_migrations_table(tables).map(|old| {
        format!(
            "SELECT pg_advisory_xact_lock(hashtext('{}{old}'))",
            legacy::LOCK_NAMESPACE
        )
    })
}
