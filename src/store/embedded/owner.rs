//! Which process has the data directory: a lock file, `aaa.lock`, that a
//! store locks before it opens sled and that names its process id, so a
//! second server on the same directory can say which server holds it.
//!
//! Holding it also makes the open of sled's own lock (on `db`) certain.
//! sled's I/O threads may still hold its locked file for a moment after
//! the last handle on a database is dropped (a task of its thread pool ends
//! only after the flush it did has been reported), so a store closed in
//! this process could make the next open fail, now and then, with
//! "could not acquire lock". Only a store that holds `aaa.lock` opens
//! sled: a lock on `db` seen while holding it is such a closing handle, and
//! the open waits until it is let go.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{Result, StoreError};

/// The lock file, in the data directory.
const LOCK_FILE: &str = "aaa.lock";
/// How long an open waits for sled's lock on a directory it owns: the I/O
/// threads of a closed store let go in milliseconds; a process that is not
/// an aaa server of this version (an older one) would hold it for good.
const SLED_RELEASE: Duration = Duration::from_secs(10);

/// The lock on the data directory, held while the store is open; let go
/// when dropped (the file is closed).
pub(super) struct Owner {
    _file: File,
}

/// Locks `dir` for this process and writes its pid into the lock file, or
/// says which server holds it; then waits for sled's lock on `db` to be
/// free, for sled to take.
pub(super) fn acquire(dir: &Path) -> Result<Owner> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(held(dir, &path)),
        Err(TryLockError::Error(e)) => return Err(e.into()),
    }
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    sled_released(dir)?;
    Ok(Owner { _file: file })
}

/// The error for a directory another store holds.
fn held(dir: &Path, path: &Path) -> StoreError {
    let pid = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok());
    let who = match pid {
        Some(pid) if pid == std::process::id() => {
            return StoreError::Unavailable(format!(
                "the data directory {} is already open in this process",
                dir.display()
            ))
        }
        Some(pid) => format!("another aaa server (pid {pid})"),
        None => "another aaa server (its pid not written yet)".to_string(),
    };
    StoreError::Unavailable(format!(
        "{who} holds the data directory {}: stop it first, or give this server \
         another --data-dir",
        dir.display()
    ))
}

/// Waits until nobody holds sled's lock on `dir/db` (or there is no such
/// file yet), at most [`SLED_RELEASE`].
fn sled_released(dir: &Path) -> Result<()> {
    let db = dir.join("db");
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let Ok(file) = File::open(&db) else {
            return Ok(());
        };
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::Error(e)) => return Err(e.into()),
            Err(TryLockError::WouldBlock) if started.elapsed() >= SLED_RELEASE => {
                return Err(StoreError::Unavailable(format!(
                    "another process holds the database file {} (an aaa server older than \
                     this one?): stop it first, or give this server another --data-dir",
                    db.display()
                )));
            }
            Err(TryLockError::WouldBlock) => {}
        }
        drop(file);
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_directory_is_refused_naming_its_holder_and_free_once_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let owner = acquire(dir.path()).unwrap();
        let error = acquire(dir.path()).err().expect("held");
        assert!(
            error.to_string().contains("already open in this process"),
            "{error}"
        );
        // Another process's pid, as a second server would read it.
        std::fs::write(dir.path().join(LOCK_FILE), "4242\n").unwrap();
        let error = acquire(dir.path()).err().expect("held");
        assert!(
            error
                .to_string()
                .contains("another aaa server (pid 4242) holds the data directory"),
            "{error}"
        );
        drop(owner);
        acquire(dir.path()).expect("free once let go");
    }
}
