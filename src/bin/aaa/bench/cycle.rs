//! The approval cycle at a given number of runs in flight: StartRun (the
//! scripted model calls the gated `wire_money`), the approver sees the
//! request on WatchApprovals and grants it, a worker serves the call, and
//! the driver waits for `aaa.run.completed` on StreamEvents.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::client::{self, WIRE_MONEY};
use super::server::Pool;
use super::stages::{Offset, Stamps, Step};
use super::stats::{closed_loop, Problems, Summary};

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
    /// With one in flight: when each step came after StartRun was sent.
    pub steps: Vec<Offset>,
    pub problems: Problems,
}

/// Runs the cycle at each (in flight, most cycles) level of `plan`, with
/// one approver and one worker serving all levels.
pub async fn run(pool: &Pool, session: &str, plan: &[(usize, usize)], limit: Duration) -> Cycle {
    let stop = CancellationToken::new();
    // The worker keeps one long poll open per run in flight, as a worker
    // sized for the load would: a granted call then finds a poll waiting and
    // starts in the grant's own commit. With 4 polls at 64 in flight, most
    // calls waited in the queue and took a commit of their own to start
    // (server CPU per cycle 0.67-0.69 against 0.49-0.52 ms).
    let pollers = plan.iter().map(|&(in_flight, _)| in_flight).max();
    // Every party marks its steps; only runs the driver marked too (those
    // at one in flight) count.
    let stamps = Arc::new(Stamps::default());
    let worker = tokio::spawn(client::serve_tool(
        pool.clone(),
        WIRE_MONEY,
        pollers.unwrap_or(1),
        Some(stamps.clone()),
        stop.clone(),
    ));
    let approver = tokio::spawn(client::grant_all(
        pool.clone(),
        WIRE_MONEY,
        session.to_string(),
        Some(stamps.clone()),
        stop.clone(),
    ));
    // Warm-up: connections, caches, the first runs' allocations.
    let warm_up = cycles(pool, session, 4, 8, None, limit).await;
    let mut levels = Vec::new();
    for &(in_flight, count) in plan {
        eprintln!("aaa bench: cycle, {in_flight} in flight, up to {count} cycles");
        let marks = (in_flight == 1).then(|| stamps.clone());
        let outcome = cycles(pool, session, in_flight, count, marks, limit).await;
        let per_second = outcome.per_second();
        let mut latencies = outcome.latencies;
        levels.push(Level {
            in_flight,
            cycles: latencies.len(),
            per_second,
            latency: Summary::of(&mut latencies),
            steps: match in_flight {
                1 => stamps.since_sent(),
                _ => Vec::new(),
            },
            problems: outcome.problems,
        });
    }
    stop.cancel();
    let mut problems = warm_up.problems;
    problems.merge(client::join_helper(worker).await);
    problems.merge(client::join_helper(approver).await);
    Cycle { levels, problems }
}

/// Cycles from `in_flight` drivers; each marks its steps in `stamps`, if
/// given.
async fn cycles(
    pool: &Pool,
    session: &str,
    in_flight: usize,
    count: usize,
    stamps: Option<Arc<Stamps>>,
    limit: Duration,
) -> super::stats::Outcome {
    let (pool, session) = (pool.clone(), session.to_string());
    closed_loop(in_flight, count, limit, move |_, _| {
        let (mut runs, session, stamps) = (pool.runs(), session.clone(), stamps.clone());
        async move {
            let sent = Instant::now();
            let run_id = client::start_run(&mut runs, WIRE_MONEY, &session).await?;
            if let Some(stamps) = &stamps {
                stamps.mark_at(&run_id, Step::Sent, sent);
                stamps.mark(&run_id, Step::Started);
            }
            client::wait_completed(&mut runs, &run_id).await?;
            if let Some(stamps) = &stamps {
                stamps.mark(&run_id, Step::Completed);
            }
            Ok(())
        }
    })
    .await
}
