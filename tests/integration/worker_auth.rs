//! Workers under auth: a task is the polling principal's alone, a worker
//! principal serves only the tools and models its config lists, and a
//! worker identity belongs to the principal that first used it.

use aaa::proto::{
    CompleteTaskRequest, ErrorDetail, FailTaskRequest, HeartbeatTaskRequest, PollTaskRequest,
    RegisterWorkerRequest, ToolDefinition,
};
use tonic::Code;

use crate::auth::{auth_toml, granted_task, start_with_auth, token};
use crate::support::*;

fn poll_request(identity: &str, tools: &[&str], models: &[&str]) -> PollTaskRequest {
    PollTaskRequest {
        identity: identity.into(),
        tools: tools.iter().map(|t| t.to_string()).collect(),
        models: models.iter().map(|m| m.to_string()).collect(),
        wait_s: 0.001,
    }
}

fn register_request(identity: &str, tools: Vec<ToolDefinition>) -> RegisterWorkerRequest {
    RegisterWorkerRequest {
        identity: identity.into(),
        tools,
        models: vec![],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_is_reported_only_by_the_principal_that_polled_it() {
    let server = start_with_auth(auth_toml(false)).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    let (run_id, task) = granted_task(&server, &mut worker, "").await;

    // Another worker principal holding the token gets nowhere.
    let mut other = Clients::with_token(&server, &token("other-worker")).await;
    let output = aaa::proto::complete_task_request::Result::OutputJson(r#""hijacked""#.into());
    let refusals = [
        other
            .workers
            .complete_task(CompleteTaskRequest {
                token: task.token.clone(),
                result: Some(output),
            })
            .await
            .map(drop),
        other
            .workers
            .fail_task(FailTaskRequest {
                token: task.token.clone(),
                error: Some(ErrorDetail {
                    r#type: "Hijack".into(),
                    message: "no".into(),
                }),
                non_retryable: true,
            })
            .await
            .map(drop),
        other
            .workers
            .heartbeat_task(HeartbeatTaskRequest {
                token: task.token.clone(),
            })
            .await
            .map(drop),
    ];
    for refusal in refusals {
        let status = expect_err(refusal);
        assert_error(&status, Code::PermissionDenied, "NOT_TASK_HOLDER");
        assert!(status.message().contains("other-worker"), "{status:?}");
    }

    // Its own principal completes it; the events name identity and principal.
    let output = aaa::proto::complete_task_request::Result::OutputJson(REFERENCE_OUTPUT.into());
    worker
        .workers
        .heartbeat_task(HeartbeatTaskRequest {
            token: task.token.clone(),
        })
        .await
        .expect("heartbeat by the holder");
    worker
        .workers
        .complete_task(CompleteTaskRequest {
            token: task.token,
            result: Some(output),
        })
        .await
        .expect("CompleteTask by the holder");
    let mut reader = Clients::with_token(&server, &token("reader")).await;
    let events = reader.wait_for_event(&run_id, "aaa.run.completed").await;
    assert_eq!(completed_text(&events), REFERENCE_TEXT);
    for ty in ["aaa.tool.started", "aaa.tool.completed"] {
        let actor = find(&events, ty).actor.clone().expect("actor");
        assert_eq!(
            (actor.kind, actor.name.as_str(), actor.principal.as_str()),
            (2, "payments-1", "worker"),
            "{ty}"
        );
    }
    let started = find(&events, "aaa.run.started").actor.clone().unwrap();
    assert_eq!(started.principal, "", "a client's name is its principal");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_principal_serves_only_its_tools_and_models() {
    let server = start_with_auth(auth_toml(false)).await;
    let mut other = Clients::with_token(&server, &token("other-worker")).await;
    let mut email = wire_money();
    email.name = "send_email".into();

    let status = expect_err(
        other
            .workers
            .register_worker(register_request("", vec![wire_money(), email]))
            .await,
    );
    let info = assert_error(&status, Code::PermissionDenied, "NOT_ALLOWED_TO_SERVE");
    assert_eq!(info.metadata["tool"], "send_email");
    assert!(status.message().contains("other-worker"), "{status:?}");
    let status = expect_err(
        other
            .workers
            .poll_task(poll_request("", &["wire_money", "send_email"], &[]))
            .await,
    );
    let info = assert_error(&status, Code::PermissionDenied, "NOT_ALLOWED_TO_SERVE");
    assert_eq!(info.metadata["tool"], "send_email");
    let status = expect_err(other.workers.poll_task(poll_request("", &[], &["m"])).await);
    let info = assert_error(&status, Code::PermissionDenied, "NOT_ALLOWED_TO_SERVE");
    assert_eq!(info.metadata["model"], "m");

    // What it lists, it serves; "worker" serves the model "m"; admin serves
    // anything.
    other
        .workers
        .poll_task(poll_request("", &["wire_money"], &[]))
        .await
        .expect("a listed tool");
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    worker
        .workers
        .poll_task(poll_request("", &["nothing"], &["m"]))
        .await
        .expect("a listed model");
    let mut admin = Clients::with_token(&server, &token("admin")).await;
    admin
        .workers
        .poll_task(poll_request("", &["send_email"], &["any-model"]))
        .await
        .expect("admin serves any tool");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_identity_belongs_to_the_first_principal_that_used_it() {
    let mut server = start_with_auth(auth_toml(false)).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    worker
        .workers
        .poll_task(poll_request("payments-1", &["wire_money"], &[]))
        .await
        .expect("first use claims the identity");
    worker
        .workers
        .register_worker(register_request("payments-1", vec![wire_money()]))
        .await
        .expect("its owner registers under it");

    for restarted in [false, true] {
        if restarted {
            // The binding is durable.
            server.restart().await;
        }
        let mut other = Clients::with_token(&server, &token("other-worker")).await;
        let poll = other
            .workers
            .poll_task(poll_request("payments-1", &["wire_money"], &[]))
            .await;
        let info = assert_error(&expect_err(poll), Code::PermissionDenied, "IDENTITY_TAKEN");
        assert_eq!(info.metadata["identity"], "payments-1");
        let register = other
            .workers
            .register_worker(register_request("payments-1", vec![wire_money()]))
            .await;
        assert_error(
            &expect_err(register),
            Code::PermissionDenied,
            "IDENTITY_TAKEN",
        );
        other
            .workers
            .poll_task(poll_request("payments-2", &["wire_money"], &[]))
            .await
            .expect("an identity of its own");
    }
    server.shutdown().await;
}

/// wire_money as its worker first declares it: two grants from finance.
fn finance_gated() -> ToolDefinition {
    ToolDefinition {
        approvers: vec!["finance".into()],
        approvals_required: 2,
        ..wire_money()
    }
}

/// Starts the reference run as "runner"; returns its id and the call
/// waiting for approval.
async fn run_waiting_for_approval(server: &TestServer) -> (String, String) {
    let mut runner = Clients::with_token(server, &token("runner")).await;
    let run_id = runner
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = runner
        .wait_for_event(&run_id, "aaa.approval.requested")
        .await;
    (run_id, call_id(events.last().unwrap()))
}

fn grant(run_id: &str, call_id: &str) -> aaa::proto::SignalRequest {
    aaa::proto::SignalRequest {
        run_id: run_id.into(),
        r#type: "aaa.approval.granted".into(),
        data_json: serde_json::json!({ "call_id": call_id }).to_string(),
        request_id: String::new(),
    }
}

/// Issue 40, item 3: a worker principal declared its gated tool again with
/// no approver groups and one approval, and an approver in no group then
/// granted a call alone. A tool's gate only tightens unless an admin
/// changes it: the lowering is refused, naming the field, and the gate
/// stands.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_cannot_lower_its_tools_gate() {
    let server = start_with_auth(crate::policy::auth_toml()).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    worker
        .workers
        .register_worker(register_request("payments-1", vec![finance_gated()]))
        .await
        .expect("the first declaration");

    let lowered = ToolDefinition {
        approvers: vec![],
        approvals_required: 1,
        ..wire_money()
    };
    let no_groups = ToolDefinition {
        approvers: vec![],
        ..finance_gated()
    };
    let ungated = ToolDefinition {
        requires_approval: false,
        ..finance_gated()
    };
    for (tool, field) in [
        (lowered, "tools[0].approvals_required"),
        (no_groups, "tools[0].approvers"),
        (ungated, "tools[0].requires_approval"),
    ] {
        let status = expect_err(
            worker
                .workers
                .register_worker(register_request("payments-1", vec![tool]))
                .await,
        );
        let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
        assert_eq!(info.metadata["field"], field, "{status:?}");
        assert!(status.message().contains(field), "{status:?}");
        assert!(status.message().contains("admin"), "{status:?}");
    }

    // The gate stands for a new run's call: carol, an approver in no
    // group, cannot grant it; one finance grant is not enough.
    let (run_id, call) = run_waiting_for_approval(&server).await;
    let mut carol = Clients::with_token(&server, &token("carol")).await;
    let status = expect_err(carol.runs.signal(grant(&run_id, &call)).await);
    assert_error(&status, Code::PermissionDenied, "NOT_AN_APPROVER_FOR_CALL");
    let mut alice = Clients::with_token(&server, &token("alice")).await;
    let voted = alice
        .runs
        .signal(grant(&run_id, &call))
        .await
        .expect("alice is in finance")
        .into_inner();
    assert_eq!(
        (
            voted.decision.as_str(),
            voted.votes,
            voted.approvals_required
        ),
        ("aaa.approval.voted", 1, 2),
        "one of two grants decides nothing yet"
    );
    let mut reader = Clients::with_token(&server, &token("runner")).await;
    let events = reader.history(&run_id).await;
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["approvals_required"], 2, "{requested}");
    assert_eq!(requested["approvers"], serde_json::json!(["finance"]));
    server.shutdown().await;
}

/// A worker may tighten its tool's gate (and declare it again unchanged,
/// as it does at every start); an admin may change it either way. Who
/// changed it last, and when, is in the stored definition that runs
/// snapshot into aaa.run.started.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_may_tighten_a_gate_and_an_admin_may_loosen_it() {
    let server = start_with_auth(crate::policy::auth_toml()).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    worker
        .workers
        .register_worker(register_request("payments-1", vec![finance_gated()]))
        .await
        .expect("the first declaration");
    let tighter = ToolDefinition {
        approvals_required: 3,
        approval_timeout_s: 3600.0,
        ..finance_gated()
    };
    for _restart in 0..2 {
        let stored = worker
            .workers
            .register_worker(register_request("payments-1", vec![tighter.clone()]))
            .await
            .expect("a tighter gate, then the same again")
            .into_inner()
            .tools;
        assert_eq!(
            (stored[0].approvals_required, stored[0].approval_timeout_s),
            (3, 3600.0)
        );
    }
    let (run_id, _) = run_waiting_for_approval(&server).await;
    let mut reader = Clients::with_token(&server, &token("runner")).await;
    let started = data(find(&reader.history(&run_id).await, "aaa.run.started"));
    assert_eq!(started["tools"][0]["gate_changed"]["by"], "worker");

    // An admin lowers it: any approver, one grant, no timeout.
    let mut admin = Clients::with_token(&server, &token("admin")).await;
    let lowered = ToolDefinition {
        approvers: vec![],
        approvals_required: 1,
        ..wire_money()
    };
    let stored = admin
        .workers
        .register_worker(register_request("deployer", vec![lowered]))
        .await
        .expect("an admin may lower a gate")
        .into_inner()
        .tools;
    assert_eq!(
        (stored[0].approvals_required, stored[0].approvers.len()),
        (1, 0)
    );
    let at = server.clock().now_ms();
    let (run_id, call) = run_waiting_for_approval(&server).await;
    let started = data(find(&reader.history(&run_id).await, "aaa.run.started"));
    let changed = &started["tools"][0]["gate_changed"];
    assert_eq!(changed["by"], "admin", "{started}");
    assert!(changed["at_ms"].as_i64().unwrap() <= at, "{changed}");
    let mut carol = Clients::with_token(&server, &token("carol")).await;
    let granted = carol
        .runs
        .signal(grant(&run_id, &call))
        .await
        .expect("any approver may decide now")
        .into_inner();
    assert_eq!(granted.decision, "aaa.approval.granted");
    server.shutdown().await;
}
