//! The reference scenario (DESIGN.md §1), with a worker-served model and with
//! the scripted model, and its denied variant.

use aaa::proto::{Role, RunStatus};
use serde_json::json;

use crate::support::*;

/// Checks what both reference runs share: the exact event order, the
/// arguments the reviewer saw and the tool got, and the result.
async fn assert_reference_run(
    runs: &mut RunClient,
    run_id: &str,
    events: &[aaa::proto::Event],
    worker: Worker,
) {
    assert_eq!(types(events), REFERENCE_TYPES);
    assert_dense(events, 1);

    let requested = data(find(events, "aaa.approval.requested"));
    assert_eq!(requested["name"], "wire_money");
    assert_eq!(requested["arguments"], json!({"amount": 250, "to": "ACME"}));
    let started = data(find(events, "aaa.tool.started"));
    assert_eq!(started["attempt"], json!(1));
    assert_eq!(started["call_id"], requested["call_id"]);
    let completed = data(find(events, "aaa.run.completed"));
    assert_eq!(completed["value"], json!({"text": REFERENCE_TEXT}));

    let run = get_run(runs, run_id).await;
    assert_eq!(run.status, RunStatus::Completed as i32);
    let result: serde_json::Value =
        serde_json::from_str(&run.result_json).expect("result_json is JSON");
    assert_eq!(result, json!({"text": REFERENCE_TEXT}));
    assert_eq!(run.last_seq, events.last().unwrap().seq);

    let tool_tasks = worker.tool_tasks_of(run_id);
    worker.stop().await;
    assert_eq!(tool_tasks.len(), 1, "the tool must run exactly once");
    // Exactly the model's 250: an integer, not 250.0.
    assert_eq!(tool_task(&tool_tasks[0]).arguments_json, REFERENCE_ARGS);
    let args: serde_json::Value =
        serde_json::from_str(&tool_task(&tool_tasks[0]).arguments_json).unwrap();
    assert_eq!(args["amount"].as_u64(), Some(250));
    assert_eq!(tool_tasks[0].attempt, 1);
    assert_eq!(
        tool_tasks[0].call_id,
        requested["call_id"].as_str().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reference_scenario_with_worker_model() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &["seed"]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &["seed"]).await;

    let run_id = start_run(&mut runs, seed_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let decision = grant(&mut runs, &run_id, &call_id).await;
    assert!(!decision.already_decided);
    assert_eq!(decision.decision, "aaa.approval.granted");
    assert!(decision.seq > 0);

    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(decision.seq, find(&events, "aaa.approval.granted").seq);

    // The model saw the user task, then the tool's output (a JSON string, unquoted).
    let model_tasks = worker.model_tasks_of(&run_id);
    assert_eq!(model_tasks.len(), 2, "two model calls");
    assert_eq!(
        model_tasks[0].messages.last().unwrap().role,
        Role::User as i32
    );
    assert_eq!(
        model_tasks[0].messages.last().unwrap().content,
        "Pay ACME $250"
    );
    let tool_message = model_tasks[1].messages.last().unwrap();
    assert_eq!(tool_message.role, Role::Tool as i32);
    assert_eq!(tool_message.call_id, call_id);
    assert_eq!(tool_message.content, REFERENCE_TEXT);
    assert_eq!(tool_message.error, None);

    assert_reference_run(&mut runs, &run_id, &events, worker).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reference_scenario_with_scripted_model() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;

    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    grant(&mut runs, &run_id, &call_id).await;
    let events = wait_for_end(&mut runs, &run_id).await;

    assert_reference_run(&mut runs, &run_id, &events, worker).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn denial_reaches_the_model_and_the_tool_never_runs() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &["seed"]).await;
    let run_id = start_run(&mut runs, seed_reference_run()).await;

    // The model asks for the tool.
    let first = poll_until_task(&mut workers, "seed-model", &[], &["seed"]).await;
    assert_eq!(first.run_id, run_id);
    complete_model(&mut workers, &first.token, seed_reply(model_task(&first)))
        .await
        .expect("CompleteTask (model)");
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    assert_eq!(
        poll(&mut workers, "payments-1", &["wire_money"], &[], 0.3).await,
        None
    );

    let reason = "payee not on the allow-list";
    let decision = deny(&mut runs, &run_id, &call_id, reason).await;
    assert!(!decision.already_decided);
    assert_eq!(decision.decision, "aaa.approval.denied");

    // The model's next call carries the denial as the tool's result.
    let second = poll_until_task(&mut workers, "seed-model", &[], &["seed"]).await;
    let messages = &model_task(&second).messages;
    let tool_message = messages.last().expect("messages");
    assert_eq!(tool_message.role, Role::Tool as i32, "{messages:?}");
    assert_eq!(tool_message.call_id, call_id);
    let error = tool_message.error.as_ref().expect("tool message error");
    assert_eq!(error.r#type, "ApprovalDenied");
    assert_eq!(error.message, reason);
    assert_eq!(tool_message.content, format!("ApprovalDenied: {reason}"));
    complete_model(&mut workers, &second.token, seed_reply(model_task(&second)))
        .await
        .expect("CompleteTask (model)");

    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "aaa.run.started",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.tool.requested",
            "aaa.approval.requested",
            "aaa.approval.denied",
            "aaa.tool.failed",
            "aaa.llm.requested",
            "aaa.llm.completed",
            "aaa.run.completed",
        ]
    );
    let denied = data(find(&events, "aaa.approval.denied"));
    assert_eq!(denied["reason"], reason);
    let failed = data(find(&events, "aaa.tool.failed"));
    assert_eq!(failed["call_id"], call_id.as_str());
    assert_eq!(failed["error"]["type"], "ApprovalDenied");
    assert_eq!(failed["error"]["message"], reason);
    assert_eq!(completed_text(&events), format!("ApprovalDenied: {reason}"));

    // No attempt was ever handed out.
    assert_eq!(
        poll(&mut workers, "payments-1", &["wire_money"], &[], 0.3).await,
        None
    );
    server.shutdown().await;
}
