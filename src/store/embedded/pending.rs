//! The pending approvals in memory: a copy of sled's `A ‖ run ‖ call`
//! entries, so that reading all of them (a WatchApprovals snapshot,
//! ListApprovals across runs) walks memory instead of paging every sled
//! leaf in and out of sled's cache. A million approvals do not fit that
//! cache, and a scan larger than an LRU cache reads each leaf from the
//! file (docs/performance.md, Scale).
//!
//! sled stays the durable home; this copy only follows it. Every put and
//! delete of an approval goes through `record::apply_entries` (commits, the
//! replay at open, compaction's rounds, retention's deletions), which
//! writes sled first and then this copy. At open the copy is empty and
//! off; the first query across runs builds it from sled on a thread of its
//! own (queries read sled until it is ready), so a restart does not wait
//! for a million records. The committer goes on meanwhile: what it writes
//! wins over what the build read, and a delete leaves a mark until the
//! build ends, so a value the build read before the delete is not
//! revived.
//!
//! Its memory is bounded: past `max_bytes` the copy is dropped and
//! queries read sled until the next start.
//!
//! While ready, it also keeps the counts of what waits (per tool, with
//! the oldest request, and how many runs have any), changed with each
//! write, so that `/metrics` does not walk a million approvals per scrape.

use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use prost::Message;

use super::keys;
use crate::store::{ToolWaiting, Waiting};

/// The default bound: about 1.7 million approvals of the size the bench
/// parks (about 300 bytes each with the map's own).
pub const MAX_BYTES: usize = 512 << 20;
/// What an entry costs beyond its key and value bytes (two boxes in a
/// B-tree node, and the allocator's rounding), as counted against the bound.
const ENTRY_OVERHEAD: usize = 48;

/// A key and its value, as sled holds them.
pub type Entry = (Box<[u8]>, Box<[u8]>);

pub struct Pending {
    state: Mutex<State>,
    max_bytes: usize,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending::new(MAX_BYTES)
    }
}

#[derive(Default)]
struct State {
    phase: Phase,
    /// `None`: deleted while the build runs (see the module docs).
    entries: BTreeMap<Box<[u8]>, Option<Box<[u8]>>>,
    bytes: usize,
    /// The counts of `entries` (their values, not deletion marks), kept
    /// from a build's start; `None` before, and for good if an entry could
    /// not be decoded (the counts then scan, and say so).
    tally: Option<Tally>,
}

/// What a pending approval's counts need of it; the record's other fields
/// are skipped, not decoded.
#[derive(Clone, PartialEq, Message)]
pub struct Waits {
    #[prost(string, tag = "3")]
    pub tool: String,
    #[prost(int64, tag = "6")]
    pub requested_ms: i64,
}

/// The counts of the copy's approvals.
#[derive(Default, Debug, PartialEq)]
struct Tally {
    /// Per tool: how many, and how many per request time (for the oldest).
    by_tool: BTreeMap<String, (u64, BTreeMap<i64, u64>)>,
    /// Runs with at least one.
    runs: u64,
    /// Request times held over all tools, counted against the bound.
    times: usize,
}

/// What a request time in the counts costs, as counted against the bound.
const TIME_ENTRY_OVERHEAD: usize = 32;

impl Tally {
    fn add(&mut self, waits: &Waits) {
        if !self.by_tool.contains_key(&waits.tool) {
            self.by_tool.insert(waits.tool.clone(), Default::default());
        }
        let (count, by_time) = self.by_tool.get_mut(&waits.tool).expect("inserted");
        *count += 1;
        let at = by_time.entry(waits.requested_ms).or_default();
        if *at == 0 {
            self.times += 1;
        }
        *at += 1;
    }

    fn remove(&mut self, waits: &Waits) {
        let Some((count, by_time)) = self.by_tool.get_mut(&waits.tool) else {
            return;
        };
        *count -= 1;
        if let Some(at) = by_time.get_mut(&waits.requested_ms) {
            *at -= 1;
            if *at == 0 {
                by_time.remove(&waits.requested_ms);
                self.times -= 1;
            }
        }
        if *count == 0 {
            self.by_tool.remove(&waits.tool);
        }
    }
}

/// `A ‖ run` of an approval's key `A ‖ run ‖ call`.
fn run_prefix(key: &[u8]) -> &[u8] {
    &key[..key.len().min(17)]
}

#[derive(Default, Clone, Copy, PartialEq, Debug)]
pub enum Phase {
    /// Not built: writes are not followed, queries read sled.
    #[default]
    Off,
    /// Being built from sled: writes are followed, queries read sled.
    Building,
    /// Equal to sled's entries: queries read it.
    Ready,
    /// Dropped for its size: off until the next start.
    TooBig,
}

impl State {
    fn set(&mut self, key: &[u8], value: Option<&[u8]>) {
        let added = value.map_or(0, |v| key.len() + v.len() + ENTRY_OVERHEAD);
        let old = self.entries.insert(key.into(), value.map(Into::into));
        if let Some(Some(old)) = &old {
            self.bytes -= key.len() + old.len() + ENTRY_OVERHEAD;
        }
        self.bytes += added;
        self.recount(key, old.flatten().as_deref(), value);
    }

    /// Removes `key` (ready: no deletion marks to leave).
    fn remove(&mut self, key: &[u8]) {
        let Some(Some(old)) = self.entries.remove(key) else {
            return;
        };
        self.bytes -= key.len() + old.len() + ENTRY_OVERHEAD;
        self.recount(key, Some(&old), None);
    }

    /// Whether the copy holds an approval of the run whose `A ‖ run` is
    /// `prefix`, other than `except`.
    fn holds_run(&self, prefix: &[u8], except: &[u8]) -> bool {
        self.entries
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .any(|(k, v)| k.as_ref() != except && v.is_some())
    }

    /// Moves `key` in the counts from `old` to `new` (either `None`: it
    /// was not there, or is not any more), once `entries` holds `new`.
    fn recount(&mut self, key: &[u8], old: Option<&[u8]>, new: Option<&[u8]>) {
        if self.tally.is_none() {
            return;
        }
        let others = self.holds_run(run_prefix(key), key);
        let decoded = |value: Option<&[u8]>| value.map(Waits::decode).transpose();
        let (Ok(old), Ok(new)) = (decoded(old), decoded(new)) else {
            tracing::warn!(
                "pending approvals: cannot decode {}; counting them scans from now on",
                hex::encode(key)
            );
            self.tally = None;
            return;
        };
        let tally = self.tally.as_mut().expect("counted");
        if let Some(old) = &old {
            tally.remove(old);
        }
        if let Some(new) = &new {
            tally.add(new);
        }
        match (others || old.is_some(), others || new.is_some()) {
            (false, true) => tally.runs += 1,
            (true, false) => tally.runs -= 1,
            _ => {}
        }
    }

    /// What the build read from sled: kept unless the committer wrote the
    /// key since the build began (its write is newer).
    fn fill_in(&mut self, key: &[u8], value: &[u8]) {
        if !self.entries.contains_key(key) {
            self.set(key, Some(value));
        }
    }

    /// Past `max_bytes`, drops the copy for good: true then.
    fn dropped_over(&mut self, max_bytes: usize) -> bool {
        let counts = self
            .tally
            .as_ref()
            .map_or(0, |t| t.times * TIME_ENTRY_OVERHEAD);
        if self.bytes + counts <= max_bytes {
            return false;
        }
        tracing::info!(
            "pending approvals: over {max_bytes} bytes in memory, read from sled from now on"
        );
        self.drop_all(Phase::TooBig);
        true
    }

    fn drop_all(&mut self, phase: Phase) {
        self.entries = BTreeMap::new();
        self.bytes = 0;
        self.tally = None;
        self.phase = phase;
    }

    /// The counts are kept from the build's start (deletion marks count as
    /// absent), so they hold already.
    fn make_ready(&mut self) {
        self.entries.retain(|_, value| value.is_some());
        self.phase = Phase::Ready;
    }
}

impl Pending {
    pub fn new(max_bytes: usize) -> Pending {
        Pending {
            state: Mutex::new(State::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("pending approvals lock")
    }

    #[cfg(test)]
    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// sled's write of `key`, just applied: `None` for a delete. Keys other
    /// than approvals' are not ours.
    pub fn applied(&self, key: &[u8], value: Option<&[u8]>) {
        if key.first() != Some(&keys::APPROVAL) {
            return;
        }
        let mut state = self.lock();
        match (state.phase, value) {
            (Phase::Off | Phase::TooBig, _) => {}
            (Phase::Ready, None) => state.remove(key),
            (Phase::Building | Phase::Ready, value) => {
                state.set(key, value);
                state.dropped_over(self.max_bytes);
            }
        }
    }

    /// Marks an empty copy of an empty set ready (a store with no
    /// approvals, at open, before the committer starts).
    pub fn ready_if_none(&self, tree: &sled::Db) -> sled::Result<()> {
        if tree
            .scan_prefix([keys::APPROVAL])
            .next()
            .transpose()?
            .is_none()
        {
            let mut state = self.lock();
            if state.phase == Phase::Off {
                state.tally = Some(Tally::default());
                state.make_ready();
            }
        }
        Ok(())
    }

    /// Builds the copy on a thread of its own, unless one has been built or
    /// is being built. If the thread cannot start, the copy stays off and
    /// a later call tries again.
    pub fn build_in_background(self: &Arc<Self>, tree: &sled::Db) -> std::io::Result<()> {
        if !self.start_build() {
            return Ok(());
        }
        let (tree, pending) = (tree.clone(), self.clone());
        let spawned = std::thread::Builder::new()
            .name("aaa-approvals".into())
            .spawn(move || {
                if let Err(e) = build(&tree, &pending) {
                    tracing::warn!("pending approvals: cannot copy them into memory: {e}");
                }
            });
        if spawned.is_err() {
            self.abandon_build();
        }
        spawned.map(drop)
    }

    /// Starts a build if none has; true when the caller is to run it
    /// ([`build`]).
    pub fn start_build(&self) -> bool {
        let mut state = self.lock();
        if state.phase != Phase::Off {
            return false;
        }
        state.phase = Phase::Building;
        state.tally = Some(Tally::default());
        true
    }

    /// Ends a build that could not start: the copy is off again.
    fn abandon_build(&self) {
        let mut state = self.lock();
        if state.phase == Phase::Building {
            state.drop_all(Phase::Off);
        }
    }

    /// What waits, from the counts kept (`None` while the copy is not
    /// ready or cannot count): `active` are the runs at work (their ids),
    /// which count as running, not waiting, whatever approvals they have.
    pub fn waiting(&self, active: &HashSet<Vec<u8>>) -> Option<Waiting> {
        let state = self.lock();
        let tally = state
            .tally
            .as_ref()
            .filter(|_| state.phase == Phase::Ready)?;
        let active_with_approvals = active
            .iter()
            .filter(|run| state.holds_run(&[&[keys::APPROVAL], run.as_slice()].concat(), &[]))
            .count() as u64;
        Some(Waiting {
            approvals_by_tool: tally
                .by_tool
                .iter()
                .map(|(tool, (pending, by_time))| ToolWaiting {
                    tool: tool.clone(),
                    pending: *pending,
                    oldest_requested_ms: by_time.keys().next().copied().unwrap_or(i64::MAX),
                })
                .collect(),
            running: active.len() as u64,
            waiting: tally.runs - active_with_approvals,
        })
    }

    /// Up to `most` entries with keys in `[low, high)`, in key order or
    /// reversed; `None` while the copy is not ready.
    pub fn range(&self, low: &[u8], high: &[u8], reverse: bool, most: usize) -> Option<Vec<Entry>> {
        let state = self.lock();
        if state.phase != Phase::Ready {
            return None;
        }
        if low >= high {
            return Some(Vec::new());
        }
        let range = state
            .entries
            .range::<[u8], _>((Bound::Included(low), Bound::Excluded(high)));
        // Deletion marks exist only while building, never when ready.
        let entries: Vec<Entry> = if reverse {
            range
                .rev()
                .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                .take(most)
                .collect()
        } else {
            range
                .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                .take(most)
                .collect()
        };
        Some(entries)
    }
}

/// Entries read from sled per turn of the lock while building.
const BUILD_CHUNK: usize = 1024;

/// Fills `pending` (in [`Phase::Building`]) from sled's approvals and
/// makes it ready. On an error it is dropped and off again, so that a
/// later query starts another build.
pub fn build(tree: &sled::Db, pending: &Pending) -> sled::Result<()> {
    let filled = fill(tree, pending);
    let mut state = pending.lock();
    if state.phase != Phase::Building {
        // Dropped for its size meanwhile.
        return filled;
    }
    match filled {
        Ok(()) => state.make_ready(),
        Err(_) => state.drop_all(Phase::Off),
    }
    filled
}

fn fill(tree: &sled::Db, pending: &Pending) -> sled::Result<()> {
    let mut chunk = Vec::with_capacity(BUILD_CHUNK);
    let mut scan = tree.scan_prefix([keys::APPROVAL]);
    loop {
        chunk.clear();
        for entry in scan.by_ref().take(BUILD_CHUNK) {
            chunk.push(entry?);
        }
        let mut state = pending.lock();
        if state.phase != Phase::Building {
            return Ok(());
        }
        for (key, value) in &chunk {
            state.fill_in(key, value);
        }
        if state.dropped_over(pending.max_bytes) {
            return Ok(());
        }
        if chunk.len() < BUILD_CHUNK {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Vec<u8> {
        vec![keys::APPROVAL, n]
    }

    fn scratch() -> sled::Db {
        sled::Config::new().temporary(true).open().unwrap()
    }

    fn all(pending: &Pending) -> Vec<(Vec<u8>, Vec<u8>)> {
        let low = [keys::APPROVAL];
        let high = [keys::APPROVAL + 1];
        let entries = pending.range(&low, &high, false, usize::MAX).unwrap();
        entries
            .into_iter()
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect()
    }

    #[test]
    fn writes_during_a_build_win_over_what_it_read() {
        let tree = scratch();
        for n in 1..=3 {
            tree.insert(key(n), vec![n]).unwrap();
        }
        tree.insert([b'Z', 1], &b"not an approval"[..]).unwrap();
        let pending = Pending::default();
        assert!(pending.start_build());
        assert!(!pending.start_build(), "one build at a time");
        // The committer, between the build's read of sled and its fill:
        // 1 deleted, 2 rewritten, 4 added (sled first, then the copy).
        tree.remove(key(1)).unwrap();
        pending.applied(&key(1), None);
        tree.insert(key(2), vec![20]).unwrap();
        pending.applied(&key(2), Some(&[20]));
        tree.insert(key(4), vec![4]).unwrap();
        pending.applied(&key(4), Some(&[4]));
        // A build that read sled before those writes fills in the old values.
        {
            let mut state = pending.lock();
            for (k, v) in [(key(1), vec![1]), (key(2), vec![2]), (key(3), vec![3])] {
                state.fill_in(&k, &v);
            }
        }
        assert!(
            pending.range(&[0], &[255], false, 10).is_none(),
            "not ready yet"
        );
        build(&tree, &pending).unwrap();
        assert_eq!(pending.phase(), Phase::Ready);
        let expected = vec![(key(2), vec![20]), (key(3), vec![3]), (key(4), vec![4])];
        assert_eq!(all(&pending), expected);
        // Then it follows sled.
        pending.applied(&key(3), None);
        pending.applied(&[b'Z', 2], Some(b"ignored"));
        assert_eq!(all(&pending), vec![(key(2), vec![20]), (key(4), vec![4])]);
        let reversed = pending.range(&key(0), &key(9), true, 1).unwrap();
        assert_eq!(reversed, vec![(key(4).into(), vec![4].into())]);
    }

    #[test]
    fn writes_before_a_build_are_not_followed() {
        let pending = Pending::default();
        pending.applied(&key(1), Some(&[1]));
        assert_eq!(pending.phase(), Phase::Off);
        assert!(pending.range(&[0], &[255], false, 10).is_none());
    }

    #[test]
    fn an_empty_store_is_ready_at_once_and_a_full_one_is_not() {
        let tree = scratch();
        let pending = Pending::default();
        pending.ready_if_none(&tree).unwrap();
        assert_eq!(pending.phase(), Phase::Ready);
        tree.insert(key(1), vec![1]).unwrap();
        let pending = Pending::default();
        pending.ready_if_none(&tree).unwrap();
        assert_eq!(pending.phase(), Phase::Off);
    }

    /// The counts are kept from the build's start: what a write during
    /// the build deleted or replaced is not counted, a rewrite counts once.
    #[test]
    fn writes_during_a_build_are_counted_as_they_win() {
        let waits = |tool: &str, requested_ms: i64| {
            Waits {
                tool: tool.into(),
                requested_ms,
            }
            .encode_to_vec()
        };
        let pending = Pending::default();
        assert!(pending.start_build());
        pending.applied(&key(1), None);
        pending.applied(&key(2), Some(&waits("email", 20)));
        {
            let mut state = pending.lock();
            state.fill_in(&key(1), &waits("wire", 10));
            state.fill_in(&key(2), &waits("wire", 11));
            state.fill_in(&key(3), &waits("wire", 30));
        }
        // A rewrite of what the build read replaces it in the counts.
        pending.applied(&key(3), Some(&waits("wire", 31)));
        assert!(pending.waiting(&HashSet::new()).is_none(), "not ready yet");
        build(&scratch(), &pending).unwrap();
        let counted = pending.waiting(&HashSet::new()).expect("ready and counted");
        let tool = |tool: &str, oldest_requested_ms| ToolWaiting {
            tool: tool.into(),
            pending: 1,
            oldest_requested_ms,
        };
        assert_eq!(
            counted,
            Waiting {
                approvals_by_tool: vec![tool("email", 20), tool("wire", 31)],
                running: 0,
                // These short keys are each a run of their own.
                waiting: 2,
            }
        );
    }

    #[test]
    fn the_counts_kept_count_against_the_bound() {
        let waits = |n: u8| {
            Waits {
                tool: "t".into(),
                requested_ms: i64::from(n),
            }
            .encode_to_vec()
        };
        let entry = 2 + waits(1).len() + ENTRY_OVERHEAD;
        // Room for three entries, and for the counts of two request times.
        let pending = Pending::new(3 * entry + 2 * TIME_ENTRY_OVERHEAD);
        pending.ready_if_none(&scratch()).unwrap();
        pending.applied(&key(1), Some(&waits(1)));
        pending.applied(&key(2), Some(&waits(2)));
        let counted = pending.waiting(&HashSet::new()).expect("ready and counted");
        // These short keys are each a run of their own.
        assert_eq!(
            (counted.approvals_by_tool[0].pending, counted.waiting),
            (2, 2)
        );
        assert_eq!(pending.phase(), Phase::Ready);
        pending.applied(&key(3), Some(&waits(3)));
        assert_eq!(
            pending.phase(),
            Phase::TooBig,
            "a third time is past the bound"
        );
    }

    #[test]
    fn past_its_bound_the_copy_is_dropped_for_good() {
        let tree = scratch();
        for n in 1..=3 {
            tree.insert(key(n), vec![0; 100]).unwrap();
        }
        let pending = Pending::new(2 * (2 + 100 + ENTRY_OVERHEAD));
        assert!(pending.start_build());
        build(&tree, &pending).unwrap();
        assert_eq!(pending.phase(), Phase::TooBig);
        assert!(pending.range(&[0], &[255], false, 10).is_none());
        assert!(!pending.start_build());

        let pending = Pending::new(2 * (2 + 100 + ENTRY_OVERHEAD));
        pending.ready_if_none(&scratch()).unwrap();
        pending.applied(&key(1), Some(&[0; 100]));
        pending.applied(&key(2), Some(&[0; 100]));
        assert_eq!(all(&pending).len(), 2);
        pending.applied(&key(3), Some(&[0; 100]));
        assert_eq!(pending.phase(), Phase::TooBig);
    }
}
