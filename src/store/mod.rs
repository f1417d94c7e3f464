//! The store: the only module that touches sled or the disk. It owns the
//! key layout, the records, and the group commit that makes an append
//! durable before anyone is told about it.
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
//! position.

mod committer;
mod groups;
mod keys;
mod log;
mod records;
mod spans;

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};

pub use groups::{DeadLetterRecord, GroupRecord};
pub use records::{ApprovalRecord, EventRecord, RunRecord};

/// A run's id: a time-ordered UUID (v7), so key order is start order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(uuid::Uuid);

impl RunId {
    /// A new id, later than every id minted before it by this process.
    pub fn new() -> Self {
        RunId(uuid::Uuid::now_v7())
    }

    /// Parses the hyphenated text form clients see.
    pub fn parse(text: &str) -> Option<Self> {
        uuid::Uuid::try_parse(text).ok().map(RunId)
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        uuid::Uuid::from_slice(bytes).ok().map(RunId)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Store failures. Any of them means the disk or the database is in trouble.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record under key {0:?}: {1}")]
    Corrupt(Vec<u8>, String),
    #[error("the store is closed")]
    Closed,
    /// A write failed (disk full, an I/O error) and nothing of it was
    /// written; the text names the cause.
    #[error("{0}")]
    Unavailable(String),
    #[error("the data directory has layout version {0}; this aaa reads version {LAYOUT} only (start with an empty --data-dir)")]
    Format(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// One atomic append: events of one run plus the index changes they imply.
/// Positions are assigned by the committer, in commit order.
#[derive(Default)]
pub struct WriteBatch {
    events: Vec<EventRecord>,
    ops: Vec<Op>,
}

enum Op {
    Put(Vec<u8>, Vec<u8>),
    /// Put, with the position of the batch's event `seq` appended as field
    /// [`records::STAMPED_POSITION_TAG`].
    PutStamped(Vec<u8>, Vec<u8>, u64),
    Delete(Vec<u8>),
}

impl WriteBatch {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.ops.is_empty()
    }

    /// Adds an event; its `position` is filled in at commit.
    pub fn push_event(&mut self, event: EventRecord) {
        self.events.push(event);
    }

    pub fn events(&self) -> &[EventRecord] {
        &self.events
    }

    pub fn put_run(&mut self, run: &RunRecord) {
        let id = RunId::from_slice(&run.run_id).expect("run record with a bad id");
        self.ops.push(Op::Put(
            keys::run_scoped(keys::RUN, id),
            run.encode_to_vec(),
        ));
    }

    /// Records a pending approval, stamped with the position of its event.
    pub fn put_approval(&mut self, approval: &ApprovalRecord) {
        let id = RunId::from_slice(&approval.run_id).expect("approval with a bad run id");
        self.ops.push(Op::PutStamped(
            keys::approval(id, &approval.call_id),
            approval.encode_to_vec(),
            approval.seq,
        ));
    }

    pub fn delete_approval(&mut self, run: RunId, call_id: &str) {
        self.ops.push(Op::Delete(keys::approval(run, call_id)));
    }

    /// Marks a run as having work to recover at startup (dispatchable or
    /// in-flight calls), or clears the mark.
    pub fn set_active(&mut self, run: RunId, active: bool) {
        let key = keys::run_scoped(keys::ACTIVE, run);
        self.ops.push(if active {
            Op::Put(key, Vec::new())
        } else {
            Op::Delete(key)
        });
    }

    pub fn put_timer(&mut self, due_ms: i64, run: RunId, name: &str) {
        self.ops
            .push(Op::Put(keys::timer(due_ms, run, name), Vec::new()));
    }

    pub fn delete_timer(&mut self, due_ms: i64, run: RunId, name: &str) {
        self.ops.push(Op::Delete(keys::timer(due_ms, run, name)));
    }

    pub fn put_tool(&mut self, name: &str, definition: Vec<u8>) {
        self.ops.push(Op::Put(keys::tool(name), definition));
    }

    /// Remembers the answer to an idempotent request.
    pub fn put_request(&mut self, scope: &[u8], request_id: &str, answer: Vec<u8>) {
        self.ops
            .push(Op::Put(keys::request(scope, request_id), answer));
    }
}

/// A due durable timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    pub due_ms: i64,
    pub run: RunId,
    pub name: String,
}

/// Handle to the store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    tree: sled::Db,
    segments: Arc<log::Segments>,
    recent: Arc<spans::Recent>,
    commits: mpsc::Sender<committer::Message>,
    durable: watch::Receiver<u64>,
    /// Mirrors `durable` for readers that do not need to wait.
    durable_position: Arc<AtomicU64>,
    /// False while writes are refused (see [`Store::watch_writable`]).
    writable: watch::Receiver<bool>,
    token_key: [u8; 32],
}

/// The layout this version reads and writes. Version 1 kept events in sled
/// and had a `wal` file; version 2 had event pointers without their last
/// event's time (and rewrote the run summary on every append); version 3
/// had one pointer per span, written at every append, where version 4 has
/// lists written at checkpoints. Nothing converts any of them.
const LAYOUT: &str = "4";

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

/// Refuses a database of another layout; marks a new one as ours.
fn check_format(tree: &sled::Db, dir: &Path) -> Result<()> {
    let name = keys::meta("format");
    match tree.get(&name)? {
        Some(format) if format == LAYOUT.as_bytes() => Ok(()),
        Some(format) => Err(StoreError::Format(String::from_utf8_lossy(&format).into())),
        None if tree.first()?.is_some() || dir.join("wal").exists() => {
            Err(StoreError::Format("1".into()))
        }
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
            .map_err(|_| StoreError::Corrupt(name.clone(), "token key is not 32 bytes".into()));
    }
    // Two random (v4) UUIDs: 244 bits from the thread's CSPRNG.
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    tree.insert(&name, &key[..])?;
    tree.flush()?;
    data_file.sync_data()?;
    Ok(key)
}

impl Store {
    /// Opens (or creates) the database in `dir` and starts its committer.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Store> {
        std::fs::create_dir_all(dir)?;
        let tree = sled_config(dir, cache_bytes).open()?;
        check_format(&tree, dir)?;
        // Before anything reads the tree: it may hold less than the log.
        let opened = log::Log::open(&dir.join("log"), &tree)?;
        if opened.replayed > 0 {
            tracing::info!("applied {} records of the log again", opened.replayed);
        }
        let last_position = opened.next_position - 1;
        let data_file = std::fs::File::open(dir.join("db"))?;
        let token_key = token_key(&tree, &data_file)?;
        let (durable_tx, durable) = watch::channel(last_position);
        let durable_position = Arc::new(AtomicU64::new(last_position));
        let (commits, messages) = mpsc::channel(4096);
        let (writable_tx, writable) = watch::channel(true);
        let committer = committer::Committer {
            tree: tree.clone(),
            data_file,
            log: opened.log,
            recent: opened.recent.clone(),
            checkpointed: opened.mark.offset,
            next_position: opened.next_position,
            durable: durable_tx,
            durable_position: durable_position.clone(),
            writable: writable_tx,
            index_failed: None,
        };
        std::thread::Builder::new()
            .name("aaa-committer".into())
            .spawn(move || committer::run(committer, messages))?;
        Ok(Store {
            inner: Arc::new(Inner {
                tree,
                segments: opened.segments,
                recent: opened.recent,
                commits,
                durable,
                durable_position,
                writable,
                token_key,
            }),
        })
    }

    /// The secret that signs task tokens, made at the database's first
    /// open and kept in it, so tokens stay valid across restarts.
    pub fn token_key(&self) -> &[u8; 32] {
        &self.inner.token_key
    }

    /// Appends the batch; returns once it is on disk, with the positions of
    /// its events.
    pub async fn commit(&self, batch: WriteBatch) -> Result<Vec<u64>> {
        let (reply, answer) = oneshot::channel();
        let request = committer::Request { batch, reply };
        self.inner
            .commits
            .send(committer::Message::Commit(request))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Lets the committer finish what it has, then stops it. Appends after
    /// this fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self
            .inner
            .commits
            .send(committer::Message::Close(done))
            .await
            .is_ok()
        {
            let _ = closed.await;
        }
    }

    /// True while the store takes writes; false after a write failed, until
    /// one succeeds again (health follows it).
    pub fn watch_writable(&self) -> watch::Receiver<bool> {
        self.inner.writable.clone()
    }

    /// The last position known to be on disk.
    pub fn durable_position(&self) -> u64 {
        self.inner.durable_position.load(Ordering::Acquire)
    }

    /// Changes whenever the durable position moves.
    pub fn watch_durable(&self) -> watch::Receiver<u64> {
        self.inner.durable.clone()
    }

    /// Events of `run` with seq > `after_seq`, at most `limit`, stopping at
    /// the first one not yet durable.
    pub fn run_events(&self, run: RunId, after_seq: u64, limit: usize) -> Result<Vec<EventRecord>> {
        let durable = self.durable_position();
        let mut out = Vec::new();
        for span in self.spans_from(run, after_seq.saturating_add(1)) {
            for event in self.inner.segments.events(span?)? {
                if event.seq <= after_seq {
                    continue;
                }
                if event.position > durable || out.len() >= limit {
                    return Ok(out);
                }
                out.push(event);
            }
        }
        Ok(out)
    }

    /// Every event of `run`, durable or not (the engine folds its own writes).
    pub fn all_run_events(&self, run: RunId) -> Result<Vec<EventRecord>> {
        let mut out = Vec::new();
        for span in self.spans_from(run, 1) {
            out.extend(self.inner.segments.events(span?)?);
        }
        Ok(out)
    }

    pub fn event(&self, run: RunId, seq: u64) -> Result<Option<EventRecord>> {
        match self.spans_from(run, seq).next() {
            Some(span) => Ok(self
                .inner
                .segments
                .events(span?)?
                .into_iter()
                .find(|e| e.seq == seq)),
            None => Ok(None),
        }
    }

    /// The run's spans in seq order, from the one that holds `seq` on: the
    /// lists in sled, then the recent spans. The recent ones are read first:
    /// a checkpoint that moves them to sled between the two reads leaves
    /// them in both, never in neither, and a span whose seqs were passed
    /// already is skipped.
    fn spans_from(&self, run: RunId, seq: u64) -> impl Iterator<Item = Result<spans::Span>> + '_ {
        let recent = self.inner.recent.of(run);
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

    /// Durable events of every run with positions after `after`, in
    /// position order, at most `limit`.
    pub fn log_after(&self, after: u64, limit: usize) -> Result<Vec<EventRecord>> {
        let durable = self.durable_position();
        let mut out = Vec::new();
        if after >= durable {
            return Ok(out);
        }
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
                .map_err(|_| StoreError::Corrupt(key.to_vec(), "bad log offset".into()))?;
            for event in self.inner.segments.record_events(offset)? {
                if event.position <= after {
                    continue;
                }
                if event.position > durable || out.len() >= limit {
                    return Ok(out);
                }
                out.push(event);
            }
        }
        Ok(out)
    }

    /// The run's summary. Its head (last seq and update time) comes from the
    /// run's newest span: the engine rewrites the stored summary only when
    /// the run's status changes, not for every appended event.
    pub fn run(&self, run: RunId) -> Result<Option<RunRecord>> {
        match self.run_start(run)? {
            Some(record) => self.with_head(record).map(Some),
            None => Ok(None),
        }
    }

    /// The summary as stored, one point read: exact for what the run
    /// started with (task, model, tools, labels, times), its head not
    /// filled in. For readers of labels on a hot path; [`Store::run`] for
    /// the rest.
    pub fn run_start(&self, run: RunId) -> Result<Option<RunRecord>> {
        self.get(&keys::run_scoped(keys::RUN, run))
    }

    fn with_head(&self, mut record: RunRecord) -> Result<RunRecord> {
        let run = RunId::from_slice(&record.run_id)
            .ok_or_else(|| StoreError::Corrupt(record.run_id.clone(), "bad run id".into()))?;
        let newest = match self.inner.recent.newest(run) {
            Some(span) => Some(span),
            None => {
                let start = keys::run_scoped(keys::EVENT, run);
                let end = keys::prefix_end(&start);
                match self.inner.tree.range(start..end).next_back() {
                    Some(entry) => {
                        let (key, value) = entry?;
                        spans::decode(&key, &value)?.last().copied()
                    }
                    None => None,
                }
            }
        };
        if let Some(span) = newest {
            record.last_seq = span.last_seq;
            record.updated_ms = span.last_time_ms;
        }
        Ok(record)
    }

    /// Run summaries, newest first, starting below `before` when given.
    pub fn runs_newest_first(
        &self,
        before: Option<RunId>,
    ) -> impl Iterator<Item = Result<RunRecord>> + '_ {
        let start = vec![keys::RUN];
        let end = match before {
            Some(run) => keys::run_scoped(keys::RUN, run),
            None => vec![keys::RUN + 1],
        };
        self.inner.tree.range(start..end).rev().map(|entry| {
            let (key, value) = entry?;
            self.with_head(decode(&key, &value)?)
        })
    }

    /// Pending approvals in (run, call) order, starting after the given pair.
    pub fn approvals_after(
        &self,
        after: Option<(RunId, &str)>,
    ) -> impl Iterator<Item = Result<ApprovalRecord>> + '_ {
        let start = match after {
            Some((run, call)) => {
                let mut k = keys::approval(run, call);
                k.push(0);
                k
            }
            None => vec![keys::APPROVAL],
        };
        self.inner
            .tree
            .range(start..vec![keys::APPROVAL + 1])
            .map(|entry| {
                let (key, value) = entry?;
                decode(&key, &value)
            })
    }

    /// Pending approvals of one run.
    pub fn run_approvals(&self, run: RunId) -> Result<Vec<ApprovalRecord>> {
        self.inner
            .tree
            .scan_prefix(keys::run_scoped(keys::APPROVAL, run))
            .map(|entry| {
                let (key, value) = entry?;
                decode(&key, &value)
            })
            .collect()
    }

    /// Runs marked active (see [`WriteBatch::set_active`]).
    pub fn active_runs(&self) -> Result<Vec<RunId>> {
        self.inner
            .tree
            .scan_prefix([keys::ACTIVE])
            .keys()
            .map(|key| {
                let key = key?;
                RunId::from_slice(&key[1..])
                    .ok_or_else(|| StoreError::Corrupt(key.to_vec(), "bad run id".into()))
            })
            .collect()
    }

    /// The earliest durable timer, if any.
    pub fn first_timer(&self) -> Result<Option<Timer>> {
        match self.inner.tree.scan_prefix([keys::TIMER]).keys().next() {
            None => Ok(None),
            Some(key) => {
                let key = key?;
                let (due_ms, run, name) = keys::parse_timer(&key)
                    .ok_or_else(|| StoreError::Corrupt(key.to_vec(), "bad timer key".into()))?;
                Ok(Some(Timer { due_ms, run, name }))
            }
        }
    }

    pub fn tool(&self, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.inner.tree.get(keys::tool(name))?.map(|v| v.to_vec()))
    }

    pub fn request(&self, scope: &[u8], request_id: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .inner
            .tree
            .get(keys::request(scope, request_id))?
            .map(|v| v.to_vec()))
    }

    fn get<T: Message + Default>(&self, key: &[u8]) -> Result<Option<T>> {
        match self.inner.tree.get(key)? {
            Some(value) => decode(key, &value).map(Some),
            None => Ok(None),
        }
    }
}

fn decode<T: Message + Default>(key: &[u8], value: &[u8]) -> Result<T> {
    T::decode(value).map_err(|e| StoreError::Corrupt(key.to_vec(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_of_the_first_layout_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wal"), b"").unwrap();
        let error = Store::open(dir.path(), 1 << 20).err().expect("refused");
        assert!(
            matches!(error, StoreError::Format(ref v) if v == "1"),
            "{error}"
        );
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
            let error = Store::open(dir.path(), 1 << 20).err().expect("refused");
            assert!(
                matches!(error, StoreError::Format(ref v) if v == old),
                "{error}"
            );
            let expected = format!("layout version {old}; this aaa reads version {LAYOUT} only");
            assert!(error.to_string().contains(&expected), "{error}");
        }
    }

    /// A crash during a checkpoint leaves span lists in sled that the replay
    /// makes again and the next checkpoint writes again, longer; recent
    /// spans follow the lists. Every read sees each event once, in order.
    #[tokio::test]
    async fn reads_merge_overlapping_span_lists_and_recent_spans() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
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
        assert_eq!(seqs(store.all_run_events(run).unwrap()), [1, 2, 3, 4, 5]);
        assert_eq!(seqs(store.run_events(run, 2, 10).unwrap()), [3, 4, 5]);
        assert_eq!(seqs(store.run_events(run, 0, 2).unwrap()), [1, 2]);
        for seq in 1..=5 {
            assert_eq!(store.event(run, seq).unwrap().unwrap().seq, seq);
        }
        assert!(store.event(run, 6).unwrap().is_none());
        let head = store.run(run).unwrap().unwrap();
        assert_eq!((head.last_seq, head.updated_ms), (5, 1005));
        recent.write_out(tree).unwrap();
        let head = store.run(run).unwrap().unwrap();
        assert_eq!((head.last_seq, head.updated_ms), (5, 1005));
        assert_eq!(seqs(store.run_events(run, 3, 10).unwrap()), [4, 5]);
        store.close().await;
    }
}
