//! The PostgreSQL store against a real PostgreSQL, and the store contract
//! both backends keep (checked once, run on each).
//!
//! Tests that need PostgreSQL read its admin URL from `AAA_TEST_POSTGRES`
//! (`.ci/postgres start DIR` prints one) and say they skip when it is unset.
//! Each makes its own database and drops it at the end. The crash test
//! makes a cluster of its own, since it stops and starts it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aaa::store::embedded::EmbeddedStore;
use aaa::store::postgres::PostgresStore;
use aaa::store::Store as _;
use aaa::store::{
    ApprovalQuery, ApprovalRecord, Cursor, DeadLetterRecord, EventRecord, GrantRecord, GrantUse,
    GroupRecord, RunId, RunQuery, RunRecord, Shards, SharedStore, StoreError, WriteBatch,
};

use aaa::proto::ListApprovalsRequest;

use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::*;

// ------------------------------------------------------------- databases

/// The admin URL, or None (said) when the tests are to skip.
fn admin_url(test: &str) -> Option<String> {
    match std::env::var("AAA_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!(
                "skipped {test}: set AAA_TEST_POSTGRES to a PostgreSQL admin URL \
                 (`.ci/postgres start DIR` prints one)"
            );
            None
        }
    }
}

async fn admin(url: &str, sql: &str) {
    let (client, driver) = connect(url).await;
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    drop(client);
    let _ = driver.await;
}

/// A connection to the database at `url`, and the task that drives it.
pub(crate) async fn connect(
    url: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test PostgreSQL: {e}"));
    (client, tokio::spawn(connection))
}

/// A database of its own for one test.
struct TestDb {
    admin: String,
    name: String,
    url: String,
}

impl TestDb {
    async fn create(test: &str) -> Option<TestDb> {
        let admin_url = admin_url(test)?;
        Some(Self::create_on(&admin_url).await)
    }

    async fn create_on(admin_url: &str) -> TestDb {
        let name = format!("aaa_test_{}", uuid::Uuid::new_v4().simple());
        admin(admin_url, &format!("CREATE DATABASE {name}")).await;
        let (base, _) = admin_url
            .split('?')
            .next()
            .and_then(|u| u.rsplit_once('/'))
            .expect("the admin URL names a database");
        TestDb {
            admin: admin_url.to_string(),
            url: format!("{base}/{name}"),
            name,
        }
    }

    async fn open(&self) -> SharedStore {
        Arc::new(PostgresStore::open(&self.url).await.expect("open"))
    }

    async fn sql(&self, sql: &str) {
        admin(&self.url, sql).await;
    }

    async fn drop(self) {
        admin(
            &self.admin,
            &format!("DROP DATABASE {} WITH (FORCE)", self.name),
        )
        .await;
    }
}

fn embedded() -> (tempfile::TempDir, SharedStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(dir.path(), 1 << 20).expect("open");
    (dir, Arc::new(store))
}

// ---------------------------------------------------------------- records

fn event(run: RunId, seq: u64, ty: &str) -> EventRecord {
    EventRecord {
        run_id: run.as_bytes().to_vec(),
        seq,
        position: 0,
        id: uuid::Uuid::new_v4().as_bytes().to_vec(),
        event_type: ty.into(),
        data_json: format!(r#"{{"amount":250,"big":12345678901234567890,"seq":{seq}}}"#),
        time_ms: 1_000 + seq as i64,
        actor_kind: 3,
        actor_name: "alice".into(),
        actor_principal: String::new(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run_record(run: RunId, status: i32, team: &str, started_by: &str) -> RunRecord {
    RunRecord {
        run_id: run.as_bytes().to_vec(),
        status,
        task: format!("task of {team}"),
        model: "scripted".into(),
        tools: vec!["wire_money".into(), "lookup".into()],
        labels: labels(&[("team", team), ("env", "test")]),
        created_ms: 42,
        updated_ms: 43,
        deadline_ms: 9_000,
        last_seq: 0,
        result_json: r#"{"text":"ok"}"#.into(),
        error_type: String::new(),
        error_message: String::new(),
        started_by: started_by.into(),
        prompt_tokens: 120,
        completion_tokens: 30,
    }
}

fn approval(run: RunId, call_id: &str, tool: &str, seq: u64) -> ApprovalRecord {
    ApprovalRecord {
        run_id: run.as_bytes().to_vec(),
        call_id: call_id.into(),
        tool: tool.into(),
        arguments_json: r#"{"amount":250,"to":"ACME"}"#.into(),
        arguments_sha256: "ab".repeat(32),
        requested_ms: 77,
        expires_ms: 0,
        labels: labels(&[("team", "a")]),
        seq,
        task: "Pay ACME $250".into(),
        position: 0,
        approvals_required: 2,
        votes: vec![aaa::domain::VoteRecord {
            approver: "alice".into(),
            time_ms: 78,
            comment: "fine by me".into(),
        }],
        edited_from: "call-0".into(),
        approvers: vec!["finance".into()],
    }
}

fn group(cursor: u64) -> GroupRecord {
    GroupRecord {
        name: "acme.notify".into(),
        event_types: vec!["aaa.approval.requested".into(), "app.*".into()],
        labels: labels(&[("team", "a")]),
        ack_timeout_ms: 30_000,
        max_deliveries: 5,
        cursor,
        created_ms: 7,
        shard_cursor: Vec::new(),
    }
}

fn letter(run: RunId, position: u64) -> DeadLetterRecord {
    DeadLetterRecord {
        run_id: run.as_bytes().to_vec(),
        seq: 1,
        position,
        deliveries: 5,
        last_error: "webhook said 500".into(),
        dead_ms: 99,
        replaying: false,
    }
}

fn seqs(events: &[EventRecord]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

fn ids(runs: &[RunRecord]) -> Vec<RunId> {
    runs.iter()
        .map(|r| RunId::from_slice(&r.run_id).expect("a run id"))
        .collect()
}

fn calls(approvals: &[ApprovalRecord]) -> Vec<&str> {
    approvals.iter().map(|a| a.call_id.as_str()).collect()
}

// ------------------------------------------------------- the contract

/// Every op and every query, with what each backend must answer.
async fn round_trip_every_op_and_query(store: &SharedStore) {
    let start = store.durable().most();
    let durable = store.watch_durable();
    let a = RunId::new();
    let mut batch = WriteBatch::default();
    batch.put_run(&run_record(a, 1, "a", "alice"));
    batch.push_event(event(a, 1, "aaa.run.started"));
    batch.push_event(event(a, 2, "aaa.llm.requested"));
    batch.set_active(a, true);
    batch.put_timer(500, a, "deadline");
    batch.put_timer(200, a, "approval:c1");
    batch.put_tool("wire_money", b"definition".to_vec());
    batch.put_request(b"scope\x00\xff", "req-1", b"answer".to_vec());
    batch.put_group(&group(0));
    batch.put_dead_letter("acme.notify", &letter(a, 1));
    batch.put_dead_letter("acme.notify", &letter(a, 2));
    let written = batch.events().to_vec();
    let positions = store.commit(batch).await.expect("commit");
    assert_eq!(positions, [start + 1, start + 2]);
    assert_eq!(store.durable().most(), start + 2);
    assert!(durable.has_changed().unwrap(), "the durable watch moved");

    // Events come back exactly, positions filled in.
    let events = store.run_events(a, 0, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    for (read, (mut sent, position)) in events.iter().zip(written.into_iter().zip(&positions)) {
        sent.position = *position;
        assert_eq!(*read, sent);
    }
    assert_eq!(seqs(&store.run_events(a, 1, 10).await.unwrap()), [2]);
    assert_eq!(seqs(&store.run_events(a, 0, 1).await.unwrap()), [1]);
    assert_eq!(store.event(a, 2).await.unwrap(), Some(events[1].clone()));
    assert_eq!(store.event(a, 3).await.unwrap(), None);
    assert_eq!(
        store.log_after(&Cursor::at(start), 10).await.unwrap(),
        events
    );
    assert_eq!(
        store.log_after(&Cursor::at(start + 1), 10).await.unwrap(),
        events[1..]
    );
    assert!(store
        .log_after(&Cursor::at(start + 2), 10)
        .await
        .unwrap()
        .is_empty());

    // The summary with its head: the newest event's seq and time.
    let read = store.run(a).await.unwrap().expect("run a");
    let mut expected = run_record(a, 1, "a", "alice");
    expected.last_seq = 2;
    expected.updated_ms = 1_002;
    assert_eq!(read, expected);
    assert_eq!(store.run(RunId::new()).await.unwrap(), None);

    assert_eq!(store.active_runs(&Shards::all()).await.unwrap(), [a]);
    let timer = store
        .next_timer(&Shards::all())
        .await
        .unwrap()
        .expect("a timer");
    assert_eq!(
        (timer.due_ms, timer.run, timer.name.as_str()),
        (200, a, "approval:c1")
    );
    assert_eq!(
        store.tool("wire_money").await.unwrap().as_deref(),
        Some(&b"definition"[..])
    );
    assert_eq!(store.tool("other").await.unwrap(), None);
    assert_eq!(
        store
            .request(b"scope\x00\xff", "req-1")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"answer"[..])
    );
    assert_eq!(store.request(b"scope", "req-1").await.unwrap(), None);
    assert_eq!(store.group("acme.notify").await.unwrap(), Some(group(0)));
    assert_eq!(store.group("other").await.unwrap(), None);
    let letters = store.dead_letters("acme.notify", 0, 10).await.unwrap();
    assert_eq!(letters, [letter(a, 1), letter(a, 2)]);
    assert_eq!(
        store.dead_letters("acme.notify", 1, 10).await.unwrap(),
        [letter(a, 2)]
    );
    assert_eq!(
        store.dead_letters("acme.notify", 0, 1).await.unwrap(),
        [letter(a, 1)]
    );

    // Approvals: positions filled in from the batch's event of their seq.
    let mut batch = WriteBatch::default();
    batch.push_event(event(a, 3, "aaa.approval.requested"));
    batch.push_event(event(a, 4, "aaa.approval.requested"));
    batch.put_approval(&approval(a, "c2", "wire_money", 3));
    batch.put_approval(&approval(a, "c1", "lookup", 4));
    // Put, then deleted in the same batch: the last change wins.
    batch.put_approval(&approval(a, "c0", "lookup", 4));
    batch.delete_approval(a, "c0");
    let at = store.commit(batch).await.expect("commit approvals");
    assert_eq!(at, [start + 3, start + 4]);
    let pending = store.run_approvals(a).await.unwrap();
    assert_eq!(calls(&pending), ["c1", "c2"]);
    assert_eq!(pending[0].position, start + 4);
    assert_eq!(pending[1].position, start + 3);
    let mut c2 = approval(a, "c2", "wire_money", 3);
    c2.position = start + 3;
    assert_eq!(pending[1], c2);

    // A second run, newer.
    let b = RunId::new();
    let mut batch = WriteBatch::default();
    batch.put_run(&run_record(b, 2, "b", "bob"));
    batch.push_event(event(b, 1, "aaa.run.started"));
    batch.put_approval(&approval(b, "c1", "wire_money", 1));
    store.commit(batch).await.expect("commit b");

    let all = RunQuery {
        limit: 10,
        ..Default::default()
    };
    let (a_id, b_id) = (a.as_bytes().to_vec(), b.as_bytes().to_vec());
    assert_eq!(ids(&store.list_runs(&all).await.unwrap()), [b, a]);
    let listed = store.list_runs(&all).await.unwrap();
    assert_eq!(listed[1], expected_with_head(&expected, 4, 1_004));
    let query = |f: &dyn Fn(&mut RunQuery)| {
        let mut q = all.clone();
        f(&mut q);
        q
    };
    let page = query(&|q| q.limit = 1);
    assert_eq!(ids(&store.list_runs(&page).await.unwrap()), [b]);
    let next = query(&|q| q.before = Some(b));
    assert_eq!(ids(&store.list_runs(&next).await.unwrap()), [a]);
    let status = query(&|q| q.status = 2);
    assert_eq!(ids(&store.list_runs(&status).await.unwrap()), [b]);
    let team = query(&|q| q.labels = labels(&[("team", "a"), ("env", "test")]));
    assert_eq!(ids(&store.list_runs(&team).await.unwrap()), [a]);
    let nobody = query(&|q| q.labels = labels(&[("team", "c")]));
    assert!(store.list_runs(&nobody).await.unwrap().is_empty());
    let bob = query(&|q| q.started_by = Some("bob".into()));
    assert_eq!(ids(&store.list_runs(&bob).await.unwrap()), [b]);

    let every = ApprovalQuery {
        limit: 10,
        ..Default::default()
    };
    let approvals = |f: &dyn Fn(&mut ApprovalQuery)| {
        let mut q = every.clone();
        f(&mut q);
        q
    };
    let keys = |list: Vec<ApprovalRecord>| {
        list.into_iter()
            .map(|a| (a.run_id, a.call_id))
            .collect::<Vec<_>>()
    };
    let key = |run: &[u8], call: &str| (run.to_vec(), call.to_string());
    let mut in_order = vec![key(&a_id, "c1"), key(&a_id, "c2"), key(&b_id, "c1")];
    in_order.sort();
    assert_eq!(keys(store.approvals(&every).await.unwrap()), in_order);
    let after_first = approvals(&|q| {
        q.after = Some((
            RunId::from_slice(&in_order[0].0).unwrap(),
            in_order[0].1.clone(),
        ))
    });
    assert_eq!(
        keys(store.approvals(&after_first).await.unwrap()),
        in_order[1..]
    );
    let of_a = approvals(&|q| q.run = Some(a));
    assert_eq!(
        keys(store.approvals(&of_a).await.unwrap()),
        [key(&a_id, "c1"), key(&a_id, "c2")]
    );
    let of_a_after_c1 = approvals(&|q| {
        q.run = Some(a);
        q.after = Some((a, "c1".into()));
    });
    assert_eq!(
        keys(store.approvals(&of_a_after_c1).await.unwrap()),
        [key(&a_id, "c2")]
    );
    let wire = approvals(&|q| q.tool = "wire_money".into());
    let mut wired = vec![key(&a_id, "c2"), key(&b_id, "c1")];
    wired.sort();
    assert_eq!(keys(store.approvals(&wire).await.unwrap()), wired);
    let below = approvals(&|q| q.at_or_below = Some(Cursor::at(start + 3)));
    assert_eq!(
        keys(store.approvals(&below).await.unwrap()),
        [key(&a_id, "c2")]
    );
    let labelled = approvals(&|q| q.labels = labels(&[("team", "z")]));
    assert!(store.approvals(&labelled).await.unwrap().is_empty());
    let one = approvals(&|q| q.limit = 1);
    assert_eq!(store.approvals(&one).await.unwrap().len(), 1);

    // Deletions, and an ops-only batch.
    let before = store.durable().most();
    let mut batch = WriteBatch::default();
    batch.delete_approval(a, "c1");
    batch.set_active(a, false);
    batch.delete_timer(200, a, "approval:c1");
    batch.delete_dead_letter("acme.notify", 1);
    batch.put_group(&group(before));
    assert_eq!(
        store.commit(batch).await.expect("ops only"),
        Vec::<u64>::new()
    );
    assert_eq!(store.durable().most(), before);
    assert_eq!(calls(&store.run_approvals(a).await.unwrap()), ["c2"]);
    assert!(store.active_runs(&Shards::all()).await.unwrap().is_empty());
    assert_eq!(
        store
            .next_timer(&Shards::all())
            .await
            .unwrap()
            .map(|t| t.due_ms),
        Some(500)
    );
    assert_eq!(
        store.dead_letters("acme.notify", 0, 10).await.unwrap(),
        [letter(a, 2)]
    );
    assert_eq!(
        store.group("acme.notify").await.unwrap(),
        Some(group(before))
    );

    // A stale expected seq is refused whole.
    let mut stale = WriteBatch::default();
    stale.push_event(event(a, 3, "app.late"));
    stale.put_tool("late", b"x".to_vec());
    match store.commit(stale).await {
        Err(StoreError::Conflict {
            run,
            expected,
            actual,
        }) => assert_eq!((run, expected, actual), (a, 2, 4)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(store.tool("late").await.unwrap(), None);
    assert_eq!(store.durable().most(), before);
    assert_eq!(
        seqs(&store.run_events(a, 0, 10).await.unwrap()),
        [1, 2, 3, 4]
    );
}

/// Grants and their uses: a use is a record, so the same use twice counts
/// once and uses committed by concurrent batches all count; a revocation
/// replaces the grant; a use commits with its run's event, or not at all.
async fn grants_and_their_uses(store: &SharedStore) {
    let grant = |id: &str| GrantRecord {
        id: id.to_string(),
        tool: "wire_money".into(),
        labels: labels(&[("team", "payroll")]),
        condition: "args.amount < 100".into(),
        max_uses: 10,
        reason: "payroll".into(),
        created_by: "alice".into(),
        created_ms: 1_000,
        creator_groups: vec!["finance".into()],
        groups_enforced: true,
        ..Default::default()
    };
    let mut batch = WriteBatch::default();
    batch.put_grant(&grant("g1"));
    batch.put_grant(&grant("g2"));
    store.commit(batch).await.unwrap();
    assert_eq!(
        store.grants().await.unwrap(),
        [(grant("g1"), 0), (grant("g2"), 0)]
    );

    // Uses from concurrent commits, each with its run's first event.
    let runs: Vec<RunId> = (0..8).map(|_| RunId::new()).collect();
    let commits = runs.iter().map(|&run| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut batch = WriteBatch::default();
            batch.push_event(event(run, 1, "aaa.approval.granted"));
            batch.use_grant(GrantUse {
                grant: "g1".into(),
                run,
                call_id: "call-1".into(),
            });
            store.commit(batch).await.unwrap();
        })
    });
    for commit in commits.collect::<Vec<_>>() {
        commit.await.unwrap();
    }
    // The same use again counts once.
    let mut again = WriteBatch::default();
    again.use_grant(GrantUse {
        grant: "g1".into(),
        run: runs[0],
        call_id: "call-1".into(),
    });
    store.commit(again).await.unwrap();
    // A use whose event is refused is not recorded.
    let mut stale = WriteBatch::default();
    stale.push_event(event(runs[1], 5, "aaa.approval.granted"));
    stale.use_grant(GrantUse {
        grant: "g1".into(),
        run: runs[1],
        call_id: "call-9".into(),
    });
    assert!(matches!(
        store.commit(stale).await,
        Err(StoreError::Conflict { .. })
    ));

    let mut revoked = grant("g2");
    revoked.revoked_ms = 2_000;
    revoked.revoked_by = "bob".into();
    revoked.revoke_reason = "done".into();
    let mut batch = WriteBatch::default();
    batch.put_grant(&revoked);
    store.commit(batch).await.unwrap();
    assert_eq!(
        store.grants().await.unwrap(),
        [(grant("g1"), 8), (revoked, 0)]
    );
    let mut uses = store.list_grant_uses().await.unwrap();
    uses.sort();
    let mut expected: Vec<GrantUse> = runs
        .iter()
        .map(|&run| GrantUse {
            grant: "g1".into(),
            run,
            call_id: "call-1".into(),
        })
        .collect();
    expected.sort();
    assert_eq!(uses, expected);
}

/// The database counts a grant's uses where every server's commits meet:
/// a use the grant no longer allows (revoked, or one more than its
/// maximum, by another server whose copy was behind) is refused whole, and
/// recording a use again is no new use.
#[tokio::test(flavor = "multi_thread")]
async fn the_database_refuses_a_use_the_grant_no_longer_allows() {
    let Some(db) = TestDb::create("the_database_refuses_a_use_the_grant_no_longer_allows").await
    else {
        return;
    };
    let store = db.open().await;
    let grant = GrantRecord {
        id: "g".into(),
        tool: "wire_money".into(),
        max_uses: 2,
        created_ms: 1_000,
        ..Default::default()
    };
    let mut batch = WriteBatch::default();
    batch.put_grant(&grant);
    store.commit(batch).await.unwrap();
    let use_on = |run: RunId| {
        let mut batch = WriteBatch::default();
        batch.push_event(event(run, 1, "aaa.approval.granted"));
        batch.use_grant(GrantUse {
            grant: "g".into(),
            run,
            call_id: "call-1".into(),
        });
        batch
    };
    let runs: Vec<RunId> = (0..3).map(|_| RunId::new()).collect();
    store.commit(use_on(runs[0])).await.unwrap();
    store.commit(use_on(runs[1])).await.unwrap();
    let before = store.durable().most();
    match store.commit(use_on(runs[2])).await {
        Err(StoreError::GrantUnusable(id)) => assert_eq!(id, "g"),
        other => panic!("a third use of a grant of two: {other:?}"),
    }
    assert_eq!(store.durable().most(), before, "nothing of it written");
    assert!(store.run_events(runs[2], 0, 10).await.unwrap().is_empty());
    // The same use again is no new use.
    let mut again = WriteBatch::default();
    again.use_grant(GrantUse {
        grant: "g".into(),
        run: runs[0],
        call_id: "call-1".into(),
    });
    store.commit(again).await.unwrap();

    let unlimited = GrantRecord {
        id: "h".into(),
        max_uses: 0,
        revoked_ms: 2_000,
        ..grant
    };
    let mut batch = WriteBatch::default();
    batch.put_grant(&unlimited);
    store.commit(batch).await.unwrap();
    let mut revoked_use = WriteBatch::default();
    revoked_use.push_event(event(runs[2], 1, "aaa.approval.granted"));
    revoked_use.use_grant(GrantUse {
        grant: "h".into(),
        run: runs[2],
        call_id: "call-2".into(),
    });
    match store.commit(revoked_use).await {
        Err(StoreError::GrantUnusable(id)) => assert_eq!(id, "h"),
        other => panic!("a use of a revoked grant: {other:?}"),
    }
    // A use copied alone, without the event that made it (`aaa migrate`),
    // is taken as it was.
    let mut copied = WriteBatch::default();
    copied.use_grant(GrantUse {
        grant: "g".into(),
        run: runs[2],
        call_id: "call-1".into(),
    });
    store.commit(copied).await.unwrap();
    store.close().await;
    db.drop().await;
}

fn expected_with_head(record: &RunRecord, last_seq: u64, updated_ms: i64) -> RunRecord {
    let mut record = record.clone();
    record.last_seq = last_seq;
    record.updated_ms = updated_ms;
    record
}

/// 64 writers, each appending to its own run: every position is used once,
/// in commit order (gaps allowed: a round done again takes new ones).
/// Returns commits per second.
async fn positions_unique_under_concurrent_writers(store: &SharedStore) -> f64 {
    const WRITERS: usize = 64;
    const COMMITS: u64 = 30;
    let start = store.durable().most();
    let began = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let run = RunId::new();
            let mut seen = Vec::new();
            for seq in 1..=COMMITS {
                let mut batch = WriteBatch::default();
                batch.push_event(event(run, seq, "app.load"));
                batch.set_active(run, seq % 2 == 0);
                let positions = store.commit(batch).await.expect("commit");
                // A later commit of one writer is later in the log.
                assert!(seen.last().is_none_or(|&last| positions[0] > last));
                seen.extend(positions);
            }
            (run, seen)
        }));
    }
    let mut by_position = HashMap::new();
    for task in tasks {
        let (run, positions) = task.await.expect("writer");
        for (i, position) in positions.into_iter().enumerate() {
            assert!(by_position.insert(position, (run, i as u64 + 1)).is_none());
        }
    }
    let elapsed = began.elapsed().as_secs_f64();
    let total = WRITERS as u64 * COMMITS;
    let mut positions: Vec<u64> = by_position.keys().copied().collect();
    positions.sort_unstable();
    assert_eq!(positions.len() as u64, total);
    assert!(positions[0] > start, "every position is new");
    assert_eq!(store.durable().most(), *positions.last().unwrap());
    // The log reads back in position order, each event where it was put.
    let log = store
        .log_after(&Cursor::at(start), total as usize)
        .await
        .unwrap();
    assert_eq!(log.len() as u64, total);
    for (i, event) in log.iter().enumerate() {
        assert_eq!(event.position, positions[i]);
        let (run, seq) = by_position[&event.position];
        assert_eq!(
            (event.run_id.as_slice(), event.seq),
            (&run.as_bytes()[..], seq)
        );
    }
    total as f64 / elapsed
}

/// Writers racing to append to one run: one wins each seq, the others get
/// a conflict naming the winner's seq, and the history never forks.
async fn racing_writers_conflict_and_never_fork(store: &SharedStore) {
    const WRITERS: usize = 8;
    const TARGET: u64 = 40;
    let run = RunId::new();
    let wins = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let (store, wins) = (store.clone(), wins.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            let mut conflicts = 0;
            while last < TARGET {
                let mut batch = WriteBatch::default();
                let mut e = event(run, last + 1, "app.race");
                e.actor_name = format!("writer-{writer}");
                batch.push_event(e);
                match store.commit(batch).await {
                    Ok(_) => {
                        last += 1;
                        wins.lock().unwrap().push((last, writer));
                    }
                    Err(StoreError::Conflict {
                        run: r,
                        expected,
                        actual,
                    }) => {
                        assert_eq!((r, expected), (run, last));
                        assert!(actual > last, "{actual} > {last}");
                        last = actual;
                        conflicts += 1;
                    }
                    Err(e) => panic!("unexpected: {e}"),
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await.expect("writer");
    }
    let events = store.run_events(run, 0, 1_000).await.unwrap();
    assert_eq!(seqs(&events), (1..=TARGET).collect::<Vec<_>>());
    let mut wins = wins.lock().unwrap().clone();
    wins.sort();
    assert_eq!(wins.len() as u64, TARGET, "one win per seq");
    for ((seq, writer), event) in wins.iter().zip(&events) {
        assert_eq!(event.seq, *seq);
        assert_eq!(event.actor_name, format!("writer-{writer}"));
    }
    assert!(conflicts > 0, "the writers never raced");
}

/// An idempotency record is written once: a later batch that records
/// another answer under the same key (a retry that reached another server,
/// or raced the first) is refused whole, its events with it, and the
/// first answer stands. Writers racing to record one key: one wins.
async fn a_recorded_answer_is_never_replaced(store: &SharedStore) {
    const SCOPE: &[u8] = b"signal/once";
    let first = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(event(first, 1, "app.note"));
    batch.put_request(SCOPE, "once", b"first".to_vec());
    store.commit(batch).await.expect("the first answer");

    let second = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(event(second, 1, "app.note"));
    batch.put_request(SCOPE, "once", b"second".to_vec());
    let refused = store.commit(batch).await;
    assert!(
        matches!(&refused, Err(StoreError::RequestRecorded { request_id }) if request_id == "once"),
        "a second answer was recorded: {refused:?}"
    );
    assert_eq!(
        store.request(SCOPE, "once").await.unwrap().as_deref(),
        Some(&b"first"[..])
    );
    assert!(
        store.run_events(second, 0, 10).await.unwrap().is_empty(),
        "the refused batch's event was written"
    );

    const WRITERS: usize = 8;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let run = RunId::new();
            let mut batch = WriteBatch::default();
            batch.push_event(event(run, 1, "app.race"));
            batch.put_request(SCOPE, "raced", vec![writer as u8]);
            (writer, run, store.commit(batch).await)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (writer, run, committed) = task.await.expect("writer");
        let written = store.run_events(run, 0, 10).await.unwrap().len();
        match committed {
            Ok(_) => {
                assert_eq!(written, 1);
                winners.push(writer);
            }
            Err(StoreError::RequestRecorded { .. }) => {
                assert_eq!(written, 0, "a refused batch's event was written")
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "writers {winners:?} each recorded an answer"
    );
    assert_eq!(
        store.request(SCOPE, "raced").await.unwrap(),
        Some(vec![winners[0] as u8])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_store_keeps_the_store_contract() {
    let (_dir, store) = embedded();
    round_trip_every_op_and_query(&store).await;
    grants_and_their_uses(&store).await;
    positions_unique_under_concurrent_writers(&store).await;
    racing_writers_conflict_and_never_fork(&store).await;
    a_recorded_answer_is_never_replaced(&store).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_postgres_store_keeps_the_store_contract() {
    let Some(db) = TestDb::create("the_postgres_store_keeps_the_store_contract").await else {
        return;
    };
    let store = db.open().await;
    round_trip_every_op_and_query(&store).await;
    grants_and_their_uses(&store).await;
    let rate = positions_unique_under_concurrent_writers(&store).await;
    eprintln!("postgres: {rate:.0} commits/s with 64 concurrent writers");
    racing_writers_conflict_and_never_fork(&store).await;
    a_recorded_answer_is_never_replaced(&store).await;
    store.close().await;
    let refused = store.commit(WriteBatch::default()).await;
    assert!(matches!(refused, Err(StoreError::Closed)), "{refused:?}");
    db.drop().await;
}

/// Figures: commits per second with 64 writers (more of them than the
/// contract test makes) and one writer's commit latency.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_commit_figures() {
    let Some(db) = TestDb::create("postgres_commit_figures").await else {
        return;
    };
    let store = db.open().await;
    let mut rates = Vec::new();
    for _ in 0..3 {
        rates.push(positions_unique_under_concurrent_writers(&store).await);
    }
    let run = RunId::new();
    let mut latencies = Vec::new();
    for seq in 1..=300 {
        let mut batch = WriteBatch::default();
        batch.push_event(event(run, seq, "app.one"));
        let began = Instant::now();
        store.commit(batch).await.expect("commit");
        latencies.push(began.elapsed());
    }
    latencies.sort();
    let mut reads = Vec::new();
    for _ in 0..300 {
        let began = Instant::now();
        store.run_events(run, 290, 10).await.expect("read");
        reads.push(began.elapsed());
    }
    reads.sort();
    eprintln!(
        "postgres: 64 writers {:?} commits/s; one writer p50 {:?} p99 {:?}; a read p50 {:?}",
        rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
        reads[reads.len() / 2],
    );
    store.close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_refused_batch_in_a_round_fails_alone() {
    let Some(db) = TestDb::create("one_refused_batch_in_a_round_fails_alone").await else {
        return;
    };
    let store = db.open().await;
    for _ in 0..5 {
        let start = store.durable().most();
        let mut tasks = Vec::new();
        for i in 0..64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let run = RunId::new();
                let mut batch = WriteBatch::default();
                let mut first = event(run, 1, "app.round");
                match i {
                    // PostgreSQL refuses a NUL in text.
                    10 => first.actor_name = "nul\u{0}".into(),
                    // Two events with one seq: the unique (run, seq) index
                    // refuses what the expected-seq check let through.
                    20 => batch.push_event(event(run, 1, "app.twin")),
                    _ => {}
                }
                batch.push_event(first);
                batch.put_tool(&format!("tool-{run}"), vec![1]);
                (i, run, store.commit(batch).await)
            }));
        }
        let mut committed = 0;
        for task in tasks {
            let (i, run, result) = task.await.expect("writer");
            match (i, result) {
                (10, Err(StoreError::Unavailable(cause))) => {
                    assert!(cause.contains("refused"), "{cause}")
                }
                (20, Err(StoreError::Conflict { run: r, .. })) => assert_eq!(r, run),
                (10 | 20, other) => panic!("batch {i}: {other:?}"),
                (_, Ok(positions)) => {
                    committed += 1;
                    assert_eq!(positions.len(), 1);
                    assert!(store.tool(&format!("tool-{run}")).await.unwrap().is_some());
                }
                (_, Err(e)) => panic!("a good batch failed: {e}"),
            }
        }
        assert_eq!(committed, 62);
        // Every good batch's event is in the log once, positions rising
        // (a round done again one by one takes new ones: gaps are allowed).
        let log = store.log_after(&Cursor::at(start), 100).await.unwrap();
        let positions: Vec<u64> = log.iter().map(|e| e.position).collect();
        assert_eq!(positions.len(), 62);
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
        assert_eq!(store.durable().most(), *positions.last().unwrap());
        assert!(*store.watch_writable().borrow());
    }
    store.close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reopened_store_keeps_everything_and_its_token_key() {
    let Some(db) = TestDb::create("a_reopened_store_keeps_everything_and_its_token_key").await
    else {
        return;
    };
    // Two servers starting at once agree on the schema and the key.
    let (first, second) = tokio::join!(PostgresStore::open(&db.url), PostgresStore::open(&db.url));
    let (first, second): (SharedStore, SharedStore) = (
        Arc::new(first.expect("open")),
        Arc::new(second.expect("open")),
    );
    assert_eq!(first.token_key(), second.token_key());
    let key = first.token_key();
    let run = RunId::new();
    let mut batch = WriteBatch::default();
    batch.put_run(&run_record(run, 1, "a", "alice"));
    batch.push_event(event(run, 1, "aaa.run.started"));
    batch.set_active(run, true);
    let positions = first.commit(batch).await.expect("commit");

    // The other server hears of the commit (NOTIFY, or the poll).
    let mut heard = second.watch_durable();
    tokio::time::timeout(WAIT, heard.wait_for(|p| *p >= positions[0]))
        .await
        .expect("the second store never heard of the commit")
        .expect("watch");
    first.close().await;
    second.close().await;
    drop((first, second));

    let store = db.open().await;
    assert_eq!(store.token_key(), key);
    assert_eq!(store.durable().most(), positions[0]);
    assert_eq!(store.active_runs(&Shards::all()).await.unwrap(), [run]);
    assert_eq!(seqs(&store.run_events(run, 0, 10).await.unwrap()), [1]);
    assert_eq!(
        store.run(run).await.unwrap().expect("run").task,
        "task of a"
    );
    store.close().await;
    db.drop().await;
}

/// Two deployments in two schemas of one database (`search_path` in the
/// URL; aaa creates the schema): each keeps its own positions, and one's
/// commits never move the other's durable position, though both hear the
/// same NOTIFY channel.
#[tokio::test(flavor = "multi_thread")]
async fn two_schemas_of_one_database_stay_apart() {
    let Some(db) = TestDb::create("two_schemas_of_one_database_stay_apart").await else {
        return;
    };
    let in_schema = |name: &str| aaa::store::postgres::in_schema(&db.url, name);
    let a: SharedStore = Arc::new(
        PostgresStore::open(&in_schema("team_a"))
            .await
            .expect("open a"),
    );
    let b: SharedStore = Arc::new(
        PostgresStore::open(&in_schema("team_b"))
            .await
            .expect("open b"),
    );
    let run = RunId::new();
    for seq in 1..=50 {
        let mut batch = WriteBatch::default();
        batch.push_event(event(run, seq, "app.note"));
        a.commit(batch).await.expect("commit to a");
    }
    let mut batch = WriteBatch::default();
    batch.push_event(event(RunId::new(), 1, "app.note"));
    assert_eq!(b.commit(batch).await.expect("commit to b"), [1]);
    // A third store on a's schema hears a's head; b never moved past its own.
    let a_again: SharedStore = Arc::new(
        PostgresStore::open(&in_schema("team_a"))
            .await
            .expect("open a again"),
    );
    assert_eq!(a_again.durable().most(), 50);
    assert_eq!(b.durable().most(), 1);
    assert_eq!(b.log_after(&Cursor::at(0), 100).await.unwrap().len(), 1);
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 51, "app.note"));
    a.commit(batch).await.expect("commit to a");
    let mut heard = a_again.watch_durable();
    tokio::time::timeout(WAIT, heard.wait_for(|_| a_again.durable().most() >= 51))
        .await
        .expect("a's other store never heard of the commit")
        .expect("watch");
    assert_eq!(b.durable().most(), 1, "b moved with a's commits");
    for store in [a, b, a_again] {
        store.close().await;
    }
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_newer_than_the_binary_is_refused_by_name() {
    let Some(db) = TestDb::create("a_schema_newer_than_the_binary_is_refused_by_name").await else {
        return;
    };
    let store = db.open().await;
    store.close().await;
    drop(store);
    db.sql("INSERT INTO aaa_schema (version) VALUES (99)").await;
    let error = PostgresStore::open(&db.url).await.err().expect("refused");
    assert!(matches!(error, StoreError::Format(_)), "{error}");
    assert!(
        error
            .to_string()
            .contains("the database schema is version 99; this aaa knows versions up to "),
        "{error}"
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsupported_scheme_and_an_unreachable_database_are_refused_without_the_password() {
    let mut settings = aaa::store::Settings::new(std::env::temp_dir());
    settings.url = Some("mysql://u:secret@db/aaa".into());
    let error = aaa::store::open(&settings).await.err().expect("refused");
    assert!(error.to_string().contains("u:***@db"), "{error}");
    assert!(!error.to_string().contains("secret"), "{error}");
    // Nothing listens on port 1.
    let url = "postgres://u:secret@127.0.0.1:1/aaa?sslmode=disable";
    let error = PostgresStore::open(url).await.err().expect("refused");
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert!(!error.to_string().contains("secret"), "{error}");
}

// ------------------------------------------------------------- the crash

/// A cluster of the test's own, made and driven by `.ci/postgres`; stopped
/// on drop.
pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    pub url: String,
}

fn ci_postgres(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/postgres");
    let out = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect(".ci/postgres");
    assert!(
        out.status.success(),
        ".ci/postgres {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Cluster {
    pub(crate) async fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().to_string_lossy().to_string();
        let url = tokio::task::spawn_blocking(move || ci_postgres(&["start", &path]))
            .await
            .expect("start");
        Cluster { dir, url }
    }

    /// A streaming replica of `primary`, which waits for it at each commit
    /// (synchronous replication).
    pub(crate) async fn replica_of(primary: &Cluster) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let from = primary.dir.path().to_string_lossy().to_string();
        let path = dir.path().to_string_lossy().to_string();
        let url = tokio::task::spawn_blocking(move || ci_postgres(&["replica", &from, &path]))
            .await
            .expect("replica");
        Cluster { dir, url }
    }

    /// `.ci/postgres ARGS[0] DIR ARGS[1..]` on this cluster.
    pub(crate) async fn run(&self, args: &'static [&'static str]) {
        let path = self.dir.path().to_string_lossy().to_string();
        tokio::task::spawn_blocking(move || {
            let mut all = vec![args[0], path.as_str()];
            all.extend(&args[1..]);
            ci_postgres(&all)
        })
        .await
        .expect(".ci/postgres");
    }
}

/// Sets PostgreSQL's `synchronous_standby_names` (through its admin URL),
/// reloads its configuration and returns once commits do (or no longer)
/// wait for a standby.
///
/// `pg_reload_conf()` only signals: commits start (or stop) waiting when
/// the checkpointer has reread the file, which may be after a commit that
/// follows at once. So probe commits are made until one is held (or one
/// is not).
pub(crate) async fn synchronous_standby(admin_url: &str, names: &str) {
    let (client, connection) = connect(admin_url).await;
    client
        .batch_execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        ))
        .await
        .expect("ALTER SYSTEM");
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("pg_reload_conf");
    let wanted = !names.is_empty();
    let give_up = tokio::time::Instant::now() + WAIT;
    while a_commit_waits_for_a_standby(admin_url, &client).await != wanted {
        assert!(
            tokio::time::Instant::now() < give_up,
            "synchronous_standby_names = '{names}' never took effect"
        );
    }
    drop(client);
    let _ = connection.await;
}

/// Makes a probe commit on a connection of its own and watches it from
/// `watcher`: true if PostgreSQL holds it for a synchronous standby (it
/// is then cancelled, which commits it locally), false if it ends.
async fn a_commit_waits_for_a_standby(admin_url: &str, watcher: &tokio_postgres::Client) -> bool {
    let (probe, connection) = connect(admin_url).await;
    let pid: i32 = probe
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")
        .get(0);
    // A commit waits only if it wrote something: a temporary table
    // writes to the catalog.
    let held = {
        let commit = probe.batch_execute("BEGIN; CREATE TEMP TABLE probe (x int); COMMIT");
        tokio::pin!(commit);
        let waiting = "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'";
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&pid];
        let held = loop {
            tokio::select! {
                ended = &mut commit => {
                    ended.expect("probe commit");
                    break false;
                }
                row = watcher.query_opt(waiting, &params) => {
                    if row.expect("pg_stat_activity").is_some() {
                        break true;
                    }
                }
            }
        };
        if held {
            watcher
                .execute("SELECT pg_cancel_backend($1)", &[&pid])
                .await
                .expect("pg_cancel_backend");
            commit
                .await
                .expect("a cancelled wait still commits locally");
        }
        held
    };
    drop(probe);
    let _ = connection.await;
    held
}

/// A commit whose outcome the store cannot know (PostgreSQL held it past
/// the round's timeout, here for a synchronous standby that never comes)
/// may land later. Commits notify other servers after their COMMIT, so
/// such a round's own notification is lost with its connection: once the
/// held commit has ended, the store notifies its shard itself (the runs
/// unknown), with no write coming to carry it. Without that, other
/// servers hear of it only from their next poll of the heads (and that
/// sends no notification, which is what this listens for).
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_whose_outcome_was_unknown_is_notified_once_it_has_ended() {
    if postgres().is_none() {
        return;
    }
    let database = Cluster::start().await;
    let store = PostgresStore::open(&database.url).await.expect("open");
    let (client, mut connection) = tokio_postgres::connect(&database.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let (heard, mut notifications) = tokio::sync::mpsc::unbounded_channel();
    let _listening = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Ok(tokio_postgres::AsyncMessage::Notification(n)) = message {
                let _ = heard.send(n.payload().to_string());
            }
        }
    }));
    let channel = aaa::store::postgres::NOTIFY_CHANNEL;
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .expect("LISTEN");
    let run = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 1, "aaa.run.started"));
    store.commit(batch).await.expect("commit");
    let first = tokio::time::timeout(WAIT, notifications.recv()).await;
    let first = first.expect("the commit was notified").expect("listening");
    assert!(first.contains(&format!(":{}=", run.shard())), "{first}");

    synchronous_standby(&database.url, "nobody").await;
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 2, "app.note"));
    let held = store.commit(batch).await;
    assert!(matches!(held, Err(StoreError::Unavailable(_))), "{held:?}");
    synchronous_standby(&database.url, "").await;
    let settled = format!("{}=", run.shard());
    let give_up = tokio::time::Instant::now() + WAIT;
    loop {
        let next = tokio::time::timeout_at(give_up, notifications.recv()).await;
        let payload = next
            .expect("the held commit's shard was never notified")
            .expect("listening");
        if payload.contains(&settled) && payload.ends_with(";*") {
            break;
        }
    }
    let events = store.run_events(run, 0, 10).await.expect("read");
    assert_eq!(events.len(), 2, "the held commit landed: {events:?}");
    store.close().await;
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let path = self.dir.path().to_string_lossy().to_string();
        let _ = std::panic::catch_unwind(|| ci_postgres(&["stop", &path, "immediate"]));
    }
}

/// Waits (bounded) until the store's writable flag is `wanted`.
async fn wait_writable(store: &SharedStore, wanted: bool) {
    let mut writable = store.watch_writable();
    tokio::time::timeout(WAIT, writable.wait_for(|w| *w == wanted))
        .await
        .unwrap_or_else(|_| panic!("writable never became {wanted}"))
        .expect("watch");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_of_postgres_loses_nothing_acknowledged_and_writes_resume() {
    if admin_url("a_crash_of_postgres_loses_nothing_acknowledged_and_writes_resume").is_none() {
        return;
    }
    let cluster = Cluster::start().await;
    let db = TestDb::create_on(&cluster.url).await;
    let store = db.open().await;

    // Writers append to their own runs until told to stop, keeping what was
    // acknowledged. A write whose outcome was unknown is found out by the
    // conflict its retry gets.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::<(RunId, u64, u64)>::new()));
    let refusals = Arc::new(Mutex::new(Vec::<String>::new()));
    // How many were acknowledged, for the test to wait on.
    let counted = Arc::new(tokio::sync::watch::channel(0usize).0);
    let mut writers = Vec::new();
    for _ in 0..16 {
        let (store, stop) = (store.clone(), stop.clone());
        let (acknowledged, refusals) = (acknowledged.clone(), refusals.clone());
        let counted = counted.clone();
        writers.push(tokio::spawn(async move {
            let run = RunId::new();
            let mut next = 1;
            while !stop.load(Ordering::Relaxed) {
                let mut batch = WriteBatch::default();
                batch.push_event(event(run, next, "app.crash"));
                match store.commit(batch).await {
                    Ok(positions) => {
                        acknowledged.lock().unwrap().push((run, next, positions[0]));
                        counted.send_modify(|n| *n += 1);
                        next += 1;
                    }
                    Err(StoreError::Conflict { actual, .. }) => next = actual + 1,
                    Err(StoreError::Unavailable(cause)) => {
                        refusals.lock().unwrap().push(cause);
                        tokio::task::yield_now().await;
                    }
                    Err(e) => panic!("unexpected: {e}"),
                }
            }
            run
        }));
    }
    tokio::time::timeout(WAIT, counted.subscribe().wait_for(|n| *n >= 300))
        .await
        .expect("fewer than 300 commits")
        .expect("the count");

    // Crash PostgreSQL under load.
    cluster.run(&["stop", "immediate"]).await;
    wait_writable(&store, false).await;
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for writer in writers {
        runs.push(writer.await.expect("writer"));
    }
    assert!(!refusals.lock().unwrap().is_empty());
    // While it is down, a write is refused, and soon.
    let began = Instant::now();
    let mut batch = WriteBatch::default();
    batch.put_tool("while-down", vec![1]);
    let refused = store.commit(batch).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "{refused:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(15));
    let read = store.run(runs[0]).await;
    assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");

    // Back up: the store says so by itself, with no write to try.
    cluster.run(&["restart"]).await;
    wait_writable(&store, true).await;

    // Every acknowledged commit is there, where it was said to be.
    let acknowledged = acknowledged.lock().unwrap().clone();
    let mut last_seq = HashMap::new();
    for &(run, seq, position) in &acknowledged {
        let event = store.event(run, seq).await.unwrap().expect("acknowledged");
        assert_eq!(event.position, position);
        let last = last_seq.entry(run).or_insert(0);
        *last = (*last).max(seq);
    }
    // Histories have no gap, and writes go on where they left off.
    for run in runs {
        let events = store.run_events(run, 0, 10_000).await.unwrap();
        let last = events.len() as u64;
        assert_eq!(seqs(&events), (1..=last).collect::<Vec<_>>());
        assert!(last >= last_seq.get(&run).copied().unwrap_or(0));
        let mut batch = WriteBatch::default();
        batch.push_event(event(run, last + 1, "app.after"));
        store
            .commit(batch)
            .await
            .expect("a write after the restart");
    }
    // Positions rise (rounds cut off by the crash left gaps), up to the
    // head, and no event is there twice.
    let head = store.durable().most();
    let log = store.log_after(&Cursor::at(0), 100_000).await.unwrap();
    let positions: Vec<u64> = log.iter().map(|e| e.position).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(positions.last().copied(), Some(head));
    store.close().await;
    drop(store);
    db.drop().await;
    drop(cluster);
}

// ------------------------------------------------------------- serving

/// PostgreSQL stopped (immediate) and started again under a serving aaa:
/// calls that need it answer UNAVAILABLE with STORAGE_UNAVAILABLE and the
/// cause, health says NOT_SERVING, then SERVING once the database is back
/// with no client write, and the run that waited finishes.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_rides_out_a_postgres_restart() {
    if admin_url("a_server_rides_out_a_postgres_restart").is_none() {
        return;
    }
    let cluster = Cluster::start().await;
    let url = cluster.url.clone();
    let server = TestServer::start_with(move |config| config.store_url = Some(url.clone())).await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    cluster.run(&["stop", "immediate"]).await;
    let status = expect_err(signal(&mut runs, &run_id, "app.note", serde_json::json!({})).await);
    assert_error(&status, tonic::Code::Unavailable, "STORAGE_UNAVAILABLE");
    wait_for_health(&server, ServingStatus::NotServing).await;

    cluster.run(&["restart"]).await;
    wait_for_health(&server, ServingStatus::Serving).await;
    grant_and_finish(&mut runs, &mut workers, &run_id, &call_id).await;
    let events = history(&mut runs, &run_id).await;
    assert_eq!(
        count(&events, "app.note"),
        0,
        "the refused signal was not written"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_runs_the_reference_scenario_on_postgres() {
    let Some(db) = TestDb::create("serve_runs_the_reference_scenario_on_postgres").await else {
        return;
    };
    let url = db.url.clone();
    let mut server =
        TestServer::start_with(move |config| config.store_url = Some(url.clone())).await;
    let mut runs = server.runs().await;
    let mut workers = server.workers().await;
    register(&mut workers, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let pending = list_approvals(
        &mut server.approvals().await,
        ListApprovalsRequest::default(),
    )
    .await;
    assert_eq!(pending.len(), 1);
    grant_and_finish(&mut runs, &mut workers, &run_id, &call_id).await;

    // A restart reads it all back from the database.
    server.restart().await;
    let events = history(&mut server.runs().await, &run_id).await;
    assert_eq!(types(&events), REFERENCE_TYPES);
    assert_dense(&events, 1);
    server.shutdown().await;
    db.drop().await;
}

// ------------------------------------------------------------------ TLS

#[tokio::test(flavor = "multi_thread")]
async fn sslmode_is_honoured_over_tls() {
    use std::os::unix::fs::PermissionsExt;
    if admin_url("sslmode_is_honoured_over_tls").is_none() {
        return;
    }
    let cluster = Cluster::start().await;
    let db = TestDb::create_on(&cluster.url).await;
    // A certificate for "localhost", in the data dir, readable by the
    // server only; then TLS on and plain TCP refused.
    let data = cluster.dir.path().join("data");
    crate::auth::make_pki(&data);
    let key = data.join("server.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    for file in ["ca.pem", "server.pem", "server.key"] {
        std::os::unix::fs::chown(data.join(file), Some(uid_of("postgres")), None).unwrap();
    }
    let hba = "local all all trust\nhostssl all all 127.0.0.1/32 trust\n";
    std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
    for sql in [
        "ALTER SYSTEM SET ssl = on",
        "ALTER SYSTEM SET ssl_cert_file = 'server.pem'",
        "ALTER SYSTEM SET ssl_key_file = 'server.key'",
    ] {
        admin(&cluster.url, sql).await;
    }
    // A restart (pg_ctl waits for it) rather than a reload, whose taking
    // effect nothing announces.
    cluster.run(&["stop"]).await;
    cluster.run(&["restart"]).await;
    let ca = data.join("ca.pem").display().to_string();
    let port = cluster
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let url = |host: &str, options: &str| {
        format!("postgres://postgres@{host}:{port}/{}?{options}", db.name)
    };
    let opens = |url: String| async move {
        match PostgresStore::open(&url).await {
            Ok(store) => {
                store.close().await;
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    };
    assert!(
        opens(url("127.0.0.1", "sslmode=disable")).await.is_err(),
        "plain text is refused by a TLS-only server"
    );
    opens(url("127.0.0.1", "sslmode=require"))
        .await
        .expect("require");
    opens(url("127.0.0.1", "sslmode=prefer"))
        .await
        .expect("prefer");
    let full = url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    opens(full).await.expect("verify-full, the right name");
    let ca_only = url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}"));
    opens(ca_only).await.expect("verify-ca");
    let wrong_name = url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let error = opens(wrong_name).await.expect_err("another name");
    assert!(error.contains("certificate"), "{error}");
    // Without our CA the system's roots do not trust it.
    let error = opens(url("localhost", "sslmode=verify-full"))
        .await
        .expect_err("an unknown CA");
    assert!(error.contains("certificate"), "{error}");
    drop(cluster);
}

fn uid_of(user: &str) -> u32 {
    let out = std::process::Command::new("id")
        .args(["-u", user])
        .output()
        .expect("id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a uid")
}

/// Two servers on one database: the one that started last, told to take
/// over, claims every run, and the first is fenced out. The write that
/// meets the fence is refused (nothing of it is written); from then on the
/// first stands by, forwarding every call to the second, which carries the
/// run to its end with nothing doubled.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_server_on_the_database_fences_the_first() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let on_url = |url: String| {
        move |config: &mut aaa::Config| {
            config.store_url = Some(url.clone());
            config.take_over = true;
        }
    };
    let first = TestServer::start_with(on_url(url.clone())).await;
    let mut first_runs = first.runs().await;
    register(&mut first.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut first_runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut first_runs, &run_id).await;

    let second = TestServer::start_with(on_url(url)).await;
    let note = signal(&mut first_runs, &run_id, "app.note", serde_json::json!({})).await;
    let status = expect_err(note);
    assert_error(&status, tonic::Code::Unavailable, "OWNERSHIP_LOST");
    assert!(status.message().contains("took over"), "{status:?}");

    // The same connection to the first server now reaches the second.
    let mut first_workers = first.workers().await;
    grant_and_finish(&mut first_runs, &mut first_workers, &run_id, &call_id).await;
    let another = start_run(&mut first_runs, scripted_reference_run()).await;
    let mut runs = second.runs().await;
    wait_for_approval(&mut runs, &another).await;

    let events = history(&mut runs, &run_id).await;
    assert_dense(&events, 1);
    assert_eq!(count(&events, "app.note"), 0, "a fenced write was kept");
    assert_eq!(count(&events, "aaa.approval.granted"), 1);
    assert_eq!(count(&events, "aaa.tool.started"), 1);
    wait_for_health(&second, ServingStatus::Serving).await;
    wait_for_health(&first, ServingStatus::Serving).await;
    first.shutdown().await;
    second.shutdown().await;
}

/// A claim of every shard, at once, with a lease longer than any test.
const CLAIM_ALL: aaa::store::Claim = aaa::store::Claim {
    lease: Duration::from_secs(60),
    standby: false,
};

/// At the store: after a second store claims the runs, the first commits
/// nothing that touches a run (by event or by index op), and the batches
/// around it in the same round are not held back; writes that touch no
/// run (a tool) still go through.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_fences_the_previous_owner_at_commit() {
    let Some(db) = TestDb::create("a_claim_fences_the_previous_owner_at_commit").await else {
        return;
    };
    let (first, second) = (db.open().await, db.open().await);
    let claim = CLAIM_ALL;
    first.claim_runs("first", claim).await.expect("claim");
    let run = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 1, "aaa.run.started"));
    first.commit(batch).await.expect("the owner writes");

    second.claim_runs("second", claim).await.expect("claim");
    let fenced = |result: Result<Vec<u64>, StoreError>, expected: u8| match result {
        Err(StoreError::Fenced {
            shard,
            held,
            current,
        }) => {
            assert_eq!(shard, expected);
            assert!(current > held, "{current} > {held}");
        }
        other => panic!("expected Fenced, got {other:?}"),
    };
    let mut by_event = WriteBatch::default();
    by_event.push_event(event(run, 2, "app.late"));
    let mut by_op = WriteBatch::default();
    by_op.set_active(run, true);
    // A consumer group's cursor moves only at the owner of its shard.
    let mut group = WriteBatch::default();
    group.put_group(&aaa::store::GroupRecord {
        name: "audit".into(),
        cursor: 7,
        ..Default::default()
    });
    let mut tool = WriteBatch::default();
    tool.put_tool("t", b"x".to_vec());
    let (a, b, c, d) = tokio::join!(
        first.commit(by_event),
        first.commit(by_op),
        first.commit(group),
        first.commit(tool)
    );
    fenced(a, run.shard());
    fenced(b, run.shard());
    fenced(c, aaa::domain::group_shard("audit"));
    d.expect("a write that touches no run or group");
    assert!(second.group("audit").await.unwrap().is_none());
    // Fenced out, it holds nothing (and stands by: see
    // failover::a_server_fenced_after_a_database_outage_stands_by_and_takes_over_again).
    assert!(
        first.held_shards().borrow().is_empty(),
        "a fenced store holds nothing"
    );

    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 2, "app.note"));
    second.commit(batch).await.expect("the new owner writes");
    assert_eq!(seqs(&second.run_events(run, 0, 10).await.unwrap()), [1, 2]);
    assert_eq!(
        second.run_events(run, 1, 1).await.unwrap()[0].event_type,
        "app.note"
    );
    assert!(second.active_runs(&Shards::all()).await.unwrap().is_empty());
    first.close().await;
    second.close().await;
    db.drop().await;
}

/// The owner of every shard answers reads of its newest events from
/// memory (the store's tail), exactly as the database would: the same
/// records, with the table out of the way too; and a commit of another
/// writer is never hidden by it.
#[tokio::test(flavor = "multi_thread")]
async fn the_owner_reads_its_newest_events_from_memory_as_the_database_has_them() {
    let Some(db) = TestDb::create("the_owner_reads_its_newest_events_from_memory").await else {
        return;
    };
    let (owner, other) = (db.open().await, db.open().await);
    let claim = CLAIM_ALL;
    owner.claim_runs("owner", claim).await.expect("claim");
    let (a, b) = (RunId::new(), RunId::new());
    for seq in 1..=3 {
        let mut batch = WriteBatch::default();
        batch.push_event(event(a, seq, "app.a"));
        batch.push_event(event(b, seq, "app.b"));
        owner.commit(batch).await.expect("commit");
    }
    let head = owner.durable().most();
    // `other` claimed nothing, so it reads the database.
    for run in [a, b] {
        for after in 0..=3 {
            assert_eq!(
                owner.run_events(run, after, 10).await.unwrap(),
                other.run_events(run, after, 10).await.unwrap(),
                "run_events({run}, {after})"
            );
        }
        assert_eq!(
            owner.event(run, 2).await.unwrap(),
            other.event(run, 2).await.unwrap()
        );
    }
    for after in 0..=head {
        assert_eq!(
            owner.log_after(&Cursor::at(after), 4).await.unwrap(),
            other.log_after(&Cursor::at(after), 4).await.unwrap(),
            "log_after({after})"
        );
    }

    // With the table renamed away, the owner still answers (from memory)
    // and a reader of the database cannot.
    db.sql("ALTER TABLE aaa_events RENAME TO aaa_events_away")
        .await;
    assert_eq!(seqs(&owner.run_events(a, 0, 10).await.unwrap()), [1, 2, 3]);
    assert_eq!(owner.log_after(&Cursor::at(0), 100).await.unwrap().len(), 6);
    assert!(other.run_events(a, 0, 10).await.is_err());
    db.sql("ALTER TABLE aaa_events_away RENAME TO aaa_events")
        .await;

    // Another writer's commit (no claim, so not fenced: as during a
    // takeover) moves the head past the tail: the owner reads it from the
    // database once it has heard of it, and never answers without it.
    let mut batch = WriteBatch::default();
    batch.push_event(event(a, 4, "app.other"));
    let position = other.commit(batch).await.expect("commit")[0];
    let mut durable = owner.watch_durable();
    tokio::time::timeout(
        Duration::from_secs(10),
        durable.wait_for(|_| owner.durable().most() >= position),
    )
    .await
    .expect("the owner hears of the commit")
    .expect("the store is open");
    assert_eq!(seqs(&owner.run_events(a, 2, 10).await.unwrap()), [3, 4]);
    assert_eq!(
        owner.log_after(&Cursor::at(head), 10).await.unwrap().len(),
        1
    );
    // The owner's next commit in that shard finds the head moved under it
    // and lets the tail go: the other writer's event is not hidden behind
    // the owner's newer one (a round that took its shards' heads from what
    // its own rounds left, not from the database, answered 1 event here).
    let mut batch = WriteBatch::default();
    batch.push_event(event(a, 5, "app.a"));
    owner.commit(batch).await.expect("commit");
    let past_head = owner.log_after(&Cursor::at(head), 10).await.unwrap();
    let types: Vec<&str> = past_head.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["app.other", "app.a"]);
    assert_eq!(seqs(&owner.run_events(a, 3, 10).await.unwrap()), [4, 5]);
    owner.close().await;
    other.close().await;
    db.drop().await;
}

/// An owner whose leases may have lapsed (here: a lease of nothing) reads
/// the database, not its memory: another server may have claimed the runs
/// and written them meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn an_owner_whose_lease_may_have_lapsed_reads_the_database() {
    let Some(db) = TestDb::create("an_owner_whose_lease_may_have_lapsed").await else {
        return;
    };
    let owner = db.open().await;
    let claim = aaa::store::Claim {
        lease: Duration::ZERO,
        standby: false,
    };
    owner.claim_runs("owner", claim).await.expect("claim");
    let run = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 1, "app.a"));
    owner.commit(batch).await.expect("commit");
    assert_eq!(seqs(&owner.run_events(run, 0, 10).await.unwrap()), [1]);
    db.sql("ALTER TABLE aaa_events RENAME TO aaa_events_away")
        .await;
    assert!(owner.run_events(run, 0, 10).await.is_err());
    assert!(owner.log_after(&Cursor::at(0), 10).await.is_err());
    db.sql("ALTER TABLE aaa_events_away RENAME TO aaa_events")
        .await;
    owner.close().await;
    db.drop().await;
}

/// A standby server takes the runs over when the serving one stops
/// renewing its claim (here: paused with SIGSTOP, as a long GC pause or a
/// partition would); the paused one, woken, is fenced out: nothing of it
/// written after the takeover; it stands by again, and the calls it still
/// gets are forwarded to the new owner.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_takes_over_and_the_paused_server_is_fenced_when_it_wakes() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let OwnerAndStandby {
        first,
        second,
        run_id,
        call_id,
        ..
    } = &owner_and_standby(&url).await;

    first.signal(libc::SIGSTOP);
    let paused_at = Instant::now();
    wait_until_owner(second, &member_of(second).await).await;
    eprintln!(
        "the standby owned the runs {:?} after the pause",
        paused_at.elapsed()
    );
    let (mut runs, mut workers) = (second.runs().await, second.workers().await);
    // The new owner may still be starting its engine: retry as the SDKs do.
    grant_retrying(&runs, run_id, call_id).await;
    finish_granted(&mut runs, &mut workers, run_id).await;

    first.signal(libc::SIGCONT);
    first.wait_for_log_line("standing by again").await;
    wait_for_health(first, ServingStatus::Serving).await;
    let mut stale = first.runs().await;
    signal(&mut stale, run_id, "app.note", serde_json::json!({}))
        .await
        .expect_err("the run has ended, wherever the call lands");
    let events = history(&mut runs, run_id).await;
    assert_dense(&events, 1);
    assert_eq!(count(&events, "app.note"), 0);
    assert_eq!(count(&events, "aaa.tool.started"), 1);
    assert!(is_terminal(&events.last().unwrap().r#type));
    let forwarded = start_run(&mut stale, scripted_reference_run()).await;
    wait_for_approval(&mut runs, &forwarded).await;
    wait_for_health(second, ServingStatus::Serving).await;
}

/// A server whose engine cannot start on the shards it just claimed (here
/// the standby taking over, with one of the tables it recovers from out of
/// the way) keeps the shards and tries the start again until it serves
/// them, with no change of shards needed. (It used to exit instead.)
#[tokio::test(flavor = "multi_thread")]
async fn an_engine_that_cannot_start_is_started_again() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let OwnerAndStandby {
        first,
        second,
        run_id,
        call_id,
        ..
    } = &owner_and_standby(&url).await;

    let database = aaa::store::postgres::connect(&url).await.expect("connect");
    database
        .batch_execute("ALTER TABLE aaa_active RENAME TO aaa_active_away")
        .await
        .expect("rename");
    first.signal(libc::SIGKILL);
    second.wait_for_log_line("cannot serve shards").await;
    // It holds the runs (a call for them would wait for an engine, then be
    // answered UNAVAILABLE), and it did not stop.
    assert_eq!(owner(second).await, Some(member_of(second).await));
    let (mut runs, mut workers) = (second.runs().await, second.workers().await);

    database
        .batch_execute("ALTER TABLE aaa_active_away RENAME TO aaa_active")
        .await
        .expect("rename back");
    grant_retrying(&runs, run_id, call_id).await;
    finish_granted(&mut runs, &mut workers, run_id).await;
    wait_for_health(second, ServingStatus::Serving).await;
}

/// Two servers on one store (lease 1 s): the first owns the runs and has
/// one parked at the reference approval; the second stands by.
struct OwnerAndStandby {
    /// The servers' data dirs, kept while they run.
    _dirs: [tempfile::TempDir; 2],
    first: ChildServer,
    second: ChildServer,
    run_id: String,
    call_id: String,
}

async fn owner_and_standby(url: &str) -> OwnerAndStandby {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let store = format!("--store={url}");
    let args = one_owner_args(&store, "1");
    let first = ChildServer::start_args(dirs[0].path(), &args).await;
    let mut runs = first.runs().await;
    register(&mut first.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let standby = [&args[..], &["--standby"]].concat();
    let second = ChildServer::start_args(dirs[1].path(), &standby).await;
    assert_eq!(owner(&second).await, Some(member_of(&first).await));
    OwnerAndStandby {
        _dirs: dirs,
        first,
        second,
        run_id,
        call_id,
    }
}

/// Servers started plainly on one database share the shards out (the
/// default), and the two ways are never mixed: a server asking for one
/// owner is refused by a spreading cluster, and a plain one by one
/// owner's, each naming what to do, before it serves anything.
#[tokio::test(flavor = "multi_thread")]
async fn plain_servers_share_the_shards_out_and_never_mix_with_one_owner() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let store = format!("--store={url}");
    let plain = ["--listen", "127.0.0.1:0", &store, "--lease-s", "1"];
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let first = ChildServer::start_args(dirs[0].path(), &plain).await;
    let second = ChildServer::start_args(dirs[1].path(), &plain).await;
    let names = [member_of(&first).await, member_of(&second).await];
    wait_until_spread(&first, &[&names[0], &names[1]]).await;
    let status = cluster_of(&second).await;
    assert!(status.members.iter().all(|m| m.spreads), "{status:?}");
    for flag in ["--one-owner", "--standby", "--take-over"] {
        let output = serve_refused(dirs[2].path(), &[&plain[..], &[flag]].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{flag}: {stderr}");
        assert!(
            stderr.contains("share the shards out")
                && stderr.contains("without --one-owner, --standby or --take-over"),
            "{flag}: {stderr}"
        );
    }
    wait_until_spread(&first, &[&names[0], &names[1]]).await;
    drop((first, second));

    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let store = format!("--store={url}");
    let plain = ["--listen", "127.0.0.1:0", &store, "--lease-s", "1"];
    let one =
        ChildServer::start_args(dirs[3].path(), &[&plain[..], &["--one-owner"]].concat()).await;
    let output = serve_refused(dirs[2].path(), &plain);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("run with one owner") && stderr.contains("start this one with --one-owner"),
        "{stderr}"
    );
    assert_eq!(
        owner(&one).await,
        Some(member_of(&one).await),
        "the owner went on"
    );
    let status = cluster_of(&one).await;
    assert!(status.members.iter().all(|m| !m.spreads), "{status:?}");
}

/// Joining one owner's cluster is safe: a server started with
/// `--one-owner` (not `--standby`) on a database whose runs another server
/// holds live stands by (the owner keeps writing), and takes nothing until
/// told to: `--take-over` takes every shard at once and fences the running
/// owner.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_joining_a_live_owner_stands_by_unless_told_to_take_over() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let store = format!("--store={url}");
    let args = one_owner_args(&store, "1");
    let first = ChildServer::start_args(dirs[0].path(), &args).await;
    let first_name = member_of(&first).await;
    let mut runs = first.runs().await;
    register(&mut first.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    let second = ChildServer::start_args(dirs[1].path(), &args).await;
    assert_eq!(
        owner(&second).await,
        Some(first_name.clone()),
        "a server joining without --take-over took the runs"
    );
    signal(&mut runs, &run_id, "app.note", serde_json::json!({}))
        .await
        .expect("the owner still writes");
    wait_for_health(&first, ServingStatus::Serving).await;
    wait_for_health(&second, ServingStatus::Serving).await;

    let take_over = [&args[..], &["--take-over"]].concat();
    let third = ChildServer::start_args(dirs[2].path(), &take_over).await;
    assert_eq!(owner(&third).await, Some(member_of(&third).await));
    let mut through_second = second.runs().await;
    grant_retrying(&through_second, &run_id, &call_id).await;
    let events = finish_granted(&mut through_second, &mut third.workers().await, &run_id).await;
    assert_eq!(count(&events, "app.note"), 1);
    assert_eq!(count(&events, "aaa.tool.started"), 1);
}

/// A lone server killed (-9) and started again the plain way (no flag) on
/// its database serves the runs within one lease: it stands by while its
/// dead predecessor's claim is live, and takes the runs once it lapses.
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_server_restarted_after_kill_9_serves_within_a_lease() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let store = format!("--store={url}");
    let lease = Duration::from_secs(2);
    let args = ["--listen", "127.0.0.1:0", &store, "--lease-s", "2"];
    let first = ChildServer::start_args(dirs[0].path(), &args).await;
    let mut runs = first.runs().await;
    register(&mut first.workers().await, vec![wire_money()], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    first.kill9();
    let killed_at = Instant::now();
    let again = ChildServer::start_args(dirs[1].path(), &args).await;
    wait_until_owner(&again, &member_of(&again).await).await;
    let (mut runs, mut workers) = (again.runs().await, again.workers().await);
    grant_retrying(&runs, &run_id, &call_id).await;
    let served_after = killed_at.elapsed();
    eprintln!("the restarted server served the runs {served_after:?} after the kill");
    // One lease, and the start of a process and an engine on a busy machine.
    assert!(
        served_after < lease + Duration::from_secs(3),
        "{served_after:?}"
    );
    finish_granted(&mut runs, &mut workers, &run_id).await;
}

/// A server that lost its shards but has not noticed yet (another server
/// took them over a moment ago, and its next renewal is a third of a long
/// lease away) gets the worker's result for the attempt the new owner
/// handed out. Its cached view of the run knows no such attempt; it must
/// not refuse it as stale (the worker would drop a result that counts):
/// it answers UNAVAILABLE, and the worker's retry reaches the owner.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_lost_its_shards_unnoticed_never_calls_the_current_attempt_stale() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let store = format!("--store={url}");
    // Renewals every 20 s: the first server notices nothing in this test.
    let args = one_owner_args(&store, "60");
    let first = ChildServer::start_args(dirs[0].path(), &args).await;
    let mut runs = first.runs().await;
    register(&mut first.workers().await, vec![lookup()], &[]).await;
    let run_id = start_run(&mut runs, scripted_run("lookup", "{}")).await;
    wait_for_event(&mut runs, &run_id, "aaa.tool.requested").await;

    let take_over = [&args[..], &["--take-over"]].concat();
    let second = ChildServer::start_args(dirs[1].path(), &take_over).await;
    assert_eq!(owner(&second).await, Some(member_of(&second).await));
    let workers = second.workers().await;
    let task = retrying(|| {
        let mut workers = workers.clone();
        async move { Ok(poll_until_task(&mut workers, "w", &["lookup"], &[]).await) }
    })
    .await;
    // (Had it noticed, it would forward the call to the owner, which is as
    // good; with its renewal far off, it has not.) A heartbeat is not told
    // the attempt is over either: the worker would abandon the tool.
    let mut at_first = first.workers().await;
    let heartbeat = at_first
        .heartbeat_task(aaa::proto::HeartbeatTaskRequest {
            token: task.token.clone(),
        })
        .await;
    assert_error(
        &expect_err(heartbeat),
        tonic::Code::Unavailable,
        "OWNERSHIP_LOST",
    );
    let at_stale = complete_tool(&mut at_first, &task.token, "{}").await;
    assert_error(
        &expect_err(at_stale),
        tonic::Code::Unavailable,
        "OWNERSHIP_LOST",
    );
    retrying(|| {
        let (mut workers, token) = (workers.clone(), task.token.clone());
        async move { complete_tool(&mut workers, &token, "{}").await }
    })
    .await;
    let events = wait_for_end(&mut second.runs().await, &run_id).await;
    assert_eq!(count(&events, "aaa.tool.completed"), 1);
    assert_eq!(count(&events, "aaa.tool.started"), 1);
}

/// The cluster's flags mean nothing on the embedded store, which belongs
/// to one server: each is refused by name rather than ignored.
#[test]
fn cluster_flags_without_a_database_are_refused() {
    for flag in ["--one-owner", "--standby", "--take-over", "--spread-shards"] {
        let dir = tempfile::tempdir().unwrap();
        let output = serve_refused(dir.path(), &["--listen", "127.0.0.1:0", flag]);
        assert_eq!(output.status.code(), Some(64), "{flag}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{flag} needs --store postgres://")),
            "{flag}: {stderr}"
        );
    }
}

/// A standby's claim waits while the owner holds the runs, and goes
/// through as soon as the owner closes its store (a graceful stop hands the
/// runs over without waiting for the lease).
#[tokio::test(flavor = "multi_thread")]
async fn a_closing_owner_hands_the_runs_to_the_standby_at_once() {
    let Some(db) = TestDb::create("a_closing_owner_hands_the_runs_to_the_standby_at_once").await
    else {
        return;
    };
    // A lease far longer than the test: only the hand-over can end the wait.
    let lease = Duration::from_secs(600);
    let (owner, standby) = (db.open().await, db.open().await);
    let claim = move |standby| aaa::store::Claim { lease, standby };
    owner
        .claim_runs("owner", claim(false))
        .await
        .expect("claim");
    let waiting = {
        let standby = standby.clone();
        tokio::spawn(async move { standby.claim_runs("standby", claim(true)).await })
    };
    let run = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 1, "aaa.run.started"));
    owner
        .commit(batch)
        .await
        .expect("the owner writes while the standby waits");
    assert!(!waiting.is_finished(), "the standby claimed a live claim");

    owner.close().await;
    tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the standby still waits after the hand-over")
        .expect("task")
        .expect("claim");
    let mut batch = WriteBatch::default();
    batch.push_event(event(run, 2, "app.note"));
    standby.commit(batch).await.expect("the new owner writes");
    standby.close().await;
    db.drop().await;
}

/// The schema's migrations before the log was partitioned (versions 1-8).
const BEFORE_PARTITIONS: [&str; 8] = [
    include_str!("../../src/store/postgres/migrations/0001_init.sql"),
    include_str!("../../src/store/postgres/migrations/0002_actor_principal.sql"),
    include_str!("../../src/store/postgres/migrations/0003_shards.sql"),
    include_str!("../../src/store/postgres/migrations/0004_members.sql"),
    include_str!("../../src/store/postgres/migrations/0005_reviews.sql"),
    include_str!("../../src/store/postgres/migrations/0006_token_usage.sql"),
    include_str!("../../src/store/postgres/migrations/0007_grants.sql"),
    include_str!("../../src/store/postgres/migrations/0008_retention.sql"),
];

/// A database written before the log was partitioned by shard (schema 8:
/// one head row, positions in commit order across the log) upgrades in
/// place: its events keep their positions, an old cursor (one position)
/// still reads exactly what came after it, a group's old cursor holds in
/// every shard, and new commits take positions after the old head.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_from_before_the_partitioned_log_keeps_its_positions_and_cursors() {
    let Some(db) = TestDb::create("a_database_from_before_the_partitioned_log").await else {
        return;
    };
    for (i, sql) in BEFORE_PARTITIONS.iter().enumerate() {
        db.sql(sql).await;
        db.sql(&format!(
            "INSERT INTO aaa_schema (version) VALUES ({})",
            i + 1
        ))
        .await;
    }
    let (a, b) = (RunId::new(), RunId::new());
    for (position, run, seq) in [(1, a, 1), (2, b, 1), (3, a, 2)] {
        db.sql(&format!(
            "INSERT INTO aaa_events (position, run_id, seq, id, type, data, time_ms, \
             actor_kind, actor_name, actor_principal) VALUES ({position}, '{run}', {seq}, \
             '\\x00', 'app.old', '{{}}', 1, 3, 'alice', '')"
        ))
        .await;
    }
    db.sql("UPDATE aaa_head SET position = 3").await;
    db.sql(
        "INSERT INTO aaa_groups (name, event_types, labels, ack_timeout_ms, max_deliveries, \
         cursor, created_ms) VALUES ('old', '[\"app.*\"]', '{}', 30000, 5, 2, 0)",
    )
    .await;

    let store = db.open().await;
    let positions =
        |events: Vec<EventRecord>| -> Vec<u64> { events.iter().map(|e| e.position).collect() };
    let all = store.log_after(&Cursor::start(), 10).await.unwrap();
    assert_eq!(positions(all), [1, 2, 3]);
    let after_two = store.log_after(&Cursor::at(2), 10).await.unwrap();
    assert_eq!(
        positions(after_two),
        [3],
        "an old cursor reads what came after it"
    );
    let group = store.group("old").await.unwrap().expect("the old group");
    assert_eq!(group.log_cursor(), Cursor::at(2));
    let mut batch = WriteBatch::default();
    batch.push_event(event(b, 2, "app.new"));
    let given = store
        .commit(batch)
        .await
        .expect("a commit after the upgrade");
    assert!(
        given[0] > 3,
        "new positions come after the old head: {given:?}"
    );
    let after_old_head = store.log_after(&Cursor::at(3), 10).await.unwrap();
    assert_eq!(positions(after_old_head), given);
    assert_eq!(store.durable().most(), given[0]);
    store.close().await;
    db.drop().await;
}

/// A run in `shard` (its id's last byte).
fn run_in_shard(shard: u8) -> RunId {
    loop {
        let run = RunId::new();
        if run.shard() == shard {
            return run;
        }
    }
}

/// Commits of disjoint shards never wait for each other: while another
/// transaction holds shard 7's lock (as a commit round of another server
/// does), a commit to a run of shard 9 lands, and one to a run of shard 7
/// waits for it, then lands.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_waits_only_for_the_shards_it_touches() {
    let Some(db) = TestDb::create("a_commit_waits_only_for_the_shards_it_touches").await else {
        return;
    };
    let store = db.open().await;
    let holder = aaa::store::postgres::connect(&db.url)
        .await
        .expect("connect");
    holder
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(1633771891, 7)")
        .await
        .expect("hold shard 7's lock");
    let one_event = |run: RunId| {
        let mut batch = WriteBatch::default();
        batch.push_event(event(run, 1, "app.note"));
        batch
    };
    tokio::time::timeout(WAIT, store.commit(one_event(run_in_shard(9))))
        .await
        .expect("a commit of shard 9 waited for shard 7's holder")
        .expect("commit");
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.commit(one_event(run_in_shard(7))).await }
    });
    let watcher = aaa::store::postgres::connect(&db.url)
        .await
        .expect("connect");
    let blocked = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    tokio::time::timeout(WAIT, async {
        while watcher
            .query_one(blocked, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the commit of shard 7 never waited for its lock");
    assert!(!waiting.is_finished());
    holder.batch_execute("COMMIT").await.expect("release");
    let given = waiting.await.expect("task").expect("the commit of shard 7");
    assert_eq!(store.durable().after(7), given[0]);
    store.close().await;
    db.drop().await;
}
