//! The approval cycle at a given number of runs in flight: StartRun (the
//! scripted model calls the gated `wire_money`), the approver sees the
//! request on WatchApprovals and grants it, a worker serves the call, and
//! the driver waits for `aaa.run.completed` on StreamEvents.

use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::client::{self, WIRE_MONEY};
use super::server::Pool;
use super::stats::{closed_loop, Problems, Summary};

/// Long polls the bench's worker keeps open.
const POLLERS: usize = 4;

#[derive(Debug, Default, Serialize)]
pub struct Cycle {
    pub levels: Vec<Level>,
    /// Problems of the warm-up, the approver and the worker.
    pub problems: Problems,
}

#[derive(Debug, Serialize)]
pub struct Level {
    pub in_flight: usize,
    pub cycles: usize,
    pub per_second: f64,
    /// StartRun sent -> aaa.run.completed received.
    pub latency: Summary,
    pub problems: Problems,
}

/// Runs the cycle at each (in flight, most cycles) level of `plan`, with
/// one approver and one worker serving all levels.
pub async fn run(pool: &Pool, session: &str, plan: &[(usize, usize)], limit: Duration) -> Cycle {
    let stop = CancellationToken::new();
    let worker = tokio::spawn(client::serve_tool(
        pool.clone(),
        WIRE_MONEY,
        POLLERS,
        stop.clone(),
    ));
    let approver = tokio::spawn(client::grant_all(
        pool.clone(),
        WIRE_MONEY,
        session.to_string(),
        stop.clone(),
    ));
    // Warm-up: connections, caches, the first runs' allocations.
    let warm_up = cycles(pool, session, 4, 8, limit).await;
    let mut levels = Vec::new();
    for &(in_flight, count) in plan {
        eprintln!("aaa bench: cycle, {in_flight} in flight, up to {count} cycles");
        let outcome = cycles(pool, session, in_flight, count, limit).await;
        let per_second = outcome.per_second();
        let mut latencies = outcome.latencies;
        levels.push(Level {
            in_flight,
            cycles: latencies.len(),
            per_second,
            latency: Summary::of(&mut latencies),
            problems: outcome.problems,
        });
    }
    stop.cancel();
    let mut problems = warm_up.problems;
    problems.merge(client::join_helper(worker).await);
    problems.merge(client::join_helper(approver).await);
    Cycle { levels, problems }
}

async fn cycles(
    pool: &Pool,
    session: &str,
    in_flight: usize,
    count: usize,
    limit: Duration,
) -> super::stats::Outcome {
    let (pool, session) = (pool.clone(), session.to_string());
    closed_loop(in_flight, count, limit, move |_, _| {
        let (mut runs, session) = (pool.runs(), session.clone());
        async move {
            let run_id = client::start_run(&mut runs, WIRE_MONEY, &session).await?;
            client::wait_completed(&mut runs, &run_id).await
        }
    })
    .await
}
