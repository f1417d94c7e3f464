//! Durable application events through Signal: each client has its own run,
//! parked at an approval, and appends `bench.note` events to it one at a
//! time; every answer means the event is on disk.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinSet;

use super::client::{self, HOLD};
use super::proc::CpuPerCall;
use super::server::Pool;
use super::stats::{closed_loop, Problems, Summary};

#[derive(Debug, Serialize)]
pub struct Appends {
    pub clients: usize,
    pub events: usize,
    pub per_second: f64,
    pub latency: Summary,
    pub problems: Problems,
    /// CPU time per Signal, parking the runs included.
    pub cpu: CpuPerCall,
}

pub async fn run(
    pool: &Pool,
    session: &str,
    clients: usize,
    total: usize,
    limit: Duration,
) -> anyhow::Result<Appends> {
    let run_ids = park_runs(pool, session, clients).await?;
    let runs = Arc::new(run_ids.clone());
    let signal_pool = pool.clone();
    let outcome = closed_loop(clients, total, limit, move |client, round| {
        let (mut rpc, runs) = (signal_pool.runs(), runs.clone());
        async move {
            let data = format!(r#"{{"n":{round}}}"#);
            client::signal(&mut rpc, &runs[client], "bench.note", data)
                .await
                .map(|_| ())
        }
    })
    .await;
    let per_second = outcome.per_second();
    let mut problems = outcome.problems;
    problems.merge(client::cancel_all(pool, &run_ids).await);
    let mut latencies = outcome.latencies;
    Ok(Appends {
        clients,
        events: latencies.len(),
        per_second,
        latency: Summary::of(&mut latencies),
        problems,
        cpu: CpuPerCall::default(),
    })
}

/// Starts `count` runs of the gated hold tool and waits until each waits
/// for approval. Returns their ids.
pub async fn park_runs(pool: &Pool, session: &str, count: usize) -> anyhow::Result<Vec<String>> {
    let parked = park_calls(pool, session, count).await?;
    Ok(parked.into_iter().map(|(run_id, _)| run_id).collect())
}

/// [`park_runs`], answering each run's id with the call_id it waits on.
pub async fn park_calls(
    pool: &Pool,
    session: &str,
    count: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut starts = JoinSet::new();
    for _ in 0..count {
        let (mut runs, session) = (pool.runs(), session.to_string());
        starts.spawn(async move {
            let run_id = client::start_run(&mut runs, HOLD, &session).await?;
            let call_id = client::wait_parked(&mut runs, &run_id).await?;
            Ok::<_, String>((run_id, call_id))
        });
    }
    let mut parked = Vec::with_capacity(count);
    while let Some(joined) = starts.join_next().await {
        parked.push(joined?.map_err(anyhow::Error::msg)?);
    }
    Ok(parked)
}
