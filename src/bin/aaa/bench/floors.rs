//! The floors the other figures are judged against, measured in the same
//! run: the no-op gRPC round trip (Health/Check, one at a time), no-op calls
//! per second with 64 in flight (what gRPC alone costs the two cores, with
//! the bench on them too), the store's own group-commit ceiling (64 writers
//! appending straight to an in-process `Store`, no gRPC, no engine) and its
//! commit latency with one writer (what each of a cycle's three commits in
//! sequence costs at least).

use std::time::Duration;

use serde::Serialize;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::proc::CpuPerCall;
use super::server::{Pool, ScratchDir};
use super::stats::{closed_loop, one_at_a_time, Problems, Summary};
use aaa::store::{EventRecord, RunId, WriteBatch};

#[derive(Debug, Serialize)]
pub struct Rtt {
    pub latency: Summary,
    pub problems: Problems,
}

/// Sequential Health/Check calls on one connection, after a short warm-up.
pub async fn rtt(pool: &Pool, calls: usize, limit: Duration) -> Rtt {
    let health = pool.health();
    let (latency, problems) = one_at_a_time(calls, limit, || check(health.clone())).await;
    Rtt { latency, problems }
}

/// One Health/Check: the no-op call.
async fn check(mut health: HealthClient<Channel>) -> Result<(), String> {
    health
        .check(HealthCheckRequest::default())
        .await
        .map(|_| ())
        .map_err(|status| format!("Health/Check: {status}"))
}

#[derive(Debug, Serialize)]
pub struct NoopCalls {
    pub clients: usize,
    pub calls: usize,
    pub per_second: f64,
    pub latency: Summary,
    pub problems: Problems,
    /// CPU time per call.
    pub cpu: CpuPerCall,
}

/// `clients` tasks, each making Health/Check calls one after the other over
/// the pool's connections: the most calls/s any RPC could reach here.
pub async fn noop_calls(pool: &Pool, clients: usize, total: usize, limit: Duration) -> NoopCalls {
    let pool = pool.clone();
    let outcome = closed_loop(clients, total, limit, move |_, _| check(pool.health())).await;
    let per_second = outcome.per_second();
    let mut latencies = outcome.latencies;
    NoopCalls {
        clients,
        calls: latencies.len(),
        per_second,
        latency: Summary::of(&mut latencies),
        problems: outcome.problems,
        cpu: CpuPerCall::default(),
    }
}

#[derive(Debug, Serialize)]
pub struct StoreAppends {
    pub writers: usize,
    pub appends: usize,
    pub per_second: f64,
    pub latency: Summary,
    pub problems: Problems,
}

/// `writers` tasks, each committing one small event at a time for its own
/// run (seq 1, 2, 3...), to a store in a scratch dir.
/// Commits one small event to `run` (its `round`-th, seq `round + 1`)
/// straight to the store: one append of the store floors.
pub async fn append_note(
    store: &dyn aaa::store::Store,
    run: RunId,
    round: u64,
) -> Result<(), String> {
    let mut batch = WriteBatch::default();
    batch.push_event(EventRecord {
        run_id: run.as_bytes().to_vec(),
        seq: round + 1,
        position: 0,
        id: uuid::Uuid::now_v7().as_bytes().to_vec(),
        event_type: "bench.note".into(),
        data_json: format!(r#"{{"n":{round}}}"#),
        time_ms: aaa::clock::now_ms(),
        actor_kind: 3,
        actor_name: "aaa-bench".into(),
        actor_principal: String::new(),
    });
    store
        .commit(batch)
        .await
        .map(|_| ())
        .map_err(|e| format!("store commit: {e}"))
}

pub async fn store_appends(
    writers: usize,
    total: usize,
    limit: Duration,
    store_url: Option<String>,
) -> anyhow::Result<StoreAppends> {
    let dir = ScratchDir::new("store")?;
    let mut settings = aaa::store::Settings::new(dir.path());
    settings.url = store_url;
    let store = aaa::store::open(&settings).await?;
    let runs: Vec<RunId> = (0..writers).map(|_| RunId::new()).collect();
    let writer_store = store.clone();
    let outcome = closed_loop(writers, total, limit, move |writer, round| {
        let store = writer_store.clone();
        let run = runs[writer];
        async move { append_note(&*store, run, round).await }
    })
    .await;
    store.close().await;
    let per_second = outcome.per_second();
    let mut latencies = outcome.latencies;
    Ok(StoreAppends {
        writers,
        appends: latencies.len(),
        per_second,
        latency: Summary::of(&mut latencies),
        problems: outcome.problems,
    })
}
