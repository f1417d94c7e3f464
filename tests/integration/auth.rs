//! Who may do what: bearer tokens and client certificates, each role against
//! each RPC, the actor recorded for decisions, separation of duties, the
//! refusal to serve open on a public address, TLS, and the request limits.

use std::path::Path;
use std::sync::Arc;

use aaa::auth::{sha256_hex, AuthConfig};
use aaa::proto::{
    model_spec, scripted_step, CancelRunRequest, CompleteTaskRequest, ErrorDetail, FailTaskRequest,
    GetRunRequest, HeartbeatTaskRequest, ListApprovalsRequest, ListRunsRequest, ModelSpec,
    PollTaskRequest, RegisterWorkerRequest, ScriptedModel, ScriptedStep, SignalRequest,
    StartRunRequest, StreamEventsRequest, WatchApprovalsRequest,
};
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::support::*;

const ROLES: [&str; 5] = ["runner", "approver", "worker", "reader", "admin"];

/// The token of each test principal is "token-NAME".
pub fn token(name: &str) -> String {
    format!("token-{name}")
}

/// One principal per role, named after it; "duo" (runner and approver);
/// "watcher" (runner and reader); "other-worker" (serves wire_money too).
/// Workers serve the tools named, and the model "m" for "worker".
pub fn auth_toml(separation_of_duties: bool) -> String {
    let mut text = format!("separation_of_duties = {separation_of_duties}\n");
    let principals = ROLES
        .iter()
        .map(|role| (*role, format!("[\"{role}\"]")))
        .chain([
            ("duo", "[\"runner\", \"approver\"]".to_string()),
            ("watcher", "[\"runner\", \"reader\"]".to_string()),
            ("other-worker", "[\"worker\"]".to_string()),
        ]);
    for (name, roles) in principals {
        text.push_str(&format!(
            "\n[[principal]]\nname = \"{name}\"\nroles = {roles}\ntoken_sha256 = \"{}\"\n",
            sha256_hex(token(name).as_bytes())
        ));
        match name {
            "worker" => text.push_str("tools = [\"wire_money\", \"nothing\"]\nmodels = [\"m\"]\n"),
            "other-worker" => text.push_str("tools = [\"wire_money\"]\n"),
            _ => {}
        }
    }
    text
}

pub async fn start_with_auth(text: String) -> TestServer {
    let auth = Arc::new(AuthConfig::parse(&text, Path::new(".")).expect("auth config"));
    TestServer::start_with(move |config| config.auth = Some(auth.clone())).await
}

/// A run of the scripted model that answers with the task at once.
pub fn echo_run() -> StartRunRequest {
    StartRunRequest {
        task: "hello".into(),
        model: Some(ModelSpec {
            kind: Some(model_spec::Kind::Scripted(ScriptedModel {
                steps: vec![ScriptedStep {
                    reply: Some(scripted_step::Reply::Text("done".into())),
                }],
            })),
        }),
        ..Default::default()
    }
}

pub fn signal_request(run_id: &str, ty: &str, data: serde_json::Value) -> SignalRequest {
    SignalRequest {
        run_id: run_id.into(),
        r#type: ty.into(),
        data_json: data.to_string(),
        request_id: String::new(),
    }
}

/// The RPCs, and which roles besides admin may call each (written here
/// again, apart from the server's table, so that a change to either shows).
const MATRIX: [(&str, &[&str]); 19] = [
    ("StartRun", &["runner"]),
    ("GetRun", &["runner", "reader"]),
    ("ListRuns", &["runner", "reader"]),
    ("StreamEvents", &["runner", "reader"]),
    ("Signal app.note", &["runner"]),
    ("Signal aaa.approval.granted", &["approver"]),
    ("Signal aaa.approval.denied", &["approver"]),
    ("CancelRun", &["runner"]),
    ("ListApprovals", &["approver", "reader"]),
    ("WatchApprovals", &["approver", "reader"]),
    ("CreateGrant", &["approver"]),
    ("RevokeGrant", &["approver"]),
    ("ListGrants", &["approver", "reader"]),
    ("RegisterWorker", &["worker"]),
    ("PollTask", &["worker"]),
    ("HeartbeatTask", &["worker"]),
    ("CompleteTask", &["worker"]),
    ("FailTask", &["worker"]),
    // Every role: the SDKs route a run's writes by it.
    ("GetCluster", &["runner", "approver", "worker", "reader"]),
];

/// Calls `rpc` as the holder of `clients`; only the status matters.
async fn call(clients: &mut Clients, rpc: &str, run_id: &str) -> Result<(), Status> {
    let Clients {
        runs,
        approvals,
        workers,
        grants,
        cluster,
    } = clients;
    let call = serde_json::json!({ "call_id": "call-9" });
    match rpc {
        "StartRun" => runs.start_run(echo_run()).await.map(drop),
        "GetRun" => runs
            .get_run(GetRunRequest {
                run_id: run_id.into(),
            })
            .await
            .map(drop),
        "ListRuns" => runs.list_runs(ListRunsRequest::default()).await.map(drop),
        "StreamEvents" => runs
            .stream_events(StreamEventsRequest {
                run_id: run_id.into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "Signal app.note" => runs
            .signal(signal_request(run_id, "app.note", serde_json::json!({})))
            .await
            .map(drop),
        "Signal aaa.approval.granted" => runs
            .signal(signal_request(run_id, "aaa.approval.granted", call))
            .await
            .map(drop),
        "Signal aaa.approval.denied" => runs
            .signal(signal_request(run_id, "aaa.approval.denied", call))
            .await
            .map(drop),
        "CancelRun" => runs
            .cancel_run(CancelRunRequest {
                run_id: run_id.into(),
                reason: String::new(),
            })
            .await
            .map(drop),
        "ListApprovals" => approvals
            .list_approvals(ListApprovalsRequest::default())
            .await
            .map(drop),
        "WatchApprovals" => approvals
            .watch_approvals(WatchApprovalsRequest::default())
            .await
            .map(drop),
        // Invalid requests: the roles are checked first.
        "CreateGrant" => grants
            .create_grant(aaa::proto::CreateGrantRequest::default())
            .await
            .map(drop),
        "RevokeGrant" => grants
            .revoke_grant(aaa::proto::RevokeGrantRequest::default())
            .await
            .map(drop),
        "ListGrants" => grants
            .list_grants(aaa::proto::ListGrantsRequest::default())
            .await
            .map(drop),
        "RegisterWorker" => workers
            .register_worker(RegisterWorkerRequest::default())
            .await
            .map(drop),
        "PollTask" => workers
            .poll_task(PollTaskRequest {
                identity: String::new(),
                tools: vec!["nothing".into()],
                models: vec![],
                wait_s: 0.001,
            })
            .await
            .map(drop),
        "HeartbeatTask" => workers
            .heartbeat_task(HeartbeatTaskRequest {
                token: "bad".into(),
            })
            .await
            .map(drop),
        "CompleteTask" => workers
            .complete_task(CompleteTaskRequest {
                token: "bad".into(),
                result: None,
            })
            .await
            .map(drop),
        "FailTask" => workers
            .fail_task(FailTaskRequest {
                token: "bad".into(),
                error: Some(ErrorDetail::default()),
                non_retryable: false,
            })
            .await
            .map(drop),
        "GetCluster" => cluster
            .get_cluster(aaa::proto::GetClusterRequest {})
            .await
            .map(drop),
        other => panic!("no such rpc in the matrix: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_role_may_call_its_rpcs_and_no_other() {
    let server = start_with_auth(auth_toml(false)).await;
    // The runner's own run: runners act only on the runs they started.
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let run_id = runner
        .runs
        .start_run(echo_run())
        .await
        .expect("StartRun as runner")
        .into_inner()
        .run_id;
    let mut wrong = Vec::new();
    for role in ROLES {
        let mut clients = Clients::with_token(&server, &token(role)).await;
        for (rpc, allowed) in MATRIX {
            let allowed = role == "admin" || allowed.contains(&role);
            let result = call(&mut clients, rpc, &run_id).await;
            let code = result.as_ref().err().map(|s| s.code());
            let ok = match (allowed, &result) {
                (true, _) => !matches!(code, Some(Code::PermissionDenied | Code::Unauthenticated)),
                (false, Err(status)) => {
                    assert_error(status, Code::PermissionDenied, "PERMISSION_DENIED");
                    true
                }
                (false, Ok(())) => false,
            };
            if !ok {
                wrong.push(format!("{role} {rpc}: allowed={allowed}, got {result:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    server.shutdown().await;
}

/// PolicyService as docs/auth.md has it: approvers read the policy (its
/// rules and file), only admin reloads it. A reader may not (issue 40,
/// item 10: GetPolicy was open to readers and told them the file's path).
#[tokio::test(flavor = "multi_thread")]
async fn the_policy_is_read_by_approvers_and_reloaded_by_admin() {
    use aaa::proto::{
        policy_service_client::PolicyServiceClient, GetPolicyRequest, ReloadPolicyRequest,
    };
    let server = start_with_auth(auth_toml(false)).await;
    let mut wrong = Vec::new();
    for role in ROLES {
        let mut policy = PolicyServiceClient::with_interceptor(
            server.channel().await,
            Bearer::new(Some(&token(role))),
        );
        let read = policy.get_policy(GetPolicyRequest {}).await.map(drop);
        let reload = policy.reload_policy(ReloadPolicyRequest {}).await.map(drop);
        for (rpc, allowed, result) in [
            ("GetPolicy", matches!(role, "approver" | "admin"), read),
            ("ReloadPolicy", role == "admin", reload),
        ] {
            let denied = matches!(&result, Err(s) if s.code() == Code::PermissionDenied);
            if denied == allowed {
                wrong.push(format!("{role} {rpc}: allowed={allowed}, got {result:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn permission_denied_names_the_roles_that_would_do() {
    let server = start_with_auth(auth_toml(false)).await;
    let mut reader = Clients::with_token(&server, &token("reader")).await;
    let status = expect_err(reader.runs.start_run(echo_run()).await);
    let info = assert_error(&status, Code::PermissionDenied, "PERMISSION_DENIED");
    assert_eq!(info.metadata["roles"], "runner,admin");
    assert!(
        status.message().contains("needs the role runner or admin"),
        "{status:?}"
    );
    assert!(status.message().contains("reader"), "{status:?}");

    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let grant = signal_request("x", "aaa.approval.granted", serde_json::json!({}));
    let status = expect_err(runner.runs.signal(grant).await);
    let info = assert_error(&status, Code::PermissionDenied, "PERMISSION_DENIED");
    assert_eq!(info.metadata["roles"], "approver,admin");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runners_see_and_touch_only_the_runs_they_started() {
    let server = start_with_auth(auth_toml(false)).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mine = runner
        .runs
        .start_run(echo_run())
        .await
        .unwrap()
        .into_inner()
        .run_id;
    // "duo" is a runner (and an approver) too, but did not start this run.
    let mut duo = Clients::with_token(&server, &token("duo")).await;
    let theirs = duo
        .runs
        .start_run(echo_run())
        .await
        .unwrap()
        .into_inner()
        .run_id;
    // Without reader, another's run is answered as an unknown one is, so
    // that run ids cannot be probed; a reader that may not act hears why.
    let unknown = aaa::store::RunId::new().to_string();
    let mut watcher = Clients::with_token(&server, &token("watcher")).await;
    for rpc in ["GetRun", "StreamEvents", "Signal app.note", "CancelRun"] {
        let status = expect_err(call(&mut duo, rpc, &mine).await);
        let info = assert_error(&status, Code::NotFound, "RUN_NOT_FOUND");
        assert_eq!(info.metadata["run_id"], mine, "{rpc}");
        let for_unknown = expect_err(call(&mut duo, rpc, &unknown).await);
        assert_error(&for_unknown, Code::NotFound, "RUN_NOT_FOUND");
        assert_eq!(
            for_unknown.message().replace(&unknown, "ID"),
            status.message().replace(&mine, "ID"),
            "{rpc}"
        );
        if rpc == "Signal app.note" || rpc == "CancelRun" {
            let status = expect_err(call(&mut watcher, rpc, &mine).await);
            let info = assert_error(&status, Code::PermissionDenied, "NOT_RUN_OWNER");
            assert_eq!(info.metadata["run_id"], mine, "{rpc}");
        } else {
            call(&mut watcher, rpc, &mine).await.expect(rpc);
        }
    }
    let listed = |response: aaa::proto::ListRunsResponse| -> Vec<String> {
        response.runs.into_iter().map(|r| r.run_id).collect()
    };
    let list = ListRunsRequest::default();
    let of_duo = listed(duo.runs.list_runs(list.clone()).await.unwrap().into_inner());
    assert_eq!(of_duo, [theirs.as_str()]);
    let of_runner = listed(
        runner
            .runs
            .list_runs(list.clone())
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(of_runner, [mine.as_str()]);
    // Readers read every run.
    let mut reader = Clients::with_token(&server, &token("reader")).await;
    let all = listed(reader.runs.list_runs(list).await.unwrap().into_inner());
    assert_eq!(all.len(), 2, "{all:?}");
    reader.history(&mine).await;
    server.shutdown().await;
}

/// Issue 40, item 10: a runner must not tell another principal's run
/// from an unknown id by how long the same NOT_FOUND takes. Timed in
/// interleaved pairs (1,000 per method after 100 not counted, the order
/// within a pair alternating), another's run must be the slower in 40% to
/// 60% of the pairs (50% tells nothing; far either way tells). Ignored
/// because it measures time (it belongs on a quiet machine). It failed
/// before issue 40: a run that exists had its first event read and
/// decoded, an unknown id was a miss (docs/auth.md, "What time tells").
/// `aaa bench --only probe` measures the same against a release server.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "measures time: run it with --ignored on a quiet machine"]
async fn a_runner_cannot_tell_anothers_run_from_an_unknown_id_by_time() {
    const PAIRS: usize = 1_000;
    const WARM_UP: usize = 100;
    let server = start_with_auth(auth_toml(false)).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mut foreign = Vec::new();
    for _ in 0..20 {
        let started = runner.runs.start_run(echo_run()).await.expect("StartRun");
        foreign.push(started.into_inner().run_id);
    }
    // Unknown ids in the same shards as the foreign runs.
    let unknown: Vec<String> = foreign
        .iter()
        .map(|id| {
            let shard = aaa::store::RunId::parse(id).expect("a run id").shard();
            aaa::store::RunId::new_in_shard(shard).to_string()
        })
        .collect();
    let mut prober = Clients::with_token(&server, &token("duo")).await;
    let mut shares = Vec::new();
    for rpc in ["GetRun", "StreamEvents", "Signal app.note"] {
        let mut slower = 0.0;
        for i in 0..WARM_UP + PAIRS {
            let (f, u) = (&foreign[i % 20], &unknown[i % 20]);
            let (f_time, u_time) = match i % 2 {
                0 => {
                    let f_time = time_not_found(&mut prober, rpc, f).await;
                    (f_time, time_not_found(&mut prober, rpc, u).await)
                }
                _ => {
                    let u_time = time_not_found(&mut prober, rpc, u).await;
                    (time_not_found(&mut prober, rpc, f).await, u_time)
                }
            };
            if i >= WARM_UP {
                slower += match f_time.cmp(&u_time) {
                    std::cmp::Ordering::Greater => 1.0,
                    std::cmp::Ordering::Equal => 0.5,
                    std::cmp::Ordering::Less => 0.0,
                };
            }
        }
        shares.push((rpc, slower / PAIRS as f64));
    }
    server.shutdown().await;
    let told = shares
        .iter()
        .filter(|(_, share)| !(0.4..=0.6).contains(share))
        .count();
    assert_eq!(
        told, 0,
        "share of pairs where another's run answered NOT_FOUND slower than an unknown id \
         (0.4 to 0.6 tells nothing): {shares:?}"
    );
}

/// How long `rpc` naming `run_id` takes to be answered RUN_NOT_FOUND.
async fn time_not_found(clients: &mut Clients, rpc: &str, run_id: &str) -> std::time::Duration {
    let start = std::time::Instant::now();
    let status = expect_err(call(clients, rpc, run_id).await);
    let elapsed = start.elapsed();
    assert_error(&status, Code::NotFound, "RUN_NOT_FOUND");
    elapsed
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_unknown_credentials_are_unauthenticated_but_health_is_open() {
    let server = start_with_auth(auth_toml(false)).await;
    let channel = server.channel().await;
    for token in [None, Some("not-a-token"), Some("")] {
        let mut clients = Clients::new(channel.clone(), token);
        let status = expect_err(clients.runs.list_runs(ListRunsRequest::default()).await);
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
        let status = expect_err(call(&mut clients, "PollTask", "").await);
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    }
    // The header must be exactly one `Bearer TOKEN` (the scheme in any case).
    let runner = format!("Bearer {}", token("runner"));
    // Tokens are compared exactly.
    let upper = format!("Bearer {}", token("runner").to_uppercase());
    let odd_case = format!("bEaReR {}", token("runner"));
    let bare = token("runner");
    let header_cases: [(Vec<&[u8]>, bool); 8] = [
        (vec![runner.as_bytes()], true),
        (vec![upper.as_bytes()], false),
        (vec![odd_case.as_bytes()], true),
        (vec![bare.as_bytes()], false),
        (vec![b"Basic dXNlcjpwYXNz"], false),
        (vec![b"Bearer "], false),
        (vec![b"Bearer token-\xff"], false),
        (vec![runner.as_bytes(), runner.as_bytes()], false),
    ];
    for (values, accepted) in header_cases {
        let mut request = tonic::Request::new(ListRunsRequest::default());
        for value in &values {
            let value = tonic::metadata::MetadataValue::try_from(*value).expect("header bytes");
            request.metadata_mut().append("authorization", value);
        }
        let result = server.runs().await.list_runs(request).await;
        let shown = values
            .iter()
            .map(|v| String::from_utf8_lossy(v))
            .collect::<Vec<_>>();
        match accepted {
            true => drop(result.unwrap_or_else(|e| panic!("{shown:?}: {e:?}"))),
            false => {
                let status = result.expect_err(&format!("{shown:?} was accepted"));
                assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
                assert!(!status.message().contains("token-runner"), "{status:?}");
            }
        }
    }

    let mut health = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: String::new(),
    };
    health
        .check(request)
        .await
        .expect("Health/Check needs no token");
    server.shutdown().await;
}

/// "worker" registers wire_money as payments-1; "runner" starts the
/// reference run, "approver" grants its call (with `comment`), and "worker"
/// polls the task with one long poll, which gets it at once.
pub async fn granted_task(
    server: &TestServer,
    worker: &mut Clients,
    comment: &str,
) -> (String, aaa::proto::Task) {
    let register = RegisterWorkerRequest {
        identity: "payments-1".into(),
        tools: vec![wire_money()],
        models: vec![],
    };
    worker
        .workers
        .register_worker(register)
        .await
        .expect("RegisterWorker");
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
    let call = call_id(events.last().unwrap());
    let grant = serde_json::json!({ "call_id": call, "comment": comment });
    let mut approver = Clients::with_token(server, &token("approver")).await;
    approver
        .runs
        .signal(signal_request(&run_id, "aaa.approval.granted", grant))
        .await
        .expect("grant");
    let request = PollTaskRequest {
        identity: "payments-1".into(),
        tools: vec!["wire_money".into()],
        models: vec![],
        wait_s: WAIT.as_secs_f64(),
    };
    let task = tokio::time::timeout(WAIT, worker.workers.poll_task(request))
        .await
        .expect("PollTask answered")
        .expect("PollTask")
        .into_inner()
        .task
        .expect("the granted call, within WAIT");
    (run_id, task)
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_are_each_principals_own() {
    let server = start_with_auth(auth_toml(false)).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mut duo = Clients::with_token(&server, &token("duo")).await;
    let start = |clients: &mut Clients| {
        let mut runs = clients.runs.clone();
        async move {
            let mut request = echo_run();
            request.request_id = "nightly-1".into();
            let answer = runs.start_run(request).await.expect("StartRun");
            let answer = answer.into_inner();
            (answer.run_id, answer.created)
        }
    };
    let (of_runner, created) = start(&mut runner).await;
    assert!(created);
    // The same id from another principal starts its own run...
    let (of_duo, created) = start(&mut duo).await;
    assert!(created);
    assert_ne!(of_runner, of_duo);
    // ...and each retry finds its own principal's run.
    assert_eq!(start(&mut runner).await, (of_runner.clone(), false));
    assert_eq!(start(&mut duo).await, (of_duo, false));

    // Signal: the run's owner and an admin send the same request id to the
    // same (waiting) run; each gets an event of its own.
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    let register = RegisterWorkerRequest {
        tools: vec![wire_money()],
        ..Default::default()
    };
    worker.workers.register_worker(register).await.unwrap();
    let waiting = runner.runs.start_run(scripted_reference_run()).await;
    let waiting = waiting.expect("StartRun").into_inner().run_id;
    runner
        .wait_for_event(&waiting, "aaa.approval.requested")
        .await;
    let admin = Clients::with_token(&server, &token("admin")).await;
    let mut seqs = Vec::new();
    for clients in [&runner, &admin, &runner] {
        let mut request = signal_request(&waiting, "app.note", serde_json::json!({}));
        request.request_id = "note-1".into();
        let answer = clients.runs.clone().signal(request).await.expect("Signal");
        seqs.push(answer.into_inner().seq);
    }
    assert_ne!(seqs[0], seqs[1], "another principal's request id answered");
    assert_eq!(seqs[0], seqs[2], "a retry appended again");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_approver_is_the_recorded_actor_of_the_grant_with_its_comment() {
    let server = start_with_auth(auth_toml(false)).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    let (run_id, task) = granted_task(&server, &mut worker, "checked with finance").await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    worker
        .workers
        .complete_task(CompleteTaskRequest {
            token: task.token,
            result: Some(aaa::proto::complete_task_request::Result::OutputJson(
                REFERENCE_OUTPUT.into(),
            )),
        })
        .await
        .expect("CompleteTask");

    let events = runner.wait_for_event(&run_id, "aaa.run.completed").await;
    let actor = |ty: &str| {
        let actor = find(&events, ty).actor.clone().expect("actor");
        (actor.kind, actor.name)
    };
    let (client, worker_kind, engine) = (3, 2, 1);
    assert_eq!(actor("aaa.run.started"), (client, "runner".to_string()));
    assert_eq!(actor("aaa.approval.granted"), (client, "approver".into()));
    assert_eq!(actor("aaa.tool.requested"), (engine, String::new()));
    // The identity the worker polled with, and (below) its principal.
    assert_eq!(
        actor("aaa.tool.completed"),
        (worker_kind, "payments-1".into())
    );
    let completed = find(&events, "aaa.tool.completed").actor.clone().unwrap();
    assert_eq!(completed.principal, "worker");
    let granted = data(find(&events, "aaa.approval.granted"));
    assert_eq!(granted["comment"], "checked with finance");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_separation_of_duties_the_starter_may_not_decide_its_runs_calls() {
    let server = start_with_auth(auth_toml(true)).await;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    worker
        .workers
        .register_worker(RegisterWorkerRequest {
            identity: "payments-1".into(),
            tools: vec![wire_money()],
            models: vec![],
        })
        .await
        .expect("RegisterWorker");
    let mut duo = Clients::with_token(&server, &token("duo")).await;
    // Nor may a standing grant the starter made: the call waits.
    duo.grants
        .create_grant(aaa::proto::CreateGrantRequest {
            tool: "wire_money".into(),
            reason: "my own payments".into(),
            ..Default::default()
        })
        .await
        .expect("CreateGrant");
    let run_id = duo
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = duo.wait_for_event(&run_id, "aaa.approval.requested").await;
    let call = serde_json::json!({ "call_id": call_id(events.last().unwrap()) });

    for ty in ["aaa.approval.granted", "aaa.approval.denied"] {
        let status = expect_err(
            duo.runs
                .signal(signal_request(&run_id, ty, call.clone()))
                .await,
        );
        let info = assert_error(&status, Code::PermissionDenied, "SEPARATION_OF_DUTIES");
        assert_eq!(info.metadata["run_id"], run_id);
    }
    // Its own application events are still fine, and nothing was decided.
    duo.runs
        .signal(signal_request(&run_id, "app.note", serde_json::json!({})))
        .await
        .expect("app event by the starter");
    let history = duo.history(&run_id).await;
    assert_eq!(count(&history, "aaa.approval.granted"), 0);
    assert_eq!(count(&history, "aaa.approval.denied"), 0);

    let mut approver = Clients::with_token(&server, &token("approver")).await;
    let answer = approver
        .runs
        .signal(signal_request(&run_id, "aaa.approval.granted", call))
        .await
        .expect("another principal may grant")
        .into_inner();
    assert!(!answer.already_decided);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_auth_a_public_address_needs_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let output = serve_refused(&dir.path().join("data"), &["--listen", "0.0.0.0:0"]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "aaa: refusing to serve 0.0.0.0:0 without authentication: give --auth-config FILE, \
          or --insecure to let anyone who can reach it call every RPC"
        ],
    );
    assert!(!dir.path().join("data").exists(), "nothing was opened");

    let server =
        ChildServer::start_args(dir.path(), &["--listen", "0.0.0.0:0", "--insecure"]).await;
    let mut runs = server.runs().await;
    start_run(&mut runs, echo_run()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_auth_config_file_exits_64_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    std::fs::write(
        &file,
        "[[principal]]\nname = \"ci\"\nroles = [\"runner\"]\ntoken_sha256 = \"abc\"\n",
    )
    .unwrap();
    let file = file.to_str().expect("a UTF-8 temp path");
    let args = ["--listen", "127.0.0.1:0", "--auth-config", file];
    let output = serve_refused(&dir.path().join("data"), &args);
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("principal 'ci': token_sha256 is not 64 hex digits"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_binary_serves_with_an_auth_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, auth_toml(false)).unwrap();
    let file = file.to_str().unwrap();
    let server = ChildServer::start_args(
        dir.path(),
        &["--listen", "0.0.0.0:0", "--auth-config", file],
    )
    .await;
    // Calls naming no principal (none, a malformed header) can come as
    // fast as anyone sends them: one log line a minute per address, and
    // nobody is locked out by them.
    let mut anonymous = server.runs().await;
    for _ in 0..30 {
        let status = expect_err(anonymous.list_runs(ListRunsRequest::default()).await);
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    }
    for _ in 0..10 {
        let mut request = tonic::Request::new(ListRunsRequest::default());
        let basic = tonic::metadata::MetadataValue::from_static("Basic dXNlcjpwYXNz");
        request.metadata_mut().insert("authorization", basic);
        let status = expect_err(anonymous.list_runs(request).await);
        assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    }
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    runner.runs.start_run(echo_run()).await.expect("StartRun");
    // A principal's refusal is logged each time; it comes after the others.
    let status = expect_err(call(&mut runner, "PollTask", "").await);
    assert_error(&status, Code::PermissionDenied, "PERMISSION_DENIED");
    server.wait_for_log_line("runner may not call").await;
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    let unnamed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("naming no principal"))
        .collect();
    assert_eq!(unnamed.len(), 1, "{unnamed:#?}");
    assert!(unnamed[0].contains("missing credentials"), "{unnamed:#?}");
    assert!(!log.contains("token-"), "no token in the log: {log}");
}

// ------------------------------------------------------------------- limits

#[tokio::test(flavor = "multi_thread")]
async fn json_nested_deeper_than_64_levels_is_refused_naming_the_field() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, echo_run()).await;
    let nested = |depth: usize| {
        format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    };
    let deep = SignalRequest {
        data_json: nested(65),
        ..signal_request(&run_id, "app.note", serde_json::json!({}))
    };
    let status = expect_err(runs.signal(deep).await);
    let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "data_json");
    assert!(status.message().contains("64 levels"), "{status:?}");

    let mut request = scripted_run("wire_money", &nested(70));
    request.tools.clear();
    let status = expect_err(runs.start_run(request).await);
    let info = assert_error(&status, Code::InvalidArgument, "INVALID_FIELD");
    assert!(
        info.metadata["field"].ends_with("arguments_json"),
        "{info:?}"
    );

    // 64 levels are fine (the run has finished, so this one is refused for that).
    let ok = SignalRequest {
        data_json: nested(64),
        ..signal_request(&run_id, "app.note", serde_json::json!({}))
    };
    let status = expect_err(runs.signal(ok).await);
    assert_error(&status, Code::FailedPrecondition, "RUN_FINISHED");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_over_the_size_limit_is_refused_by_the_transport() {
    let server = TestServer::start_with(|config| config.max_message_bytes = 4096).await;
    let mut runs = server.runs().await;
    let big = StartRunRequest {
        task: "x".repeat(5000),
        ..echo_run()
    };
    let status = expect_err(runs.start_run(big).await);
    // tonic's own refusal: OUT_OF_RANGE, with the sizes in the message.
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("the limit is: 4096 bytes"),
        "{status:?}"
    );
    start_run(&mut runs, echo_run()).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_gets_no_more_concurrent_streams_than_the_cap() {
    let server = TestServer::start_with(|config| config.max_streams_per_connection = 1).await;
    let channel = server.channel().await;
    let mut approvals =
        aaa::proto::approval_service_client::ApprovalServiceClient::new(channel.clone());
    let watch = watch_approvals(&mut approvals, WatchApprovalsRequest::default()).await;
    // The one stream is taken: a second call on this connection waits.
    let mut runs = aaa::proto::run_service_client::RunServiceClient::new(channel);
    let mut list = Box::pin(runs.list_runs(ListRunsRequest::default()));
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut list).await;
    assert!(
        waited.is_err(),
        "the second stream was not held back: {waited:?}"
    );
    // Another connection is not affected.
    let mut other = server.runs().await;
    other
        .list_runs(ListRunsRequest::default())
        .await
        .expect("ListRuns");
    drop(watch);
    tokio::time::timeout(WAIT, list)
        .await
        .expect("the call went on once the stream closed")
        .expect("ListRuns");
    server.shutdown().await;
}

// ---------------------------------------------------------------------- TLS

/// A CA, a server certificate for "localhost" and a client certificate,
/// both signed by the CA; PEM files in `dir` (`server.pem`
/// holds the server's certificate, then the CA's). Returns the client's
/// certificate DER hash, as the auth config names it.
pub struct Pki {
    pub ca_pem: String,
    client: ClientCert,
    /// Signed by the same CA, but without extendedKeyUsage.
    no_usage: ClientCert,
}

pub struct ClientCert {
    cert_pem: String,
    key_pem: String,
    sha256: String,
}

pub fn make_pki(dir: &Path) -> Pki {
    make_pki_for(dir, &["localhost"])
}

/// [`make_pki`] with a server certificate for these names (DNS names or
/// IP addresses).
pub fn make_pki_for(dir: &Path, names: &[&str]) -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let server_key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let server_params = CertificateParams::new(names).unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    let client = |usages: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["robot".to_string()]).unwrap();
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &issuer).unwrap();
        ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            sha256: sha256_hex(cert.der()),
        }
    };

    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    // The server's file holds its chain: servers of a cluster trust it.
    let chain = format!("{}{}", server_cert.pem(), ca_cert.pem());
    std::fs::write(dir.join("server.pem"), chain).unwrap();
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        client: client(vec![ExtendedKeyUsagePurpose::ClientAuth]),
        no_usage: client(Vec::new()),
    }
}

/// Connects over TLS, trusting `pki`'s CA, with a client certificate or not.
async fn tls_channel(
    addr: std::net::SocketAddr,
    pki: &Pki,
    cert: Option<&ClientCert>,
) -> tonic::transport::Channel {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");
    if let Some(cert) = cert {
        tls = tls.identity(Identity::from_pem(&cert.cert_pem, &cert.key_pem));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("TLS connect to {addr}: {e:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn over_tls_a_client_certificate_or_a_token_names_the_caller() {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = make_pki(pki_dir.path());
    let text = format!(
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"ca.pem\"\n\n\
         [[principal]]\nname = \"robot\"\nroles = [\"runner\"]\ncert_sha256 = \"{}\"\n\n\
         [[principal]]\nname = \"no-usage\"\nroles = [\"runner\"]\ncert_sha256 = \"{}\"\n\n\
         [[principal]]\nname = \"reader\"\nroles = [\"reader\"]\ntoken_sha256 = \"{}\"\n",
        pki.client.sha256,
        pki.no_usage.sha256,
        sha256_hex(token("reader").as_bytes()),
    );
    std::fs::write(pki_dir.path().join("auth.toml"), &text).unwrap();
    let auth = Arc::new(AuthConfig::load(&pki_dir.path().join("auth.toml")).expect("auth config"));
    let server = TestServer::start_with(move |config| config.auth = Some(auth.clone())).await;

    // The client certificate alone authenticates "robot".
    let mut robot = Clients::new(
        tls_channel(server.addr(), &pki, Some(&pki.client)).await,
        None,
    );
    let run_id = robot
        .runs
        .start_run(echo_run())
        .await
        .expect("StartRun with a client certificate")
        .into_inner()
        .run_id;
    // A token over TLS, without a certificate.
    let mut reader = Clients::new(
        tls_channel(server.addr(), &pki, None).await,
        Some(&token("reader")),
    );
    let events = reader.history(&run_id).await;
    let actor = find(&events, "aaa.run.started").actor.clone().unwrap();
    assert_eq!((actor.kind, actor.name.as_str()), (3, "robot"));
    // Neither: UNAUTHENTICATED.
    let mut anonymous = Clients::new(tls_channel(server.addr(), &pki, None).await, None);
    let status = expect_err(anonymous.runs.list_runs(ListRunsRequest::default()).await);
    assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    // A certificate of the CA, listed in the config, but not for client
    // authentication (no extendedKeyUsage): UNAUTHENTICATED, saying why.
    let mut no_usage = Clients::new(
        tls_channel(server.addr(), &pki, Some(&pki.no_usage)).await,
        None,
    );
    let status = expect_err(no_usage.runs.list_runs(ListRunsRequest::default()).await);
    assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    assert!(status.message().contains("clientAuth"), "{status:?}");
    // Plain text gets no answer from a TLS server.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut runs = aaa::proto::run_service_client::RunServiceClient::new(channel);
        expect_err(runs.list_runs(ListRunsRequest::default()).await);
    }
    server.shutdown().await;
}

/// grpcurl: `AAA_GRPCURL`, else `grpcurl` on PATH. `.ci/run` installs it and
/// sets `AAA_GRPCURL`, so under CI a missing grpcurl fails the test.
fn grpcurl() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("AAA_GRPCURL") {
        return Some(path.into());
    }
    let found = std::process::Command::new("grpcurl")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    found.then(|| "grpcurl".into())
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcurl_connects_over_tls_with_a_token_or_a_client_certificate() {
    let Some(grpcurl) = grpcurl() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs grpcurl (AAA_GRPCURL)"
        );
        eprintln!("grpcurl not found: skipped (set AAA_GRPCURL)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    std::fs::write(dir.path().join("client.pem"), &pki.client.cert_pem).unwrap();
    std::fs::write(dir.path().join("client.key"), &pki.client.key_pem).unwrap();
    let text = format!(
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"ca.pem\"\n\n\
         [[principal]]\nname = \"robot\"\nroles = [\"reader\"]\ncert_sha256 = \"{}\"\n\n\
         [[principal]]\nname = \"reader\"\nroles = [\"reader\"]\ntoken_sha256 = \"{}\"\n",
        pki.client.sha256,
        sha256_hex(token("reader").as_bytes()),
    );
    let auth = Arc::new(AuthConfig::parse(&text, dir.path()).expect("auth config"));
    let server = TestServer::start_with(move |config| config.auth = Some(auth.clone())).await;
    let target = format!("localhost:{}", server.addr().port());
    let run = |credentials: &[&str]| {
        let output = std::process::Command::new(&grpcurl)
            .current_dir(dir.path())
            .args(["-cacert", "ca.pem"])
            .args(credentials)
            .args(["-d", "{}", &target, "aaa.v1.RunService/ListRuns"])
            .output()
            .expect("run grpcurl");
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        (output.status.success(), stderr)
    };
    let (ok, stderr) = run(&["-cert", "client.pem", "-key", "client.key"]);
    assert!(ok, "mTLS: {stderr}");
    let bearer = format!("authorization: Bearer {}", token("reader"));
    let (ok, stderr) = run(&["-H", &bearer]);
    assert!(ok, "TLS with a token: {stderr}");
    let (ok, stderr) = run(&[]);
    assert!(!ok && stderr.contains("Unauthenticated"), "{stderr}");
    server.shutdown().await;
}

/// With auth on, a server of a database that advertises an address other
/// machines reach forwards callers' identities over that hop: without
/// `[tls]` it refuses to start (exit 64 from `aaa serve`), naming the fix,
/// before it opens the store.
#[tokio::test]
async fn with_auth_on_a_server_forwarding_beyond_loopback_needs_tls() {
    let auth = Arc::new(AuthConfig::parse(&auth_toml(false), Path::new(".")).expect("auth config"));
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = aaa::Config::new(dir.path());
    config.auth = Some(auth);
    config.store_url = Some("postgres://nobody@127.0.0.1:1/nothing".into());
    config.advertise = Some("10.1.2.3:50051".into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let served = aaa::serve(listener, config, || {}, std::future::pending());
    let error = tokio::time::timeout(std::time::Duration::from_secs(30), served)
        .await
        .expect("answered at once")
        .expect_err("refused to start");
    let text = error.to_string();
    assert!(matches!(error, aaa::ServeError::Config(_)), "{text}");
    assert!(
        text.contains("10.1.2.3:50051") && text.contains("[tls]"),
        "{text}"
    );
}
