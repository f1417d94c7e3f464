//! Figures: latency samples and their percentiles, the closed loop that
//! collects them, and the list of correctness problems a scenario saw.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinSet;

/// The longest one operation of a load loop may take before it counts as failed.
pub const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    /// Nearest-rank percentiles (sorts `samples`).
    pub fn of(samples: &mut [Duration]) -> Summary {
        samples.sort_unstable();
        let rank = |p: f64| {
            let n = samples.len();
            let index = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            millis(samples[index])
        };
        if samples.is_empty() {
            return Summary::default();
        }
        Summary {
            count: samples.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: millis(samples[samples.len() - 1]),
        }
    }

    /// "p50 / p99 ms" for the table.
    pub fn text(&self) -> String {
        format!("{} / {} ms", ms(self.p50_ms), ms(self.p99_ms))
    }
}

/// Milliseconds, rounded to the microsecond.
pub fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// Milliseconds with three significant digits or so.
pub fn ms(value: f64) -> String {
    match value {
        v if v < 1.0 => format!("{v:.3}"),
        v if v < 100.0 => format!("{v:.2}"),
        v => format!("{v:.0}"),
    }
}

/// Correctness problems: how many, and the first few messages.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Problems {
    pub count: usize,
    pub first: Vec<String>,
}

impl Problems {
    const KEPT: usize = 5;
    const LONGEST: usize = 300;

    pub fn add(&mut self, message: impl Into<String>) {
        self.count += 1;
        if self.first.len() < Self::KEPT {
            let message: String = message.into();
            self.first
                .push(message.chars().take(Self::LONGEST).collect());
        }
    }

    pub fn one(message: impl Into<String>) -> Problems {
        let mut problems = Problems::default();
        problems.add(message);
        problems
    }

    pub fn merge(&mut self, other: Problems) {
        self.count += other.count;
        for message in other.first {
            if self.first.len() < Self::KEPT {
                self.first.push(message);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// What a closed loop measured.
pub struct Outcome {
    /// Latency of each successful operation.
    pub latencies: Vec<Duration>,
    pub problems: Problems,
    /// From the first operation's start to the last one's end.
    pub elapsed: Duration,
}

impl Outcome {
    pub fn done(&self) -> usize {
        self.latencies.len()
    }

    pub fn per_second(&self) -> f64 {
        self.done() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Times `op`, called one at a time: `calls` samples after a warm-up of a
/// tenth as many, until `limit` has passed. A failed call is a problem,
/// not a sample.
pub async fn one_at_a_time<F, Fut>(calls: usize, limit: Duration, mut op: F) -> (Summary, Problems)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut problems = Problems::default();
    let mut samples = Vec::with_capacity(calls);
    let deadline = Instant::now() + limit;
    for i in 0..calls + calls / 10 {
        if Instant::now() > deadline {
            break;
        }
        let t0 = Instant::now();
        match op().await {
            Ok(()) if i >= calls / 10 => samples.push(t0.elapsed()),
            Ok(()) => {}
            Err(problem) => problems.add(problem),
        }
    }
    (Summary::of(&mut samples), problems)
}

/// Runs `op` from `clients` concurrent tasks, each starting its next
/// operation when the previous one answered, until `total` operations were
/// started or `limit` has passed. `op(client, round)` gets the client's
/// number and how many operations that client started before.
pub async fn closed_loop<F, Fut>(clients: usize, total: usize, limit: Duration, op: F) -> Outcome
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let op = Arc::new(op);
    let started = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + limit;
    let mut tasks = JoinSet::new();
    for client in 0..clients {
        let (op, started) = (op.clone(), started.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut problems = Problems::default();
            let mut round = 0;
            while Instant::now() < deadline && started.fetch_add(1, Ordering::Relaxed) < total {
                let t0 = Instant::now();
                match tokio::time::timeout(OP_TIMEOUT, op(client, round)).await {
                    Ok(Ok(())) => latencies.push(t0.elapsed()),
                    Ok(Err(message)) => problems.add(message),
                    Err(_) => problems.add(format!("an operation took over {OP_TIMEOUT:?}")),
                }
                round += 1;
            }
            (latencies, problems)
        });
    }
    let mut outcome = Outcome {
        latencies: Vec::new(),
        problems: Problems::default(),
        elapsed: Duration::ZERO,
    };
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((latencies, problems)) => {
                outcome.latencies.extend(latencies);
                outcome.problems.merge(problems);
            }
            Err(e) => outcome.problems.add(format!("a load task panicked: {e}")),
        }
    }
    outcome.elapsed = start.elapsed();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = Summary::of(&mut samples);
        assert_eq!(
            (s.count, s.p50_ms, s.p99_ms, s.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        assert_eq!(Summary::of(&mut []).count, 0);
    }

    #[tokio::test]
    async fn closed_loop_stops_at_the_count() {
        let outcome = closed_loop(4, 10, Duration::from_secs(10), |_, _| async { Ok(()) }).await;
        assert_eq!(outcome.done(), 10);
        assert!(outcome.problems.is_empty());
    }
}
