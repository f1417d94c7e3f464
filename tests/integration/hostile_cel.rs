//! CEL a client or a deployer wrote cannot hurt the server (issue 40,
//! items 1 and 2): deep nesting in a grant's condition, a policy file or a
//! reload is refused before it is parsed, naming the limit, and the
//! server goes on; a rule or condition that would run for seconds stops
//! at its cost budget, the call waits for a person, and the event names
//! the rule.

use aaa::proto::{
    policy_service_client::PolicyServiceClient, CreateGrantRequest, GetRunRequest,
    ReloadPolicyRequest,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::auth::token;
use crate::policy::{register_tools, run_calling, start};
use crate::support::*;

/// Three comprehensions deep over one list: 300 elements make 27 million
/// steps, which ran for 17 s on the engine's threads before the budget.
const RUNAWAY: &str = "args.l.all(x, args.l.all(y, args.l.all(z, x + y + z >= 0)))";

/// A call of `lookup` whose arguments hold a list of 300 numbers.
fn three_hundred() -> String {
    let list: Vec<u32> = (0..300).collect();
    serde_json::json!({ "key": "k", "l": list }).to_string()
}

const PLAIN_POLICY: &str =
    "[[rule]]\nname = \"nothing\"\nwhen = 'tool == \"none\"'\ndecide = \"allow\"\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_deeply_nested_grant_condition_is_refused_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), PLAIN_POLICY).await;
    register_tools(&server).await;
    let mut alice = Clients::with_token(&server, &token("alice")).await;
    for condition in [
        format!("{}true{}", "(".repeat(500), ")".repeat(500)),
        format!("{}1{} == 1", "[".repeat(1000), "]".repeat(1000)),
    ] {
        let refused = expect_err(
            alice
                .grants
                .create_grant(CreateGrantRequest {
                    tool: "lookup".into(),
                    condition,
                    reason: "standing order".into(),
                    ..Default::default()
                })
                .await,
        );
        let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
        assert_eq!(info.metadata["field"], "condition");
        assert!(
            refused.message().contains("limit of 32"),
            "{}",
            refused.message()
        );
    }
    wait_for_health(&server, ServingStatus::Serving).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deeply_nested_policy_is_refused_at_start_and_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    let nested = format!(
        "[[rule]]\nname = \"deep\"\nwhen = '{}true{}'\ndecide = \"allow\"\n",
        "(".repeat(500),
        ")".repeat(500)
    );
    let file = dir.path().join("nested.toml");
    std::fs::write(&file, &nested).unwrap();
    let output = serve_refused(
        &dir.path().join("data"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--policy",
            file.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("rule 1 ('deep'): when:"), "{stderr}");
    assert!(stderr.contains("limit of 32"), "{stderr}");

    // A running server keeps its policy and goes on.
    let server = start(dir.path(), PLAIN_POLICY).await;
    std::fs::write(dir.path().join("policy.toml"), &nested).unwrap();
    let mut admin = PolicyServiceClient::with_interceptor(
        server.channel().await,
        Bearer::new(Some(&token("admin"))),
    );
    let refused = expect_err(admin.reload_policy(ReloadPolicyRequest {}).await);
    assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    assert!(
        refused.message().contains("limit of 32"),
        "{}",
        refused.message()
    );
    wait_for_health(&server, ServingStatus::Serving).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runaway_rule_stops_at_its_budget_and_the_call_waits_for_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let policy = format!(
        "[[rule]]\nname = \"runaway\"\nwhen = 'tool == \"lookup\" && {RUNAWAY}'\ndecide = \"allow\"\n"
    );
    let server = start(dir.path(), &policy).await;
    register_tools(&server).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let (run_id, events) = run_calling(&mut runner, "lookup", &three_hundred()).await;
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["policy"]["rule"], "runaway", "{requested}");
    let error = requested["policy"]["error"].as_str().unwrap();
    assert!(error.contains("over the evaluation budget"), "{error}");
    assert_eq!(count(&events, "aaa.approval.granted"), 0);
    // The server answers as ever.
    runner
        .runs
        .get_run(GetRunRequest { run_id })
        .await
        .expect("GetRun");
    wait_for_health(&server, ServingStatus::Serving).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runaway_grant_condition_stops_at_its_budget_and_grants_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), PLAIN_POLICY).await;
    register_tools(&server).await;
    let mut alice = Clients::with_token(&server, &token("alice")).await;
    alice
        .grants
        .create_grant(CreateGrantRequest {
            tool: "lookup".into(),
            condition: RUNAWAY.into(),
            reason: "standing order".into(),
            ..Default::default()
        })
        .await
        .expect("CreateGrant: the condition checks; its cost shows only on a call");
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mut request = scripted_run("lookup", &three_hundred());
    request.tools[0].requires_approval = true;
    let run_id = runner
        .runs
        .start_run(request)
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = runner
        .follow_until(&run_id, true, |e| {
            matches!(
                e.r#type.as_str(),
                "aaa.approval.requested" | "aaa.approval.granted"
            )
        })
        .await;
    assert_eq!(
        count(&events, "aaa.approval.granted"),
        0,
        "the grant grants nothing"
    );
    assert_eq!(count(&events, "aaa.approval.requested"), 1);
    wait_for_health(&server, ServingStatus::Serving).await;
    server.shutdown().await;
}
