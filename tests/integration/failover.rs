//! Failover under load (these tests need PostgreSQL: they pass without
//! doing anything otherwise). Three servers and a hundred runs, half of
//! them gated. A worker, a consumer group, a StreamEvents follower and a
//! WatchApprovals watcher are all attached to servers that do not own the
//! runs. The owner is killed (-9), or paused (SIGSTOP) and woken once
//! another server has taken its runs over.
//!
//! Afterwards: every run completes; each attempt starts once and runs at
//! most once; seqs and global positions are dense; every acknowledged grant
//! is in its place; the group, the follower and the watcher saw what the
//! new owner wrote. An owner that wakes from a pause is fenced: it writes
//! nothing more.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aaa::proto::subscription_service_client::SubscriptionServiceClient;
use aaa::proto::{
    stream_events_response, subscribe_request, subscribe_response, watch_approvals_response, Ack,
    Event, PollTaskRequest, StartFrom, StartRunRequest, StreamEventsRequest, SubscribeRequest,
    SubscriptionOpen, ToolDefinition, WatchApprovalsRequest,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::postgres::Cluster;
use crate::support::*;

/// Runs in all; every other one is gated.
const RUNS: usize = 100;
/// Runs started before the outage; half of their gated calls are granted
/// just before it, so their tools run while the owner goes away.
const BEFORE: usize = 60;
/// The tools' attempt lease. A PollTask whose answer the owner had
/// committed but not yet sent when it died leaves an attempt no worker
/// holds; it is lost (AttemptLost, the gated default) once this lapses.
/// Not less: on a busy machine a worker's retries across a restart must
/// not outlast it.
const ATTEMPT_LEASE_S: f64 = 10.0;
/// The consumer group's subscription: every run lifecycle event.
const GROUP_TYPES: &str = "aaa.run.";

#[derive(Clone, Copy, Debug)]
enum Outage {
    Kill,
    Pause,
}

/// How the servers hold the shards.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shards {
    /// One owns them all; the others stand by.
    OneOwner,
    /// Shared out among the three (`--spread-shards`).
    Spread,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_owner_loses_nothing_under_load() {
    failover(Outage::Kill, Shards::OneOwner).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_owner_is_fenced_when_it_wakes() {
    failover(Outage::Pause, Shards::OneOwner).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_spread_shards_a_killed_owner_loses_nothing_under_load() {
    failover(Outage::Kill, Shards::Spread).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_spread_shards_a_paused_owner_is_fenced_when_it_wakes() {
    failover(Outage::Pause, Shards::Spread).await;
}

/// Three servers: the one to kill or pause (the owner, or the one holding
/// the most shards) first.
async fn three_servers(url: &str, shards: Shards) -> (Vec<tempfile::TempDir>, [ChildServer; 3]) {
    let (dirs, mut servers) = match shards {
        Shards::OneOwner => cluster_members(url, 3, "1").await,
        Shards::Spread => spread_members(url, 3, "1").await,
    };
    let cluster = cluster_of(&servers[0]).await;
    let mut most = 0;
    for (i, server) in servers.iter().enumerate() {
        let name = member_of(server).await;
        let held = |n: &str| {
            cluster
                .members
                .iter()
                .find(|m| m.server == n)
                .map_or(0, |m| m.shards)
        };
        if held(&name) > held(&member_of(&servers[most]).await) {
            most = i;
        }
    }
    servers.swap(0, most);
    let Ok(servers) = <[ChildServer; 3]>::try_from(servers) else {
        unreachable!("three servers")
    };
    (dirs, servers)
}

async fn failover(outage: Outage, shards: Shards) {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let (_dirs, [first, second, third]) = three_servers(&url, shards).await;
    register(&mut second.workers().await, failover_tools(), &[]).await;

    // Everyone attaches to a standby: the worker to the second, the group,
    // the watcher and (later) the follower to the third.
    let executed = Seen::<Executed>::new();
    let delivered = Seen::<BTreeSet<(String, u64)>>::new();
    let watched = Seen::<Watched>::new();
    let followed = Seen::<Vec<Event>>::new();
    let (at_second, at_third) = (AddressList::new(&[&second]), AddressList::new(&[&third]));
    let mut background = Background(vec![
        tokio::spawn(serve_tools(at_second.clone(), executed.clone())),
        tokio::spawn(consume(at_third.clone(), delivered.clone())),
        tokio::spawn(watch_approvals_of(at_third.clone(), watched.clone())),
    ]);
    watched
        .wait_until("the watcher's snapshot", |w| w.position.is_some())
        .await;

    let mut runs = third.runs().await;
    let mut started = Vec::new();
    for i in 0..BEFORE {
        // Retried as the SDKs do: with spread shards, a shard may be
        // between owners for a moment (OWNER_UNAVAILABLE).
        let request = run_request(i);
        let run_id = retrying(|| {
            let (mut runs, request) = (runs.clone(), request.clone());
            async move { runs.start_run(request).await }
        })
        .await
        .into_inner()
        .run_id;
        started.push((run_id, is_gated(i)));
    }
    let mut waiting = Vec::new();
    for (run_id, _) in started.iter().filter(|(_, gated)| *gated) {
        waiting.push((run_id.clone(), wait_for_approval(&mut runs, run_id).await));
    }
    let mut granted = Vec::new();
    for (run_id, call_id) in waiting.drain(..waiting.len() / 2) {
        let seq = runs
            .signal(grant_request(&run_id, &call_id))
            .await
            .expect("grant before the outage")
            .into_inner()
            .seq;
        granted.push((run_id, call_id, seq));
    }
    let followed_run = waiting[0].0.clone();
    background.0.push(tokio::spawn(follow(
        at_third,
        followed_run.clone(),
        followed.clone(),
    )));

    let outage_at = Instant::now();
    let paused = match outage {
        Outage::Kill => {
            first.kill9();
            None
        }
        Outage::Pause => {
            first.signal(libc::SIGSTOP);
            Some(first)
        }
    };

    // The rest goes through the second server, retried as the SDKs do.
    let after = Seen::<Vec<(String, bool)>>::new();
    start_runs(at_second.clone(), after.clone(), BEFORE..RUNS).await;
    started.extend(after.read(Vec::clone));
    let runs = second.runs().await;
    for (run_id, _) in started[BEFORE..].iter().filter(|(_, gated)| *gated) {
        let call_id = watched
            .wait_until("a request of a run started after the outage", |w| {
                w.requested.iter().any(|(run, _)| run == run_id)
            })
            .await
            .requested
            .iter()
            .find(|(run, _)| run == run_id)
            .map(|(_, call)| call.clone())
            .unwrap();
        waiting.push((run_id.clone(), call_id));
    }
    for (run_id, call_id) in waiting {
        let seq = retrying(|| {
            let (mut runs, request) = (runs.clone(), grant_request(&run_id, &call_id));
            async move { runs.signal(request).await }
        })
        .await
        .into_inner()
        .seq;
        granted.push((run_id, call_id, seq));
    }
    let mut histories = HashMap::new();
    for (run_id, _) in &started {
        let events = wait_for_end(&mut runs.clone(), run_id).await;
        histories.insert(run_id.clone(), events);
    }
    eprintln!(
        "{outage:?} {shards:?}: all {RUNS} runs ended {:?} after the outage",
        outage_at.elapsed()
    );

    if let Some(paused) = paused {
        // It wakes up owning nothing; whatever it tries to write is refused.
        // It stands by again, or, sharing shards out, takes its share back.
        paused.signal(libc::SIGCONT);
        match shards {
            Shards::OneOwner => {
                paused.wait_for_log_line("standing by again").await;
                wait_for_health(&paused, ServingStatus::Serving).await;
            }
            Shards::Spread => {
                let names = [
                    member_of(&paused).await,
                    member_of(&second).await,
                    member_of(&third).await,
                ];
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                wait_until_spread(&second, &names).await;
            }
        }
        let mut after = HashMap::new();
        for (run_id, _) in &started {
            after.insert(run_id.clone(), history(&mut runs.clone(), run_id).await);
        }
        assert!(after == histories, "the woken owner wrote to the runs");
    }

    let lost = check_histories(&histories, &started, &granted, &executed);
    eprintln!("{outage:?} {shards:?}: runs that lost an attempt to the outage: {lost:?}");

    let matching: BTreeSet<(String, u64)> = histories
        .values()
        .flatten()
        .filter(|e| e.r#type.starts_with(GROUP_TYPES))
        .map(|e| (e.run_id.clone(), e.seq))
        .collect();
    delivered
        .wait_until("every run event at the group", |got| {
            matching.is_subset(got)
        })
        .await;
    let gated_calls: BTreeSet<(String, String)> = granted
        .iter()
        .map(|(run, call, _)| (run.clone(), call.clone()))
        .collect();
    watched
        .wait_until("every request and its grant at the watcher", |w| {
            gated_calls.is_subset(&w.requested) && gated_calls.is_subset(&w.resolved)
        })
        .await;
    let seen = followed
        .wait_until("the followed run's end", |events| {
            events.last().is_some_and(|e| is_terminal(&e.r#type))
        })
        .await;
    assert!(
        seen == histories[&followed_run],
        "the follower: {:?}",
        types(&seen)
    );
}

/// What must hold of the runs' histories after any outage: every run
/// completed, seqs dense, one `aaa.tool.started` per attempt, one grant per
/// gated run, every acknowledged grant at its seq, global positions dense,
/// and no attempt executed twice by the worker. Answers the runs that lost
/// an attempt (AttemptLost).
fn check_histories(
    histories: &HashMap<String, Vec<Event>>,
    started: &[(String, bool)],
    granted: &[(String, String, u64)],
    executed: &Seen<Executed>,
) -> Vec<String> {
    for (run_id, gated) in started {
        let events = &histories[run_id];
        assert_eq!(
            events.last().map(|e| e.r#type.as_str()),
            Some("aaa.run.completed"),
            "{run_id}: {:?}",
            types(events)
        );
        assert_dense(events, 1);
        let attempts: Vec<u64> = events
            .iter()
            .filter(|e| e.r#type == "aaa.tool.started")
            .map(|e| data(e)["attempt"].as_u64().expect("attempt"))
            .collect();
        let distinct: BTreeSet<_> = attempts.iter().collect();
        assert_eq!(distinct.len(), attempts.len(), "{run_id}: {attempts:?}");
        let grants = count(events, "aaa.approval.granted");
        assert_eq!(grants, usize::from(*gated), "{run_id}: {:?}", types(events));
    }
    for (run_id, call_id, seq) in granted {
        let event = &histories[run_id][*seq as usize - 1];
        assert_eq!(event.r#type, "aaa.approval.granted", "{run_id} seq {seq}");
        assert_eq!(&self::call_id(event), call_id);
    }
    // Positions are unique, and rise with seq within each run (its shard's
    // commit order); across shards they need not be dense or ordered.
    let mut positions: Vec<u64> = histories.values().flatten().map(|e| e.position).collect();
    positions.sort_unstable();
    let total = positions.len();
    positions.dedup();
    assert_eq!(positions.len(), total, "a position was given twice");
    for (run_id, events) in histories {
        assert!(
            events.windows(2).all(|w| w[0].position < w[1].position),
            "{run_id}: positions do not rise with seq"
        );
    }

    let executed = executed.read(|e| (e.attempts.clone(), e.errors.clone()));
    assert!(executed.1.is_empty(), "worker errors: {:?}", executed.1);
    for ((run_id, call_id, attempt), times) in &executed.0 {
        assert_eq!(
            *times, 1,
            "{run_id} {call_id} attempt {attempt} ran {times} times"
        );
    }
    histories
        .iter()
        .filter(|(_, events)| events.iter().any(|e| e.data_json.contains("AttemptLost")))
        .map(|(run_id, _)| run_id.clone())
        .collect()
}

/// The servers are stopped and started again one by one (the owner first)
/// while runs are started, granted and served through all three. Every
/// call a client made succeeded, at worst after retrying UNAVAILABLE
/// answers as the SDKs do; no attempt was lost; everything else holds as
/// after an outage.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_under_load_loses_nothing() {
    rolling_restart(Shards::OneOwner).await;
}

/// The same with the shards spread: each stop and start moves shards
/// between all three servers, and every move closes an engine while polls
/// wait on it. (It once lost an attempt that way: a poll set aside for an
/// attempt being committed gave up when the engine closed, so the attempt
/// went back to a queue nobody read. See `dispatch::PendingTake::end`.)
#[tokio::test(flavor = "multi_thread")]
async fn with_spread_shards_a_rolling_restart_under_load_loses_nothing() {
    rolling_restart(Shards::Spread).await;
}

async fn rolling_restart(shards: Shards) {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let store = format!("--store={url}");
    let serve = |port: u16, standby: bool| {
        let mut args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{port}"),
            store.clone(),
            "--lease-s".into(),
            "1".into(),
        ];
        match shards {
            Shards::OneOwner if standby => args.push("--standby".into()),
            Shards::OneOwner => args.push("--one-owner".into()),
            Shards::Spread => {}
        }
        args
    };
    let mut servers = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let args = serve(0, i > 0);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(ChildServer::start_args(dir.path(), &args).await);
    }
    let everywhere = AddressList::new(&servers.iter().collect::<Vec<_>>());
    let ports: Vec<u16> = servers.iter().map(|s| s.addr().port()).collect();
    register(&mut servers[0].workers().await, failover_tools(), &[]).await;

    let executed = Seen::<Executed>::new();
    let granted = Seen::<Vec<(String, String, u64)>>::new();
    let started = Seen::<Vec<(String, bool)>>::new();
    let _background = Background(vec![
        tokio::spawn(serve_tools(everywhere.clone(), executed.clone())),
        tokio::spawn(grant_every_request(everywhere.clone(), granted.clone())),
    ]);
    let load = tokio::spawn(start_runs(everywhere.clone(), started.clone(), 0..RUNS));

    // One by one: wait for some load, stop the server, start it on its port.
    for (i, dir) in dirs.iter().enumerate() {
        let some = (i + 1) * RUNS / 4;
        started
            .wait_until("runs started through the cluster", |s| s.len() >= some)
            .await;
        let server = servers.remove(0);
        let stopping = Instant::now();
        server.stop();
        eprintln!(
            "rolling restart ({shards:?}): server {i} stopped in {:?}",
            stopping.elapsed()
        );
        let args = serve(ports[i], true);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(ChildServer::start_args(dir.path(), &args).await);
    }
    load.await.expect("the load's calls");
    let started = started.read(Vec::clone);
    let mut histories = HashMap::new();
    for (run_id, _) in &started {
        let events = wait_for_end(&mut everywhere.runs(), run_id).await;
        histories.insert(run_id.clone(), events);
    }
    let gated = started.iter().filter(|(_, gated)| *gated).count();
    let granted = granted
        .wait_until("every gated call granted", |g| g.len() == gated)
        .await;
    let lost = check_histories(&histories, &started, &granted, &executed);
    assert!(
        lost.is_empty(),
        "attempts lost in a rolling restart: {lost:?}; the servers' log lines about them:\n{}\n\
         the worker executed {:?}, and was refused completions {:?}",
        log_lines_about(&dirs, &lost),
        executed.read(|e| e
            .attempts
            .keys()
            .filter(|(run, _, _)| lost.contains(run))
            .cloned()
            .collect::<Vec<_>>()),
        executed.read(|e| e
            .refused_completions
            .iter()
            .filter(|line| lost.iter().any(|run| line.starts_with(run.as_str())))
            .cloned()
            .collect::<Vec<_>>()),
    );
}

/// The lines of the servers' logs (their `AAA_LOG` decides how many) that
/// name one of `runs`.
fn log_lines_about(dirs: &[tempfile::TempDir], runs: &[String]) -> String {
    let mut lines = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        lines.extend(
            log.lines()
                .filter(|line| runs.iter().any(|run| line.contains(run.as_str())))
                .map(|line| format!("server {i}: {line}")),
        );
    }
    lines.join("\n")
}

/// The database fails over under load: PostgreSQL with a synchronous
/// streaming replica, and aaa given both hosts with
/// `target_session_attrs=read-write`. The primary is killed (-9) while runs
/// are started, granted and served, and the replica is promoted. aaa goes
/// on with the new primary: every acknowledged run and grant is there,
/// every run completes, no attempt runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_failover_loses_nothing_acknowledged() {
    // PostgreSQL's programs are there when .ci/run started a database.
    if postgres().is_none() {
        return;
    }
    let primary = Cluster::start().await;
    let replica = Cluster::replica_of(&primary).await;
    // Both hosts; a connection goes to the one that takes writes.
    let host = |url: &str| {
        url.split('@')
            .nth(1)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string()
    };
    let store = format!(
        "--store=postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        host(&primary.url),
        host(&replica.url)
    );
    let server_dir = tempfile::tempdir().unwrap();
    let server =
        ChildServer::start_args(server_dir.path(), &["--listen", "127.0.0.1:0", &store]).await;
    register(&mut server.workers().await, failover_tools(), &[]).await;
    let at_server = AddressList::new(&[&server]);
    let executed = Seen::<Executed>::new();
    let granted = Seen::<Vec<(String, String, u64)>>::new();
    let started = Seen::<Vec<(String, bool)>>::new();
    let _background = Background(vec![
        tokio::spawn(serve_tools(at_server.clone(), executed.clone())),
        tokio::spawn(grant_every_request(at_server.clone(), granted.clone())),
    ]);
    // A third of the runs before the kill (their calls are granted and
    // served while the database fails over), the rest after it, so they
    // can only be on the promoted replica.
    let runs = 60;
    start_runs(at_server.clone(), started.clone(), 0..runs / 3).await;
    let failed_over = Instant::now();
    primary.run(&["kill"]).await;
    replica.run(&["promote"]).await;
    start_runs(at_server.clone(), started.clone(), runs / 3..runs).await;
    let started = started.read(Vec::clone);
    let mut histories = HashMap::new();
    for (run_id, _) in &started {
        let events = wait_for_end(&mut at_server.runs(), run_id).await;
        histories.insert(run_id.clone(), events);
    }
    eprintln!(
        "database failover: all {runs} runs ended {:?} after the primary was killed",
        failed_over.elapsed()
    );
    let gated = started.iter().filter(|(_, gated)| *gated).count();
    let granted = granted
        .wait_until("every gated call granted", |g| g.len() == gated)
        .await;
    let lost = check_histories(&histories, &started, &granted, &executed);
    eprintln!("database failover: runs that lost an attempt: {lost:?}");
}

/// Starts runs `numbers` (see [`run_request`]) through the servers in
/// turn, retrying UNAVAILABLE.
async fn start_runs(
    servers: Arc<AddressList>,
    started: Arc<Seen<Vec<(String, bool)>>>,
    numbers: std::ops::Range<usize>,
) {
    for i in numbers {
        let request = run_request(i);
        let run_id = retrying(|| {
            let (mut runs, request) = (servers.runs(), request.clone());
            async move { runs.start_run(request).await }
        })
        .await
        .into_inner()
        .run_id;
        started.update(|s| s.push((run_id, is_gated(i))));
    }
}

/// An approver that grants every request it sees, through the servers in
/// turn, retrying UNAVAILABLE; records each grant and its seq.
async fn grant_every_request(
    servers: Arc<AddressList>,
    granted: Arc<Seen<Vec<(String, String, u64)>>>,
) {
    use watch_approvals_response::Item;
    let mut position = None;
    loop {
        let mut approvals = ApprovalClient::new(servers.channel());
        let request = WatchApprovalsRequest {
            after_position: position,
            heartbeat_s: 1.0,
            ..Default::default()
        };
        if let Ok(stream) = approvals.watch_approvals(request).await {
            let mut stream = stream.into_inner();
            while let Ok(Some(response)) = stream.message().await {
                let approval = match response.item {
                    Some(Item::Requested(approval)) => approval,
                    Some(Item::Resolved(_) | Item::SnapshotComplete(_)) => {
                        position = Some(response.position);
                        continue;
                    }
                    _ => continue,
                };
                let seq = retrying(|| {
                    let mut runs = servers.runs();
                    let request = grant_request(&approval.run_id, &approval.call_id);
                    async move { runs.signal(request).await }
                })
                .await
                .into_inner()
                .seq;
                position = Some(response.position);
                granted.update(|g| g.push((approval.run_id, approval.call_id, seq)));
            }
        }
        backoff().await;
    }
}

/// Both tools, with the attempt lease of these tests.
fn failover_tools() -> Vec<ToolDefinition> {
    [wire_money(), lookup()]
        .map(|tool| ToolDefinition {
            heartbeat_timeout_s: ATTEMPT_LEASE_S,
            ..tool
        })
        .to_vec()
}

fn is_gated(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// Run `i`: gated (wire_money) or not (lookup), with a request id, so a
/// StartRun retried after an UNAVAILABLE answer starts it once.
fn run_request(i: usize) -> StartRunRequest {
    let request = match is_gated(i) {
        true => scripted_reference_run(),
        false => scripted_run("lookup", r#"{"payee":"ACME"}"#),
    };
    StartRunRequest {
        request_id: format!("failover-{i}"),
        ..request
    }
}

/// What a client in the background saw, and a signal each time it saw more.
struct Seen<T> {
    state: Mutex<T>,
    changed: watch::Sender<u64>,
}

impl<T: Default + Clone> Seen<T> {
    fn new() -> Arc<Self> {
        Arc::new(Seen {
            state: Mutex::default(),
            changed: watch::Sender::new(0),
        })
    }

    fn update(&self, change: impl FnOnce(&mut T)) {
        change(&mut self.state.lock().unwrap());
        self.changed.send_modify(|n| *n += 1);
    }

    fn read<R>(&self, look: impl FnOnce(&T) -> R) -> R {
        look(&self.state.lock().unwrap())
    }

    /// Waits (bounded by [`WAIT`]) until `done` holds; answers what was seen.
    async fn wait_until(&self, what: &str, done: impl Fn(&T) -> bool) -> T {
        let mut changes = self.changed.subscribe();
        let give_up = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(seen) = self.read(|seen| done(seen).then(|| seen.clone())) {
                return seen;
            }
            tokio::time::timeout_at(give_up, changes.changed())
                .await
                .unwrap_or_else(|_| panic!("{what} never came"))
                .expect("the sender lives in self");
        }
    }
}

/// The servers a client knows, by address: each (re)connection goes to the
/// next one in turn, as with an SDK's address list. A server restarted on
/// its port is reached again.
struct AddressList {
    channels: Vec<Channel>,
    next: AtomicUsize,
}

impl AddressList {
    fn new(servers: &[&ChildServer]) -> Arc<Self> {
        let channels = servers
            .iter()
            .map(|server| {
                tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))
                    .expect("endpoint")
                    .connect_lazy()
            })
            .collect();
        Arc::new(AddressList {
            channels,
            next: AtomicUsize::new(0),
        })
    }

    fn channel(&self) -> Channel {
        let next = self.next.fetch_add(1, Ordering::Relaxed);
        self.channels[next % self.channels.len()].clone()
    }

    fn runs(&self) -> RunClient {
        RunClient::new(self.channel())
    }
}

/// Background clients, stopped when the test ends (or fails).
struct Background(Vec<JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

#[derive(Default, Clone)]
struct Executed {
    /// (run, call, attempt) -> how often this worker executed it.
    attempts: HashMap<(String, String, u32), usize>,
    errors: Vec<String>,
    /// Each CompleteTask that failed: run, call, attempt and the answer.
    refused_completions: Vec<String>,
}

/// A worker for both tools: records every attempt it executes; retries a
/// call that [`is_retryable`].
async fn serve_tools(servers: Arc<AddressList>, seen: Arc<Seen<Executed>>) {
    loop {
        let mut workers = WorkerClient::new(servers.channel());
        let request = PollTaskRequest {
            identity: "failover-worker".into(),
            tools: vec!["wire_money".into(), "lookup".into()],
            wait_s: 1.0,
            ..Default::default()
        };
        let task = match workers.poll_task(request).await {
            Ok(answer) => answer.into_inner().task,
            Err(status) => {
                if !is_retryable(&status) {
                    seen.update(|s| s.errors.push(format!("PollTask: {status:?}")));
                }
                backoff().await;
                continue;
            }
        };
        let Some(task) = task else { continue };
        let attempt = (task.run_id.clone(), task.call_id.clone(), task.attempt);
        seen.update(|s| *s.attempts.entry(attempt).or_default() += 1);
        let mut tries = 0;
        loop {
            tries += 1;
            let answer = complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT).await;
            if let Err(status) = &answer {
                let (run, call, attempt) = (&task.run_id, &task.call_id, task.attempt);
                let line = format!("{run} {call} attempt {attempt}: {status:?}");
                seen.update(|s| s.refused_completions.push(line));
            }
            match answer {
                Ok(()) => break,
                Err(status) if is_retryable(&status) => backoff().await,
                // A retry after an UNAVAILABLE answer may find the first
                // try applied; that is the one answer allowed to differ.
                Err(_) if tries > 1 => break,
                Err(status) => {
                    seen.update(|s| s.errors.push(format!("CompleteTask: {status:?}")));
                    break;
                }
            }
        }
    }
}

/// A member of the group "failover-audit": records and acks each delivery;
/// subscribes again whenever its stream breaks.
async fn consume(servers: Arc<AddressList>, seen: Arc<Seen<BTreeSet<(String, u64)>>>) {
    loop {
        let (requests, outgoing) = mpsc::channel(1024);
        let open = SubscriptionOpen {
            group: "failover-audit".into(),
            event_types: vec![format!("{GROUP_TYPES}*")],
            start_from: StartFrom::Beginning as i32,
            ..Default::default()
        };
        let first = SubscribeRequest {
            kind: Some(subscribe_request::Kind::Open(open)),
        };
        requests.send(first).await.expect("request channel");
        let mut client = SubscriptionServiceClient::new(servers.channel());
        let outgoing = tokio_stream::wrappers::ReceiverStream::new(outgoing);
        if let Ok(responses) = client.subscribe(outgoing).await {
            let mut responses = responses.into_inner();
            while let Ok(Some(response)) = responses.message().await {
                let Some(subscribe_response::Item::Delivery(delivery)) = response.item else {
                    continue;
                };
                let event = delivery.event.expect("a delivery's event");
                seen.update(|s| {
                    s.insert((event.run_id, event.seq));
                });
                let ack = Ack {
                    delivery_id: delivery.delivery_id,
                };
                let ack = SubscribeRequest {
                    kind: Some(subscribe_request::Kind::Ack(ack)),
                };
                if requests.send(ack).await.is_err() {
                    break;
                }
            }
        }
        backoff().await;
    }
}

#[derive(Default, Clone)]
struct Watched {
    requested: BTreeSet<(String, String)>,
    resolved: BTreeSet<(String, String)>,
    /// The last position received; a broken watch resumes after it.
    position: Option<u64>,
}

/// A WatchApprovals client that resumes after its last position whenever
/// its stream breaks.
async fn watch_approvals_of(servers: Arc<AddressList>, seen: Arc<Seen<Watched>>) {
    use watch_approvals_response::Item;
    loop {
        let mut approvals = ApprovalClient::new(servers.channel());
        let request = WatchApprovalsRequest {
            after_position: seen.read(|w| w.position),
            heartbeat_s: 1.0,
            ..Default::default()
        };
        if let Ok(stream) = approvals.watch_approvals(request).await {
            let mut stream = stream.into_inner();
            while let Ok(Some(response)) = stream.message().await {
                let position = response.position;
                seen.update(|w| match response.item {
                    Some(Item::Requested(approval)) => {
                        w.requested.insert((approval.run_id, approval.call_id));
                        w.position = Some(position);
                    }
                    Some(Item::Resolved(resolution)) => {
                        w.resolved.insert((resolution.run_id, resolution.call_id));
                        w.position = Some(position);
                    }
                    Some(Item::SnapshotComplete(_)) => w.position = Some(position),
                    _ => {}
                });
            }
        }
        backoff().await;
    }
}

/// Follows one run to its end, resuming after its last event whenever its
/// stream breaks.
async fn follow(servers: Arc<AddressList>, run_id: String, seen: Arc<Seen<Vec<Event>>>) {
    use stream_events_response::Item;
    loop {
        let mut runs = RunClient::new(servers.channel());
        let request = StreamEventsRequest {
            run_id: run_id.clone(),
            after_seq: seen.read(|events| events.last().map_or(0, |e| e.seq)),
            follow: true,
            stop_at_end: true,
            ..Default::default()
        };
        if let Ok(stream) = runs.stream_events(request).await {
            let mut stream = stream.into_inner();
            while let Ok(Some(response)) = stream.message().await {
                if let Some(Item::Event(event)) = response.item {
                    seen.update(|events| events.push(event));
                }
            }
        }
        if seen.read(|events| events.last().is_some_and(|e| is_terminal(&e.r#type))) {
            return;
        }
        backoff().await;
    }
}

/// Membership converges after a database outage longer than the lease.
/// The owner is paused through the outage, so the standby claims the runs
/// when the database returns; the owner, woken, finds itself fenced out
/// and stands by again. When the new owner is then killed (-9), the first
/// takes the runs back and carries the parked run to its end: no server
/// stays fenced for good, nobody restarts one by hand.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_fenced_after_a_database_outage_stands_by_and_takes_over_again() {
    if postgres().is_none() {
        return;
    }
    let database = Cluster::start().await;
    let (_dirs, servers) = cluster_members(&database.url, 2, "1").await;
    let Ok([first, second]) = <[ChildServer; 2]>::try_from(servers) else {
        unreachable!("two servers")
    };
    let (first_name, second_name) = (member_of(&first).await, member_of(&second).await);
    register(&mut first.workers().await, vec![wire_money()], &[]).await;
    let mut runs = second.runs().await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    first.signal(libc::SIGSTOP);
    database.run(&["stop"]).await;
    // The outage itself (a fault the test makes, not a wait for a state):
    // twice the lease, so every claim has lapsed when the database returns.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    database.run(&["restart"]).await;
    wait_until_owner(&second, &second_name).await;
    first.signal(libc::SIGCONT);
    first
        .wait_for_log_line("other aaa servers claimed every shard this server held")
        .await;

    second.kill9();
    let killed_at = Instant::now();
    wait_until_owner(&first, &first_name).await;
    eprintln!(
        "the fenced server took the runs back {:?} after the owner was killed",
        killed_at.elapsed()
    );
    wait_for_health(&first, ServingStatus::Serving).await;
    let (mut runs, mut workers) = (first.runs().await, first.workers().await);
    grant_retrying(&runs, &run_id, &call_id).await;
    let events = finish_granted(&mut runs, &mut workers, &run_id).await;
    assert_dense(&events, 1);
    assert_eq!(count(&events, "aaa.tool.started"), 1);
}

/// The faults of [`membership_converges_under_a_random_mix_of_faults`].
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// kill -9 of a server, and a new one started the plain way in its place.
    Kill,
    /// SIGSTOP of a server for twice the lease, then SIGCONT.
    Pause,
    /// The database stopped for twice the lease.
    DatabaseOutage,
    /// Both: a server paused through a database outage.
    PauseThroughOutage,
}

/// Chaos, short: three servers (lease 1 s, started the plain way) on a
/// throwaway PostgreSQL go through a seeded random mix of kills, pauses and
/// database outages (`AAA_CHAOS_SEED`, `AAA_CHAOS_ROUNDS` to vary it).
/// After each fault the cluster converges with no human action: one live
/// server owns the runs, every live server says SERVING, and a gated run
/// started through one server is granted through another and served by a
/// worker polling a third. Every run's history is dense, each call started
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn membership_converges_under_a_random_mix_of_faults() {
    if postgres().is_none() {
        return;
    }
    let seed: u64 = std::env::var("AAA_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(41);
    let rounds: usize = std::env::var("AAA_CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    // splitmix64: the same faults for the same seed, with no dependency.
    let mut state = seed;
    let mut next = move |below: usize| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % below as u64) as usize
    };
    let database = Cluster::start().await;
    let store = format!("--store={}", database.url);
    let args = one_owner_args(&store, "1");
    let outage = std::time::Duration::from_secs(2);
    let mut dirs = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..3 {
        dirs.push(tempfile::tempdir().unwrap());
        servers.push(ChildServer::start_args(dirs.last().unwrap().path(), &args).await);
    }
    register(&mut servers[0].workers().await, vec![wire_money()], &[]).await;
    let mut runs_done = Vec::new();
    for round in 0..rounds {
        let fault = [
            Fault::Kill,
            Fault::Pause,
            Fault::DatabaseOutage,
            Fault::PauseThroughOutage,
        ][next(4)];
        // The owner most of the time: its faults are the ones that matter.
        let owner_name = owner(&servers[0]).await;
        let mut victim = next(3);
        for (i, server) in servers.iter().enumerate() {
            if next(4) > 0 && Some(member_of(server).await) == owner_name {
                victim = i;
            }
        }
        eprintln!("chaos seed {seed} round {round}: {fault:?} of server {victim}");
        let faulted = Instant::now();
        match fault {
            Fault::Kill => {
                servers.remove(victim).kill9();
                dirs.push(tempfile::tempdir().unwrap());
                let again = ChildServer::start_args(dirs.last().unwrap().path(), &args).await;
                servers.insert(victim, again);
            }
            Fault::Pause => {
                servers[victim].signal(libc::SIGSTOP);
                tokio::time::sleep(outage).await;
                servers[victim].signal(libc::SIGCONT);
            }
            Fault::DatabaseOutage | Fault::PauseThroughOutage => {
                let pause = matches!(fault, Fault::PauseThroughOutage);
                if pause {
                    servers[victim].signal(libc::SIGSTOP);
                }
                database.run(&["stop"]).await;
                tokio::time::sleep(outage).await;
                database.run(&["restart"]).await;
                if pause {
                    // The others claim the runs first, as the database returns.
                    let others: Vec<&ChildServer> = servers
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != victim)
                        .map(|(_, s)| s)
                        .collect();
                    let mut names = Vec::new();
                    for other in &others {
                        names.push(member_of(*other).await);
                    }
                    wait_until_owned_by_one_of(others[0], &names).await;
                    servers[victim].signal(libc::SIGCONT);
                }
            }
        }
        // Converged: one of the live servers owns the runs, all serve.
        let mut names = Vec::new();
        for server in &servers {
            names.push(member_of(server).await);
        }
        wait_until_owned_by_one_of(&servers[0], &names).await;
        for server in &servers {
            wait_for_health(server, ServingStatus::Serving).await;
        }
        // A cycle through three servers, retrying as the SDKs do.
        let mut runs = servers[round % 3].runs().await;
        let run_id = retrying(|| {
            let mut runs = runs.clone();
            async move { runs.start_run(scripted_reference_run()).await }
        })
        .await
        .into_inner()
        .run_id;
        let call_id = wait_for_approval(&mut runs, &run_id).await;
        grant_retrying(&servers[(round + 1) % 3].runs().await, &run_id, &call_id).await;
        let workers = servers[(round + 2) % 3].workers().await;
        let task = retrying(|| {
            let mut workers = workers.clone();
            async move { Ok(poll_until_task(&mut workers, "w", &["wire_money"], &[]).await) }
        })
        .await;
        retrying(|| {
            let (mut workers, token) = (workers.clone(), task.token.clone());
            async move { complete_tool(&mut workers, &token, REFERENCE_OUTPUT).await }
        })
        .await;
        let events = wait_for_end(&mut runs, &run_id).await;
        assert_eq!(completed_text(&events), REFERENCE_TEXT);
        eprintln!(
            "chaos seed {seed} round {round}: converged and a cycle done {:?} after the fault",
            faulted.elapsed()
        );
        runs_done.push(run_id);
    }
    let mut runs = servers[0].runs().await;
    for run_id in &runs_done {
        let events = history(&mut runs, run_id).await;
        assert_dense(&events, 1);
        assert_eq!(count(&events, "aaa.tool.started"), 1, "{run_id}");
        assert_eq!(count(&events, "aaa.approval.granted"), 1, "{run_id}");
    }
}

/// Asks `server` (bounded by `WAIT`) until one of `members` owns the runs.
async fn wait_until_owned_by_one_of(server: &ChildServer, members: &[String]) {
    let give_up = Instant::now() + WAIT;
    loop {
        if let Some(owner) = owner(server).await {
            if members.contains(&owner) {
                return;
            }
        }
        assert!(
            Instant::now() < give_up,
            "none of {members:?} owns the runs: {:?}",
            cluster_of(server).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
