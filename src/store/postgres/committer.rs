//! Group commit: one task takes every batch that is waiting and commits
//! them in ONE transaction per round, then answers them all and moves the
//! durable positions of the shards it wrote.
//!
//! A round is two round trips to the database, whatever its size, because
//! its statements are pipelined (sent together, answered in order):
//! 1. `BEGIN` (seq scans off, see [`BEGIN`]), `synchronous_commit` made at
//!    least `on` for the transaction,
//!    the shards the round touches locked (a transaction-scoped advisory
//!    lock each, in shard order: it serialises the writers of those shards,
//!    of every server on the database, and nobody else, and writes no row),
//!    positions for its events taken from the `aaa_positions` sequence
//!    while the locks are held, their heads (the last position committed
//!    in each, one backward index probe each, skipped when nobody else
//!    took a position since this committer's last round: see
//!    [`SHARD_HEADS`]), the
//!    last seq of each run the round appends to, (once the store claimed
//!    runs) the epochs of those shards, the grants its batches use (locked)
//!    and a lock on each request id it records, with a limit on how long
//!    the transaction may sit idle (see [`super::ownership`]).
//! 2. After checking each batch's shards (see [`super::ownership`]), the
//!    grants it uses (see [`super::grant_uses`]), the answers it records
//!    (see [`super::answered`]) and its
//!    expected seqs, and giving its events the
//!    positions taken, in memory: one multi-row statement per table for all
//!    batches, `COMMIT`, then `pg_notify` with the shards' new heads (see
//!    below).
//!
//! Positions come from a sequence, so rounds of disjoint shards never wait
//! for each other; within a shard they increase in commit order, because
//! a round takes them only once it holds the shard's lock, which it keeps
//! until it committed. Positions a round took but did not use (a batch
//! refused) are gaps, never reused. (A head row per shard, locked and
//! moved by each round, did the same, but wrote and locked a row per shard
//! per round: one committer made 40% of the rounds it makes with one head
//! row, measured with `aaa bench --only committers`.)
//!
//! The notification goes after the COMMIT, in a transaction of its own:
//! PostgreSQL serialises the commits of every transaction that notifies,
//! holding one lock of the whole database from before their commit record
//! until they end (so that notifications queue in commit order). Inside
//! the round's transaction that lock was held through its WAL flush, and
//! rounds of disjoint shards waited for each other there (28-30% of the
//! sessions at 4 committers, `aaa bench --only committers`); a transaction
//! that only notifies writes no WAL and holds it for a moment. The price:
//! a round whose COMMIT is answered but whose notification is not, or
//! whose outcome is unknown (the database did not answer, the round timed
//! out), may have landed with nobody told. So its shards are *unsettled*:
//! the tail forgets everything at once (reads go to the database), and the
//! next round, a probe if no write comes, takes their locks too (which
//! waits for the unknown transaction to end, committed or not), reads
//! their heads and notifies them with "runs unknown", so other servers and
//! this one's engine read them again. The listener's poll of the heads
//! (every second) bounds the rest. A round whose data the database
//! refused (rolled back, then done one by one) has notified heads it did
//! not commit: positions are never reused and rise within a shard, so a
//! durable position in such a gap hides nothing.
//!
//! When a statement of step 2 fails for a batch's data (a constraint, a
//! value PostgreSQL refuses), the whole transaction has rolled back; the
//! round is done again batch by batch, each under its own SAVEPOINT, so the
//! bad batch fails alone, its positions are given to the next batch, and
//! the others commit in one transaction.
//!
//! A round that fails for the database (unreachable, restarting, read-only,
//! a COMMIT whose outcome is unknown) is refused whole with
//! [`StoreError::Unavailable`]: nothing of it is acknowledged, and the
//! engine reloads what it knows from the database. The store is then not
//! writable until a round succeeds; an empty round is tried every
//! [`PROBE_EVERY`] so that health recovers with no client writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio::sync::{mpsc, watch};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use super::answered::{self, Answered};
use super::errors::{describe, is_down};
use super::grant_uses::{self, GrantUses};
use super::ownership::{self, Ownership};
use super::tail::Tail;
use super::writes::{self, Writes};
use super::{Durable, NOTIFY_CHANNEL};
use crate::causes::with_causes;
use crate::store::queue::{self, Message, Request};
use crate::store::{Op, Result, RunId, StoreError, WriteBatch};

/// Most batches folded into one round.
const MAX_ROUND: usize = 1024;
/// Longest a round may take; past it its outcome is unknown.
const ROUND_TIMEOUT: Duration = Duration::from_secs(10);
/// While writes fail, how often an empty round tries the database.
pub(super) const PROBE_EVERY: Duration = Duration::from_millis(500);

pub(super) struct Committer {
    pub pool: Pool,
    pub durable: Arc<Durable>,
    /// False while rounds fail.
    pub writable: watch::Sender<bool>,
    /// The connection of the last round that went well, kept for the next.
    pub connection: Option<Object>,
    pub ownership: Arc<Ownership>,
    pub metrics: crate::metrics::Metrics,
    /// The newest events committed, for readers (see [`super::tail`]).
    pub tail: Arc<Tail>,
    /// Shards a round may have committed to without telling anyone (its
    /// outcome unknown, or its notification failed): the next round locks
    /// them, reads their heads and notifies them.
    pub unsettled: BTreeSet<u8>,
    /// The last position this committer's rounds took, while every round
    /// since it went well: see [`SHARD_HEADS`].
    pub last_taken: Option<u64>,
}

/// What a round's first round trip read: the heads of the shards it
/// touches (or knew them), the positions it took, the last seq of each
/// run it appends to, and the epochs of those shards.
struct Begun {
    shard_heads: BTreeMap<u8, u64>,
    positions: Vec<u64>,
    heads: HashMap<RunId, u64>,
    epochs: HashMap<i16, i64>,
    grants: GrantUses,
    answered: Answered,
}

/// Why a whole round failed: nothing of it may be taken as written.
struct Down(String);

type Rows = std::result::Result<Vec<Row>, tokio_postgres::Error>;
type Call<'a> = Pin<Box<dyn Future<Output = Rows> + Send + 'a>>;

/// One statement of a pipeline.
enum Step<'a> {
    /// Simple-protocol SQL (transaction control).
    Simple(&'static str),
    /// A statement prepared once per connection, with its parameters.
    Query(&'static str, Vec<&'a (dyn ToSql + Sync)>),
}

/// Seq scans are off in a round: `aaa_approvals` and `aaa_active` are
/// queues (rows written, then deleted a moment later), so their pages are
/// mostly dead rows between two vacuums, while the plan a connection keeps
/// for a statement was made when they looked empty. The deletes then read
/// every page (a hash join over a seq scan: 0.7 ms a round at 64 cycles in
/// flight, the round's costliest statement) where the primary key finds
/// the rows at once.
const BEGIN: &str = "BEGIN; SET LOCAL enable_seqscan = off; \
    SELECT set_config('synchronous_commit', 'on', true) \
    WHERE current_setting('synchronous_commit') IN ('off', 'local', 'remote_write')";
/// The shards' locks: advisory, transaction-scoped, keyed (class, shard)
/// so that they meet no other advisory lock (a one-key lock lives apart).
/// Taken in shard order, so that two rounds never wait for each other in
/// a circle (claims take them in the same order, see [`super::ownership`]).
pub(super) const LOCK_SHARDS: &str = "SELECT pg_advisory_xact_lock(1633771891, s) \
    FROM (SELECT DISTINCT unnest($1::int2[])::int4 AS s ORDER BY 1) AS shards";
/// Each locked shard's head: the last position committed in it, one
/// backward index probe each (a fifth of a round's database time when it
/// appends to many shards). A holder's tail knows the heads of the shards
/// it committed to, and they are still the heads unless somebody else
/// committed there since: a writer without a claim, or another server
/// after a takeover, which the moved head tells the tail about (see
/// `Tail::committed`). Every event's position comes from the one
/// sequence, so when the positions this round took ($3 of them, after
/// [`TAKE_POSITIONS`] in the same transaction) end at the last one the
/// committer took before ($2) plus $3, nobody took a position in between,
/// nobody else committed an event anywhere, and the probes are skipped
/// (no rows). $2 is -1 to read them whatever happened.
const SHARD_HEADS: &str = "SELECT s.shard, coalesce((SELECT e.position FROM aaa_events e \
    WHERE e.shard = s.shard ORDER BY e.position DESC LIMIT 1), 0) \
    FROM unnest($1::int2[]) AS s(shard) \
    WHERE CASE WHEN $2::int8 < 0 THEN true \
    ELSE currval('aaa_positions') <> $2::int8 + $3::int8 END";
/// The round's positions, taken once its shards' heads are locked.
const TAKE_POSITIONS: &str = "SELECT nextval('aaa_positions') FROM generate_series(1, $1)";
/// Rounds of two servers may record the same request (a retry sent to
/// another server, its runs in another shard): each waits for the other's
/// end before it asks whether the answer is recorded. Locks are taken
/// after the heads, in key order, like every other lock of a round.
const LOCK_REQUESTS: &str = "SELECT pg_advisory_xact_lock(k) \
    FROM (SELECT unnest($1::int8[]) AS k ORDER BY 1) AS keys";
/// One backward index probe per run (not an aggregate over its history):
/// this runs while the shards are locked.
const RUN_HEADS: &str = "SELECT r.run_id, e.seq FROM UNNEST($1::uuid[]) AS r(run_id) \
    CROSS JOIN LATERAL (SELECT seq FROM aaa_events WHERE run_id = r.run_id \
    ORDER BY seq DESC LIMIT 1) e";
/// The payload names the schema: servers of other deployments, in other
/// schemas of the same database, hear it too and must ignore it.
const NOTIFY: &str = "SELECT pg_notify($1, current_schema() || ':' || $2)";
const SAVEPOINT: &str = "SAVEPOINT aaa_batch";
const RELEASE: &str = "RELEASE SAVEPOINT aaa_batch";
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT aaa_batch";

/// The committer's loop.
pub(super) async fn run(mut committer: Committer, mut messages: mpsc::Receiver<Message>) {
    let mut round = Vec::new();
    let mut closed = None;
    while closed.is_none() {
        let message = if *committer.writable.borrow() {
            tokio::select! {
                message = messages.recv() => message,
                () = committer.ownership.lost_notify.notified() => {
                    committer.writable.send_replace(false);
                    continue;
                }
            }
        } else {
            tokio::select! {
                message = messages.recv() => message,
                () = tokio::time::sleep(PROBE_EVERY) => {
                    committer.commit_round(&mut Vec::new()).await;
                    continue;
                }
            }
        };
        let Some(message) = message else { break };
        // Nobody asks a database for compaction steps: one asked is done.
        let mut compactions = Vec::new();
        closed = queue::gather(
            message,
            &mut messages,
            &mut round,
            &mut compactions,
            MAX_ROUND,
        );
        for reply in compactions {
            let _ = reply.send(Ok(crate::store::Compacted::default()));
        }
        if !round.is_empty() {
            committer.commit_round(&mut round).await;
        }
    }
    // Refuse what comes after: its senders get StoreError::Closed.
    messages.close();
    drop(committer);
    if let Some(done) = closed {
        let _ = done.send(());
    }
}

impl Committer {
    /// Counts a round the database committed.
    fn observe(&self, round: &[Request], started: std::time::Instant) {
        let families = self.metrics.families();
        let events: usize = round.iter().map(|r| r.batch.events().len()).sum();
        families
            .store_commit_seconds
            .observe(started.elapsed().as_secs_f64());
        families.store_commit_batch_size.observe(events as f64);
        families.store_fsyncs.inc();
    }

    /// Commits and answers every request of the round (none: a probe).
    async fn commit_round(&mut self, round: &mut Vec<Request>) {
        let mut answers: Vec<Option<Result<Vec<u64>>>> = round
            .iter()
            .map(|r| writes::check(&r.batch).err().map(Err))
            .collect();
        let settling: Vec<i16> = self.unsettled.iter().copied().map(i16::from).collect();
        let outcome = match self.connection().await {
            Err(down) => Err(down),
            Ok(client) => {
                let started = std::time::Instant::now();
                let given = Given {
                    ownership: &self.ownership,
                    settling: &settling,
                    tail: &self.tail,
                    last_taken: self.last_taken,
                };
                let attempt = commit(&client, given, round, &mut answers);
                let outcome = tokio::time::timeout(ROUND_TIMEOUT, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Down(format!(
                            "the database did not finish a commit within {ROUND_TIMEOUT:?}; \
                             its outcome is unknown"
                        )))
                    });
                match outcome {
                    Ok(_) => {
                        self.connection = Some(client);
                        self.observe(round, started);
                    }
                    // Its state (a transaction open, a lock held?) is unknown:
                    // it must never serve again.
                    Err(_) => drop(Object::take(client)),
                }
                outcome
            }
        };
        match outcome {
            Ok(heads) => {
                self.last_taken = heads.last_taken.or(self.last_taken);
                // Before the durable positions move, so that a reader told
                // of them finds the tail that far.
                self.keep_in_tail(round, &answers, &heads.before);
                match heads.notified {
                    true => self.unsettled.clear(),
                    false => self
                        .unsettled
                        .extend(heads.after.iter().map(|&(shard, _)| shard)),
                }
                self.durable.advance(heads.after);
                // Fenced out, the store stays unwritable: health says so
                // and writes are refused until the server restarts.
                let writable = !self.ownership.is_lost();
                if self.writable.send_replace(writable) != writable && writable {
                    tracing::info!("the database takes writes again");
                }
                for (request, answer) in round.drain(..).zip(answers) {
                    let answer = answer.unwrap_or_else(|| {
                        Err(StoreError::Unavailable(
                            "the batch was not committed".into(),
                        ))
                    });
                    let _ = request.reply.send(answer);
                }
            }
            Err(Down(cause)) => {
                // It may have landed: nobody was told, and the tail does
                // not have it.
                self.unsettled
                    .extend(round.iter().flat_map(|request| request.batch.shards()));
                self.tail.clear();
                self.last_taken = None;
                if self.writable.send_replace(false) {
                    tracing::error!("{cause}; writes are refused until one succeeds");
                }
                for request in round.drain(..) {
                    let _ = request
                        .reply
                        .send(Err(StoreError::Unavailable(cause.clone())));
                }
            }
        }
    }

    /// Moves the committed batches' events to the tail, in position
    /// order (the batches are only answered after); a round that deleted
    /// runs (retention) empties it instead.
    fn keep_in_tail(
        &self,
        round: &mut [Request],
        answers: &[Option<Result<Vec<u64>>>],
        before: &BTreeMap<u8, u64>,
    ) {
        let mut committed: Vec<&mut WriteBatch> = round
            .iter_mut()
            .zip(answers)
            .filter(|(_, answer)| matches!(answer, Some(Ok(_))))
            .map(|(request, _)| &mut request.batch)
            .collect();
        let deletes_runs = committed
            .iter()
            .flat_map(|batch| batch.ops())
            .any(|op| matches!(op, Op::ExpireRun { .. }));
        match deletes_runs {
            true => self.tail.clear(),
            false => self.tail.committed(
                committed.iter_mut().flat_map(|batch| batch.take_events()),
                before,
            ),
        }
    }

    /// The kept connection if it is still open, or one from the pool.
    async fn connection(&mut self) -> std::result::Result<Object, Down> {
        if let Some(client) = self.connection.take() {
            if !client.is_closed() {
                return Ok(client);
            }
        }
        self.pool
            .get()
            .await
            .map_err(|e| Down(format!("cannot reach the database: {}", with_causes(&e))))
    }
}

/// The heads of the shards a round touched, before it and after it.
pub(super) struct Heads {
    pub before: BTreeMap<u8, u64>,
    /// The last position the round took, if it took any.
    pub last_taken: Option<u64>,
    /// The shards whose heads moved, and those it settled.
    pub after: Vec<(u8, u64)>,
    /// Whether the notification of `after` went out (or none was due).
    pub notified: bool,
}

/// Commits the round on `client`: all at once, or batch by batch when one
/// of them is refused. Fills in the answers; returns the heads it moved.
async fn commit(
    client: &ClientWrapper,
    given: Given<'_>,
    round: &mut [Request],
    answers: &mut [Option<Result<Vec<u64>>>],
) -> std::result::Result<Heads, Down> {
    let together = attempt(client, given, round, answers, Mode::Together);
    if let Some(heads) = together.await? {
        return Ok(heads);
    }
    // A batch's data was refused and the COMMIT rolled everything back.
    for (answer, request) in answers.iter_mut().zip(round.iter()) {
        *answer = writes::check(&request.batch).err().map(Err);
    }
    // One by one, a refused batch fails alone: the round commits or is down.
    attempt(client, given, round, answers, Mode::OneByOne)
        .await?
        .ok_or_else(|| Down("a round one by one was refused whole".into()))
}

/// What a round is given beside its batches: the store's claims, the
/// shards it settles, and what the committer knows of the heads without
/// reading them (the tail's heads of the shards it committed to, and the
/// last position its rounds took: see [`SHARD_HEADS`]).
#[derive(Clone, Copy)]
struct Given<'a> {
    ownership: &'a Ownership,
    settling: &'a [i16],
    tail: &'a Tail,
    last_taken: Option<u64>,
}

/// How [`attempt`] writes the batches that pass its checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// All in the pipeline that ends in COMMIT: a batch the database
    /// refuses rolls the whole round back.
    Together,
    /// Each under its own savepoint as it comes, so a batch the database
    /// refuses fails alone and its positions go to the next one.
    OneByOne,
}

/// One transaction over the round: checks each unanswered batch (its
/// shards, the grants it uses, the answers it records, its expected seqs),
/// gives its events the positions taken and writes it as `mode` says, then
/// commits, and notifies the heads that moved and those of the `settling`
/// shards (locked and read with the round's). Returns the heads; `None`
/// when, together, the database refused a batch's data (nothing was
/// committed: the round is for one by one).
async fn attempt(
    client: &ClientWrapper,
    given: Given<'_>,
    round: &mut [Request],
    answers: &mut [Option<Result<Vec<u64>>>],
    mode: Mode,
) -> std::result::Result<Option<Heads>, Down> {
    let Given {
        ownership,
        settling,
        ..
    } = given;
    let Begun {
        shard_heads,
        positions: taken,
        mut heads,
        epochs,
        mut grants,
        mut answered,
    } = begin(client, given, round, answers).await?;
    let mut next = 0;
    let mut staged = Vec::new();
    let mut moved_heads = Vec::new();
    for (i, request) in round.iter_mut().enumerate() {
        if answers[i].is_some() {
            continue;
        }
        let start = next;
        let checked = ownership
            .check(&request.batch, &epochs)
            .and_then(|()| grants.check(&request.batch))
            .and_then(|()| answered.check(&request.batch))
            .and_then(|()| stage(&mut request.batch, &heads, &taken, &mut next));
        let moved = match checked {
            Ok(moved) => moved,
            Err(refusal) => {
                answers[i] = Some(Err(refusal));
                continue;
            }
        };
        if mode == Mode::OneByOne {
            if let Some(e) = under_savepoint(client, &request.batch).await {
                if is_down(&e) {
                    return Err(down(e));
                }
                next = start;
                let undone = pipeline(client, vec![Step::Simple(ROLLBACK_TO)]).await;
                if let Some(e) = first_error(undone) {
                    return Err(down(e));
                }
                answers[i] = Some(Err(refused(client, &request.batch, &heads, e).await));
                continue;
            }
        }
        grants.record(&request.batch);
        answered.record(&request.batch);
        heads.extend(moved.iter().copied());
        moved_heads.extend(moved);
        staged.push(i);
    }
    // One by one, the batches are written already.
    let mut writes = Writes::default();
    if mode == Mode::Together {
        for &i in &staged {
            writes.add(&round[i].batch);
        }
    }
    let statements = writes.statements();
    let mut after = shard_heads.clone();
    for event in staged.iter().flat_map(|&i| round[i].batch.events()) {
        if let Some(run) = RunId::from_slice(&event.run_id) {
            let head = after.entry(run.shard()).or_default();
            *head = (*head).max(event.position);
        }
    }
    let settles = |shard: &u8| settling.contains(&i16::from(*shard));
    let after: Vec<(u8, u64)> = after
        .into_iter()
        .filter(|(shard, head)| shard_heads.get(shard) != Some(head) || settles(shard))
        .collect();
    // Which runs a settled shard's unknown round moved, nobody knows.
    let runs = settling.is_empty().then_some(&moved_heads[..]);
    let finished = finish(client, &statements, &after, runs).await;
    match finished.committed {
        Ok(()) => {
            for &i in &staged {
                answers[i] = Some(Ok(positions(&round[i].batch)));
            }
            Ok(Some(Heads {
                before: shard_heads,
                last_taken: taken.last().copied(),
                after,
                notified: finished.notified,
            }))
        }
        Err(e) if mode == Mode::Together && !is_down(&e) => Ok(None),
        Err(e) => Err(down(e)),
    }
}

/// Writes one batch under its own savepoint, released once written;
/// answers the error that stopped it, if one did (the caller then rolls
/// back to the savepoint).
async fn under_savepoint(
    client: &ClientWrapper,
    batch: &WriteBatch,
) -> Option<tokio_postgres::Error> {
    let mut writes = Writes::default();
    writes.add(batch);
    let statements = writes.statements();
    let mut steps = vec![Step::Simple(SAVEPOINT)];
    steps.extend(queries(&statements));
    steps.push(Step::Simple(RELEASE));
    first_error(pipeline(client, steps).await)
}

/// What a batch the database refused is told: a unique (run, seq) clash is
/// another writer's append (a conflict); anything else is the database's
/// refusal, named.
async fn refused(
    client: &ClientWrapper,
    batch: &WriteBatch,
    heads: &HashMap<RunId, u64>,
    error: tokio_postgres::Error,
) -> StoreError {
    let clash = error.as_db_error().is_some_and(|db| {
        db.code() == &SqlState::UNIQUE_VIOLATION && db.constraint() == Some("aaa_events_run_seq")
    });
    let expected = batch.expected_seqs();
    match (clash, expected.first()) {
        (true, Some(&(run, expected))) => {
            let actual = last_seq(client, run)
                .await
                .unwrap_or_else(|| heads.get(&run).copied().unwrap_or(expected));
            StoreError::Conflict {
                run,
                expected,
                actual,
            }
        }
        _ => StoreError::Unavailable(format!(
            "the database refused the write: {}",
            describe(&error)
        )),
    }
}

/// A run's last seq as the database has it now.
async fn last_seq(client: &ClientWrapper, run: RunId) -> Option<u64> {
    let rows = pipeline(
        client,
        vec![Step::Query(
            "SELECT coalesce(max(seq), 0) FROM aaa_events WHERE run_id = $1",
            vec![&run.as_uuid()],
        )],
    )
    .await;
    let row = rows.into_iter().next()?.ok()?.into_iter().next()?;
    row.try_get::<_, i64>(0).ok().map(|seq| seq as u64)
}

/// Opens the round's transaction: locks the shards the unanswered batches
/// touch, takes positions for their events, reads the shards' heads
/// (unless the committer knows them), the last seq of each run they append
/// to and, when the store is fenced, the epochs of their shards; then
/// locks the grants they use and the request ids they record.
async fn begin(
    client: &ClientWrapper,
    given: Given<'_>,
    round: &[Request],
    answers: &[Option<Result<Vec<u64>>>],
) -> std::result::Result<Begun, Down> {
    let Given {
        ownership,
        settling,
        tail,
        last_taken,
    } = given;
    let unanswered = || {
        round
            .iter()
            .zip(answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(request, _)| &request.batch)
    };
    let mut runs: Vec<Uuid> = unanswered()
        .flat_map(|batch| batch.expected_seqs())
        .map(|(run, _)| run.as_uuid())
        .collect();
    runs.sort_unstable();
    runs.dedup();
    let mut touched: Vec<i16> = unanswered()
        .flat_map(|batch| batch.shards())
        .map(i16::from)
        .chain(settling.iter().copied())
        .collect();
    touched.sort_unstable();
    touched.dedup();
    let events: usize = unanswered().map(|batch| batch.events().len()).sum();
    let events = i32::try_from(events).unwrap_or(i32::MAX);
    let taking = i64::from(events);
    // Settling reads the heads; so does a round that takes no position.
    let known_heads = (settling.is_empty() && events > 0)
        .then(|| last_taken.zip(tail.heads(&touched)))
        .flatten();
    let since = known_heads.as_ref().map_or(-1, |(last, _)| *last as i64);
    let shards = ownership.shards_of(unanswered());
    let stall_limit = ownership.stall_limit();
    let mut steps = vec![Step::Simple(BEGIN)];
    if let Some(limit) = &stall_limit {
        steps.push(Step::Query(ownership::STALL_LIMIT, vec![limit]));
    }
    steps.push(Step::Query(LOCK_SHARDS, vec![&touched]));
    steps.push(Step::Query(TAKE_POSITIONS, vec![&events]));
    steps.push(Step::Query(SHARD_HEADS, vec![&touched, &since, &taking]));
    steps.push(Step::Query(RUN_HEADS, vec![&runs]));
    if let Some(shards) = &shards {
        steps.push(Step::Query(ownership::EPOCHS, vec![shards]));
    }
    let (grant_ids, grant_runs) = GrantUses::keys(unanswered());
    let uses_grants = !grant_ids.is_empty();
    if uses_grants {
        steps.push(Step::Query(grant_uses::GRANTS, vec![&grant_ids]));
        steps.push(Step::Query(
            grant_uses::RECORDED,
            vec![&grant_ids, &grant_runs],
        ));
    }
    // Only a round that records answers asks (most record none).
    let (request_scopes, request_ids) = Answered::keys(unanswered());
    let records_answers = !request_ids.is_empty();
    let request_locks = answered::lock_keys(&request_scopes, &request_ids);
    if records_answers {
        steps.push(Step::Query(LOCK_REQUESTS, vec![&request_locks]));
        steps.push(Step::Query(
            answered::ANSWERED,
            vec![&request_scopes, &request_ids],
        ));
    }
    let expected = steps.len();
    let mut results = pipeline(client, steps).await.into_iter();
    if results.len() < expected {
        return Err(Down("the database gave too few answers".into()));
    }
    results.next().expect("counted").map_err(down)?;
    if stall_limit.is_some() {
        results.next().expect("counted").map_err(down)?;
    }
    let (Some(locked), Some(taken), Some(shard_rows), Some(heads)) = (
        results.next(),
        results.next(),
        results.next(),
        results.next(),
    ) else {
        return Err(Down("the database gave too few answers".into()));
    };
    locked.map_err(down)?;
    let shard_rows = shard_rows.map_err(down)?;
    let mut shard_heads = match known_heads {
        // Skipped: nobody else committed since, the tail's are the heads.
        Some((_, heads)) if shard_rows.is_empty() => heads,
        _ => BTreeMap::new(),
    };
    for row in shard_rows {
        let shard: i16 = row.try_get(0).map_err(down)?;
        let position: i64 = row.try_get(1).map_err(down)?;
        let shard =
            u8::try_from(shard).map_err(|_| Down(format!("a head row of shard {shard}")))?;
        shard_heads.insert(shard, position as u64);
    }
    let mut positions = Vec::with_capacity(taken.as_ref().map_or(0, Vec::len));
    for row in taken.map_err(down)? {
        positions.push(row.try_get::<_, i64>(0).map_err(down)? as u64);
    }
    // Taken one by one, they rise; sorted, whatever order the rows came in.
    positions.sort_unstable();
    let mut last = HashMap::new();
    for row in heads.map_err(down)? {
        let run: Uuid = row.try_get(0).map_err(down)?;
        let seq: i64 = row.try_get(1).map_err(down)?;
        last.insert(
            RunId::from_slice(run.as_bytes()).unwrap_or_default(),
            seq as u64,
        );
    }
    let mut epochs = HashMap::new();
    if shards.is_some() {
        let rows = results.next().expect("counted");
        for row in rows.map_err(down)? {
            let shard: i16 = row.try_get(0).map_err(down)?;
            let epoch: i64 = row.try_get(1).map_err(down)?;
            epochs.insert(shard, epoch);
        }
    }
    let mut grants = GrantUses::default();
    if uses_grants {
        let (Some(read), Some(recorded)) = (results.next(), results.next()) else {
            return Err(Down("the database gave too few answers".into()));
        };
        grants = GrantUses::read(read.map_err(down)?, recorded.map_err(down)?).map_err(down)?;
    }
    let mut answered = Answered::default();
    if records_answers {
        results.next().expect("counted").map_err(down)?;
        let rows = results.next().expect("counted");
        answered = Answered::read(rows.map_err(down)?).map_err(down)?;
    }
    Ok(Begun {
        shard_heads,
        positions,
        heads: last,
        epochs,
        grants,
        answered,
    })
}

/// Checks the batch's expected seqs against `heads` and gives its events
/// the next of the positions `taken` (`next` indexes them). Returns the
/// runs' new last seqs.
fn stage(
    batch: &mut WriteBatch,
    heads: &HashMap<RunId, u64>,
    taken: &[u64],
    next: &mut usize,
) -> Result<Vec<(RunId, u64)>> {
    for (run, expected) in batch.expected_seqs() {
        let actual = heads.get(&run).copied().unwrap_or(0);
        if actual != expected {
            return Err(StoreError::Conflict {
                run,
                expected,
                actual,
            });
        }
    }
    let mut moved = Vec::new();
    for event in &mut batch.events {
        // As many were taken as the round's batches hold events.
        event.position = taken[*next];
        *next += 1;
        if let Some(run) = RunId::from_slice(&event.run_id) {
            moved.push((run, event.seq));
        }
    }
    Ok(moved)
}

fn positions(batch: &WriteBatch) -> Vec<u64> {
    batch.events().iter().map(|e| e.position).collect()
}

/// What [`finish`] saw.
struct Finished {
    /// The first error of the writes or the COMMIT, if any.
    committed: std::result::Result<(), tokio_postgres::Error>,
    /// The notification went out (or none was due).
    notified: bool,
}

/// The round's writes and COMMIT, then, outside the transaction, a
/// notification naming the shards' new heads (`after`) and the runs whose
/// heads moved (`None`: not known), in one pipeline.
async fn finish(
    client: &ClientWrapper,
    statements: &[writes::Statement],
    after: &[(u8, u64)],
    runs: Option<&[(RunId, u64)]>,
) -> Finished {
    let text = notification(after, runs);
    let mut steps = queries(statements);
    steps.push(Step::Simple("COMMIT"));
    let notifies = !after.is_empty();
    if notifies {
        steps.push(Step::Query(NOTIFY, vec![&NOTIFY_CHANNEL, &text]));
    }
    let sent = steps.len();
    let mut results = pipeline(client, steps).await;
    // Fewer answers than steps: nothing was sent (a statement could not be
    // prepared), and the error among them says why.
    let notify = match notifies && results.len() == sent {
        true => results.pop(),
        false => None,
    };
    match first_error(results) {
        Some(e) => Finished {
            committed: Err(e),
            notified: false,
        },
        None => Finished {
            committed: Ok(()),
            notified: notify.is_none_or(|notify| notify.is_ok()),
        },
    }
}

/// The longest run list a notification carries (PostgreSQL takes 8000
/// bytes of payload, with the schema's name in front).
const MOST_NOTIFIED: usize = 7800;

/// A commit's notification text (after the schema's name): the shards'
/// new heads, then the runs whose heads moved, as
/// "SHARD=HEAD,...;RUN=SEQ,RUN=SEQ", or "SHARD=HEAD,...;*" when they would
/// not fit or are not known (`None`; see [`super::listener`]).
fn notification(after: &[(u8, u64)], moved: Option<&[(RunId, u64)]>) -> String {
    use std::fmt::Write;
    // A batch's events of one run come together: keep each run's last.
    let mut heads: Vec<(RunId, u64)> = Vec::new();
    for &(run, seq) in moved.unwrap_or_default() {
        match heads.last_mut() {
            Some((last_run, last_seq)) if *last_run == run => *last_seq = seq,
            _ => heads.push((run, seq)),
        }
    }
    let mut text = String::new();
    for (i, (shard, head)) in after.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(text, "{comma}{shard}={head}");
    }
    text.push(';');
    if moved.is_none() {
        text.push('*');
        return text;
    }
    let shards = text.len();
    for (i, (run, seq)) in heads.iter().enumerate() {
        if text.len() > MOST_NOTIFIED {
            text.truncate(shards);
            text.push('*');
            return text;
        }
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(text, "{comma}{run}={seq}");
    }
    text
}

fn queries(statements: &[writes::Statement]) -> Vec<Step<'_>> {
    statements
        .iter()
        .map(|s| {
            let params = s
                .params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            Step::Query(s.sql, params)
        })
        .collect()
}

/// Runs the steps as one pipeline: every statement is sent before the
/// first answer is awaited, in order (tokio-postgres sends a request when
/// its future is first polled, so they are polled in order). Answers come
/// back one per step, in order.
async fn pipeline(client: &ClientWrapper, steps: Vec<Step<'_>>) -> Vec<Rows> {
    // Statements are prepared once per connection; later rounds find them
    // in the connection's cache without a round trip.
    let mut prepared = Vec::with_capacity(steps.len());
    for step in &steps {
        match step {
            Step::Simple(_) => prepared.push(None),
            Step::Query(sql, _) => match client.prepare_cached(sql).await {
                Ok(statement) => prepared.push(Some(statement)),
                Err(e) => return vec![Err(e)],
            },
        }
    }
    let mut calls: Vec<Call<'_>> = Vec::with_capacity(steps.len());
    for (step, statement) in steps.iter().zip(&prepared) {
        let call: Call<'_> = match (step, statement) {
            (Step::Query(_, params), Some(statement)) => {
                Box::pin(async move { client.query(statement, params).await })
            }
            (Step::Simple(sql), _) | (Step::Query(sql, _), None) => {
                Box::pin(async move { client.batch_execute(sql).await.map(|()| Vec::new()) })
            }
        };
        calls.push(call);
    }
    join_in_order(calls).await
}

/// Awaits every call, polling the unfinished ones in order each time.
async fn join_in_order(mut calls: Vec<Call<'_>>) -> Vec<Rows> {
    let mut results: Vec<Option<Rows>> = calls.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (call, result) in calls.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match call.as_mut().poll(cx) {
                    Poll::Ready(rows) => *result = Some(rows),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}

/// The first failure of a pipeline, if any: the cause, not the "current
/// transaction is aborted" answers that follow it.
fn first_error(results: Vec<Rows>) -> Option<tokio_postgres::Error> {
    results.into_iter().find_map(|r| r.err())
}

fn down(e: tokio_postgres::Error) -> Down {
    Down(format!("the database cannot commit: {}", describe(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_names_the_runs_it_knows_and_a_star_for_those_it_does_not() {
        let run = RunId::parse("01a23a1a-205d-72d5-bdf8-595f9c171f82").unwrap();
        let moved = [(run, 6), (run, 7)];
        assert_eq!(
            notification(&[(130, 42), (7, 40)], Some(&moved)),
            format!("130=42,7=40;{run}=7")
        );
        assert_eq!(notification(&[(3, 9)], Some(&[])), "3=9;");
        // A settled shard: whichever runs its unknown round moved.
        assert_eq!(notification(&[(3, 9)], None), "3=9;*");
    }
}
