//! The span index: where each run's events sit in the log.
//!
//! A span is a run's events with consecutive seqs in one log record. Spans
//! applied since the last checkpoint are kept in memory ([`Recent`]); a
//! checkpoint writes each run's recent spans to sled as one value under
//! `E ‖ run ‖ last seq`, a list of at most [`MAX_LIST`] spans, and forgets
//! them. So an append writes nothing to sled for its events: a sled insert
//! per run and round was most of a commit's CPU (store ceiling in `aaa
//! bench`: 81-85k appends/s with it, 151-166k without). A restart rebuilds
//! the recent spans by applying the log after the checkpoint's mark again.
//!
//! A crash during a checkpoint can leave lists in sled that the next
//! checkpoint writes again, longer; the store's readers skip a span whose
//! seqs they have passed, so overlap is harmless.

use std::collections::HashMap;
use std::sync::RwLock;

use super::{keys, Result, RunId};

/// Most spans in one sled value (7 KiB).
const MAX_LIST: usize = 256;
const ENCODED: usize = 28;

/// A run's events with consecutive seqs in one record: seqs up to
/// `last_seq`, `len` bytes at log `offset`, the last one written at
/// `last_time_ms` (so the newest span tells a run's head without reading
/// the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub last_seq: u64,
    pub offset: u64,
    pub len: u32,
    pub last_time_ms: i64,
}

/// Encodes spans as one sled value.
fn encode(spans: &[Span]) -> Vec<u8> {
    let mut out = Vec::with_capacity(spans.len() * ENCODED);
    for span in spans {
        out.extend_from_slice(&span.last_seq.to_le_bytes());
        out.extend_from_slice(&span.offset.to_le_bytes());
        out.extend_from_slice(&span.len.to_le_bytes());
        out.extend_from_slice(&span.last_time_ms.to_le_bytes());
    }
    out
}

/// The spans of the sled value under `key`.
pub fn decode(key: &[u8], bytes: &[u8]) -> Result<Vec<Span>> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(ENCODED) {
        return Err(super::corrupt(key, "bad span list"));
    }
    let field = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    let spans = bytes
        .chunks_exact(ENCODED)
        .map(|b| Span {
            last_seq: field(b, 0),
            offset: field(b, 8),
            len: u32::from_le_bytes(b[16..20].try_into().expect("4")),
            last_time_ms: field(b, 20) as i64,
        })
        .collect();
    Ok(spans)
}

/// The span lists of `run` that may hold its span ending at `last_seq`:
/// those from the first whose last seq is at or after it, up to one that
/// starts after it (overlapping lists repeat earlier spans, never later).
fn lists_holding(
    tree: &sled::Db,
    run: RunId,
    last_seq: u64,
) -> impl Iterator<Item = Result<(sled::IVec, Vec<Span>)>> + '_ {
    let end = keys::prefix_end(&keys::run_scoped(keys::EVENT, run));
    tree.range(keys::event(run, last_seq)..end)
        .map(|entry| {
            let (key, value) = entry?;
            let list = decode(&key, &value)?;
            Ok((key, list))
        })
        .take_while(move |list| match list {
            Ok((_, list)) => list.first().is_some_and(|s| s.last_seq <= last_seq),
            Err(_) => true,
        })
}

/// Whether the span index still points at the span ending at `last_seq`
/// written at log `offset` (compaction: the span is live).
pub fn is_indexed(tree: &sled::Db, run: RunId, last_seq: u64, offset: u64) -> Result<bool> {
    for list in lists_holding(tree, run, last_seq) {
        let (_, list) = list?;
        if list.iter().any(|s| s.offset == offset) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Points the run's span ending at `last_seq` at `new_offset` where it
/// points at `old_offset` (compaction copied it; the bytes are the same),
/// in every list that holds it. A span no list holds (the run was deleted
/// since) stays gone. Each list is one sled value, rewritten whole, so a
/// reader sees the old offset or the new one, both readable until the old
/// segment is deleted.
pub fn relocate(
    tree: &sled::Db,
    run: RunId,
    last_seq: u64,
    old_offset: u64,
    new_offset: u64,
) -> Result<()> {
    let mut changed = Vec::new();
    for list in lists_holding(tree, run, last_seq) {
        let (key, mut list) = list?;
        let mut hit = false;
        for span in list.iter_mut().filter(|s| s.offset == old_offset) {
            span.offset = new_offset;
            hit = true;
        }
        if hit {
            changed.push((key, list));
        }
    }
    for (key, list) in changed {
        tree.insert(key, encode(&list))?;
    }
    Ok(())
}

/// Spans applied since the last checkpoint, per run in seq order. The
/// committer (and the replay at open) adds them; readers copy a run's.
#[derive(Default)]
pub struct Recent {
    runs: RwLock<HashMap<RunId, Vec<Span>>>,
}

impl Recent {
    /// Adds one record's spans.
    pub fn add(&self, spans: &[(RunId, Span)]) {
        if spans.is_empty() {
            return;
        }
        let mut runs = self.runs.write().expect("recent spans lock");
        for &(run, span) in spans {
            runs.entry(run).or_default().push(span);
        }
    }

    /// Forgets the run's recent spans (it was deleted).
    pub fn forget(&self, run: RunId) {
        self.runs.write().expect("recent spans lock").remove(&run);
    }

    /// The run's recent spans.
    pub fn of(&self, run: RunId) -> Vec<Span> {
        let runs = self.runs.read().expect("recent spans lock");
        runs.get(&run).cloned().unwrap_or_default()
    }

    /// At most `most` of the run's recent spans, from the first that holds
    /// `seq` or a later seq on. A long run may have many recent spans, and a
    /// reader of one page of its events needs only a page of them: copying
    /// all of them for each page made reading a run of 100,000 events
    /// quadratic.
    pub fn from(&self, run: RunId, seq: u64, most: usize) -> Vec<Span> {
        let runs = self.runs.read().expect("recent spans lock");
        let Some(spans) = runs.get(&run) else {
            return Vec::new();
        };
        let first = spans.partition_point(|span| span.last_seq < seq);
        spans[first..].iter().take(most).copied().collect()
    }

    /// The run's newest recent span.
    pub fn newest(&self, run: RunId) -> Option<Span> {
        let runs = self.runs.read().expect("recent spans lock");
        runs.get(&run).and_then(|spans| spans.last().copied())
    }

    /// Puts every run's recent spans into sled, then forgets them: a
    /// reader always finds a span in one place or the other. For the
    /// checkpoint, whose flush makes them durable. Returns how many
    /// values it wrote.
    pub fn write_out(&self, tree: &sled::Db) -> Result<usize> {
        let mut lists = 0;
        {
            // Only the committer adds spans, and it is here.
            let runs = self.runs.read().expect("recent spans lock");
            for (&run, spans) in runs.iter() {
                for list in spans.chunks(MAX_LIST) {
                    let last = list.last().expect("chunks are not empty");
                    tree.insert(keys::event(run, last.last_seq), encode(list))?;
                    lists += 1;
                }
            }
        }
        // A new map, not clear(): give back what a busy interval grew.
        *self.runs.write().expect("recent spans lock") = HashMap::new();
        Ok(lists)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_round_trip_and_bad_values_are_refused() {
        let spans = [
            Span {
                last_seq: 3,
                offset: 1 << 40,
                len: 7,
                last_time_ms: -1,
            },
            Span {
                last_seq: 9,
                offset: 12,
                len: u32::MAX,
                last_time_ms: 1_700_000_000_000,
            },
        ];
        assert_eq!(decode(b"E", &encode(&spans)).unwrap(), spans);
        assert!(decode(b"E", &encode(&spans)[..ENCODED + 3]).is_err());
        assert!(decode(b"E", &[]).is_err());
    }

    #[test]
    fn write_out_moves_recent_spans_to_sled_in_lists() {
        let tree = sled::Config::new().temporary(true).open().unwrap();
        let recent = Recent::default();
        let run = RunId::new();
        let span = |seq: u64| Span {
            last_seq: seq,
            offset: seq * 100,
            len: 10,
            last_time_ms: seq as i64,
        };
        let added: Vec<_> = (1..=MAX_LIST as u64 + 2).map(|s| (run, span(s))).collect();
        recent.add(&added);
        assert_eq!(recent.newest(run), Some(span(MAX_LIST as u64 + 2)));
        recent.write_out(&tree).unwrap();
        assert!(recent.of(run).is_empty());
        let lists: Vec<Vec<Span>> = tree
            .scan_prefix(keys::run_scoped(keys::EVENT, run))
            .map(|entry| {
                let (key, value) = entry.unwrap();
                decode(&key, &value).unwrap()
            })
            .collect();
        assert_eq!(lists.len(), 2);
        assert_eq!(lists[0].len(), MAX_LIST);
        let all: Vec<Span> = lists.concat();
        assert_eq!(all, added.iter().map(|&(_, s)| s).collect::<Vec<_>>());
    }
}
