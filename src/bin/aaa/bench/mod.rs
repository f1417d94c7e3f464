//! `aaa bench`: the benchmark harness. It starts its own server (this
//! executable, `serve` on an ephemeral port and a scratch data dir) or
//! targets `--server`, runs the scenarios of issue 9 with bounded counts
//! and time, prints a table with the targets beside the figures, and
//! writes the figures as JSON.
//!
//! Scenarios (`--only`, comma-separated):
//! - `floors`: the no-op gRPC round trip and the store's group-commit ceiling;
//! - `cycle`: the approval cycle at 1, 16 and 64 runs in flight;
//! - `appends`: Signal appends from 64 clients, each on its own parked run;
//! - `fanout`: followers of one run while events are appended to it;
//! - `parked`: N runs waiting for approval, memory, listing, kill -9 and restart;
//! - `million`: the same with a million runs and issue 24's targets;
//! - `long`: one run with 100,000 events: reading it, appending to it,
//!   GetRun, and rebuilding its state after kill -9;
//! - `retention`: a steady load of cycles with a short retention, and the
//!   data dir's size over time;
//! - `cluster` (`--cluster N`, with `--store`): 1..=N servers on one
//!   database, the cycle spread over all of them, forwarding's cost, and a
//!   kill -9 of the owner;
//! - `probe`: with auth on, whether a runner can tell another principal's
//!   runs from unknown run ids by how long NOT_FOUND takes.
//!
//! `million`, `long` and `retention` take minutes: a full run does them
//! only when `--only` names them; `--smoke` does every scenario. `probe`
//! runs when named, and in the smoke run of a server the bench starts.
//!
//! The floors a selected scenario is judged against are measured with it.
//! Every figure is reported; a correctness problem (an RPC error, a wrong
//! end of run, a missed event) makes the command fail. Missed speed targets
//! fail it too, except with `--smoke`, which CI runs.

mod appends;
mod client;
mod cluster;
mod committers;
mod cycle;
mod fanout;
mod floors;
mod long;
mod parked;
mod postgres;
mod probe;
mod proc;
mod report;
mod retention;
mod server;
mod stages;
mod stats;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use serde::Serialize;

use server::{ChildServer, Pool};
use stats::Problems;

/// Benchmark a server: approval cycles, Signal appends, fan-out, parked runs.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Tiny counts, seconds in all; fails only on correctness problems, never on speed.
    #[arg(long)]
    pub smoke: bool,
    /// Benchmark this running server (host:port) instead of starting one;
    /// it should serve only the bench (the bench's worker takes any
    /// wire_money task). The parked scenario then measures no memory and
    /// does no restart, and leaves its runs parked.
    #[arg(long, env = "AAA_BENCH_SERVER")]
    pub server: Option<String>,
    /// Run the servers the bench starts on this PostgreSQL database, each
    /// in a scratch schema it drops at the end, and measure the database's
    /// commit floor (see docs/postgres.md).
    #[arg(long, env = "AAA_BENCH_STORE", conflicts_with = "server", value_parser = postgres_url)]
    pub store: Option<String>,
    /// Measure clusters of 1 to N servers on the `--store` database (the
    /// cluster scenario; the only one run unless `--only` names others).
    #[arg(long, requires = "store", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub cluster: Option<u16>,
    /// With --cluster: one owner and standbys (`aaa serve --one-owner`,
    /// `--standby`) instead of servers that share the shards out (the
    /// default, as `aaa serve`'s).
    #[arg(long, requires = "cluster")]
    pub one_owner: bool,
    /// With --cluster: servers that share the shards out. The default; the
    /// flag is kept so that older command lines still work.
    #[arg(long, requires = "cluster", conflicts_with = "one_owner")]
    pub spread_shards: bool,
    /// With --cluster: send every call to the servers in turn, as a client
    /// that does not route (grpcurl, the CLI) does, instead of a run's
    /// writes to its owner as the SDKs do (GetCluster's shard owners).
    #[arg(long, requires = "cluster")]
    pub unrouted: bool,
    /// Where to write the figures as JSON.
    #[arg(long, default_value = "bench.json")]
    pub out: PathBuf,
    /// Runs to park in the parked scenario [default: 100000, 200 with --smoke].
    #[arg(long)]
    pub parked: Option<usize>,
    /// Runs to park in the million scenario [default: 1000000, 300 with --smoke].
    #[arg(long)]
    pub million: Option<usize>,
    /// Events of the long run [default: 100000, 300 with --smoke].
    #[arg(long)]
    pub long_events: Option<usize>,
    /// How long the retention scenario's load lasts, in seconds [default:
    /// 120, 4 with --smoke].
    #[arg(long)]
    pub retention_s: Option<u64>,
    /// Upper bound of each load loop, in seconds.
    #[arg(long, default_value_t = 20.0)]
    pub duration_s: f64,
    /// Run only these scenarios (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Scenario>,
    /// Pairs of calls of each read in the probe scenario [default: 4000,
    /// 200 with --smoke].
    #[arg(long)]
    pub probe_pairs: Option<usize>,
    /// With --server, the probe scenario's prober: the token of a principal
    /// with the runner role and not reader.
    #[arg(long, env = "AAA_BENCH_PROBE_TOKEN", hide_env_values = true)]
    pub probe_token: Option<String>,
    /// With --server, the probe scenario's victim, whose runs the prober
    /// asks about: another runner principal's token.
    #[arg(long, env = "AAA_BENCH_PROBE_VICTIM_TOKEN", hide_env_values = true)]
    pub probe_victim_token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// No-op gRPC round trip and calls/s with 64 in flight, the store's
    /// group-commit ceiling and its commit latency with one writer.
    Floors,
    /// The approval cycle at 1, 16 and 64 runs in flight.
    Cycle,
    /// Signal appends from 64 clients.
    Appends,
    /// StreamEvents followers of one run while events are appended.
    Fanout,
    /// Runs waiting for approval: memory, listing, kill -9 and restart.
    Parked,
    /// A million runs waiting for approval (issue 24's targets).
    Million,
    /// One run with a long history: StreamEvents, Signal, GetRun, restart.
    Long,
    /// Steady cycles with a short retention: does the data dir stop growing?
    Retention,
    /// 1..=N servers on one PostgreSQL (`--cluster N`, default 3): cycles
    /// spread over all, forwarded latency, kill -9 of the owner.
    Cluster,
    /// Commit rounds of 1, 2 and 4 committers (store handles) on disjoint
    /// shards of one PostgreSQL, and how much they wait on locks.
    Committers,
    /// With auth on: a runner times NOT_FOUND for another principal's runs
    /// against unknown run ids (GetRun, StreamEvents, Signal).
    Probe,
}

fn postgres_url(text: &str) -> Result<String, String> {
    match text.starts_with("postgres://") || text.starts_with("postgresql://") {
        true => Ok(text.to_string()),
        false => Err("expected a postgres:// URL".into()),
    }
}

/// Concurrent writers of the store ceiling and clients of the appends scenario.
const WRITERS: usize = 64;
/// Connections of the load pool. Two, not eight: more streams per
/// connection means fewer, fuller writes on both sides (server CPU per
/// cycle 0.75-0.79 against 0.84-0.90 ms back to back, Signal appends the
/// same), and 64 cycles in flight stay under 200 streams per connection.
const CONNECTIONS: usize = 2;

/// The counts of one bench run.
struct Plan {
    rtt_calls: usize,
    noop_calls: usize,
    store_appends: usize,
    /// Commits of the one-writer floor, one at a time.
    one_writer_commits: usize,
    /// (runs in flight, most cycles) per level.
    cycle_levels: [(usize, usize); 3],
    appends: usize,
    followers: usize,
    fanout_events: usize,
    parked: usize,
    million: usize,
    long_events: usize,
    retention: retention::Plan,
    /// Most cycles at 64 in flight per cluster size.
    cluster_cycles: usize,
    /// Runs parked for the cluster's failover.
    failover_parked: usize,
    /// Pairs of calls of each read in the probe scenario.
    probe_pairs: usize,
    limit: Duration,
}

impl Plan {
    fn new(args: &BenchArgs) -> anyhow::Result<Plan> {
        if !(args.duration_s.is_finite() && args.duration_s > 0.0 && args.duration_s < 1e6) {
            bail!(
                "--duration-s: {} is not a positive number of seconds",
                args.duration_s
            );
        }
        let limit = Duration::from_secs_f64(args.duration_s);
        Ok(match args.smoke {
            true => Plan {
                rtt_calls: 200,
                noop_calls: 2_000,
                store_appends: 2_000,
                one_writer_commits: 200,
                cycle_levels: [(1, 20), (16, 20), (64, 64)],
                appends: 200,
                followers: 20,
                fanout_events: 50,
                parked: args.parked.unwrap_or(200),
                million: args.million.unwrap_or(300),
                long_events: args.long_events.unwrap_or(300),
                retention: retention::Plan::smoke(args.retention_s),
                cluster_cycles: 64,
                failover_parked: 5,
                probe_pairs: args.probe_pairs.unwrap_or(200),
                limit,
            },
            false => Plan {
                rtt_calls: 5_000,
                noop_calls: 500_000,
                store_appends: 500_000,
                one_writer_commits: 5_000,
                cycle_levels: [(1, 2_000), (16, 20_000), (64, 50_000)],
                appends: 500_000,
                followers: 1_000,
                fanout_events: 1_000,
                parked: args.parked.unwrap_or(100_000),
                million: args.million.unwrap_or(1_000_000),
                long_events: args.long_events.unwrap_or(100_000),
                retention: retention::Plan::full(args.retention_s),
                cluster_cycles: 20_000,
                failover_parked: 20,
                probe_pairs: args.probe_pairs.unwrap_or(4_000),
                limit,
            },
        })
    }
}

/// Everything measured; a scenario that did not run is absent.
#[derive(Debug, Default, Serialize)]
pub struct Results {
    /// "embedded" or "postgres": which store the servers ran on.
    store: &'static str,
    postgres_floor: Option<postgres::Floor>,
    rtt: Option<floors::Rtt>,
    noop: Option<floors::NoopCalls>,
    store_ceiling: Option<floors::StoreAppends>,
    store_one_writer: Option<floors::StoreAppends>,
    cycle: Option<cycle::Cycle>,
    appends: Option<appends::Appends>,
    fanout: Option<fanout::Fanout>,
    parked: Option<parked::Parked>,
    million: Option<parked::Parked>,
    long: Option<long::Long>,
    retention: Option<retention::Retention>,
    cluster: Option<cluster::Cluster>,
    committers: Option<committers::Committers>,
    probe: Option<probe::Probe>,
    /// Scenarios that could not run to the end, with why.
    failed: Vec<String>,
}

impl Results {
    /// Every correctness problem of every scenario.
    fn problems(&self) -> Problems {
        let mut all = Problems::default();
        let mut add = |p: &Problems| all.merge(p.clone());
        self.rtt.iter().for_each(|r| add(&r.problems));
        self.noop.iter().for_each(|n| add(&n.problems));
        self.store_ceiling.iter().for_each(|s| add(&s.problems));
        self.postgres_floor.iter().for_each(|f| add(&f.problems));
        self.store_one_writer.iter().for_each(|s| add(&s.problems));
        if let Some(cycle) = &self.cycle {
            add(&cycle.problems);
            cycle.levels.iter().for_each(|l| add(&l.problems));
        }
        self.appends.iter().for_each(|a| add(&a.problems));
        self.fanout.iter().for_each(|f| add(&f.problems));
        self.parked.iter().for_each(|p| add(&p.problems));
        self.million.iter().for_each(|p| add(&p.problems));
        self.long.iter().for_each(|l| add(&l.problems));
        self.retention.iter().for_each(|r| add(&r.problems));
        self.committers.iter().for_each(|c| add(&c.problems));
        if let Some(cluster) = &self.cluster {
            add(&cluster.problems);
            cluster.sizes.iter().for_each(|s| add(&s.cycle.problems));
        }
        self.probe.iter().for_each(|p| add(&p.problems));
        for failure in &self.failed {
            all.add(failure.clone());
        }
        all
    }

    fn record<T>(&mut self, scenario: &str, result: anyhow::Result<T>) -> Option<T> {
        result
            .map_err(|e| self.failed.push(format!("{scenario}: {e:#}")))
            .ok()
    }
}

/// Runs the bench, prints the table and writes the JSON. Fails on any
/// correctness problem, and (without `--smoke`) on a missed target.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let plan = Plan::new(&args)?;
    // On Ctrl-C, dropping `measure` kills the servers it started and
    // removes their scratch dirs.
    let results = tokio::select! {
        results = measure(&args, &plan) => results?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
    };

    let table = report::table(&results);
    let problems = results.problems();
    let json = serde_json::json!({
        "mode": if args.smoke { "smoke" } else { "full" },
        "server": args.server.as_deref().unwrap_or("child"),
        "store": results.store,
        "duration_s": args.duration_s,
        "results": results,
        "table": table.rows,
        "problems": problems,
    });
    let text = serde_json::to_string_pretty(&json)?;
    std::fs::write(&args.out, text + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!();
    table.print(args.smoke);
    println!("\nfigures written to {}", args.out.display());

    if !problems.is_empty() {
        bail!(
            "{} correctness problems: {:?}",
            problems.count,
            problems.first
        );
    }
    let missed = table.failed_targets();
    if missed > 0 && !args.smoke {
        bail!("{missed} targets missed");
    }
    Ok(())
}

/// Runs the selected scenarios.
async fn measure(args: &BenchArgs, plan: &Plan) -> anyhow::Result<Results> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let session = format!("{}-{nanos}", std::process::id());
    let database = args
        .store
        .as_deref()
        .map(|url| postgres::Database::new(url, &session));
    let mut results = Results {
        store: if database.is_some() {
            "postgres"
        } else {
            "embedded"
        },
        ..Default::default()
    };
    let measured = measure_on(args, plan, &session, database.as_deref(), &mut results).await;
    if let Some(database) = &database {
        if let Err(e) = database.clean_up().await {
            eprintln!("aaa bench: {e:#}");
        }
    }
    measured.map(|()| results)
}

/// Runs the selected scenarios, on `database` when there is one.
async fn measure_on(
    args: &BenchArgs,
    plan: &Plan,
    session: &str,
    database: Option<&postgres::Database>,
    results: &mut Results,
) -> anyhow::Result<()> {
    // The cluster scenario runs when asked for; `--cluster` alone asks for
    // it only. The scenarios that take minutes run when named, or in the
    // smoke run (which does everything, with tiny counts).
    let everything = args.only.is_empty() && args.cluster.is_none();
    let wanted = |s: Scenario| match s {
        Scenario::Cluster => args.cluster.is_some() || args.only.contains(&s),
        Scenario::Million | Scenario::Long | Scenario::Retention => {
            args.only.contains(&s) || (everything && args.smoke)
        }
        // With --server it needs two principals' tokens.
        Scenario::Probe => {
            args.only.contains(&s) || (everything && args.smoke && args.server.is_none())
        }
        _ => args.only.contains(&s) || everything,
    };
    let scratch = |tag: &str| database.map(|d| d.scratch(tag));

    // Floors, and the scenarios that share one server.
    let main_server = [
        Scenario::Floors,
        Scenario::Cycle,
        Scenario::Appends,
        Scenario::Fanout,
    ]
    .into_iter()
    .any(wanted);
    if main_server {
        let (child, addr) = server_for(args, "main", scratch("main")).await?;
        let meter = || proc::CpuMeter::start(child.as_ref().and_then(ChildServer::pid));
        let pool = Pool::connect(&addr, CONNECTIONS).await?;
        client::register_tools(&pool).await?;
        if wanted(Scenario::Floors) || wanted(Scenario::Cycle) {
            eprintln!("aaa bench: no-op round trip");
            results.rtt = Some(floors::rtt(&pool, plan.rtt_calls, plan.limit).await);
        }
        if wanted(Scenario::Floors) || wanted(Scenario::Appends) {
            eprintln!("aaa bench: no-op calls, {WRITERS} in flight");
            let cpu = meter();
            let mut noop = floors::noop_calls(&pool, WRITERS, plan.noop_calls, plan.limit).await;
            noop.cpu = cpu.per_call(noop.calls);
            results.noop = Some(noop);
            eprintln!("aaa bench: store ceiling, {WRITERS} writers");
            let store =
                floors::store_appends(WRITERS, plan.store_appends, plan.limit, scratch("ceiling"))
                    .await;
            results.store_ceiling = results.record("store ceiling", store);
        }
        if wanted(Scenario::Floors) || wanted(Scenario::Cycle) {
            eprintln!("aaa bench: store commits, one writer");
            let one =
                floors::store_appends(1, plan.one_writer_commits, plan.limit, scratch("one")).await;
            results.store_one_writer = results.record("store commits, one writer", one);
            if let Some(database) = database {
                eprintln!("aaa bench: postgres commit floor");
                let floor = postgres::floor(
                    database,
                    plan.one_writer_commits,
                    WRITERS,
                    plan.store_appends.min(20_000),
                    plan.limit,
                )
                .await;
                results.postgres_floor = results.record("postgres commit floor", floor);
            }
        }
        if wanted(Scenario::Cycle) {
            let levels = &plan.cycle_levels;
            results.cycle = Some(cycle::run(&pool, session, levels, plan.limit).await);
        }
        if wanted(Scenario::Appends) {
            eprintln!("aaa bench: Signal appends, {WRITERS} clients");
            let cpu = meter();
            let mut appends = appends::run(&pool, session, WRITERS, plan.appends, plan.limit).await;
            if let Ok(appends) = &mut appends {
                appends.cpu = cpu.per_call(appends.events);
            }
            results.appends = results.record("appends", appends);
        }
        if wanted(Scenario::Fanout) {
            let (followers, events) = (plan.followers, plan.fanout_events);
            let fanout = fanout::run(&addr, session, followers, events, plan.limit).await;
            results.fanout = results.record("fanout", fanout);
        }
        drop(child);
    }

    // Parked runs get a fresh server of their own, which they kill and restart.
    if wanted(Scenario::Parked) {
        let parked = async {
            let (mut child, addr) = server_for(args, "parked", scratch("parked")).await?;
            parked::run(&addr, child.as_mut(), session, plan.parked, 1).await
        };
        results.parked = results.record("parked", parked.await);
    }
    if wanted(Scenario::Million) {
        let million = async {
            let (mut child, addr) = server_for(args, "million", scratch("million")).await?;
            let restarts = parked::MILLION_RESTARTS;
            parked::run(&addr, child.as_mut(), session, plan.million, restarts).await
        };
        results.million = results.record("million", million.await);
    }
    if wanted(Scenario::Long) {
        let long = async {
            let (mut child, addr) = server_for(args, "long", scratch("long")).await?;
            long::run(&addr, child.as_mut(), session, plan.long_events, plan.limit).await
        };
        results.long = results.record("long", long.await);
    }
    if wanted(Scenario::Retention) {
        let retention = retention::run(args, &plan.retention, session, scratch("retention"));
        results.retention = results.record("retention", retention.await);
    }

    if wanted(Scenario::Committers) {
        if let Some(database) = database {
            let committers = committers::run(
                database.url(),
                |tag| database.scratch(tag),
                plan.store_appends,
                plan.limit,
            );
            results.committers = results.record("committers", committers.await);
        } else if args.only.contains(&Scenario::Committers) {
            bail!("the committers scenario needs --store (a PostgreSQL URL)");
        }
    }

    if wanted(Scenario::Cluster) {
        let Some(database) = database else {
            bail!("the cluster scenario needs --store (a PostgreSQL URL)");
        };
        let most = args.cluster.map_or(3, usize::from);
        let cluster = cluster::run(
            database,
            session,
            cluster::Shape {
                most,
                spread: !args.one_owner,
                routed: !args.unrouted,
            },
            plan.cluster_cycles,
            plan.rtt_calls,
            plan.failover_parked,
            plan.limit,
        )
        .await;
        results.cluster = Some(cluster);
    }
    if wanted(Scenario::Probe) {
        let tokens = match (&args.probe_token, &args.probe_victim_token) {
            (Some(prober), Some(victim)) => Some(probe::Tokens {
                prober: prober.clone(),
                victim: victim.clone(),
            }),
            _ => None,
        };
        let server = args.server.as_deref();
        let probe = probe::run(server, tokens, scratch("probe"), plan.probe_pairs);
        results.probe = results.record("probe", probe.await);
    }
    Ok(())
}

/// The server to load: `--server`, or a fresh child (returned so it lives
/// as long as the caller needs it, and is killed when dropped).
async fn server_for(
    args: &BenchArgs,
    tag: &str,
    store_url: Option<String>,
) -> anyhow::Result<(Option<ChildServer>, String)> {
    match &args.server {
        Some(addr) => Ok((None, addr.clone())),
        None => {
            let child = ChildServer::start(tag, store_url).await?;
            server::wait_serving(child.addr()).await?;
            let addr = child.addr().to_string();
            Ok((Some(child), addr))
        }
    }
}
