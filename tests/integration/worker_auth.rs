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
