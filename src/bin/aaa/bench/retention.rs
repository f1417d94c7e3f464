//! Retention under a steady load: a server the bench starts with a short
//! `--retention` and small log segments carries approval cycles at a fixed
//! rate, and the bench samples the size of its data dir as it goes. This is
//! issue 24's disk target (retention 1 h, 500 cycles/s for 2 h) scaled down
//! in time with the same shape, tombstones included (they last as long as
//! the retention): the load lasts several retentions, so the dir should
//! stop growing once the first runs expire and compaction gives their
//! segments back.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::client::{self, WIRE_MONEY};
use super::server::{ChildServer, Pool};
use super::stats::{Problems, OP_TIMEOUT};
use super::BenchArgs;

/// Cycles in flight at most; a tick that finds this many is counted as
/// behind instead of starting one (the load is open, not closed).
const MOST_IN_FLIGHT: usize = 256;

/// The shape of the load.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub seconds: u64,
    pub cycles_per_second: u32,
    pub retention_s: u64,
    pub segment_kib: u64,
    pub sample_every_ms: u64,
}

impl Plan {
    /// Two minutes at the rate with a 20 s retention: six
    /// retentions of load, as the 2 h are two of 1 h, and then some,
    /// so a plateau has time to show.
    pub fn full(seconds: Option<u64>) -> Plan {
        Plan {
            seconds: seconds.unwrap_or(120),
            cycles_per_second: 500,
            retention_s: 20,
            segment_kib: 1024,
            sample_every_ms: 5_000,
        }
    }

    pub fn smoke(seconds: Option<u64>) -> Plan {
        Plan {
            seconds: seconds.unwrap_or(4),
            cycles_per_second: 100,
            retention_s: 1,
            segment_kib: 64,
            sample_every_ms: 500,
        }
    }
}

/// The data dir at one moment of the load.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub at_s: f64,
    pub cycles_done: usize,
    /// Disk used by the log's segment files, and by the rest (sled).
    pub log_bytes: u64,
    pub other_bytes: u64,
}

impl Sample {
    pub fn total(&self) -> u64 {
        self.log_bytes + self.other_bytes
    }
}

#[derive(Debug, Serialize)]
pub struct Retention {
    pub plan: Plan,
    pub cycles: usize,
    pub per_second: f64,
    /// Ticks that found [`MOST_IN_FLIGHT`] cycles still running.
    pub behind: usize,
    pub samples: Vec<Sample>,
    pub problems: Problems,
}

impl Retention {
    /// Growth of the data dir over the last half of the load: the largest
    /// size in it against the largest before it (1.0: no growth).
    pub fn late_growth(&self) -> Option<f64> {
        let half = self.plan.seconds as f64 / 2.0;
        let before = self.samples.iter().filter(|s| s.at_s <= half);
        let after = self.samples.iter().filter(|s| s.at_s > half);
        let before = before.map(Sample::total).max()?;
        let after = after.map(Sample::total).max()?;
        Some(after as f64 / before.max(1) as f64)
    }
}

pub async fn run(
    args: &BenchArgs,
    plan: &Plan,
    session: &str,
    store_url: Option<String>,
) -> anyhow::Result<Retention> {
    if args.server.is_some() || store_url.is_some() {
        bail!("the retention scenario measures the data dir of an embedded store the bench starts: run it without --server and --store");
    }
    let flags = vec![
        format!("--retention={}s", plan.retention_s),
        // Scaled down with the retention: the shape keeps a deleted
        // run's tombstone as long as its retention (1 h), and at the
        // default's hour they would outlast this whole load.
        format!("--tombstone={}s", plan.retention_s),
        format!("--log-segment-kib={}", plan.segment_kib),
    ];
    let child = ChildServer::start_with("retention", None, flags).await?;
    super::server::wait_serving(child.addr()).await?;
    let pool = Pool::connect(child.addr(), 2).await?;
    client::register_tools(&pool).await?;

    eprintln!(
        "aaa bench: retention {} s, {} cycles/s for {} s",
        plan.retention_s, plan.cycles_per_second, plan.seconds
    );
    let stop = CancellationToken::new();
    let worker = tokio::spawn(client::serve_tool(
        pool.clone(),
        WIRE_MONEY,
        64,
        None,
        stop.clone(),
    ));
    let approver = tokio::spawn(client::grant_all(
        pool.clone(),
        WIRE_MONEY,
        session.to_string(),
        None,
        stop.clone(),
    ));

    let mut out = Retention {
        plan: plan.clone(),
        cycles: 0,
        per_second: 0.0,
        behind: 0,
        samples: Vec::new(),
        problems: Problems::default(),
    };
    let done = Arc::new(AtomicUsize::new(0));
    let mut cycles = JoinSet::new();
    let start = Instant::now();
    let end = start + Duration::from_secs(plan.seconds);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(
        1.0 / f64::from(plan.cycles_per_second.max(1)),
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sample = tokio::time::interval(Duration::from_millis(plan.sample_every_ms));
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < end {
        tokio::select! {
            _ = tick.tick() => {
                while let Some(joined) = cycles.try_join_next() {
                    client::settle(joined, &mut out.problems);
                }
                if cycles.len() >= MOST_IN_FLIGHT {
                    out.behind += 1;
                    continue;
                }
                let (mut runs, session, done) = (pool.runs(), session.to_string(), done.clone());
                cycles.spawn(async move {
                    let cycle = async {
                        let run_id = client::start_run(&mut runs, WIRE_MONEY, &session).await?;
                        client::wait_completed(&mut runs, &run_id).await
                    };
                    let ended = tokio::time::timeout(OP_TIMEOUT, cycle).await;
                    let ended = ended.unwrap_or_else(|_| Err(format!("a cycle took over {OP_TIMEOUT:?}")));
                    if ended.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    ended
                });
            }
            _ = sample.tick() => {
                let cycles_done = done.load(Ordering::Relaxed);
                let sample = measure(&child.data_dir(), start.elapsed(), cycles_done);
                eprintln!(
                    "aaa bench: {:>5.1} s  {cycles_done} cycles  log {} KiB  other {} KiB",
                    sample.at_s,
                    sample.log_bytes / 1024,
                    sample.other_bytes / 1024
                );
                out.samples.push(sample);
            }
        }
    }
    let elapsed = start.elapsed();
    while let Some(joined) = cycles.join_next().await {
        client::settle(joined, &mut out.problems);
    }
    out.samples.push(measure(
        &child.data_dir(),
        start.elapsed(),
        done.load(Ordering::Relaxed),
    ));
    out.cycles = done.load(Ordering::Relaxed);
    out.per_second = out.cycles as f64 / elapsed.as_secs_f64().max(1e-9);
    stop.cancel();
    out.problems.merge(client::join_helper(worker).await);
    out.problems.merge(client::join_helper(approver).await);
    Ok(out)
}

/// The data dir's disk use now: the log's segments and the rest.
fn measure(dir: &Path, at: Duration, cycles_done: usize) -> Sample {
    let log_bytes = disk_use(&dir.join("log"));
    Sample {
        at_s: at.as_secs_f64(),
        cycles_done,
        log_bytes,
        other_bytes: disk_use(dir).saturating_sub(log_bytes),
    }
}

/// Bytes of disk the files under `dir` use (allocated blocks, as `du`
/// counts them), as far as they can be read: a file compaction deleted
/// meanwhile counts as nothing.
fn disk_use(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_use(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}
