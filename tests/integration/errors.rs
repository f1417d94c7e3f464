//! Bad input gets the documented status and ErrorInfo; retries with a
//! request_id get the original answer.

use std::collections::HashMap;

use aaa::proto::complete_task_request::Result::OutputJson;
use aaa::proto::{
    CancelRunRequest, CompleteTaskRequest, ListRunsRequest, SignalRequest, StartRunRequest,
    StreamEventsRequest, ToolRef,
};
use serde_json::json;
use tonic::Code;

use crate::support::*;

const UNKNOWN_RUN: &str = "01890000-0000-7000-8000-000000000000";

#[track_caller]
fn assert_names_field(info: &tonic_types::ErrorInfo, field: &str) {
    let named = info
        .metadata
        .get("field")
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        named.contains(field),
        "ErrorInfo.metadata[field] = {named:?}, expected it to name {field}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_run_is_not_found_and_named() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;

    let check = |result: Result<(), tonic::Status>, rpc: &str| {
        let status = expect_err(result);
        assert_error(&status, Code::NotFound, "RUN_NOT_FOUND");
        assert!(
            status.message().contains(UNKNOWN_RUN),
            "{rpc}: message does not name the run: {status:?}"
        );
    };
    let get = runs
        .get_run(aaa::proto::GetRunRequest {
            run_id: UNKNOWN_RUN.into(),
        })
        .await;
    check(get.map(drop), "GetRun");
    let note = signal(&mut runs, UNKNOWN_RUN, "app.note", json!({})).await;
    check(note.map(drop), "Signal");
    let cancel = runs
        .cancel_run(CancelRunRequest {
            run_id: UNKNOWN_RUN.into(),
            reason: "test".into(),
        })
        .await;
    check(cancel.map(drop), "CancelRun");
    // StreamEvents may fail at the call or on its first message.
    let request = StreamEventsRequest {
        run_id: UNKNOWN_RUN.into(),
        ..Default::default()
    };
    let stream = match runs.stream_events(request).await {
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .map(|m| panic!("StreamEvents sent {m:?}")),
        Err(status) => Err(status),
    };
    check(stream, "StreamEvents");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_input_names_the_field() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;

    // Scripted tool call arguments that are not JSON.
    let status = expect_err(
        runs.start_run(scripted_run("wire_money", r#"{"amount":250,"#))
            .await,
    );
    let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
    assert_names_field(&info, "arguments_json");

    // No task, no model.
    let status = expect_err(
        runs.start_run(StartRunRequest {
            task: String::new(),
            ..scripted_reference_run()
        })
        .await,
    );
    assert_names_field(
        &assert_error(&status, Code::InvalidArgument, "INVALID_FIELD"),
        "task",
    );
    let status = expect_err(
        runs.start_run(StartRunRequest {
            model: None,
            ..scripted_reference_run()
        })
        .await,
    );
    assert_names_field(
        &assert_error(&status, Code::InvalidArgument, "INVALID_FIELD"),
        "model",
    );

    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let before = get_run(&mut runs, &run_id).await.last_seq;
    let raw = |ty: &str, data_json: &str| SignalRequest {
        run_id: run_id.clone(),
        r#type: ty.into(),
        data_json: data_json.into(),
        request_id: String::new(),
    };

    // data_json that is not JSON, or not an object.
    for data_json in [r#"{"note": "#, "[1,2]", "42"] {
        let status = expect_err(runs.signal(raw("app.note", data_json)).await);
        let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
        assert_names_field(&info, "data_json");
    }
    // A decision without its call_id.
    let status = expect_err(runs.signal(raw("aaa.approval.granted", "{}")).await);
    let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
    assert_names_field(&info, "call_id");
    // An empty type.
    let status = expect_err(runs.signal(raw("", "{}")).await);
    let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
    assert_names_field(&info, "type");

    // 1 MiB of data.
    let big = json!({ "blob": "x".repeat(1 << 20) }).to_string();
    let status = expect_err(runs.signal(raw("app.note", &big)).await);
    let info = assert_error(&status, Code::InvalidArgument, "PAYLOAD_TOO_LARGE");
    assert_names_field(&info, "data_json");
    assert!(info.metadata.contains_key("limit"), "no limit in {info:?}");

    // A decision for a call the run does not have.
    let unknown_call = json!({ "call_id": "no-such-call" });
    let status = expect_err(signal(&mut runs, &run_id, "aaa.approval.granted", unknown_call).await);
    assert_error(&status, Code::NotFound, "CALL_NOT_FOUND");

    assert_eq!(
        get_run(&mut runs, &run_id).await.last_seq,
        before,
        "refused signals appended something"
    );
    grant(&mut runs, &run_id, &call_id).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unregistered_tool_and_invalid_token_are_refused() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut request = scripted_reference_run();
    request.tools = vec![ToolRef {
        name: "wire_money".into(),
        ..Default::default()
    }];
    let status = expect_err(runs.start_run(request).await);
    assert_error(&status, Code::InvalidArgument, "TOOL_NOT_REGISTERED");

    let status = expect_err(
        server
            .workers()
            .await
            .complete_task(CompleteTaskRequest {
                token: "not-a-token".into(),
                result: Some(OutputJson(REFERENCE_OUTPUT.into())),
            })
            .await,
    );
    assert_error(&status, Code::InvalidArgument, "INVALID_TOKEN");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn signals_to_a_finished_run_are_refused() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut request = scripted_reference_run();
    request.tools.clear();
    request.model = Some(aaa::proto::ModelSpec {
        kind: Some(aaa::proto::model_spec::Kind::Scripted(
            aaa::proto::ScriptedModel {
                steps: vec![aaa::proto::ScriptedStep {
                    reply: Some(aaa::proto::scripted_step::Reply::Text("done".into())),
                }],
            },
        )),
    });
    let run_id = start_run(&mut runs, request).await;
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(completed_text(&events), "done");

    let status = expect_err(signal(&mut runs, &run_id, "app.note", json!({"text": "hi"})).await);
    assert_error(&status, Code::FailedPrecondition, "RUN_FINISHED");
    assert_eq!(
        get_run(&mut runs, &run_id).await.last_seq,
        events.last().unwrap().seq
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_make_start_and_signal_idempotent() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let labels = HashMap::from([("test".to_string(), "idempotency".to_string())]);

    let request = StartRunRequest {
        request_id: "start-1".into(),
        labels: labels.clone(),
        ..scripted_reference_run()
    };
    let first = runs
        .start_run(request.clone())
        .await
        .expect("StartRun")
        .into_inner();
    let again = runs
        .start_run(request)
        .await
        .expect("StartRun retry")
        .into_inner();
    assert!(first.created);
    assert!(!again.created);
    assert_eq!(again.run_id, first.run_id);
    let listed = runs
        .list_runs(ListRunsRequest {
            labels,
            ..Default::default()
        })
        .await
        .expect("ListRuns")
        .into_inner()
        .runs;
    assert_eq!(listed.len(), 1, "a retried StartRun started a second run");
    let run_id = first.run_id;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    // An application signal, retried.
    let note = SignalRequest {
        run_id: run_id.clone(),
        r#type: "app.note".into(),
        data_json: r#"{"text":"hello"}"#.into(),
        request_id: "note-1".into(),
    };
    let noted = runs
        .signal(note.clone())
        .await
        .expect("Signal")
        .into_inner();
    let again = runs.signal(note).await.expect("Signal retry").into_inner();
    assert!(noted.seq > 0);
    assert_eq!(again, noted);

    // A grant, retried: the first answer again (not "already decided").
    let decision = SignalRequest {
        run_id: run_id.clone(),
        r#type: "aaa.approval.granted".into(),
        data_json: json!({ "call_id": call_id }).to_string(),
        request_id: "grant-1".into(),
    };
    let first = runs
        .signal(decision.clone())
        .await
        .expect("grant")
        .into_inner();
    let again = runs
        .signal(decision)
        .await
        .expect("grant retry")
        .into_inner();
    assert!(!first.already_decided);
    assert_eq!(again, first);

    let events = history(&mut runs, &run_id).await;
    assert_eq!(count(&events, "app.note"), 1);
    let note = find(&events, "app.note");
    assert_eq!(note.seq, noted.seq);
    assert_eq!(data(note), json!({"text": "hello"}));
    assert_eq!(count(&events, "aaa.approval.granted"), 1);
    server.shutdown().await;
}

/// Task tokens are signed: one made up for a real attempt (here: the real
/// token with another signature) is refused and changes nothing; the real
/// one still completes the attempt.
#[tokio::test(flavor = "multi_thread")]
async fn a_made_up_token_for_a_real_attempt_is_refused() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    grant(&mut runs, &run_id, &call_id).await;
    let task = poll_until_task(&mut workers, "w1", &["wire_money"], &[]).await;

    let (kind, rest) = task.token.split_once('.').expect("KIND.MAC...");
    let (_mac, body) = rest.split_once('.').expect("MAC.RUN...");
    let forged = format!("{kind}.{}.{body}", "0".repeat(32));
    let status = expect_err(complete_tool(&mut workers, &forged, REFERENCE_OUTPUT).await);
    assert_error(&status, Code::InvalidArgument, "INVALID_TOKEN");
    let before = history(&mut runs, &run_id).await;
    assert_eq!(before.last().unwrap().r#type, "aaa.tool.started");

    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("the real token completes the attempt");
    server.shutdown().await;
}

/// A caller's deadline that passes while the server works is answered
/// DEADLINE_EXCEEDED, as the gRPC spec and the SDKs' retry rules expect,
/// not CANCELLED "Timeout expired" (issue 41, item 4). A long poll with
/// nothing to do outlasts a 300 ms deadline. The call is made over plain
/// HTTP/2: a tonic client enforces the deadline itself too, and its own
/// timer, answering CANCELLED, races the server's answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadline_that_passes_at_the_server_is_deadline_exceeded() {
    use http_body_util::{BodyExt, Full};
    use prost::Message;

    let server = TestServer::start().await;
    let mut clients = Clients::new(server.channel().await, None);
    clients
        .workers
        .register_worker(aaa::proto::RegisterWorkerRequest {
            identity: "w".into(),
            tools: vec![wire_money()],
            models: vec![],
        })
        .await
        .expect("RegisterWorker");
    let poll = aaa::proto::PollTaskRequest {
        identity: "w".into(),
        tools: vec!["wire_money".into()],
        models: vec![],
        wait_s: 4.0,
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend((poll.len() as u32).to_be_bytes());
    framed.extend(poll);
    let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("an HTTP/2 connection");
    tokio::spawn(connection);
    let request = http::Request::post(format!(
        "http://{}/aaa.v1.WorkerService/PollTask",
        server.addr()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", "300m")
    .body(Full::new(bytes::Bytes::from(framed)))
    .unwrap();
    let response = sender.send_request(request).await.expect("an answer");
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.expect("the body").trailers().cloned();
    let status = parts
        .headers
        .get("grpc-status")
        .or_else(|| trailers.as_ref().and_then(|t| t.get("grpc-status")))
        .map(|v| v.to_str().unwrap().to_string());
    // 4: DEADLINE_EXCEEDED (1 would be CANCELLED).
    assert_eq!(status.as_deref(), Some("4"), "{parts:?} {trailers:?}");
    server.shutdown().await;
}
