//! Who is on the database (`aaa_members`): each server writes its row when
//! it joins and renews it every third of its lease, so the others know the
//! address to forward calls to and whether it is alive. A server leaving
//! gracefully deletes its row; rows of servers silent for [`PRUNE_AFTER_MS`]
//! are deleted by the live ones. Times are the database's clock.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;

use super::errors::{database_error, describe, pool_error};
use super::ownership::NOW_MS;
use crate::store::{ClusterView, Member, Result, ShardLease, StoreError};

/// How long a dead member's row stays for `aaa cluster status` to show.
const PRUNE_AFTER_MS: i64 = 10 * 60 * 1000;

/// What a member writes of itself.
pub(super) struct Row {
    pub server: String,
    pub address: String,
    /// How long the row counts as alive after each renewal.
    pub lease_ms: i64,
    /// It shares the shards out (see `Member::spreads`).
    pub spreads: bool,
}

/// Renews the member's row every third of `lease` until `stop`. A renewal
/// the database does not take is logged: the row lapses meanwhile.
pub(super) async fn keep(pool: Pool, row: Row, lease: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(lease / 3) => {}
            () = stop.cancelled() => return,
        }
        if let Err(e) = renew(&pool, &row).await {
            tracing::warn!("could not renew this server's membership: {e}");
        }
    }
}

/// Deletes the member's row: it leaves.
pub(super) async fn leave(pool: &Pool, server: &str) -> Result<()> {
    let client = pool.get().await.map_err(pool_error)?;
    client
        .execute("DELETE FROM aaa_members WHERE server = $1", &[&server])
        .await
        .map_err(database_error)?;
    Ok(())
}

/// Writes or renews the row, and prunes rows long dead.
pub(super) async fn renew(pool: &Pool, row: &Row) -> Result<()> {
    let client = pool.get().await.map_err(pool_error)?;
    let upsert = format!(
        "INSERT INTO aaa_members (server, address, started_ms, seen_until_ms, spreads) \
         VALUES ($1, $2, {NOW_MS}, {NOW_MS} + $3, $4) \
         ON CONFLICT (server) DO UPDATE SET address = $2, seen_until_ms = {NOW_MS} + $3, \
         spreads = $4"
    );
    client
        .execute(
            &upsert,
            &[&row.server, &row.address, &row.lease_ms, &row.spreads],
        )
        .await
        .map_err(database_error)?;
    let prune = format!("DELETE FROM aaa_members WHERE seen_until_ms < {NOW_MS} - $1");
    client
        .execute(&prune, &[&PRUNE_AFTER_MS])
        .await
        .map_err(database_error)?;
    Ok(())
}

/// The members and the shard leases, with the database's time. Three
/// reads sent together (one round trip), not one snapshot: a lease may
/// move between them, which a status and an owner lookup tolerate.
pub(super) async fn view(pool: &Pool) -> Result<ClusterView> {
    let client = pool.get().await.map_err(pool_error)?;
    let now_sql = format!("SELECT {NOW_MS}");
    let (now, members, shards) = tokio::try_join!(
        client.query_one(&now_sql, &[]),
        client.query(
            "SELECT server, address, started_ms, seen_until_ms, spreads FROM aaa_members \
             ORDER BY server",
            &[],
        ),
        client.query(
            "SELECT shard, owner, epoch, lease_until_ms FROM aaa_shards ORDER BY shard",
            &[],
        ),
    )
    .map_err(database_error)?;
    let now: i64 = now.try_get(0).map_err(|e| corrupt("aaa_members", &e))?;
    let members = members
        .iter()
        .map(|row| {
            Ok(Member {
                server: row.try_get(0)?,
                address: row.try_get(1)?,
                started_ms: row.try_get(2)?,
                seen_until_ms: row.try_get(3)?,
                spreads: row.try_get(4)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(|e| corrupt("aaa_members", &e))?;
    let shards = shards
        .iter()
        .map(|row| {
            let shard: i16 = row.try_get(0)?;
            Ok(ShardLease {
                shard: u8::try_from(shard).unwrap_or(u8::MAX),
                owner: row.try_get(1)?,
                epoch: row.try_get(2)?,
                lease_until_ms: row.try_get(3)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(|e| corrupt("aaa_shards", &e))?;
    Ok(ClusterView {
        now_ms: now,
        members,
        shards,
    })
}

fn corrupt(table: &str, e: &tokio_postgres::Error) -> StoreError {
    super::errors::corrupt(format!("{table}: {}", describe(e)))
}
