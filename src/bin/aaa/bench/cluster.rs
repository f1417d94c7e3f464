//! The cluster scenario (`--cluster N`, PostgreSQL only). For 1, 2, ... N
//! servers on one database (a fresh schema for each size; with
//! `--one-owner` the first server owns the runs and the others are standbys
//! that forward the writes they get, by default they share the shards out
//! as `aaa serve` does, and a run's writes reach the other servers the same
//! way):
//! - the approval cycle at 64 in flight, with the bench's connections spread
//!   evenly over the servers, so (n-1)/n of the calls reach a standby, which
//!   answers the reads itself; a run's writes (the grant, the task's
//!   completion) go to its owner, as the SDKs send them (GetCluster's shard
//!   owners), or with `--unrouted` to the next server in turn, which
//!   forwards them (as for grpcurl or the CLI);
//! - the extra latency of one forwarded write: Signal (an application
//!   event appended to a parked run) one at a time, to the owner and
//!   through a standby.
//!
//! On the largest cluster (2 servers or more), failover: runs park at
//! approval, the owner is killed (-9), and the bench measures how long until
//! another server owns the runs (GetCluster) and until the parked runs,
//! granted and served through the standbys from the moment of the kill (the
//! calls retried while nobody owns the runs, as the SDKs do), complete.
//!
//! With the shards shared out, "the
//! owner" is the first server (the runs parked for the failover are
//! started through it, so they live in its shards), "the standbys" the
//! others, and the runs are owned again once every shard has a live owner.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::appends::{park_calls, park_runs};
use super::client::{self, HOLD, WIRE_OUTPUT};
use super::cycle::{self, Level};
use super::postgres::Database;
use super::proc;
use super::server::{wait_serving, ChildServer, Pool};
use super::stats::{millis, one_at_a_time, Problems, Summary, OP_TIMEOUT};
use super::CONNECTIONS;
use aaa::proto::{
    complete_task_request, CompleteTaskRequest, GetClusterRequest, PollTaskRequest, SignalRequest,
};

/// The servers' lease: a dead owner's runs move after at most this.
const LEASE_S: f64 = 2.0;

#[derive(Debug, Serialize)]
pub struct Cluster {
    pub lease_s: f64,
    pub sizes: Vec<Size>,
    pub failover: Option<Failover>,
    /// Sizes or failovers that could not be measured, with why.
    pub problems: Problems,
}

#[derive(Debug, Serialize)]
pub struct Size {
    pub servers: usize,
    /// Whether a run's writes went to its owner (else round robin).
    pub routed: bool,
    /// The share of the bench's writes that reached a server other than
    /// the run's owner, which forwarded them.
    pub forwarded_share: f64,
    /// The approval cycle at 64 in flight over all servers.
    pub cycle: Level,
    /// CPU time per cycle of the owner, and of all standbys together (ms).
    pub owner_cpu_ms_per_cycle: f64,
    pub standbys_cpu_ms_per_cycle: f64,
    /// CPU time per cycle of PostgreSQL (the postmaster and its backends),
    /// when it runs on this machine (ms).
    pub database_cpu_ms_per_cycle: Option<f64>,
    /// Signal, one at a time, served by the owner itself.
    pub direct: Summary,
    /// The same through a standby (forwarded); none for one server.
    pub forwarded: Option<Summary>,
}

impl Size {
    /// Cycles per second of CPU spent by the servers and the database
    /// together: what a cluster makes of shared cores, whatever else the
    /// machine runs. None when the database's CPU is unknown.
    pub fn cycles_per_cpu_second(&self) -> Option<f64> {
        let ms = self.owner_cpu_ms_per_cycle
            + self.standbys_cpu_ms_per_cycle
            + self.database_cpu_ms_per_cycle?;
        (ms > 0.0).then(|| 1000.0 / ms)
    }
}

#[derive(Debug, Serialize)]
pub struct Failover {
    pub servers: usize,
    pub parked: usize,
    /// Kill -9 of the owner -> GetCluster names another owner.
    pub owned_again_s: f64,
    /// Kill -9 -> the first parked run, granted then, completed.
    pub first_completed_s: f64,
    /// Kill -9 -> every parked run completed (granted and served one by one).
    pub all_completed_s: f64,
}

/// Which clusters to measure: 1..=`most` servers, with the shards spread
/// or with one owner.
pub struct Shape {
    pub most: usize,
    pub spread: bool,
    /// A run's writes go to its owner.
    pub routed: bool,
}

/// Measures clusters of 1..=`shape.most` servers on `database`.
pub async fn run(
    database: &Database,
    session: &str,
    shape: Shape,
    cycles: usize,
    calls: usize,
    parked: usize,
    limit: Duration,
) -> Cluster {
    let Shape {
        most,
        spread,
        routed,
    } = shape;
    let mut cluster = Cluster {
        lease_s: LEASE_S,
        sizes: Vec::new(),
        failover: None,
        problems: Problems::default(),
    };
    let postmaster = database.postmaster().await;
    for servers in 1..=most {
        let measured = async {
            let mut members = start(database, servers, spread).await?;
            let load = Load {
                session,
                routed,
                cycles,
                calls,
                limit,
            };
            let size = measure_size(&members, postmaster, load).await?;
            let failover = match servers == most && servers > 1 {
                true => Some(failover(&mut members, session, parked, spread).await?),
                false => None,
            };
            anyhow::Ok((size, failover))
        };
        match measured.await {
            Ok((size, failover)) => {
                cluster.sizes.push(size);
                cluster.failover = cluster.failover.take().or(failover);
            }
            Err(e) => cluster.problems.add(format!("cluster of {servers}: {e:#}")),
        }
    }
    cluster
}

/// Starts `servers` servers on a fresh schema: with `spread`, servers that
/// share the shards out (once every shard has an owner); otherwise the
/// owner first, then the standbys.
async fn start(
    database: &Database,
    servers: usize,
    spread: bool,
) -> anyhow::Result<Vec<ChildServer>> {
    let url = database.scratch(&format!("cluster{servers}"));
    let mut members = Vec::with_capacity(servers);
    for i in 0..servers {
        let mut args = vec!["--lease-s".to_string(), LEASE_S.to_string()];
        match (spread, i) {
            (true, _) => {}
            (false, 0) => args.push("--one-owner".into()),
            (false, _) => args.push("--standby".into()),
        }
        let tag = format!("cluster{servers}-{i}");
        let member = ChildServer::start_with(&tag, Some(url.clone()), args).await?;
        wait_serving(member.addr()).await?;
        members.push(member);
    }
    if spread {
        let pool = Pool::connect(members[0].addr(), 1).await?;
        let spread_out = async {
            while held_by(&pool, "").await.ok() != Some(servers) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(OP_TIMEOUT, spread_out)
            .await
            .map_err(|_| anyhow::anyhow!("the shards were not shared out within {OP_TIMEOUT:?}"))?;
    }
    Ok(members)
}

/// How many live members other than `except` hold shards, if together
/// they hold every shard.
async fn held_by(pool: &Pool, except: &str) -> anyhow::Result<usize> {
    let view = pool
        .cluster()
        .get_cluster(GetClusterRequest {})
        .await?
        .into_inner();
    let holders: Vec<_> = view
        .members
        .iter()
        .filter(|m| m.alive && m.server != except && m.shards > 0)
        .collect();
    match holders.iter().map(|m| m.shards).sum::<u32>() == view.shards {
        true => Ok(holders.len()),
        false => Ok(0),
    }
}

/// What one size of cluster is measured with.
struct Load<'a> {
    session: &'a str,
    routed: bool,
    cycles: usize,
    calls: usize,
    limit: Duration,
}

async fn measure_size(
    members: &[ChildServer],
    postmaster: Option<u32>,
    load: Load<'_>,
) -> anyhow::Result<Size> {
    let Load {
        session,
        routed,
        cycles,
        calls,
        limit,
    } = load;
    let database_cpu = || postmaster.and_then(proc::family_cpu_seconds);
    let servers = members.len();
    let addrs: Vec<&str> = members.iter().map(ChildServer::addr).collect();
    eprintln!("aaa bench: cluster of {servers}, cycle at 64 in flight");
    let everywhere = Pool::connect_all(&addrs, CONNECTIONS).await?;
    client::register_tools(&everywhere).await?;
    let mut forwarded_share = (servers - 1) as f64 / servers as f64;
    if routed {
        let known = everywhere.route().await?;
        // Writes of a shard whose owner the bench does not know go round.
        forwarded_share *= 1.0 - known as f64 / aaa::domain::SHARDS as f64;
    }
    let cpu_before = cpu_seconds(members);
    let database_before = database_cpu();
    let mut cycle = cycle::run(&everywhere, session, &[(64, cycles)], limit).await;
    let cpu: Vec<f64> = cpu_seconds(members)
        .iter()
        .zip(&cpu_before)
        .map(|(after, before)| after - before)
        .collect();
    let database = database_before
        .zip(database_cpu())
        .map(|(before, after)| after - before);
    let mut level = cycle.levels.pop().expect("one level");
    level.problems.merge(cycle.problems);
    // The warm-up's few cycles are counted in the CPU time too.
    let per_cycle = |seconds: f64| 1000.0 * seconds / level.cycles.max(1) as f64;

    let owner = Pool::connect(addrs[0], 1).await?;
    let run_id = park_runs(&owner, session, 1).await?.remove(0);
    let direct = signal_latency(&owner, &run_id, calls, limit).await?;
    let forwarded = match addrs.get(1) {
        Some(standby) => {
            let standby = Pool::connect(standby, 1).await?;
            Some(signal_latency(&standby, &run_id, calls, limit).await?)
        }
        None => None,
    };
    Ok(Size {
        servers,
        routed,
        forwarded_share,
        owner_cpu_ms_per_cycle: per_cycle(cpu[0]),
        standbys_cpu_ms_per_cycle: per_cycle(cpu[1..].iter().sum()),
        database_cpu_ms_per_cycle: database.map(per_cycle),
        cycle: level,
        direct,
        forwarded,
    })
}

/// Each member's CPU time so far, in seconds (0 where unknown).
fn cpu_seconds(members: &[ChildServer]) -> Vec<f64> {
    members
        .iter()
        .map(|m| m.cpu_seconds().unwrap_or(0.0))
        .collect()
}

/// Signals an application event to one run, one call at a time: each is
/// a commit, made by the owner.
async fn signal_latency(
    pool: &Pool,
    run_id: &str,
    calls: usize,
    limit: Duration,
) -> anyhow::Result<Summary> {
    let (latency, problems) = one_at_a_time(calls, limit, || {
        let mut runs = pool.runs();
        async move {
            client::signal(&mut runs, run_id, "bench.note", "{}".into())
                .await
                .map(|_| ())
        }
    })
    .await;
    match problems.first.first() {
        None => Ok(latency),
        Some(problem) => anyhow::bail!("{} Signal calls failed, first: {problem}", problems.count),
    }
}

/// Parks runs, kills the owner (-9), and grants and serves the runs
/// through the standbys from that moment on.
async fn failover(
    members: &mut [ChildServer],
    session: &str,
    parked: usize,
    spread: bool,
) -> anyhow::Result<Failover> {
    let standby_addrs: Vec<&str> = members[1..].iter().map(ChildServer::addr).collect();
    let standbys = Pool::connect_all(&standby_addrs, 1).await?;
    eprintln!(
        "aaa bench: cluster of {}, failover with {parked} parked runs",
        members.len()
    );
    // The runs to wait through the outage live in the shards of the server
    // killed: the owner's, or (spread) those it starts runs in.
    let waiting = match spread {
        true => park_calls(&Pool::connect(members[0].addr(), 1).await?, session, parked).await?,
        false => park_calls(&standbys, session, parked).await?,
    };
    let victim = Pool::connect(members[0].addr(), 1).await?;
    let victim = victim
        .cluster()
        .get_cluster(GetClusterRequest {})
        .await?
        .into_inner()
        .this_server;

    members[0].kill9();
    let killed = Instant::now();
    let owned_again = async {
        loop {
            // Ownership moves by leases in the database, which no stream
            // announces: ask every 10 ms.
            if held_by(&standbys, &victim).await.unwrap_or(0) > 0 {
                return killed.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let completed = async {
        let mut first = None;
        for (run_id, call_id) in &waiting {
            grant_and_serve(&standbys, run_id, call_id).await?;
            first.get_or_insert(killed.elapsed());
        }
        anyhow::Ok((first.unwrap_or_default(), killed.elapsed()))
    };
    let (owned_again, completed) =
        tokio::join!(tokio::time::timeout(OP_TIMEOUT, owned_again), completed);
    let owned_again = owned_again
        .map_err(|_| anyhow::anyhow!("no other server owned the runs within {OP_TIMEOUT:?}"))?;
    let (first, all) = completed?;
    Ok(Failover {
        servers: members.len(),
        parked,
        owned_again_s: millis(owned_again) / 1000.0,
        first_completed_s: millis(first) / 1000.0,
        all_completed_s: millis(all) / 1000.0,
    })
}

/// Grants the run's call, serves it as a worker and waits for the run to
/// complete; each call retried while the cluster answers UNAVAILABLE.
async fn grant_and_serve(pool: &Pool, run_id: &str, call_id: &str) -> anyhow::Result<()> {
    let grant = SignalRequest {
        run_id: run_id.into(),
        r#type: "aaa.approval.granted".into(),
        data_json: serde_json::json!({ "call_id": call_id }).to_string(),
        // A retry after an UNAVAILABLE answer cannot grant twice.
        request_id: format!("bench-grant-{run_id}"),
    };
    retrying(|| {
        let (mut runs, grant) = (pool.runs(), grant.clone());
        async move { runs.signal(grant).await }
    })
    .await?;
    let poll = PollTaskRequest {
        identity: "aaa-bench-failover".into(),
        tools: vec![HOLD.into()],
        models: vec![],
        wait_s: 5.0,
    };
    let task = loop {
        let answer = retrying(|| {
            let (mut workers, poll) = (pool.workers(), poll.clone());
            async move { workers.poll_task(poll).await }
        })
        .await?;
        if let Some(task) = answer.into_inner().task {
            break task;
        }
    };
    let complete = CompleteTaskRequest {
        token: task.token,
        result: Some(complete_task_request::Result::OutputJson(
            WIRE_OUTPUT.into(),
        )),
    };
    retrying(|| {
        let (mut workers, complete) = (pool.workers(), complete.clone());
        async move { workers.complete_task(complete).await }
    })
    .await?;
    client::wait_completed(&mut pool.runs(), run_id)
        .await
        .map_err(anyhow::Error::msg)
}

/// Calls until the answer is not UNAVAILABLE (bounded by [`OP_TIMEOUT`]),
/// with a 10 ms pause between tries.
async fn retrying<T, F, Fut>(mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let give_up = Instant::now() + OP_TIMEOUT;
    loop {
        match call().await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < give_up =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            answer => return Ok(answer?),
        }
    }
}
