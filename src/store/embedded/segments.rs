//! The log's segment files as readers see them: each one's file and size
//! by its start offset, shared by the committer (which adds and removes
//! them, see [`super::log`]) and the readers of events.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, RwLock};

use super::record::{corrupt, decode_events, entries, Entry, HEADER};
use super::spans::Span;
use super::{EventRecord, Result, StoreError};

/// Reads up to this size reuse a per-thread buffer (see [`Segments::read`]).
const MAX_REUSED_BUFFER: usize = 1 << 20;
/// Bytes between two spans that [`Segments::events_of`] reads (and drops)
/// rather than make a second read: the rest of a record, typically.
const MAX_READ_GAP: u64 = 4 * 1024;
/// Most bytes of one read of [`Segments::events_of`] (the thread's buffer).
const MAX_READ_WINDOW: u64 = 256 * 1024;
/// The error of a read from a segment compaction deleted: the reader's
/// span was moved; looking it up again finds it (see
/// `EmbeddedStore::retrying`).
pub fn retired() -> StoreError {
    StoreError::Io(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        "the log segment was compacted away",
    ))
}

/// Whether `error` is [`retired`]'s.
pub fn is_retired(error: &StoreError) -> bool {
    matches!(error, StoreError::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// The segment files, shared by the committer (which adds them) and readers.
#[derive(Default)]
pub struct Segments {
    /// Each segment's file and size, by start offset.
    files: RwLock<BTreeMap<u64, (Arc<File>, u64)>>,
}

impl Segments {
    /// Calls `f` with `len` bytes of the log from `offset`; they must lie in
    /// one segment. The bytes sit in a buffer the thread reuses: reads are
    /// frequent and records can be large, and a fresh zeroed buffer per read
    /// showed up in profiles. `f` must not read the log itself.
    fn read<R>(&self, offset: u64, len: usize, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        thread_local! {
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let (start, file) = {
            let files = self.files.read().expect("segments lock");
            let (start, (file, size)) = files.range(..=offset).next_back().ok_or_else(retired)?;
            if offset + len as u64 > start + size {
                // The segment that held it was compacted away.
                return Err(retired());
            }
            (*start, file.clone())
        };
        if len > MAX_REUSED_BUFFER {
            let mut bytes = vec![0; len];
            file.read_exact_at(&mut bytes, offset - start)?;
            return f(&bytes);
        }
        BUFFER.with_borrow_mut(|buffer| {
            if buffer.len() < len {
                buffer.resize(len, 0);
            }
            let bytes = &mut buffer[..len];
            file.read_exact_at(bytes, offset - start)?;
            f(bytes)
        })
    }

    /// Decodes the events of the span.
    pub fn events(&self, span: Span) -> Result<Vec<EventRecord>> {
        self.read(span.offset, span.len as usize, |bytes| {
            decode_events(bytes, span.offset)
        })
    }

    /// The events of `spans`, in their order. Spans that lie close together
    /// in one segment, as the spans of a run appended to one event after
    /// another do, are read with one pread: reading a run of 100,000 events
    /// one span at a time was a syscall per event.
    pub fn events_of(&self, spans: &[Span]) -> Result<Vec<EventRecord>> {
        let mut out = Vec::new();
        let mut rest = spans;
        while let Some(first) = rest.first() {
            let start = first.offset;
            let segment_end = self.segment_end(start).ok_or_else(retired)?;
            let mut end = start + u64::from(first.len);
            let mut together = 1;
            for span in &rest[1..] {
                let span_end = span.offset + u64::from(span.len);
                let close = span.offset >= end && span.offset - end <= MAX_READ_GAP;
                if !close || span_end - start > MAX_READ_WINDOW || span_end > segment_end {
                    break;
                }
                end = span_end;
                together += 1;
            }
            let (read, later) = rest.split_at(together);
            self.read(start, (end - start) as usize, |bytes| {
                for span in read {
                    let at = (span.offset - start) as usize;
                    let block = &bytes[at..at + span.len as usize];
                    out.extend(decode_events(block, span.offset)?);
                }
                Ok(())
            })?;
            rest = later;
        }
        Ok(out)
    }

    /// The end of the segment that holds `offset`, if one does.
    fn segment_end(&self, offset: u64) -> Option<u64> {
        let files = self.files.read().expect("segments lock");
        let (&start, &(_, size)) = files.range(..=offset).next_back()?;
        (offset < start + size).then_some(start + size)
    }

    /// The events of the record at `offset`, in position order.
    pub fn record_events(&self, offset: u64) -> Result<Vec<EventRecord>> {
        let len = self.read(offset, HEADER as usize, |header| {
            Ok(u32::from_le_bytes(header[..4].try_into().expect("4 bytes")))
        })?;
        self.read(offset + HEADER, len as usize, |payload| {
            let parsed = entries(payload).ok_or_else(|| corrupt(offset, "bad entries"))?;
            let mut out = Vec::new();
            for entry in parsed.entries {
                match entry {
                    Entry::Events { block, .. } | Entry::Moved { block, .. } => {
                        out.extend(decode_events(block, offset)?)
                    }
                    _ => {}
                }
            }
            Ok(out)
        })
    }

    /// The start of the segment that holds `offset`, if one does.
    pub fn segment_of(&self, offset: u64) -> Option<u64> {
        let files = self.files.read().expect("segments lock");
        let (&start, &(_, size)) = files.range(..=offset).next_back()?;
        (offset < start + size).then_some(start)
    }

    /// Forgets the segment that starts at `start` (compaction deleted
    /// it): a read of it fails with [`retired`], for the reader to look
    /// its spans up again.
    pub fn remove(&self, start: u64) {
        self.files.write().expect("segments lock").remove(&start);
    }

    /// Every segment: (start, size in bytes).
    pub fn list(&self) -> Vec<(u64, u64)> {
        let files = self.files.read().expect("segments lock");
        files
            .iter()
            .map(|(&start, &(_, size))| (start, size))
            .collect()
    }

    /// The file and size of the segment that starts at `start`.
    pub(super) fn file(&self, start: u64) -> Option<(Arc<File>, u64)> {
        let files = self.files.read().expect("segments lock");
        files.get(&start).map(|(file, size)| (file.clone(), *size))
    }

    pub(super) fn insert(&self, start: u64, size: u64, file: Arc<File>) -> Arc<File> {
        self.files
            .write()
            .expect("segments lock")
            .insert(start, (file.clone(), size));
        file
    }
}
