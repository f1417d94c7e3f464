//! The embedded store: the only module that touches sled or the data
//! directory. It owns the key layout and the group commit that makes an
//! append durable before anyone is told about it.
//!
//! Events live in the log (see [`log`]): segment files of records, one per
//! group commit, in position order. Everything else (run summaries, pending
//! approvals, timers, cursors, and pointers into the log) lives in one sled
//! tree (see [`keys`]), except the newest pointers to each run's events,
//! which stay in memory until a checkpoint (see [`spans`]). An event and the
//! index entries it implies are made durable together, by one record.
//! Appends go through one committer thread (see [`rounds`]): it gathers
//! the batches waiting, writes them to the log as one record and fdatasyncs
//! it, applies the index writes, then answers all of them. sled itself is
//! flushed and fsynced at checkpoints. Readers never see past the durable
//! position. The pending approvals are also copied into memory (see
//! [`pending`]), so reading all of them does not page sled's leaves.

mod committer;
mod compact;
mod keys;
mod layout;
mod log;
mod owner;
mod pending;
mod record;
mod retention;
mod rounds;
mod segments;
mod space;
mod spans;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prost::Message;
use tokio::sync::watch;

use super::{
    ApprovalQuery, ApprovalRecord, Cursor, DeadLetterRecord, EventRecord, GrantRecord, GrantUse,
    GroupRecord, Result, RunId, RunQuery, RunRecord, Shards, StoreError, Timer, ToolWaiting,
    Waiting, WriteBatch,
};

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        match e {
            sled::Error::Io(e) => StoreError::Io(e),
            sled::Error::Corruption { .. } => StoreError::Corrupt(format!("sled: {e}")),
            other => StoreError::Unavailable(format!("sled: {other}")),
        }
    }
}

/// A key and what is wrong with the value under it.
fn corrupt(key: &[u8], what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("under key {key:?}: {what}"))
}

/// The embedded store. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    tree: sled::Db,
    segments: Arc<segments::Segments>,
    recent: Arc<spans::Recent>,
    /// The pending approvals in memory, once built (see [`pending`]).
    pending: Arc<pending::Pending>,
    commits: crate::store::queue::Queue,
    durable: watch::Receiver<u64>,
    /// Mirrors `durable` for readers that do not need to wait.
    durable_position: Arc<AtomicU64>,
    /// False while writes are refused (see [`Store::watch_writable`]).
    writable: watch::Receiver<bool>,
    token_key: [u8; 32],
    /// Dropped with the last handle on the store.
    held: watch::Sender<()>,
    /// The file sled locks while the store is open.
    locked: PathBuf,
    /// This process's lock on the data directory (see [`owner`]).
    _owner: owner::Owner,
}

impl EmbeddedStore {
    /// Opens (or creates) the database in `dir` and starts its committer.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<EmbeddedStore> {
        let segment = crate::store::DEFAULT_LOG_SEGMENT_KIB * 1024;
        EmbeddedStore::open_with(
            dir,
            cache_bytes,
            segment,
            &crate::metrics::Metrics::new(),
            None,
        )
    }

    /// [`EmbeddedStore::open`], with log segments of at most
    /// `segment_bytes` (the unit compaction gives disk back in), counting
    /// commits and disk use into `metrics`; `hold`: a test's hold on the
    /// commits (see [`crate::store::CommitHold`]).
    pub fn open_with(
        dir: &Path,
        cache_bytes: u64,
        segment_bytes: u64,
        metrics: &crate::metrics::Metrics,
        hold: Option<crate::store::CommitHold>,
    ) -> Result<EmbeddedStore> {
        std::fs::create_dir_all(dir)?;
        // Before sled: says which server holds the directory, if one does.
        let owner = owner::acquire(dir)?;
        let space = space::Space::new(dir);
        // sled writes at open: on a full disk, the reserve makes its room.
        space.release_if_short()?;
        let tree = layout::sled_config(dir, cache_bytes).open()?;
        layout::check_format(&tree, dir)?;
        let reserved = space.keep()?;
        if !reserved {
            tracing::error!("{}", space.full());
        }
        // Before anything reads the tree: it may hold less than the log.
        let pending = Arc::new(pending::Pending::default());
        let opened = log::Log::open(&dir.join("log"), &tree, segment_bytes, &pending, &space)?;
        if opened.replayed > 0 {
            tracing::info!("applied {} records of the log again", opened.replayed);
        }
        retention::backfill(&tree)?;
        pending.ready_if_none(&tree)?;
        let dead = retention::load_dead(&tree)?;
        let last_position = opened.next_position - 1;
        let data_file = std::fs::File::open(dir.join("db"))?;
        let token_key = layout::token_key(&tree, &data_file)?;
        let (durable_tx, durable) = watch::channel(last_position);
        let durable_position = Arc::new(AtomicU64::new(last_position));
        let (commits, messages) = crate::store::queue::Queue::new();
        // Without its reserve the store starts refusing writes; the
        // committer makes the reserve once there is room (see `space`).
        let (writable_tx, writable) = watch::channel(reserved);
        let committer = committer::Committer {
            tree: tree.clone(),
            data_file,
            log: opened.log,
            recent: opened.recent.clone(),
            pending: pending.clone(),
            checkpointed: opened.mark.offset,
            next_position: opened.next_position,
            durable: durable_tx,
            durable_position: durable_position.clone(),
            writable: writable_tx,
            space,
            short: !reserved,
            index_failed: None,
            metrics: metrics.clone(),
            reclaim: committer::Reclaim::new(dead),
            hold,
        };
        std::thread::Builder::new()
            .name("aaa-committer".into())
            .spawn(move || rounds::run(committer, messages))?;
        let inner = Arc::new(Inner {
            tree,
            segments: opened.segments,
            recent: opened.recent,
            pending,
            commits,
            durable,
            durable_position,
            writable,
            token_key,
            held: watch::Sender::new(()),
            locked: dir.join("db"),
            _owner: owner,
        });
        let dir = dir.to_path_buf();
        metrics.refresh_from(Arc::downgrade(&inner), move |_, metrics| {
            let bytes = disk_bytes(&dir);
            metrics.families().store_disk_bytes.set(bytes as i64);
            std::future::ready(())
        });
        Ok(EmbeddedStore { inner })
    }

    /// The approvals `query` selects, from the copy in memory when
    /// `pending` is given and ready, else from sled.
    fn select_approvals(
        &self,
        query: &ApprovalQuery,
        pending: Option<&pending::Pending>,
    ) -> Result<Vec<ApprovalRecord>> {
        let mut out = Vec::new();
        // Pages of at most the limit: the filters may pass few of them.
        let page = query.limit.clamp(1, 1024);
        let bounds = approval_bounds(query);
        each_approval(
            &self.inner.tree,
            pending,
            bounds,
            query.newest_first,
            page,
            |key, value| {
                let record: ApprovalRecord = decode(key, value)?;
                if query.matches(&record) && out.len() < query.limit {
                    out.push(record);
                }
                Ok(out.len() < query.limit)
            },
        )?;
        Ok(out)
    }

    /// Runs a read again when compaction deleted a segment under it: the
    /// spans it found had been moved, and looking them up again finds them
    /// where they are now.
    fn retrying<T>(&self, read: impl Fn() -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            match read() {
                Err(e) if segments::is_retired(&e) && tries < 3 => tries += 1,
                other => return other,
            }
        }
    }

    /// Every event of `run` after `after_seq`, the durable ones only.
    fn events_from(&self, run: RunId, after_seq: u64, limit: usize) -> Result<Vec<EventRecord>> {
        self.retrying(|| self.events_from_once(run, after_seq, limit))
    }

    fn events_from_once(
        &self,
        run: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventRecord>> {
        let durable = self.inner.durable_position.load(Ordering::Acquire);
        // Every span holds at least one event, and only the first may hold
        // events at or before `after_seq`: this many spans are enough.
        let most = limit.saturating_add(1);
        let spans = self
            .spans_from(run, after_seq.saturating_add(1), most)
            .take(most)
            .collect::<Result<Vec<_>>>()?;
        let mut out = Vec::new();
        for event in self.inner.segments.events_of(&spans)? {
            if event.seq <= after_seq {
                continue;
            }
            if event.position > durable || out.len() >= limit {
                break;
            }
            out.push(event);
        }
        Ok(out)
    }

    /// The run's spans in seq order, from the one that holds `seq` on: the
    /// lists in sled, then the recent spans (`most` of them at most: the
    /// caller takes no more). The recent ones are read first:
    /// a checkpoint that moves them to sled between the two reads leaves
    /// them in both, never in neither, and a span whose seqs were passed
    /// already is skipped.
    fn spans_from(
        &self,
        run: RunId,
        seq: u64,
        most: usize,
    ) -> impl Iterator<Item = Result<spans::Span>> + '_ {
        let recent = self.inner.recent.from(run, seq, most);
        let end = keys::prefix_end(&keys::run_scoped(keys::EVENT, run));
        let lists = self
            .inner
            .tree
            .range(keys::event(run, seq)..end)
            .map(|entry| {
                let (key, value) = entry?;
                spans::decode(&key, &value)
            })
            .chain(std::iter::once(Ok(recent)));
        let mut passed = seq.saturating_sub(1);
        lists
            .flat_map(|list| match list {
                Ok(spans) => spans.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            })
            .filter(move |span| match span {
                Ok(span) if span.last_seq <= passed => false,
                Ok(span) => {
                    passed = span.last_seq;
                    true
                }
                Err(_) => true,
            })
    }

    /// The run's newest span: the recent one, or the last of its lists.
    fn newest_span(&self, run: RunId) -> Result<Option<spans::Span>> {
        newest_span(&self.inner.tree, &self.inner.recent, run)
    }

    /// The summary as stored: exact for what the run started with (task,
    /// model, tools, labels, times), its head not filled in.
    fn run_start(&self, run: RunId) -> Result<Option<RunRecord>> {
        self.get(&keys::run_scoped(keys::RUN, run))
    }

    fn with_head(&self, mut record: RunRecord) -> Result<RunRecord> {
        let run = RunId::from_slice(&record.run_id)
            .ok_or_else(|| corrupt(&record.run_id, "bad run id"))?;
        if let Some(span) = self.newest_span(run)? {
            record.last_seq = span.last_seq;
            record.updated_ms = span.last_time_ms;
        }
        Ok(record)
    }

    /// Who started the run: the summary says, or (for summaries written
    /// before it did) the run's first event.
    fn started_by(&self, record: &RunRecord) -> Result<String> {
        if !record.started_by.is_empty() {
            return Ok(record.started_by.clone());
        }
        let Some(run) = RunId::from_slice(&record.run_id) else {
            return Ok(String::new());
        };
        let first = self.events_from(run, 0, 1)?;
        Ok(first
            .into_iter()
            .find(|e| e.actor_kind == crate::store::CLIENT_ACTOR)
            .map(|e| e.actor_name)
            .unwrap_or_default())
    }

    /// Durable events past `cursor` (see [`super::Store::log_after`]).
    /// Positions here are in commit order across the whole log, so the
    /// read starts at the cursor's lowest shard and skips what the others
    /// have read.
    fn log_after_once(&self, cursor: &Cursor, limit: usize) -> Result<Vec<EventRecord>> {
        let durable = self.inner.durable_position.load(Ordering::Acquire);
        let after = cursor.least();
        let mut out = Vec::new();
        if after >= durable {
            return Ok(out);
        }
        // Events of runs deleted by retention stay in the log until their
        // segment is compacted: skip them. A run is deleted when its span
        // index is (a durable event always has its span, recent or in sled).
        let mut kept: std::collections::HashMap<Vec<u8>, bool> = Default::default();
        // The record that holds `after + 1`, then the ones after it.
        for entry in self
            .inner
            .tree
            .range(keys::log(after + 1)..vec![keys::LOG + 1])
        {
            let (key, value) = entry?;
            let offset = value
                .as_ref()
                .try_into()
                .map(u64::from_le_bytes)
                .map_err(|_| corrupt(&key, "bad log offset"))?;
            for event in self.inner.segments.record_events(offset)? {
                let run = RunId::from_slice(&event.run_id)
                    .ok_or_else(|| corrupt(&event.run_id, "bad run id"))?;
                if !cursor.passes(run, event.position) {
                    continue;
                }
                if event.position > durable || out.len() >= limit {
                    return Ok(out);
                }
                let live = match kept.get(&event.run_id) {
                    Some(&live) => live,
                    None => {
                        let live = self.newest_span(run)?.is_some();
                        kept.insert(event.run_id.clone(), live);
                        live
                    }
                };
                if live {
                    out.push(event);
                }
            }
        }
        Ok(out)
    }

    fn get<T: Message + Default>(&self, key: &[u8]) -> Result<Option<T>> {
        match self.inner.tree.get(key)? {
            Some(value) => decode(key, &value).map(Some),
            None => Ok(None),
        }
    }
}

/// The keys an approval query reads, `[low, high)`: a run's or all
/// approvals, after (or, newest first, below) the previous page's last.
fn approval_bounds(query: &ApprovalQuery) -> (Vec<u8>, Vec<u8>) {
    let (mut low, mut high) = match query.run {
        Some(run) => {
            let prefix = keys::run_scoped(keys::APPROVAL, run);
            let end = keys::prefix_end(&prefix);
            (prefix, end)
        }
        None => (vec![keys::APPROVAL], vec![keys::APPROVAL + 1]),
    };
    if let Some((run, call)) = &query.after {
        let key = keys::approval(*run, call);
        if query.newest_first {
            high = high.min(key);
        } else {
            low = low.max([key.as_slice(), &[0]].concat());
        }
    }
    (low, high)
}

/// The run's newest span, recent or in sled. The committer asks it too, to
/// check a batch's expected seq.
fn newest_span(tree: &sled::Db, recent: &spans::Recent, run: RunId) -> Result<Option<spans::Span>> {
    if let Some(span) = recent.newest(run) {
        return Ok(Some(span));
    }
    let start = keys::run_scoped(keys::EVENT, run);
    let end = keys::prefix_end(&start);
    match tree.range(start..end).next_back() {
        Some(entry) => {
            let (key, value) = entry?;
            Ok(spans::decode(&key, &value)?.last().copied())
        }
        None => Ok(None),
    }
}

// Reads run on the caller's task: sled answers from its page cache in
// microseconds, and the log is read with positioned reads of one record.
#[async_trait::async_trait]
impl super::Store for EmbeddedStore {
    async fn commit(&self, batch: WriteBatch) -> Result<Vec<u64>> {
        self.inner.commits.commit(batch).await
    }

    async fn compact(&self) -> Result<super::Compacted> {
        self.inner.commits.compact().await
    }

    async fn claim_runs(
        &self,
        _server: &str,
        _claim: super::Claim,
    ) -> Result<tokio::sync::watch::Receiver<Shards>> {
        Ok(self.held_shards())
    }

    async fn claim_shards(
        &self,
        _server: &str,
        _claim: super::Claim,
        wanted: Shards,
    ) -> Result<Shards> {
        Ok(wanted)
    }

    async fn release_shards(&self, _shards: Shards) -> Result<()> {
        Ok(())
    }

    fn held_shards(&self) -> tokio::sync::watch::Receiver<Shards> {
        // The data directory's lock keeps every other process out, for as
        // long as the store is open: this one holds every shard, for good.
        tokio::sync::watch::Sender::new(Shards::all()).subscribe()
    }

    async fn join(
        &self,
        _server: &str,
        _address: &str,
        _lease: std::time::Duration,
        _spreads: bool,
    ) -> Result<()> {
        Ok(())
    }

    async fn cluster(&self) -> Result<super::ClusterView> {
        Ok(super::ClusterView::default())
    }

    async fn close(&self) {
        self.inner.commits.close().await;
    }

    fn released(&self) -> crate::store::Released {
        let mut held = self.inner.held.subscribe();
        let locked = self.inner.locked.clone();
        crate::store::Released::after(async move {
            while held.changed().await.is_ok() {}
            // sled's I/O threads may close their copy of the locked file a
            // moment after its last handle is dropped.
            layout::unlocked(&locked).await
        })
    }

    fn token_key(&self) -> [u8; 32] {
        self.inner.token_key
    }

    fn watch_writable(&self) -> watch::Receiver<bool> {
        self.inner.writable.clone()
    }

    fn durable(&self) -> Cursor {
        Cursor::at(self.inner.durable_position.load(Ordering::Acquire))
    }

    /// One committer gives positions in commit order across the log: past
    /// an event, a reader has read everything at or below it.
    fn read_past(&self, cursor: &mut Cursor, event: &EventRecord) {
        cursor.set_all(event.position);
    }

    fn watch_durable(&self) -> watch::Receiver<u64> {
        self.inner.durable.clone()
    }

    async fn run_events(
        &self,
        run: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventRecord>> {
        self.events_from(run, after_seq, limit)
    }

    async fn event(&self, run: RunId, seq: u64) -> Result<Option<EventRecord>> {
        self.retrying(|| match self.spans_from(run, seq, 1).next() {
            Some(span) => Ok(self
                .inner
                .segments
                .events(span?)?
                .into_iter()
                .find(|e| e.seq == seq)),
            None => Ok(None),
        })
    }

    async fn log_after(&self, after: &Cursor, limit: usize) -> Result<Vec<EventRecord>> {
        self.retrying(|| self.log_after_once(after, limit))
    }

    async fn run(&self, run: RunId) -> Result<Option<RunRecord>> {
        match self.run_start(run)? {
            Some(record) => self.with_head(record).map(Some),
            None => Ok(None),
        }
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>> {
        let start = vec![keys::RUN];
        let end = match query.before {
            Some(run) => keys::run_scoped(keys::RUN, run),
            None => vec![keys::RUN + 1],
        };
        let mut out = Vec::new();
        for entry in self.inner.tree.range(start..end).rev() {
            if out.len() >= query.limit {
                break;
            }
            let (key, value) = entry?;
            let record: RunRecord = decode(&key, &value)?;
            if !query.matches(&record) {
                continue;
            }
            if let Some(name) = &query.started_by {
                if self.started_by(&record)? != *name {
                    continue;
                }
            }
            out.push(self.with_head(record)?);
        }
        Ok(out)
    }

    async fn run_approvals(&self, run: RunId) -> Result<Vec<ApprovalRecord>> {
        self.inner
            .tree
            .scan_prefix(keys::run_scoped(keys::APPROVAL, run))
            .map(|entry| {
                let (key, value) = entry?;
                decode(&key, &value)
            })
            .collect()
    }

    async fn approvals(&self, query: &ApprovalQuery) -> Result<Vec<ApprovalRecord>> {
        if query.run.is_none() {
            // A query across runs: worth a copy of them all in memory.
            self.inner.pending.build_in_background(&self.inner.tree)?;
        }
        self.select_approvals(query, Some(&self.inner.pending))
    }

    async fn active_runs(&self, shards: &Shards) -> Result<Vec<RunId>> {
        let mut runs = Vec::new();
        for key in self.inner.tree.scan_prefix([keys::ACTIVE]).keys() {
            let key = key?;
            let run = RunId::from_slice(&key[1..]).ok_or_else(|| corrupt(&key, "bad run id"))?;
            if shards.contains(run.shard()) {
                runs.push(run);
            }
        }
        Ok(runs)
    }

    async fn waiting(&self, shards: &Shards) -> Result<Waiting> {
        let shards = *shards;
        let inner = self.inner.clone();
        // Counting reads every pending approval: worth the copy in memory.
        inner.pending.build_in_background(&inner.tree)?;
        let counted =
            tokio::task::spawn_blocking(move || count_waiting(&inner.tree, &inner.pending, shards));
        counted
            .await
            .map_err(|e| StoreError::Format(format!("counting what waits failed: {e}")))?
    }

    async fn next_timer(&self, shards: &Shards) -> Result<Option<Timer>> {
        for key in self.inner.tree.scan_prefix([keys::TIMER]).keys() {
            let timer = timer(&key?)?;
            if shards.contains(timer.run.shard()) {
                return Ok(Some(timer));
            }
        }
        Ok(None)
    }

    async fn tool(&self, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.inner.tree.get(keys::tool(name))?.map(|v| v.to_vec()))
    }

    async fn request(&self, scope: &[u8], request_id: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .inner
            .tree
            .get(keys::request(scope, request_id))?
            .map(|v| v.to_vec()))
    }

    async fn group(&self, name: &str) -> Result<Option<GroupRecord>> {
        self.get(&keys::group(name))
    }

    async fn dead_letters(
        &self,
        group: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetterRecord>> {
        let start = keys::dead_letter(group, after.saturating_add(1));
        let end = keys::prefix_end(&keys::dead_letters(group));
        self.inner
            .tree
            .range(start..end)
            .take(limit)
            .map(|entry| {
                let (key, value) = entry?;
                decode(&key, &value)
            })
            .collect()
    }

    async fn list_timers(&self) -> Result<Vec<Timer>> {
        self.inner
            .tree
            .scan_prefix([keys::TIMER])
            .keys()
            .map(|key| timer(&key?))
            .collect()
    }

    async fn list_tools(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.inner
            .tree
            .scan_prefix([keys::TOOL])
            .map(|entry| {
                let (key, value) = entry?;
                let name = String::from_utf8(key[1..].to_vec())
                    .map_err(|_| corrupt(&key, "tool name is not UTF-8"))?;
                Ok((name, value.to_vec()))
            })
            .collect()
    }

    async fn list_requests(
        &self,
        after: Option<(Vec<u8>, String)>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, String, Vec<u8>)>> {
        let start = match after {
            Some((scope, request_id)) => {
                let mut key = keys::request(&scope, &request_id);
                key.push(0);
                key
            }
            None => vec![keys::REQUEST],
        };
        self.inner
            .tree
            .range(start..vec![keys::REQUEST + 1])
            .take(limit)
            .map(|entry| {
                let (key, value) = entry?;
                let (scope, request_id) =
                    keys::parse_request(&key).ok_or_else(|| corrupt(&key, "bad request key"))?;
                Ok((scope, request_id, value.to_vec()))
            })
            .collect()
    }

    async fn list_groups(&self) -> Result<Vec<GroupRecord>> {
        self.inner
            .tree
            .scan_prefix([keys::GROUP])
            .map(|entry| {
                let (key, value) = entry?;
                decode(&key, &value)
            })
            .collect()
    }

    async fn grants(&self) -> Result<Vec<(GrantRecord, u64)>> {
        let tree = &self.inner.tree;
        tree.scan_prefix([keys::GRANT])
            .map(|entry| {
                let (key, value) = entry?;
                let grant: GrantRecord = decode(&key, &value)?;
                let uses = tree.scan_prefix(keys::grant_uses(&grant.id)).count() as u64;
                Ok((grant, uses))
            })
            .collect()
    }

    async fn expired_runs(
        &self,
        now_ms: i64,
        default_ms: Option<i64>,
        limit: usize,
        shards: &Shards,
    ) -> Result<Vec<RunId>> {
        // This store's one server holds every shard; the filter is for form.
        let mut runs = EmbeddedStore::expired_runs(self, now_ms, default_ms, limit)?;
        runs.retain(|run| shards.contains(run.shard()));
        Ok(runs)
    }

    async fn expired_at(&self, run: RunId) -> Result<Option<i64>> {
        EmbeddedStore::expired_at(self, run)
    }

    async fn drop_tombstones(&self, now_ms: i64, limit: usize) -> Result<usize> {
        EmbeddedStore::drop_tombstones(self, now_ms, limit)
    }

    async fn list_grant_uses(&self) -> Result<Vec<GrantUse>> {
        self.inner
            .tree
            .scan_prefix([keys::GRANT_USE])
            .keys()
            .map(|key| {
                let key = key?;
                let (grant, run, call_id) = keys::parse_grant_use(&key)
                    .ok_or_else(|| corrupt(&key, "bad grant use key"))?;
                Ok(GrantUse {
                    grant,
                    run,
                    call_id,
                })
            })
            .collect()
    }
}

/// The timer a timer key names.
fn timer(key: &[u8]) -> Result<Timer> {
    let (due_ms, run, name) =
        keys::parse_timer(key).ok_or_else(|| corrupt(key, "bad timer key"))?;
    Ok(Timer { due_ms, run, name })
}

/// Approvals counted per turn of the in-memory copy's lock, which the
/// committer takes for every approval it writes.
const COUNT_CHUNK: usize = 4096;

/// Visits the pending approvals with keys in `bounds` (`[low, high)`), in
/// key order or reversed, until `visit` answers false: from the copy in
/// memory while `pending` is given and ready (`page` entries cloned per
/// turn of its lock, visited outside it), else from sled, from where the
/// copy left off.
fn each_approval(
    tree: &sled::Db,
    pending: Option<&pending::Pending>,
    (mut low, mut high): (Vec<u8>, Vec<u8>),
    reverse: bool,
    page: usize,
    mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool>,
) -> Result<()> {
    while let Some(entries) = pending.and_then(|p| p.range(&low, &high, reverse, page)) {
        if let Some((last, _)) = entries.last() {
            match reverse {
                true => high = last.to_vec(),
                false => low = [last.as_ref(), &[0]].concat(),
            }
        }
        for (key, value) in &entries {
            if !visit(key, value)? {
                return Ok(());
            }
        }
        if entries.len() < page {
            return Ok(());
        }
    }
    if low >= high {
        return Ok(());
    }
    let range = tree.range(low..high);
    let range: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> = match reverse {
        true => Box::new(range.rev()),
        false => Box::new(range),
    };
    for entry in range {
        let (key, value) = entry?;
        if !visit(&key, &value)? {
            break;
        }
    }
    Ok(())
}

/// See [`Store::waiting`]: the runs at work from sled (few: runs that only
/// wait are not there); the approvals from the counts the in-memory copy
/// keeps when it is ready and every shard is asked for, else counted from
/// the copy (ready) or sled (while it is built).
fn count_waiting(tree: &sled::Db, pending: &pending::Pending, shards: Shards) -> Result<Waiting> {
    let mut active = std::collections::HashSet::new();
    for key in tree.scan_prefix([keys::ACTIVE]).keys() {
        let key = key?;
        if key.get(16).is_some_and(|shard| shards.contains(*shard)) {
            active.insert(key[1..].to_vec());
        }
    }
    if shards.is_all() {
        if let Some(waiting) = pending.waiting(&active) {
            return Ok(waiting);
        }
    }
    let mut by_tool = std::collections::BTreeMap::<String, (u64, i64)>::new();
    let mut waiting = 0;
    let mut last_run = Vec::new();
    let every = (vec![keys::APPROVAL], vec![keys::APPROVAL + 1]);
    each_approval(
        tree,
        Some(pending),
        every,
        false,
        COUNT_CHUNK,
        |key, value| {
            // Keys are `A ‖ run ‖ call`; a run id's last byte is its shard.
            if key.get(16).is_some_and(|shard| !shards.contains(*shard)) {
                return Ok(true);
            }
            let pending::Waits { tool, requested_ms } = decode(key, value)?;
            let tool = by_tool.entry(tool).or_insert((0, i64::MAX));
            tool.0 += 1;
            tool.1 = tool.1.min(requested_ms);
            // A run's approvals are together.
            let run = key.get(1..17).unwrap_or(key);
            if run != last_run.as_slice() {
                last_run = run.to_vec();
                if !active.contains(run) {
                    waiting += 1;
                }
            }
            Ok(true)
        },
    )?;
    Ok(Waiting {
        approvals_by_tool: by_tool
            .into_iter()
            .map(|(tool, (pending, oldest))| ToolWaiting {
                tool,
                pending,
                oldest_requested_ms: oldest,
            })
            .collect(),
        running: active.len() as u64,
        waiting,
    })
}

fn decode<T: Message + Default>(key: &[u8], value: &[u8]) -> Result<T> {
    T::decode(value).map_err(|e| corrupt(key, e))
}

/// Bytes of the files under `dir`, as far as they can be read.
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests;
