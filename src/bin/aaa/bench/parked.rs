//! Parked runs: N runs waiting for approval. Measures the server's memory,
//! ListApprovals' first page and WatchApprovals' snapshot; then (on a
//! server the bench started) kills it with SIGKILL, restarts it on the same
//! data, and times readiness, the first ListApprovals page and the first
//! approval cycle after restart. It also times `GET /metrics`, which counts
//! what waits. The `parked` scenario does this with 100k runs and one
//! restart, `million` with a million runs and a few restarts.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::client::{self, HOLD, LABEL};
use super::server::{self, ChildServer, Pool};
use super::stats::{closed_loop, millis, Problems, Summary, OP_TIMEOUT};
use aaa::proto::{watch_approvals_response, ListApprovalsRequest, WatchApprovalsRequest};

/// Concurrent StartRun calls while parking.
const STARTERS: usize = 64;
/// The longest parking may take, whatever N.
const PARK_LIMIT: Duration = Duration::from_secs(900);
/// ListApprovals first-page calls timed.
const LIST_CALLS: usize = 20;
/// `GET /metrics` calls timed.
const SCRAPES: usize = 5;
/// kill -9 and restarts of the million scenario: a range, not one sample.
pub const MILLION_RESTARTS: usize = 3;

#[derive(Debug, Default, Serialize)]
pub struct Parked {
    pub parked: usize,
    pub parked_per_second: f64,
    pub rss_before_kib: Option<u64>,
    pub rss_parked_kib: Option<u64>,
    /// (rss_parked - rss_before) / parked. Not linear in N (caches fill
    /// up), so it does not project: the memory target is judged at 100k.
    pub kib_per_parked: Option<f64>,
    pub list_first_page: Summary,
    pub snapshot_ms: f64,
    pub snapshot_pending: u32,
    /// `GET /metrics`, after the snapshot.
    pub metrics_scrape: Summary,
    /// One per kill -9 and restart.
    pub restarts: Vec<Restart>,
    pub problems: Problems,
}

/// What one kill -9 and restart took.
#[derive(Debug, Default, Serialize)]
pub struct Restart {
    /// From the restart (spawn after kill -9) to Health/Check SERVING.
    pub ready_ms: f64,
    pub rss_kib: Option<u64>,
    /// ListApprovals' first page, asked right after SERVING.
    pub first_page_ms: f64,
    /// From the grant of one of that page's approvals to its run completing.
    pub grant_to_completed_ms: f64,
    /// From the restart to that run completing.
    pub first_approval_ms: f64,
}

impl Parked {
    /// Items of the WatchApprovals snapshot per second.
    pub fn snapshot_per_second(&self) -> f64 {
        self.snapshot_pending as f64 / (self.snapshot_ms / 1000.0).max(1e-9)
    }
}

/// `child` is the server behind `addr` when the bench started it (then
/// RSS and `restarts` restarts are measured), None for `--server`.
pub async fn run(
    addr: &str,
    child: Option<&mut ChildServer>,
    session: &str,
    count: usize,
    restarts: usize,
) -> anyhow::Result<Parked> {
    let pool = Pool::connect(addr, 8).await?;
    client::register_tools(&pool).await?;
    let mut out = Parked {
        rss_before_kib: child.as_ref().and_then(|c| c.rss_kib()),
        ..Default::default()
    };

    eprintln!("aaa bench: parking {count} runs");
    let start = Instant::now();
    out.parked = park(&pool, session, count, &mut out.problems).await;
    out.parked_per_second = out.parked as f64 / start.elapsed().as_secs_f64().max(1e-9);
    out.rss_parked_kib = child.as_ref().and_then(|c| c.rss_kib());
    if let (Some(before), Some(parked)) = (out.rss_before_kib, out.rss_parked_kib) {
        let per = parked.saturating_sub(before) as f64 / out.parked.max(1) as f64;
        out.kib_per_parked = Some(per);
    }

    list_first_page(&pool, &mut out).await;

    match snapshot(&pool).await {
        Ok((elapsed, pending)) => {
            out.snapshot_ms = millis(elapsed);
            out.snapshot_pending = pending;
            // Our own server holds only this session's runs.
            let enough = match child {
                Some(_) => pending as usize == out.parked,
                None => pending as usize >= out.parked,
            };
            if !enough {
                let parked = out.parked;
                let message = format!("the snapshot has {pending} pending, {parked} parked");
                out.problems.add(message);
            }
        }
        Err(message) => out.problems.add(message),
    }

    let own_server = child.is_some();
    scrape_metrics(addr, own_server, &mut out).await;

    if let Some(child) = child {
        for _ in 0..restarts {
            let restart = restart_and_approve(child, session, &mut out.problems).await?;
            out.restarts.push(restart);
        }
    }
    Ok(out)
}

/// Starts `count` runs of the gated hold tool and waits until their
/// approval requests are out. A watch opened first counts them, so the bench
/// knows when all runs are parked without polling. Returns how many started.
async fn park(pool: &Pool, session: &str, count: usize, problems: &mut Problems) -> usize {
    let watcher = tokio::spawn(count_requests(pool.clone(), session.to_string(), count));
    let (starters, session) = (pool.clone(), session.to_string());
    let started = closed_loop(STARTERS, count, PARK_LIMIT, move |_, _| {
        let (mut runs, session) = (starters.runs(), session.clone());
        async move {
            client::start_run(&mut runs, HOLD, &session)
                .await
                .map(|_| ())
        }
    })
    .await;
    let done = started.done();
    problems.merge(started.problems);
    let stop_watch = watcher.abort_handle();
    let seen = match tokio::time::timeout(OP_TIMEOUT, watcher).await {
        Ok(Ok(Ok(seen))) => seen,
        Ok(Ok(Err(message))) => {
            problems.add(message);
            0
        }
        _ => {
            stop_watch.abort();
            0
        }
    };
    if seen < done {
        problems.add(format!(
            "{done} runs started, {seen} approval requests seen"
        ));
    }
    done
}

/// Times ListApprovals' first page a few times.
async fn list_first_page(pool: &Pool, out: &mut Parked) {
    let mut approvals = pool.approvals();
    let mut samples = Vec::with_capacity(LIST_CALLS);
    for _ in 0..LIST_CALLS {
        let t0 = Instant::now();
        let page = match approvals
            .list_approvals(ListApprovalsRequest::default())
            .await
        {
            Ok(page) => page.into_inner(),
            Err(status) => {
                out.problems.add(format!("ListApprovals: {status}"));
                continue;
            }
        };
        samples.push(t0.elapsed());
        if page.approvals.len() < out.parked.min(50) {
            let message = format!("ListApprovals' first page has {}", page.approvals.len());
            out.problems.add(message);
        }
    }
    out.list_first_page = Summary::of(&mut samples);
}

/// Times `GET /metrics` a few times; on the bench's own server, its count
/// of waiting runs must be the runs parked.
async fn scrape_metrics(addr: &str, own_server: bool, out: &mut Parked) {
    let mut samples = Vec::with_capacity(SCRAPES);
    for _ in 0..SCRAPES {
        let t0 = Instant::now();
        let text = match tokio::time::timeout(OP_TIMEOUT, get_metrics(addr)).await {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => return out.problems.add(format!("GET /metrics: {e}")),
            Err(_) => return out.problems.add("GET /metrics timed out".to_string()),
        };
        samples.push(t0.elapsed());
        let waiting = text.lines().find_map(|line| {
            line.strip_prefix(r#"aaa_runs{status="waiting"} "#)?
                .trim()
                .parse::<usize>()
                .ok()
        });
        if own_server && waiting != Some(out.parked) {
            let message = format!(
                "/metrics counts {waiting:?} runs waiting, {} parked",
                out.parked
            );
            out.problems.add(message);
        }
    }
    out.metrics_scrape = Summary::of(&mut samples);
}

/// The body of `GET /metrics` (HTTP/1.1 on the gRPC port). One plain
/// request by hand: `aaa::https::client` would need a trust store for a
/// loopback read over plain HTTP.
async fn get_metrics(addr: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(std::io::Error::other(format!(
            "answered {}",
            response.lines().next().unwrap_or("nothing")
        ))),
    }
}

/// kill -9, restart on the same data; times readiness and the first
/// ListApprovals page, then grants one of this session's approvals on that
/// page, with a worker serving the hold tool, and times the run's end.
async fn restart_and_approve(
    child: &mut ChildServer,
    session: &str,
    problems: &mut Problems,
) -> anyhow::Result<Restart> {
    eprintln!("aaa bench: kill -9 and restart");
    child.kill9();
    let restart = Instant::now();
    child.resume().await?;
    server::wait_serving(child.addr()).await?;
    let mut out = Restart {
        ready_ms: millis(restart.elapsed()),
        rss_kib: child.rss_kib(),
        ..Default::default()
    };

    let pool = Pool::connect(child.addr(), 2).await?;
    let listed = Instant::now();
    let page = pool
        .approvals()
        .list_approvals(ListApprovalsRequest::default())
        .await;
    out.first_page_ms = millis(listed.elapsed());
    let approval = match page {
        Ok(page) => page
            .into_inner()
            .approvals
            .into_iter()
            .find(|a| a.labels.get(LABEL).map(String::as_str) == Some(session)),
        Err(status) => {
            problems.add(format!("ListApprovals after restart: {status}"));
            None
        }
    };
    let Some(approval) = approval else {
        problems.add("no pending approval of this session after restart");
        return Ok(out);
    };

    let stop = CancellationToken::new();
    let worker = tokio::spawn(client::serve_tool(
        pool.clone(),
        HOLD,
        1,
        None,
        stop.clone(),
    ));
    let granted = Instant::now();
    let mut runs = pool.runs();
    let cycle = async {
        client::grant(&mut runs, &approval.run_id, &approval.call_id).await?;
        client::wait_completed(&mut runs, &approval.run_id).await
    };
    match cycle.await {
        Ok(()) => {
            out.first_approval_ms = millis(restart.elapsed());
            out.grant_to_completed_ms = millis(granted.elapsed());
        }
        Err(message) => problems.add(message),
    }
    stop.cancel();
    problems.merge(client::join_helper(worker).await);
    Ok(out)
}

/// Reads WatchApprovals(tool = hold) until `count` requests of this session
/// were seen; returns how many.
async fn count_requests(pool: Pool, session: String, count: usize) -> Result<usize, String> {
    use watch_approvals_response::Item;
    let request = WatchApprovalsRequest {
        tool: HOLD.into(),
        heartbeat_s: 1.0,
        ..Default::default()
    };
    let mut stream = pool
        .approvals()
        .watch_approvals(request)
        .await
        .map_err(|s| format!("WatchApprovals: {s}"))?
        .into_inner();
    let mut seen = 0;
    let deadline = Instant::now() + PARK_LIMIT + OP_TIMEOUT;
    while seen < count && Instant::now() < deadline {
        let item = stream
            .message()
            .await
            .map_err(|s| format!("WatchApprovals: {s}"))?
            .ok_or("WatchApprovals ended")?;
        if let Some(Item::Requested(approval)) = item.item {
            if approval.labels.get(LABEL) == Some(&session) {
                seen += 1;
            }
        }
    }
    Ok(seen)
}

/// Time from WatchApprovals to its snapshot_complete, and the pending count.
async fn snapshot(pool: &Pool) -> Result<(Duration, u32), String> {
    use watch_approvals_response::Item;
    let t0 = Instant::now();
    let read = async {
        let mut stream = pool
            .approvals()
            .watch_approvals(WatchApprovalsRequest::default())
            .await?
            .into_inner();
        while let Some(item) = stream.message().await? {
            if let Some(Item::SnapshotComplete(done)) = item.item {
                return Ok(Some(done.pending));
            }
        }
        Ok::<_, tonic::Status>(None)
    };
    match tokio::time::timeout(OP_TIMEOUT, read).await {
        Ok(Ok(Some(pending))) => Ok((t0.elapsed(), pending)),
        Ok(Ok(None)) => Err("WatchApprovals ended before snapshot_complete".into()),
        Ok(Err(status)) => Err(format!("WatchApprovals: {status}")),
        Err(_) => Err(format!("no snapshot_complete within {OP_TIMEOUT:?}")),
    }
}
