//! The write-ahead log that makes a group commit durable and atomic. The
//! committer appends each round's writes here as one record and
//! `fdatasync`s it, then applies them to sled one by one, in memory. sled
//! reaches the disk only at checkpoints (flush, fsync of its file, then the
//! log is emptied). So a round costs one write and one disk wait, instead of
//! a sled batch (which makes sled seal and write its own log through its
//! thread pool, waking all of its threads) plus sled's flush (which waits for
//! writeback) plus our fsync. Readers may see part of a round being applied,
//! but only ever durable writes.
//!
//! At open, the records of the log are applied to sled again. They are
//! absolute puts and deletes in commit order, so applying them to a sled that
//! already holds some of them ends in the same state. A torn last record
//! (a crash mid-append) was never acknowledged and is cut off.
//!
//! Record: `len: u32 LE ‖ crc32(payload): u32 LE ‖ payload`; payload: ops,
//! each `1 ‖ key_len: u32 ‖ key ‖ value_len: u32 ‖ value` (put) or
//! `2 ‖ key_len: u32 ‖ key` (delete).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use super::Result;

const PUT: u8 = 1;
const DELETE: u8 = 2;
const HEADER: usize = 8;

/// One round's writes, encoded as the log's payload; sled gets them from it.
#[derive(Default)]
pub struct Round {
    payload: Vec<u8>,
}

impl Round {
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.payload.push(PUT);
        put_bytes(&mut self.payload, &key);
        put_bytes(&mut self.payload, &value);
    }

    pub fn delete(&mut self, key: Vec<u8>) {
        self.payload.push(DELETE);
        put_bytes(&mut self.payload, &key);
    }

    pub fn apply(&self, tree: &sled::Db) -> Result<()> {
        apply(
            &ops(&self.payload).expect("a round encodes its own ops"),
            tree,
        )
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

pub struct Wal {
    file: File,
    len: u64,
}

impl Wal {
    /// Opens `dir/wal` and applies its records to `tree`; returns the log
    /// and how many records it applied.
    pub fn open(dir: &Path, tree: &sled::Db) -> Result<(Wal, usize)> {
        let path = dir.join("wal");
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        if created {
            // The log's directory entry must survive a crash too.
            File::open(dir)?.sync_all()?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut at = 0;
        let mut applied = 0;
        while let Some((payload, next)) = record_at(&bytes, at) {
            apply(&ops(payload).ok_or_else(|| corrupt(at))?, tree)?;
            applied += 1;
            at = next;
        }
        if at < bytes.len() {
            tracing::warn!(
                "cutting a torn record off the write-ahead log at byte {at} of {}",
                bytes.len()
            );
            file.set_len(at as u64)?;
            file.sync_all()?;
        }
        let len = at as u64;
        Ok((Wal { file, len }, applied))
    }

    /// Appends the round's record and waits until it is on disk.
    pub fn append(&mut self, round: &Round) -> Result<()> {
        let mut record = Vec::with_capacity(HEADER + round.payload.len());
        record.extend_from_slice(&(round.payload.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(&round.payload).to_le_bytes());
        record.extend_from_slice(&round.payload);
        self.file.write_all(&record)?;
        self.file.sync_data()?;
        self.len += record.len() as u64;
        Ok(())
    }

    /// Bytes in the log since it was last emptied.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Empties the log; call once sled holds every record durably.
    pub fn clear(&mut self) -> Result<()> {
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.len = 0;
        Ok(())
    }
}

/// The payload of the complete record at `at`, and where the next starts.
fn record_at(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let header = bytes.get(at..at + HEADER)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    let payload = bytes.get(at + HEADER..at + HEADER + len)?;
    (crc32fast::hash(payload) == crc).then_some((payload, at + HEADER + len))
}

/// A put (value Some) or a delete.
type Op<'a> = (&'a [u8], Option<&'a [u8]>);

/// The ops of a payload, in order; None if it is malformed.
fn ops(mut payload: &[u8]) -> Option<Vec<Op<'_>>> {
    fn take<'a>(payload: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (payload.get(..n)?, payload.get(n..)?);
        *payload = rest;
        Some(head)
    }
    fn bytes<'a>(payload: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(take(payload, 4)?.try_into().ok()?) as usize;
        take(payload, len)
    }
    let mut ops = Vec::new();
    while let Some(&kind) = payload.first() {
        payload = &payload[1..];
        let key = bytes(&mut payload)?;
        match kind {
            PUT => ops.push((key, Some(bytes(&mut payload)?))),
            DELETE => ops.push((key, None)),
            _ => return None,
        }
    }
    Some(ops)
}

/// Applies ops to sled one by one: the log made them durable and atomic
/// already, and a sled batch would make sled write its own log each time.
fn apply(ops: &[Op<'_>], tree: &sled::Db) -> Result<()> {
    for (key, value) in ops {
        match value {
            Some(value) => tree.insert(key, *value)?,
            None => tree.remove(key)?,
        };
    }
    Ok(())
}

fn corrupt(at: usize) -> super::StoreError {
    super::StoreError::Corrupt(
        b"wal".to_vec(),
        format!("record at byte {at} has a good checksum but bad ops"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ops: &[(&str, Option<&str>)]) -> Round {
        let mut round = Round::default();
        for (key, value) in ops {
            match value {
                Some(value) => round.put(key.as_bytes().to_vec(), value.as_bytes().to_vec()),
                None => round.delete(key.as_bytes().to_vec()),
            }
        }
        round
    }

    fn value(tree: &sled::Db, key: &str) -> Option<String> {
        let value = tree.get(key).unwrap()?;
        Some(String::from_utf8(value.to_vec()).unwrap())
    }

    #[test]
    fn records_are_applied_again_at_open_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let log_dir = dir.path().join("log");
        std::fs::create_dir(&log_dir).unwrap();
        {
            let scratch = sled::Config::new().temporary(true).open().unwrap();
            let (mut wal, applied) = Wal::open(&log_dir, &scratch).unwrap();
            assert_eq!(applied, 0);
            wal.append(&round(&[("a", Some("1")), ("b", Some("2"))]))
                .unwrap();
            wal.append(&round(&[("a", None), ("b", Some("3"))]))
                .unwrap();
        }
        // A crash mid-append: half a record at the end.
        let path = log_dir.join("wal");
        let good = std::fs::metadata(&path).unwrap().len();
        let torn = round(&[("c", Some("4"))]).payload;
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&(torn.len() as u32).to_le_bytes()).unwrap();
        file.write_all(&[0, 0, 0]).unwrap();
        drop(file);

        // A sled that already holds the first record: same end state.
        let tree = sled::Config::new().temporary(true).open().unwrap();
        tree.insert("a", "1").unwrap();
        tree.insert("b", "2").unwrap();
        let (wal, applied) = Wal::open(&log_dir, &tree).unwrap();
        assert_eq!(applied, 2);
        assert_eq!(value(&tree, "a"), None);
        assert_eq!(value(&tree, "b").as_deref(), Some("3"));
        assert_eq!(value(&tree, "c"), None, "the torn record is not applied");
        assert_eq!(wal.len(), good);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "cut off");
    }

    #[test]
    fn a_cleared_log_applies_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled::Config::new().temporary(true).open().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), &tree).unwrap();
        wal.append(&round(&[("a", Some("1"))])).unwrap();
        wal.clear().unwrap();
        let other = sled::Config::new().temporary(true).open().unwrap();
        let (wal, applied) = Wal::open(dir.path(), &other).unwrap();
        assert_eq!((applied, wal.len()), (0, 0));
        assert_eq!(value(&other, "a"), None);
    }
}
