//! A full disk, for real: the data dir on a small tmpfs, filled to the last
//! byte while the server serves. Writes are refused with
//! STORAGE_UNAVAILABLE naming the cause (not "shutting down"), health says
//! NOT_SERVING, reads still answer; once space is freed, health says
//! SERVING again by itself and writes succeed with no restart, and nothing
//! acknowledged is lost or doubled.
//! A server also starts on a disk that is full, serving reads and refusing
//! writes until space is freed, and the log's zero-filled segments leave
//! the index store a reserve of free space.
//! Needs root (mount); CI runs as root. Where a tmpfs cannot be mounted the
//! tests say so and pass without checking anything.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::*;

/// A tmpfs of `mib` MiB mounted on a temp dir; unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// `None` (and a line saying the test is skipped) where a tmpfs cannot
    /// be mounted: it takes root, which CI has.
    fn mount(mib: u32) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status();
        match status {
            Ok(status) if status.success() => Some(SmallDisk { dir }),
            other => {
                eprintln!(
                    "SKIPPED: mounting a {mib} MiB tmpfs failed ({other:?}); \
                     this test needs root (as CI has) to make a real full disk"
                );
                None
            }
        }
    }

    /// Bytes an unprivileged writer could still write.
    fn free(&self) -> u64 {
        fs2::available_space(self.path()).expect("statvfs")
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the filesystem is full; returns its path.
    fn fill(&self) -> PathBuf {
        self.fill_named("filler")
    }

    /// [`SmallDisk::fill`], with a file of that name.
    fn fill_named(&self, name: &str) -> PathBuf {
        let path = self.path().join(name);
        let mut file = std::fs::File::create(&path).expect("create filler");
        let block = vec![7u8; 64 * 1024];
        loop {
            if let Err(e) = file.write_all(&block) {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
        // Also the last partial block.
        while file.write_all(&block[..512]).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Appends `app.bulk` events of ~48 KiB; true when acknowledged.
async fn bulk(runs: &mut RunClient, run_id: &str, n: usize) -> Result<(), tonic::Status> {
    signal(
        runs,
        run_id,
        "app.bulk",
        serde_json::json!({ "n": n, "pad": "p".repeat(48 * 1024) }),
    )
    .await
    .map(|_| ())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_writes_by_name_and_they_resume_when_space_is_freed() {
    let Some(disk) = SmallDisk::mount(64) else {
        return;
    };
    let data_dir = disk.path().join("data");
    // The embedded store's disk, also when the suite runs on PostgreSQL.
    let mut server = TestServer::start_with(move |config| {
        config.data_dir = data_dir.clone();
        config.store_url = None;
    })
    .await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let waiting = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &waiting).await;
    let bulk_run = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &bulk_run).await;

    let filler = disk.fill();
    // The log's segments are zero-filled ahead of use: appends go on until
    // the next segment cannot be made.
    let mut acknowledged = 0;
    let refusal = loop {
        match bulk(&mut runs, &bulk_run, acknowledged).await {
            Ok(()) => acknowledged += 1,
            Err(status) => break status,
        }
        assert!(acknowledged < 400, "the disk never filled");
    };
    let info = assert_error(&refusal, Code::Unavailable, "STORAGE_UNAVAILABLE");
    assert!(info.reason == "STORAGE_UNAVAILABLE");
    assert!(
        refusal.message().contains("No space left on device"),
        "{refusal:?}"
    );
    wait_for_health(&server, ServingStatus::NotServing).await;
    // Reads answer, and a write is refused again rather than wedged.
    assert_eq!(get_run(&mut runs, &waiting).await.run_id, waiting);
    let again = expect_err(bulk(&mut runs, &bulk_run, acknowledged).await);
    assert_error(&again, Code::Unavailable, "STORAGE_UNAVAILABLE");

    // Once space is freed the store sees it on its own, with no write to
    // try (a load balancer that follows health would send none).
    std::fs::remove_file(filler).expect("free the space");
    wait_for_health(&server, ServingStatus::Serving).await;
    bulk(&mut runs, &bulk_run, acknowledged)
        .await
        .expect("a write once space is back");
    acknowledged += 1;

    // The run that waited through it all finishes its approval cycle.
    grant_and_finish(&mut runs, &mut workers, &waiting, &call_id).await;

    // Every acknowledged append is there once, in order, also after a restart.
    for round in 0..2 {
        let events = history(&mut server.runs().await, &bulk_run).await;
        assert_dense(&events, 1);
        let numbers: Vec<u64> = events
            .iter()
            .filter(|e| e.r#type == "app.bulk")
            .map(|e| data(e)["n"].as_u64().unwrap())
            .collect();
        assert_eq!(
            numbers,
            (0..acknowledged as u64).collect::<Vec<_>>(),
            "round {round}"
        );
        if round == 0 {
            server.restart().await;
        }
    }
    server.shutdown().await;
}

/// Issue 41 (6): after a disk-full episode the log zero-filled its next
/// segments into the space freed, and the next start failed with "No space
/// left on device". The log leaves a reserve free when space is short, and
/// a server starts on a full disk: reads answer, writes are refused with
/// STORAGE_UNAVAILABLE naming the cause, and they are taken again, with no
/// restart, once space is freed.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_starts_on_a_full_disk_serves_reads_and_takes_writes_once_space_is_freed() {
    let Some(disk) = SmallDisk::mount(64) else {
        return;
    };
    let data_dir = disk.path().join("data");
    let mut server = TestServer::start_with(move |config| {
        config.data_dir = data_dir.clone();
        config.store_url = None;
    })
    .await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let waiting = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &waiting).await;
    let bulk_run = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &bulk_run).await;
    // About 4 MiB of log: its segments have grown to a few MiB each.
    let mut acknowledged = 0;
    while acknowledged < 80 {
        bulk(&mut runs, &bulk_run, acknowledged)
            .await
            .expect("a write before the disk fills");
        acknowledged += 1;
    }

    // The disk fills; then some space is freed, and writes go on in it.
    let filler = disk.fill();
    while bulk(&mut runs, &bulk_run, acknowledged).await.is_ok() {
        acknowledged += 1;
        assert!(acknowledged < 1000, "the disk never filled");
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .and_then(|file| file.set_len(file.metadata()?.len() - (12 << 20)))
        .expect("free 12 MiB");
    wait_for_health(&server, ServingStatus::Serving).await;
    for _ in 0..40 {
        bulk(&mut runs, &bulk_run, acknowledged)
            .await
            .expect("a write once space is back");
        acknowledged += 1;
    }
    // The log's segments, made ahead of use, left room free beside the
    // reserve file the store keeps for its index (8 and 16 MiB).
    let reserve = std::fs::metadata(disk.path().join("data/reserve")).map(|m| m.len());
    assert!(
        disk.free() >= 8 << 20 && reserve.as_ref().is_ok_and(|&len| len >= 16 << 20),
        "the log left {} bytes free and the reserve is {reserve:?}; \
         it must leave 8 MiB and a reserve of 16",
        disk.free()
    );

    // A restart on a disk that is full to the last byte.
    server.stop().await;
    let filler_too = {
        let more = disk.fill_named("filler-2");
        assert_eq!(disk.free(), 0);
        more
    };
    server.resume().await;
    let mut runs = server.runs().await;
    assert_eq!(get_run(&mut runs, &waiting).await.run_id, waiting);
    let events = history(&mut runs, &bulk_run).await;
    assert_eq!(count(&events, "app.bulk"), acknowledged);
    let refusal = expect_err(bulk(&mut runs, &bulk_run, acknowledged).await);
    assert_error(&refusal, Code::Unavailable, "STORAGE_UNAVAILABLE");
    assert!(
        refusal.message().contains("No space left on device")
            && refusal.message().contains("free space"),
        "{refusal:?}"
    );
    wait_for_health(&server, ServingStatus::NotServing).await;

    // Once space is freed, writes are taken again with no restart.
    std::fs::remove_file(filler_too).expect("free the space");
    std::fs::remove_file(filler).expect("free the space");
    wait_for_health(&server, ServingStatus::Serving).await;
    bulk(&mut runs, &bulk_run, acknowledged)
        .await
        .expect("a write once space is back");
    acknowledged += 1;
    server.restart().await;
    let events = history(&mut server.runs().await, &bulk_run).await;
    assert_dense(&events, 1);
    assert_eq!(count(&events, "app.bulk"), acknowledged);
    server.shutdown().await;
}
