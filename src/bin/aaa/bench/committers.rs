//! The commit scenario (`--only committers`, PostgreSQL only): 1, 2 and 4
//! committers on one database, each a store handle of its own (as each
//! server of a cluster has one), appending to runs in its own shards only.
//! Before the log was partitioned every commit locked one head row, so
//! committers took turns whatever their shards; now each locks the heads
//! of the shards it writes. Reported for each: commit rounds/s (one
//! transaction each), acked events/s, and the share of the database's
//! active sessions that were waiting on another commit's lock (a row, a
//! shard's, a transaction's; not a table's extension), sampled from
//! `pg_stat_activity` every 20 ms while they ran. And what the machine
//! spent: its busy share of every CPU, and busy CPU time per round (the
//! bench's committers and PostgreSQL together, when the database runs on
//! this machine), which says whether more rounds could fit on its cores.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::stats::{closed_loop, Problems, Summary};
use aaa::store::RunId;

/// Writers per committer: enough in flight that rounds hold several
/// batches, as a busy server's do.
const WRITERS_PER_COMMITTER: usize = 16;
const COMMITTERS: [usize; 3] = [1, 2, 4];

#[derive(Debug, Serialize)]
pub struct Committers {
    pub levels: Vec<Level>,
    /// Rounds/s of 4 committers over 1's.
    pub four_over_one: f64,
    pub problems: Problems,
}

#[derive(Debug, Serialize)]
pub struct Level {
    pub committers: usize,
    pub rounds_per_second: f64,
    pub events_per_second: f64,
    /// Of the samples of active client sessions, the share waiting on
    /// another commit's lock (a row, a shard's, a transaction's end).
    pub lock_wait_share: f64,
    /// Of every CPU of this machine, the share busy while they ran.
    pub machine_busy_share: f64,
    /// The machine's busy CPU time per round, in milliseconds.
    pub machine_cpu_ms_per_round: f64,
    pub latency: Summary,
}

/// Runs the levels, each on a scratch schema of its own (`scratch`).
pub async fn run(
    url: &str,
    scratch: impl Fn(&str) -> String,
    appends_per_level: usize,
    limit: Duration,
) -> anyhow::Result<Committers> {
    let mut levels = Vec::new();
    let mut problems = Problems::default();
    for committers in COMMITTERS {
        eprintln!("aaa bench: {committers} committers on disjoint shards");
        let store_url = scratch(&format!("commit{committers}"));
        let level = measure(url, &store_url, committers, appends_per_level, limit).await?;
        problems.merge(level.1);
        levels.push(level.0);
    }
    let four_over_one = levels[2].rounds_per_second / levels[0].rounds_per_second.max(1e-9);
    Ok(Committers {
        levels,
        four_over_one,
        problems,
    })
}

async fn measure(
    url: &str,
    store_url: &str,
    committers: usize,
    total: usize,
    limit: Duration,
) -> anyhow::Result<(Level, Problems)> {
    let metrics: Vec<aaa::metrics::Metrics> = (0..committers)
        .map(|_| aaa::metrics::Metrics::new())
        .collect();
    let mut stores = Vec::new();
    for metrics in &metrics {
        let store =
            aaa::store::postgres::PostgresStore::open_with_metrics(store_url, metrics).await?;
        stores.push(Arc::new(store));
    }
    // Committer c writes runs whose shard is c modulo the committers.
    let writers = committers * WRITERS_PER_COMMITTER;
    let runs: Vec<RunId> = (0..writers)
        .map(|writer| loop {
            let run = RunId::new();
            if usize::from(run.shard()) % committers == writer % committers {
                break run;
            }
        })
        .collect();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn(sample_lock_waits(url.to_string(), sampling.clone()));
    let rounds_before: u64 = metrics.iter().map(rounds).sum();
    let cpu = super::proc::CpuMeter::start(None);
    let started = Instant::now();
    let writer_stores = stores.clone();
    let outcome = closed_loop(writers, total, limit, move |writer, round| {
        let store = writer_stores[writer % committers].clone();
        let run = runs[writer];
        async move { super::floors::append_note(&*store, run, round).await }
    })
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let rounds_done = metrics.iter().map(rounds).sum::<u64>() - rounds_before;
    let cpu_ms_per_round = cpu.per_call(rounds_done as usize).machine_us.unwrap_or(0.0) / 1000.0;
    sampling.store(false, Ordering::Release);
    let (waiting, active) = sampler.await.unwrap_or((0, 0));
    for store in stores {
        aaa::store::Store::close(&*store).await;
    }
    let per_second = outcome.per_second();
    let mut latencies = outcome.latencies;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let rounds_per_second = rounds_done as f64 / elapsed.max(1e-9);
    let level = Level {
        committers,
        rounds_per_second,
        events_per_second: per_second,
        lock_wait_share: waiting as f64 / (active.max(1)) as f64,
        machine_busy_share: cpu_ms_per_round * rounds_per_second / 1000.0 / cpus,
        machine_cpu_ms_per_round: cpu_ms_per_round,
        latency: Summary::of(&mut latencies),
    };
    eprintln!(
        "aaa bench:   {:.0} rounds/s, {:.0} events/s, {:.0}% of active sessions waiting on another commit's lock; \
         the machine {:.0}% busy, {:.2} ms of CPU per round",
        level.rounds_per_second,
        level.events_per_second,
        level.lock_wait_share * 100.0,
        level.machine_busy_share * 100.0,
        level.machine_cpu_ms_per_round
    );
    Ok((level, outcome.problems))
}

/// Commit rounds a store handle made (its fsync counter).
fn rounds(metrics: &aaa::metrics::Metrics) -> u64 {
    metrics.families().store_fsyncs.get()
}

/// Samples the database's client sessions until `sampling` is cleared:
/// (samples waiting on a lock, samples active).
async fn sample_lock_waits(url: String, sampling: Arc<AtomicBool>) -> (u64, u64) {
    let Ok(client) = aaa::store::postgres::connect(&url).await else {
        return (0, 0);
    };
    let (mut waiting, mut active) = (0, 0);
    // Waits on another commit: a row lock (the old head row), a shard's
    // advisory lock, a transaction's end. A table's extension ('extend')
    // is a wait of concurrent inserts, not of a lock the design takes.
    let sql =
        "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event <> 'extend'), \
               count(*) \
               FROM pg_stat_activity WHERE backend_type = 'client backend' \
               AND state IN ('active', 'idle in transaction') AND pid <> pg_backend_pid()";
    while sampling.load(Ordering::Acquire) {
        if let Ok(row) = client.query_one(sql, &[]).await {
            let (w, a): (i64, i64) = (row.get(0), row.get(1));
            waiting += w as u64;
            active += a as u64;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (waiting, active)
}
