//! Exclusive, numbered attempts (DESIGN.md §2.6): a lost lease ends the
//! attempt, retries follow the tool's policy, stale tokens are refused.
//! Leases last a minute; the tests move the server's clock instead of
//! waiting.

use std::time::Duration;

use aaa::proto::{HeartbeatTaskRequest, RetryPolicy, RunStatus, ToolDefinition};
use serde_json::json;
use tonic::Code;

use crate::support::*;

/// An ungated tool with a lease of [`LEASE`].
fn fetch_quote(max_attempts: u32) -> ToolDefinition {
    ToolDefinition {
        name: "fetch_quote".into(),
        description: "Fetch a quote".into(),
        parameters_json: String::new(),
        requires_approval: false,
        retry: Some(RetryPolicy {
            max_attempts,
            initial_backoff_s: 0.1,
            ..Default::default()
        }),
        heartbeat_timeout_s: LEASE.as_secs_f64(),
        approval_timeout_s: 0.0,
        ..Default::default()
    }
}

const LEASE: Duration = Duration::from_secs(60);

async fn heartbeat(workers: &mut WorkerClient, token: &str) -> Result<bool, tonic::Status> {
    workers
        .heartbeat_task(HeartbeatTaskRequest {
            token: token.into(),
        })
        .await
        .map(|r| r.into_inner().cancel_requested)
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_lease_is_retried_on_another_poller() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut worker_a = server.workers().await;
    let mut worker_b = server.workers().await;
    register(&mut worker_a, vec![fetch_quote(2)], &[]).await;
    let run_id = start_run(
        &mut runs,
        scripted_run("fetch_quote", r#"{"symbol":"ACME"}"#),
    )
    .await;

    // A takes attempt 1 and goes silent.
    let first = poll_until_task(&mut worker_a, "worker-a", &["fetch_quote"], &[]).await;
    assert_eq!(first.attempt, 1);
    assert_eq!(tool_task(&first).arguments_json, r#"{"symbol":"ACME"}"#);
    server.clock().advance(LEASE + Duration::from_secs(1));

    // B gets attempt 2 of the same call once A's lease is lost.
    let second = poll_until_task(&mut worker_b, "worker-b", &["fetch_quote"], &[]).await;
    assert_eq!(second.attempt, 2);
    assert_eq!(second.call_id, first.call_id);
    assert_ne!(second.token, first.token);
    assert_eq!(tool_task(&second).arguments_json, r#"{"symbol":"ACME"}"#);

    // A's late result and heartbeat are refused.
    let status = expect_err(complete_tool(&mut worker_a, &first.token, r#""quote from a""#).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");
    let status = expect_err(heartbeat(&mut worker_a, &first.token).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");

    complete_tool(&mut worker_b, &second.token, r#""quote from b""#)
        .await
        .expect("CompleteTask of attempt 2");
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "aaa.run.started",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.tool.requested",
            "aaa.tool.started",
            "aaa.tool.retrying",
            "aaa.tool.started",
            "aaa.tool.completed",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.run.completed",
        ]
    );
    let started: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "aaa.tool.started")
        .map(data)
        .collect();
    assert_eq!(
        (started[0]["attempt"].clone(), started[0]["worker"].clone()),
        (json!(1), json!("worker-a"))
    );
    assert_eq!(
        (started[1]["attempt"].clone(), started[1]["worker"].clone()),
        (json!(2), json!("worker-b"))
    );
    let retrying = data(find(&events, "aaa.tool.retrying"));
    assert_eq!(retrying["attempt"], json!(1));
    assert_eq!(retrying["error"]["type"], "AttemptLost", "{retrying}");
    assert_eq!(
        data(find(&events, "aaa.tool.completed"))["attempt"],
        json!(2)
    );
    assert_eq!(completed_text(&events), "quote from b");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_lease_of_a_gated_tool_fails_the_call() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut worker_a = server.workers().await;
    let mut worker_b = server.workers().await;
    let mut model = server.workers().await;
    // Gated and no retry policy: no automatic retry. The model is served by
    // this test, so the run stays live until the test answers it.
    let tool = ToolDefinition {
        heartbeat_timeout_s: LEASE.as_secs_f64(),
        ..wire_money()
    };
    register(&mut worker_a, vec![tool], &["seed"]).await;
    let run_id = start_run(&mut runs, seed_reference_run()).await;
    let task = poll_until_task(&mut model, "seed-model", &[], &["seed"]).await;
    complete_model(&mut model, &task.token, seed_reply(model_task(&task)))
        .await
        .expect("CompleteTask (model)");
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    grant(&mut runs, &run_id, &call_id).await;

    let first = poll_until_task(&mut worker_a, "worker-a", &["wire_money"], &[]).await;
    assert_eq!(first.attempt, 1);
    server.clock().advance(LEASE + Duration::from_secs(1));
    let events = wait_for_event(&mut runs, &run_id, "aaa.tool.failed").await;
    let failed = data(events.last().unwrap());
    assert_eq!(failed["call_id"], call_id.as_str());
    assert_eq!(failed["attempt"], json!(1));
    assert_eq!(failed["error"]["type"], "AttemptLost", "{failed}");
    assert_eq!(count(&events, "aaa.tool.retrying"), 0);

    assert_eq!(
        poll(&mut worker_b, "worker-b", &["wire_money"], &[], 0.5).await,
        None,
        "no second attempt"
    );
    // The run is live (its model call waits), the attempt is not.
    assert_eq!(
        get_run(&mut runs, &run_id).await.status,
        RunStatus::Running as i32
    );
    let status = expect_err(complete_tool(&mut worker_a, &first.token, REFERENCE_OUTPUT).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");
    let status = expect_err(heartbeat(&mut worker_a, &first.token).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");

    // The model reads the failure as the tool's result.
    let task = poll_until_task(&mut model, "seed-model", &[], &["seed"]).await;
    let tool_message = model_task(&task).messages.last().expect("messages").clone();
    assert_eq!(tool_message.call_id, call_id);
    assert_eq!(
        tool_message.error.expect("tool message error").r#type,
        "AttemptLost"
    );
    complete_model(&mut model, &task.token, seed_reply(model_task(&task)))
        .await
        .expect("CompleteTask (model)");
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(count(&events, "aaa.tool.started"), 1);
    assert_eq!(count(&events, "aaa.tool.completed"), 0);
    let text = completed_text(&events);
    assert!(text.starts_with("AttemptLost"), "{text}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_keep_the_lease() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![fetch_quote(1)], &[]).await;
    let run_id = start_run(
        &mut runs,
        scripted_run("fetch_quote", r#"{"symbol":"ACME"}"#),
    )
    .await;

    let task = poll_until_task(&mut workers, "worker-a", &["fetch_quote"], &[]).await;
    // Work for three lease lengths, heartbeating well within each.
    for _ in 0..6 {
        server.clock().advance(LEASE / 2);
        let cancel = heartbeat(&mut workers, &task.token)
            .await
            .expect("HeartbeatTask");
        assert!(!cancel);
    }
    complete_tool(&mut workers, &task.token, r#""quote""#)
        .await
        .expect("CompleteTask");

    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(count(&events, "aaa.tool.started"), 1);
    assert_eq!(count(&events, "aaa.tool.retrying"), 0);
    assert_eq!(count(&events, "aaa.tool.failed"), 0);
    assert_eq!(completed_text(&events), "quote");
    server.shutdown().await;
}

async fn complete(
    workers: &mut WorkerClient,
    token: &str,
    output_json: &str,
) -> Result<bool, tonic::Status> {
    workers
        .complete_task(aaa::proto::CompleteTaskRequest {
            token: token.into(),
            result: Some(aaa::proto::complete_task_request::Result::OutputJson(
                output_json.into(),
            )),
        })
        .await
        .map(|r| r.into_inner().already_recorded)
}

async fn fail(
    workers: &mut WorkerClient,
    token: &str,
    message: &str,
) -> Result<bool, tonic::Status> {
    workers
        .fail_task(aaa::proto::FailTaskRequest {
            token: token.into(),
            error: Some(aaa::proto::ErrorDetail {
                r#type: "QuoteServiceDown".into(),
                message: message.into(),
            }),
            non_retryable: false,
        })
        .await
        .map(|r| r.into_inner().already_recorded)
}

/// A worker whose CompleteTask or FailTask answer was lost sends it again:
/// the same result is answered OK and `already_recorded`, with nothing
/// appended, also once the run has finished; another result for that
/// attempt stays refused as stale.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_sent_again_after_a_lost_answer_is_recorded_once() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    let mut tool = fetch_quote(2);
    tool.heartbeat_timeout_s = 30.0;
    register(&mut workers, vec![tool], &[]).await;
    let run_id = start_run(
        &mut runs,
        scripted_run("fetch_quote", r#"{"symbol":"ACME"}"#),
    )
    .await;

    // Attempt 1 fails (retryable), and the failure is sent twice.
    let first = poll_until_task(&mut workers, "w", &["fetch_quote"], &[]).await;
    assert!(!fail(&mut workers, &first.token, "timeout").await.unwrap());
    assert!(fail(&mut workers, &first.token, "timeout").await.unwrap());
    let status = expect_err(fail(&mut workers, &first.token, "another message").await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");
    let status = expect_err(complete(&mut workers, &first.token, r#""late""#).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");

    // Attempt 2 completes; the run finishes; the completion is sent again.
    let second = poll_until_task(&mut workers, "w", &["fetch_quote"], &[]).await;
    assert_eq!(second.attempt, 2);
    assert!(!complete(&mut workers, &second.token, r#"{"price": 250}"#)
        .await
        .unwrap());
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        get_run(&mut runs, &run_id).await.status,
        RunStatus::Completed as i32
    );
    // The same JSON value, spelled another way, is the same result.
    assert!(complete(&mut workers, &second.token, r#"{ "price":250 }"#)
        .await
        .unwrap());
    let status = expect_err(complete(&mut workers, &second.token, r#"{"price": 251}"#).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");
    let status = expect_err(fail(&mut workers, &second.token, "timeout").await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");

    let after = history(&mut runs, &run_id).await;
    assert_eq!(after.len(), events.len(), "retries appended nothing");
    assert_eq!(count(&after, "aaa.tool.retrying"), 1);
    assert_eq!(count(&after, "aaa.tool.completed"), 1);
}

/// The same for a model attempt served by a worker.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_reply_sent_again_is_recorded_once() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &["seed"]).await;
    let run_id = start_run(&mut runs, seed_reference_run()).await;
    let task = poll_until_task(&mut workers, "m", &[], &["seed"]).await;
    let reply = seed_reply(model_task(&task));
    let again = |reply| {
        let mut workers = workers.clone();
        let token = task.token.clone();
        async move {
            workers
                .complete_task(aaa::proto::CompleteTaskRequest {
                    token,
                    result: Some(aaa::proto::complete_task_request::Result::Reply(reply)),
                })
                .await
                .map(|r| r.into_inner().already_recorded)
        }
    };
    assert!(!again(reply.clone()).await.unwrap());
    wait_for_approval(&mut runs, &run_id).await;
    assert!(again(reply.clone()).await.unwrap());
    let mut other = reply;
    other.tool_calls[0].arguments_json = r#"{"amount": 1, "to": "EVIL"}"#.into();
    let status = expect_err(again(other).await);
    assert_error(&status, Code::FailedPrecondition, "STALE_ATTEMPT");
    let events = history(&mut runs, &run_id).await;
    assert_eq!(count(&events, "aaa.llm.completed"), 1);
    assert_eq!(count(&events, "aaa.tool.requested"), 1);
}
