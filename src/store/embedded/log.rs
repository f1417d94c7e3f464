//! The log: where events live, and what makes a group commit durable.
//!
//! Each round of the committer is one record, written in place into a
//! segment file and `fdatasync`ed. A record holds the round's events
//! (encoded once, by [`super::record`], and never copied into sled) and its index writes
//! (run summaries, approvals, timers, ...). Applying a record puts those
//! index writes into sled, each run's events as a span into the span index
//! (see [`super::spans`]), and `L ‖ last position` → the record into sled.
//! Keyed by the last, the record that holds a position is the first key at
//! or after it: a forward seek. sled reaches the disk only at checkpoints
//! (see [`super::committer`]), which note how far the log was applied; at
//! open the records after that are applied again. They are absolute puts
//! and deletes in commit order, so applying one twice ends in the same
//! state.
//!
//! Segments are files named by the log offset they start at, zero-filled
//! to their full size before the first write: overwriting allocated blocks
//! lets `fdatasync` skip the file-size journal commit an append needs (about
//! half the wait on this machine kind). A zero header ends a segment's
//! records; the next segment is prepared on a thread of its own. A torn last
//! record (a crash mid-write) was never acknowledged: it is zeroed at open.
//!
//! Record: `len: u32 LE ‖ crc32(payload): u32 LE ‖ payload`; payload:
//! `first_position: u64 LE` then entries, each
//! `1 ‖ key ‖ value` (put), `2 ‖ key` (delete) or
//! `3 ‖ run: 16 ‖ first_seq: u64 LE ‖ count: u32 LE ‖ last_time_ms: i64 LE
//! ‖ events` (a run's events, consecutive seqs), `4 ‖ run: 16` (the
//! run was deleted: forget its recent spans), `5 ‖ old offset: u64 LE ‖
//! run: 16 ‖ last_seq: u64 LE ‖ events` (compaction copied a live span
//! here from `old offset`: its span lists now point here) or `6 ‖
//! position: u64 LE` (the log index entry of the record whose last event
//! has this position now points to this record, whose moved spans hold its
//! live events), where key, value and events are `len: u32 LE ‖ bytes`
//! and events is a sequence of such encoded events.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::pending::Pending;
use super::record::{apply_entries, corrupt, entries, Applied, Entry, Round, HEADER};
use super::segments::{retired, Segments};
use super::space::Space;
use super::spans::Recent;
use super::{keys, Result, RunId};

/// The first segments are small (a fresh server writes little) and each
/// one is as big as the log before it, up to the largest the store was
/// opened with (`--log-segment-kib`, 32 MiB by default).
const MIN_SEGMENT: u64 = 1 << 20;
/// The smallest segment made when space is short (see [`super::space`]):
/// below it, the log says the disk is full.
const MIN_SHORT_SEGMENT: u64 = 64 << 10;
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

enum Next {
    Ready(Segment),
    Preparing(JoinHandle<std::io::Result<Segment>>),
}

struct Segment {
    start: u64,
    capacity: u64,
    file: Arc<File>,
}

impl Segment {
    fn end(&self) -> u64 {
        self.start + self.capacity
    }
}

/// The committer's handle on the log.
pub struct Log {
    dir: PathBuf,
    /// The disk's free space, which new segments leave a reserve of.
    space: Space,
    /// The largest segment made (a record bigger than that grows one).
    max_segment: u64,
    segments: Arc<Segments>,
    current: Segment,
    /// The segment after `current`: found at open, or being zero-filled.
    next: Option<Next>,
    /// Log offset of the next record.
    end: u64,
}

/// A dropped log waits for the segment it is zero-filling, so that nothing
/// of it writes in the directory afterwards (a log opened there again
/// would race it over the same file name).
impl Drop for Log {
    fn drop(&mut self) {
        if let Some(Next::Preparing(thread)) = self.next.take() {
            let _ = thread.join();
        }
    }
}

/// What [`Log::open`] found.
pub struct Opened {
    pub log: Log,
    pub segments: Arc<Segments>,
    /// The spans of the records applied again.
    pub recent: Arc<Recent>,
    /// The last checkpoint's mark.
    pub mark: Mark,
    /// Position the next event gets.
    pub next_position: u64,
    /// Records applied to sled again.
    pub replayed: usize,
}

/// How far sled holds the log durably: a checkpoint's mark, kept in sled
/// under [`MARK`] and flushed with what it describes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    pub offset: u64,
    pub next_position: u64,
}

/// The meta key of the last checkpoint's [`Mark`].
const MARK: &str = "log-mark";

impl Mark {
    /// The last checkpoint's mark; the start of the log if there was none.
    pub fn load(tree: &sled::Db) -> Result<Mark> {
        let Some(bytes) = tree.get(keys::meta(MARK))? else {
            return Ok(Mark::default());
        };
        let field = |range: std::ops::Range<usize>| {
            Some(u64::from_le_bytes(bytes.get(range)?.try_into().ok()?))
        };
        match (field(0..8), field(8..16)) {
            (Some(offset), Some(next_position)) => Ok(Mark {
                offset,
                next_position,
            }),
            _ => Err(super::corrupt(&keys::meta(MARK), "bad checkpoint mark")),
        }
    }

    /// Puts the mark in sled, for the flush that follows to make durable.
    pub fn save(&self, tree: &sled::Db) -> Result<()> {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.offset.to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_position.to_le_bytes());
        tree.insert(keys::meta(MARK), &bytes[..])?;
        Ok(())
    }
}

impl Log {
    /// Opens the log in `dir` and applies the records after the last
    /// checkpoint's mark again, to `tree`, to the returned recent spans and
    /// to `pending`.
    pub fn open(
        dir: &Path,
        tree: &sled::Db,
        max_segment: u64,
        pending: &Pending,
        space: &Space,
    ) -> Result<Opened> {
        let max_segment = max_segment.max(HEADER * 8);
        let min_segment = MIN_SEGMENT.min(max_segment);
        let mark = Mark::load(tree)?;
        let recent = Arc::new(Recent::default());
        std::fs::create_dir_all(dir)?;
        let segments = Arc::new(Segments::default());
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("tmp") => std::fs::remove_file(&path)?,
                Some("seg") => {
                    let start = path
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or_else(|| corrupt(0, &format!("bad segment name {path:?}")))?;
                    let file = OpenOptions::new().read(true).write(true).open(&path)?;
                    let capacity = file.metadata()?.len();
                    found.push(Segment {
                        start,
                        capacity,
                        file: segments.insert(start, capacity, Arc::new(file)),
                    });
                }
                _ => {}
            }
        }
        found.sort_by_key(|s| s.start);
        if found.is_empty() {
            let capacity = fitted(space, min_segment)?;
            let file = make_segment(dir, 0, capacity)?;
            found.push(Segment {
                start: 0,
                capacity,
                file: segments.insert(0, capacity, Arc::new(file)),
            });
        }
        // Compaction deletes segments below the checkpoint: gaps there are
        // its doing. From the checkpoint on, segments follow each other.
        for pair in found.windows(2) {
            if pair[0].end() != pair[1].start && pair[1].start > mark.offset {
                return Err(corrupt(pair[1].start, "segments do not follow each other"));
            }
        }

        let applied = Applied {
            recent: &recent,
            pending,
        };
        let mut replay = Replay {
            tree,
            applied: &applied,
            at: mark.offset,
            next_position: mark.next_position.max(1),
            replayed: 0,
        };
        let mut index = found
            .iter()
            .position(|s| s.start <= mark.offset && mark.offset <= s.end())
            .ok_or_else(|| corrupt(mark.offset, "the checkpoint is past the log"))?;
        loop {
            let segment = &found[index];
            match replay.segment(segment)? {
                SegmentEnd::Clean if index + 1 < found.len() => {
                    // Records go on in the next segment, or the log ends here.
                    let next = &found[index + 1];
                    if !has_record(next)? {
                        break;
                    }
                    index += 1;
                    replay.at = next.start;
                }
                SegmentEnd::Clean => break,
                SegmentEnd::Torn => {
                    if found[index + 1..]
                        .iter()
                        .any(|s| has_record(s).unwrap_or(true))
                    {
                        return Err(corrupt(replay.at, "a bad record before later ones"));
                    }
                    tracing::warn!("zeroing a torn record at log offset {}", replay.at);
                    zero(&segment.file, replay.at - segment.start, segment.capacity)?;
                    segment.file.sync_data()?;
                    break;
                }
            }
        }
        let end = replay.at;
        let (next_position, replayed) = (replay.next_position, replay.replayed);
        // Segments compaction emptied whose deletion a crash cut short.
        for key in tree.scan_prefix([keys::RETIRED]).keys() {
            let key = key?;
            let start = key
                .get(1..9)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| super::corrupt(&key, "bad retired segment key"))?;
            if start >= found[index].start {
                return Err(corrupt(
                    start,
                    "a retired segment at or after the checkpoint",
                ));
            }
            segments.remove(start);
            match std::fs::remove_file(dir.join(format!("{start:020}.seg"))) {
                Ok(()) => tracing::info!("deleted log segment {start}, which compaction emptied"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            tree.remove(&key)?;
        }
        let mut found = found.into_iter().skip(index);
        let current = found.next().expect("the segment the log ends in");
        let next = found.next().map(Next::Ready);
        let mut log = Log {
            dir: dir.to_path_buf(),
            space: space.clone(),
            max_segment,
            segments: segments.clone(),
            current,
            next,
            end,
        };
        if log.next.is_none() {
            log.prepare_next();
        }
        Ok(Opened {
            log,
            segments,
            recent,
            mark,
            next_position,
            replayed,
        })
    }

    /// Writes the round's record and waits until it is on disk; returns the
    /// record's offset, for [`super::record::apply`].
    pub fn append(&mut self, round: &Round) -> Result<u64> {
        self.write_record(round, true)
    }

    /// Writes the rounds' records one after the other and waits once until
    /// all are on disk; returns their offsets. On an error, none of them
    /// counts as written (the ones before it may reach the disk: each is a
    /// whole record, applied at the next open like any other).
    pub fn append_all(&mut self, rounds: &[Round]) -> Result<Vec<u64>> {
        let mut offsets = Vec::with_capacity(rounds.len());
        for round in rounds {
            offsets.push(self.write_record(round, false)?);
        }
        self.current.file.sync_data()?;
        Ok(offsets)
    }

    fn write_record(&mut self, round: &Round, sync: bool) -> Result<u64> {
        let payload = round.payload();
        let mut record = Vec::with_capacity(HEADER as usize + payload.len());
        record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        record.extend_from_slice(payload);
        let len = record.len() as u64;
        if self.end + len > self.current.end() {
            if !sync {
                // What was written unsynced to this segment goes first.
                self.current.file.sync_data()?;
            }
            self.switch()?;
        }
        let at = self.end;
        let written = (|| {
            self.current
                .file
                .write_all_at(&record, at - self.current.start)?;
            if at + len > self.current.end() {
                // A record bigger than a whole segment grew this (empty) one.
                self.current.file.sync_all()
            } else if sync {
                self.current.file.sync_data()
            } else {
                Ok(())
            }
        })();
        if let Err(e) = written {
            // Not acknowledged, and the end stays: the next record goes to
            // the same offset and overwrites what was written of this one
            // (a torn tail, as after a crash). A segment this record grew
            // is cut back to its size, to give the space back.
            let _ = self.current.file.set_len(self.current.capacity);
            return Err(e.into());
        }
        if at + len > self.current.end() {
            self.current.capacity = at + len - self.current.start;
            let (start, file) = (self.current.start, self.current.file.clone());
            self.segments.insert(start, self.current.capacity, file);
        }
        self.end = at + len;
        if self.next.is_none() {
            self.prepare_next();
        }
        Ok(at)
    }

    /// The start of the segment that holds log offset `offset`.
    pub fn segment_of(&self, offset: u64) -> Option<u64> {
        self.segments.segment_of(offset)
    }

    /// Makes the next segment now, if it is not made or being made; waits
    /// for one being made. A failure leaves none, for the next try.
    pub fn prepare_now(&mut self) -> Result<()> {
        let segment = self.take_next()?;
        self.next = Some(Next::Ready(segment));
        Ok(())
    }

    /// The next segment: prepared, being prepared (waited for), or made
    /// here when its preparation failed before (disk full).
    fn take_next(&mut self) -> Result<Segment> {
        Ok(match self.next.take() {
            Some(Next::Ready(segment)) => segment,
            Some(Next::Preparing(thread)) => thread
                .join()
                .map_err(|_| corrupt(self.current.end(), "preparing a segment panicked"))??,
            None => {
                let start = self.current.end();
                let capacity = fitted(&self.space, self.capacity_at(start))?;
                Segment {
                    start,
                    capacity,
                    file: Arc::new(make_segment(&self.dir, start, capacity)?),
                }
            }
        })
    }

    /// The size of a new segment starting at `start`.
    fn capacity_at(&self, start: u64) -> u64 {
        start.clamp(MIN_SEGMENT.min(self.max_segment), self.max_segment)
    }

    /// The offset the next record goes to: a checkpoint's mark.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Moves on to the next segment (see [`Log::take_next`]).
    fn switch(&mut self) -> Result<()> {
        let next = self.take_next()?;
        self.segments
            .insert(next.start, next.capacity, next.file.clone());
        self.end = next.start;
        self.current = next;
        Ok(())
    }

    /// Starts zero-filling the segment after the current one, if the disk
    /// has room for it (else [`Log::take_next`] tries again when it is due).
    fn prepare_next(&mut self) {
        let start = self.current.end();
        let Ok(capacity) = fitted(&self.space, self.capacity_at(start)) else {
            return;
        };
        let dir = self.dir.clone();
        self.next = Some(Next::Preparing(std::thread::spawn(move || {
            let file = Arc::new(make_segment(&dir, start, capacity)?);
            Ok(Segment {
                start,
                capacity,
                file,
            })
        })));
    }
}

/// A span found in a segment by [`Log::scan`]: a run's events (or a copy
/// compaction made of them) ending at `last_seq`, at log `offset`.
pub struct ScannedSpan {
    pub run: RunId,
    pub last_seq: u64,
    pub offset: u64,
    pub block: Vec<u8>,
}

/// A record found in a segment by [`Log::scan`].
pub struct Scanned {
    pub at: u64,
    /// The positions whose log index entry may point at this record: its
    /// last event's, or those it took over from records it holds copies of.
    pub links: Vec<u64>,
    pub spans: Vec<ScannedSpan>,
}

impl Log {
    /// The records of the segment that starts at `start`, which must be
    /// sealed (below the last checkpoint): compaction reads them.
    pub fn scan(&self, start: u64) -> Result<Vec<Scanned>> {
        let (file, size) = self.segments.file(start).ok_or_else(retired)?;
        let mut bytes = vec![0; size as usize];
        file.read_exact_at(&mut bytes, 0)?;
        let mut out = Vec::new();
        let mut rest = &bytes[..];
        let mut at = start;
        while let Some(header) = rest.get(..HEADER as usize) {
            if header == [0; HEADER as usize] {
                break;
            }
            let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
            let payload = rest
                .get(HEADER as usize..HEADER as usize + len)
                .ok_or_else(|| corrupt(at, "a sealed segment ends in a torn record"))?;
            let parsed = entries(payload).ok_or_else(|| corrupt(at, "bad entries"))?;
            let mut record = Scanned {
                at,
                links: Vec::new(),
                spans: Vec::new(),
            };
            let mut position = parsed.first_position;
            for entry in parsed.entries {
                let (run, last_seq, block_at, block) = match entry {
                    Entry::Events {
                        run,
                        first_seq,
                        count,
                        block_at,
                        block,
                        ..
                    } => {
                        position += u64::from(count);
                        let last_seq = first_seq + u64::from(count.max(1)) - 1;
                        (run, last_seq, block_at, block)
                    }
                    Entry::Moved {
                        run,
                        last_seq,
                        block_at,
                        block,
                        ..
                    } => (run, last_seq, block_at, block),
                    Entry::Relink(position) => {
                        record.links.push(position);
                        continue;
                    }
                    _ => continue,
                };
                record.spans.push(ScannedSpan {
                    run: RunId::from_slice(run).ok_or_else(|| corrupt(at, "bad run id"))?,
                    last_seq,
                    offset: at + HEADER + block_at as u64,
                    block: block.to_vec(),
                });
            }
            if position > parsed.first_position {
                record.links.push(position - 1);
            }
            out.push(record);
            at += HEADER + len as u64;
            rest = &rest[HEADER as usize + len..];
        }
        Ok(out)
    }

    /// Deletes a segment compaction emptied (nothing points into it any
    /// more, durably): readers that still hold a span into it look it up
    /// again.
    pub fn delete_segment(&mut self, start: u64) -> Result<()> {
        self.segments.remove(start);
        let path = self.dir.join(format!("{start:020}.seg"));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// The segments compaction may take: (start, size) of those that end
    /// at or before `sealed_to` (a checkpoint's mark), neither the one
    /// written to nor the next.
    pub fn sealed(&self, sealed_to: u64) -> Vec<(u64, u64)> {
        self.segments
            .list()
            .into_iter()
            .filter(|&(start, size)| start != self.current.start && start + size <= sealed_to)
            .collect()
    }
}

/// The size of a segment planned at `planned` bytes that the disk has room
/// for beside the reserve: smaller when space is short, or the disk-full
/// error when there is not room for the smallest.
fn fitted(space: &Space, planned: u64) -> std::io::Result<u64> {
    let room = space.room()? / MIN_SHORT_SEGMENT * MIN_SHORT_SEGMENT;
    if room < MIN_SHORT_SEGMENT.min(planned) {
        return Err(space.full());
    }
    Ok(planned.min(room))
}

/// A segment file of `capacity` zero bytes, complete before it gets its name.
/// One that cannot be made (disk full) leaves no file behind.
fn make_segment(dir: &Path, start: u64, capacity: u64) -> std::io::Result<File> {
    let name = format!("{start:020}");
    let temporary = dir.join(format!("{name}.tmp"));
    let made = fill_segment(dir, &name, &temporary, capacity);
    if made.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    made
}

fn fill_segment(dir: &Path, name: &str, temporary: &Path, capacity: u64) -> std::io::Result<File> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(temporary)?;
    let mut left = capacity;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        file.write_all(&ZEROS[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    std::fs::rename(temporary, dir.join(format!("{name}.seg")))?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

/// Overwrites `[from, to)` of the file with zeros.
fn zero(file: &File, mut from: u64, to: u64) -> std::io::Result<()> {
    while from < to {
        let n = (to - from).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], from)?;
        from += n as u64;
    }
    Ok(())
}

/// Whether the segment's first record header is written.
fn has_record(segment: &Segment) -> std::io::Result<bool> {
    let mut header = [0; HEADER as usize];
    segment.file.read_exact_at(&mut header, 0)?;
    Ok(header != [0; HEADER as usize])
}

enum SegmentEnd {
    /// A zero header, or no room for one: the segment's records end here.
    Clean,
    /// A record that is not whole, or not the one expected.
    Torn,
}

struct Replay<'a> {
    tree: &'a sled::Db,
    applied: &'a Applied<'a>,
    at: u64,
    next_position: u64,
    replayed: usize,
}

impl Replay<'_> {
    /// Applies the segment's records from `self.at` on.
    fn segment(&mut self, segment: &Segment) -> Result<SegmentEnd> {
        let mut bytes = vec![0; (segment.end() - self.at) as usize];
        segment
            .file
            .read_exact_at(&mut bytes, self.at - segment.start)?;
        let mut rest = &bytes[..];
        loop {
            let Some(header) = rest.get(..HEADER as usize) else {
                return Ok(SegmentEnd::Clean);
            };
            if header == [0; HEADER as usize] {
                return Ok(SegmentEnd::Clean);
            }
            let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
            let Some(payload) = rest.get(HEADER as usize..HEADER as usize + len) else {
                return Ok(SegmentEnd::Torn);
            };
            if crc32fast::hash(payload) != crc {
                return Ok(SegmentEnd::Torn);
            }
            match entries(payload) {
                Some(parsed) if parsed.first_position == self.next_position => {
                    self.next_position = apply_entries(&parsed, self.at, self.tree, self.applied)?;
                }
                _ => return Ok(SegmentEnd::Torn),
            }
            self.replayed += 1;
            self.at += HEADER + len as u64;
            rest = &rest[HEADER as usize + len..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::apply;
    use super::super::EventRecord;
    use super::*;

    fn event(run: RunId, seq: u64, position: u64, data: &str) -> EventRecord {
        EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            position,
            event_type: "app.test".into(),
            data_json: data.into(),
            ..Default::default()
        }
    }

    /// Appends a round of `events` (one run, from `seq`) plus a put; returns
    /// the record's offset.
    fn append(log: &mut Log, tree: &sled::Db, events: &[EventRecord], key: &str) -> u64 {
        let mut round = Round::new(events[0].position);
        round.events(RunId::from_slice(&events[0].run_id).unwrap(), events);
        round.put(key.as_bytes(), b"v");
        let at = log.append(&round).unwrap();
        let applied = Applied {
            recent: &Recent::default(),
            pending: &Pending::default(),
        };
        apply(&round, at, tree, &applied).unwrap();
        at
    }

    /// The log in `dir`, opened over `tree` with 32 MiB segments at most.
    fn open(dir: &tempfile::TempDir, tree: &sled::Db) -> Opened {
        let space = Space::new(dir.path());
        Log::open(dir.path(), tree, 32 << 20, &Pending::default(), &space).unwrap()
    }

    fn scratch() -> sled::Db {
        sled::Config::new().temporary(true).open().unwrap()
    }

    /// The seqs of the recent span that holds `seq`.
    fn span_events(opened: &Opened, run: RunId, seq: u64) -> Vec<u64> {
        let spans = opened.recent.of(run);
        let span = *spans.iter().find(|s| s.last_seq >= seq).unwrap();
        opened
            .segments
            .events(span)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    /// Dropping the log waits for the segment it was zero-filling. Left to
    /// run, that thread raced a log opened again in the directory (as this
    /// file's tests and a restart in one process do) over one file name:
    /// the new open failed (NotFound) removing the `.tmp` the thread had
    /// just renamed, or both filled the same file.
    #[test]
    fn a_dropped_log_leaves_no_segment_half_made() {
        let dir = tempfile::tempdir().unwrap();
        let tree = scratch();
        let opened = open(&dir, &tree);
        drop(opened);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
        assert!(names.contains(&format!("{:020}.seg", 1 << 20)), "{names:?}");
    }

    #[test]
    fn records_are_applied_again_from_the_mark_and_a_torn_tail_is_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new();
        let first_tree = scratch();
        let mut opened = open(&dir, &first_tree);
        assert_eq!((opened.next_position, opened.replayed), (1, 0));
        let log = &mut opened.log;
        append(
            log,
            &first_tree,
            &[event(run, 1, 1, "a"), event(run, 2, 2, "b")],
            "k1",
        );
        let mark = Mark {
            offset: log.end(),
            next_position: 3,
        };
        append(log, &first_tree, &[event(run, 3, 3, "c")], "k2");
        let end = log.end();
        drop(opened);
        // A crash mid-write: a header and part of a payload after the end.
        let segment = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join(format!("{:020}.seg", 0)))
            .unwrap();
        segment
            .write_all_at(&[40, 0, 0, 0, 1, 2, 3, 4, 9, 9], end)
            .unwrap();

        // Everything again into an empty sled.
        let tree = scratch();
        let opened = open(&dir, &tree);
        assert_eq!((opened.next_position, opened.replayed), (4, 2));
        assert_eq!(span_events(&opened, run, 1), [1, 2]);
        assert_eq!(span_events(&opened, run, 3), [3]);
        assert!(tree.get("k1").unwrap().is_some() && tree.get("k2").unwrap().is_some());
        let mut torn = [1; 10];
        segment.read_exact_at(&mut torn, end).unwrap();
        assert_eq!(torn, [0; 10], "the torn record is zeroed");
        assert_eq!(opened.log.end(), end);
        drop(opened);

        // From the mark: only the record after it.
        let tree = scratch();
        mark.save(&tree).unwrap();
        let opened = open(&dir, &tree);
        assert_eq!((opened.next_position, opened.replayed), (4, 1));
        assert!(tree.get("k1").unwrap().is_none());
        assert_eq!(span_events(&opened, run, 3), [3]);
    }

    #[test]
    fn records_go_on_in_later_segments_and_one_may_outgrow_a_segment() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new();
        let tree = scratch();
        let mut opened = open(&dir, &tree);
        let filler = "x".repeat(300 * 1024);
        let mut offsets = Vec::new();
        for seq in 1..=12 {
            let data = if seq == 8 {
                "y".repeat(3 << 20)
            } else {
                filler.clone()
            };
            let at = append(&mut opened.log, &tree, &[event(run, seq, seq, &data)], "k");
            offsets.push(at);
        }
        let segments = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().unwrap() == "seg")
            .count();
        assert!(segments >= 4, "{segments} segments");
        drop(opened);

        let tree = scratch();
        let opened = open(&dir, &tree);
        assert_eq!((opened.next_position, opened.replayed), (13, 12));
        for (seq, at) in (1..=12).zip(offsets) {
            let stored = u64::from_le_bytes(
                tree.get(keys::log(seq)).unwrap().unwrap()[..]
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(stored, at);
            let events = opened.segments.record_events(at).unwrap();
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].seq, seq);
            let len = if seq == 8 { 3 << 20 } else { filler.len() };
            assert_eq!(events[0].data_json.len(), len);
        }
    }
}
