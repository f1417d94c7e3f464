//! Hostile and careless input (issue 16): seconds out of range are refused
//! by name instead of panicking or wrapping, errors stay small whatever a
//! client sent, undecodable requests are the client's fault, connections
//! that stall or exceed the cap are closed, and `aaa serve`'s bad flags
//! exit 64 with one line.

use std::time::Duration;

use aaa::proto::{
    Budget, GetRunRequest, RegisterWorkerRequest, StartRunRequest, ToolRef, WatchApprovalsRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

use crate::support::*;

/// The INVALID_FIELD refusal of `field`; its message names the range.
fn assert_out_of_range(status: &tonic::Status, field: &str, bound: &str) {
    let info = assert_error(status, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], field, "{status:?}");
    assert!(
        status.message().contains("out of range") && status.message().contains(bound),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn seconds_out_of_range_are_refused_by_field_and_range() {
    let server = TestServer::start().await;
    let mut workers = server.workers().await;
    let mut runs = server.runs().await;

    for huge in [1e19, 1e308] {
        let mut tool = wire_money();
        tool.heartbeat_timeout_s = huge;
        let status = expect_err(register_one(&mut workers, tool).await);
        assert_out_of_range(&status, "tools[0].heartbeat_timeout_s", "<= 21600");
    }
    let mut tool = wire_money();
    tool.approval_timeout_s = 1e16;
    let status = expect_err(register_one(&mut workers, tool).await);
    assert_out_of_range(&status, "tools[0].approval_timeout_s", "<= 315576000");

    register(&mut workers, vec![wire_money()], &[]).await;
    let mut start = scripted_reference_run();
    start.budget = Some(Budget {
        deadline_s: 1e16,
        ..Default::default()
    });
    let status = expect_err(runs.start_run(start).await);
    assert_out_of_range(&status, "budget.deadline_s", "0 for no deadline");
    let start = StartRunRequest {
        tools: vec![ToolRef {
            name: "wire_money".into(),
            approval_timeout_s: 1e16,
            ..Default::default()
        }],
        ..scripted_reference_run()
    };
    let status = expect_err(runs.start_run(start).await);
    assert_out_of_range(&status, "tools[0].approval_timeout_s", "<= 315576000");

    let status = expect_err(
        server
            .approvals()
            .await
            .watch_approvals(WatchApprovalsRequest {
                heartbeat_s: 1e308,
                ..Default::default()
            })
            .await,
    );
    assert_out_of_range(&status, "heartbeat_s", "<= 600");

    // None of it started a run; the largest accepted values still work.
    assert!(list_runs_count(&mut runs).await == 0);
    let mut tool = wire_money();
    tool.heartbeat_timeout_s = 21_600.0;
    tool.approval_timeout_s = 315_576_000.0;
    register(&mut workers, vec![tool], &[]).await;
    let mut start = scripted_reference_run();
    start.budget = Some(Budget {
        deadline_s: 315_576_000.0,
        ..Default::default()
    });
    let run_id = start_run(&mut runs, start).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let pending = list_approvals(&mut server.approvals().await, Default::default()).await;
    let expires = pending[0].expires_at.as_ref().expect("expires_at").seconds;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(expires > now + 300_000_000, "the due time did not wrap");
    grant_and_finish(&mut runs, &mut workers, &run_id, &call_id).await;
}

async fn register_one(
    workers: &mut WorkerClient,
    tool: aaa::proto::ToolDefinition,
) -> Result<tonic::Response<aaa::proto::RegisterWorkerResponse>, tonic::Status> {
    workers
        .register_worker(RegisterWorkerRequest {
            identity: "w".into(),
            tools: vec![tool],
            models: vec![],
        })
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_quote_only_a_prefix_of_long_ids() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    for len in [5_000, 60_000] {
        let id = "x".repeat(len);
        let status = expect_err(runs.get_run(GetRunRequest { run_id: id }).await);
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().len() < 512, "{}", status.message());
        assert!(status.message().contains(&format!("({len} bytes)")));
        let info = assert_error(&status, Code::NotFound, "RUN_NOT_FOUND");
        assert!(info.metadata["run_id"].len() < 100);
    }
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &run_id).await;
    let status = expect_err(grant_raw(&mut runs, &run_id, &"c".repeat(60_000)).await);
    let info = assert_error(&status, Code::NotFound, "CALL_NOT_FOUND");
    assert!(info.metadata["call_id"].ends_with("(60000 bytes)"));
    assert!(status.message().len() < 512);
}

async fn grant_raw(
    runs: &mut RunClient,
    run_id: &str,
    call_id: &str,
) -> Result<tonic::Response<aaa::proto::SignalResponse>, tonic::Status> {
    runs.signal(aaa::proto::SignalRequest {
        run_id: run_id.into(),
        r#type: "aaa.approval.granted".into(),
        data_json: serde_json::json!({ "call_id": call_id }).to_string(),
        ..Default::default()
    })
    .await
}

/// StartRunRequest with `task` (field 1, a string) as raw bytes, so a test
/// can send bytes that are not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawStartRun {
    #[prost(bytes = "vec", tag = "1")]
    task: Vec<u8>,
}

/// Sends `message` to `path`, whatever its proto type.
async fn call_raw<M: prost::Message + Default + Clone + std::fmt::Debug + Send + Sync + 'static>(
    server: &impl Server,
    path: &'static str,
    message: M,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.expect("ready");
    let codec: tonic_prost::ProstCodec<M, M> = tonic_prost::ProstCodec::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    expect_err(grpc.unary(tonic::Request::new(message), path, codec).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_requests_are_invalid_arguments_with_an_error_info() {
    let server = TestServer::start().await;
    let bad = RawStartRun {
        task: vec![0xff, 0xfe, b'x'],
    };
    let status = call_raw(&server, "/aaa.v1.RunService/StartRun", bad.clone()).await;
    assert_error(&status, Code::InvalidArgument, "MALFORMED_REQUEST");
    assert!(status.message().contains("UTF-8"), "{status:?}");
    // A server-streaming method, refused before its stream starts.
    let status = call_raw(&server, "/aaa.v1.RunService/StreamEvents", bad).await;
    assert_error(&status, Code::InvalidArgument, "MALFORMED_REQUEST");
    // A real internal answer is left alone: only decode failures change.
    assert_eq!(list_runs_count(&mut server.runs().await).await, 0);
}

/// Reads until the server closes the connection (EOF or reset).
async fn closed_by_server(stream: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buffer)).await {
            Err(_) => panic!("the server kept the connection open past {WAIT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return seen,
            Ok(Ok(n)) => seen.extend_from_slice(&buffer[..n]),
        }
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_stalls_in_its_handshake_is_closed() {
    let server = TestServer::start_with(|config| {
        config.handshake_timeout = Duration::from_millis(300);
        config.keepalive_interval = Duration::from_millis(300);
    })
    .await;
    // Half a preface, then nothing.
    let mut half = TcpStream::connect(server.addr()).await.unwrap();
    half.write_all(&PREFACE[..12]).await.unwrap();
    closed_by_server(&mut half).await;

    // A whole handshake, then a client that never answers a ping.
    let mut silent = TcpStream::connect(server.addr()).await.unwrap();
    silent.write_all(PREFACE).await.unwrap();
    silent
        .write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0])
        .await
        .unwrap(); // SETTINGS
    silent
        .write_all(&[0, 0, 0, 0x4, 0x1, 0, 0, 0, 0])
        .await
        .unwrap(); // its ACK
    let seen = closed_by_server(&mut silent).await;
    // A PING frame (type 6) came before the close.
    assert!(frame_types(&seen).contains(&0x6), "{seen:?}");

    // Well-behaved clients are served as before.
    assert_eq!(list_runs_count(&mut server.runs().await).await, 0);
}

/// The types of the HTTP/2 frames in `bytes`.
fn frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_cap_are_told_why_and_closed() {
    let server = TestServer::start_with(|config| config.max_connections = 2).await;
    let mut first = server.runs().await;
    let second = server.runs().await;
    assert_eq!(list_runs_count(&mut first).await, 0);

    let mut third = TcpStream::connect(server.addr()).await.unwrap();
    third.write_all(PREFACE).await.unwrap();
    let seen = closed_by_server(&mut third).await;
    assert_eq!(frame_types(&seen), [0x4, 0x7], "SETTINGS then GOAWAY");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("too many connections (the server's cap is 2)"),
        "{text}"
    );

    // A closed connection frees its place.
    drop(second);
    let give_up = tokio::time::Instant::now() + WAIT;
    loop {
        let mut probe = TcpStream::connect(server.addr()).await.unwrap();
        probe.write_all(PREFACE).await.unwrap();
        probe
            .write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0])
            .await
            .unwrap();
        let mut head = [0; 9];
        probe.read_exact(&mut head).await.unwrap();
        let mut rest = vec![0; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
        probe.read_exact(&mut rest).await.unwrap();
        // The server's own SETTINGS, then no GOAWAY right away: served.
        let mut next = [0; 9];
        let served =
            match tokio::time::timeout(Duration::from_millis(200), probe.read_exact(&mut next))
                .await
            {
                Err(_) => true,
                Ok(Ok(_)) => next[3] != 0x7,
                Ok(Err(_)) => false,
            };
        if served {
            break;
        }
        assert!(tokio::time::Instant::now() < give_up, "no place freed");
    }
    assert_eq!(list_runs_count(&mut first).await, 0);
}

#[test]
fn bad_serve_flags_exit_64_with_one_line_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--store-cache-mib", "0"], "--store-cache-mib"),
        (&["--store-cache-mib", "99999999"], "1..=65536"),
        (&["--poll-wait-cap-s", "1e20"], "1e20 is out of range"),
        (&["--shutdown-grace-s", "1e9"], "<= 3600"),
        (&["--heartbeat-timeout-s", "-1"], "--heartbeat-timeout-s"),
        (&["--max-message-mib", "1000000"], "--max-message-mib"),
        (&["--max-connections", "0"], "--max-connections"),
        (&["--listen", "nonsense"], "--listen"),
        (&["--tombstone", "8d"], "--tombstone"),
        (&["--no-such-flag"], "--no-such-flag"),
    ];
    for (args, named) in cases {
        let output = serve_refused(&dir.path().join("data"), args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty());
    }
    // A data dir that cannot be made is named.
    let output = serve_refused(
        std::path::Path::new("/proc/aaa-no-such-dir"),
        &["--listen", "127.0.0.1:0"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("/proc/aaa-no-such-dir"), "{stderr}");
}
