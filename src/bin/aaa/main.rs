//! The `aaa` command: parses flags, then runs the server, the bench, or one
//! of the client commands of `aaa::cli`. The bench (`bench/`) is part of
//! this command only: it reaches the server through the library's public
//! API, like any other client.

mod bench;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// glibc's malloc was a tenth of the server's CPU under load, with lock
/// waits between its arenas (perf, docs/performance.md). mimalloc asks for
/// transparent huge pages, which [`main`] turns off.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "aaa",
    version,
    about = "Durable agent runs with a server-enforced approval gate"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the server.
    ///
    /// Example: aaa serve --listen 127.0.0.1:50051 --data-dir ./aaa-data
    Serve(ServeArgs),
    /// Copy every run, approval, group and setting of one store into
    /// another, empty one, then verify the copy (stop the server first).
    ///
    /// Example: aaa migrate ./aaa-data postgres://aaa@localhost/aaa
    Migrate(MigrateArgs),
    /// Benchmark a server: approval cycles, appends, fan-out, parked runs.
    ///
    /// Example: aaa bench --smoke
    Bench(bench::BenchArgs),
    /// Serve aaa's MCP tools over stdio, for MCP clients that only launch
    /// processes: relays to the server's /mcp (see docs/mcp.md).
    ///
    /// Example: aaa mcp --server 127.0.0.1:50051 --token "$AAA_TOKEN"
    Mcp(McpArgs),
    #[command(flatten)]
    Client(aaa::cli::Command),
}

#[derive(clap::Args)]
struct McpArgs {
    #[command(subcommand)]
    command: Option<McpCommand>,
    /// The aaa server (host:port, or an http:// or https:// URL).
    #[arg(long, env = "AAA_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Sent as `authorization: Bearer TOKEN`; a principal with the role runner.
    #[arg(long, env = "AAA_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Subcommand)]
enum McpCommand {
    /// List the upstreams of an --mcp file, whether each answers now, and
    /// each exposed tool with its gate (from this machine, not the server).
    ///
    /// Example: aaa mcp ls --mcp mcp.toml
    Ls {
        /// The --mcp file.
        #[arg(long, env = "AAA_MCP")]
        mcp: PathBuf,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "AAA_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Where runs are kept: `embedded` (the store in --data-dir, nothing to
    /// install) or a PostgreSQL URL, postgres://USER[:PASSWORD]@HOST[:PORT]/DB
    /// (see docs/postgres.md).
    #[arg(long, env = "AAA_STORE", default_value = "embedded", value_parser = store_location)]
    store: StoreLocation,
    /// Directory of the embedded store; created if missing.
    #[arg(long, env = "AAA_DATA_DIR", default_value = "./aaa-data")]
    data_dir: PathBuf,
    /// Longest PollTask wait, in seconds (> 0, at most 3600).
    #[arg(long, env = "AAA_POLL_WAIT_CAP_S", default_value_t = 30.0,
          allow_negative_numbers = true, value_parser = seconds_in(aaa::seconds::SERVER_WAIT))]
    poll_wait_cap_s: f64,
    /// Lease of task attempts whose tool sets no heartbeat timeout, in
    /// seconds (> 0, at most 21600).
    #[arg(long, env = "AAA_HEARTBEAT_TIMEOUT_S", default_value_t = 30.0,
          allow_negative_numbers = true, value_parser = seconds_in(aaa::seconds::SERVER_HEARTBEAT))]
    heartbeat_timeout_s: f64,
    /// How long a graceful stop waits for in-flight calls, in seconds (> 0,
    /// at most 3600).
    #[arg(long, env = "AAA_SHUTDOWN_GRACE_S", default_value_t = 10.0,
          allow_negative_numbers = true, value_parser = seconds_in(aaa::seconds::SERVER_WAIT))]
    shutdown_grace_s: f64,
    /// Memory for sled's page cache, in MiB (1 to 65536).
    #[arg(long, env = "AAA_STORE_CACHE_MIB", default_value_t = aaa::config::DEFAULT_STORE_CACHE_MIB,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    store_cache_mib: u64,
    /// Principals, roles and TLS (a TOML file; see docs/auth.md). Without it
    /// anyone who reaches the server may call every RPC.
    #[arg(long, env = "AAA_AUTH_CONFIG")]
    auth_config: Option<PathBuf>,
    /// Serve without --auth-config on an address other than loopback.
    #[arg(long, env = "AAA_INSECURE", value_parser = clap::builder::BoolishValueParser::new())]
    insecure: bool,
    /// Largest request message, in MiB (1 to 64).
    #[arg(long, env = "AAA_MAX_MESSAGE_MIB", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    max_message_mib: u32,
    /// Concurrent calls one client connection may have open (1 to 10000).
    #[arg(long, env = "AAA_MAX_STREAMS_PER_CONNECTION", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_streams_per_connection: u32,
    /// Open client connections the server keeps (1 to 100000); more are
    /// refused with an HTTP/2 GOAWAY that says why.
    #[arg(long, env = "AAA_MAX_CONNECTIONS", default_value_t = aaa::config::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_connections: u32,
    /// Webhooks to POST events to (a TOML file; see docs/subscriptions.md).
    #[arg(long, env = "AAA_WEBHOOKS")]
    webhooks: Option<PathBuf>,
    /// Providers of the built-in OpenAI-compatible model: base URLs, API
    /// keys (from env vars or files), timeouts, retries (a TOML file; see
    /// docs/models.md).
    #[arg(long, env = "AAA_MODELS")]
    models: Option<PathBuf>,
    /// Upstream MCP servers whose tools aaa serves to MCP clients at /mcp,
    /// each tool with its gate (a TOML file; see docs/mcp.md).
    #[arg(long, env = "AAA_MCP")]
    mcp: Option<PathBuf>,
    /// With --store postgres://...: one server owns every run and the
    /// others stand by to take them over if it dies, instead of the
    /// servers sharing the runs' shards out (the default; see
    /// docs/cluster.md). Every server of the cluster needs it (or
    /// --standby, or --take-over). A server started with it stands by
    /// when it finds a live owner, and claims the runs when it finds none.
    #[arg(long, env = "AAA_ONE_OWNER", value_parser = clap::builder::BoolishValueParser::new())]
    one_owner: bool,
    /// With --store postgres://...: one owner's standby (implies
    /// --one-owner): serve at once, forwarding every call to the server
    /// that holds the runs, and take them over once its claim lapses (see
    /// docs/postgres.md).
    #[arg(long, env = "AAA_STANDBY", value_parser = clap::builder::BoolishValueParser::new())]
    standby: bool,
    /// With --store postgres://... (implies --one-owner): take every run
    /// over at once, fencing out the server that holds them (its clients
    /// must reconnect), instead of standing by until its claim lapses.
    #[arg(long, env = "AAA_TAKE_OVER", conflicts_with = "standby",
          value_parser = clap::builder::BoolishValueParser::new())]
    take_over: bool,
    /// With --store postgres://...: share the runs' shards out among the
    /// live servers. The default; the flag is kept so that command lines
    /// from when it was a preview still work.
    #[arg(long, env = "AAA_SPREAD_SHARDS",
          conflicts_with_all = ["one_owner", "standby", "take_over"],
          value_parser = clap::builder::BoolishValueParser::new())]
    spread_shards: bool,
    /// With --store postgres://...: how long this server's claim on the
    /// runs lasts unless renewed (every third of it), in seconds (> 0, at
    /// most 600); a standby takes over once it lapses.
    #[arg(long, env = "AAA_LEASE_S", default_value_t = 3.0,
          allow_negative_numbers = true, value_parser = seconds_in(aaa::seconds::SERVER_LEASE))]
    lease_s: f64,
    /// With --store postgres://...: the host:port the other servers of the
    /// cluster reach this one at (default: the listening address, or
    /// 127.0.0.1 with its port when listening on every interface).
    #[arg(long, env = "AAA_ADVERTISE")]
    advertise: Option<String>,
    /// The approval policy: ordered CEL rules that allow, deny or set what
    /// a decision needs (a TOML file; see docs/policy.md). Read again on
    /// SIGHUP and by PolicyService.ReloadPolicy (`aaa policy reload`).
    #[arg(long, env = "AAA_POLICY")]
    policy: Option<PathBuf>,
    /// Export OpenTelemetry traces over OTLP/gRPC to this collector, e.g.
    /// http://127.0.0.1:4317. Sampling and resource attributes come from
    /// the standard OTEL_* variables (see docs/observability.md).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// How long finished runs are kept after they finish: a whole number
    /// and a unit (ms, s, m, h, d), e.g. 30d, or 0 / forever to keep them
    /// all. A run's label aaa.retention overrides it (see docs/retention.md).
    #[arg(long, env = "AAA_RETENTION", default_value = "30d",
          value_parser = aaa::domain::Retention::parse)]
    retention: aaa::domain::Retention,
    /// How long a deleted run answers RUN_EXPIRED before it is simply
    /// unknown (each costs the store about half a KiB meanwhile): a whole
    /// number and a unit, up to 7d. Default: as long as the retention,
    /// between 1h and 7d.
    #[arg(long, env = "AAA_TOMBSTONE", value_parser = aaa::engine::retention::parse_tombstone)]
    tombstone: Option<std::time::Duration>,
    /// Before deleting an expired run, write its events to this directory
    /// as RUN_ID.jsonl.gz (gzip JSON Lines); created if missing.
    #[arg(long, env = "AAA_ARCHIVE_DIR")]
    archive_dir: Option<PathBuf>,
    /// The embedded log's largest segment file, in KiB (64 to 1048576):
    /// compaction gives disk back a segment at a time.
    #[arg(long, env = "AAA_LOG_SEGMENT_KIB", default_value_t = aaa::config::DEFAULT_LOG_SEGMENT_KIB,
          value_parser = clap::value_parser!(u64).range(64..=1_048_576))]
    log_segment_kib: u64,
    /// The web inbox's base URL as people reach it (a proxy, a load
    /// balancer), for the links in webhooks and `aaa approvals ls --links`.
    /// Default: http:// (https:// under TLS) and the advertised address.
    /// The inbox itself is served on the gRPC port (see docs/web.md).
    #[arg(long, env = "AAA_PUBLIC_URL", value_parser = public_url)]
    public_url: Option<String>,
    /// Another host name the web inbox answers to (repeat it, or separate
    /// names with commas in the env var): `name` for any port or
    /// `name:port`. It always answers to localhost, 127.0.0.1 and [::1]
    /// with its port, and with --auth-config to the host of --public-url
    /// and the listening and advertised addresses; any other `Host` is
    /// refused (421), which stops DNS rebinding (see docs/web.md).
    #[arg(long = "allow-host", env = "AAA_ALLOW_HOSTS", value_delimiter = ',',
          value_parser = aaa::web::hosts::parse_allowed)]
    allow_host: Vec<String>,
}

/// `--public-url`: an http:// or https:// URL, without query or fragment.
fn public_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("not a URL ({e}); e.g. https://aaa.example.com"))?;
    match (uri.scheme_str(), uri.authority(), uri.query()) {
        (Some("http" | "https"), Some(_), None) if !text.contains('#') => {
            Ok(text.trim_end_matches('/').to_string())
        }
        _ => Err("expected an http:// or https:// URL with a host and no query, e.g. https://aaa.example.com"
            .into()),
    }
}

#[derive(clap::Args)]
struct MigrateArgs {
    /// The store to copy: a data directory of the embedded store, or a
    /// postgres:// URL.
    from: String,
    /// The empty store to copy into: a data directory (created if missing)
    /// or a postgres:// URL of an empty database.
    to: String,
}

/// Exit code for bad configuration (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

/// `--store`: the embedded store, or a database URL.
#[derive(Clone)]
enum StoreLocation {
    Embedded,
    Url(String),
}

fn store_location(text: &str) -> Result<StoreLocation, String> {
    match text.trim() {
        "embedded" => Ok(StoreLocation::Embedded),
        url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(StoreLocation::Url(url.to_string()))
        }
        _ => Err("expected 'embedded' or a postgres:// URL".into()),
    }
}

/// A clap parser for a seconds flag in `range`.
fn seconds_in(range: aaa::seconds::Range) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text| {
        let value: f64 = text
            .trim()
            .parse()
            .map_err(|_| format!("not a number of seconds ({})", range.describe()))?;
        range.check(value)
    }
}

/// Parses the command line. A bad `aaa serve` flag exits 64 with one line
/// naming it and what to use instead (scripts and service managers read one
/// line); the client commands keep clap's exit 2 for usage errors, as their
/// help says.
fn parse() -> Cli {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut error = match Cli::try_parse_from(&args) {
        Ok(cli) => return cli,
        Err(error) => error,
    };
    let serving = args.get(1).map(String::as_str) == Some("serve");
    add_flag_hint(&mut error, serving, &args);
    if !serving || !error.use_stderr() {
        error.exit();
    }
    eprintln!("aaa serve: {}", one_line(&error));
    std::process::exit(EXIT_CONFIG.into());
}

/// An unknown flag's error gets what to use instead: clap's own "a similar
/// argument exists" when it finds one, else the aaa name of a flag other
/// servers spell differently (`--port` is `--listen 127.0.0.1:PORT`).
fn add_flag_hint(error: &mut clap::Error, serving: bool, args: &[String]) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return;
    }
    let Some(ContextValue::String(given)) = error.get(ContextKind::InvalidArg) else {
        return;
    };
    // `--port 50052` or `--port=50052`: the value makes the hint exact.
    let (flag, inline) = match given.split_once('=') {
        Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
        None => (given.clone(), None),
    };
    let joined = format!("{flag}=");
    let value = inline.or_else(|| {
        let at = args
            .iter()
            .position(|a| *a == flag || a.starts_with(&joined))?;
        match args[at].strip_prefix(&joined) {
            Some(value) => Some(value.to_string()),
            None => args.get(at + 1).filter(|v| !v.starts_with('-')).cloned(),
        }
    });
    let hint = match serving {
        true => serve_flag_hint(&flag, value.as_deref()),
        false => client_flag_hint(&flag, value.as_deref()),
    };
    let hint = match hint {
        Some(hint) => hint,
        None if error.get(ContextKind::SuggestedArg).is_some() => return,
        None if serving => "`aaa serve --help` lists every flag".to_string(),
        None => return,
    };
    error.insert(
        ContextKind::Suggested,
        ContextValue::StyledStrs(vec![hint.into()]),
    );
}

/// `aaa serve` flags as other servers name them.
fn serve_flag_hint(flag: &str, value: Option<&str>) -> Option<String> {
    let hint = match flag {
        "--port" | "-p" => {
            let port = value.filter(|v| v.parse::<u16>().is_ok()).unwrap_or("PORT");
            format!("use --listen 127.0.0.1:{port} (the address and port to listen on)")
        }
        "--host" | "--bind" | "--address" | "--addr" | "--ip" | "-b" => {
            let host = value.filter(|v| !v.contains(':')).unwrap_or("HOST");
            format!("use --listen {host}:50051 (the address and port to listen on)")
        }
        "--db" | "--database" | "--database-url" | "--postgres" | "--pg" => {
            "use --store postgres://USER@HOST/DB (see docs/postgres.md)".to_string()
        }
        "--config" | "--config-file" | "-c" => "there is no single config file: \
            --auth-config, --policy, --webhooks and --models each take one \
            (see `aaa serve --help`)"
            .to_string(),
        "--tls" | "--tls-cert" | "--cert" | "--tls-key" | "--key" => {
            "TLS is set in the --auth-config file (see docs/auth.md)".to_string()
        }
        "--verbose" | "-v" | "--debug" | "--log-level" | "--log" => {
            "set AAA_LOG instead, e.g. AAA_LOG=debug aaa serve".to_string()
        }
        _ => return None,
    };
    Some(hint)
}

/// Client command flags as other tools name them.
fn client_flag_hint(flag: &str, value: Option<&str>) -> Option<String> {
    let hint = match flag {
        "--port" | "-p" => {
            let port = value.filter(|v| v.parse::<u16>().is_ok()).unwrap_or("PORT");
            format!("use --server http://127.0.0.1:{port} (the aaa server's URL)")
        }
        "--host" | "--addr" | "--address" | "--url" | "--endpoint" | "--server-url" => {
            "use --server http://HOST:PORT (the aaa server's URL)".to_string()
        }
        "--verbose" | "-v" | "--debug" => {
            "set AAA_LOG instead, e.g. AAA_LOG=debug aaa ...".to_string()
        }
        _ => return None,
    };
    Some(hint)
}

/// A clap error as one line: its first line and its tips.
fn one_line(error: &clap::Error) -> String {
    let text = error.to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines
        .next()
        .unwrap_or("bad arguments")
        .trim_start_matches("error: ")
        .to_string();
    let tips = lines.filter_map(|l| l.strip_prefix("tip: "));
    std::iter::once(first)
        .chain(tips.map(str::to_string))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Logs to stderr: `info` by default for the server and the bench; client
/// commands log nothing unless AAA_LOG asks, so their stderr is their errors.
/// Colours only on a terminal: a log file or a pipe (systemd, docker, `2>`)
/// gets plain text, without escape codes.
fn init_logging(default: &str) {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AAA_LOG")
                .unwrap_or_else(|_| default.into()),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    // With mimalloc, transparent huge pages made a server with 100,000
    // parked runs a third bigger (196 against 147 MiB RSS); they bought up
    // to a tenth more approval cycles per second in noisy back-to-back runs.
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and only sets a flag
    // of this process.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    let command = parse().command;
    init_logging(match command {
        Command::Client(_) => "off",
        // Its stdout is the MCP channel; warnings go to stderr.
        Command::Mcp(_) => "warn",
        _ => "info",
    });
    // The bench drives its load from one thread: on a 2-core machine it
    // shares the cores with the server it measures, and a single-threaded
    // client spends less CPU per call (no wakeups across threads).
    let mut runtime = match command {
        Command::Bench(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = runtime.enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        match command {
            Command::Client(command) => aaa::cli::run(command).await,
            Command::Serve(args) => serve(args).await,
            Command::Mcp(McpArgs {
                command: Some(McpCommand::Ls { mcp }),
                ..
            }) => match aaa::mcp::load(&mcp) {
                Ok(config) => {
                    print!("{}", aaa::mcp::ls(&config).await);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("aaa: --mcp {e}");
                    ExitCode::from(EXIT_CONFIG)
                }
            },
            Command::Mcp(args) => match aaa::mcp::stdio::relay(&args.server, args.token).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("aaa mcp: {e}");
                    ExitCode::FAILURE
                }
            },
            Command::Migrate(args) => migrate(args).await,
            Command::Bench(args) => match bench::run(args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("aaa bench: {e:#}");
                    ExitCode::FAILURE
                }
            },
        }
    })
}

/// The tracer for `--otlp-endpoint`, sampling as OTEL_TRACES_SAMPLER says.
fn tracer(endpoint: &str, metrics: aaa::metrics::Metrics) -> Result<aaa::otel::Tracer, String> {
    let sampler = std::env::var("OTEL_TRACES_SAMPLER").ok();
    let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok();
    let sampler = aaa::otel::Sampler::from_env(sampler.as_deref(), arg.as_deref())?;
    aaa::otel::Tracer::start(endpoint, sampler, metrics)
}

async fn serve(args: ServeArgs) -> ExitCode {
    let ServeArgs {
        listen,
        store,
        data_dir,
        poll_wait_cap_s,
        heartbeat_timeout_s,
        shutdown_grace_s,
        store_cache_mib,
        auth_config,
        insecure,
        max_message_mib,
        max_streams_per_connection,
        max_connections,
        webhooks,
        models,
        mcp,
        one_owner,
        standby,
        take_over,
        spread_shards,
        lease_s,
        advertise,
        policy,
        otlp_endpoint,
        retention,
        tombstone,
        archive_dir,
        log_segment_kib,
        public_url,
        allow_host,
    } = args;
    let mut config = aaa::Config::new(data_dir.clone());
    let place = match store {
        StoreLocation::Embedded => data_dir.display().to_string(),
        StoreLocation::Url(url) => {
            let place = aaa::store::redact(&url);
            config.store_url = Some(url);
            place
        }
    };
    config.store_cache_bytes = store_cache_mib * 1024 * 1024;
    config.retention = retention;
    config.tombstone = tombstone;
    config.archive_dir = archive_dir;
    config.log_segment_bytes = log_segment_kib * 1024;
    config.max_message_bytes = max_message_mib as usize * 1024 * 1024;
    config.max_streams_per_connection = max_streams_per_connection;
    config.max_connections = max_connections as usize;
    config.poll_wait_cap = aaa::seconds::duration(poll_wait_cap_s);
    config.default_heartbeat_timeout = aaa::seconds::duration(heartbeat_timeout_s);
    config.shutdown_grace = aaa::seconds::duration(shutdown_grace_s);
    config.lease = aaa::seconds::duration(lease_s);
    config.standby = standby;
    config.take_over = take_over;
    // Spreading is the default on a database; one owner is asked for.
    config.spread_shards = config.store_url.is_some() && !(one_owner || standby || take_over);
    config.advertise = advertise;
    config.public_url = public_url.clone();
    config.allowed_hosts = allow_host;
    let cluster_flag = [
        (one_owner, "--one-owner"),
        (standby, "--standby"),
        (take_over, "--take-over"),
        (spread_shards, "--spread-shards"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag));
    if let (Some(flag), None) = (cluster_flag, &config.store_url) {
        eprintln!(
            "aaa: {flag} needs --store postgres://...: the embedded store belongs to one server"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    if let Some(path) = auth_config {
        match aaa::auth::AuthConfig::load(&path) {
            Ok(auth) => config.auth = Some(std::sync::Arc::new(auth)),
            Err(e) => {
                eprintln!("aaa: --auth-config {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    if let Some(path) = policy {
        match aaa::policy::PolicyHandle::load(&path) {
            Ok(handle) => {
                let handle = std::sync::Arc::new(handle);
                reload_on_hangup(handle.clone());
                config.policy = Some(handle);
            }
            Err(e) => {
                eprintln!("aaa: --policy {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    if let Some(endpoint) = otlp_endpoint.filter(|e| !e.trim().is_empty()) {
        match tracer(&endpoint, config.metrics.clone()) {
            Ok(tracer) => config.tracer = Some(std::sync::Arc::new(tracer)),
            Err(e) => {
                eprintln!("aaa: --otlp-endpoint {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    if let Some(path) = webhooks {
        match aaa::subscriptions::WebhookConfig::load(&path) {
            Ok(hooks) => config.webhooks = hooks,
            Err(e) => {
                eprintln!("aaa: --webhooks {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    if let Some(path) = models {
        match aaa::openai::ModelsConfig::load(&path) {
            Ok(models) => config.models = Some(std::sync::Arc::new(models)),
            Err(e) => {
                eprintln!("aaa: --models {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    if let Some(path) = mcp {
        match aaa::mcp::load(&path) {
            Ok(mcp) => config.mcp = Some(std::sync::Arc::new(mcp)),
            Err(e) => {
                eprintln!("aaa: --mcp {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    if let Err(message) = aaa::config::check_exposure(listen, config.auth.is_some(), insecure) {
        eprintln!("aaa: {message}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("aaa: cannot listen on {listen}: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let address = listener.local_addr().map_or(listen, |a| a);
    // Printed once the store is open: test harnesses and the SDKs' test
    // servers wait for this line.
    let scheme = match config.auth.as_ref().is_some_and(|a| a.tls.is_some()) {
        true => "https",
        false => "http",
    };
    let web = public_url.unwrap_or_else(|| match address.ip().is_unspecified() {
        true => format!("{scheme}://127.0.0.1:{}", address.port()),
        false => format!("{scheme}://{address}"),
    });
    let ready = move || {
        println!("aaa serving on {address} with data in {place}");
        println!("aaa web inbox at {web}/");
    };
    match aaa::serve(listener, config, ready, stop_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aaa: {e}");
            match e {
                aaa::ServeError::Store { .. } | aaa::ServeError::Config(_) => {
                    ExitCode::from(EXIT_CONFIG)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// A store location as `aaa migrate` takes it: a URL or a directory.
fn store_config(location: &str) -> aaa::Config {
    match store_location(location) {
        Ok(StoreLocation::Url(url)) => {
            let mut config = aaa::Config::new("");
            config.store_url = Some(url);
            config
        }
        _ => aaa::Config::new(location),
    }
}

async fn migrate(args: MigrateArgs) -> ExitCode {
    let open = |location: &str| {
        let config = store_config(location);
        let place = aaa::store::redact(location);
        async move {
            aaa::store::open(&config.store_settings())
                .await
                .map_err(|e| eprintln!("aaa migrate: cannot open {place}: {e}"))
        }
    };
    let Ok(from) = open(&args.from).await else {
        return ExitCode::from(EXIT_CONFIG);
    };
    let Ok(to) = open(&args.to).await else {
        from.close().await;
        return ExitCode::from(EXIT_CONFIG);
    };
    let result = aaa::migrate::migrate(&from, &to, |step| eprintln!("aaa migrate: {step}")).await;
    from.close().await;
    to.close().await;
    match result {
        Ok(counts) => {
            println!("copied and verified: {counts}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("aaa migrate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the policy file again on each SIGHUP; a file that does not check
/// is logged and the policy in force stays.
fn reload_on_hangup(handle: std::sync::Arc<aaa::policy::PolicyHandle>) {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .expect("can install a SIGHUP handler");
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match handle.reload() {
                Ok(policy) => tracing::info!(sha256 = %policy.sha256, "policy reloaded on SIGHUP"),
                Err(e) => tracing::warn!("policy reload refused, the policy in force stays: {e}"),
            }
        }
    });
}

/// Completes on the first Ctrl-C or SIGTERM; a second one exits at once.
async fn stop_signal() {
    wait_for_signal().await;
    tokio::spawn(async {
        wait_for_signal().await;
        eprintln!("aaa: second signal, exiting now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("can install a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
