//! Random and mutated requests to every RPC of a real `aaa serve` (a child
//! process, so its log can be read): every answer is OK or a clean status
//! with an `aaa.v1` ErrorInfo and a short message, a refused call changes no
//! run, health stays SERVING, the log has no panic, and an approval cycle
//! still completes at the end.
//!
//! The quick version runs in `cargo test` (a fixed seed, 300 cases). More:
//! `AAA_FUZZ_CASES=20000 AAA_FUZZ_SEED=7 cargo test --test integration fuzz:: -- --nocapture`.

use std::time::Duration;

use aaa::proto::*;
use bytes::{Buf, BufMut};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

use crate::support::*;

/// What the seeded server holds, for requests that name real things.
#[derive(Clone, Debug)]
struct Seeds {
    run: String,
    call: String,
}

fn text(seeds: &Seeds) -> impl Strategy<Value = String> {
    prop_oneof![
        Just(seeds.run.clone()),
        Just(seeds.call.clone()),
        Just(String::new()),
        Just("wire_money".to_string()),
        Just("aaa.approval.granted".to_string()),
        Just("aaa.tool.completed".to_string()),
        Just("x".repeat(70_000)),
        "\\PC{0,40}",
        "[a-z._*-]{1,20}",
    ]
}

fn json(seeds: &Seeds) -> impl Strategy<Value = String> {
    let call = seeds.call.clone();
    prop_oneof![
        Just(format!(r#"{{"call_id":"{call}"}}"#)),
        Just(format!(r#"{{"call_id":"{call}","arguments_sha256":"00"}}"#)),
        Just(r#"{"amount":250,"to":"ACME"}"#.to_string()),
        Just("[".repeat(200)),
        Just(format!("{}1{}", "[".repeat(100), "]".repeat(100))),
        Just("1e99999".to_string()),
        Just(String::new()),
        "\\PC{0,30}",
    ]
}

fn seconds() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-1.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(1e308),
        Just(1e16),
        Just(0.01),
        0.0..5.0f64,
    ]
}

/// One request to one RPC.
#[derive(Clone, Debug)]
enum Call {
    StartRun(StartRunRequest),
    GetRun(GetRunRequest),
    ListRuns(ListRunsRequest),
    StreamEvents(StreamEventsRequest),
    Signal(SignalRequest),
    CancelRun(CancelRunRequest),
    ListApprovals(ListApprovalsRequest),
    WatchApprovals(WatchApprovalsRequest),
    RegisterWorker(RegisterWorkerRequest),
    PollTask(PollTaskRequest),
    HeartbeatTask(HeartbeatTaskRequest),
    CompleteTask(CompleteTaskRequest),
    FailTask(FailTaskRequest),
    Subscribe(SubscriptionOpen),
    ListDeadLetters(ListDeadLettersRequest),
    ReplayDeadLetters(ReplayDeadLettersRequest),
    /// A valid message's bytes, mutated, sent to the method at this path.
    Raw(&'static str, Vec<u8>),
}

fn tool(seeds: &Seeds) -> impl Strategy<Value = ToolDefinition> {
    (
        text(seeds),
        json(seeds),
        any::<bool>(),
        seconds(),
        seconds(),
        seconds(),
    )
        .prop_map(
            |(name, parameters_json, requires_approval, heartbeat, approval, backoff)| {
                ToolDefinition {
                    name,
                    description: String::new(),
                    parameters_json,
                    requires_approval,
                    retry: Some(RetryPolicy {
                        max_attempts: 3,
                        initial_backoff_s: backoff,
                        backoff_coefficient: backoff,
                        max_backoff_s: backoff,
                    }),
                    heartbeat_timeout_s: heartbeat,
                    approval_timeout_s: approval,
                    ..Default::default()
                }
            },
        )
}

fn calls(seeds: &Seeds) -> impl Strategy<Value = Call> {
    let s = seeds.clone();
    let start = (text(&s), text(&s), seconds(), seconds(), json(&s)).prop_map(
        |(task, tool_name, deadline, approval, args)| {
            let mut start = scripted_run(&tool_name, &args);
            start.task = task;
            start.tools[0].approval_timeout_s = approval;
            start.budget = Some(Budget {
                deadline_s: deadline,
                max_model_calls: 3,
                ..Default::default()
            });
            Call::StartRun(start)
        },
    );
    let signal = (text(&s), text(&s), json(&s), text(&s)).prop_map(|(run_id, ty, data, rid)| {
        Call::Signal(SignalRequest {
            run_id,
            r#type: ty,
            data_json: data,
            request_id: rid,
        })
    });
    let paths = [
        "/aaa.v1.RunService/StartRun",
        "/aaa.v1.RunService/Signal",
        "/aaa.v1.RunService/GetRun",
        "/aaa.v1.WorkerService/RegisterWorker",
        "/aaa.v1.ApprovalService/ListApprovals",
        "/aaa.v1.WorkerService/CompleteTask",
    ];
    let valid = scripted_reference_run().encode_to_vec();
    let raw = (
        0..paths.len(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        any::<u16>(),
    )
        .prop_map(move |(path, flips, cut)| {
            let mut bytes = valid.clone();
            for (at, byte) in flips {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            bytes.truncate(bytes.len() - (cut as usize % 4));
            Call::Raw(paths[path], bytes)
        });
    prop_oneof![
        start,
        signal,
        raw,
        text(&s).prop_map(|run_id| Call::GetRun(GetRunRequest { run_id })),
        (any::<u32>(), text(&s), text(&s)).prop_map(|(page_size, page_token, label)| {
            Call::ListRuns(ListRunsRequest {
                page_size,
                page_token,
                labels: [(label.clone(), label)].into(),
                ..Default::default()
            })
        }),
        (text(&s), any::<u64>(), text(&s)).prop_map(|(run_id, after_seq, prefix)| {
            Call::StreamEvents(StreamEventsRequest {
                run_id,
                after_seq,
                type_prefix: prefix,
                ..Default::default()
            })
        }),
        (text(&s), text(&s))
            .prop_map(|(run_id, reason)| Call::CancelRun(CancelRunRequest { run_id, reason })),
        (text(&s), text(&s), any::<u32>()).prop_map(|(tool, run_id, page_size)| {
            Call::ListApprovals(ListApprovalsRequest {
                tool,
                run_id,
                page_size,
                ..Default::default()
            })
        }),
        (text(&s), seconds(), any::<u64>()).prop_map(|(tool, heartbeat_s, after)| {
            Call::WatchApprovals(WatchApprovalsRequest {
                tool,
                heartbeat_s,
                after_position: Some(after),
                ..Default::default()
            })
        }),
        (
            text(&s),
            proptest::collection::vec(tool(&s), 0..3),
            text(&s)
        )
            .prop_map(|(identity, tools, model)| Call::RegisterWorker(
                RegisterWorkerRequest {
                    identity,
                    tools,
                    models: vec![model],
                }
            )),
        (text(&s), text(&s), seconds()).prop_map(|(identity, tool, wait_s)| {
            Call::PollTask(PollTaskRequest {
                identity,
                tools: vec![tool],
                models: vec![],
                wait_s: wait_s.min(0.2),
            })
        }),
        text(&s).prop_map(|token| Call::HeartbeatTask(HeartbeatTaskRequest { token })),
        (text(&s), json(&s)).prop_map(|(token, output)| {
            Call::CompleteTask(CompleteTaskRequest {
                token,
                result: Some(complete_task_request::Result::OutputJson(output)),
            })
        }),
        (text(&s), text(&s), text(&s)).prop_map(|(token, ty, message)| {
            Call::FailTask(FailTaskRequest {
                token,
                error: Some(ErrorDetail {
                    r#type: ty,
                    message,
                }),
                non_retryable: false,
            })
        }),
        (text(&s), text(&s), seconds()).prop_map(|(group, ty, ack)| {
            Call::Subscribe(SubscriptionOpen {
                group,
                event_types: vec![ty],
                ack_timeout_s: ack,
                ..Default::default()
            })
        }),
        text(&s).prop_map(|group| Call::ListDeadLetters(ListDeadLettersRequest {
            group,
            ..Default::default()
        })),
        text(&s).prop_map(|group| Call::ReplayDeadLetters(ReplayDeadLettersRequest {
            group,
            ..Default::default()
        })),
    ]
}

/// Sends bytes as they are; reads the answer's bytes.
#[derive(Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

/// Reads a stream's first item (or waits a little for it), then drops it.
async fn first_of<T>(
    stream: Result<tonic::Response<tonic::Streaming<T>>, Status>,
) -> Result<(), Status> {
    let mut stream = stream?.into_inner();
    match tokio::time::timeout(Duration::from_millis(300), stream.message()).await {
        Ok(item) => item.map(|_| ()),
        Err(_) => Ok(()),
    }
}

/// Sends the call; the status of a refusal, or None when it was answered.
async fn send(server: &ChildServer, call: Call) -> Option<Status> {
    let channel = server.channel().await;
    let mut runs = RunClient::new(channel.clone());
    let mut approvals = ApprovalClient::new(channel.clone());
    let mut workers = WorkerClient::new(channel.clone());
    let mut subscriptions =
        subscription_service_client::SubscriptionServiceClient::new(channel.clone());
    let answer: Result<(), Status> = match call {
        Call::StartRun(r) => runs.start_run(r).await.map(drop),
        Call::GetRun(r) => runs.get_run(r).await.map(drop),
        Call::ListRuns(r) => runs.list_runs(r).await.map(drop),
        Call::StreamEvents(r) => first_of(runs.stream_events(r).await).await,
        Call::Signal(r) => runs.signal(r).await.map(drop),
        Call::CancelRun(r) => runs.cancel_run(r).await.map(drop),
        Call::ListApprovals(r) => approvals.list_approvals(r).await.map(drop),
        Call::WatchApprovals(r) => first_of(approvals.watch_approvals(r).await).await,
        Call::RegisterWorker(r) => workers.register_worker(r).await.map(drop),
        Call::PollTask(r) => workers.poll_task(r).await.map(drop),
        Call::HeartbeatTask(r) => workers.heartbeat_task(r).await.map(drop),
        Call::CompleteTask(r) => workers.complete_task(r).await.map(drop),
        Call::FailTask(r) => workers.fail_task(r).await.map(drop),
        Call::Subscribe(open) => {
            let request = SubscribeRequest {
                kind: Some(subscribe_request::Kind::Open(open)),
            };
            let outbound = tokio_stream::iter(vec![request]);
            first_of(subscriptions.subscribe(outbound).await).await
        }
        Call::ListDeadLetters(r) => subscriptions.list_dead_letters(r).await.map(drop),
        Call::ReplayDeadLetters(r) => subscriptions.replay_dead_letters(r).await.map(drop),
        Call::Raw(path, bytes) => {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("ready");
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
            grpc.unary(tonic::Request::new(bytes), path, RawCodec)
                .await
                .map(drop)
        }
    };
    answer.err()
}

fn assert_clean(status: &Status, call: &str) {
    assert!(
        !matches!(
            status.code(),
            Code::Internal | Code::Unknown | Code::Cancelled
        ),
        "{call}: {status:?}"
    );
    let info = status
        .get_error_details()
        .error_info()
        .cloned()
        .unwrap_or_else(|| panic!("{call}: no ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "aaa.v1", "{call}");
    assert!(
        status.message().len() <= 600,
        "{call}: {} bytes",
        status.message().len()
    );
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread")]
async fn random_and_mutated_requests_get_clean_answers_and_change_nothing_they_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start_args(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--poll-wait-cap-s", "0.2"],
    )
    .await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run = start_run(&mut runs, scripted_reference_run()).await;
    let call = wait_for_approval(&mut runs, &run).await;
    let seeds = Seeds { run, call };

    let cases = env_number("AAA_FUZZ_CASES", 300);
    let seed = env_number("AAA_FUZZ_SEED", 16) as u8;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    let strategy = calls(&seeds);
    let mut reasons = std::collections::BTreeMap::<String, u32>::new();
    for case in 0..cases {
        let call = strategy.new_tree(&mut runner).unwrap().current();
        let shown = format!("case {case} (seed {seed}): {call:.300?}");
        let before = get_run(&mut runs, &seeds.run).await;
        if let Some(status) = send(&server, call).await {
            assert_clean(&status, &shown);
            let info = status.get_error_details().error_info().cloned();
            *reasons
                .entry(info.map(|i| i.reason).unwrap_or_default())
                .or_default() += 1;
            let after = get_run(&mut runs, &seeds.run).await;
            assert_eq!(before.last_seq, after.last_seq, "{shown} changed the run");
        }
    }

    println!("{cases} cases; refusals by reason: {reasons:?}");
    // The mutations do reach the decoder, and refusals of every kind come.
    assert!(reasons.contains_key("MALFORMED_REQUEST"), "{reasons:?}");
    assert!(reasons.len() >= 5, "{reasons:?}");

    let health = HealthClient::new(server.channel().await)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("Health/Check")
        .into_inner();
    assert_eq!(health.status, 1, "SERVING");
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");

    // The gate still works: a fresh run through its whole cycle.
    let mut workers = server.workers().await;
    let fresh = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &fresh).await;
    grant_and_finish(&mut runs, &mut workers, &fresh, &call_id).await;
}
