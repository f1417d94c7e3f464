//! A log record: one round's writes, encoded once as the record's payload
//! (see [`super::log`] for the format), parsed back, and applied to sled,
//! the recent spans and the pending approvals in memory.

use prost::Message;

use super::pending::Pending;
use super::spans::{Recent, Span};
use super::{keys, EventRecord, Result, RunId, StoreError};

const PUT: u8 = 1;
const DELETE: u8 = 2;
const EVENTS: u8 = 3;
const FORGET: u8 = 4;
const MOVE: u8 = 5;
const RELINK: u8 = 6;
/// A record's header: its payload's length and crc32.
pub(super) const HEADER: u64 = 8;
/// One round's writes, encoded as the record's payload.
pub struct Round {
    payload: Vec<u8>,
}

impl Round {
    pub fn new(first_position: u64) -> Round {
        Round {
            payload: first_position.to_le_bytes().to_vec(),
        }
    }

    /// The encoded payload, for the log to write.
    pub(super) fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Where the payload ends now, to [`Round::rollback`] to.
    pub fn mark(&self) -> usize {
        self.payload.len()
    }

    /// Takes back everything added after `mark`.
    pub fn rollback(&mut self, mark: usize) {
        self.payload.truncate(mark);
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.payload.push(PUT);
        put_bytes(&mut self.payload, key);
        put_bytes(&mut self.payload, value);
    }

    pub fn delete(&mut self, key: &[u8]) {
        self.payload.push(DELETE);
        put_bytes(&mut self.payload, key);
    }

    /// Forgets the run's recent spans when applied (the run is deleted;
    /// the round deletes its span lists in sled too).
    pub fn forget(&mut self, run: RunId) {
        self.payload.push(FORGET);
        self.payload.extend_from_slice(run.as_bytes());
    }

    /// Adds a span compaction copies out of its segment: `block` is the
    /// span's bytes as they were at `old_offset`, unchanged.
    pub fn moved(&mut self, old_offset: u64, run: RunId, last_seq: u64, block: &[u8]) {
        let out = &mut self.payload;
        out.push(MOVE);
        out.extend_from_slice(&old_offset.to_le_bytes());
        out.extend_from_slice(run.as_bytes());
        out.extend_from_slice(&last_seq.to_le_bytes());
        put_bytes(out, block);
    }

    /// Points the log index entry of `position` (a record's last event)
    /// at this record.
    pub fn relink(&mut self, position: u64) {
        self.payload.push(RELINK);
        self.payload.extend_from_slice(&position.to_le_bytes());
    }

    /// Adds events of one run with consecutive seqs, positions assigned.
    pub fn events(&mut self, run: RunId, events: &[EventRecord]) {
        let out = &mut self.payload;
        out.push(EVENTS);
        out.extend_from_slice(run.as_bytes());
        out.extend_from_slice(&events[0].seq.to_le_bytes());
        out.extend_from_slice(&(events.len() as u32).to_le_bytes());
        let last_time_ms = events.last().map_or(0, |e| e.time_ms);
        out.extend_from_slice(&last_time_ms.to_le_bytes());
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        for event in events {
            out.extend_from_slice(&(event.encoded_len() as u32).to_le_bytes());
            event.encode(out).expect("a Vec grows");
        }
        let len = (out.len() - len_at - 4) as u32;
        out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }
}

pub(super) fn decode_events(mut block: &[u8], offset: u64) -> Result<Vec<EventRecord>> {
    let mut out = Vec::new();
    while !block.is_empty() {
        let event = take_bytes(&mut block)
            .and_then(|b| EventRecord::decode(b).ok())
            .ok_or_else(|| corrupt(offset, "undecodable events"))?;
        out.push(event);
    }
    Ok(out)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

pub(super) enum Entry<'a> {
    Put(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
    Events {
        run: &'a [u8],
        first_seq: u64,
        count: u32,
        last_time_ms: i64,
        /// Where the events start in the payload.
        block_at: usize,
        block: &'a [u8],
    },
    Forget(&'a [u8]),
    Moved {
        old_offset: u64,
        run: &'a [u8],
        last_seq: u64,
        block_at: usize,
        block: &'a [u8],
    },
    Relink(u64),
}

pub(super) struct Entries<'a> {
    pub first_position: u64,
    pub entries: Vec<Entry<'a>>,
}

fn take<'a>(payload: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = (payload.get(..n)?, payload.get(n..)?);
    *payload = rest;
    Some(head)
}

fn take_bytes<'a>(payload: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u32::from_le_bytes(take(payload, 4)?.try_into().ok()?) as usize;
    take(payload, len)
}

/// The entries of a payload, in order; None if it is malformed.
pub(super) fn entries(payload: &[u8]) -> Option<Entries<'_>> {
    let mut rest = payload;
    let first_position = u64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?);
    let mut entries = Vec::new();
    while let Some(kind) = take(&mut rest, 1) {
        entries.push(match kind[0] {
            PUT => Entry::Put(take_bytes(&mut rest)?, take_bytes(&mut rest)?),
            DELETE => Entry::Delete(take_bytes(&mut rest)?),
            EVENTS => {
                let run = take(&mut rest, 16)?;
                let first_seq = u64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?);
                let count = u32::from_le_bytes(take(&mut rest, 4)?.try_into().ok()?);
                let last_time_ms = i64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?);
                let block = take_bytes(&mut rest)?;
                let block_at = payload.len() - rest.len() - block.len();
                Entry::Events {
                    run,
                    first_seq,
                    count,
                    last_time_ms,
                    block_at,
                    block,
                }
            }
            FORGET => Entry::Forget(take(&mut rest, 16)?),
            MOVE => {
                let old_offset = u64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?);
                let run = take(&mut rest, 16)?;
                let last_seq = u64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?);
                let block = take_bytes(&mut rest)?;
                let block_at = payload.len() - rest.len() - block.len();
                Entry::Moved {
                    old_offset,
                    run,
                    last_seq,
                    block_at,
                    block,
                }
            }
            RELINK => Entry::Relink(u64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?)),
            _ => return None,
        });
    }
    Some(Entries {
        first_position,
        entries,
    })
}

/// Applies the round written at log offset `at` to sled and `recent`, one
/// key at a time (the log made the round durable and atomic already).
/// Returns the position after its events.
pub fn apply(round: &Round, at: u64, tree: &sled::Db, applied: &Applied) -> Result<u64> {
    let parsed = entries(&round.payload).expect("a round encodes its own entries");
    apply_entries(&parsed, at, tree, applied)
}

/// What applying a record updates besides sled: the recent spans, and the
/// copy of the pending approvals (written after sled: see
/// [`super::pending`]).
pub struct Applied<'a> {
    pub recent: &'a Recent,
    pub pending: &'a Pending,
}

pub(super) fn apply_entries(
    parsed: &Entries<'_>,
    at: u64,
    tree: &sled::Db,
    applied: &Applied,
) -> Result<u64> {
    let recent = applied.recent;
    // The spans first: a reader that sees a run's summary or approval from
    // this record must find the events it came with (a finished run's
    // stream ends at its last seq).
    let mut position = parsed.first_position;
    let mut spans = Vec::new();
    for entry in &parsed.entries {
        if let Entry::Events {
            run,
            first_seq,
            count,
            last_time_ms,
            block_at,
            block,
        } = *entry
        {
            let run = RunId::from_slice(run).ok_or_else(|| corrupt(at, "bad run id"))?;
            spans.push((
                run,
                Span {
                    last_seq: first_seq + u64::from(count.max(1)) - 1,
                    offset: at + HEADER + block_at as u64,
                    len: block.len() as u32,
                    last_time_ms,
                },
            ));
            position += count as u64;
        }
    }
    recent.add(&spans);
    for entry in &parsed.entries {
        match *entry {
            Entry::Put(key, value) => {
                tree.insert(key, value)?;
                applied.pending.applied(key, Some(value));
            }
            Entry::Delete(key) => {
                tree.remove(key)?;
                applied.pending.applied(key, None);
            }
            Entry::Forget(run) => {
                recent.forget(RunId::from_slice(run).ok_or_else(|| corrupt(at, "bad run id"))?);
            }
            Entry::Moved {
                old_offset,
                run,
                last_seq,
                block_at,
                ..
            } => {
                let run = RunId::from_slice(run).ok_or_else(|| corrupt(at, "bad run id"))?;
                let new_offset = at + HEADER + block_at as u64;
                super::spans::relocate(tree, run, last_seq, old_offset, new_offset)?;
            }
            Entry::Relink(position) => {
                tree.insert(keys::log(position), &at.to_le_bytes()[..])?;
            }
            Entry::Events { .. } => {}
        }
    }
    if position > parsed.first_position {
        tree.insert(keys::log(position - 1), &at.to_le_bytes()[..])?;
    }
    Ok(position)
}

/// A record at `offset` that does not read back.
pub(super) fn corrupt(offset: u64, what: &str) -> StoreError {
    StoreError::Corrupt(format!("log at offset {offset}: {what}"))
}
