//! Waiting is durable (DESIGN.md §2.4, §2.7): a pending approval survives a
//! graceful restart and a kill -9, and granting it afterwards completes the run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use aaa::proto::{ListApprovalsRequest, RunStatus, WatchApprovalsRequest};

use crate::support::*;

/// Before the restart: a run waiting for its approval. Returns (run_id, call_id).
async fn start_waiting_run(server: &impl Server) -> (String, String) {
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    (run_id, call_id)
}

/// After the restart: the approval is still pending, granting it completes the run.
async fn finish_waiting_run(server: &impl Server, run_id: &str, call_id: &str) {
    let mut runs = server.runs().await;
    let mut approvals = server.approvals().await;

    let listed = list_approvals(&mut approvals, ListApprovalsRequest::default()).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].run_id.as_str(), listed[0].call_id.as_str()),
        (run_id, call_id)
    );
    assert_eq!(listed[0].arguments_json, REFERENCE_ARGS);
    let mut watch = watch_approvals(&mut approvals, WatchApprovalsRequest::default()).await;
    let snapshot = read_snapshot(&mut watch).await;
    drop(watch);
    assert_eq!(snapshot.len(), 1, "{snapshot:?}");
    assert_eq!(
        (snapshot[0].run_id.as_str(), snapshot[0].call_id.as_str()),
        (run_id, call_id)
    );
    assert_eq!(
        get_run(&mut runs, run_id).await.status,
        RunStatus::WaitingForApproval as i32
    );

    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(server, "payments-2", &["wire_money"], &[]).await;
    let decision = grant(&mut runs, run_id, call_id).await;
    assert!(!decision.already_decided);
    let events = wait_for_end(&mut runs, run_id).await;
    assert_eq!(types(&events), REFERENCE_TYPES);
    assert_dense(&events, 1);
    assert_eq!(completed_text(&events), REFERENCE_TEXT);
    assert_eq!(worker.stop().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_approval_survives_a_graceful_restart() {
    let mut server = TestServer::start().await;
    let (run_id, call_id) = start_waiting_run(&server).await;
    server.restart().await;
    finish_waiting_run(&server, &run_id, &call_id).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_approval_survives_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ChildServer::start(dir.path()).await;
    let (run_id, call_id) = start_waiting_run(&server).await;
    server.kill9();

    let server = ChildServer::start(dir.path()).await;
    finish_waiting_run(&server, &run_id, &call_id).await;
    drop(server);
}

/// Appends of more than a checkpoint's worth (16 MiB) of events, over
/// several log segments: the pointers to some reach sled's file at a
/// checkpoint, the rest stay in memory and are made again from the log at
/// open. Every acknowledged event is there, in order, with its data, before
/// and after a kill -9.
#[tokio::test(flavor = "multi_thread")]
async fn events_before_and_after_a_checkpoint_survive_kill_9() {
    const EVENTS: usize = 300;
    let check = |events: &[aaa::proto::Event], filler: &str| {
        assert_dense(events, 1);
        assert_eq!(bulk_numbers(events), (0..EVENTS as u64).collect::<Vec<_>>());
        assert_eq!(data(events.last().unwrap())["filler"], filler);
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ChildServer::start(dir.path()).await;
    let (run_id, _) = start_waiting_run(&server).await;
    let mut runs = server.runs().await;
    let filler = "x".repeat(60 * 1024);
    for n in 0..EVENTS {
        let data = serde_json::json!({ "n": n, "filler": filler });
        signal(&mut runs, &run_id, "app.bulk", data)
            .await
            .expect("Signal");
    }
    if !on_postgres() {
        let segments = std::fs::read_dir(dir.path().join("data").join("log"))
            .expect("the log")
            .filter(|entry| {
                let path = entry.as_ref().expect("a log entry").path();
                path.extension().is_some_and(|e| e == "seg")
            })
            .count();
        assert!(
            segments >= 6,
            "18 MB of events span the log's first segments (1, 1, 2, 4, 8, 16 MiB): {segments}"
        );
    }
    check(&history(&mut runs, &run_id).await, &filler);
    server.kill9();

    let server = ChildServer::start(dir.path()).await;
    check(&history(&mut server.runs().await, &run_id).await, &filler);
    drop(server);
}

/// A kill -9 in the middle of appends from several clients, after several
/// checkpoints (one may be running when the kill lands): every event a
/// client was told is on disk is there after the restart, each run's
/// history dense and in order, the unanswered last one there or not.
#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_events_survive_kill_9_in_the_middle_of_appends() {
    const WRITERS: usize = 4;
    // 16 KiB each: about 40 MB of log, past two 16 MiB checkpoints.
    const KILL_AFTER: usize = 2_400;
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ChildServer::start(dir.path()).await;
    let filler = "y".repeat(16 * 1024);
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let enough = Arc::new(tokio::sync::Notify::new());
    let mut writers = Vec::new();
    for _ in 0..WRITERS {
        let (run_id, _) = start_waiting_run(&server).await;
        let mut runs = server.runs().await;
        let (filler, acknowledged, enough) = (filler.clone(), acknowledged.clone(), enough.clone());
        writers.push(tokio::spawn(async move {
            // Writes n = 0, 1, ... until the server is gone; returns how
            // many were acknowledged.
            let mut n = 0u64;
            loop {
                let data = serde_json::json!({ "n": n, "filler": filler });
                if signal(&mut runs, &run_id, "app.bulk", data).await.is_err() {
                    return (run_id, n);
                }
                n += 1;
                if acknowledged.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER {
                    enough.notify_one();
                }
            }
        }));
    }
    // A writer that failed before the kill would leave this waiting.
    let reached = tokio::time::timeout(WAIT, enough.notified()).await;
    reached.expect("the writers were acknowledged KILL_AFTER events");
    server.kill9();
    let mut written = Vec::new();
    for writer in writers {
        written.push(writer.await.expect("writer task"));
    }

    let server = ChildServer::start(dir.path()).await;
    let mut runs = server.runs().await;
    for (run_id, acked) in written {
        let events = history(&mut runs, &run_id).await;
        assert_dense(&events, 1);
        let bulk = bulk_numbers(&events);
        let kept = bulk.len() as u64;
        assert!(
            kept == acked || kept == acked + 1,
            "{kept} kept, {acked} acknowledged"
        );
        assert_eq!(bulk, (0..kept).collect::<Vec<_>>());
        let head = get_run(&mut runs, &run_id).await;
        assert_eq!(head.last_seq, events.last().unwrap().seq);
    }
    drop(server);
}

/// The `n` of each `app.bulk` event, in order.
fn bulk_numbers(events: &[aaa::proto::Event]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e.r#type == "app.bulk")
        .map(|e| data(e)["n"].as_u64().unwrap())
        .collect()
}

/// Application events move a run's head without changing its status: GetRun
/// and ListRuns show the last seq and time of the newest event (the stored
/// summary is only rewritten when the status changes), before and after a
/// kill -9.
#[tokio::test(flavor = "multi_thread")]
async fn application_events_move_the_runs_head() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ChildServer::start(dir.path()).await;
    let (run_id, _) = start_waiting_run(&server).await;
    let mut runs = server.runs().await;
    let parked = get_run(&mut runs, &run_id).await;
    let mut last = 0;
    for n in 0..3 {
        let note = serde_json::json!({ "n": n });
        last = signal(&mut runs, &run_id, "app.note", note)
            .await
            .expect("Signal")
            .seq;
    }
    assert_eq!(last, parked.last_seq + 3);

    let check = |run: &aaa::proto::Run| {
        assert_eq!(run.last_seq, last, "{run:?}");
        assert_eq!(run.status, RunStatus::WaitingForApproval as i32);
        let (before, after) = (parked.updated_at.unwrap(), run.updated_at.unwrap());
        assert!((after.seconds, after.nanos) >= (before.seconds, before.nanos));
    };
    check(&get_run(&mut runs, &run_id).await);
    let listed = runs
        .list_runs(aaa::proto::ListRunsRequest::default())
        .await
        .expect("ListRuns")
        .into_inner();
    check(
        listed
            .runs
            .iter()
            .find(|r| r.run_id == run_id)
            .expect("listed"),
    );
    let events = history(&mut runs, &run_id).await;
    let newest = events.last().expect("events");
    assert_eq!((newest.seq, newest.r#type.as_str()), (last, "app.note"));
    assert_eq!(get_run(&mut runs, &run_id).await.updated_at, newest.time);
    server.kill9();

    let server = ChildServer::start(dir.path()).await;
    let mut runs = server.runs().await;
    check(&get_run(&mut runs, &run_id).await);
    assert_eq!(get_run(&mut runs, &run_id).await.updated_at, newest.time);
    drop(server);
}

/// A data directory of an older layout is refused by name and path (exit
/// 64, bad configuration), and the server never says it serves (the line
/// test harnesses wait for comes after the store opened).
#[test]
fn a_data_dir_of_an_older_layout_is_refused_before_serving() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("wal"), b"").expect("an old layout's file");
    let output = serve_refused(dir.path(), &["--listen", "127.0.0.1:0"]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the data directory has layout version 1; this aaa reads version 5 only"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&dir.path().display().to_string()),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "{output:?}");
}

/// A worker-served model's attempt handed out before a kill -9 is not
/// handed out again: the restarted server offers the call as the next
/// attempt, the first holder's heartbeat and result are refused as stale,
/// and the completion names the worker that really answered (issue 40,
/// item 8: both held attempt 1 and both heartbeats answered OK).
#[tokio::test(flavor = "multi_thread")]
async fn a_model_attempt_held_across_kill_9_is_never_held_twice() {
    use aaa::proto::complete_task_request::Result::Reply;
    use aaa::proto::{task::Kind, CompleteTaskRequest, HeartbeatTaskRequest};

    let dir = tempfile::tempdir().expect("temp dir");
    let server = ChildServer::start(dir.path()).await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &["seed"]).await;
    let run_id = start_run(&mut runs, seed_reference_run()).await;
    let first = poll_until_task(&mut server.workers().await, "model-1", &[], &["seed"]).await;
    assert_eq!((first.run_id.as_str(), first.attempt), (run_id.as_str(), 1));
    server.kill9();

    let server = ChildServer::start(dir.path()).await;
    let mut workers = server.workers().await;
    let second = poll_until_task(&mut workers, "model-2", &[], &["seed"]).await;
    assert_eq!(second.call_id, first.call_id);
    assert_eq!(
        second.attempt, 2,
        "the restarted server handed out attempt 1 again"
    );
    let stale = workers
        .heartbeat_task(HeartbeatTaskRequest {
            token: first.token.clone(),
        })
        .await
        .expect_err("the first holder's attempt is superseded");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    let Some(Kind::Model(task)) = second.kind.as_ref() else {
        panic!("a model task: {second:?}")
    };
    let reply = seed_reply(task);
    let refused = workers
        .complete_task(CompleteTaskRequest {
            token: first.token.clone(),
            result: Some(Reply(reply.clone())),
        })
        .await
        .expect_err("the first holder's reply is stale");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    workers
        .complete_task(CompleteTaskRequest {
            token: second.token.clone(),
            result: Some(Reply(reply)),
        })
        .await
        .expect("the second holder's reply");
    let events = history(&mut server.runs().await, &run_id).await;
    let completed = events
        .iter()
        .find(|e| e.r#type == "aaa.llm.completed")
        .expect("the model call completed");
    let actor = completed.actor.as_ref().expect("an actor");
    assert_eq!(actor.name, "model-2", "{actor:?}");
    drop(server);
}

/// Issue 44: a second server on a data dir another one serves from says
/// which server holds it (its pid) and what to do, not a raw lock error.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_server_on_a_held_data_dir_names_the_server_that_holds_it() {
    if on_postgres() {
        // The data dir is the embedded store's; PostgreSQL has no such lock.
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let first = ChildServer::start(dir.path()).await;
    let output = serve_refused(&dir.path().join("data"), &["--listen", "127.0.0.1:0"]);
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let holder = format!("another aaa server (pid {}) holds", first.pid());
    assert!(stderr.contains(&holder), "{stderr}");
    assert!(
        stderr.contains("stop it") && stderr.contains("--data-dir"),
        "{stderr}"
    );
    assert!(!stderr.contains("WouldBlock"), "{stderr}");
    // The first server serves on, undisturbed.
    wait_for_health(
        &first,
        tonic_health::pb::health_check_response::ServingStatus::Serving,
    )
    .await;
    first.stop();
}
