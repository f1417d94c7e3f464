//! Free space on the data directory's disk, and the reserve that lets the
//! store start and checkpoint on a disk that is full.
//!
//! sled needs room of its own at times the store cannot choose: at open it
//! overwrites the rest of its active segment (up to 8 MiB, see
//! [`super::layout::sled_config`]) and writes a snapshot, and a checkpoint
//! grows its file. A disk the log (or anything else) filled to the last
//! byte made the next start fail with "No space left on device". So:
//!
//! - the data directory holds a reserve file of [`RESERVE`] allocated bytes,
//!   made whenever it is missing and there is room for it;
//! - at open, and before a checkpoint, on a disk with less than [`SLACK`]
//!   free, the reserve is deleted, giving sled its room back; writes are
//!   then refused (STORAGE_UNAVAILABLE, naming the cause) until the reserve
//!   can be made again, which the committer tries on its own;
//! - the log makes its zero-filled segments only in the room left beyond
//!   [`SLACK`] (and the reserve, while it is missing): smaller ones when
//!   space is short, none when there is no room.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use fs2::FileExt;

/// The reserve file's size: two of sled's segments, one for what sled
/// writes at open, one for a checkpoint after it.
pub const RESERVE: u64 = 16 << 20;
/// Free space the log leaves beside the reserve: one of sled's segments,
/// for the checkpoints of a server that runs on.
pub const SLACK: u64 = 8 << 20;
/// The reserve file, in the data directory.
const RESERVE_FILE: &str = "reserve";

/// The data directory's disk, as the store sees its space.
#[derive(Clone, Debug)]
pub struct Space {
    dir: PathBuf,
}

impl Space {
    pub fn new(dir: &Path) -> Space {
        Space {
            dir: dir.to_path_buf(),
        }
    }

    /// Bytes that can still be written on the disk.
    fn available(&self) -> std::io::Result<u64> {
        fs2::available_space(&self.dir)
    }

    /// Whether the reserve file is there, whole.
    fn reserved(&self) -> bool {
        std::fs::metadata(self.dir.join(RESERVE_FILE)).is_ok_and(|m| m.len() >= RESERVE)
    }

    /// Bytes the log may take for a new segment: what is free beyond
    /// [`SLACK`], and beyond the reserve while it is missing.
    pub fn room(&self) -> std::io::Result<u64> {
        Ok(self.available()?.saturating_sub(self.kept()))
    }

    /// What the log leaves free: [`SLACK`], and the reserve while it is
    /// missing.
    fn kept(&self) -> u64 {
        match self.reserved() {
            true => SLACK,
            false => SLACK + RESERVE,
        }
    }

    /// Makes the reserve if it is missing and there is room for it beside
    /// [`SLACK`]; says whether it is there now.
    pub fn keep(&self) -> std::io::Result<bool> {
        if self.reserved() {
            return Ok(true);
        }
        if self.available()? < RESERVE + SLACK {
            return Ok(false);
        }
        let temporary = self.dir.join(format!("{RESERVE_FILE}.tmp"));
        let made = (|| {
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&temporary)?;
            file.allocate(RESERVE)?;
            file.sync_all()?;
            std::fs::rename(&temporary, self.dir.join(RESERVE_FILE))?;
            File::open(&self.dir)?.sync_all()
        })();
        match made {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                let _ = std::fs::remove_file(&temporary);
                Ok(false)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&temporary);
                Err(e)
            }
        }
    }

    /// Deletes the reserve when the disk has less than [`SLACK`] free, so
    /// sled has room to open or checkpoint; says whether it did.
    pub fn release_if_short(&self) -> std::io::Result<bool> {
        let available = self.available()?;
        if available >= SLACK || !self.reserved() {
            return Ok(false);
        }
        std::fs::remove_file(self.dir.join(RESERVE_FILE))?;
        File::open(&self.dir)?.sync_all()?;
        tracing::warn!(
            "the disk of the data directory has {available} bytes free: deleted the reserve \
             of {RESERVE} bytes that aaa keeps there for its index; writes are refused until \
             there is room for it again"
        );
        Ok(true)
    }

    /// The error of a write refused for want of space: what is free, what
    /// the store keeps, and what to do.
    pub fn full(&self) -> std::io::Error {
        let available = self
            .available()
            .map_or_else(|e| format!("unknown ({e})"), |b| b.to_string());
        std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!(
                "No space left on device: the disk of the data directory {} has {available} \
                 bytes free, and aaa keeps {SLACK} bytes free beside a reserve of {RESERVE} \
                 bytes (the file `{RESERVE_FILE}`) so that it can always start and save its \
                 index; free space on that disk, and writes resume on their own, with no \
                 restart",
                self.dir.display()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_made_once_and_counted_as_room_until_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let space = Space::new(dir.path());
        // Missing, the reserve is kept out of the room. (The kept bytes,
        // not the room, are compared: the room is the disk's free space,
        // which the other tests running beside this one change.)
        assert_eq!(space.kept(), SLACK + RESERVE);
        assert!(space.keep().unwrap(), "a temp dir has room for the reserve");
        assert_eq!(
            std::fs::metadata(dir.path().join(RESERVE_FILE))
                .unwrap()
                .len(),
            RESERVE
        );
        assert!(space.keep().unwrap());
        // Made, the reserve is on the disk instead of kept out of the room.
        assert_eq!(space.kept(), SLACK);
        assert!(!space.release_if_short().unwrap(), "the disk is not short");
        assert!(space.full().to_string().contains("No space left on device"));
    }
}
