//! Several servers on one PostgreSQL (these tests need one: they pass
//! without doing anything otherwise). One owns the runs; the others answer
//! every call by forwarding it to the owner, with the caller's principal;
//! when the owner dies, one of them takes over and nothing is lost or run
//! twice.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aaa::auth::AuthConfig;
use aaa::proto::{
    complete_task_request, stream_events_response, watch_approvals_response, CompleteTaskRequest,
    ListApprovalsRequest, ListRunsRequest, PollTaskRequest, RegisterWorkerRequest, StartRunRequest,
    StreamEventsRequest, WatchApprovalsRequest,
};
use tonic::Code;

use crate::auth::{auth_toml, token};
use crate::support::*;

/// An in-process server on `url` with the test principals; a standby if
/// asked.
async fn member(url: &str, standby: bool) -> TestServer {
    let auth = Arc::new(AuthConfig::parse(&auth_toml(false), Path::new(".")).expect("auth"));
    member_with(url, standby, Some(auth)).await
}

/// An in-process server on `url` with this auth config (or none).
async fn member_with(url: &str, standby: bool, auth: Option<Arc<AuthConfig>>) -> TestServer {
    let url = url.to_string();
    TestServer::start_with(move |config| {
        config.auth = auth.clone();
        config.store_url = Some(url.clone());
        config.standby = standby;
    })
    .await
}

/// Through a standby, every role does its part of the reference scenario:
/// the owner serves the calls and records each caller's principal, as if
/// they had called it. A client cannot pose as a forwarding server.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_forwards_every_call_to_the_owner_with_the_callers_principal() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let owner_server = member(&url, false).await;
    let standby = member(&url, true).await;
    let mut runner = Clients::with_token(&standby, &token("runner")).await;
    let mut worker = Clients::with_token(&standby, &token("worker")).await;
    let mut approver = Clients::with_token(&standby, &token("approver")).await;

    worker
        .workers
        .register_worker(RegisterWorkerRequest {
            identity: "payments-1".into(),
            tools: vec![wire_money()],
            ..Default::default()
        })
        .await
        .expect("RegisterWorker through the standby");
    let run_id = runner
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun through the standby")
        .into_inner()
        .run_id;
    let events = runner
        .wait_for_event(&run_id, "aaa.approval.requested")
        .await;
    let call_id = call_id(events.last().unwrap());
    approver
        .runs
        .signal(grant_request(&run_id, &call_id))
        .await
        .expect("a grant through the standby");
    let task = loop {
        let polled = worker
            .workers
            .poll_task(PollTaskRequest {
                identity: "payments-1".into(),
                tools: vec!["wire_money".into()],
                wait_s: 1.0,
                ..Default::default()
            })
            .await
            .expect("PollTask through the standby")
            .into_inner();
        if let Some(task) = polled.task {
            break task;
        }
    };
    worker
        .workers
        .complete_task(CompleteTaskRequest {
            token: task.token,
            result: Some(complete_task_request::Result::OutputJson(
                REFERENCE_OUTPUT.into(),
            )),
        })
        .await
        .expect("CompleteTask through the standby");
    let events = runner.wait_for_event(&run_id, "aaa.run.completed").await;
    assert_eq!(types(&events), REFERENCE_TYPES);
    // A client is named by its principal; a worker by its identity, with
    // its principal beside it.
    let actor = |ty| find(&events, ty).actor.clone().expect("actor");
    assert_eq!(actor("aaa.run.started").name, "runner");
    assert_eq!(actor("aaa.approval.granted").name, "approver");
    assert_eq!(actor("aaa.tool.started").principal, "worker");

    // A batch decision is a write too: forwarded, decided as the approver.
    let second = runner
        .runs
        .start_run(scripted_reference_run())
        .await
        .expect("StartRun through the standby")
        .into_inner()
        .run_id;
    let requested = runner
        .wait_for_event(&second, "aaa.approval.requested")
        .await;
    let requested = data(requested.last().unwrap());
    let answer = approver
        .approvals
        .decide_approvals(aaa::proto::DecideApprovalsRequest {
            items: vec![aaa::proto::DecisionItem {
                run_id: second.clone(),
                call_id: requested["call_id"].as_str().unwrap().into(),
                arguments_sha256: requested["arguments_sha256"].as_str().unwrap().into(),
            }],
            decision: aaa::proto::BatchDecision::Deny as i32,
            reason: "not this vendor".into(),
            ..Default::default()
        })
        .await
        .expect("DecideApprovals through the standby")
        .into_inner();
    assert_eq!(
        answer.results[0].status,
        aaa::proto::DecisionStatus::Decided as i32
    );
    let events = runner.wait_for_event(&second, "aaa.run.completed").await;
    let denied = find(&events, "aaa.approval.denied");
    assert_eq!(denied.actor.as_ref().unwrap().name, "approver");

    // Roles are checked for forwarded calls too (here, at the standby).
    let refused = runner.runs.signal(grant_request(&run_id, &call_id)).await;
    assert_eq!(expect_err(refused).code(), Code::PermissionDenied);

    // A client that sends the forwarding headers itself is refused.
    let mut forged = tonic::Request::new(aaa::proto::GetRunRequest {
        run_id: run_id.clone(),
    });
    let headers = forged.metadata_mut();
    headers.insert("aaa-forwarded-principal", "admin".parse().unwrap());
    headers.insert(
        "aaa-forwarded-signature",
        format!("{}.{}.{}", i64::MAX, "00".repeat(16), "00".repeat(32))
            .parse()
            .unwrap(),
    );
    let status = expect_err(owner_server.runs().await.get_run(forged).await);
    assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");

    // Both answer GetCluster from the database alike (a reader may ask).
    let mut views = Vec::new();
    for server in [&owner_server, &standby] {
        let mut cluster =
            aaa::proto::cluster_service_client::ClusterServiceClient::with_interceptor(
                server.channel().await,
                Bearer::new(Some(&token("reader"))),
            );
        let view = cluster
            .get_cluster(aaa::proto::GetClusterRequest {})
            .await
            .expect("GetCluster")
            .into_inner();
        views.push(view);
    }
    let (at_owner, at_standby) = (&views[0], &views[1]);
    assert_eq!(at_owner.members.len(), 2, "{at_owner:?}");
    assert_eq!(at_standby.unowned_shards, 0);
    let owner_row = |view: &aaa::proto::GetClusterResponse| {
        view.members
            .iter()
            .find(|m| m.shards == 256)
            .map(|m| m.server.clone())
    };
    assert_eq!(owner_row(at_standby), Some(at_owner.this_server.clone()));
    let owner_address = at_standby
        .members
        .iter()
        .find(|m| m.shards == 256)
        .map(|m| m.address.clone())
        .expect("the owner's row");
    assert!(
        at_standby.shard_owners.len() == 256
            && at_standby.shard_owners.iter().all(|a| *a == owner_address),
        "every shard's writes go to the owner: {at_standby:?}"
    );
    assert_ne!(at_standby.this_server, at_owner.this_server);
    standby.shutdown().await;
    owner_server.shutdown().await;
}

/// Three servers; runs wait for approval on the owner; it is killed (-9).
/// A standby takes over; grants sent through the third server reach it,
/// every run completes, each gated call runs once, and the worker, polling
/// through a standby all along, never got one attempt twice.
#[tokio::test(flavor = "multi_thread")]
async fn three_servers_carry_on_after_the_owner_is_killed() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (_dirs, servers) = cluster_members(&url, 3, "1").await;
    let Ok([first, second, third]) = <[ChildServer; 3]>::try_from(servers) else {
        unreachable!("three servers")
    };

    register(&mut second.workers().await, vec![wire_money()], &[]).await;
    let mut runs = third.runs().await;
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        waiting.push((run_id, call_id));
    }
    // One granted and finished before the kill, through the standbys.
    let mut workers = second.workers().await;
    let (run_id, call_id) = waiting.remove(0);
    grant_and_finish(&mut runs, &mut workers, &run_id, &call_id).await;

    first.kill9();
    let killed_at = Instant::now();
    // The first grant, sent once right after the kill, waits at the
    // standby for the next owner rather than failing. (A call the standby
    // sent down the dead owner's connection before it saw it close may
    // or may not have been applied, and says so; that one is retried.)
    let (run_id, call_id) = &waiting[0];
    if let Err(status) = runs.clone().signal(grant_request(run_id, call_id)).await {
        assert!(
            status
                .message()
                .contains("may or may not have been applied"),
            "{status:?}"
        );
    }
    let mut executed: HashMap<(String, String, u32), usize> = HashMap::new();
    for (run_id, call_id) in &waiting {
        grant_retrying(&runs, run_id, call_id).await;
        if executed.is_empty() {
            eprintln!(
                "the first grant after the kill landed {:?} after it",
                killed_at.elapsed()
            );
        }
        let task = retrying(|| {
            let mut workers = workers.clone();
            async move { Ok(poll_until_task(&mut workers, "w", &["wire_money"], &[]).await) }
        })
        .await;
        *executed
            .entry((task.run_id.clone(), task.call_id.clone(), task.attempt))
            .or_default() += 1;
        retrying(|| {
            let mut workers = workers.clone();
            let token = task.token.clone();
            async move { complete_tool(&mut workers, &token, REFERENCE_OUTPUT).await }
        })
        .await;
    }
    eprintln!(
        "every run granted and served {:?} after the kill",
        killed_at.elapsed()
    );
    assert!(executed.values().all(|n| *n == 1), "{executed:?}");
    for (run_id, _) in &waiting {
        let events = wait_for_end(&mut runs, run_id).await;
        assert_eq!(completed_text(&events), REFERENCE_TEXT);
        assert_dense(&events, 1);
        assert_eq!(count(&events, "aaa.tool.started"), 1, "{run_id}");
        assert_eq!(count(&events, "aaa.approval.granted"), 1, "{run_id}");
    }
    let new_owner = owner(&third).await.expect("a new owner");
    assert!(
        [member_of(&second).await, member_of(&third).await].contains(&new_owner),
        "{new_owner}"
    );
}

/// A standby answers reads from the database itself: with the owner paused
/// (and a lease long enough that nobody takes over), GetRun, ListRuns,
/// ListApprovals and a WatchApprovals snapshot still answer through it.
/// Once the owner wakes, a follower and a watcher on the standby see the
/// owner's new events as they are committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_answers_reads_itself_and_follows_the_owners_commits() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (_dirs, servers) = cluster_members(&url, 2, "60").await;
    let Ok([owner_server, standby]) = <[ChildServer; 2]>::try_from(servers) else {
        unreachable!("two servers")
    };
    register(&mut standby.workers().await, vec![wire_money()], &[]).await;
    let mut runs = standby.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let mut approvals = standby.approvals().await;
    let mut watch = watch_approvals(&mut approvals, WatchApprovalsRequest::default()).await;
    assert_eq!(read_snapshot(&mut watch).await.len(), 1);
    let seen = history(&mut runs, &run_id).await.len() as u64;
    let mut follower = runs
        .stream_events(StreamEventsRequest {
            run_id: run_id.clone(),
            after_seq: seen,
            follow: true,
            stop_at_end: true,
            ..Default::default()
        })
        .await
        .expect("StreamEvents through the standby")
        .into_inner();

    owner_server.signal(libc::SIGSTOP);
    // Forwarded, these would wait for the paused owner; answered here,
    // they come at once. The bound only keeps a failure from hanging.
    let local = Duration::from_secs(10);
    let reads = async {
        let run = get_run(&mut runs, &run_id).await;
        assert_eq!(run.pending_approvals.len(), 1);
        let listed = runs
            .list_runs(ListRunsRequest::default())
            .await
            .expect("ListRuns");
        assert_eq!(listed.into_inner().runs.len(), 1);
        let pending = list_approvals(&mut approvals, ListApprovalsRequest::default()).await;
        assert_eq!(pending[0].call_id, call_id);
        let mut again = watch_approvals(&mut approvals, WatchApprovalsRequest::default()).await;
        assert_eq!(read_snapshot(&mut again).await.len(), 1);
    };
    tokio::time::timeout(local, reads)
        .await
        .expect("reads through the standby waited for the paused owner");
    owner_server.signal(libc::SIGCONT);

    grant(&mut runs, &run_id, &call_id).await;
    let resolved = next_watch_change(&mut watch).await;
    assert!(
        matches!(
            resolved.item,
            Some(watch_approvals_response::Item::Resolved(_))
        ),
        "{resolved:?}"
    );
    let mut workers = standby.workers().await;
    let task = poll_until_task(&mut workers, "w", &["wire_money"], &[]).await;
    complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    let mut followed = Vec::new();
    while let Some(item) = tokio::time::timeout(WAIT, follower.message())
        .await
        .expect("the follower on the standby heard nothing")
        .expect("StreamEvents")
    {
        if let Some(stream_events_response::Item::Event(event)) = item.item {
            followed.push(event);
        }
    }
    assert_eq!(
        types(&followed),
        REFERENCE_TYPES[5..].to_vec(),
        "what the follower on the standby saw"
    );
}

/// With TLS, a standby reaches the owner over TLS, trusting the CA that
/// follows the server's certificate in its file and checking the owner's
/// advertised host (here an IP address): a write through the standby is
/// served by the owner and names the caller.
#[tokio::test(flavor = "multi_thread")]
async fn servers_with_tls_forward_to_each_other_over_tls() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ca_pem = crate::auth::make_pki_for(dir.path(), &["localhost", "127.0.0.1"]).ca_pem;
    // Top-level keys first: [tls] opens a table.
    let text = format!(
        "{}\n[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n",
        auth_toml(false)
    );
    std::fs::write(dir.path().join("auth.toml"), text).unwrap();
    let auth = Arc::new(AuthConfig::load(&dir.path().join("auth.toml")).expect("auth config"));
    let owner_server = member_with(&url, false, Some(auth.clone())).await;
    let standby = member_with(&url, true, Some(auth)).await;

    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", standby.addr()))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .expect("TLS to the standby");
    let mut runner = Clients::new(channel, Some(&token("runner")));
    let run_id = runner
        .runs
        .start_run(crate::auth::echo_run())
        .await
        .expect("StartRun through the standby, forwarded over TLS")
        .into_inner()
        .run_id;
    let events = runner.wait_for_event(&run_id, "aaa.run.completed").await;
    assert_eq!(
        find(&events, "aaa.run.started")
            .actor
            .as_ref()
            .unwrap()
            .name,
        "runner"
    );
    standby.shutdown().await;
    owner_server.shutdown().await;
}

/// With auth off, the actor of a call a standby forwarded is the client's
/// address, as it would be had the client called the owner, not the
/// standby's; a client cannot name itself with the forwarding headers.
#[tokio::test(flavor = "multi_thread")]
async fn with_auth_off_a_forwarded_call_names_the_client() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let owner_server = member_with(&url, false, None).await;
    let standby = member_with(&url, true, None).await;
    // Connect on a socket whose local address the test knows.
    let (local_tx, local_rx) = std::sync::mpsc::channel();
    let target = standby.addr();
    let channel = tonic::transport::Endpoint::from_static("http://standby")
        .connect_with_connector(tower::service_fn(move |_| {
            let local_tx = local_tx.clone();
            async move {
                let stream = tokio::net::TcpStream::connect(target).await?;
                let _ = local_tx.send(stream.local_addr()?);
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connect to the standby");
    let client = local_rx.recv().unwrap().to_string();
    let mut runs = aaa::proto::run_service_client::RunServiceClient::new(channel);
    let run_id = start_run(&mut runs, crate::auth::echo_run()).await;
    let events = wait_for_event(&mut runs, &run_id, "aaa.run.completed").await;
    assert_eq!(
        find(&events, "aaa.run.started")
            .actor
            .as_ref()
            .unwrap()
            .name,
        client
    );

    let mut forged = tonic::Request::new(crate::auth::echo_run());
    let headers = forged.metadata_mut();
    headers.insert("aaa-forwarded-principal", "10.0.0.1:1".parse().unwrap());
    headers.insert(
        "aaa-forwarded-signature",
        format!("{}.{}.{}", i64::MAX, "00".repeat(16), "00".repeat(32))
            .parse()
            .unwrap(),
    );
    let status = expect_err(owner_server.runs().await.start_run(forged).await);
    assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    standby.shutdown().await;
    owner_server.shutdown().await;
}

/// Standing grants in a cluster: created through a standby (forwarded to
/// the owner, which applies them), listed by the standby from the
/// database, and, when the standby takes the runs over, loaded by it with
/// their uses: a grant of two uses grants one call on each server, then no
/// more.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_forwards_grants_and_loads_them_with_their_uses_when_it_takes_over() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let owner_server = member_with(&url, false, None).await;
    let standby = member_with(&url, true, None).await;
    let mut clients = Clients::new(standby.channel().await, None);
    let mut runs = standby.runs().await;
    register(&mut standby.workers().await, vec![wire_money()], &[]).await;
    let grant = clients
        .grants
        .create_grant(aaa::proto::CreateGrantRequest {
            tool: "wire_money".into(),
            max_uses: 2,
            reason: "two payments".into(),
            ..Default::default()
        })
        .await
        .expect("CreateGrant through the standby")
        .into_inner()
        .grant
        .unwrap();
    let granted_by_it = |events: &[aaa::proto::Event]| {
        events
            .iter()
            .any(|e| e.actor.as_ref().is_some_and(|a| a.name == grant.id))
    };
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let events = wait_for_event(&mut runs, &run_id, "aaa.approval.granted").await;
    assert!(granted_by_it(&events), "{:?}", types(&events));
    let listed = clients
        .grants
        .list_grants(aaa::proto::ListGrantsRequest::default())
        .await
        .expect("ListGrants on the standby")
        .into_inner()
        .grants;
    assert_eq!((listed[0].uses, listed[0].uses_left), (1, Some(1)));

    owner_server.shutdown().await;
    wait_until_owner(&standby, &member_of(&standby).await).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let events = wait_for_event(&mut runs, &run_id, "aaa.approval.granted").await;
    assert!(granted_by_it(&events), "{:?}", types(&events));
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    assert!(!call_id.is_empty(), "used up: a person decides");
    standby.shutdown().await;
}

/// Servers started with `--spread-shards` on one database.
async fn spread_member(url: &str) -> TestServer {
    spread_member_with(url, None).await
}

/// [`spread_member`] with this auth config (or none).
async fn spread_member_with(url: &str, auth: Option<Arc<AuthConfig>>) -> TestServer {
    let url = url.to_string();
    TestServer::start_with(move |config| {
        config.auth = auth.clone();
        config.store_url = Some(url.clone());
        config.spread_shards = true;
        config.lease = Duration::from_secs(1);
    })
    .await
}

/// Two spread members once they share every shard, with wire_money
/// registered (through the first).
async fn spread_pair(url: &str) -> (TestServer, TestServer) {
    let (a, b) = (spread_member(url).await, spread_member(url).await);
    let (name_a, name_b) = (member_of(&a).await, member_of(&b).await);
    wait_until_spread(&a, &[&name_a, &name_b]).await;
    register(&mut a.workers().await, vec![wire_money()], &[]).await;
    (a, b)
}

/// The shard of a run (its id's last byte).
fn shard_of(run_id: &str) -> u8 {
    aaa::store::RunId::parse(run_id).expect("a run id").shard()
}

/// With the shards spread, a run is made in a shard of the server that
/// started it; a grant through the other server reaches the run's owner;
/// one worker polling one server gets the tasks of both servers' shards,
/// each attempt started once. When a server stops, the other takes its
/// shards over and the runs waiting there go on.
#[tokio::test(flavor = "multi_thread")]
async fn spread_shards_serve_every_run_through_any_server() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (a, mut b) = spread_pair(&url).await;
    let name_a = member_of(&a).await;
    let mut through_a = a.runs().await;
    let mut through_b = b.runs().await;
    let mut started = Vec::new();
    for i in 0..12 {
        let runs = if i % 2 == 0 {
            &mut through_a
        } else {
            &mut through_b
        };
        let run_id = retrying(|| {
            let mut runs = runs.clone();
            async move { runs.start_run(scripted_reference_run()).await }
        })
        .await
        .into_inner()
        .run_id;
        let call_id = wait_for_approval(runs, &run_id).await;
        started.push((run_id, call_id));
    }
    let shards_a: Vec<u8> = started.iter().step_by(2).map(|r| shard_of(&r.0)).collect();
    let shards_b: Vec<u8> = started
        .iter()
        .skip(1)
        .step_by(2)
        .map(|r| shard_of(&r.0))
        .collect();
    assert!(
        shards_a.iter().all(|s| !shards_b.contains(s)),
        "each server makes runs in its own shards: {shards_a:?} {shards_b:?}"
    );
    // GetCluster names each shard's owner by address, for clients that
    // send a run's calls there.
    let view = cluster_of(&b).await;
    let address = |name: &str| {
        let member = view.members.iter().find(|m| m.server == name);
        member.expect("a member").address.clone()
    };
    let (address_a, address_b) = (address(&name_a), address(&member_of(&b).await));
    assert_eq!(view.shard_owners.len(), 256);
    for (shards, owner) in [(&shards_a, &address_a), (&shards_b, &address_b)] {
        for &shard in shards {
            assert_eq!(&view.shard_owners[usize::from(shard)], owner, "{view:?}");
        }
    }
    let held = |owner: &str| view.shard_owners.iter().filter(|o| *o == owner).count();
    assert_eq!(held(&address_a) + held(&address_b), 256, "{view:?}");

    // A request id names one run whichever server is asked: its shard's
    // owner alone checks it.
    let request = StartRunRequest {
        request_id: "spread-once".into(),
        ..scripted_reference_run()
    };
    let mut answers = Vec::new();
    for runs in [through_a.clone(), through_b.clone(), through_a.clone()] {
        let answer = retrying(|| {
            let mut runs = runs.clone();
            let request = request.clone();
            async move { runs.start_run(request).await }
        })
        .await
        .into_inner();
        answers.push((answer.run_id, answer.created));
    }
    assert_eq!(answers[0].0, answers[1].0);
    assert_eq!(answers[0].0, answers[2].0);
    assert_eq!(
        answers.iter().map(|a| a.1).collect::<Vec<_>>(),
        [true, false, false]
    );
    let once = answers[0].0.clone();
    started.push((once.clone(), wait_for_approval(&mut through_a, &once).await));
    // Keeps the alternation (even: started through a) for the grants.
    let other = start_run(&mut through_b, scripted_reference_run()).await;
    started.push((
        other.clone(),
        wait_for_approval(&mut through_b, &other).await,
    ));

    // Granted through the other server; served by one worker on `a`.
    let mut workers = a.workers().await;
    for (i, (run_id, call_id)) in started.iter().enumerate() {
        let runs = if i % 2 == 0 {
            &mut through_b
        } else {
            &mut through_a
        };
        grant_and_finish(runs, &mut workers, run_id, call_id).await;
        let events = history(runs, run_id).await;
        assert_dense(&events, 1);
        assert_eq!(count(&events, "aaa.tool.started"), 1, "{run_id}");
    }
    // The worker's polls reach b's tasks over streams kept open across
    // polls, not one stream per poll.
    let from_b = started.len() / 2;
    let scraped = crate::metrics::scrape(&b).await;
    let peer_polls: f64 = scraped
        .lines()
        .filter(|line| {
            line.starts_with(r#"aaa_api_requests_total{method="ClusterService/PeerPoll""#)
                || line.starts_with(r#"aaa_api_open_streams{method="ClusterService/PeerPoll""#)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        peer_polls >= 1.0 && (peer_polls as usize) < from_b,
        "{peer_polls} PeerPoll streams for {from_b} tasks of b's shards"
    );

    // Two runs wait in b's shards; b stops, a takes its shards over.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let run_id = start_run(&mut through_b, scripted_reference_run()).await;
        waiting.push((
            run_id.clone(),
            wait_for_approval(&mut through_b, &run_id).await,
        ));
    }
    b.stop().await;
    wait_until_spread(&a, &[&name_a]).await;
    for (run_id, call_id) in &waiting {
        grant_retrying(&through_a, run_id, call_id).await;
        let events = finish_granted(&mut through_a, &mut workers, run_id).await;
        assert_eq!(count(&events, "aaa.tool.started"), 1, "{run_id}");
    }
}

/// With the shards spread, a standing grant of one use is used once in
/// the whole cluster: each server decides with its own copy of the grants,
/// and the database refuses a use the grant no longer allows (the call is
/// then decided again, and waits for a person).
#[tokio::test(flavor = "multi_thread")]
async fn spread_shards_use_a_grant_of_one_use_once() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (a, b) = spread_pair(&url).await;
    let grants = aaa::proto::grant_service_client::GrantServiceClient::new(a.channel().await);
    let grant = retrying(|| {
        let mut grants = grants.clone();
        let request = aaa::proto::CreateGrantRequest {
            tool: "wire_money".into(),
            max_uses: 1,
            reason: "one payment".into(),
            ..Default::default()
        };
        async move { grants.create_grant(request).await }
    })
    .await
    .into_inner()
    .grant
    .expect("the grant")
    .id;
    let granted_by_it = |events: &[aaa::proto::Event]| {
        events.iter().any(|e| {
            e.r#type == "aaa.approval.granted" && e.actor.as_ref().is_some_and(|a| a.name == grant)
        })
    };
    // Made through `a`, the grant reaches `b`'s copy within a second: runs
    // through `b` until one uses it. `a`'s copy still says it was never
    // used, and the database refuses what `a` decides with it.
    let (runs_a, runs_b) = (a.runs().await, b.runs().await);
    let review = |runs: &RunClient| {
        let mut runs = runs.clone();
        async move {
            let run_id = retrying(|| {
                let mut runs = runs.clone();
                async move { runs.start_run(scripted_reference_run()).await }
            })
            .await
            .into_inner()
            .run_id;
            // The review commits with the call's request: granted or asked.
            wait_for_event(&mut runs, &run_id, "aaa.tool.requested").await;
            let events = history(&mut runs, &run_id).await;
            let granted = granted_by_it(&events);
            let asked = count(&events, "aaa.approval.requested");
            assert_eq!(asked + usize::from(granted), 1, "{:?}", types(&events));
            granted
        }
    };
    let give_up = Instant::now() + WAIT;
    while !review(&runs_b).await {
        assert!(Instant::now() < give_up, "b never used the grant");
    }
    let mut used = 1;
    for _ in 0..4 {
        used += usize::from(review(&runs_a).await);
    }
    assert_eq!(used, 1, "a grant of one use, used {used} times");
}

/// With the shards spread, a batch decision through one server decides
/// the items of every server's runs (each owner its own); all_or_nothing
/// over runs of several servers is refused, as no one commit spans them.
#[tokio::test(flavor = "multi_thread")]
async fn spread_shards_decide_a_batch_of_every_servers_runs() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (a, b) = spread_pair(&url).await;
    let mut items = Vec::new();
    for server in [&a, &b, &a, &b] {
        let mut runs = server.runs().await;
        let run_id = retrying(|| {
            let mut runs = runs.clone();
            async move { runs.start_run(scripted_reference_run()).await }
        })
        .await
        .into_inner()
        .run_id;
        wait_for_approval(&mut runs, &run_id).await;
        let pending = list_approvals(
            &mut a.approvals().await,
            ListApprovalsRequest {
                run_id: run_id.clone(),
                ..Default::default()
            },
        )
        .await;
        items.push(aaa::proto::DecisionItem {
            run_id,
            call_id: pending[0].call_id.clone(),
            arguments_sha256: pending[0].arguments_sha256.clone(),
        });
    }
    let batch = |all_or_nothing| aaa::proto::DecideApprovalsRequest {
        items: items.clone(),
        decision: aaa::proto::BatchDecision::Grant as i32,
        comment: "all four".into(),
        all_or_nothing,
        ..Default::default()
    };
    let mut approvals = b.approvals().await;
    let refused = expect_err(approvals.decide_approvals(batch(true)).await);
    assert_error(&refused, Code::InvalidArgument, "INVALID_FIELD");
    let results = retrying(|| {
        let mut approvals = approvals.clone();
        let request = batch(false);
        async move { approvals.decide_approvals(request).await }
    })
    .await
    .into_inner()
    .results;
    let decided = aaa::proto::DecisionStatus::Decided as i32;
    assert!(results.iter().all(|r| r.status == decided), "{results:?}");
    let ran: Vec<&str> = results.iter().map(|r| r.run_id.as_str()).collect();
    let asked: Vec<&str> = items.iter().map(|i| i.run_id.as_str()).collect();
    assert_eq!(ran, asked, "results in the request's order");
}

/// PeerPoll as an asking server uses it: a task it accepted and hands back
/// (its worker's poll went away before the task arrived) goes to the next
/// poll as the same attempt, instead of waiting for its lease to lapse.
/// A client cannot call PeerPoll.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_task_handed_back_by_another_server_goes_to_the_next_poll() {
    use aaa::proto::cluster_service_client::ClusterServiceClient;
    use aaa::proto::{peer_poll_request, peer_poll_response, PeerPollRequest, PeerPollResponse};

    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let server = member_with(&url, false, None).await;
    let lookup = aaa::proto::ToolDefinition {
        name: "lookup".into(),
        ..Default::default()
    };
    register(&mut server.workers().await, vec![lookup], &[]).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_run("lookup", "{}")).await;
    wait_for_event(&mut runs, &run_id, "aaa.tool.requested").await;

    let step = |step| PeerPollRequest { step: Some(step) };
    let poll = PollTaskRequest {
        identity: "peer-asked".into(),
        tools: vec!["lookup".into()],
        wait_s: 5.0,
        ..Default::default()
    };
    let (requests, mut answers) = peer_poll(&server, &url, poll.clone()).await;
    let mut peers = ClusterServiceClient::new(server.channel().await);
    // Accepted, then handed back before reading the task, as an asking
    // server does when its worker's poll goes away meanwhile.
    requests
        .send(step(peer_poll_request::Step::Accept(true)))
        .await
        .unwrap();
    requests
        .send(step(peer_poll_request::Step::Returned(true)))
        .await
        .unwrap();
    let handed_back = match answers.message().await.expect("the task") {
        Some(PeerPollResponse {
            step: Some(peer_poll_response::Step::Task(task)),
        }) => task,
        other => panic!("expected the started task, got {other:?}"),
    };
    drop(requests);

    let mut workers = server.workers().await;
    let task = poll_until_task(&mut workers, "next-worker", &["lookup"], &[]).await;
    assert_eq!(
        (&task.run_id, &task.call_id, task.attempt),
        (&run_id, &handed_back.call_id, handed_back.attempt),
        "the same attempt, handed out again"
    );
    complete_tool(&mut workers, &task.token, r#"{"found":true}"#)
        .await
        .expect("complete");
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        count(&events, "aaa.tool.started"),
        1,
        "{:?}",
        types(&events)
    );
    assert_eq!(
        count(&events, "aaa.run.completed"),
        1,
        "{:?}",
        types(&events)
    );

    // Unsigned, a client is refused.
    let (_requests, outgoing) = tokio::sync::mpsc::channel(1);
    _requests
        .send(step(peer_poll_request::Step::Poll(poll)))
        .await
        .unwrap();
    let refused = peers
        .peer_poll(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await;
    assert_eq!(expect_err(refused).code(), Code::PermissionDenied);
}

/// A PeerPoll stream to `server` (on the database at `url`), signed as
/// another server of that database signs it (it shares the key), whose
/// first round asks with `poll` and is offered a task: the requests' sender
/// and the answers after the offer.
async fn peer_poll(
    server: &TestServer,
    url: &str,
    poll: PollTaskRequest,
) -> (
    tokio::sync::mpsc::Sender<aaa::proto::PeerPollRequest>,
    tonic::Streaming<aaa::proto::PeerPollResponse>,
) {
    use aaa::proto::cluster_service_client::ClusterServiceClient;
    use aaa::proto::{peer_poll_request, peer_poll_response, PeerPollRequest, PeerPollResponse};

    let key = {
        let store = aaa::store::postgres::PostgresStore::open(url)
            .await
            .expect("open the store");
        let key = aaa::store::Store::token_key(&store);
        aaa::store::Store::close(&store).await;
        key
    };
    // For this server, over no body (PeerPoll's request is a stream).
    let to = server.addr().to_string();
    let call = aaa::auth::forwarded::Call {
        method: "/aaa.v1.ClusterService/PeerPoll",
        to: &to,
        body: &[],
    };
    let mut headers = tonic::codegen::http::HeaderMap::new();
    aaa::auth::forwarded::sign(
        &mut headers,
        &key,
        "127.0.0.1:9",
        &call,
        aaa::clock::now_ms(),
    );
    let (requests, outgoing) = tokio::sync::mpsc::channel(3);
    requests
        .send(PeerPollRequest {
            step: Some(peer_poll_request::Step::Poll(poll)),
        })
        .await
        .unwrap();
    let mut call = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
    *call.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers);
    let mut peers = ClusterServiceClient::new(server.channel().await);
    let mut answers = peers.peer_poll(call).await.expect("PeerPoll").into_inner();
    let offered = answers.message().await.expect("an answer");
    assert!(
        matches!(
            offered,
            Some(PeerPollResponse {
                step: Some(peer_poll_response::Step::Offered(true))
            })
        ),
        "{offered:?}"
    );
    (requests, answers)
}

/// Found by the long chaos suite with spread shards (`call-1 executed as
/// [1, 1]`): a poll whose start of a call was refused for the store put the
/// call back marked "started for a poll that never delivered it", although
/// nothing had started. Once the store answered, the engine offered the
/// call again; another server's round held the marked entry and declined
/// it, which put it behind the fresh one; the fresh one started attempt 1
/// for a worker, and the marked one then handed attempt 1 to a second
/// worker. Only an attempt known to be started and undelivered (its task
/// made and never handed over) may be handed out again.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_refused_for_the_store_never_hands_its_attempt_to_two_workers() {
    use aaa::proto::{peer_poll_request, peer_poll_response, PeerPollRequest, PeerPollResponse};

    if postgres().is_none() {
        return;
    }
    let database = crate::postgres::Cluster::start().await;
    let server = member_with(&database.url, false, None).await;
    let lookup = aaa::proto::ToolDefinition {
        name: "lookup".into(),
        ..Default::default()
    };
    let mut workers = server.workers().await;
    register(&mut workers, vec![lookup], &[]).await;
    let mut runs = server.runs().await;
    let run_id = start_run(&mut runs, scripted_run("lookup", "{}")).await;
    wait_for_event(&mut runs, &run_id, "aaa.tool.requested").await;

    // A worker's poll takes the call while the database is down: the
    // attempt's start cannot commit, and the poll is refused.
    database.run(&["stop"]).await;
    let refused = workers
        .poll_task(PollTaskRequest {
            identity: "first".into(),
            tools: vec!["lookup".into()],
            wait_s: 1.0,
            ..Default::default()
        })
        .await;
    assert_eq!(
        expect_err(refused).code(),
        Code::Unavailable,
        "the start could not be written"
    );
    database.run(&["restart"]).await;

    // Once the store answers, the engine offers the call again (the
    // refused commit might have landed): two entries for one call.
    let ready = r#"aaa_ready_tasks{kind="tool",name="lookup"}"#;
    let give_up = Instant::now() + WAIT;
    while crate::metrics::value(&crate::metrics::scrape(&server).await, ready) != Some(2.0) {
        assert!(Instant::now() < give_up, "the call was not offered again");
        tokio::task::yield_now().await;
    }

    // Another server's round holds the first entry and declines it: it
    // goes back behind the other.
    let asked = PollTaskRequest {
        identity: "peer-asked".into(),
        tools: vec!["lookup".into()],
        wait_s: 5.0,
        ..Default::default()
    };
    let (requests, mut answers) = peer_poll(&server, &database.url, asked).await;
    requests
        .send(PeerPollRequest {
            step: Some(peer_poll_request::Step::Withdraw(true)),
        })
        .await
        .unwrap();
    let ended = answers.message().await.expect("an answer");
    assert!(
        matches!(
            ended,
            Some(PeerPollResponse {
                step: Some(peer_poll_response::Step::Ended(true))
            })
        ),
        "{ended:?}"
    );
    drop(requests);

    // One worker gets attempt 1; the other entry starts nothing.
    let task = poll_until_task(&mut workers, "second", &["lookup"], &[]).await;
    assert_eq!((task.run_id.as_str(), task.attempt), (run_id.as_str(), 1));
    let again = poll(&mut workers, "third", &["lookup"], &[], 0.5).await;
    assert!(
        again.is_none(),
        "attempt {} handed to a second worker: {again:?}",
        task.attempt
    );
    complete_tool(&mut workers, &task.token, r#"{"found":true}"#)
        .await
        .expect("complete");
    let events = wait_for_end(&mut runs, &run_id).await;
    assert_eq!(
        count(&events, "aaa.tool.started"),
        1,
        "{:?}",
        types(&events)
    );
}

/// Between two servers, a proxy that records every call it passes on
/// (path, headers, body), as someone on a plaintext hop could. The server
/// it fronts advertises the proxy's address, so the others forward there.
struct RecordingProxy {
    addr: std::net::SocketAddr,
    target: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    recorded: Arc<std::sync::Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One call the proxy passed on.
#[derive(Clone)]
struct Recorded {
    path: String,
    headers: tonic::codegen::http::HeaderMap,
    body: bytes::Bytes,
}

impl RecordingProxy {
    /// Listens now; passes calls on once [`RecordingProxy::send_to`] says where.
    async fn start() -> RecordingProxy {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(std::sync::OnceLock::<std::net::SocketAddr>::new());
        let recorded = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (target_in, recorded_in) = (target.clone(), recorded.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (target, recorded) = (target_in.clone(), recorded_in.clone());
                let service = hyper::service::service_fn(
                    move |request: tonic::codegen::http::Request<hyper::body::Incoming>| {
                        let (target, recorded) = (target.clone(), recorded.clone());
                        async move {
                            let (mut parts, body) = request.into_parts();
                            let body = body.collect().await.map(|b| b.to_bytes());
                            let body = body.unwrap_or_default();
                            recorded.lock().unwrap().push(Recorded {
                                path: parts.uri.path().to_string(),
                                headers: parts.headers.clone(),
                                body: body.clone(),
                            });
                            let target = *target.get().expect("the proxy's target");
                            parts.uri = format!("http://{target}{}", parts.uri.path())
                                .parse()
                                .unwrap();
                            let request = tonic::codegen::http::Request::from_parts(
                                parts,
                                tonic::body::Body::new(http_body_util::Full::new(body)),
                            );
                            let channel =
                                tonic::transport::Endpoint::from_shared(format!("http://{target}"))
                                    .unwrap()
                                    .connect_lazy();
                            let response = tower::ServiceExt::oneshot(channel, request)
                                .await
                                .expect("the proxy's target answers");
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    },
                );
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
        RecordingProxy {
            addr,
            target,
            recorded,
            task,
        }
    }

    fn send_to(&self, target: std::net::SocketAddr) {
        self.target.set(target).unwrap();
    }

    /// The calls of `path` passed on so far.
    fn recorded(&self, path: &str) -> Vec<Recorded> {
        let recorded = self.recorded.lock().unwrap();
        recorded
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The headers a forwarding server added to a call (the caller's signed
/// identity and the hop count), copied onto `request` as someone who
/// recorded them would.
fn with_forwarded_headers<T>(recorded: &Recorded, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    for (name, value) in &recorded.headers {
        if name.as_str().starts_with("aaa-forward") {
            request.metadata_mut().as_mut().insert(name, value.clone());
        }
    }
    request
}

/// Asserts a call was refused as a forwarded call whose signature is no
/// good for it, saying `why`.
#[track_caller]
fn refused_because<T: std::fmt::Debug>(result: Result<T, tonic::Status>, why: &str) {
    let status = expect_err(result);
    assert_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    assert!(
        status.message().contains("forwarded") && status.message().contains(why),
        "{status:?}"
    );
}

/// The message of a recorded unary call.
fn message_of<T: prost::Message + Default>(recorded: &Recorded) -> T {
    T::decode(&recorded.body[5..]).expect("a recorded message")
}

/// The identity a server forwards a call with is good for that call, at
/// that server, once: recorded on the hop between two servers and sent
/// again by someone without credentials, it is refused for the same
/// request (a replay), for another run's grant, for a grant of another
/// scope, and at another server.
#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_identity_recorded_between_servers_cannot_be_used_again() {
    use aaa::proto::grant_service_client::GrantServiceClient;
    use aaa::proto::{CreateGrantRequest, SignalRequest};

    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let proxy = RecordingProxy::start().await;
    let owner_server = {
        let (url, advertised) = (url.clone(), proxy.addr.to_string());
        let auth = Arc::new(AuthConfig::parse(&auth_toml(false), Path::new(".")).unwrap());
        TestServer::start_with(move |config| {
            config.auth = Some(auth.clone());
            config.store_url = Some(url.clone());
            config.advertise = Some(advertised.clone());
        })
        .await
    };
    proxy.send_to(owner_server.addr());
    let standby = member(&url, true).await;

    let mut at_owner = Clients::with_token(&owner_server, &token("runner")).await;
    Clients::with_token(&owner_server, &token("worker"))
        .await
        .workers
        .register_worker(RegisterWorkerRequest {
            identity: "payments-1".into(),
            tools: vec![wire_money()],
            ..Default::default()
        })
        .await
        .expect("RegisterWorker");
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let run_id = at_owner
            .runs
            .start_run(scripted_reference_run())
            .await
            .expect("StartRun")
            .into_inner()
            .run_id;
        let events = at_owner
            .wait_for_event(&run_id, "aaa.approval.requested")
            .await;
        waiting.push((run_id, call_id(events.last().unwrap())));
    }
    let (first, second) = (&waiting[0], &waiting[1]);

    // The approver acts through the standby, which forwards to the owner
    // through the proxy: a grant of one call, and a standing grant of one
    // use for calls with arguments nobody asked for.
    let mut approver = Clients::with_token(&standby, &token("approver")).await;
    approver
        .runs
        .signal(grant_request(&first.0, &first.1))
        .await
        .expect("a grant through the standby");
    let scoped = CreateGrantRequest {
        tool: "wire_money".into(),
        arguments_sha256: "ab".repeat(32),
        max_uses: 1,
        reason: "one payment of other arguments".into(),
        ..Default::default()
    };
    approver
        .grants
        .create_grant(scoped)
        .await
        .expect("CreateGrant through the standby");
    let signal = proxy.recorded("/aaa.v1.RunService/Signal");
    let create = proxy.recorded("/aaa.v1.GrantService/CreateGrant");
    assert_eq!(
        (signal.len(), create.len()),
        (1, 1),
        "one of each forwarded"
    );
    let (signal, create) = (&signal[0], &create[0]);
    assert!(signal.headers.contains_key("aaa-forwarded-signature"));

    // The same request again, at the owner: a replay.
    let same: SignalRequest = message_of(signal);
    assert_eq!(prost::Message::encode_to_vec(&same), signal.body[5..]);
    let mut runs = owner_server.runs().await;
    let replayed = runs
        .signal(with_forwarded_headers(signal, same.clone()))
        .await;
    refused_because(replayed, "used before");
    // The same request at another server of the deployment.
    let mut elsewhere = standby.runs().await;
    let replayed = elsewhere.signal(with_forwarded_headers(signal, same)).await;
    refused_because(replayed, "does not verify");
    // The headers on another run's grant.
    let moved = runs
        .signal(with_forwarded_headers(
            signal,
            grant_request(&second.0, &second.1),
        ))
        .await;
    refused_because(moved, "does not verify");
    // The standing grant's headers on a grant of any call, any number of times.
    let unscoped = CreateGrantRequest {
        tool: "wire_money".into(),
        reason: "anything".into(),
        ..Default::default()
    };
    let mut grants = GrantServiceClient::new(owner_server.channel().await);
    let moved = grants
        .create_grant(with_forwarded_headers(create, unscoped))
        .await;
    refused_because(moved, "does not verify");

    // Nothing of it took: the second run still waits, and the one grant
    // is the scoped one.
    let mut reader = Clients::with_token(&owner_server, &token("reader")).await;
    let pending = reader
        .approvals
        .list_approvals(ListApprovalsRequest {
            run_id: second.0.clone(),
            ..Default::default()
        })
        .await
        .expect("ListApprovals")
        .into_inner()
        .approvals;
    assert_eq!(pending.len(), 1, "the second run's call still waits");
    let listed = reader
        .grants
        .list_grants(aaa::proto::ListGrantsRequest::default())
        .await
        .expect("ListGrants")
        .into_inner()
        .grants;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].reason, "one payment of other arguments");
    standby.shutdown().await;
    owner_server.shutdown().await;
}

/// With the shards spread, two servers never give one worker identity to
/// two principals: the first claim is a request record the database keeps
/// once, and the other server's claim then reads it (issue 40, item 9: 40
/// of 40 simultaneous registrations on two servers both got OK).
#[tokio::test(flavor = "multi_thread")]
async fn spread_shards_bind_a_worker_identity_to_one_principal() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let auth = Arc::new(AuthConfig::parse(&auth_toml(false), Path::new(".")).expect("auth"));
    let a = spread_member_with(&url, Some(auth.clone())).await;
    let b = spread_member_with(&url, Some(auth)).await;
    // Both hold shards: each serves registrations itself.
    let mut names = Vec::new();
    for server in [&a, &b] {
        let mut reader = Clients::with_token(server, &token("reader")).await;
        let cluster = reader.cluster.get_cluster(aaa::proto::GetClusterRequest {});
        names.push(cluster.await.expect("GetCluster").into_inner().this_server);
    }
    let reader = Clients::with_token(&a, &token("reader")).await;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    wait_until_spread_by(reader.cluster, &names).await;
    let mut worker = Clients::with_token(&a, &token("worker")).await;
    let mut other = Clients::with_token(&b, &token("other-worker")).await;
    let mut both_ok = Vec::new();
    for round in 0..20 {
        let request = RegisterWorkerRequest {
            identity: format!("shared-{round}"),
            tools: vec![wire_money()],
            models: vec![],
        };
        let (first, second) = tokio::join!(
            worker.workers.register_worker(request.clone()),
            other.workers.register_worker(request.clone()),
        );
        match (first, second) {
            (Ok(_), Ok(_)) => both_ok.push(round),
            (Ok(_), Err(refused)) | (Err(refused), Ok(_)) => {
                assert_error(&refused, Code::PermissionDenied, "IDENTITY_TAKEN");
            }
            (Err(a), Err(b)) => panic!("round {round}: both refused: {a:?} {b:?}"),
        }
    }
    assert!(
        both_ok.is_empty(),
        "one identity given to two principals in rounds {both_ok:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}
