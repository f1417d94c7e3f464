//! Fan-out: many StreamEvents followers of one run while one client appends
//! events to it through Signal, one at a time. Checks that every follower
//! gets every event, in order, and measures each delivery's lag: the
//! instant a follower received seq N minus the instant the Signal that
//! appended seq N was sent.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::appends::park_runs;
use super::client;
use super::server::Pool;
use super::stats::{Problems, Summary, OP_TIMEOUT};
use aaa::proto::{stream_events_response, StreamEventsRequest};

/// Followers per HTTP/2 connection (the server allows 200 streams on one).
const FOLLOWERS_PER_CONNECTION: usize = 100;

#[derive(Debug, Serialize)]
pub struct Fanout {
    pub followers: usize,
    /// Events appended.
    pub events: usize,
    /// Appends per second of the one appending client.
    pub appends_per_second: f64,
    /// Deliveries expected (followers x events) and received.
    pub expected: usize,
    pub delivered: usize,
    pub missed: usize,
    /// Receive instant minus the Signal's send instant, over every delivery.
    pub lag: Summary,
    /// Receive instant minus the Signal's answer instant (negative ones count as 0).
    pub lag_after_ack: Summary,
    pub problems: Problems,
}

/// What one follower saw: (seq, instant received), in arrival order.
type Received = Vec<(u64, Instant)>;

pub async fn run(
    addr: &str,
    session: &str,
    followers: usize,
    events: usize,
    limit: Duration,
) -> anyhow::Result<Fanout> {
    let connections = followers.div_ceil(FOLLOWERS_PER_CONNECTION).max(4);
    let pool = Pool::connect(addr, connections).await?;
    let run_id = park_runs(&pool, session, 1).await?.remove(0);
    let response = pool
        .runs()
        .get_run(aaa::proto::GetRunRequest {
            run_id: run_id.clone(),
        })
        .await?;
    let base = response.into_inner().run.map_or(0, |r| r.last_seq);
    let mut problems = Problems::default();

    // Followers subscribe after `base` and report when they are live.
    let (ready_tx, mut ready) = mpsc::channel::<()>(followers.max(1));
    let (last_tx, last) = watch::channel::<Option<u64>>(None);
    let give_up = CancellationToken::new();
    let mut tasks = JoinSet::new();
    for _ in 0..followers {
        let request = StreamEventsRequest {
            run_id: run_id.clone(),
            after_seq: base,
            follow: true,
            ..Default::default()
        };
        let follower = follow(
            pool.clone(),
            request,
            ready_tx.clone(),
            last.clone(),
            give_up.clone(),
        );
        tasks.spawn(follower);
    }
    drop(ready_tx);
    let all_ready = async {
        for _ in 0..followers {
            if ready.recv().await.is_none() {
                return false;
            }
        }
        true
    };
    if !tokio::time::timeout(OP_TIMEOUT, all_ready)
        .await
        .unwrap_or(false)
    {
        problems.add("not every follower caught up before the appends");
    }

    eprintln!("aaa bench: fan-out, {followers} followers, up to {events} events");
    let start = Instant::now();
    let (sent, acked) = append(&pool, &run_id, base, events, limit, &mut problems).await;
    let appended = acked.len();
    let appends_per_second = appended as f64 / start.elapsed().as_secs_f64().max(1e-9);
    last_tx.send_replace(Some(base + appended as u64));

    // Followers end when they have the last seq; give up after a grace period.
    let grace = tokio::spawn({
        let give_up = give_up.clone();
        async move {
            tokio::time::sleep(OP_TIMEOUT).await;
            give_up.cancel();
        }
    });
    let mut lags = Vec::with_capacity(followers * appended);
    let mut lags_after_ack = Vec::with_capacity(followers * appended);
    let mut delivered = 0;
    while let Some(joined) = tasks.join_next().await {
        let (received, follower_problems) = match joined {
            Ok(result) => result,
            Err(e) => {
                problems.add(format!("a follower panicked: {e}"));
                continue;
            }
        };
        problems.merge(follower_problems);
        for (seq, at) in received {
            let Some(i) = seq.checked_sub(base + 1).map(|i| i as usize) else {
                continue;
            };
            if i < appended {
                delivered += 1;
                lags.push(at.saturating_duration_since(sent[i]));
                lags_after_ack.push(at.saturating_duration_since(acked[i]));
            }
        }
    }
    grace.abort();
    let expected = followers * appended;
    let missed = expected.saturating_sub(delivered);
    if missed > 0 {
        problems.add(format!("{missed} of {expected} deliveries missed"));
    }
    problems.merge(client::cancel_all(&pool, &[run_id]).await);
    Ok(Fanout {
        followers,
        events: appended,
        appends_per_second,
        expected,
        delivered,
        missed,
        lag: Summary::of(&mut lags),
        lag_after_ack: Summary::of(&mut lags_after_ack),
        problems,
    })
}

/// Appends up to `count` events to the run, one Signal at a time, checking
/// each lands at the next seq after `base`. Returns, per event, the instant
/// its Signal was sent and the instant it was answered.
async fn append(
    pool: &Pool,
    run_id: &str,
    base: u64,
    count: usize,
    limit: Duration,
    problems: &mut Problems,
) -> (Vec<Instant>, Vec<Instant>) {
    let mut rpc = pool.runs();
    let (mut sent, mut acked) = (Vec::with_capacity(count), Vec::with_capacity(count));
    let start = Instant::now();
    for i in 0..count {
        if start.elapsed() > limit {
            break;
        }
        let expected = base + 1 + i as u64;
        let t0 = Instant::now();
        let data = format!(r#"{{"i":{i}}}"#);
        match client::signal(&mut rpc, run_id, "bench.note", data).await {
            Ok(seq) if seq == expected => {
                sent.push(t0);
                acked.push(Instant::now());
            }
            Ok(seq) => {
                problems.add(format!("append {i} got seq {seq}, not {expected}"));
                break;
            }
            Err(message) => {
                problems.add(message);
                break;
            }
        }
    }
    (sent, acked)
}

/// One follower: says when it is live (caught_up), then records each event
/// until it has the last seq announced on `last`, or `give_up`.
async fn follow(
    pool: Pool,
    request: StreamEventsRequest,
    ready: mpsc::Sender<()>,
    mut last: watch::Receiver<Option<u64>>,
    give_up: CancellationToken,
) -> (Received, Problems) {
    let mut received = Received::new();
    let mut problems = Problems::default();
    let mut expected = request.after_seq + 1;
    let mut stream = match pool.runs().stream_events(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            problems.add(format!("StreamEvents: {status}"));
            return (received, problems);
        }
    };
    loop {
        if last.borrow_and_update().is_some_and(|last| expected > last) {
            break;
        }
        let message = tokio::select! {
            message = stream.message() => message,
            changed = last.changed() => match changed {
                Ok(()) => continue,
                Err(_) => break,
            },
            _ = give_up.cancelled() => break,
        };
        let item = match message {
            Ok(Some(response)) => response.item,
            Ok(None) => {
                problems.add("a follower's stream ended");
                break;
            }
            Err(status) => {
                problems.add(format!("StreamEvents: {status}"));
                break;
            }
        };
        match item {
            Some(stream_events_response::Item::Event(event)) => {
                if event.seq != expected {
                    problems.add(format!(
                        "follower got seq {}, expected {expected}",
                        event.seq
                    ));
                }
                received.push((event.seq, Instant::now()));
                expected = event.seq + 1;
            }
            Some(stream_events_response::Item::CaughtUp(_)) => {
                let _ = ready.send(()).await;
            }
            None => {}
        }
    }
    (received, problems)
}
