//! A full disk, for real: the data dir on a small tmpfs, filled to the last
//! byte while the server serves. Writes are refused with
//! STORAGE_UNAVAILABLE naming the cause (not "shutting down"), health says
//! NOT_SERVING, reads still answer; once space is freed, health says
//! SERVING again by itself and writes succeed with no restart, and nothing
//! acknowledged is lost or doubled.
//! Needs root (mount); CI runs as root.

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
    fn mount(mib: u32) -> SmallDisk {
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs failed ({status}): this test needs root, as CI has"
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the filesystem is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
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
    let disk = SmallDisk::mount(24);
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
