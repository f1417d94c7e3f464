//! The `aaa` command for people: the client subcommands (`runs`,
//! `approvals`, `approve`, `deny`), how they reach the server, and the exit
//! codes scripts rely on (and `cluster status`). Each command is one call or one stream of the
//! generated tonic client; `render` turns answers into lines and JSON.

mod approvals;
mod cluster;
mod decisions;
mod grants;
mod policy;
mod render;
mod runs;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use crate::proto::approval_service_client::ApprovalServiceClient;
use crate::proto::cluster_service_client::ClusterServiceClient;
use crate::proto::grant_service_client::GrantServiceClient;
use crate::proto::policy_service_client::PolicyServiceClient;
use crate::proto::run_service_client::RunServiceClient;

/// The exit codes, shown in the help of every client command.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  the server refused the request (the error line gives the gRPC code,
     message and reason), or a decision was already made the other way
  2  usage error: bad flags, or a bad --steps file
  3  the server cannot be reached (connection failed, or UNAVAILABLE)
  4  runs tail: the run ended failed or cancelled";

/// Give up connecting after this long (an address that drops packets would
/// otherwise hang the command).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The client subcommands, flattened into the `aaa` command beside `serve`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Start runs, list them, show one, follow one live.
    ///
    /// Example: aaa runs ls --status waiting_for_approval
    #[command(after_help = EXIT_CODES)]
    Runs(runs::RunsArgs),
    /// The approval inbox: list it, watch it live, review it interactively.
    ///
    /// Example: aaa approvals review
    #[command(after_help = EXIT_CODES)]
    Approvals(approvals::ApprovalsArgs),
    /// Approve a pending tool call: it runs with exactly the requested
    /// arguments (once it has all the grants its tool needs). --from
    /// approves every call of an `aaa approvals ls --json` listing.
    ///
    /// Example: aaa approve "$RUN" call-1 --comment "checked with finance"
    /// Example: aaa approvals ls --tool send_email --json | aaa approve --from -
    #[command(after_help = EXIT_CODES)]
    Approve(decisions::ApproveArgs),
    /// Deny a pending tool call: the model reads the reason as the tool's
    /// result. --from denies every call of a listing.
    ///
    /// Example: aaa deny "$RUN" call-1 --reason "not this vendor"
    #[command(after_help = EXIT_CODES)]
    Deny(decisions::DenyArgs),
    /// Edit a pending call's arguments: it never runs, a new call with the
    /// edited arguments takes its place and needs its own grant (--grant
    /// gives yours in the same step). The model is told what changed and why.
    ///
    /// Example: aaa edit "$RUN" call-1 --arguments '{"amount":200,"to":"ACME"}' --reason "cap" --grant
    #[command(after_help = EXIT_CODES)]
    Edit(decisions::EditArgs),
    /// The servers of the deployment: who owns the runs, who stands by.
    ///
    /// Example: aaa cluster status
    #[command(after_help = EXIT_CODES)]
    Cluster(cluster::ClusterArgs),
    /// The approval policy: try a file on a call, see or reload the server's.
    ///
    /// Example: aaa policy test policy.toml --tool wire_money --arguments '{"amount":50,"to":"ACME"}'
    #[command(after_help = EXIT_CODES)]
    Policy(policy::PolicyArgs),
    /// Standing grants: approve a tool's calls in advance, with a scope, a
    /// condition, an expiry and a number of uses; list and revoke them.
    ///
    /// Example: aaa grants create --tool wire_money --run "$RUN" --max-uses 3 --expires-in 2h --reason "month-end"
    #[command(after_help = EXIT_CODES)]
    Grants(grants::GrantsArgs),
}

/// Where the server is and who we are; every client command takes these.
#[derive(clap::Args, Clone)]
#[command(next_help_heading = "Connection")]
pub struct Connection {
    /// The aaa server's URL ("host:port" means http://host:port).
    #[arg(
        long,
        global = true,
        env = "AAA_SERVER",
        default_value = "http://127.0.0.1:50051",
        value_parser = server_url
    )]
    server: String,
    /// Sent on every call as `authorization: Bearer TOKEN`; the server maps
    /// it to a principal and its roles (see docs/auth.md).
    #[arg(
        long,
        global = true,
        env = "AAA_TOKEN",
        hide_env_values = true,
        value_parser = bearer_token
    )]
    token: Option<MetadataValue<Ascii>>,
    /// PEM file of the CA that signed the server's certificate; needed for
    /// an https:// server.
    #[arg(long, global = true, env = "AAA_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// PEM client certificate, for a server that authenticates callers by
    /// certificate (mTLS); goes with --key.
    #[arg(long, global = true, env = "AAA_CLIENT_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "AAA_CLIENT_KEY", requires = "cert")]
    key: Option<PathBuf>,
}

/// `--json` of every read command.
#[derive(clap::Args)]
struct Format {
    /// Print JSON for scripts: one document, or one object per line for
    /// streams (tail, watch). JSON-text fields (data, arguments, result) are
    /// embedded as JSON, numbers exactly as the server has them.
    #[arg(long)]
    json: bool,
}

/// `--limit` and `--page-token` of the list commands.
#[derive(clap::Args)]
struct Page {
    /// At most this many (the server's default is 50, its maximum 1000).
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// Where the previous page ended (printed after it, or `next_page_token` with --json).
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
}

/// Runs a client command; errors become one line on stderr and an exit code.
pub async fn run(command: Command) -> ExitCode {
    let (connection, result) = match &command {
        Command::Runs(args) => (&args.connection, runs::run(args).await),
        Command::Approvals(args) => (&args.connection, approvals::run(args).await),
        Command::Approve(args) => (&args.connection, decisions::approve(args).await),
        Command::Deny(args) => (&args.connection, decisions::deny(args).await),
        Command::Edit(args) => (&args.connection, decisions::edit(args).await),
        Command::Cluster(args) => (&args.connection, cluster::run(args).await),
        Command::Policy(args) => (&args.connection, policy::run(args).await),
        Command::Grants(args) => (&args.connection, grants::run(args).await),
    };
    let server = &connection.server;
    let Err(error) = result else {
        return ExitCode::SUCCESS;
    };
    let (code, line) = match error {
        Error::Failed(line) => (1, Some(line)),
        Error::Usage(line) => (2, Some(line)),
        Error::Unreachable(detail) => (
            3,
            Some(format!("cannot reach aaa server at {server}: {detail}")),
        ),
        Error::RunNotCompleted => (4, None),
        // The reader went away (`aaa runs tail RUN | head`): nothing to say.
        Error::OutputClosed => (0, None),
    };
    if let Some(line) = line {
        let _ = writeln!(std::io::stderr(), "aaa: {line}");
    }
    ExitCode::from(code)
}

/// Why a client command did not succeed; each kind is one exit code.
#[derive(Debug)]
enum Error {
    /// Exit 1: the server refused, or something local failed (stdin, stdout).
    Failed(String),
    /// Exit 2: bad input that clap could not check (a --steps file).
    Usage(String),
    /// Exit 3: no connection, or UNAVAILABLE; the line names the server.
    Unreachable(String),
    /// Exit 4: `runs tail` saw the run end failed or cancelled.
    RunNotCompleted,
    /// Exit 0: stdout was closed by its reader.
    OutputClosed,
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        let line = status_line(&status);
        match status.code() {
            Code::Unavailable => Error::Unreachable(line),
            _ => Error::Failed(line),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::BrokenPipe => Error::OutputClosed,
            _ => Error::Failed(e.to_string()),
        }
    }
}

/// "NOT_FOUND: run 'x' not found (RUN_NOT_FOUND)": the code as gRPC names
/// it, the message, and the ErrorInfo reason scripts branch on.
fn status_line(status: &Status) -> String {
    // Code's Debug is "NotFound"; gRPC's name is "NOT_FOUND".
    let mut code = String::new();
    for (i, c) in format!("{:?}", status.code()).chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            code.push('_');
        }
        code.push(c.to_ascii_uppercase());
    }
    let mut line = format!("{code}: {}", status.message().replace('\n', " "));
    if let Some(info) = status.get_details_error_info() {
        line.push_str(&format!(" ({})", info.reason));
    }
    line
}

type Transport = InterceptedService<Channel, Bearer>;

/// A connection to the server; hands out the generated clients.
struct Client {
    channel: Channel,
    bearer: Bearer,
}

impl Client {
    fn runs(&self) -> RunServiceClient<Transport> {
        RunServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    fn approvals(&self) -> ApprovalServiceClient<Transport> {
        ApprovalServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    fn cluster(&self) -> ClusterServiceClient<Transport> {
        ClusterServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    fn grants(&self) -> GrantServiceClient<Transport> {
        GrantServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    fn policy(&self) -> PolicyServiceClient<Transport> {
        PolicyServiceClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }
}

impl Connection {
    /// Connects now, so an unreachable server is reported as such (exit 3)
    /// before any request is made.
    async fn connect(&self) -> Result<Client, Error> {
        let mut endpoint = Endpoint::from_shared(self.server.clone())
            .map_err(|e| Error::Usage(format!("--server {}: {e}", self.server)))?
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = self.tls()? {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Error::Usage(format!("TLS settings: {e}")))?;
        }
        let channel = endpoint.connect().await.map_err(|e| {
            // tonic says "transport error"; the cause ("Connection refused") is below.
            let mut detail = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                // hyper repeats some causes ("tcp connect error: tcp connect error").
                let cause_text = cause.to_string();
                if !detail.ends_with(&cause_text) {
                    detail.push_str(&format!(": {cause_text}"));
                }
                source = cause.source();
            }
            Error::Unreachable(detail)
        })?;
        Ok(Client {
            channel,
            bearer: Bearer(self.token.clone()),
        })
    }

    /// TLS settings for an https:// server; None for http://.
    fn tls(&self) -> Result<Option<ClientTlsConfig>, Error> {
        let https = self.server.starts_with("https://");
        if !https {
            return match (&self.ca_cert, &self.cert) {
                (None, None) => Ok(None),
                _ => Err(Error::Usage(format!(
                    "--ca-cert and --cert need an https:// server, not {}",
                    self.server
                ))),
            };
        }
        let Some(ca_cert) = &self.ca_cert else {
            return Err(Error::Usage(format!(
                "--ca-cert FILE (the CA of the server's certificate) is needed for {}",
                self.server
            )));
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(ca_cert)?));
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(Identity::from_pem(pem(cert)?, pem(key)?));
        }
        Ok(Some(tls))
    }
}

/// A PEM file's text; an unreadable file is a usage error naming it.
fn pem(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read {}: {e}", path.display())))
}

/// Adds `authorization: Bearer TOKEN` to every request, when there is a token.
#[derive(Clone)]
struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

fn server_url(text: &str) -> Result<String, String> {
    let url = match text.contains("://") {
        true => text.to_string(),
        false => format!("http://{text}"),
    };
    Endpoint::from_shared(url.clone())
        .map(|_| url)
        .map_err(|e| e.to_string())
}

fn bearer_token(text: &str) -> Result<MetadataValue<Ascii>, String> {
    format!("Bearer {text}")
        .parse()
        .map_err(|_| "not a valid header value (printable ASCII only)".to_string())
}

/// Parses a `KEY=VALUE` label (filters and StartRun take the same form).
fn label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("'{text}' is not KEY=VALUE")),
    }
}
