//! `aaa migrate`: copies everything one store holds into another, empty
//! one (the embedded store into PostgreSQL, or back), through the
//! [`Store`](crate::store::Store) trait alone, then verifies the copy.
//!
//! Events are committed in position order, so the destination gives them
//! the same global positions (consumer group cursors and WatchApprovals
//! positions stay valid); a position that comes out different stops the
//! copy. Then the indexes are copied as they are (run summaries, pending
//! approvals with their positions, active marks, timers, tools,
//! idempotency records, groups with their cursors, dead letters, standing
//! grants and each of their uses) and the
//! task-token key, so a worker holding a task can still report it. Last,
//! every count is compared and each run's events are checksummed on both
//! sides. Neither store may be in use by a server while this runs.

use sha2::{Digest, Sha256};

use crate::store::{
    ApprovalQuery, ApprovalRecord, DeadLetterRecord, RunId, RunQuery, RunRecord, SharedStore,
    WriteBatch,
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
    #[error("event {run}/{seq} has position {in_source} in the source but got {got} in the destination; the source log is not dense (was it written by this version of aaa?)")]
    Position {
        run: String,
        seq: u64,
        in_source: u64,
        got: u64,
    },
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
    copy_events(from, to).await?;
    progress("copying runs, approvals, timers, tools, requests and groups");
    copy_indexes(from, to).await?;
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

async fn copy_events(from: &SharedStore, to: &SharedStore) -> Result<(), MigrateError> {
    let mut after = 0;
    loop {
        let events = from.log_after(after, EVENTS_PER_BATCH).await?;
        let Some(last) = events.last() else {
            return Ok(());
        };
        after = last.position;
        let mut batch = WriteBatch::default();
        let mut bytes = 0;
        for event in events {
            bytes += event.data_json.len();
            batch.push_event(event);
            if bytes >= BYTES_PER_BATCH {
                commit_events(to, std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
        }
        commit_events(to, batch).await?;
    }
}

/// Commits events and checks they kept their source positions.
async fn commit_events(to: &SharedStore, batch: WriteBatch) -> Result<(), MigrateError> {
    if batch.is_empty() {
        return Ok(());
    }
    let sources: Vec<(Vec<u8>, u64, u64)> = batch
        .events()
        .iter()
        .map(|e| (e.run_id.clone(), e.seq, e.position))
        .collect();
    let positions = to.commit(batch).await?;
    for ((run_id, seq, in_source), got) in sources.into_iter().zip(positions) {
        if in_source != got {
            return Err(MigrateError::Position {
                run: run_text(&run_id),
                seq,
                in_source,
                got,
            });
        }
    }
    Ok(())
}

fn run_text(id: &[u8]) -> String {
    RunId::from_slice(id).map_or_else(|| hex::encode(id), |r| r.to_string())
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

async fn copy_indexes(from: &SharedStore, to: &SharedStore) -> Result<(), MigrateError> {
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
        for approval in &approvals {
            out.add(|b| b.put_approval(approval)).await?;
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
    for group in from.list_groups().await? {
        out.add(|b| b.put_group(&group)).await?;
        let mut cursor = 0;
        loop {
            let (letters, next) = dead_letters_page(from, &group.name, cursor).await?;
            for letter in &letters {
                out.add(|b| b.put_dead_letter(&group.name, letter)).await?;
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
        events: store.durable_position(),
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
            hash.update(prost::Message::encode_to_vec(event));
        }
    }
    Ok(hex::encode(hash.finalize()))
}
