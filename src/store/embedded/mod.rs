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
//! Appends go through one committer thread (see [`committer`]): it gathers
//! the batches waiting, writes them to the log as one record and fdatasyncs
//! it, applies the index writes, then answers all of them. sled itself is
//! flushed and fsynced at checkpoints. Readers never see past the durable
//! position. The pending approvals are also copied into memory (see
//! [`pending`]), so reading all of them does not page sled's leaves.

mod committer;
mod compact;
mod keys;
mod log;
mod pending;
mod retention;
mod spans;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::watch;

use super::{
    ApprovalQuery, ApprovalRecord, DeadLetterRecord, EventRecord, GrantRecord, GrantUse,
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
    segments: Arc<log::Segments>,
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
}

/// The layout this version reads and writes. Version 1 kept events in sled
/// and had a `wal` file; version 2 had event pointers without their last
/// event's time (and rewrote the run summary on every append); version 3
/// had one pointer per span, written at every append, where version 4 has
/// lists written at checkpoints. Nothing converts any of them. Version 5
/// adds retention (expiry index entries, tombstones, dead bytes per
/// segment) and log entries that version 4 cannot read (a deleted run,
/// compaction's copies): a version 4 directory is upgraded in place at
/// open (its finished runs indexed), and an older aaa refuses a version 5
/// one by name instead of misreading its log.
const LAYOUT: &str = "5";
/// The layout this version upgrades to [`LAYOUT`] at open.
const UPGRADED: &str = "4";

/// Resolves once nobody holds the lock on `file` (or it cannot be read).
async fn unlocked(file: &Path) {
    let mut pause = Duration::from_millis(1);
    loop {
        let Ok(file) = std::fs::File::open(file) else {
            return;
        };
        if !matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)) {
            return;
        }
        drop(file);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How the store opens sled in `dir`.
fn sled_config(dir: &Path, cache_bytes: u64) -> sled::Config {
    sled::Config::new()
        .path(dir)
        // We flush ourselves, at the committer's checkpoints; sled's
        // background flusher would only add concurrent flushes (STACK.md,
        // trap 1).
        .flush_every_ms(None)
        .cache_capacity(cache_bytes)
        // Pages bigger than a quarter segment go to blob files that sled
        // never fsyncs. 8 MiB segments keep every page we write (records are
        // capped at 64 KiB of data, leaves split at 17 entries) in the main
        // file, which the committer does fsync.
        .segment_size(8 * 1024 * 1024)
}

/// The error for a data directory of another layout.
fn other_layout(version: &str) -> StoreError {
    StoreError::Format(format!(
        "the data directory has layout version {version}; this aaa reads version {LAYOUT} only (and upgrades version {UPGRADED}; start with an empty --data-dir)"
    ))
}

/// Refuses a database of another layout; marks a new one as ours.
fn check_format(tree: &sled::Db, dir: &Path) -> Result<()> {
    let name = keys::meta("format");
    match tree.get(&name)? {
        Some(format) if format == LAYOUT.as_bytes() => Ok(()),
        Some(format) if format == UPGRADED.as_bytes() => {
            // Made durable by the first checkpoint, after the backfill of
            // the retention index (which runs again if a crash comes first).
            tree.insert(&name, LAYOUT.as_bytes())?;
            Ok(())
        }
        Some(format) => Err(other_layout(&String::from_utf8_lossy(&format))),
        None if tree.first()?.is_some() || dir.join("wal").exists() => Err(other_layout("1")),
        None => {
            tree.insert(&name, LAYOUT.as_bytes())?;
            Ok(())
        }
    }
}

/// Reads the task-token key, or makes and stores one. Runs in `open`,
/// before the committer starts, so this flush cannot race another.
fn token_key(tree: &sled::Db, data_file: &std::fs::File) -> Result<[u8; 32]> {
    let name = keys::meta("token-key");
    if let Some(stored) = tree.get(&name)? {
        return stored
            .as_ref()
            .try_into()
            .map_err(|_| corrupt(&name, "token key is not 32 bytes"));
    }
    let key = crate::domain::random_key();
    tree.insert(&name, &key[..])?;
    tree.flush()?;
    data_file.sync_data()?;
    Ok(key)
}

impl EmbeddedStore {
    /// Opens (or creates) the database in `dir` and starts its committer.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<EmbeddedStore> {
        let segment = crate::config::DEFAULT_LOG_SEGMENT_KIB * 1024;
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
        let tree = sled_config(dir, cache_bytes).open()?;
        check_format(&tree, dir)?;
        // Before anything reads the tree: it may hold less than the log.
        let pending = Arc::new(pending::Pending::default());
        let opened = log::Log::open(&dir.join("log"), &tree, segment_bytes, &pending)?;
        if opened.replayed > 0 {
            tracing::info!("applied {} records of the log again", opened.replayed);
        }
        retention::backfill(&tree)?;
        pending.ready_if_none(&tree)?;
        let dead = retention::load_dead(&tree)?;
        let last_position = opened.next_position - 1;
        let data_file = std::fs::File::open(dir.join("db"))?;
        let token_key = token_key(&tree, &data_file)?;
        let (durable_tx, durable) = watch::channel(last_position);
        let durable_position = Arc::new(AtomicU64::new(last_position));
        let (commits, messages) = crate::store::queue::Queue::new();
        let (writable_tx, writable) = watch::channel(true);
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
            index_failed: None,
            metrics: metrics.clone(),
            reclaim: compact::Reclaim::new(dead),
            hold,
        };
        std::thread::Builder::new()
            .name("aaa-committer".into())
            .spawn(move || committer::run(committer, messages))?;
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
                Err(e) if log::is_retired(&e) && tries < 3 => tries += 1,
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
            .find(|e| e.actor_kind == crate::proto::ActorKind::Client as i32)
            .map(|e| e.actor_name)
            .unwrap_or_default())
    }

    /// Durable events after global position `after` (see
    /// [`super::Store::log_after`]).
    fn log_after_once(&self, after: u64, limit: usize) -> Result<Vec<EventRecord>> {
        let durable = self.inner.durable_position.load(Ordering::Acquire);
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
                if event.position <= after {
                    continue;
                }
                if event.position > durable || out.len() >= limit {
                    return Ok(out);
                }
                let live = match kept.get(&event.run_id) {
                    Some(&live) => live,
                    None => {
                        let run = RunId::from_slice(&event.run_id)
                            .ok_or_else(|| corrupt(&event.run_id, "bad run id"))?;
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

    async fn join(&self, _server: &str, _address: &str, _lease: std::time::Duration) -> Result<()> {
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
            unlocked(&locked).await
        })
    }

    fn token_key(&self) -> [u8; 32] {
        self.inner.token_key
    }

    fn watch_writable(&self) -> watch::Receiver<bool> {
        self.inner.writable.clone()
    }

    fn durable_position(&self) -> u64 {
        self.inner.durable_position.load(Ordering::Acquire)
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

    async fn log_after(&self, after: u64, limit: usize) -> Result<Vec<EventRecord>> {
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
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn released_waits_for_the_last_handle_and_for_the_lock() {
        use futures_util::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        let other = store.clone();
        let mut released = Box::pin(store.released().wait());
        store.close().await;
        drop(store);
        assert!((&mut released).now_or_never().is_none(), "a handle is left");
        drop(other);
        // Someone else's copy of the locked file, as sled's I/O threads may
        // keep one a moment after its last handle is gone.
        let straggler = std::fs::File::open(dir.path().join("db")).unwrap();
        let straggler = tokio::task::spawn_blocking(move || {
            straggler.lock().unwrap();
            straggler
        })
        .await
        .unwrap();
        for _ in 0..3 {
            tokio::task::yield_now().await;
            assert!(
                (&mut released).now_or_never().is_none(),
                "released while locked"
            );
        }
        drop(straggler);
        released.await;
        EmbeddedStore::open(dir.path(), 1 << 20).expect("opens again");
    }

    #[test]
    fn a_data_dir_of_the_first_layout_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wal"), b"").unwrap();
        let error = EmbeddedStore::open(dir.path(), 1 << 20)
            .err()
            .expect("refused");
        assert!(matches!(error, StoreError::Format(_)), "{error}");
        assert!(error.to_string().contains("layout version 1"), "{error}");
    }

    #[test]
    fn data_dirs_of_the_second_and_third_layouts_are_refused_by_name() {
        for old in ["2", "3"] {
            let dir = tempfile::tempdir().unwrap();
            let tree = sled_config(dir.path(), 1 << 20).open().unwrap();
            tree.insert(keys::meta("format"), old.as_bytes()).unwrap();
            tree.flush().unwrap();
            drop(tree);
            let error = EmbeddedStore::open(dir.path(), 1 << 20)
                .err()
                .expect("refused");
            assert!(matches!(error, StoreError::Format(_)), "{error}");
            let expected = format!("layout version {old}; this aaa reads version {LAYOUT} only");
            assert!(error.to_string().contains(&expected), "{error}");
        }
    }

    /// A directory of layout 4 (before retention) is upgraded in place: its
    /// finished runs are indexed for retention, its running ones are not.
    #[tokio::test]
    async fn a_data_dir_of_layout_4_is_upgraded_and_its_finished_runs_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let (done, running) = (RunId::new(), RunId::new());
        {
            let tree = sled_config(dir.path(), 1 << 20).open().unwrap();
            tree.insert(keys::meta("format"), b"4").unwrap();
            for (run, status) in [(done, 3), (running, 2)] {
                let record = RunRecord {
                    run_id: run.as_bytes().to_vec(),
                    status,
                    updated_ms: 5_000,
                    ..Default::default()
                };
                tree.insert(keys::run_scoped(keys::RUN, run), record.encode_to_vec())
                    .unwrap();
            }
            tree.flush().unwrap();
        }
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        let format = store.inner.tree.get(keys::meta("format")).unwrap().unwrap();
        assert_eq!(&format[..], LAYOUT.as_bytes());
        assert_eq!(store.expired_runs(5_000, Some(0), 10).unwrap(), [done]);
        assert!(store.expired_runs(4_999, Some(0), 10).unwrap().is_empty());
        assert!(store.expired_runs(i64::MAX, None, 10).unwrap().is_empty());
        store.close().await;
    }

    /// A crash during a checkpoint leaves span lists in sled that the replay
    /// makes again and the next checkpoint writes again, longer; recent
    /// spans follow the lists. Every read sees each event once, in order.
    #[tokio::test]
    async fn reads_merge_overlapping_span_lists_and_recent_spans() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        let run = RunId::new();
        let append = |seq: u64| {
            let mut batch = WriteBatch::default();
            if seq == 1 {
                batch.put_run(&RunRecord {
                    run_id: run.as_bytes().to_vec(),
                    ..Default::default()
                });
            }
            batch.push_event(EventRecord {
                run_id: run.as_bytes().to_vec(),
                seq,
                event_type: "app.test".into(),
                time_ms: 1000 + seq as i64,
                ..Default::default()
            });
            store.commit(batch)
        };
        let (tree, recent) = (&store.inner.tree, &store.inner.recent);
        for seq in 1..=3 {
            append(seq).await.unwrap();
        }
        let written = recent.of(run);
        recent.write_out(tree).unwrap();
        // The replay after the crash: the same spans again, then more.
        recent.add(&written.iter().map(|&s| (run, s)).collect::<Vec<_>>());
        append(4).await.unwrap();
        recent.write_out(tree).unwrap();
        append(5).await.unwrap();
        assert_eq!(
            tree.scan_prefix(keys::run_scoped(keys::EVENT, run)).count(),
            2
        );
        assert_eq!(recent.of(run).len(), 1);

        let seqs = |events: Vec<EventRecord>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
        let all = store.run_events(run, 0, usize::MAX).await.unwrap();
        assert_eq!(seqs(all), [1, 2, 3, 4, 5]);
        assert_eq!(seqs(store.run_events(run, 2, 10).await.unwrap()), [3, 4, 5]);
        assert_eq!(seqs(store.run_events(run, 0, 2).await.unwrap()), [1, 2]);
        for seq in 1..=5 {
            assert_eq!(store.event(run, seq).await.unwrap().unwrap().seq, seq);
        }
        assert!(store.event(run, 6).await.unwrap().is_none());
        let head = store.run(run).await.unwrap().unwrap();
        assert_eq!((head.last_seq, head.updated_ms), (5, 1005));
        recent.write_out(tree).unwrap();
        let head = store.run(run).await.unwrap().unwrap();
        assert_eq!((head.last_seq, head.updated_ms), (5, 1005));
        assert_eq!(seqs(store.run_events(run, 3, 10).await.unwrap()), [4, 5]);
        store.close().await;
    }

    /// A run's events, one per commit and interleaved with another run's,
    /// are read back whole and in order when reads take many spans at once,
    /// also where the spans cross from one log segment to the next.
    #[tokio::test]
    async fn reads_of_many_spans_cross_segments_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = crate::metrics::Metrics::new();
        let store =
            EmbeddedStore::open_with(dir.path(), 1 << 20, 64 * 1024, &metrics, None).unwrap();
        let (long, other) = (RunId::new(), RunId::new());
        let event = |run: RunId, seq: u64| EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            event_type: "app.test".into(),
            data_json: format!(r#"{{"pad":"{}"}}"#, "x".repeat(200)),
            ..Default::default()
        };
        for seq in 1..=600 {
            for run in [long, other] {
                let mut batch = WriteBatch::default();
                batch.push_event(event(run, seq));
                store.commit(batch).await.unwrap();
            }
        }
        assert!(
            store.inner.segments.segment_of(200 * 1024).is_some(),
            "several segments"
        );
        let seqs = |events: Vec<EventRecord>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
        let all = store.run_events(long, 0, usize::MAX).await.unwrap();
        assert!(all.iter().all(|e| e.run_id == long.as_bytes()));
        assert_eq!(seqs(all), (1..=600).collect::<Vec<_>>());
        let page = store.run_events(long, 250, 256).await.unwrap();
        assert_eq!(seqs(page), (251..=506).collect::<Vec<_>>());
        store.inner.recent.write_out(&store.inner.tree).unwrap();
        let tail = store.run_events(long, 590, 256).await.unwrap();
        assert_eq!(seqs(tail), (591..=600).collect::<Vec<_>>());
        store.close().await;
    }

    /// A batch expecting a run's last seq that another writer moved is
    /// refused whole, also within one round, and the history never forks.
    #[tokio::test]
    async fn a_batch_behind_the_runs_head_is_refused_as_a_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        let run = RunId::new();
        let event = |seq: u64, text: &str| EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            event_type: "app.test".into(),
            data_json: format!(r#"{{"by":"{text}"}}"#),
            ..Default::default()
        };
        let batch = |seq: u64, text: &str| {
            let mut batch = WriteBatch::default();
            batch.push_event(event(seq, text));
            batch.put_tool(text, Vec::new());
            batch
        };
        store.commit(batch(1, "first")).await.unwrap();
        // Two writers both append seq 2, in one round: one wins.
        let (a, b) = tokio::join!(store.commit(batch(2, "a")), store.commit(batch(2, "b")));
        let (won, lost) = match (&a, &b) {
            (Ok(_), Err(e)) => ("a", e),
            (Err(e), Ok(_)) => ("b", e),
            other => panic!("expected one conflict, got {other:?}"),
        };
        assert!(
            matches!(lost, StoreError::Conflict { run: r, expected: 1, actual: 2 } if *r == run),
            "{lost}"
        );
        // A writer far behind, or ahead, is refused too.
        for seq in [1, 4] {
            let error = store.commit(batch(seq, "late")).await.unwrap_err();
            assert!(matches!(error, StoreError::Conflict { .. }), "{error}");
        }
        let events = store.run_events(run, 0, usize::MAX).await.unwrap();
        let data: Vec<&str> = events.iter().map(|e| e.data_json.as_str()).collect();
        assert_eq!(data, [r#"{"by":"first"}"#, &format!(r#"{{"by":"{won}"}}"#)]);
        // Nothing of a refused batch was written: not its index writes either.
        let tools: Vec<String> = store
            .list_tools()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.0)
            .collect();
        let mut expected = vec!["first", won];
        expected.sort();
        assert_eq!(tools, expected);
        store.close().await;
    }

    /// A copy of `from` into `to`, taken while a store runs on `from`: what
    /// its disk holds after a kill -9 at that point (the page cache survives
    /// a process, and only the committer writes, between commits).
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }

    /// Every page of `query` (3 at a time), read as the store reads, or
    /// from sled.
    async fn all_pages(store: &EmbeddedStore, query: &ApprovalQuery, sled: bool) -> Vec<String> {
        let mut query = ApprovalQuery {
            limit: 3,
            ..query.clone()
        };
        let mut out = Vec::new();
        loop {
            let page = if sled {
                store.select_approvals(&query, None).unwrap()
            } else {
                store.approvals(&query).await.unwrap()
            };
            let Some(last) = page.last() else {
                return out;
            };
            query.after = Some((
                RunId::from_slice(&last.run_id).unwrap(),
                last.call_id.clone(),
            ));
            out.extend(page.iter().map(|a| format!("{:?}", a)));
        }
    }

    /// Answers from the copy in memory and from sled, for queries across
    /// runs, of one run and of one tool, both ways; they must agree.
    async fn approvals_read_both_ways(store: &EmbeddedStore, one_run: RunId) -> Vec<Vec<String>> {
        let mut answers = Vec::new();
        for newest_first in [false, true] {
            for (run, tool) in [(None, ""), (Some(one_run), ""), (None, "b")] {
                let query = ApprovalQuery {
                    newest_first,
                    run,
                    tool: tool.into(),
                    limit: 3,
                    ..Default::default()
                };
                let memory = all_pages(store, &query, false).await;
                let sled = all_pages(store, &query, true).await;
                assert_eq!(memory, sled, "{query:?}");
                answers.push(memory);
            }
        }
        answers
    }

    /// The pending approvals in memory answer as sled does after commits
    /// that add, rewrite and delete approvals and after retention deletes
    /// a run's; after a kill -9, the copy built from sled again holds the
    /// same.
    #[tokio::test]
    async fn pending_approvals_in_memory_answer_as_sled_does_and_after_kill_9() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            store.inner.pending.phase(),
            pending::Phase::Ready,
            "empty at open"
        );
        let runs: Vec<RunId> = (0..20).map(|_| RunId::new()).collect();
        let approval = |run: RunId, call: &str, tool: &str| ApprovalRecord {
            run_id: run.as_bytes().to_vec(),
            call_id: call.into(),
            tool: tool.into(),
            arguments_json: "{}".into(),
            ..Default::default()
        };
        let mut batch = WriteBatch::default();
        for (i, run) in runs.iter().enumerate() {
            batch.put_approval(&approval(*run, "c1", ["a", "b"][i % 2]));
            if i % 3 == 0 {
                batch.put_approval(&approval(*run, "c2", "b"));
            }
        }
        store.commit(batch).await.unwrap();
        let mut batch = WriteBatch::default();
        batch.put_approval(&ApprovalRecord {
            arguments_json: r#"{"edited":1}"#.into(),
            ..approval(runs[0], "c1", "a")
        });
        batch.delete_approval(runs[1], "c1");
        let finished = runs[3];
        batch.put_run(&RunRecord {
            run_id: finished.as_bytes().to_vec(),
            status: 3,
            updated_ms: 1_000,
            ..Default::default()
        });
        store.commit(batch).await.unwrap();
        let mut batch = WriteBatch::default();
        batch.expire_run(finished, 2_000, 3_000);
        store.commit(batch).await.unwrap();

        let before = approvals_read_both_ways(&store, runs[0]).await;
        let all = &before[0];
        assert_eq!(all.len(), 20 - 2 + 7 - 1, "{all:?}");
        assert!(all.iter().any(|a| a.contains("edited")));
        assert!(store.run_approvals(finished).await.unwrap().is_empty());

        let crashed = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), crashed.path());
        store.close().await;
        let store = EmbeddedStore::open(crashed.path(), 1 << 20).unwrap();
        assert_eq!(store.inner.pending.phase(), pending::Phase::Off);
        assert!(store.inner.pending.start_build());
        pending::build(&store.inner.tree, &store.inner.pending).unwrap();
        assert_eq!(store.inner.pending.phase(), pending::Phase::Ready);
        assert_eq!(approvals_read_both_ways(&store, runs[0]).await, before);
        store.close().await;
    }

    /// What waits is counted the same from sled and from the copy in
    /// memory (read in chunks), per tool, with the oldest request, runs
    /// at work apart, and only in the shards asked for.
    #[tokio::test]
    async fn what_waits_is_counted_alike_from_sled_and_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        let mut batch = WriteBatch::default();
        // More approvals than a chunk, over runs of two shards; the runs of
        // shard 1 are at work.
        let mut runs = Vec::new();
        for n in 0..(COUNT_CHUNK as i64 + 100) {
            let run = RunId::new_in_shard((n % 2) as u8);
            runs.push(run);
            for call in ["c1", "c2"] {
                batch.put_approval(&ApprovalRecord {
                    run_id: run.as_bytes().to_vec(),
                    call_id: call.into(),
                    tool: if n % 3 == 0 { "wire" } else { "email" }.into(),
                    requested_ms: 1_000 + n,
                    ..Default::default()
                });
            }
            batch.set_active(run, n % 2 == 1);
        }
        store.commit(batch).await.unwrap();
        store.close().await;
        drop(store);
        // Reopened, the copy is off until a query builds it.
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.inner.pending.phase(), pending::Phase::Off);
        let count =
            |shards| count_waiting(&store.inner.tree, &store.inner.pending, shards).unwrap();
        let from_sled = count(Shards::all());
        let mut shard_0 = Shards::none();
        shard_0.insert(0);
        let shard_0_from_sled = count(shard_0);
        assert!(store.inner.pending.start_build());
        pending::build(&store.inner.tree, &store.inner.pending).unwrap();
        assert_eq!(store.inner.pending.phase(), pending::Phase::Ready);
        assert_eq!(count(Shards::all()), from_sled);
        assert_eq!(count(shard_0), shard_0_from_sled);

        let runs = runs.len() as u64;
        let tool = |name: &str, pending: u64, oldest| ToolWaiting {
            tool: name.into(),
            pending,
            oldest_requested_ms: oldest,
        };
        let thirds = runs.div_ceil(3);
        assert_eq!(
            from_sled,
            Waiting {
                approvals_by_tool: vec![
                    tool("email", 2 * (runs - thirds), 1_001),
                    tool("wire", 2 * thirds, 1_000)
                ],
                running: runs / 2,
                waiting: runs.div_ceil(2),
            }
        );
        assert_eq!(shard_0_from_sled.running, 0);
        assert_eq!(shard_0_from_sled.waiting, runs.div_ceil(2));
        store.close().await;
    }

    /// The counts the ready copy keeps follow every write: each step's
    /// counts equal a fresh count from sled.
    #[tokio::test]
    async fn what_waits_is_kept_counted_as_approvals_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
        // An empty store is ready at once, with its counts.
        assert_eq!(store.inner.pending.phase(), pending::Phase::Ready);
        let approval = |run: RunId, call: &str, tool: &str, requested_ms| ApprovalRecord {
            run_id: run.as_bytes().to_vec(),
            call_id: call.into(),
            tool: tool.into(),
            requested_ms,
            ..Default::default()
        };
        let (a, b, c) = (RunId::new(), RunId::new(), RunId::new());
        let batch = |write: &dyn Fn(&mut WriteBatch)| {
            let mut batch = WriteBatch::default();
            write(&mut batch);
            batch
        };
        let steps = [
            batch(&|w| w.put_approval(&approval(a, "c1", "wire", 30))),
            batch(&|w| w.put_approval(&approval(a, "c2", "wire", 10))),
            batch(&|w| w.put_approval(&approval(b, "c1", "email", 20))),
            // The oldest goes: the next oldest of its tool shows.
            batch(&|w| w.delete_approval(a, "c2")),
            // A rewrite that moves a call to another tool and time.
            batch(&|w| w.put_approval(&approval(a, "c1", "email", 5))),
            // A run at work counts as running, whatever it has pending.
            batch(&|w| {
                w.put_approval(&approval(c, "c1", "wire", 40));
                w.set_active(c, true);
            }),
            batch(&|w| w.set_active(c, false)),
            // A run's last approval goes: it no longer waits; the tool with
            // none left is not listed.
            batch(&|w| w.delete_approval(b, "c1")),
            batch(&|w| {
                w.delete_approval(a, "c1");
                w.delete_approval(c, "c1");
            }),
        ];
        for (n, batch) in steps.into_iter().enumerate() {
            store.commit(batch).await.unwrap();
            let counted = store.inner.pending.waiting(&Default::default());
            assert!(counted.is_some(), "the copy keeps its counts at step {n}");
            let kept = count_waiting(&store.inner.tree, &store.inner.pending, Shards::all());
            let off = pending::Pending::default();
            let scanned = count_waiting(&store.inner.tree, &off, Shards::all());
            assert_eq!(kept.unwrap(), scanned.unwrap(), "after step {n}");
        }
        let last = count_waiting(&store.inner.tree, &store.inner.pending, Shards::all()).unwrap();
        assert_eq!(last, Waiting::default());
        store.close().await;
    }
}
