//! A long history: one run, parked at approval, with N application events
//! appended by Signal. Measures StreamEvents from the start, a Signal on it
//! against one on a short run, GetRun, and (on a server the bench started)
//! the first Signal after kill -9 and restart, which rebuilds the run's
//! state from its events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::appends::park_runs;
use super::client;
use super::server::{self, ChildServer, Pool, RunClient};
use super::stats::{closed_loop, millis, one_at_a_time, Problems, Summary, OP_TIMEOUT};
use aaa::proto::{stream_events_response, GetRunRequest, StreamEventsRequest};

/// Signals in flight while the history is written (they queue on the
/// run's lock in the server; more in flight only hides the round trips).
const WRITERS: usize = 16;
/// The longest writing the history may take.
const WRITE_LIMIT: Duration = Duration::from_secs(300);
/// Reads of the whole history timed.
const READS: usize = 3;
/// Calls timed for each latency figure (a tenth as many more warm up).
const CALLS: usize = 500;
const EVENT_TYPE: &str = "bench.tick";

#[derive(Debug, Default, Serialize)]
pub struct Long {
    /// Events of the long run (its engine events and the Signals).
    pub events: u64,
    pub appended_per_second: f64,
    /// StreamEvents from seq 0 to caught-up, events/s, one per read.
    pub stream_per_second: Vec<f64>,
    /// One Signal at a time on the long run, and on a short one, taken
    /// in turns.
    pub signal_long: Summary,
    pub signal_short: Summary,
    pub get_run: Summary,
    /// From the spawn after kill -9 to Health/Check SERVING.
    pub ready_ms: Option<f64>,
    /// The first Signal on the long run after the restart: the engine
    /// rebuilds the run's state from its events first.
    pub first_signal_after_restart_ms: Option<f64>,
    /// The Signals on the long run after that one.
    pub signal_after_restart: Option<Summary>,
    pub problems: Problems,
}

/// `child` is the server behind `addr` when the bench started it (then the
/// restart is measured), None for `--server`.
pub async fn run(
    addr: &str,
    child: Option<&mut ChildServer>,
    session: &str,
    count: usize,
    limit: Duration,
) -> anyhow::Result<Long> {
    let pool = Pool::connect(addr, 2).await?;
    client::register_tools(&pool).await?;
    let mut out = Long::default();
    let parked = park_runs(&pool, session, 2).await?;
    let (long, short) = (parked[0].clone(), parked[1].clone());

    eprintln!("aaa bench: long run, appending {count} events");
    let (writers, run_id) = (pool.clone(), Arc::new(long.clone()));
    let written = closed_loop(WRITERS, count, WRITE_LIMIT, move |_, round| {
        let (mut runs, run_id) = (writers.runs(), run_id.clone());
        async move {
            let data = format!(r#"{{"n":{round}}}"#);
            client::signal(&mut runs, &run_id, EVENT_TYPE, data)
                .await
                .map(|_| ())
        }
    })
    .await;
    out.appended_per_second = written.per_second();
    if written.done() < count {
        let done = written.done();
        out.problems.add(format!(
            "{done} of {count} events appended in {WRITE_LIMIT:?}"
        ));
    }
    out.problems.merge(written.problems);

    eprintln!("aaa bench: long run, reading it whole {READS} times");
    let mut runs = pool.runs();
    for _ in 0..READS {
        match read_all(&mut runs, &long).await {
            Ok((events, elapsed)) => {
                out.events = events;
                out.stream_per_second
                    .push(events as f64 / elapsed.as_secs_f64().max(1e-9));
            }
            Err(message) => out.problems.add(message),
        }
    }

    eprintln!("aaa bench: long run, Signal and GetRun latency");
    let (mut on_long, mut on_short) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + limit;
    for i in 0..CALLS + CALLS / 10 {
        if Instant::now() > deadline {
            break;
        }
        for (run_id, samples) in [(&long, &mut on_long), (&short, &mut on_short)] {
            let t0 = Instant::now();
            match client::signal(&mut runs, run_id, EVENT_TYPE, "{}".into()).await {
                Ok(_) if i >= CALLS / 10 => samples.push(t0.elapsed()),
                Ok(_) => {}
                Err(message) => out.problems.add(message),
            }
        }
    }
    out.signal_long = Summary::of(&mut on_long);
    out.signal_short = Summary::of(&mut on_short);
    let (get_run, problems) =
        one_at_a_time(CALLS, limit, || get_run(runs.clone(), long.clone())).await;
    out.get_run = get_run;
    out.problems.merge(problems);

    if let Some(child) = child {
        eprintln!("aaa bench: long run, kill -9 and restart");
        child.kill9();
        let restart = Instant::now();
        child.resume().await?;
        server::wait_serving(child.addr()).await?;
        out.ready_ms = Some(millis(restart.elapsed()));
        let mut runs = Pool::connect(child.addr(), 1).await?.runs();
        let t0 = Instant::now();
        match client::signal(&mut runs, &long, EVENT_TYPE, "{}".into()).await {
            Ok(_) => out.first_signal_after_restart_ms = Some(millis(t0.elapsed())),
            Err(message) => out.problems.add(message),
        }
        let (after, problems) = one_at_a_time(CALLS, limit, || {
            let (mut runs, long) = (runs.clone(), long.clone());
            async move {
                client::signal(&mut runs, &long, EVENT_TYPE, "{}".into())
                    .await
                    .map(|_| ())
            }
        })
        .await;
        out.signal_after_restart = Some(after);
        out.problems.merge(problems);
    }
    Ok(out)
}

async fn get_run(mut runs: RunClient, run_id: String) -> Result<(), String> {
    let request = GetRunRequest { run_id };
    runs.get_run(request)
        .await
        .map(|_| ())
        .map_err(|s| format!("GetRun: {s}"))
}

/// Reads the run's events from the start to the caught-up marker; checks
/// that every seq came, in order. Returns how many, and how long it took.
async fn read_all(runs: &mut RunClient, run_id: &str) -> Result<(u64, Duration), String> {
    use stream_events_response::Item;
    let request = StreamEventsRequest {
        run_id: run_id.into(),
        after_seq: 0,
        follow: false,
        ..Default::default()
    };
    let t0 = Instant::now();
    let read = async {
        let mut stream = runs.stream_events(request).await?.into_inner();
        let mut seen = 0;
        while let Some(item) = stream.message().await? {
            match item.item {
                Some(Item::Event(event)) if event.seq == seen + 1 => seen = event.seq,
                Some(Item::Event(event)) => {
                    return Ok(Err(format!("event {} after {seen}", event.seq)))
                }
                Some(Item::CaughtUp(up)) if up.last_seq == seen => return Ok(Ok(seen)),
                Some(Item::CaughtUp(up)) => {
                    return Ok(Err(format!("caught up at {} after {seen}", up.last_seq)))
                }
                _ => {}
            }
        }
        Ok::<_, tonic::Status>(Err("StreamEvents ended before caught-up".into()))
    };
    match tokio::time::timeout(OP_TIMEOUT, read).await {
        Ok(Ok(Ok(seen))) => Ok((seen, t0.elapsed())),
        Ok(Ok(Err(message))) => Err(format!("StreamEvents {run_id}: {message}")),
        Ok(Err(status)) => Err(format!("StreamEvents {run_id}: {status}")),
        Err(_) => Err(format!("StreamEvents {run_id}: not read in {OP_TIMEOUT:?}")),
    }
}
