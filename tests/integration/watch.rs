//! WatchApprovals and ListApprovals: one client watches, another decides.

use std::collections::HashMap;

use aaa::proto::watch_approvals_response::Item;
use aaa::proto::{ApprovalOutcome, ListApprovalsRequest, WatchApprovalsRequest};

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn watcher_sees_the_request_and_its_resolution() {
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;

    // Third connection: the watcher, started before anything is pending.
    let mut watcher = server.approvals().await;
    let request = WatchApprovalsRequest {
        heartbeat_s: 0.2,
        ..Default::default()
    };
    let mut watch = watch_approvals(&mut watcher, request).await;
    assert!(read_snapshot(&mut watch).await.is_empty());

    // First connection starts the run.
    let mut starter = server.runs().await;
    let run_id = start_run(&mut starter, scripted_reference_run()).await;
    let requested = next_watch_change(&mut watch).await;
    let Some(Item::Requested(approval)) = requested.item else {
        panic!("expected the request, got {:?}", requested.item);
    };
    assert_eq!(approval.run_id, run_id);
    assert_eq!(approval.tool, "wire_money");
    assert_eq!(approval.task, "Pay ACME $250");
    assert_eq!(approval.arguments_json, REFERENCE_ARGS);
    assert!(!approval.call_id.is_empty());
    assert!(approval.seq > 0);
    assert_eq!(approval.position, requested.position);

    // Second connection grants.
    let mut approver = server.runs().await;
    let decision = grant(&mut approver, &run_id, &approval.call_id).await;
    let resolved = next_watch_change(&mut watch).await;
    let Some(Item::Resolved(resolution)) = resolved.item else {
        panic!("expected the resolution, got {:?}", resolved.item);
    };
    assert_eq!(resolution.run_id, run_id);
    assert_eq!(resolution.call_id, approval.call_id);
    assert_eq!(resolution.tool, "wire_money");
    assert_eq!(resolution.outcome, ApprovalOutcome::Granted as i32);
    assert_eq!(resolution.seq, decision.seq);
    assert!(
        resolved.position > requested.position,
        "positions must grow"
    );

    assert_eq!(
        completed_text(&wait_for_end(&mut starter, &run_id).await),
        REFERENCE_TEXT
    );
    drop(watch);
    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_watch_sends_heartbeats() {
    let server = TestServer::start().await;
    let mut approvals = server.approvals().await;
    let request = WatchApprovalsRequest {
        heartbeat_s: 0.2,
        ..Default::default()
    };
    let mut watch = watch_approvals(&mut approvals, request).await;
    read_snapshot(&mut watch).await;
    let item = next_watch_item(&mut watch).await;
    assert!(
        matches!(item, Item::Heartbeat(_)),
        "expected a heartbeat, got {item:?}"
    );
    drop(watch);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_and_list_apply_filters() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let mut run_ids = Vec::new();
    for team in ["a", "b"] {
        let mut request = scripted_reference_run();
        request.labels = HashMap::from([("team".to_string(), team.to_string())]);
        let run_id = start_run(&mut runs, request).await;
        wait_for_approval(&mut runs, &run_id).await;
        run_ids.push(run_id);
    }
    let team_a = HashMap::from([("team".to_string(), "a".to_string())]);
    let mut approvals = server.approvals().await;

    let all = list_approvals(&mut approvals, ListApprovalsRequest::default()).await;
    assert_eq!(all.len(), 2);
    let by_label = ListApprovalsRequest {
        labels: team_a.clone(),
        ..Default::default()
    };
    let listed = list_approvals(&mut approvals, by_label).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].run_id, run_ids[0]);
    assert_eq!(listed[0].labels, team_a);
    let by_tool = ListApprovalsRequest {
        tool: "other_tool".into(),
        ..Default::default()
    };
    assert!(list_approvals(&mut approvals, by_tool).await.is_empty());

    let request = WatchApprovalsRequest {
        labels: team_a,
        ..Default::default()
    };
    let mut watch = watch_approvals(&mut approvals, request).await;
    let snapshot = read_snapshot(&mut watch).await;
    assert_eq!(snapshot.len(), 1);
    assert_eq!(snapshot[0].run_id, run_ids[0]);
    drop(watch);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_resumes_after_a_position() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let mut approvals = server.approvals().await;

    let mut watch = watch_approvals(&mut approvals, WatchApprovalsRequest::default()).await;
    read_snapshot(&mut watch).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let requested = next_watch_change(&mut watch).await;
    let Some(Item::Requested(approval)) = requested.item else {
        panic!("expected the request, got {:?}", requested.item);
    };
    drop(watch);

    // Decided while nobody watched; the resumed watch skips the snapshot.
    deny(&mut runs, &run_id, &approval.call_id, "no").await;
    let request = WatchApprovalsRequest {
        after_position: Some(requested.position),
        ..Default::default()
    };
    let mut watch = watch_approvals(&mut approvals, request).await;
    let resolved = next_watch_change(&mut watch).await;
    let Some(Item::Resolved(resolution)) = resolved.item else {
        panic!("expected the resolution first, got {:?}", resolved.item);
    };
    assert_eq!(resolution.call_id, approval.call_id);
    assert_eq!(resolution.outcome, ApprovalOutcome::Denied as i32);
    assert_eq!(resolution.reason, "no");
    drop(watch);
    server.shutdown().await;
}
