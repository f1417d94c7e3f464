//! `GET /metrics` on the server's own port: the approval gauges and
//! histograms follow a run from its request to its grant, the gauges are
//! seeded again after a restart, the api and store are counted, and with
//! auth on only a reader may scrape.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::auth::{auth_toml, start_with_auth, token};
use crate::support::*;

/// GET `path` over HTTP/1.1 with an optional bearer token: (status, body).
pub async fn http_get(server: &impl Server, path: &str, token: Option<&str>) -> (u16, String) {
    try_http_get(server.addr(), path, token)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Like [`http_get`], with the failure to connect as an error.
pub async fn try_http_get(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut request = http::Request::get(format!("http://{addr}{path}"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = client
        .request(request.body(Empty::new()).expect("request"))
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    ))
}

pub async fn scrape(server: &impl Server) -> String {
    let (status, text) = http_get(server, "/metrics", None).await;
    assert_eq!(status, 200, "{text}");
    text
}

/// The value of one series (`name{labels}` exactly as exposed), if shown.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}

fn must(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

const PENDING: &str = r#"aaa_approvals_pending{tool="wire_money"}"#;
const WAITING: &str = r#"aaa_runs{status="waiting"}"#;
const OLDEST: &str = r#"aaa_approval_oldest_wait_seconds{tool="wire_money"}"#;

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_is_measured_from_its_request_to_its_grant() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let text = scrape(&server).await;
    assert_eq!(must(&text, PENDING), 1.0);
    assert_eq!(must(&text, WAITING), 1.0);
    assert_eq!(must(&text, "aaa_runs_started_total"), 1.0);
    assert_eq!(
        must(
            &text,
            r#"aaa_api_requests_total{method="RunService/StartRun",code="OK"}"#
        ),
        1.0
    );

    // The wait is measured on the server's clock, which the test moves.
    server.clock().advance(Duration::from_secs(90));
    let oldest = must(&scrape(&server).await, OLDEST);
    assert!((90.0..300.0).contains(&oldest), "oldest wait {oldest}");
    grant(&mut runs, &run_id, &call_id).await;
    let task = poll_until_task(&mut workers, "payments-1", &["wire_money"], &[]).await;
    server.clock().advance(Duration::from_secs(2));
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    wait_for_end(&mut runs, &run_id).await;

    let text = scrape(&server).await;
    assert_eq!(must(&text, PENDING), 0.0);
    assert_eq!(must(&text, OLDEST), 0.0);
    assert_eq!(must(&text, WAITING), 0.0);
    let wait = r#"aaa_approval_wait_seconds_{}{tool="wire_money",outcome="granted"}"#;
    assert_eq!(must(&text, &wait.replace("{}", "count")), 1.0);
    // Real time runs too: the wait is 90 s and a little.
    let waited = must(&text, &wait.replace("{}", "sum"));
    assert!((90.0..300.0).contains(&waited), "waited {waited}");
    let bucket = |le: &str| {
        format!(
            r#"aaa_approval_wait_seconds_bucket{{le="{le}",tool="wire_money",outcome="granted"}}"#
        )
    };
    assert_eq!(value(&text, &bucket("60.0")), Some(0.0), "{text}");
    assert_eq!(value(&text, &bucket("300.0")), Some(1.0), "{text}");
    assert_eq!(
        must(
            &text,
            r#"aaa_approval_decisions_total{tool="wire_money",outcome="granted",actor_kind="client"}"#
        ),
        1.0
    );
    assert_eq!(
        must(
            &text,
            r#"aaa_tool_attempts_total{tool="wire_money",outcome="completed"}"#
        ),
        1.0
    );
    let ran = must(&text, r#"aaa_tool_attempt_seconds_sum{tool="wire_money"}"#);
    assert!((2.0..60.0).contains(&ran), "ran {ran}");
    assert_eq!(
        must(&text, r#"aaa_runs_finished_total{status="completed"}"#),
        1.0
    );
    assert!(must(&text, "aaa_store_commit_seconds_count") >= 3.0);
    assert!(must(&text, "aaa_store_fsyncs_total") >= 3.0);
    assert!(must(&text, "aaa_store_commit_batch_size_sum") >= 8.0);
    if !on_postgres() {
        assert!(must(&text, "aaa_store_disk_bytes") > 0.0);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_server_counts_the_runs_it_finds_waiting() {
    let mut server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    for _ in 0..3 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        wait_for_approval(&mut runs, &run_id).await;
    }
    drop((runs, workers));
    server.restart().await;

    let text = scrape(&server).await;
    assert_eq!(must(&text, PENDING), 3.0);
    assert_eq!(must(&text, WAITING), 3.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn queues_show_the_polls_waiting_and_the_calls_ready() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    let lookup = aaa::proto::ToolDefinition {
        name: "lookup".into(),
        parameters_json: r#"{"type":"object"}"#.into(),
        ..Default::default()
    };
    register(&mut workers, vec![lookup], &[]).await;
    let run_id = start_run(&mut runs, scripted_run("lookup", "{}")).await;
    wait_for_event(&mut runs, &run_id, "aaa.tool.requested").await;

    // Offered before the request is visible to readers.
    let ready = r#"aaa_ready_tasks{kind="tool",name="lookup"}"#;
    let text = scrape(&server).await;
    assert_eq!(must(&text, ready), 1.0);
    let task = poll_until_task(&mut workers, "payments-1", &["lookup"], &[]).await;
    assert_eq!(must(&scrape(&server).await, ready), 0.0);
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_auth_on_only_a_reader_may_scrape() {
    let server = start_with_auth(auth_toml(false)).await;
    let (status, text) = http_get(&server, "/metrics", None).await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("missing credentials"), "{text}");
    let (status, text) = http_get(&server, "/metrics", Some("not-a-token")).await;
    assert_eq!(status, 401, "{text}");
    let (status, text) = http_get(&server, "/metrics", Some(&token("runner"))).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("reader"), "{text}");
    for name in ["reader", "admin"] {
        let (status, text) = http_get(&server, "/metrics", Some(&token(name))).await;
        assert_eq!(status, 200, "{name}: {text}");
        assert!(text.contains("aaa_runs_started_total 0"), "{text}");
    }
    // gRPC on the same port still asks for its own credentials.
    let mut runs = server.runs().await;
    let refused = runs
        .list_runs(aaa::proto::ListRunsRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_http_elsewhere_is_not_found_and_never_reaches_a_service() {
    let server = TestServer::start().await;
    let (status, _) = http_get(&server, "/nothing", None).await;
    assert_eq!(status, 404);
    // A gRPC path asked for over plain HTTP is not a gRPC call.
    let (status, _) = http_get(&server, "/aaa.v1.RunService/ListRuns", None).await;
    assert_eq!(status, 404);
    server.shutdown().await;
}
