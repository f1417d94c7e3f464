//! The PostgreSQL store: the only module that knows the `aaa_` tables. It
//! owns the schema and its migrations (see [`schema`]), the connection
//! settings and TLS (see [`connect`]), the group commit that makes an append
//! durable before anyone is told about it (see [`committer`]), and the
//! listener that hears other servers' commits (see [`listener`]).
//!
//! Durability: every commit transaction runs with `synchronous_commit` at
//! least `on` (set in the transaction, so a pooled or pgbouncer connection
//! cannot weaken it), and a batch is acknowledged only after its COMMIT
//! answered. A COMMIT whose answer never came is reported as
//! [`StoreError::Unavailable`], never as success.
//!
//! Positions: each shard has a lock (transaction-scoped, advisory), taken
//! by every commit that touches the shard, of this server or any other on
//! the database; positions come from one sequence, taken while the locks
//! are held. So commits of disjoint shards never wait for each other, and
//! within a shard positions rise in commit order (with gaps where a
//! refused batch took some). A shard's head is its newest event's
//! position. Readers of the whole log follow each shard's positions
//! (see [`crate::domain::Cursor`]) and only ever see committed, hence
//! durable, rows.
//!
//! A shard's durable position moves when this server's committer commits
//! there, when another server's commit NOTIFYs the `aaa_head` channel with
//! the shards it moved, and when the listener's poll (every second) or a
//! read sees a higher position. LISTEN does not work through a
//! transaction-pooling pgbouncer: there other servers' commits are seen by
//! the poll alone, up to a second late.
//!
//! A database that is down makes calls fail in seconds with
//! [`StoreError::Unavailable`] (every wait is bounded), `watch_writable`
//! false until a commit succeeds again (the committer tries one every half
//! second on its own), and nothing acknowledged is lost: it was committed.

mod answered;
mod committer;
mod connect;
mod errors;
mod grant_uses;
mod listener;
mod members;
mod ownership;
mod rows;
mod schema;
mod tail;
mod writes;

use crate::causes::with_causes;
use errors::{corrupt, database_error, describe, pool_error};
use rows::{
    approval, dead_letter, event, get, group, in_shards, limit, run, run_id, timer, Conditions,
    APPROVAL_COLUMNS, EVENT_COLUMNS, RUN_SELECT,
};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    ApprovalQuery, ApprovalRecord, Claim, ClusterView, Cursor, DeadLetterRecord, EventRecord,
    GrantRecord, GrantUse, GroupRecord, Result, RunId, RunQuery, RunRecord, Shards, StoreError,
    Timer, ToolWaiting, Waiting, WriteBatch,
};

/// The channel commits NOTIFY with their shards' new heads.
pub const NOTIFY_CHANNEL: &str = "aaa_head";
/// Longest a read waits for the database.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a standby tries to claim the runs.
const STANDBY_POLL: Duration = Duration::from_millis(500);

/// The PostgreSQL store. Cheap to clone.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    commits: crate::store::queue::Queue,
    durable: Arc<Durable>,
    writable: watch::Receiver<bool>,
    token_key: [u8; 32],
    ownership: Arc<ownership::Ownership>,
    /// The newest events this store committed (see [`tail`]).
    tail: Arc<tail::Tail>,
    /// Set once the held shards' leases are being renewed.
    renewing: AtomicBool,
    /// This server's name once it joined, to leave at close.
    member: std::sync::Mutex<Option<String>>,
    /// Stops the listener.
    stop: CancellationToken,
    /// Stops a fenced server's standing by: cancelled first at close, so
    /// it claims nothing while the store hands its runs over.
    standing_by: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Each shard's durable position, moved only forward, by whoever learns of
/// a higher one.
struct Durable {
    heads: std::sync::Mutex<Cursor>,
    /// Grows with every move (see [`Store::watch_durable`]).
    watch: watch::Sender<u64>,
    /// The runs other servers' commits moved (see [`Store::heads_moved`]).
    heads_moved: tokio::sync::broadcast::Sender<crate::store::HeadsMoved>,
}

/// Notices of moved heads a slow reader may fall behind by before it is
/// told it lagged (and looks at every run it follows again).
const HEADS_MOVED_KEPT: usize = 1024;

impl Durable {
    fn new(heads: Cursor) -> Durable {
        Durable {
            heads: std::sync::Mutex::new(heads),
            watch: watch::channel(0).0,
            heads_moved: tokio::sync::broadcast::Sender::new(HEADS_MOVED_KEPT),
        }
    }

    /// Moves each shard to its position where that is further; answers
    /// whether one moved.
    fn advance(&self, heads: impl IntoIterator<Item = (u8, u64)>) -> bool {
        let moved = {
            let mut current = self.heads.lock().expect("poisoned");
            let mut moved = false;
            for (shard, head) in heads {
                if head > current.after(shard) {
                    current.advance(shard, head);
                    moved = true;
                }
            }
            moved
        };
        if moved {
            self.watch.send_modify(|moves| *moves += 1);
        }
        moved
    }

    fn cursor(&self) -> Cursor {
        self.heads.lock().expect("poisoned").clone()
    }

    fn head(&self, shard: u8) -> u64 {
        self.heads.lock().expect("poisoned").after(shard)
    }
}

/// One connection to the database a store URL names, with the store's TLS
/// and connect timeout, for tools beside the store (the bench's commit
/// floor and scratch schemas). Its driver runs on a task of its own.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let target = connect::target(url)?;
    let connecting = target.config.connect(target.tls.clone());
    let (client, connection) = tokio::time::timeout(connect::CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| StoreError::Unavailable(format!("cannot reach {}: timed out", target.shown)))?
        .map_err(database_error)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("a tool's database connection ended: {}", describe(&e));
        }
    });
    Ok(client)
}

/// `url` with `options=-csearch_path=SCHEMA` added: aaa keeps its tables in
/// that schema of the database, creating it if missing.
pub fn in_schema(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-csearch_path%3D{schema}")
}

impl PostgresStore {
    /// Connects to the database `url` names, brings its schema up to date,
    /// and starts the committer and the listener.
    pub async fn open(url: &str) -> Result<PostgresStore> {
        Self::open_with_metrics(url, &crate::metrics::Metrics::new()).await
    }

    /// Like [`PostgresStore::open`], counting commits and the pool's
    /// connections into `metrics`.
    pub async fn open_with_metrics(
        url: &str,
        metrics: &crate::metrics::Metrics,
    ) -> Result<PostgresStore> {
        let target = connect::target(url)?;
        let pool = connect::pool(&target)?;
        let unreachable = |e: PoolError| {
            StoreError::Unavailable(format!(
                "cannot reach {}: {}",
                target.shown,
                with_causes(&e)
            ))
        };
        let mut client = pool.get().await.map_err(unreachable)?;
        let token_key = schema::prepare(&mut client).await?;
        let durable = Arc::new(Durable::new(read_heads(&client).await?));
        let (writable_tx, writable) = watch::channel(true);
        let (commits, messages) = crate::store::queue::Queue::new();
        let ownership = Arc::new(ownership::Ownership::default());
        let tail = Arc::new(tail::Tail::new(ownership.holding.subscribe()));
        let committer = committer::Committer {
            pool: pool.clone(),
            durable: durable.clone(),
            writable: writable_tx,
            connection: Some(client),
            ownership: ownership.clone(),
            metrics: metrics.clone(),
            tail: tail.clone(),
            unsettled: Default::default(),
            last_taken: None,
        };
        tokio::spawn(committer::run(committer, messages));
        let stop = CancellationToken::new();
        tokio::spawn(listener::run(
            target.config.clone(),
            target.tls.clone(),
            durable.clone(),
            stop.clone(),
        ));
        tracing::info!(
            "store: PostgreSQL at {} (schema version {})",
            target.shown,
            schema::LATEST
        );
        let inner = Arc::new(Inner {
            pool,
            commits,
            durable,
            writable,
            token_key,
            ownership,
            tail,
            renewing: AtomicBool::new(false),
            member: std::sync::Mutex::new(None),
            standing_by: stop.child_token(),
            stop,
        });
        metrics.refresh_from(Arc::downgrade(&inner), |inner, metrics| {
            let families = metrics.families();
            let status = inner.pool.status();
            let idle = status.available;
            let in_use = status.size.saturating_sub(idle);
            for (state, n) in [("in_use", in_use), ("idle", idle)] {
                let label = crate::metrics::PoolLabel { state };
                families
                    .store_pool_connections
                    .get_or_create(&label)
                    .set(n as i64);
            }
            std::future::ready(())
        });
        Ok(PostgresStore { inner })
    }

    /// A pooled connection, bounded in time by the pool's timeouts.
    async fn client(&self) -> Result<Object> {
        self.inner.pool.get().await.map_err(pool_error)
    }

    /// Runs one read; a connection that timed out is dropped, not pooled.
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let client = self.client().await?;
        let read = async {
            let statement = client.prepare_cached(sql).await?;
            client.query(&statement, params).await
        };
        match tokio::time::timeout(QUERY_TIMEOUT, read).await {
            Ok(rows) => rows.map_err(database_error),
            Err(_) => {
                drop(Object::take(client));
                Err(StoreError::Unavailable(format!(
                    "postgres: no answer within {QUERY_TIMEOUT:?}"
                )))
            }
        }
    }

    async fn query_opt(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>> {
        Ok(self.query(sql, params).await?.into_iter().next())
    }

    /// The newest events this store committed, while no other server can
    /// have committed since (see [`tail`]).
    fn tail(&self) -> Option<&tail::Tail> {
        self.inner
            .ownership
            .holds_for_sure()
            .then_some(&*self.inner.tail)
    }

    /// Events read: whatever is committed is durable, so each shard's
    /// durable position is at least the highest read there.
    fn events(&self, rows: Vec<Row>) -> Result<Vec<EventRecord>> {
        let events = rows.iter().map(event).collect::<Result<Vec<_>>>()?;
        let read = events
            .iter()
            .filter_map(|e| RunId::from_slice(&e.run_id).map(|run| (run.shard(), e.position)));
        self.inner.durable.advance(read);
        Ok(events)
    }
}

/// Every shard's head as the database has it now.
async fn read_heads(client: &Object) -> Result<Cursor> {
    let rows = client.query(HEADS, &[]).await.map_err(database_error)?;
    heads_of(&rows).map_err(|e| StoreError::Corrupt(format!("the shards' heads: {e}")))
}

/// Every shard's head: its newest event's position (one backward index
/// probe each).
const HEADS: &str = "SELECT s::int2, coalesce((SELECT e.position FROM aaa_events e \
    WHERE e.shard = s ORDER BY e.position DESC LIMIT 1), 0) FROM generate_series(0, 255) AS s";

/// The cursor the rows of [`HEADS`] make.
fn heads_of(rows: &[Row]) -> std::result::Result<Cursor, String> {
    let mut heads = Cursor::start();
    for row in rows {
        let shard: i16 = row.try_get(0).map_err(|e| describe(&e))?;
        let position: i64 = row.try_get(1).map_err(|e| describe(&e))?;
        let shard = u8::try_from(shard).map_err(|_| format!("no shard {shard}"))?;
        heads.advance(shard, position as u64);
    }
    Ok(heads)
}

impl PostgresStore {
    /// Starts renewing the held shards' leases, once: every third of the
    /// lease until the store closes.
    fn keep_renewing(&self, claim: Claim) {
        if self.inner.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let lease_ms = i64::try_from(claim.lease.as_millis()).unwrap_or(i64::MAX);
        tokio::spawn(ownership::renew_every(
            self.inner.pool.clone(),
            self.inner.ownership.clone(),
            lease_ms,
            claim.lease / 3,
            self.inner.stop.clone(),
        ));
    }
}

#[async_trait::async_trait]
impl super::Store for PostgresStore {
    async fn commit(&self, batch: WriteBatch) -> Result<Vec<u64>> {
        self.inner.commits.commit(batch).await
    }

    async fn close(&self) {
        self.inner.standing_by.cancel();
        self.inner.commits.close().await;
        // Nothing more will be written: hand the runs over at once.
        if let Ok(client) = self.client().await {
            if let Err(e) = self.inner.ownership.release(&client, None).await {
                tracing::warn!(
                    "could not hand the runs over (they pass on when the lease lapses): {e}"
                );
            }
        }
        let member = self.inner.member.lock().expect("poisoned").take();
        if let Some(server) = member {
            if let Err(e) = members::leave(&self.inner.pool, &server).await {
                tracing::debug!("could not delete this server's membership: {e}");
            }
        }
        self.inner.stop.cancel();
    }

    async fn join(
        &self,
        server: &str,
        address: &str,
        lease: Duration,
        spreads: bool,
    ) -> Result<()> {
        // The first row is written before answering, so a server that
        // joined is visible (and a database that refuses it is an error).
        let row = members::Row {
            server: server.to_string(),
            address: address.to_string(),
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
            spreads,
        };
        members::renew(&self.inner.pool, &row).await?;
        tokio::spawn(members::keep(
            self.inner.pool.clone(),
            row,
            lease,
            self.inner.stop.clone(),
        ));
        *self.inner.member.lock().expect("poisoned") = Some(server.to_string());
        Ok(())
    }

    async fn cluster(&self) -> Result<ClusterView> {
        members::view(&self.inner.pool).await
    }

    async fn claim_runs(&self, server: &str, claim: Claim) -> Result<watch::Receiver<Shards>> {
        let lease_ms = i64::try_from(claim.lease.as_millis()).unwrap_or(i64::MAX);
        let wanted = || match claim.standby {
            true => ownership::Wanted::AllIfLapsed,
            false => ownership::Wanted::All,
        };
        let ownership = &self.inner.ownership;
        let mut waiting = false;
        loop {
            let claimed = match self.client().await {
                Ok(mut client) => {
                    ownership
                        .claim(&mut client, server, lease_ms, wanted())
                        .await
                }
                Err(e) => Err(e),
            };
            match claimed {
                Ok(claimed) if !claimed.is_empty() => break,
                Ok(_) if !waiting => {
                    waiting = true;
                    tracing::info!(
                        "standing by: another server holds the runs; taking them over once its \
                         claim has not been renewed for {:?}",
                        claim.lease
                    );
                }
                Ok(_) => {}
                // A standby waits out the database's trouble too.
                Err(StoreError::Unavailable(cause)) if claim.standby => {
                    tracing::warn!("standing by: {cause}")
                }
                Err(e) => return Err(e),
            }
            // A standby looks often: a graceful stop hands the runs over
            // at once, whatever the lease.
            tokio::select! {
                () = tokio::time::sleep((claim.lease / 3).min(STANDBY_POLL)) => {}
                () = self.inner.stop.cancelled() => return Err(StoreError::Closed),
            }
        }
        self.keep_renewing(claim);
        // One server owns every shard: fenced out of them, it stands by.
        tokio::spawn(ownership::stand_by_when_fenced(
            self.inner.pool.clone(),
            ownership.clone(),
            server.to_string(),
            lease_ms,
            (claim.lease / 3).min(STANDBY_POLL),
            self.inner.standing_by.clone(),
        ));
        Ok(self.held_shards())
    }

    async fn claim_shards(&self, server: &str, claim: Claim, wanted: Shards) -> Result<Shards> {
        let lease_ms = i64::try_from(claim.lease.as_millis()).unwrap_or(i64::MAX);
        let shards: Vec<i16> = wanted.iter().map(i16::from).collect();
        let mut client = self.client().await?;
        let claimed = self
            .inner
            .ownership
            .claim(
                &mut client,
                server,
                lease_ms,
                ownership::Wanted::Lapsed(shards),
            )
            .await?;
        self.keep_renewing(claim);
        Ok(claimed)
    }

    async fn release_shards(&self, shards: Shards) -> Result<()> {
        let client = self.client().await?;
        self.inner.ownership.release(&client, Some(shards)).await
    }

    fn held_shards(&self) -> watch::Receiver<Shards> {
        self.inner.ownership.holding.subscribe()
    }

    fn token_key(&self) -> [u8; 32] {
        self.inner.token_key
    }

    fn watch_writable(&self) -> watch::Receiver<bool> {
        self.inner.writable.clone()
    }

    fn durable(&self) -> Cursor {
        self.inner.durable.cursor()
    }

    fn watch_durable(&self) -> watch::Receiver<u64> {
        self.inner.durable.watch.subscribe()
    }

    fn heads_moved(&self) -> tokio::sync::broadcast::Receiver<crate::store::HeadsMoved> {
        self.inner.durable.heads_moved.subscribe()
    }

    async fn run_events(
        &self,
        run: RunId,
        after_seq: u64,
        limit_: usize,
    ) -> Result<Vec<EventRecord>> {
        let durable = self.inner.durable.head(run.shard());
        let tail = self.tail();
        if let Some(events) = tail.and_then(|t| t.run_events(run, after_seq, limit_, durable)) {
            return Ok(events);
        }
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM aaa_events WHERE run_id = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3"
        );
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let rows = self
            .query(&sql, &[&run.as_uuid(), &after, &limit(limit_)])
            .await?;
        self.events(rows)
    }

    async fn event(&self, run: RunId, seq: u64) -> Result<Option<EventRecord>> {
        if let Some(event) = self.tail().and_then(|t| t.event(run, seq)) {
            return Ok(Some(event));
        }
        let sql = format!("SELECT {EVENT_COLUMNS} FROM aaa_events WHERE run_id = $1 AND seq = $2");
        let Ok(seq) = i64::try_from(seq) else {
            return Ok(None);
        };
        let rows = self.query(&sql, &[&run.as_uuid(), &seq]).await?;
        Ok(self.events(rows)?.into_iter().next())
    }

    async fn log_after(&self, after: &Cursor, limit_: usize) -> Result<Vec<EventRecord>> {
        let durable = self.durable();
        if let Some(events) = self
            .tail()
            .and_then(|t| t.log_after(after, limit_, &durable))
        {
            return Ok(events);
        }
        // Only the shards known to have moved past the cursor: the durable
        // positions follow every commit (this server's, the notifications
        // of others', the listener's poll), as the readers' wake-ups do.
        let (shards, afters): (Vec<i16>, Vec<i64>) = durable
            .shards()
            .filter(|(shard, head)| *head > after.after(*shard))
            .map(|(shard, _)| {
                let at = i64::try_from(after.after(shard)).unwrap_or(i64::MAX);
                (i16::from(shard), at)
            })
            .unzip();
        if shards.is_empty() {
            return Ok(Vec::new());
        }
        // Each shard's first events past its position (an index probe
        // each), the lowest positions of them all.
        let sql = format!(
            "SELECT e.* FROM UNNEST($1::int2[], $2::int8[]) AS c(shard, after) \
             CROSS JOIN LATERAL (SELECT {EVENT_COLUMNS} FROM aaa_events \
             WHERE shard = c.shard AND position > c.after ORDER BY position LIMIT $3) e \
             ORDER BY e.position LIMIT $3"
        );
        let rows = self
            .query(&sql, &[&shards, &afters, &limit(limit_)])
            .await?;
        self.events(rows)
    }

    async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        let sql = format!("{RUN_SELECT} WHERE r.run_id = $1");
        self.query_opt(&sql, &[&id.as_uuid()])
            .await?
            .as_ref()
            .map(run)
            .transpose()
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>> {
        let mut filter = Conditions::default();
        if let Some(before) = query.before {
            filter.add("r.run_id < $?", before.as_uuid());
        }
        if query.status != 0 {
            filter.add("r.status = $?", query.status);
        }
        if !query.labels.is_empty() {
            filter.add("r.labels @> $?::jsonb", writes::labels_json(&query.labels));
        }
        if let Some(started_by) = &query.started_by {
            // The summary's starter, or (when it has none) the client that
            // appended the run's first event, as the embedded store reads it.
            filter.add2(
                "$? = CASE WHEN r.started_by <> '' THEN r.started_by \
                 ELSE coalesce((SELECT CASE WHEN e.actor_kind = $? THEN e.actor_name ELSE '' END \
                 FROM aaa_events e WHERE e.run_id = r.run_id ORDER BY e.seq LIMIT 1), '') END",
                started_by.clone(),
                crate::store::CLIENT_ACTOR,
            );
        }
        let sql = format!(
            "{RUN_SELECT}{} ORDER BY r.run_id DESC LIMIT {}",
            filter.where_clause(),
            filter.bind(limit(query.limit))
        );
        let rows = self.query(&sql, &filter.params()).await?;
        rows.iter().map(run).collect()
    }

    async fn run_approvals(&self, id: RunId) -> Result<Vec<ApprovalRecord>> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM aaa_approvals WHERE run_id = $1 ORDER BY call_id"
        );
        let rows = self.query(&sql, &[&id.as_uuid()]).await?;
        rows.iter().map(approval).collect()
    }

    async fn approvals(&self, query: &ApprovalQuery) -> Result<Vec<ApprovalRecord>> {
        let mut filter = Conditions::default();
        if let Some((run, call)) = &query.after {
            filter.add2(
                match query.newest_first {
                    true => "(run_id, call_id) < ($?::uuid, $?::text COLLATE \"C\")",
                    false => "(run_id, call_id) > ($?::uuid, $?::text COLLATE \"C\")",
                },
                run.as_uuid(),
                call.clone(),
            );
        }
        if let Some(run) = query.run {
            filter.add("run_id = $?", run.as_uuid());
        }
        if !query.tool.is_empty() {
            filter.add("tool = $?", query.tool.clone());
        }
        if !query.labels.is_empty() {
            filter.add("labels @> $?::jsonb", writes::labels_json(&query.labels));
        }
        if let Some(cursor) = &query.at_or_below {
            // The cursor's position in the run's shard (arrays count from 1).
            let heads: Vec<i64> = cursor
                .shards()
                .map(|(_, p)| i64::try_from(p).unwrap_or(i64::MAX))
                .collect();
            filter.add(
                "position <= ($?::int8[])[get_byte(uuid_send(run_id), 15) + 1]",
                heads,
            );
        }
        if let Some(groups) = &query.decidable_by {
            filter.add(
                "(approvers = '[]'::jsonb OR approvers ?| $?::text[])",
                groups.clone(),
            );
        }
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM aaa_approvals{} ORDER BY {} LIMIT {}",
            filter.where_clause(),
            match query.newest_first {
                true => "run_id DESC, call_id DESC",
                false => "run_id, call_id",
            },
            filter.bind(limit(query.limit))
        );
        let rows = self.query(&sql, &filter.params()).await?;
        rows.iter().map(approval).collect()
    }

    async fn active_runs(&self, shards: &Shards) -> Result<Vec<RunId>> {
        let (filter, shards) = in_shards(shards, 1);
        let sql = format!("SELECT run_id FROM aaa_active WHERE {filter} ORDER BY run_id");
        let rows = self.query(&sql, &[&shards]).await?;
        rows.iter().map(|row| run_id(row, 0)).collect()
    }

    async fn waiting(&self, shards: &Shards) -> Result<Waiting> {
        let (filter, shards) = in_shards(shards, 1);
        let tools = self
            .query(
                &format!(
                    "SELECT tool, count(*), min(requested_ms) FROM aaa_approvals \
                     WHERE {filter} GROUP BY tool ORDER BY tool"
                ),
                &[&shards],
            )
            .await?;
        let statuses = self
            .query(
                &format!(
                    "SELECT status, count(*) FROM aaa_runs WHERE status IN (1, 2) AND {filter} \
                     GROUP BY status"
                ),
                &[&shards],
            )
            .await?;
        let mut waiting = Waiting {
            approvals_by_tool: tools
                .iter()
                .map(|row| ToolWaiting {
                    tool: row.get(0),
                    pending: row.get::<_, i64>(1) as u64,
                    oldest_requested_ms: row.get(2),
                })
                .collect(),
            ..Waiting::default()
        };
        for row in &statuses {
            let n = row.get::<_, i64>(1) as u64;
            match row.get::<_, i32>(0) {
                1 => waiting.running = n,
                _ => waiting.waiting = n,
            }
        }
        Ok(waiting)
    }

    async fn next_timer(&self, shards: &Shards) -> Result<Option<Timer>> {
        let (filter, shards) = in_shards(shards, 1);
        let sql = format!(
            "SELECT due_ms, run_id, name FROM aaa_timers WHERE {filter} \
             ORDER BY due_ms, run_id, name LIMIT 1"
        );
        let row = self.query_opt(&sql, &[&shards]).await?;
        row.as_ref().map(timer).transpose()
    }

    async fn tool(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .query_opt("SELECT definition FROM aaa_tools WHERE name = $1", &[&name])
            .await?;
        row.map(|row| get(&row, 0)).transpose()
    }

    async fn request(&self, scope: &[u8], request_id: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .query_opt(
                "SELECT answer FROM aaa_requests WHERE scope = $1 AND request_id = $2",
                &[&scope, &request_id],
            )
            .await?;
        row.map(|row| get(&row, 0)).transpose()
    }

    async fn group(&self, name: &str) -> Result<Option<GroupRecord>> {
        let row = self
            .query_opt(
                "SELECT name, event_types, labels, ack_timeout_ms, max_deliveries, cursor, \
                 created_ms, shard_cursor FROM aaa_groups WHERE name = $1",
                &[&name],
            )
            .await?;
        row.as_ref().map(group).transpose()
    }

    async fn dead_letters(
        &self,
        group_name: &str,
        after: u64,
        limit_: usize,
    ) -> Result<Vec<DeadLetterRecord>> {
        let Ok(after) = i64::try_from(after) else {
            return Ok(Vec::new());
        };
        let rows = self
            .query(
                "SELECT position, run_id, seq, deliveries, last_error, dead_ms, replaying \
                 FROM aaa_dead_letters WHERE group_name = $1 AND position > $2 \
                 ORDER BY position LIMIT $3",
                &[&group_name, &after, &limit(limit_)],
            )
            .await?;
        rows.iter().map(dead_letter).collect()
    }

    async fn list_timers(&self) -> Result<Vec<Timer>> {
        let rows = self
            .query(
                "SELECT due_ms, run_id, name FROM aaa_timers ORDER BY due_ms, run_id, name",
                &[],
            )
            .await?;
        rows.iter().map(timer).collect()
    }

    async fn list_tools(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let rows = self
            .query("SELECT name, definition FROM aaa_tools ORDER BY name", &[])
            .await?;
        rows.iter()
            .map(|row| Ok((get(row, 0)?, get(row, 1)?)))
            .collect()
    }

    async fn list_requests(
        &self,
        after: Option<(Vec<u8>, String)>,
        limit_: usize,
    ) -> Result<Vec<(Vec<u8>, String, Vec<u8>)>> {
        let rows = match after {
            Some((scope, request_id)) => {
                self.query(
                    "SELECT scope, request_id, answer FROM aaa_requests \
                     WHERE (scope, request_id) > ($1, $2) \
                     ORDER BY scope, request_id LIMIT $3",
                    &[&scope, &request_id, &limit(limit_)],
                )
                .await?
            }
            None => {
                self.query(
                    "SELECT scope, request_id, answer FROM aaa_requests \
                     ORDER BY scope, request_id LIMIT $1",
                    &[&limit(limit_)],
                )
                .await?
            }
        };
        rows.iter()
            .map(|row| Ok((get(row, 0)?, get(row, 1)?, get(row, 2)?)))
            .collect()
    }

    async fn list_groups(&self) -> Result<Vec<GroupRecord>> {
        let rows = self
            .query(
                "SELECT name, event_types, labels, ack_timeout_ms, max_deliveries, cursor, \
                 created_ms, shard_cursor FROM aaa_groups ORDER BY name",
                &[],
            )
            .await?;
        rows.iter().map(group).collect()
    }

    async fn grants(&self) -> Result<Vec<(GrantRecord, u64)>> {
        let rows = self
            .query(
                "SELECT g.record, (SELECT count(*) FROM aaa_grant_uses u WHERE u.grant_id = g.id) \
                 FROM aaa_grants g ORDER BY g.id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let bytes: Vec<u8> = get(row, 0)?;
                let grant = <GrantRecord as prost::Message>::decode(bytes.as_slice())
                    .map_err(|e| corrupt(format!("grant: {e}")))?;
                let uses: i64 = get(row, 1)?;
                Ok((grant, uses.max(0) as u64))
            })
            .collect()
    }

    async fn expired_runs(
        &self,
        now_ms: i64,
        default_ms: Option<i64>,
        limit_: usize,
        shards: &Shards,
    ) -> Result<Vec<RunId>> {
        let (filter, shards) = in_shards(shards, 3);
        let mut out = Vec::new();
        if let Some(default_ms) = default_ms {
            let rows = self
                .query(
                    &format!(
                        "SELECT run_id FROM aaa_runs WHERE finished_ms <= $1 AND {filter} \
                         ORDER BY finished_ms LIMIT $2"
                    ),
                    &[&now_ms.saturating_sub(default_ms), &limit(limit_), &shards],
                )
                .await?;
            for row in &rows {
                out.push(run_id(row, 0)?);
            }
        }
        let left = limit_.saturating_sub(out.len());
        if left > 0 {
            let rows = self
                .query(
                    &format!(
                        "SELECT run_id FROM aaa_runs WHERE expires_ms <= $1 AND {filter} \
                         ORDER BY expires_ms LIMIT $2"
                    ),
                    &[&now_ms, &limit(left), &shards],
                )
                .await?;
            for row in &rows {
                out.push(run_id(row, 0)?);
            }
        }
        Ok(out)
    }

    async fn expired_at(&self, run: RunId) -> Result<Option<i64>> {
        let row = self
            .query_opt(
                "SELECT expired_ms FROM aaa_expired WHERE run_id = $1",
                &[&run.as_uuid()],
            )
            .await?;
        row.map(|row| get(&row, 0)).transpose()
    }

    async fn drop_tombstones(&self, now_ms: i64, limit_: usize) -> Result<usize> {
        let rows = self
            .query(
                "DELETE FROM aaa_expired WHERE run_id IN (SELECT run_id FROM aaa_expired \
                 WHERE until_ms <= $1 ORDER BY until_ms LIMIT $2) RETURNING run_id",
                &[&now_ms, &limit(limit_)],
            )
            .await?;
        Ok(rows.len())
    }

    async fn list_grant_uses(&self) -> Result<Vec<GrantUse>> {
        let rows = self
            .query(
                "SELECT grant_id, run_id, call_id FROM aaa_grant_uses \
                 ORDER BY grant_id, run_id, call_id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let run: Uuid = get(row, 1)?;
                Ok(GrantUse {
                    grant: get(row, 0)?,
                    run: RunId::from_slice(run.as_bytes())
                        .ok_or_else(|| corrupt("grant use with a bad run id"))?,
                    call_id: get(row, 2)?,
                })
            })
            .collect()
    }
}
