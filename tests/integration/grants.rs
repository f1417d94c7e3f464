//! Standing grants (issue 20, part 3): a grant made in advance lets the
//! calls it matches run without asking anyone, recorded with actor GRANT;
//! its uses are counted durably and never exceed max_uses, also when runs
//! race for the last one; revocation and expiry stop it; its condition,
//! digest and creator's groups limit it; the policy's deny comes first.

use std::collections::HashMap;
use std::time::Duration;

use aaa::proto::{
    ActorKind, CreateGrantRequest, Event, Grant, GrantScope, ListGrantsRequest, RevokeGrantRequest,
};
use serde_json::json;
use tonic::Code;

use crate::auth::token;
use crate::support::*;

/// A grant of wire_money for `reason`, adjusted by `change`.
fn create(change: impl FnOnce(&mut CreateGrantRequest)) -> CreateGrantRequest {
    let mut request = CreateGrantRequest {
        tool: "wire_money".into(),
        reason: "standing order".into(),
        ..Default::default()
    };
    change(&mut request);
    request
}

async fn create_grant(clients: &mut Clients, request: CreateGrantRequest) -> Grant {
    clients
        .grants
        .create_grant(request)
        .await
        .expect("CreateGrant")
        .into_inner()
        .grant
        .expect("a grant")
}

async fn list(clients: &mut Clients, include_revoked: bool) -> Vec<Grant> {
    clients
        .grants
        .list_grants(ListGrantsRequest {
            include_revoked,
            tool: String::new(),
        })
        .await
        .expect("ListGrants")
        .into_inner()
        .grants
}

/// Starts a run calling wire_money with `arguments` and `labels`; returns
/// its id and its events up to the call's decision or request.
async fn run_paying(
    clients: &mut Clients,
    arguments: &str,
    labels: &[(&str, &str)],
) -> (String, Vec<Event>) {
    run_calling(clients, "wire_money", arguments, labels).await
}

async fn run_calling(
    clients: &mut Clients,
    tool: &str,
    arguments: &str,
    labels: &[(&str, &str)],
) -> (String, Vec<Event>) {
    let mut request = scripted_run(tool, arguments);
    request.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<HashMap<_, _>>();
    let run_id = clients
        .runs
        .start_run(request)
        .await
        .expect("StartRun")
        .into_inner()
        .run_id;
    let events = decided_or_waiting(clients, &run_id).await;
    (run_id, events)
}

async fn decided_or_waiting(clients: &mut Clients, run_id: &str) -> Vec<Event> {
    clients
        .follow_until(run_id, true, |e| {
            matches!(
                e.r#type.as_str(),
                "aaa.approval.requested" | "aaa.approval.granted" | "aaa.approval.denied"
            )
        })
        .await
}

/// The grant that granted the call, if one did.
fn granted_by(events: &[Event]) -> Option<String> {
    let granted = events.iter().find(|e| e.r#type == "aaa.approval.granted")?;
    let actor = granted.actor.as_ref().expect("an actor");
    (actor.kind == ActorKind::Grant as i32).then(|| actor.name.clone())
}

fn waits(events: &[Event]) -> bool {
    events.last().map(|e| e.r#type.as_str()) == Some("aaa.approval.requested")
}

const PAY: &str = r#"{"amount":250,"to":"ACME"}"#;

async fn server_with_tools() -> (TestServer, Clients) {
    let server = TestServer::start().await;
    let mut clients = Clients::new(server.channel().await, None);
    clients
        .workers
        .register_worker(aaa::proto::RegisterWorkerRequest {
            identity: "registrar".into(),
            tools: vec![wire_money()],
            models: vec![],
        })
        .await
        .expect("RegisterWorker");
    (server, clients)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_scoped_to_labels_lets_matching_calls_run_and_counts_its_uses() {
    let (server, mut clients) = server_with_tools().await;
    let grant = create_grant(
        &mut clients,
        create(|g| {
            g.scope = Some(GrantScope {
                labels: [("team".to_string(), "payroll".to_string())].into(),
                ..Default::default()
            });
            g.max_uses = 2;
        }),
    )
    .await;
    assert!(grant.active);
    assert_eq!((grant.uses, grant.uses_left), (0, Some(2)));

    let payroll = [("team", "payroll")];
    let (_, events) = run_paying(&mut clients, PAY, &payroll).await;
    assert_eq!(granted_by(&events).as_deref(), Some(grant.id.as_str()));
    assert_eq!(count(&events, "aaa.approval.requested"), 0, "nobody asked");
    let granted = data(find(&events, "aaa.approval.granted"));
    // With auth off, the creator is named by its address.
    assert!(
        grant.created_by.starts_with("127.0.0.1:"),
        "{}",
        grant.created_by
    );
    assert_eq!(
        granted["grant"],
        json!({"id": grant.id, "reason": "standing order", "created_by": grant.created_by})
    );
    // Outside the scope: a person decides.
    let (_, events) = run_paying(&mut clients, PAY, &[("team", "sales")]).await;
    assert!(waits(&events), "{:?}", types(&events));

    let (_, events) = run_paying(&mut clients, PAY, &payroll).await;
    assert_eq!(granted_by(&events).as_deref(), Some(grant.id.as_str()));
    // Used up: the next call waits for a person, and the grant is listed
    // only with the used-up and revoked ones.
    let (_, events) = run_paying(&mut clients, PAY, &payroll).await;
    assert!(waits(&events), "max_uses reached: {:?}", types(&events));
    assert!(list(&mut clients, false).await.is_empty());
    let all = list(&mut clients, true).await;
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].uses, all[0].uses_left, all[0].active),
        (2, Some(0), false)
    );
    server.shutdown().await;
}

/// A CreateGrant whose answer was lost, sent again with its request_id
/// (on another connection, as a client that reconnected), creates nothing
/// and answers the first grant with its uses now: a retried grant of one
/// use never grants two calls. Another request id is another grant.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_grant_retried_with_its_request_id_creates_one_grant() {
    let (server, mut clients) = server_with_tools().await;
    let once = create(|g| {
        g.max_uses = 1;
        g.request_id = "grant-once".into();
    });
    let first = create_grant(&mut clients, once.clone()).await;
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(first.id.as_str()));

    let mut reconnected = Clients::new(server.channel().await, None);
    let again = create_grant(&mut reconnected, once).await;
    assert_eq!(again.id, first.id, "the retry created another grant");
    assert_eq!(again.uses, 1, "the retry answers the grant as it is now");
    assert_eq!(list(&mut clients, true).await.len(), 1);
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert_eq!(granted_by(&events), None, "a second call was granted");

    let other = create_grant(
        &mut clients,
        create(|g| g.request_id = "grant-other".into()),
    )
    .await;
    assert_ne!(other.id, first.id);
    assert_eq!(list(&mut clients, true).await.len(), 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_racing_for_the_last_use_get_it_once() {
    let (server, mut clients) = server_with_tools().await;
    let grant = create_grant(&mut clients, create(|g| g.max_uses = 1)).await;
    let runs = (0..8).map(|_| {
        let mut clients = clients.clone();
        tokio::spawn(async move { run_paying(&mut clients, PAY, &[]).await })
    });
    let mut winners = 0;
    for run in runs.collect::<Vec<_>>() {
        let (_, events) = run.await.expect("run task");
        match granted_by(&events) {
            Some(id) => {
                assert_eq!(id, grant.id);
                winners += 1;
            }
            None => assert!(waits(&events), "{:?}", types(&events)),
        }
    }
    assert_eq!(winners, 1, "exactly one run got the last use");
    assert_eq!(list(&mut clients, true).await[0].uses, 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_grant_grants_nothing_more() {
    let (server, mut clients) = server_with_tools().await;
    let grant = create_grant(&mut clients, create(|_| {})).await;
    assert_eq!(grant.uses_left, None, "unlimited");
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(grant.id.as_str()));

    let revoke = |reason: &str| RevokeGrantRequest {
        id: grant.id.clone(),
        reason: reason.into(),
    };
    let refused = expect_err(clients.grants.revoke_grant(revoke("")).await);
    let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "reason");
    let revoked = clients
        .grants
        .revoke_grant(revoke("the vendor changed banks"))
        .await
        .expect("RevokeGrant")
        .into_inner()
        .grant
        .unwrap();
    assert!(!revoked.active);
    assert!(revoked.revoked_at.is_some());
    assert_eq!(revoked.revoke_reason, "the vendor changed banks");
    assert_eq!(revoked.uses, 1);
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert!(waits(&events), "{:?}", types(&events));
    // Again: nothing changes, the first revocation stands.
    let again = clients
        .grants
        .revoke_grant(revoke("twice"))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    assert_eq!(again.revoke_reason, "the vendor changed banks");
    let unknown = expect_err(
        clients
            .grants
            .revoke_grant(RevokeGrantRequest {
                id: "no-such-grant".into(),
                reason: "x".into(),
            })
            .await,
    );
    assert_error(&unknown, Code::NotFound, "GRANT_NOT_FOUND");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_expires_by_the_servers_clock() {
    let (server, mut clients) = server_with_tools().await;
    let now = server.clock().now_ms();
    let at = |ms: i64| prost_types::Timestamp {
        seconds: ms / 1000,
        nanos: 0,
    };
    let refused = expect_err(
        clients
            .grants
            .create_grant(create(|g| g.expires_at = Some(at(now - 60_000))))
            .await,
    );
    let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    assert_eq!(info.metadata["field"], "expires_at");

    let grant = create_grant(
        &mut clients,
        create(|g| g.expires_at = Some(at(now + 3_600_000))),
    )
    .await;
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(grant.id.as_str()));
    server.clock().advance(Duration::from_secs(2 * 3600));
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert!(waits(&events), "expired: {:?}", types(&events));
    assert!(list(&mut clients, false).await.is_empty());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_condition_and_a_digest_limit_what_a_grant_grants() {
    let (server, mut clients) = server_with_tools().await;
    // Bad input is refused, naming the field.
    for (request, field) in [
        (
            create(|g| g.condition = "args.amount <".into()),
            "condition",
        ),
        (create(|g| g.condition = "amount < 5".into()), "condition"),
        (create(|g| g.tool = "launch_rockets".into()), "tool"),
        (create(|g| g.tool = String::new()), "tool"),
        (create(|g| g.reason = String::new()), "reason"),
        (
            create(|g| g.arguments_sha256 = "abc".into()),
            "arguments_sha256",
        ),
        (
            create(|g| {
                g.scope = Some(GrantScope {
                    run_id: "not-a-run".into(),
                    ..Default::default()
                })
            }),
            "scope.run_id",
        ),
    ] {
        let refused = expect_err(clients.grants.create_grant(request).await);
        let info = assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
        assert_eq!(info.metadata["field"], field);
    }

    let small = create_grant(
        &mut clients,
        create(|g| g.condition = r#"args.amount < 100 && args.to == "ACME""#.into()),
    )
    .await;
    let (_, events) = run_paying(&mut clients, r#"{"amount":50,"to":"ACME"}"#, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(small.id.as_str()));
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert!(
        waits(&events),
        "the condition is false: {:?}",
        types(&events)
    );

    // "Approve this plan": single-use grants bound to exact arguments.
    let plan = [
        r#"{"amount":300,"to":"ACME"}"#,
        r#"{"amount":400,"to":"Globex"}"#,
    ];
    let mut ids = Vec::new();
    for step in plan {
        let digest = aaa::domain::event::sha256_hex(&serde_json::from_str(step).unwrap());
        let grant = create_grant(
            &mut clients,
            create(|g| {
                g.arguments_sha256 = digest;
                g.max_uses = 1;
            }),
        )
        .await;
        ids.push(grant.id);
    }
    let (_, events) = run_paying(&mut clients, r#"{"amount":301,"to":"ACME"}"#, &[]).await;
    assert!(waits(&events), "other arguments: {:?}", types(&events));
    for (step, id) in plan.iter().zip(&ids) {
        let (_, events) = run_paying(&mut clients, step, &[]).await;
        assert_eq!(granted_by(&events).as_ref(), Some(id));
    }
    let (_, events) = run_paying(&mut clients, plan[0], &[]).await;
    assert!(waits(&events), "each step once: {:?}", types(&events));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_is_limited_by_its_creators_groups_and_yields_to_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let server = crate::policy::start(dir.path(), crate::policy::EXAMPLE_POLICY).await;
    crate::policy::register_tools(&server).await;
    let mut runner = Clients::with_token(&server, &token("runner")).await;
    let mut alice = Clients::with_token(&server, &token("alice")).await;
    let mut carol = Clients::with_token(&server, &token("carol")).await;
    let to_initech = r#"{"amount":500,"to":"Initech"}"#;

    // Carol may not decide finance's calls: neither may her grant.
    let carols = create_grant(&mut carol, create(|_| {})).await;
    assert_eq!(carols.created_by, "carol");
    let (_, events) = run_paying(&mut runner, to_initech, &[]).await;
    assert!(waits(&events), "{:?}", types(&events));

    // Alice may: her grant stands in for her, under the rule that
    // required finance.
    let alices = create_grant(&mut alice, create(|_| {})).await;
    assert_eq!(alices.creator_groups, ["finance"]);
    let (_, events) = run_paying(&mut runner, to_initech, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(alices.id.as_str()));
    let granted = data(find(&events, "aaa.approval.granted"));
    assert_eq!(granted["policy"]["rule"], "payments");
    assert_eq!(granted["grant"]["created_by"], "alice");

    // The policy's deny comes first.
    let (_, events) = run_paying(&mut runner, r#"{"amount":50,"to":"Mallory"}"#, &[]).await;
    let denied = find(&events, "aaa.approval.denied");
    assert_eq!(
        denied.actor.as_ref().unwrap().kind,
        ActorKind::Policy as i32
    );
    // A rule that failed leaves the call to a person, grant or not.
    create_grant(&mut alice, create(|g| g.tool = "lookup".into())).await;
    let (_, events) = run_calling(&mut runner, "lookup", "{}", &[]).await;
    assert!(waits(&events), "{:?}", types(&events));
    let requested = data(find(&events, "aaa.approval.requested"));
    assert_eq!(requested["policy"]["rule"], "lookups-of-secrets");
    assert!(requested["policy"]["error"].is_string());
    // A grant is not a vote: a call that needs two approvers waits.
    let (_, events) = run_paying(&mut runner, r#"{"amount":20000,"to":"Initech"}"#, &[]).await;
    assert!(waits(&events), "{:?}", types(&events));
    assert_eq!(list(&mut alice, false).await.len(), 3);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn uses_survive_a_restart() {
    let (mut server, mut clients) = server_with_tools().await;
    let grant = create_grant(&mut clients, create(|g| g.max_uses = 2)).await;
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(grant.id.as_str()));

    // Close the connection first: one still open can keep the stopped
    // server's store open while the next one starts.
    drop(clients);
    server.restart().await;
    let mut clients = Clients::new(server.channel().await, None);
    let listed = list(&mut clients, false).await;
    assert_eq!((listed[0].uses, listed[0].uses_left), (1, Some(1)));
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert_eq!(granted_by(&events).as_deref(), Some(grant.id.as_str()));
    let (_, events) = run_paying(&mut clients, PAY, &[]).await;
    assert!(
        waits(&events),
        "used up across the restart: {:?}",
        types(&events)
    );
    server.shutdown().await;
}
