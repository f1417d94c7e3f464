//! The approval policy (issue 20, parts 1 and 2): approver groups decide
//! who may decide a call; CEL rules allow, deny or set what a decision
//! needs when a call is requested, and every such decision is an event
//! naming the rule and the policy's sha256; a rule that fails leaves the
//! call to a person; reloads take effect for new calls only; a bad policy
//! is refused at start and at reload.

use std::path::Path;
use std::sync::Arc;

use aaa::auth::{sha256_hex, AuthConfig};
use aaa::policy::PolicyHandle;
use aaa::proto::{
    policy_service_client::PolicyServiceClient, ActorKind, GetPolicyRequest, ListApprovalsRequest,
    RegisterWorkerRequest, ReloadPolicyRequest, SignalRequest, ToolDefinition,
};
use serde_json::json;
use tonic::Code;

use crate::auth::token;
use crate::support::*;

/// The README's example policy.
pub const EXAMPLE_POLICY: &str = r#"
[[rule]]
name = "small-payments-to-known-vendors"
when = 'tool == "wire_money" && args.amount < 100 && args.to in ["ACME", "Globex"]'
decide = "allow"

[[rule]]
name = "no-payments-to-mallory"
when = 'tool == "wire_money" && args.to == "Mallory"'
decide = "deny"
reason = "Mallory is on the sanctions list"

[[rule]]
name = "large-payments"
when = 'tool == "wire_money" && args.amount > 10000'
decide = "require"
approvals_required = 2
approvers = ["finance"]

[[rule]]
name = "payments"
when = 'tool == "wire_money"'
decide = "require"
approvers = ["finance"]

[[rule]]
name = "lookups-of-secrets"
when = 'tool == "lookup" && args.key.startsWith("secret/")'
decide = "require"
"#;

/// Principals: alice and bob (finance approvers), carol (an approver in no
/// group), runner, worker, admin.
pub fn auth_toml() -> String {
    let principals = [
        ("alice", r#"["approver"]"#, r#"["finance"]"#),
        ("bob", r#"["approver"]"#, r#"["finance"]"#),
        ("carol", r#"["approver"]"#, "[]"),
        ("dave", r#"["approver"]"#, r#"["finance-leads"]"#),
        ("runner", r#"["runner", "reader"]"#, "[]"),
        ("worker", r#"["worker"]"#, "[]"),
        ("admin", r#"["admin"]"#, "[]"),
    ];
    let mut text = String::new();
    for (name, roles, groups) in principals {
        text.push_str(&format!(
            "[[principal]]\nname = \"{name}\"\nroles = {roles}\ngroups = {groups}\ntoken_sha256 = \"{}\"\n",
            sha256_hex(token(name).as_bytes())
        ));
        if name == "worker" {
            text.push_str("tools = [\"wire_money\", \"lookup\"]\n");
        }
    }
    text
}

/// A server with auth and the policy in `dir/policy.toml`.
pub async fn start(dir: &Path, policy: &str) -> TestServer {
    let file = dir.join("policy.toml");
    std::fs::write(&file, policy).expect("write the policy");
    let handle = Arc::new(PolicyHandle::load(&file).expect("the policy checks"));
    let auth = Arc::new(AuthConfig::parse(&auth_toml(), Path::new(".")).expect("auth config"));
    TestServer::start_with(move |config| {
        config.auth = Some(auth.clone());
        config.policy = Some(handle.clone());
    })
    .await
}

fn lookup() -> ToolDefinition {
    ToolDefinition {
        name: "lookup".into(),
        description: "Read a key".into(),
        parameters_json: r#"{"type":"object","properties":{"key":{"type":"string"}}}"#.into(),
        ..Default::default()
    }
}

pub async fn register_tools(server: &TestServer) {
    let mut worker = Clients::with_token(server, &token("worker")).await;
    worker
        .workers
        .register_worker(RegisterWorkerRequest {
            identity: "payments-1".into(),
            tools: vec![wire_money(), lookup()],
            models: vec![],
        })
        .await
        .expect("RegisterWorker");
}

/// Starts a run that calls `tool` with `arguments`; returns its id and
/// its events once the call is decided or waits (or the run ended).
pub async fn run_calling(
    runner: &mut Clients,
    tool: &str,
    arguments: &str,
) -> (String, Vec<aaa::proto::Event>) {
    let run_id = runner
        .runs
        .start_run(scripted_run(tool, arguments))
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = runner
        .follow_until(&run_id, true, |e| {
            matches!(
                e.r#type.as_str(),
                "aaa.approval.requested"
                    | "aaa.approval.granted"
                    | "aaa.approval.denied"
                    | "aaa.tool.failed"
            )
        })
        .await;
    (run_id, events)
}

fn grant(run_id: &str, call_id: &str) -> SignalRequest {
    SignalRequest {
        run_id: run_id.into(),
        r#type: "aaa.approval.granted".into(),
        data_json: json!({ "call_id": call_id }).to_string(),
        request_id: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_policy_decides_who_may_approve_what() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), EXAMPLE_POLICY).await;
    register_tools(&server).await;
    let sha256 = sha256_hex(EXAMPLE_POLICY.as_bytes());
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mut alice = Clients::with_token(&server, &token("alice")).await;
    let mut bob = Clients::with_token(&server, &token("bob")).await;
    let mut carol = Clients::with_token(&server, &token("carol")).await;

    // Small, to a known vendor: granted by the policy, nobody asked.
    let (_, events) = run_calling(&mut runner, "wire_money", r#"{"amount":50,"to":"ACME"}"#).await;
    assert_eq!(count(&events, "aaa.approval.requested"), 0);
    let granted = find(&events, "aaa.approval.granted");
    let actor = granted.actor.as_ref().unwrap();
    assert_eq!(actor.kind, ActorKind::Policy as i32);
    assert_eq!(actor.name, "small-payments-to-known-vendors");
    assert_eq!(
        data(granted)["policy"],
        json!({"rule": "small-payments-to-known-vendors", "sha256": sha256})
    );

    // To Mallory: denied by the policy; the model reads the reason.
    let (_, events) =
        run_calling(&mut runner, "wire_money", r#"{"amount":50,"to":"Mallory"}"#).await;
    let denied = find(&events, "aaa.approval.denied");
    assert_eq!(
        denied.actor.as_ref().unwrap().kind,
        ActorKind::Policy as i32
    );
    assert_eq!(data(denied)["reason"], "Mallory is on the sanctions list");

    // A payment to someone else: one finance approver.
    let (run_id, events) = run_calling(
        &mut runner,
        "wire_money",
        r#"{"amount":500,"to":"Initech"}"#,
    )
    .await;
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["approvers"], json!(["finance"]));
    assert_eq!(requested["policy"]["rule"], "payments");
    let call_id = requested["call_id"].as_str().unwrap().to_string();
    let refused = carol
        .runs
        .signal(grant(&run_id, &call_id))
        .await
        .expect_err("carol is not in finance");
    let info = assert_error(&refused, Code::PermissionDenied, "NOT_AN_APPROVER_FOR_CALL");
    assert_eq!(info.metadata["groups"], "finance");
    let mine = |decidable| ListApprovalsRequest {
        decidable,
        ..Default::default()
    };
    let carols = carol
        .approvals
        .list_approvals(mine(true))
        .await
        .unwrap()
        .into_inner();
    assert!(carols.approvals.is_empty(), "carol may decide none of them");
    let everyone = carol
        .approvals
        .list_approvals(mine(false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(everyone.approvals.len(), 1, "but sees them");
    assert_eq!(everyone.approvals[0].approvers, ["finance"]);
    let alices = alice
        .approvals
        .list_approvals(mine(true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alices.approvals.len(), 1);
    alice
        .runs
        .signal(grant(&run_id, &call_id))
        .await
        .expect("alice decides");

    // A large one: two of finance.
    let (run_id, events) = run_calling(
        &mut runner,
        "wire_money",
        r#"{"amount":20000,"to":"Initech"}"#,
    )
    .await;
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["approvals_required"], 2);
    let call_id = requested["call_id"].as_str().unwrap().to_string();
    let first = alice
        .runs
        .signal(grant(&run_id, &call_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.decision, "aaa.approval.voted");
    let second = bob
        .runs
        .signal(grant(&run_id, &call_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.decision, "aaa.approval.granted");

    // An edit is a new call: the policy decides it too. Carol may not
    // edit a finance call; alice edits one down to a small payment to a
    // known vendor, which the policy then allows.
    let (run_id, events) = run_calling(
        &mut runner,
        "wire_money",
        r#"{"amount":500,"to":"Initech"}"#,
    )
    .await;
    let call_id = crate::support::call_id(events.last().unwrap());
    let edit = |who: &str| {
        SignalRequest {
        run_id: run_id.clone(),
        r#type: "aaa.approval.edited".into(),
        data_json: json!({"call_id": call_id, "arguments": {"amount": 90, "to": "ACME"}, "reason": format!("{who}: cap")}).to_string(),
        request_id: String::new(),
    }
    };
    let refused = carol
        .runs
        .signal(edit("carol"))
        .await
        .expect_err("carol edits");
    assert_error(&refused, Code::PermissionDenied, "NOT_AN_APPROVER_FOR_CALL");
    let edited = alice.runs.signal(edit("alice")).await.unwrap().into_inner();
    let events = runner.wait_for_event(&run_id, "aaa.approval.granted").await;
    let granted = events.last().unwrap();
    assert_eq!(data(granted)["call_id"], edited.new_call_id.as_str());
    assert_eq!(
        granted.actor.as_ref().unwrap().name,
        "small-payments-to-known-vendors"
    );

    // An ungated tool the policy gates; and one it leaves alone.
    let (_, events) = run_calling(&mut runner, "lookup", r#"{"key":"secret/db"}"#).await;
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["policy"]["rule"], "lookups-of-secrets");
    assert_eq!(requested["approvers"], json!(null), "any approver");
    let run_id = runner
        .runs
        .start_run(scripted_run("lookup", r#"{"key":"public/motd"}"#))
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let mut worker = Clients::with_token(&server, &token("worker")).await;
    let task = loop {
        let polled = worker
            .workers
            .poll_task(aaa::proto::PollTaskRequest {
                identity: "payments-1".into(),
                tools: vec!["lookup".into()],
                wait_s: 1.0,
                ..Default::default()
            })
            .await
            .expect("PollTask")
            .into_inner();
        if let Some(task) = polled.task {
            break task;
        }
    };
    assert_eq!(
        task.run_id, run_id,
        "an ungated call no rule matches runs at once"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_that_cannot_be_evaluated_leaves_the_call_to_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), EXAMPLE_POLICY).await;
    register_tools(&server).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    // No "key": the rule about lookups cannot be evaluated.
    let (_, events) = run_calling(&mut runner, "lookup", "{}").await;
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["policy"]["rule"], "lookups-of-secrets");
    assert!(
        !requested["policy"]["error"].as_str().unwrap().is_empty(),
        "{requested}"
    );
    assert_eq!(requested["approvers"], json!(null), "the tool's settings");
    assert_eq!(count(&events, "aaa.approval.granted"), 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_applies_to_new_calls_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), EXAMPLE_POLICY).await;
    register_tools(&server).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let (waiting, _) = run_calling(
        &mut runner,
        "wire_money",
        r#"{"amount":500,"to":"Initech"}"#,
    )
    .await;

    let mut admin = PolicyServiceClient::with_interceptor(
        server.channel().await,
        Bearer::new(Some(&token("admin"))),
    );
    let mut carol = PolicyServiceClient::with_interceptor(
        server.channel().await,
        Bearer::new(Some(&token("carol"))),
    );
    let before = carol
        .get_policy(GetPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(before.sha256, sha256_hex(EXAMPLE_POLICY.as_bytes()));
    assert_eq!(before.rules.len(), 5);
    let refused = carol
        .reload_policy(ReloadPolicyRequest {})
        .await
        .expect_err("only admin reloads");
    assert_error(&refused, Code::PermissionDenied, "PERMISSION_DENIED");

    // A file that does not check: refused, the policy in force stays.
    let file = dir.path().join("policy.toml");
    std::fs::write(
        &file,
        "[[rule]]\nname = \"r\"\nwhen = 'amount > 1'\ndecide = \"allow\"\n",
    )
    .unwrap();
    let refused = admin
        .reload_policy(ReloadPolicyRequest {})
        .await
        .expect_err("a bad policy");
    assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    assert!(
        refused.message().contains("rule 1 ('r')"),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("unknown variable amount"),
        "{}",
        refused.message()
    );
    let same = carol
        .get_policy(GetPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.sha256, before.sha256);

    // Every payment allowed from now on: new calls go through, the call
    // that waits keeps waiting (its request is history).
    let everything =
        "[[rule]]\nname = \"all\"\nwhen = 'tool == \"wire_money\"'\ndecide = \"allow\"\n";
    std::fs::write(&file, everything).unwrap();
    let reloaded = admin
        .reload_policy(ReloadPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reloaded.policy.unwrap().sha256,
        sha256_hex(everything.as_bytes())
    );
    let (_, events) = run_calling(
        &mut runner,
        "wire_money",
        r#"{"amount":500,"to":"Initech"}"#,
    )
    .await;
    assert_eq!(
        find(&events, "aaa.approval.granted")
            .actor
            .as_ref()
            .unwrap()
            .name,
        "all"
    );
    let history = runner.history(&waiting).await;
    assert_eq!(count(&history, "aaa.approval.granted"), 0);
    let run = runner
        .runs
        .get_run(aaa::proto::GetRunRequest { run_id: waiting })
        .await
        .expect("GetRun")
        .into_inner()
        .run
        .unwrap();
    assert_eq!(run.status, aaa::proto::RunStatus::WaitingForApproval as i32);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_refuses_a_policy_that_does_not_check() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.toml");
    std::fs::write(
        &file,
        "[[rule]]\nname = \"bad\"\nwhen = 'tool =='\ndecide = \"allow\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let output = serve_refused(
        &data,
        &[
            "--listen",
            "127.0.0.1:0",
            "--policy",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("rule 1 ('bad'): when:"), "{stderr}");
}

/// Reminders and an escalation are durable timers: each fires once, also
/// across a restart, and the escalation widens who may decide.
#[tokio::test(flavor = "multi_thread")]
async fn reminders_and_an_escalation_fire_once_each_across_a_restart() {
    let policy = r#"
[[rule]]
name = "payments"
when = 'tool == "wire_money"'
decide = "require"
approvers = ["finance"]
remind_after_s = 60
reminders = 2
escalate_after_s = 600
escalate_to = ["finance-leads"]
"#;
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), policy).await;
    register_tools(&server).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let (run_id, events) = run_calling(
        &mut runner,
        "wire_money",
        r#"{"amount":500,"to":"Initech"}"#,
    )
    .await;
    let call_id = crate::support::call_id(events.last().unwrap());
    let count_of =
        |events: &[aaa::proto::Event], ty: &str| events.iter().filter(|e| e.r#type == ty).count();

    server.clock().advance(std::time::Duration::from_secs(61));
    let events = runner
        .wait_for_event(&run_id, "aaa.approval.reminded")
        .await;
    let reminded = data(events.last().unwrap());
    assert_eq!(
        (
            reminded["reminder"].as_u64(),
            reminded["reminders"].as_u64()
        ),
        (Some(1), Some(2))
    );

    // An open connection can keep the old server's store open past its
    // stop, and the restart then finds its store locked; close it first.
    drop(runner);
    server.restart().await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    server.clock().advance(std::time::Duration::from_secs(61));
    let events = runner
        .follow_until(&run_id, true, |e| {
            e.r#type == "aaa.approval.reminded" && data(e)["reminder"] == 2
        })
        .await;
    assert_eq!(count_of(&events, "aaa.approval.reminded"), 2);

    // Dave (finance-leads) may not decide yet; after the escalation he may.
    let mut dave = Clients::with_token(&server, &token("dave")).await;
    let refused = dave
        .runs
        .signal(grant(&run_id, &call_id))
        .await
        .expect_err("not yet");
    assert_error(&refused, Code::PermissionDenied, "NOT_AN_APPROVER_FOR_CALL");
    server.clock().advance(std::time::Duration::from_secs(600));
    let events = runner
        .wait_for_event(&run_id, "aaa.approval.escalated")
        .await;
    assert_eq!(
        data(events.last().unwrap())["approvers"],
        json!(["finance", "finance-leads"])
    );
    let listed = dave
        .approvals
        .list_approvals(ListApprovalsRequest {
            decidable: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.approvals.len(), 1, "dave's to decide now");
    dave.runs
        .signal(grant(&run_id, &call_id))
        .await
        .expect("dave decides");

    server.clock().advance(std::time::Duration::from_secs(3600));
    let events = runner.history(&run_id).await;
    assert_eq!(
        count_of(&events, "aaa.approval.reminded"),
        2,
        "two reminders in all"
    );
    assert_eq!(count_of(&events, "aaa.approval.escalated"), 1);
    server.shutdown().await;
}
