//! Retries with a request_id whose first try was cancelled while its
//! commit was in flight (a client's deadline, a forwarding server killed):
//! the retry waits for that commit and answers what it recorded, so a run
//! starts once and a signal or a decision is appended once (DESIGN.md §2,
//! guarantee 8). Commits are held back as a slow store holds them: on
//! PostgreSQL a transaction of the test's own takes the shards' locks that
//! every commit locks first; on the embedded store the server's commit
//! hold keeps the committer from writing.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use aaa::proto::{
    BatchDecision, CreateGrantRequest, CreateGrantResponse, DecideApprovalsRequest,
    DecideApprovalsResponse, DecisionItem, DecisionStatus, ListApprovalsRequest, ListGrantsRequest,
    ListRunsRequest, SignalRequest, SignalResponse, StartRunRequest, StartRunResponse,
};
use aaa::store::CommitHold;
use tokio::task::JoinHandle;
use tonic::{Code, Status};

use crate::postgres::connect;
use crate::support::*;

/// The first try's deadline: it passes while the try's commit is held.
const DEADLINE: Duration = Duration::from_millis(500);
/// How long the retry is watched, while the first try's commit is held,
/// for an answer it must not give: a retry that did not wait would answer
/// (or reach its own commit) within milliseconds.
const RETRY_WAITS: Duration = Duration::from_millis(500);

/// A test server whose embedded store's commits the test can hold.
async fn server_with_hold() -> (TestServer, CommitHold) {
    let hold = CommitHold::default();
    let configured = hold.clone();
    let server = TestServer::start_with(move |config| {
        config.commit_hold = Some(configured.clone());
    })
    .await;
    (server, hold)
}

/// Commits held back: by a lock in the database, or by the embedded
/// store's hold.
enum Held {
    Embedded(CommitHold),
    Postgres(Box<HeadRowLock>),
}

/// A transaction of the test's own that holds the shards' locks.
struct HeadRowLock {
    holder: tokio_postgres::Client,
    holder_pid: i32,
    /// Asks the database who waits for the holder.
    watcher: tokio_postgres::Client,
    connections: Vec<JoinHandle<Result<(), tokio_postgres::Error>>>,
}

impl Held {
    async fn start(server: &TestServer, hold: &CommitHold) -> Held {
        if !on_postgres() {
            hold.hold();
            return Held::Embedded(hold.clone());
        }
        let url = server.store_location();
        let (holder, holding) = connect(&url).await;
        let (watcher, watching) = connect(&url).await;
        // The locks every commit round takes first: those of its shards
        // (advisory, keyed (class, shard)); all of them here.
        holder
            .batch_execute(
                "BEGIN; SELECT pg_advisory_xact_lock(1633771891, s) FROM generate_series(0, 255) s",
            )
            .await
            .expect("lock the shards");
        let holder_pid = holder
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pg_backend_pid")
            .get(0);
        Held::Postgres(Box::new(HeadRowLock {
            holder,
            holder_pid,
            watcher,
            connections: vec![holding, watching],
        }))
    }

    /// Returns once a commit waits on the hold.
    async fn until_a_commit_waits(&self) {
        match self {
            Held::Embedded(hold) => tokio::time::timeout(WAIT, hold.until_waiting())
                .await
                .expect("no commit reached the hold"),
            Held::Postgres(lock) => {
                let HeadRowLock {
                    holder_pid,
                    watcher,
                    ..
                } = &**lock;
                let give_up = std::time::Instant::now() + WAIT;
                loop {
                    let waiting: i64 = watcher
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity \
                             WHERE $1 = ANY(pg_blocking_pids(pid))",
                            &[holder_pid],
                        )
                        .await
                        .expect("ask who waits for the shards' locks")
                        .get(0);
                    if waiting > 0 {
                        return;
                    }
                    assert!(
                        std::time::Instant::now() < give_up,
                        "no commit waited for the shards' locks"
                    );
                    backoff().await;
                }
            }
        }
    }

    async fn release(self) {
        match self {
            Held::Embedded(hold) => hold.release(),
            Held::Postgres(lock) => {
                let HeadRowLock {
                    holder,
                    watcher,
                    connections,
                    ..
                } = *lock;
                holder.batch_execute("ROLLBACK").await.expect("release");
                drop((holder, watcher));
                for connection in connections {
                    let _ = connection.await;
                }
            }
        }
    }
}

/// Sends `call` with [`DEADLINE`] while the server's commits are held, so
/// that the deadline passes with the call's commit in flight; then sends
/// it again with no deadline, checks that the retry waits for the held
/// commit, lets the commit go and returns the retry's answer.
async fn cancelled_mid_commit_then_retried<T, F, Fut>(
    server: &TestServer,
    hold: &CommitHold,
    call: F,
) -> T
where
    F: Fn(Option<Duration>) -> Fut,
    Fut: Future<Output = Result<T, Status>> + Send + 'static,
    T: Debug + Send + 'static,
{
    let held = Held::start(server, hold).await;
    let first = tokio::spawn(call(Some(DEADLINE)));
    held.until_a_commit_waits().await;
    let status = first
        .await
        .expect("first try")
        .expect_err("the first try answered while its commit was held");
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "the first try was not cut by its deadline: {status:?}"
    );
    let mut retry = tokio::spawn(call(None));
    let early = tokio::time::timeout(RETRY_WAITS, &mut retry).await;
    assert!(
        early.is_err(),
        "the retry answered while the first try's commit was held: {early:?}"
    );
    held.release().await;
    tokio::time::timeout(WAIT, retry)
        .await
        .expect("the retry did not answer once the commit was let go")
        .expect("retry task")
        .expect("retry")
}

/// `message` as a request with `deadline` (sent as grpc-timeout; the
/// server cuts the call when it passes).
fn with_deadline<M>(message: M, deadline: Option<Duration>) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    request
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_run_cancelled_mid_commit_and_retried_starts_one_run() {
    let (server, hold) = server_with_hold().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let labels = HashMap::from([("test".to_string(), "cancelled-start".to_string())]);
    let request = StartRunRequest {
        request_id: "start-once".into(),
        labels: labels.clone(),
        ..scripted_reference_run()
    };
    let caller = runs.clone();
    let call = |deadline| {
        let mut runs = caller.clone();
        let request = with_deadline(request.clone(), deadline);
        async move {
            let answer = runs.start_run(request).await?;
            Ok::<StartRunResponse, Status>(answer.into_inner())
        }
    };

    let retried = cancelled_mid_commit_then_retried(&server, &hold, call).await;
    let listed = runs
        .list_runs(ListRunsRequest {
            labels,
            ..Default::default()
        })
        .await
        .expect("ListRuns")
        .into_inner()
        .runs;
    let listed: Vec<&str> = listed.iter().map(|run| run.run_id.as_str()).collect();
    assert_eq!(
        listed,
        [retried.run_id.as_str()],
        "the retry's run is not the one run started"
    );
    assert!(!retried.created, "the retry says it started the run");
    let again = call(None).await.expect("StartRun once more");
    assert_eq!(again, retried);
    wait_for_approval(&mut runs, &retried.run_id).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_cancelled_mid_commit_and_retried_is_appended_once() {
    let (server, hold) = server_with_hold().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &run_id).await;
    let note = SignalRequest {
        run_id: run_id.clone(),
        r#type: "app.note".into(),
        data_json: r#"{"text":"once"}"#.into(),
        request_id: "note-once".into(),
    };
    let caller = runs.clone();
    let call = |deadline| {
        let mut runs = caller.clone();
        let request = with_deadline(note.clone(), deadline);
        async move {
            let answer = runs.signal(request).await?;
            Ok::<SignalResponse, Status>(answer.into_inner())
        }
    };

    let retried = cancelled_mid_commit_then_retried(&server, &hold, call).await;
    let events = history(&mut runs, &run_id).await;
    assert_eq!(
        count(&events, "app.note"),
        1,
        "the note was appended more than once: {:?}",
        types(&events)
    );
    assert_eq!(find(&events, "app.note").seq, retried.seq);
    let again = call(None).await.expect("Signal once more");
    assert_eq!(again, retried);
    server.shutdown().await;
}

/// On the embedded store only: on PostgreSQL the test's hold takes the
/// shards' locks, and a grant's commit touches no run's shard.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_grant_cancelled_mid_commit_and_retried_creates_one_grant() {
    if on_postgres() {
        return;
    }
    let (server, hold) = server_with_hold().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let grants = Clients::new(server.channel().await, None).grants;
    let request = CreateGrantRequest {
        tool: "wire_money".into(),
        reason: "standing order".into(),
        max_uses: 1,
        request_id: "grant-once".into(),
        ..Default::default()
    };
    let call = |deadline| {
        let mut grants = grants.clone();
        let request = with_deadline(request.clone(), deadline);
        async move {
            let answer = grants.create_grant(request).await?;
            Ok::<CreateGrantResponse, Status>(answer.into_inner())
        }
    };

    let retried = cancelled_mid_commit_then_retried(&server, &hold, call).await;
    let listed = grants
        .clone()
        .list_grants(ListGrantsRequest {
            include_revoked: true,
            tool: String::new(),
        })
        .await
        .expect("ListGrants")
        .into_inner()
        .grants;
    let retried = retried.grant.expect("a grant");
    let ids: Vec<&str> = listed.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(ids, [retried.id.as_str()], "one grant, the retry's answer");
    server.shutdown().await;
}

/// Two runs waiting for approval, and the batch that grants both.
async fn two_waiting_calls(
    runs: &mut RunClient,
    approvals: &mut ApprovalClient,
) -> Vec<DecisionItem> {
    let mut run_ids = Vec::new();
    for _ in 0..2 {
        let run_id = start_run(runs, scripted_reference_run()).await;
        wait_for_approval(runs, &run_id).await;
        run_ids.push(run_id);
    }
    let pending = list_approvals(approvals, ListApprovalsRequest::default()).await;
    run_ids
        .iter()
        .map(|run_id| {
            let approval = pending
                .iter()
                .find(|a| &a.run_id == run_id)
                .expect("the run's approval is listed");
            DecisionItem {
                run_id: run_id.clone(),
                call_id: approval.call_id.clone(),
                arguments_sha256: approval.arguments_sha256.clone(),
            }
        })
        .collect()
}

fn grant_batch(items: Vec<DecisionItem>, request_id: &str) -> DecideApprovalsRequest {
    DecideApprovalsRequest {
        items,
        decision: BatchDecision::Grant as i32,
        comment: "both".into(),
        request_id: request_id.into(),
        ..Default::default()
    }
}

/// Each item granted once, at the seq its result names.
async fn assert_granted_once(runs: &mut RunClient, answer: &DecideApprovalsResponse) {
    for result in &answer.results {
        assert_eq!(
            result.status,
            DecisionStatus::Decided as i32,
            "not the first answer: {result:?}"
        );
        let events = history(runs, &result.run_id).await;
        assert_eq!(count(&events, "aaa.approval.granted"), 1);
        assert_eq!(find(&events, "aaa.approval.granted").seq, result.seq);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decide_approvals_retried_with_its_request_id_answers_as_the_first_time() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    let mut approvals = server.approvals().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let items = two_waiting_calls(&mut runs, &mut approvals).await;

    let first = approvals
        .decide_approvals(grant_batch(items.clone(), "batch-once"))
        .await
        .expect("DecideApprovals")
        .into_inner();
    assert_granted_once(&mut runs, &first).await;
    // The answer was lost; the retry gets it again.
    let again = approvals
        .decide_approvals(grant_batch(items.clone(), "batch-once"))
        .await
        .expect("DecideApprovals retry")
        .into_inner();
    assert_eq!(again, first);
    // Another request id is another request: already decided.
    let other = approvals
        .decide_approvals(grant_batch(items, "batch-other"))
        .await
        .expect("DecideApprovals with another request id")
        .into_inner();
    for result in &other.results {
        assert_eq!(result.status, DecisionStatus::AlreadyDecided as i32);
    }
    assert_granted_once(&mut runs, &first).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decide_approvals_cancelled_mid_commit_and_retried_decides_once() {
    let (server, hold) = server_with_hold().await;
    let mut runs = server.runs().await;
    let mut approvals = server.approvals().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let items = two_waiting_calls(&mut runs, &mut approvals).await;
    let call = |deadline| {
        let mut approvals = approvals.clone();
        let request = with_deadline(grant_batch(items.clone(), "batch-once"), deadline);
        async move {
            let answer = approvals.decide_approvals(request).await?;
            Ok::<DecideApprovalsResponse, Status>(answer.into_inner())
        }
    };

    let retried = cancelled_mid_commit_then_retried(&server, &hold, call).await;
    assert_granted_once(&mut runs, &retried).await;
    let again = call(None).await.expect("DecideApprovals once more");
    assert_eq!(again, retried);
    server.shutdown().await;
}
