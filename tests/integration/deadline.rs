//! Deadlines apply (DESIGN.md §2.5), also when they pass while the server is down.
//! The runs have an hour; the tests move the server's clock past it.

use std::time::{Duration, SystemTime};

use aaa::proto::watch_approvals_response::Item;
use aaa::proto::{
    ApprovalOutcome, Budget, Event, ListApprovalsRequest, RunStatus, WatchApprovalsRequest,
};

use crate::support::*;

fn with_deadline(deadline_s: f64) -> aaa::proto::StartRunRequest {
    aaa::proto::StartRunRequest {
        budget: Some(Budget {
            deadline_s,
            ..Default::default()
        }),
        ..scripted_reference_run()
    }
}

/// The log of a run whose deadline passed while it waited for `call_id`.
#[track_caller]
fn assert_deadline_failure(events: &[Event], call_id: &str) {
    assert_eq!(
        types(events),
        [
            "aaa.run.started",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.tool.requested",
            "aaa.approval.requested",
            "aaa.approval.expired",
            "aaa.run.failed",
        ]
    );
    let expired = data(find(events, "aaa.approval.expired"));
    assert_eq!(expired["call_id"], call_id);
    assert_eq!(expired["reason"], "deadline");
    let failed = data(find(events, "aaa.run.failed"));
    assert_eq!(failed["error"]["type"], "DeadlineExceeded", "{failed}");
}

async fn assert_failed_run(server: &impl Server, run_id: &str, call_id: &str) {
    let mut runs = server.runs().await;
    let run = get_run(&mut runs, run_id).await;
    assert_eq!(run.status, RunStatus::Failed as i32);
    assert_eq!(run.error.expect("Run.error").r#type, "DeadlineExceeded");
    assert!(run.pending_approvals.is_empty());
    let request = ListApprovalsRequest {
        run_id: run_id.into(),
        ..Default::default()
    };
    assert!(list_approvals(&mut server.approvals().await, request)
        .await
        .is_empty());

    // A grant after the expiry changes nothing and says so.
    let late = grant(&mut runs, run_id, call_id).await;
    assert!(late.already_decided, "{late:?}");
    assert_eq!(late.decision, "aaa.approval.expired");
    assert_eq!(get_run(&mut runs, run_id).await.last_seq, run.last_seq);
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_expires_the_approval_and_fails_the_run() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, with_deadline(3600.0)).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let request = WatchApprovalsRequest {
        run_id: run_id.clone(),
        ..Default::default()
    };
    let mut watch = watch_approvals(&mut server.approvals().await, request).await;
    let snapshot = read_snapshot(&mut watch).await;
    assert_eq!(snapshot.len(), 1);
    assert!(
        snapshot[0].expires_at.is_some(),
        "the approval should say when it expires"
    );

    server.clock().advance(Duration::from_secs(3601));
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_deadline_failure(&events, &call_id);
    let resolved = next_watch_change(&mut watch).await;
    let Some(Item::Resolved(resolution)) = resolved.item else {
        panic!("expected the expiry, got {:?}", resolved.item);
    };
    assert_eq!(resolution.call_id, call_id);
    assert_eq!(resolution.outcome, ApprovalOutcome::Expired as i32);
    drop(watch);

    assert_failed_run(&server, &run_id, &call_id).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_that_passed_while_down_fires_at_startup() {
    let mut server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, with_deadline(3600.0)).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let deadline_at = get_run(&mut runs, &run_id)
        .await
        .deadline_at
        .expect("Run.deadline_at");
    let deadline_at = SystemTime::try_from(deadline_at).expect("deadline_at");

    server.stop().await;
    // The point of this test: the deadline passes while the server is down.
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(server.clock().now_ms() as u64);
    let left = deadline_at.duration_since(now).unwrap_or_default();
    assert!(
        left > Duration::ZERO,
        "the deadline passed before the server was down; raise deadline_s"
    );
    server.clock().advance(left + Duration::from_secs(1));
    let restarted_at =
        SystemTime::UNIX_EPOCH + Duration::from_millis(server.clock().now_ms() as u64);
    server.resume().await;

    let mut runs = server.runs().await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_deadline_failure(&events, &call_id);
    let expired = find(&events, "aaa.approval.expired");
    let expired_at = SystemTime::try_from(expired.time.expect("Event.time")).expect("time");
    assert!(
        expired_at >= restarted_at,
        "the expiry must have been appended after the restart"
    );

    assert_failed_run(&server, &run_id, &call_id).await;
    server.shutdown().await;
}

/// A run may shorten a tool's approval timeout, or set one where the tool
/// has none, never lengthen it: a longer one would leave its requests open
/// to a grant for longer than the tool's gate allows (docs/auth.md), and
/// StartRun is open to every runner. Refused by name, nothing started.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_may_shorten_a_tools_approval_timeout_never_lengthen_it() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let gated = aaa::proto::ToolDefinition {
        approval_timeout_s: 600.0,
        ..wire_money()
    };
    let untimed = aaa::proto::ToolDefinition {
        name: "send_email".into(),
        ..wire_money()
    };
    register(&mut server.workers().await, vec![gated, untimed], &[]).await;
    let with_timeout = |tool: &str, approval_timeout_s: f64| {
        let mut start = scripted_run(tool, REFERENCE_ARGS);
        start.tools[0].approval_timeout_s = approval_timeout_s;
        start
    };

    let status = expect_err(runs.start_run(with_timeout("wire_money", 7200.0)).await);
    let info = assert_error(&status, tonic::Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "tools[0].approval_timeout_s");
    assert!(
        status.message().contains("7200 s") && status.message().contains("600 s"),
        "{status:?}"
    );
    assert_eq!(list_runs_count(&mut runs).await, 0, "nothing started");

    // Shorter than the tool's, and one where the tool has none.
    for (tool, timeout) in [("wire_money", 60), ("send_email", 7200)] {
        let run_id = start_run(&mut runs, with_timeout(tool, timeout as f64)).await;
        wait_for_approval(&mut runs, &run_id).await;
        let pending = list_approvals(
            &mut server.approvals().await,
            ListApprovalsRequest {
                run_id: run_id.clone(),
                ..Default::default()
            },
        )
        .await;
        let expires_at = pending[0].expires_at.expect("Approval.expires_at");
        let requested_at = pending[0].requested_at.expect("Approval.requested_at");
        assert_eq!(expires_at.seconds - requested_at.seconds, timeout, "{tool}");
    }
    server.shutdown().await;
}

/// A tool's `approval_timeout_s` denies a call nobody decided in time, with
/// reason `timeout`; the model reads the denial as the tool's result.
#[tokio::test(flavor = "multi_thread")]
async fn an_undecided_approval_times_out_as_a_denial() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let tool = aaa::proto::ToolDefinition {
        approval_timeout_s: 600.0,
        ..wire_money()
    };
    register(&mut server.workers().await, vec![tool], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let pending = list_approvals(&mut server.approvals().await, Default::default()).await;
    let expires_at = pending[0].expires_at.expect("Approval.expires_at");
    let requested_at = pending[0].requested_at.expect("Approval.requested_at");
    assert_eq!(expires_at.seconds - requested_at.seconds, 600);

    server.clock().advance(Duration::from_secs(601));
    let events = wait_for_end(&mut runs, &run_id).await;
    let denied = data(find(&events, "aaa.approval.denied"));
    assert_eq!(denied["call_id"], call_id.as_str());
    assert_eq!(denied["reason"], "timeout");
    let failed = data(find(&events, "aaa.tool.failed"));
    assert_eq!(failed["error"]["type"], "ApprovalDenied", "{failed}");
    assert_eq!(count(&events, "aaa.tool.started"), 0);
    assert_eq!(
        get_run(&mut runs, &run_id).await.status,
        RunStatus::Completed as i32
    );
    server.shutdown().await;
}
