//! `aaa migrate`: copies everything one store holds into another, empty
//! one (the embedded store into PostgreSQL, or back), through the
//! [`Store`](crate::store::Store) trait alone, then verifies the copy.
//!
//! Events are committed in position order, one commit at a time, so each
//! shard's events keep their order; the destination gives them its own
//! positions (a log with gaps, a PostgreSQL one, comes out dense), and the
//! copy keeps the map from the source's. Then the indexes are copied
//! (run summaries, pending approvals and dead letters with their positions
//! mapped, active marks, timers, tools, idempotency records, groups with
//! their cursors mapped shard by shard, standing grants and each of their
//! uses) and the task-token key, so a worker holding a task can still
//! report it. Last, every count is compared and each run's events are
//! checksummed on both sides (all but their positions). Neither store may
//! be in use by a server while this runs. A client's WatchApprovals resume
//! token from the source does not carry over: it starts with a snapshot.

use sha2::{Digest, Sha256};

use std::collections::HashMap;

use crate::store::{
    ApprovalQuery, ApprovalRecord, Cursor, DeadLetterRecord, RunId, RunQuery, RunRecord,
    SharedStore, WriteBatch,
};

/// Events per commit, and at most this much event data.
const EVENTS_PER_BATCH: usize = 1000;
const BYTES_PER_BATCH: usize = 1 << 20;
/// Index entries per commit, and rows per page read.
const OPS_PER_BATCH: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("the destination is not empty ({0}); migrate into a new data directory or an empty database")]
    NotEmpty(String),
    #[error("verification failed: {0}")]
    Mismatch(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// What was copied (and verified equal on both sides).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub events: u64,
    pub runs: u64,
    pub approvals: u64,
    pub active: u64,
    pub timers: u64,
    pub tools: u64,
    pub requests: u64,
    pub groups: u64,
    pub dead_letters: u64,
    pub grants: u64,
    pub grant_uses: u64,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} events, {} runs, {} pending approvals, {} active runs, {} timers, {} tools, {} idempotency records, {} groups, {} dead letters, {} grants, {} grant uses",
            self.events,
            self.runs,
            self.approvals,
            self.active,
            self.timers,
            self.tools,
            self.requests,
            self.groups,
            self.dead_letters,
            self.grants,
            self.grant_uses
        )
    }
}

/// Copies `from` into the empty `to`, then verifies; `progress` hears what
/// is being done.
pub async fn migrate(
    from: &SharedStore,
    to: &SharedStore,
    progress: impl Fn(&str),
) -> Result<Counts, MigrateError> {
    check_empty(to).await?;
    progress("copying events");
    let positions = copy_events(from, to).await?;
    progress("copying runs, approvals, timers, tools, requests and groups");
    copy_indexes(from, to, &positions).await?;
    progress("verifying");
    let source = count(from).await?;
    let copied = count(to).await?;
    if source != copied {
        return Err(MigrateError::Mismatch(format!(
            "the source holds {source}; the destination {copied}"
        )));
    }
    verify_runs(from, to).await?;
    Ok(copied)
}

async fn check_empty(to: &SharedStore) -> Result<(), MigrateError> {
    let counts = count(to).await?;
    if counts != Counts::default() {
        return Err(MigrateError::NotEmpty(counts.to_string()));
    }
    Ok(())
}

/// Each shard's events' positions in the source and in the destination,
/// in order.
#[derive(Default)]
struct Positions(HashMap<u8, Vec<(u64, u64)>>);

impl Positions {
    /// The destination's position of the source's event at `position`.
    fn of(&self, run: &[u8], position: u64) -> Option<u64> {
        let pairs = self.0.get(&RunId::from_slice(run)?.shard())?;
        let i = pairs
            .binary_search_by_key(&position, |(from, _)| *from)
            .ok()?;
        Some(pairs[i].1)
    }

    /// The destination's cursor for a source's: per shard, the last event
    /// at or below it.
    fn cursor(&self, cursor: &Cursor) -> Cursor {
        let mut mapped = Cursor::start();
        for (shard, after) in cursor.shards() {
            let pairs = self.0.get(&shard).map_or(&[][..], Vec::as_slice);
            let below = pairs.partition_point(|(from, _)| *from <= after);
            if let Some((_, to)) = below.checked_sub(1).map(|i| pairs[i]) {
                mapped.advance(shard, to);
            }
        }
        mapped
    }
}

async fn copy_events(from: &SharedStore, to: &SharedStore) -> Result<Positions, MigrateError> {
    let mut positions = Positions::default();
    let mut after = Cursor::start();
    loop {
        let events = from.log_after(&after, EVENTS_PER_BATCH).await?;
        if events.is_empty() {
            return Ok(positions);
        }
        let mut batch = WriteBatch::default();
        let mut bytes = 0;
        for event in events {
            from.read_past(&mut after, &event);
            bytes += event.data_json.len();
            batch.push_event(event);
            if bytes >= BYTES_PER_BATCH {
                commit_events(to, std::mem::take(&mut batch), &mut positions).await?;
                bytes = 0;
            }
        }
        commit_events(to, batch, &mut positions).await?;
    }
}

/// Commits events and notes the positions they got.
async fn commit_events(
    to: &SharedStore,
    batch: WriteBatch,
    positions: &mut Positions,
) -> Result<(), MigrateError> {
    if batch.is_empty() {
        return Ok(());
    }
    let sources: Vec<(Option<RunId>, u64)> = batch
        .events()
        .iter()
        .map(|e| (RunId::from_slice(&e.run_id), e.position))
        .collect();
    let given = to.commit(batch).await?;
    for ((run, in_source), got) in sources.into_iter().zip(given) {
        if let Some(run) = run {
            positions
                .0
                .entry(run.shard())
                .or_default()
                .push((in_source, got));
        }
    }
    Ok(())
}

/// Collects index writes and commits them `OPS_PER_BATCH` at a time.
struct Writer<'a> {
    to: &'a SharedStore,
    batch: WriteBatch,
}

impl Writer<'_> {
    async fn add(&mut self, add: impl FnOnce(&mut WriteBatch)) -> Result<(), MigrateError> {
        add(&mut self.batch);
        if self.batch.ops().len() >= OPS_PER_BATCH {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), MigrateError> {
        let batch = std::mem::take(&mut self.batch);
        if !batch.is_empty() {
            self.to.commit(batch).await?;
        }
        Ok(())
    }
}

async fn copy_indexes(
    from: &SharedStore,
    to: &SharedStore,
    positions: &Positions,
) -> Result<(), MigrateError> {
    let mut out = Writer {
        to,
        batch: WriteBatch::default(),
    };
    let mut cursor = None;
    loop {
        let (runs, next) = runs_page(from, cursor).await?;
        for run in &runs {
            out.add(|b| b.put_run(run)).await?;
        }
        let Some(next) = next else { break };
        cursor = Some(next);
    }
    let mut cursor = None;
    loop {
        let (approvals, next) = approvals_page(from, cursor).await?;
        for approval in approvals {
            let approval = ApprovalRecord {
                position: positions
                    .of(&approval.run_id, approval.position)
                    .unwrap_or(approval.position),
                ..approval
            };
            out.add(|b| b.put_approval(&approval)).await?;
        }
        let Some(next) = next else { break };
        cursor = Some(next);
    }
    for run in from.active_runs(&crate::domain::Shards::all()).await? {
        out.add(|b| b.set_active(run, true)).await?;
    }
    for timer in from.list_timers().await? {
        out.add(|b| b.put_timer(timer.due_ms, timer.run, &timer.name))
            .await?;
    }
    for (name, definition) in from.list_tools().await? {
        out.add(|b| b.put_tool(&name, definition)).await?;
    }
    let mut cursor = None;
    loop {
        let (requests, next) = requests_page(from, cursor).await?;
        for (scope, request_id, answer) in requests {
            out.add(|b| b.put_request(&scope, &request_id, answer))
                .await?;
        }
        let Some(next) = next else { break };
        cursor = Some(next);
    }
    for mut group in from.list_groups().await? {
        group.set_log_cursor(&positions.cursor(&group.log_cursor()));
        out.add(|b| b.put_group(&group)).await?;
        let mut cursor = 0;
        loop {
            let (letters, next) = dead_letters_page(from, &group.name, cursor).await?;
            for letter in &letters {
                let letter = DeadLetterRecord {
                    position: positions
                        .of(&letter.run_id, letter.position)
                        .unwrap_or(letter.position),
                    ..letter.clone()
                };
                out.add(|b| b.put_dead_letter(&group.name, &letter)).await?;
            }
            let Some(next) = next else { break };
            cursor = next;
        }
    }
    for (grant, _) in from.grants().await? {
        out.add(|b| b.put_grant(&grant)).await?;
    }
    for used in from.list_grant_uses().await? {
        out.add(|b| b.use_grant(used)).await?;
    }
    let key = from.token_key();
    out.add(|b| b.put_token_key(key)).await?;
    out.flush().await
}

// Pages of what a store holds, each with the cursor of the next page
// (`None` after the last).

async fn runs_page(
    store: &SharedStore,
    before: Option<RunId>,
) -> Result<(Vec<RunRecord>, Option<RunId>), MigrateError> {
    let query = RunQuery {
        before,
        limit: OPS_PER_BATCH,
        ..Default::default()
    };
    let runs = store.list_runs(&query).await?;
    let next = match runs.last() {
        Some(last) if runs.len() == OPS_PER_BATCH => RunId::from_slice(&last.run_id),
        _ => None,
    };
    Ok((runs, next))
}

type ApprovalCursor = (RunId, String);

async fn approvals_page(
    store: &SharedStore,
    after: Option<ApprovalCursor>,
) -> Result<(Vec<ApprovalRecord>, Option<ApprovalCursor>), MigrateError> {
    let query = ApprovalQuery {
        newest_first: false,
        after,
        limit: OPS_PER_BATCH,
        ..Default::default()
    };
    let approvals = store.approvals(&query).await?;
    let next = match approvals.last() {
        Some(last) if approvals.len() == OPS_PER_BATCH => {
            RunId::from_slice(&last.run_id).map(|run| (run, last.call_id.clone()))
        }
        _ => None,
    };
    Ok((approvals, next))
}

type Request = (Vec<u8>, String, Vec<u8>);
type RequestCursor = (Vec<u8>, String);

async fn requests_page(
    store: &SharedStore,
    after: Option<RequestCursor>,
) -> Result<(Vec<Request>, Option<RequestCursor>), MigrateError> {
    let requests = store.list_requests(after, OPS_PER_BATCH).await?;
    let next = match requests.last() {
        Some((scope, id, _)) if requests.len() == OPS_PER_BATCH => {
            Some((scope.clone(), id.clone()))
        }
        _ => None,
    };
    Ok((requests, next))
}

async fn dead_letters_page(
    store: &SharedStore,
    group: &str,
    after: u64,
) -> Result<(Vec<DeadLetterRecord>, Option<u64>), MigrateError> {
    let letters = store.dead_letters(group, after, OPS_PER_BATCH).await?;
    let next = letters.last().map(|last| last.position);
    Ok((letters, next))
}

/// Counts everything a store holds.
async fn count(store: &SharedStore) -> Result<Counts, MigrateError> {
    let mut counts = Counts {
        active: store
            .active_runs(&crate::domain::Shards::all())
            .await?
            .len() as u64,
        timers: store.list_timers().await?.len() as u64,
        tools: store.list_tools().await?.len() as u64,
        grants: store.grants().await?.len() as u64,
        grant_uses: store.list_grant_uses().await?.len() as u64,
        ..Default::default()
    };
    let mut cursor = None;
    loop {
        let (runs, next) = runs_page(store, cursor).await?;
        counts.runs += runs.len() as u64;
        // A run's seqs are dense from 1.
        counts.events += runs.iter().map(|r| r.last_seq).sum::<u64>();
        let Some(next) = next else { break };
        cursor = Some(next);
    }
    let mut cursor = None;
    loop {
        let (approvals, next) = approvals_page(store, cursor).await?;
        counts.approvals += approvals.len() as u64;
        let Some(next) = next else { break };
        cursor = Some(next);
    }
    let mut cursor = None;
    loop {
        let (requests, next) = requests_page(store, cursor).await?;
        counts.requests += requests.len() as u64;
        let Some(next) = next else { break };
        cursor = Some(next);
    }
    for group in store.list_groups().await? {
        counts.groups += 1;
        let mut cursor = 0;
        loop {
            let (letters, next) = dead_letters_page(store, &group.name, cursor).await?;
            counts.dead_letters += letters.len() as u64;
            let Some(next) = next else { break };
            cursor = next;
        }
    }
    Ok(counts)
}

/// Compares a checksum of every run's events on both sides.
async fn verify_runs(from: &SharedStore, to: &SharedStore) -> Result<(), MigrateError> {
    let mut cursor = None;
    loop {
        let (runs, next) = runs_page(from, cursor).await?;
        for id in runs.iter().filter_map(|r| RunId::from_slice(&r.run_id)) {
            let (source, copied) = (checksum(from, id).await?, checksum(to, id).await?);
            if source != copied {
                return Err(MigrateError::Mismatch(format!(
                    "the events of run {id} differ (sha256 {source} in the source, {copied} in the destination)"
                )));
            }
        }
        let Some(next) = next else { return Ok(()) };
        cursor = Some(next);
    }
}

/// sha256 over a run's events, every field, in seq order.
pub async fn checksum(store: &SharedStore, run: RunId) -> Result<String, MigrateError> {
    let mut hash = Sha256::new();
    let mut after = 0;
    loop {
        let events = store.run_events(run, after, EVENTS_PER_BATCH).await?;
        let Some(last) = events.last() else { break };
        after = last.seq;
        for event in &events {
            // Positions are the store's own (see the module's comment).
            let event = crate::store::EventRecord {
                position: 0,
                ..event.clone()
            };
            hash.update(prost::Message::encode_to_vec(&event));
        }
    }
    Ok(hex::encode(hash.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_in(shard: u8) -> RunId {
        let mut bytes = [3u8; 16];
        bytes[15] = shard;
        RunId::from_slice(&bytes).unwrap()
    }

    /// A source with gaps (positions 3, 7, 8, 20 over two shards) copied
    /// into a dense destination: each event's position and each shard of a
    /// cursor map onto the destination's.
    #[test]
    fn positions_with_gaps_map_onto_the_destinations() {
        let (a, b) = (run_in(1), run_in(2));
        let mut positions = Positions::default();
        positions.0.insert(1, vec![(3, 1), (8, 3)]);
        positions.0.insert(2, vec![(7, 2), (20, 4)]);
        assert_eq!(positions.of(a.as_bytes(), 8), Some(3));
        assert_eq!(positions.of(b.as_bytes(), 20), Some(4));
        assert_eq!(positions.of(b.as_bytes(), 8), None, "no such event");
        // Read up to 7 everywhere: shard 1 up to its event at 3, shard 2
        // up to its event at 7; shards with no events stay at the start.
        let mapped = positions.cursor(&Cursor::at(7));
        assert_eq!(
            (mapped.after(1), mapped.after(2), mapped.after(9)),
            (1, 2, 0)
        );
        let mut partly = Cursor::at(20);
        partly.lower(1, 2);
        let mapped = positions.cursor(&partly);
        assert_eq!((mapped.after(1), mapped.after(2)), (0, 4));
    }
}
