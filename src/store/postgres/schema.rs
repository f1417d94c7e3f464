//! The schema: versioned migrations compiled into the binary, applied at
//! open in one transaction under an advisory lock (servers starting at once
//! take turns; the second finds the work done), and the values made once
//! (the task-token key). A database whose schema is newer than this binary
//! knows is refused by name rather than written to.

use tokio_postgres::Client;

use super::errors::{database_error, describe};
use crate::store::{Result, StoreError};

/// Every migration, in order: (version, SQL).
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_init.sql")),
    (2, include_str!("migrations/0002_actor_principal.sql")),
    (3, include_str!("migrations/0003_shards.sql")),
    (4, include_str!("migrations/0004_members.sql")),
    (5, include_str!("migrations/0005_reviews.sql")),
    (6, include_str!("migrations/0006_token_usage.sql")),
    (7, include_str!("migrations/0007_grants.sql")),
    (8, include_str!("migrations/0008_retention.sql")),
    (9, include_str!("migrations/0009_shard_positions.sql")),
    (10, include_str!("migrations/0010_member_modes.sql")),
];

/// The newest schema version this binary knows.
pub(super) const LATEST: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The advisory lock migrations take: "aaa_mig" in ASCII.
const MIGRATION_LOCK: i64 = 0x0061_6161_5f6d_6967;

/// The meta row holding the task-token key.
const TOKEN_KEY: &str = "token-key";

/// Brings the schema up to [`LATEST`] and returns the task-token key (made
/// by whichever server got here first).
pub(super) async fn prepare(client: &mut Client) -> Result<[u8; 32]> {
    let tx = client.transaction().await.map_err(database_error)?;
    // What this transaction writes must be durable before anyone uses it.
    tx.batch_execute("SET LOCAL synchronous_commit TO on")
        .await
        .map_err(database_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(database_error)?;
    create_own_schema(&tx).await?;
    let current = version(&tx).await?;
    if current > LATEST {
        return Err(too_new(current));
    }
    for (number, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql).await.map_err(|e| {
            StoreError::Format(format!(
                "migrating the database to schema version {number} failed: {}",
                describe(&e)
            ))
        })?;
        tx.execute("INSERT INTO aaa_schema (version) VALUES ($1)", &[number])
            .await
            .map_err(database_error)?;
        tracing::info!("database schema migrated to version {number}");
    }
    let made = crate::domain::random_key();
    tx.execute(
        "INSERT INTO aaa_meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[&TOKEN_KEY, &made.as_slice()],
    )
    .await
    .map_err(database_error)?;
    let row = tx
        .query_one("SELECT value FROM aaa_meta WHERE name = $1", &[&TOKEN_KEY])
        .await
        .map_err(database_error)?;
    let stored: Vec<u8> = row.try_get(0).map_err(database_error)?;
    let key = stored
        .try_into()
        .map_err(|_| StoreError::Corrupt("aaa_meta: the token key is not 32 bytes".into()))?;
    tx.commit().await.map_err(database_error)?;
    Ok(key)
}

/// Creates the schema the connection's `search_path` names first, when it
/// names one that does not exist yet (`options=-csearch_path%3Dname` in the
/// URL keeps aaa's tables apart from others in one database).
async fn create_own_schema(tx: &tokio_postgres::Transaction<'_>) -> Result<()> {
    let path: String = tx
        .query_one("SELECT current_setting('search_path')", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(database_error)?;
    let Some(first) = path.split(',').next().map(str::trim) else {
        return Ok(());
    };
    let name = match first.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\"\"", "\""),
        None => first.to_lowercase(),
    };
    if name.is_empty() || name == "$user" {
        return Ok(());
    }
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {quoted}"))
        .await
        .map_err(database_error)
}

/// The schema version the database has: 0 when it has none of our tables.
async fn version(tx: &tokio_postgres::Transaction<'_>) -> Result<i32> {
    let exists: bool = tx
        .query_one("SELECT to_regclass('aaa_schema') IS NOT NULL", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(database_error)?;
    if !exists {
        return Ok(0);
    }
    tx.query_one("SELECT coalesce(max(version), 0) FROM aaa_schema", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(database_error)
}

/// The refusal of a database a newer aaa has migrated.
fn too_new(version: i32) -> StoreError {
    StoreError::Format(format!(
        "the database schema is version {version}; this aaa knows versions up to {LATEST} \
         (run a newer aaa, or point this one at another database)"
    ))
}
