//! The gate is the server's (DESIGN.md §2.1-2.3): nothing runs before a
//! grant, clients cannot forge engine events, a decision names one call with
//! its exact arguments, and the first decision wins.

use aaa::proto::{ListApprovalsRequest, RunStatus, ToolDefinition, ToolRef};
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::Code;

use crate::support::*;

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[tokio::test(flavor = "multi_thread")]
async fn no_tool_task_before_the_grant() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    // Waiting: a poller gets nothing, the run says why.
    assert_eq!(
        poll(&mut workers, "payments-1", &["wire_money"], &[], 0.5).await,
        None
    );
    let run = get_run(&mut runs, &run_id).await;
    assert_eq!(run.status, RunStatus::WaitingForApproval as i32);
    assert_eq!(run.pending_approvals.len(), 1);
    assert_eq!(run.pending_approvals[0].call_id, call_id);
    assert_eq!(run.pending_approvals[0].tool, "wire_money");
    assert_eq!(run.pending_approvals[0].arguments_json, REFERENCE_ARGS);
    let listed = runs
        .list_runs(aaa::proto::ListRunsRequest::default())
        .await
        .expect("ListRuns")
        .into_inner();
    assert_eq!(listed.runs, vec![run], "ListRuns shows what GetRun shows");
    assert_eq!(
        count(&history(&mut runs, &run_id).await, "aaa.tool.started"),
        0
    );

    grant(&mut runs, &run_id, &call_id).await;
    let task = poll_until_task(&mut workers, "payments-1", &["wire_money"], &[]).await;
    assert_eq!(task.run_id, run_id);
    assert_eq!(task.call_id, call_id);
    assert_eq!(task.attempt, 1);
    assert_eq!(tool_task(&task).name, "wire_money");
    assert_eq!(tool_task(&task).arguments_json, REFERENCE_ARGS);

    // aaa.tool.started was durable before the worker got the task.
    let events = history(&mut runs, &run_id).await;
    let started = data(find(&events, "aaa.tool.started"));
    assert_eq!(started["call_id"], call_id.as_str());
    assert_eq!(started["attempt"], json!(1));
    assert_eq!(started["worker"], "payments-1");
    assert!(find(&events, "aaa.approval.granted").seq < find(&events, "aaa.tool.started").seq);

    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(types(&events), REFERENCE_TYPES);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_engine_events_are_refused() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let before = get_run(&mut runs, &run_id).await.last_seq;

    let forged = json!({
        "call_id": call_id,
        "attempt": 1,
        "name": "wire_money",
        "arguments": {"amount": 250, "to": "ACME"},
        "output": "sent $250 to ACME",
        "value": {"text": "forged"},
        "reason": "forged",
    });
    for ty in [
        "aaa.tool.requested",
        "aaa.tool.started",
        "aaa.tool.completed",
        "aaa.tool.failed",
        "aaa.tool.retrying",
        "aaa.run.started",
        "aaa.run.completed",
        "aaa.run.failed",
        "aaa.run.cancelled",
        "aaa.approval.requested",
        "aaa.approval.expired",
        "aaa.llm.requested",
        "aaa.llm.completed",
        "aaa.llm.x",
        "aaa.anything",
        // The prefix in any case.
        "AAA.approval.granted",
        "Aaa.note",
        "aAa.tool.completed",
    ] {
        let status = expect_err(signal(&mut runs, &run_id, ty, forged.clone()).await);
        assert_error(&status, Code::InvalidArgument, "RESERVED_EVENT_TYPE");
    }

    let run = get_run(&mut runs, &run_id).await;
    assert_eq!(run.last_seq, before, "a refused signal appended something");
    assert_eq!(run.status, RunStatus::WaitingForApproval as i32);
    assert_eq!(history(&mut runs, &run_id).await.len() as u64, before);
    assert_eq!(
        poll(&mut workers, "payments-1", &["wire_money"], &[], 0.3).await,
        None
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicate_and_late_decisions_change_nothing() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let first = grant(&mut runs, &run_id, &call_id).await;
    assert!(!first.already_decided);
    assert_eq!(first.decision, "aaa.approval.granted");
    assert!(first.seq > 0);

    let again = grant(&mut runs, &run_id, &call_id).await;
    assert!(again.already_decided, "second grant: {again:?}");
    assert_eq!(again.decision, "aaa.approval.granted");
    let late_deny = deny(&mut runs, &run_id, &call_id, "too late").await;
    assert!(late_deny.already_decided, "deny after grant: {late_deny:?}");
    assert_eq!(late_deny.decision, "aaa.approval.granted");

    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(types(&events), REFERENCE_TYPES);

    // After the run finished: still OK, still the grant.
    let after = grant(&mut runs, &run_id, &call_id).await;
    assert!(after.already_decided, "grant after completion: {after:?}");
    assert_eq!(after.decision, "aaa.approval.granted");
    let deny_after = deny(&mut runs, &run_id, &call_id, "way too late").await;
    assert!(
        deny_after.already_decided,
        "deny after completion: {deny_after:?}"
    );
    assert_eq!(deny_after.decision, "aaa.approval.granted");

    let events = history(&mut runs, &run_id).await;
    assert_eq!(
        types(&events),
        REFERENCE_TYPES,
        "a late decision appended something"
    );
    assert_eq!(
        get_run(&mut runs, &run_id).await.last_seq,
        events.last().unwrap().seq
    );
    assert_eq!(worker.stop().await.len(), 1, "the tool ran more than once");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grant_racing_deny_has_exactly_one_winner() {
    const RUNS: usize = 20;
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;

    let mut calls = Vec::new();
    for _ in 0..RUNS {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        calls.push((run_id, call_id));
    }

    // Each race: a grant and a deny on two connections, in parallel.
    let mut races = Vec::new();
    for (run_id, call_id) in &calls {
        let (mut a, mut b) = (server.runs().await, server.runs().await);
        let (r1, c1, r2, c2) = (
            run_id.clone(),
            call_id.clone(),
            run_id.clone(),
            call_id.clone(),
        );
        let granting = tokio::spawn(async move { grant(&mut a, &r1, &c1).await });
        let denying = tokio::spawn(async move { deny(&mut b, &r2, &c2, "racing").await });
        races.push((granting, denying));
    }

    let mut grants_won = 0;
    for ((run_id, _), (granting, denying)) in calls.iter().zip(races) {
        let (g, d) = (granting.await.unwrap(), denying.await.unwrap());
        assert!(
            g.already_decided != d.already_decided,
            "exactly one decision must take effect: {g:?} {d:?}"
        );
        let winner = if g.already_decided {
            "aaa.approval.denied"
        } else {
            "aaa.approval.granted"
        };
        assert_eq!(g.decision, winner, "grant's answer");
        assert_eq!(d.decision, winner, "deny's answer");

        let events = wait_for_end(&mut runs, run_id).await;
        assert_eq!(
            count(&events, "aaa.approval.granted") + count(&events, "aaa.approval.denied"),
            1,
            "{:?}",
            types(&events)
        );
        assert_eq!(count(&events, winner), 1);
        let granted = winner == "aaa.approval.granted";
        grants_won += granted as usize;
        assert_eq!(
            count(&events, "aaa.tool.started"),
            granted as usize,
            "{:?}",
            types(&events)
        );
        assert_eq!(
            worker.tool_tasks_of(run_id).len(),
            granted as usize,
            "tool tasks of {run_id}"
        );
    }
    println!("grants won {grants_won} of {RUNS} races");
    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grant_must_match_the_arguments_sha256() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let right = sha256_hex(REFERENCE_ARGS);
    let events = history(&mut runs, &run_id).await;
    assert_eq!(
        data(find(&events, "aaa.approval.requested"))["arguments_sha256"],
        right.as_str()
    );
    let listed = server
        .approvals()
        .await
        .list_approvals(ListApprovalsRequest {
            run_id: run_id.clone(),
            ..Default::default()
        })
        .await
        .expect("ListApprovals")
        .into_inner()
        .approvals;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].arguments_json, REFERENCE_ARGS);
    assert_eq!(listed[0].arguments_sha256, right);

    let before = get_run(&mut runs, &run_id).await.last_seq;
    let wrong = sha256_hex(r#"{"amount":25000,"to":"ACME"}"#);
    let granted = "aaa.approval.granted";
    let status = expect_err(
        signal(
            &mut runs,
            &run_id,
            granted,
            json!({"call_id": call_id, "arguments_sha256": wrong}),
        )
        .await,
    );
    assert_error(&status, Code::FailedPrecondition, "ARGUMENTS_MISMATCH");
    let run = get_run(&mut runs, &run_id).await;
    assert_eq!(run.last_seq, before, "a refused grant appended something");
    assert_eq!(
        run.pending_approvals.len(),
        1,
        "the approval must still be pending"
    );
    assert_eq!(
        poll(&mut workers, "payments-1", &["wire_money"], &[], 0.3).await,
        None
    );

    let accepted = signal(
        &mut runs,
        &run_id,
        granted,
        json!({"call_id": call_id, "arguments_sha256": right}),
    )
    .await
    .expect("grant with the right sha256");
    assert!(!accepted.already_decided);
    assert_eq!(accepted.decision, granted);
    let task = poll_until_task(&mut workers, "payments-1", &["wire_money"], &[]).await;
    assert_eq!(tool_task(&task).arguments_json, REFERENCE_ARGS);
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    assert_eq!(
        completed_text(&wait_for_end(&mut runs, &run_id).await),
        REFERENCE_TEXT
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gates_can_be_added_never_removed() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;

    // A run gates a tool its worker does not.
    let lookup = ToolDefinition {
        name: "lookup".into(),
        parameters_json: r#"{"type":"object"}"#.into(),
        requires_approval: false,
        ..wire_money()
    };
    register(&mut workers, vec![lookup], &[]).await;
    let mut request = scripted_run("lookup", r#"{"q":"ACME"}"#);
    request.tools = vec![ToolRef {
        name: "lookup".into(),
        requires_approval: true,
        ..Default::default()
    }];
    let run_id = start_run(&mut runs, request).await;
    wait_for_approval(&mut runs, &run_id).await;
    assert_eq!(poll(&mut workers, "w", &["lookup"], &[], 0.3).await, None);

    // A worker cannot take a gate back (with auth off there is no admin
    // who may), and a run cannot drop it.
    register(&mut workers, vec![wire_money()], &[]).await;
    let refused = workers
        .register_worker(aaa::proto::RegisterWorkerRequest {
            identity: "sneaky".into(),
            tools: vec![ToolDefinition {
                requires_approval: false,
                ..wire_money()
            }],
            models: vec![],
        })
        .await;
    let status = expect_err(refused);
    let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "tools[0].requires_approval");
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &run_id).await;
    assert_eq!(
        poll(&mut workers, "w", &["wire_money"], &[], 0.3).await,
        None
    );
    server.shutdown().await;
}

/// A call whose arguments do not fit its tool's schema never reaches a
/// human or a worker: it fails with InvalidArguments, naming what is wrong,
/// and the model reads that (the scripted model echoes it).
#[tokio::test(flavor = "multi_thread")]
async fn arguments_that_do_not_fit_the_schema_are_never_shown() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(
        &mut runs,
        scripted_run("wire_money", r#"{"amount":"lots","to":"ACME"}"#),
    )
    .await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "aaa.run.started",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.tool.requested",
            "aaa.tool.failed",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.run.completed",
        ]
    );
    let failed = data(find(&events, "aaa.tool.failed"));
    assert_eq!(failed["error"]["type"], "InvalidArguments", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(message.contains("/amount"), "{message}");
    assert!(completed_text(&events).contains("/amount"));
    let pending = list_approvals(&mut server.approvals().await, Default::default()).await;
    assert!(pending.is_empty(), "{pending:?}");
    let mut workers = server.workers().await;
    assert!(poll(&mut workers, "w", &["wire_money"], &[], 0.05)
        .await
        .is_none());
    server.shutdown().await;
}

/// A tool whose parameters_json is not a JSON Schema the server can check
/// calls against (a wrong type, a reference to another document) is
/// refused at registration, naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_with_an_unusable_schema_is_refused() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    for schema in [
        r#"{"type":"objekt"}"#,
        r#"{"$ref":"https://example.com/payment.json"}"#,
    ] {
        let tool = aaa::proto::ToolDefinition {
            parameters_json: schema.into(),
            ..wire_money()
        };
        let status = expect_err(
            workers
                .register_worker(aaa::proto::RegisterWorkerRequest {
                    identity: "w".into(),
                    tools: vec![wire_money(), tool],
                    models: vec![],
                })
                .await,
        );
        let info = assert_error(&status, tonic::Code::InvalidArgument, "INVALID_FIELD");
        assert_eq!(
            info.metadata.get("field").map(String::as_str),
            Some("tools[1].parameters_json"),
            "{status:?}"
        );
    }
    server.shutdown().await;
}
