//! The shared harness: servers (in-process and child process), clients,
//! the reference scenario's requests, event-stream helpers and worker loops.
//!
//! Every wait is bounded by [`WAIT`] and waits on something the server says
//! (an event, a PollTask answer), never on a sleep.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aaa::proto::approval_service_client::ApprovalServiceClient;
use aaa::proto::cluster_service_client::ClusterServiceClient;
use aaa::proto::run_service_client::RunServiceClient;
use aaa::proto::worker_service_client::WorkerServiceClient;
use aaa::proto::{
    complete_task_request, model_spec, scripted_step, stream_events_response, task,
    watch_approvals_response, Approval, CompleteTaskRequest, Event, GetRunRequest,
    ListApprovalsRequest, ModelReply, ModelSpec, ModelTask, ModelToolCall, PollTaskRequest,
    RegisterWorkerRequest, Role, Run, ScriptedModel, ScriptedStep, ScriptedToolCall,
    ScriptedToolCalls, SignalRequest, SignalResponse, StartRunRequest, StreamEventsRequest,
    StreamEventsResponse, Task, ToolDefinition, ToolRef, WatchApprovalsRequest,
    WatchApprovalsResponse,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::{ErrorInfo, StatusExt};

pub type RunClient = RunServiceClient<Channel>;
pub type ApprovalClient = ApprovalServiceClient<Channel>;
pub type WorkerClient = WorkerServiceClient<Channel>;

/// The longest any test waits for something the server should do.
pub const WAIT: Duration = Duration::from_secs(30);

/// The reference tool call's arguments, canonical JSON text.
pub const REFERENCE_ARGS: &str = r#"{"amount":250,"to":"ACME"}"#;
/// What the test tool worker answers: a JSON string.
pub const REFERENCE_OUTPUT: &str = r#""sent $250 to ACME""#;
/// The text the reference run completes with.
pub const REFERENCE_TEXT: &str = "sent $250 to ACME";
/// The reference scenario's event types, granted, in order (DESIGN.md §1).
pub const REFERENCE_TYPES: [&str; 11] = [
    "aaa.run.started",
    "aaa.llm.requested",
    "aaa.llm.completed",
    "aaa.tool.requested",
    "aaa.approval.requested",
    "aaa.approval.granted",
    "aaa.tool.started",
    "aaa.tool.completed",
    "aaa.llm.requested",
    "aaa.llm.completed",
    "aaa.run.completed",
];

// ---------------------------------------------------------------- servers

/// Anything tests can connect to. Each call opens a fresh channel, so two
/// clients are two connections.
pub trait Server {
    fn addr(&self) -> SocketAddr;

    async fn channel(&self) -> Channel {
        let addr = self.addr();
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"))
    }
    async fn runs(&self) -> RunClient {
        RunServiceClient::new(self.channel().await)
    }
    async fn approvals(&self) -> ApprovalClient {
        ApprovalServiceClient::new(self.channel().await)
    }
    async fn workers(&self) -> WorkerClient {
        WorkerServiceClient::new(self.channel().await)
    }
    async fn cluster(&self) -> ClusterServiceClient<Channel> {
        ClusterServiceClient::new(self.channel().await)
    }
}

// ---------------------------------------------------------------- stores

/// The PostgreSQL server of this run (an admin URL), when there is one:
/// `.ci/run` starts one and sets `AAA_TEST_POSTGRES`.
pub fn postgres() -> Option<String> {
    std::env::var("AAA_TEST_POSTGRES")
        .ok()
        .filter(|url| !url.is_empty())
}

/// True when every test server is to keep its data in PostgreSQL
/// (`AAA_TEST_STORE=postgres`): `.ci/run` runs the suite once on the
/// embedded store and once so.
pub fn on_postgres() -> bool {
    std::env::var("AAA_TEST_STORE").as_deref() == Ok("postgres")
}

/// A store URL of a new, empty schema on the run's PostgreSQL (aaa
/// creates the schema its search_path names), or `None` without one.
pub fn fresh_postgres_store() -> Option<String> {
    let schema = format!("aaa_test_{}", uuid::Uuid::new_v4().simple());
    Some(aaa::store::postgres::in_schema(&postgres()?, &schema))
}

/// The store a test server in `dir` keeps its data in: `None` for the
/// embedded one in its data dir, or the PostgreSQL URL chosen at its first
/// start (kept in `dir`, so a restart finds the same data).
fn store_url_for(dir: &Path) -> Option<String> {
    if !on_postgres() {
        return None;
    }
    let file = dir.join("store-url");
    if let Ok(url) = std::fs::read_to_string(&file) {
        return Some(url);
    }
    let url = fresh_postgres_store().expect("AAA_TEST_STORE=postgres needs AAA_TEST_POSTGRES");
    std::fs::write(&file, &url).expect("write store-url");
    Some(url)
}

/// `aaa::serve` in this process, on an ephemeral port and a temp data dir
/// (or, with `AAA_TEST_STORE=postgres`, a fresh PostgreSQL schema), with a
/// manual clock the test may move forward (see [`TestServer::clock`]).
pub struct TestServer {
    dir: tempfile::TempDir,
    store_url: Option<String>,
    clock: aaa::clock::Clock,
    addr: SocketAddr,
    running: Option<Serving>,
    /// Applied to the config on every (re)start; see [`TestServer::start_with`].
    configure: Option<Configure>,
}

/// Adjusts the config a [`TestServer`] serves with (auth, limits).
pub type Configure = Arc<dyn Fn(&mut aaa::Config) + Send + Sync>;

/// A running `serve` task and the trigger of its shutdown future.
type Serving = (oneshot::Sender<()>, JoinHandle<Result<(), aaa::ServeError>>);

impl Server for TestServer {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_configured(None).await
    }

    /// Like [`TestServer::start`], with `configure` applied to the config.
    pub async fn start_with(configure: impl Fn(&mut aaa::Config) + Send + Sync + 'static) -> Self {
        Self::start_configured(Some(Arc::new(configure))).await
    }

    async fn start_configured(configure: Option<Configure>) -> Self {
        Self::start_on(tempfile::tempdir().expect("temp dir"), configure).await
    }

    /// Serves the data already in `dir` (a copy `aaa migrate` made, say).
    pub async fn start_on(dir: tempfile::TempDir, configure: Option<Configure>) -> Self {
        let mut server = TestServer {
            store_url: store_url_for(dir.path()),
            dir,
            clock: aaa::clock::Clock::manual(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            running: None,
            configure,
        };
        server.resume().await;
        server
    }

    /// Graceful stop: triggers the shutdown future and waits for `serve` to
    /// return (store flushed and closed).
    pub async fn stop(&mut self) {
        let (shutdown, task) = self.running.take().expect("server is not running");
        let _ = shutdown.send(());
        let result = tokio::time::timeout(WAIT, task)
            .await
            .expect("serve did not return after the shutdown signal")
            .expect("serve task panicked");
        if let Err(e) = result {
            panic!("serve returned an error: {e:?}");
        }
    }

    /// Serves again on the same data dir, on a new ephemeral port.
    pub async fn resume(&mut self) {
        assert!(self.running.is_none(), "server is already running");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        self.addr = listener.local_addr().expect("local addr");
        let mut config = aaa::Config::new(self.dir.path());
        config.poll_wait_cap = Duration::from_secs(5);
        config.shutdown_grace = Duration::from_secs(5);
        config.clock = self.clock.clone();
        config.store_url = self.store_url.clone();
        if let Some(configure) = &self.configure {
            configure(&mut config);
        }
        let (tx, rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = oneshot::channel::<()>();
        let mut task = tokio::spawn(aaa::serve(
            listener,
            config,
            move || {
                let _ = ready_tx.send(());
            },
            async move {
                let _ = rx.await;
            },
        ));
        // Wait until it serves, or say why it never did (a client would
        // only see a refused connection).
        let ended = tokio::select! {
            ready = ready_rx => match ready {
                Ok(()) => None,
                Err(_) => Some(tokio::time::timeout(WAIT, &mut task).await),
            },
            ended = &mut task => Some(Ok(ended)),
        };
        if let Some(ended) = ended {
            panic!("serve ended before it was ready: {ended:?}");
        }
        self.running = Some((tx, task));
    }

    /// Where the server keeps its data, as `aaa migrate` takes it: the
    /// PostgreSQL URL, or the embedded store's directory.
    pub fn store_location(&self) -> String {
        match &self.store_url {
            Some(url) => url.clone(),
            None => self.dir.path().display().to_string(),
        }
    }

    /// The server's clock, kept across restarts: advancing it fires
    /// deadlines, timeouts and lease expiries without waiting for them.
    pub fn clock(&self) -> &aaa::clock::Clock {
        &self.clock
    }

    pub async fn restart(&mut self) {
        self.stop().await;
        self.resume().await;
    }

    pub async fn shutdown(mut self) {
        self.stop().await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some((shutdown, task)) = self.running.take() {
            let _ = shutdown.send(());
            task.abort();
        }
    }
}

/// A child server that has not said it serves yet.
pub struct StartingServer {
    /// Taken by `ready`; killed on drop otherwise.
    child: Option<Child>,
    serving: oneshot::Receiver<SocketAddr>,
    log_path: std::path::PathBuf,
}

impl StartingServer {
    /// Waits (up to [`WAIT`]) for its `serving on ADDR` line.
    pub async fn ready(mut self) -> ChildServer {
        let serving = std::mem::replace(&mut self.serving, oneshot::channel().1);
        let mut child = self.child.take().expect("a child");
        let addr = match tokio::time::timeout(WAIT, serving).await {
            Ok(Ok(addr)) if addr.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], addr.port()))
            }
            Ok(Ok(addr)) => addr,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "aaa serve printed no `serving on ADDR` line; its log:\n{}",
                    std::fs::read_to_string(&self.log_path).unwrap_or_default()
                );
            }
        };
        ChildServer {
            child,
            addr,
            log_path: std::mem::take(&mut self.log_path),
        }
    }
}

impl Drop for StartingServer {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `aaa` binary as a child process, so it can be killed with SIGKILL.
/// Data lives in `dir/data`, the server's stderr in `dir/server.log`.
pub struct ChildServer {
    child: Child,
    addr: SocketAddr,
    log_path: std::path::PathBuf,
}

impl Server for ChildServer {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Runs `aaa serve ARGS --data-dir DATA_DIR`, without the auth settings of
/// the environment, for a server that must refuse to start: returns its
/// output once it exits. One that goes on serving is killed after [`WAIT`]
/// and the test fails.
pub fn serve_refused(data_dir: &Path, args: &[&str]) -> std::process::Output {
    let child = Command::new(env!("CARGO_BIN_EXE_aaa"))
        .arg("serve")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("AAA_INSECURE")
        .env_remove("AAA_AUTH_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aaa serve");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(WAIT) {
        Ok(output) => output.expect("wait for aaa serve"),
        Err(_) => {
            // SAFETY: kill takes plain integers; the child is not reaped
            // yet (its waiting thread still holds it), so the pid is its own.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("aaa serve {args:?} did not exit within {WAIT:?}");
        }
    }
}

impl ChildServer {
    pub async fn start(dir: &Path) -> Self {
        Self::start_args(dir, &["--listen", "127.0.0.1:0"]).await
    }

    /// Runs `aaa serve ARGS --data-dir dir/data` (and `--store URL` with
    /// `AAA_TEST_STORE=postgres`, unless ARGS name a store); ARGS must
    /// include `--listen`. An unspecified address (0.0.0.0) is reached on
    /// loopback.
    pub async fn start_args(dir: &Path, args: &[&str]) -> Self {
        Self::spawn_args(dir, args).ready().await
    }

    /// Starts the process without waiting for it to serve (a standby).
    pub fn spawn_args(dir: &Path, args: &[&str]) -> StartingServer {
        Self::spawn_args_env(dir, args, &[])
    }

    /// [`ChildServer::spawn_args`] with these variables in its environment
    /// (test hooks such as `AAA_TEST_CRASH_AT`).
    pub fn spawn_args_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> StartingServer {
        let log_path = dir.join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("server log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_aaa"))
            .arg("serve")
            .args(args)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(
                store_url_for(dir)
                    .filter(|_| !args.iter().any(|a| a.starts_with("--store")))
                    .map(|url| format!("--store={url}")),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn aaa serve");
        // Read stdout on a thread: report the address, then keep draining.
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = oneshot::channel::<SocketAddr>();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("serving on ").nth(1) {
                    let token = rest.split_whitespace().next().unwrap_or_default();
                    if let (Some(tx), Ok(addr)) = (tx.take(), token.parse()) {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
        StartingServer {
            child: Some(child),
            serving: rx,
            log_path,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill takes plain integers; the child is not reaped yet,
        // so the pid is its own.
        let done = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(done, 0, "kill({signal})");
    }

    /// SIGTERM, then waits (up to [`WAIT`], else SIGKILL) for the process
    /// to exit; asserts that it stopped cleanly.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let pid = self.child.id() as libc::pid_t;
        let (exited, watchdog) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = watchdog.recv_timeout(WAIT) {
                // SAFETY: kill takes plain integers; the child is not reaped
                // until `exited` is sent, so the pid is still its own.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        let status = tokio::task::block_in_place(|| self.child.wait()).expect("wait for aaa serve");
        let _ = exited.send(());
        assert!(status.success(), "aaa serve did not stop cleanly: {status}");
    }

    /// Waits (up to [`WAIT`]) for the process to end on its own; its exit
    /// status.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "aaa serve did not exit within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to [`WAIT`]) until the server's log has a line containing
    /// `needle`: what a server says only in its log, read every 50 ms.
    pub async fn wait_for_log_line(&self, needle: &str) {
        let give_up = tokio::time::Instant::now() + WAIT;
        loop {
            let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
            if log.lines().any(|line| line.contains(needle)) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "no line with {needle:?} in {}:\n{log}",
                self.log_path.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, then reap the process.
    pub fn kill9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("wait for killed server");
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------- requests and tools

/// The reference tool: gated, served by a worker.
pub fn wire_money() -> ToolDefinition {
    ToolDefinition {
        name: "wire_money".into(),
        description: "Wire money to a payee".into(),
        parameters_json: r#"{"type":"object","properties":{"amount":{"type":"integer"},"to":{"type":"string"}},"required":["amount","to"]}"#.into(),
        requires_approval: true,
        ..Default::default()
    }
}

/// A tool that needs no approval: its calls go to a worker at once.
pub fn lookup() -> ToolDefinition {
    ToolDefinition {
        name: "lookup".into(),
        description: "Look a payee up".into(),
        parameters_json: r#"{"type":"object"}"#.into(),
        requires_approval: false,
        ..Default::default()
    }
}

/// Registers tools and models under the identity "registrar".
/// Registers the tools and models, retrying UNAVAILABLE as the SDKs do (a
/// server of a cluster may still be starting the engine for its shards).
pub async fn register(workers: &mut WorkerClient, tools: Vec<ToolDefinition>, models: &[&str]) {
    let request = RegisterWorkerRequest {
        identity: "registrar".into(),
        tools,
        models: models.iter().map(|m| m.to_string()).collect(),
    };
    retrying(|| {
        let (mut workers, request) = (workers.clone(), request.clone());
        async move { workers.register_worker(request).await }
    })
    .await;
}

pub fn tool_calls_step(name: &str, arguments_json: &str) -> ScriptedStep {
    ScriptedStep {
        reply: Some(scripted_step::Reply::ToolCalls(ScriptedToolCalls {
            calls: vec![ScriptedToolCall {
                name: name.into(),
                arguments_json: arguments_json.into(),
            }],
        })),
    }
}

pub fn echo_step() -> ScriptedStep {
    ScriptedStep {
        reply: Some(scripted_step::Reply::Echo(())),
    }
}

/// A run of `tool` driven by the scripted model: call it with `arguments_json`,
/// then echo its result.
pub fn scripted_run(tool: &str, arguments_json: &str) -> StartRunRequest {
    StartRunRequest {
        task: "Pay ACME $250".into(),
        model: Some(ModelSpec {
            kind: Some(model_spec::Kind::Scripted(ScriptedModel {
                steps: vec![tool_calls_step(tool, arguments_json), echo_step()],
            })),
        }),
        tools: vec![ToolRef {
            name: tool.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// How many runs ListRuns shows (its first page).
pub async fn list_runs_count(runs: &mut RunClient) -> usize {
    runs.list_runs(aaa::proto::ListRunsRequest::default())
        .await
        .expect("ListRuns")
        .into_inner()
        .runs
        .len()
}

/// The reference run with the scripted model.
pub fn scripted_reference_run() -> StartRunRequest {
    scripted_run("wire_money", REFERENCE_ARGS)
}

/// The reference run with the worker-served "seed" model.
pub fn seed_reference_run() -> StartRunRequest {
    StartRunRequest {
        model: Some(ModelSpec {
            kind: Some(model_spec::Kind::Worker("seed".into())),
        }),
        ..scripted_reference_run()
    }
}

/// The seed model: a user message last -> call wire_money; otherwise reply
/// with the last message's content.
pub fn seed_reply(task: &ModelTask) -> ModelReply {
    let last = task.messages.last().expect("a model task without messages");
    if last.role == Role::User as i32 {
        ModelReply {
            content: String::new(),
            tool_calls: vec![ModelToolCall {
                name: "wire_money".into(),
                arguments_json: REFERENCE_ARGS.into(),
            }],
        }
    } else {
        ModelReply {
            content: last.content.clone(),
            tool_calls: vec![],
        }
    }
}

pub async fn start_run(runs: &mut RunClient, request: StartRunRequest) -> String {
    runs.start_run(request)
        .await
        .expect("StartRun")
        .into_inner()
        .run_id
}

pub async fn get_run(runs: &mut RunClient, run_id: &str) -> Run {
    runs.get_run(GetRunRequest {
        run_id: run_id.into(),
    })
    .await
    .expect("GetRun")
    .into_inner()
    .run
    .expect("GetRunResponse.run")
}

// ------------------------------------------------------------------ events

pub fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.r#type.as_str()).collect()
}

pub fn data(event: &Event) -> serde_json::Value {
    serde_json::from_str(&event.data_json).unwrap_or_else(|e| {
        panic!(
            "{} data_json is not JSON ({e}): {}",
            event.r#type, event.data_json
        )
    })
}

pub fn count(events: &[Event], ty: &str) -> usize {
    events.iter().filter(|e| e.r#type == ty).count()
}

/// The first event of type `ty`.
#[track_caller]
pub fn find<'a>(events: &'a [Event], ty: &str) -> &'a Event {
    events
        .iter()
        .find(|e| e.r#type == ty)
        .unwrap_or_else(|| panic!("no {ty} event in {:?}", types(events)))
}

pub fn call_id(event: &Event) -> String {
    data(event)["call_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{} has no call_id: {}", event.r#type, event.data_json))
        .to_string()
}

#[track_caller]
pub fn assert_dense(events: &[Event], first_seq: u64) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (first_seq..first_seq + events.len() as u64).collect();
    assert_eq!(
        seqs,
        expected,
        "seqs are not consecutive from {first_seq}: {:?}",
        types(events)
    );
}

pub fn is_terminal(ty: &str) -> bool {
    matches!(
        ty,
        "aaa.run.completed" | "aaa.run.failed" | "aaa.run.cancelled"
    )
}

/// Reads StreamEvents until `until` matches an event (returned last), the
/// stream ends or, when not following, the caught_up marker arrives.
async fn read_events(
    runs: &mut RunClient,
    request: StreamEventsRequest,
    until: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let (run_id, follow) = (request.run_id.clone(), request.follow);
    read_stream(&run_id, follow, runs.stream_events(request), until).await
}

/// Reads the stream `open` starts as [`read_events`] says; panics naming
/// the run if it fails or times out. Any client of RunService can open it.
async fn read_stream(
    run_id: &str,
    follow: bool,
    open: impl std::future::Future<
        Output = Result<tonic::Response<tonic::Streaming<StreamEventsResponse>>, Status>,
    >,
    until: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    match try_read_stream(run_id, follow, open, until).await {
        Ok(seen) => seen,
        Err((status, seen)) => panic!(
            "StreamEvents({run_id}) failed: {status:?}; saw {:?}",
            types(&seen)
        ),
    }
}

/// [`read_stream`], answering a failed stream with its status and the
/// events seen before it; panics only if it times out.
async fn try_read_stream(
    run_id: &str,
    follow: bool,
    open: impl std::future::Future<
        Output = Result<tonic::Response<tonic::Streaming<StreamEventsResponse>>, Status>,
    >,
    until: impl Fn(&Event) -> bool,
) -> Result<Vec<Event>, (Status, Vec<Event>)> {
    let mut seen = Vec::new();
    let read = async {
        let mut stream = open.await?.into_inner();
        while let Some(item) = stream.message().await? {
            match item.item {
                Some(stream_events_response::Item::Event(event)) => {
                    let done = until(&event);
                    seen.push(event);
                    if done {
                        break;
                    }
                }
                Some(stream_events_response::Item::CaughtUp(_)) if !follow => break,
                _ => {}
            }
        }
        Ok::<(), Status>(())
    };
    match tokio::time::timeout(WAIT, read).await {
        Ok(Ok(())) => Ok(seen),
        Ok(Err(status)) => Err((status, seen)),
        Err(_) => panic!("StreamEvents({run_id}) timed out; saw {:?}", types(&seen)),
    }
}

/// The run's stored events (no follow), or the status StreamEvents failed with.
pub async fn try_history(runs: &mut RunClient, run_id: &str) -> Result<Vec<Event>, Status> {
    let request = StreamEventsRequest {
        run_id: run_id.into(),
        ..Default::default()
    };
    try_read_stream(run_id, false, runs.stream_events(request), |_| false)
        .await
        .map_err(|(status, _)| status)
}

/// The run's stored events (no follow).
pub async fn history(runs: &mut RunClient, run_id: &str) -> Vec<Event> {
    let request = StreamEventsRequest {
        run_id: run_id.into(),
        ..Default::default()
    };
    read_events(runs, request, |_| false).await
}

/// Follows the run from its first event until an event of type `ty`; returns
/// every event up to and including it.
pub async fn wait_for_event(runs: &mut RunClient, run_id: &str, ty: &str) -> Vec<Event> {
    let request = StreamEventsRequest {
        run_id: run_id.into(),
        follow: true,
        ..Default::default()
    };
    ending_with(read_events(runs, request, |e| e.r#type == ty).await, ty)
}

/// The events, checked to end with one of type `ty`.
#[track_caller]
fn ending_with(events: Vec<Event>, ty: &str) -> Vec<Event> {
    assert_eq!(
        events.last().map(|e| e.r#type.as_str()),
        Some(ty),
        "stream ended before {ty}: {:?}",
        types(&events)
    );
    events
}

/// Waits for the run's approval request; returns its call_id.
pub async fn wait_for_approval(runs: &mut RunClient, run_id: &str) -> String {
    let events = wait_for_event(runs, run_id, "aaa.approval.requested").await;
    call_id(events.last().unwrap())
}

/// Follows the run with stop_at_end until the server ends the stream; returns
/// the whole log, which must end with a terminal event.
pub async fn wait_for_end(runs: &mut RunClient, run_id: &str) -> Vec<Event> {
    let request = StreamEventsRequest {
        run_id: run_id.into(),
        follow: true,
        stop_at_end: true,
        ..Default::default()
    };
    let events = read_events(runs, request, |_| false).await;
    let last = events.last().map(|e| e.r#type.as_str()).unwrap_or_default();
    assert!(
        is_terminal(last),
        "StreamEvents(stop_at_end) ended before the terminal event: {:?}",
        types(&events)
    );
    events
}

/// The `text` of the log's aaa.run.completed.
#[track_caller]
pub fn completed_text(events: &[Event]) -> String {
    let value = data(find(events, "aaa.run.completed"));
    value["value"]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("aaa.run.completed has no value.text: {value}"))
        .to_string()
}

/// Waits (bounded) until health on "" says `status`: the server follows
/// the store's state in a task of its own.
pub async fn wait_for_health(server: &impl Server, status: ServingStatus) {
    let mut health = HealthClient::new(server.channel().await);
    let give_up = tokio::time::Instant::now() + WAIT;
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Health/Watch")
        .into_inner();
    loop {
        let seen = tokio::time::timeout_at(give_up, watch.message())
            .await
            .unwrap_or_else(|_| panic!("health never said {status:?}"))
            .expect("Health/Watch")
            .expect("the watch ended");
        if seen.status == status as i32 {
            return;
        }
    }
}

// ----------------------------------------------------------------- cluster

/// `aaa serve`'s arguments for a server of one owner's cluster on `store`
/// (`--store=URL`), with `--lease-s LEASE_S`, listening on any free port.
pub fn one_owner_args<'a>(store: &'a str, lease_s: &'a str) -> [&'a str; 6] {
    [
        "--listen",
        "127.0.0.1:0",
        store,
        "--lease-s",
        lease_s,
        "--one-owner",
    ]
}

/// `count` child servers on the PostgreSQL at `url` with `--lease-s
/// LEASE_S` and one owner: the first owns the runs (`--one-owner`,
/// checked), the others start as standbys. Their data and logs are in the
/// temp dirs returned beside them.
pub async fn cluster_members(
    url: &str,
    count: usize,
    lease_s: &str,
) -> (Vec<tempfile::TempDir>, Vec<ChildServer>) {
    let dirs: Vec<_> = (0..count).map(|_| tempfile::tempdir().unwrap()).collect();
    let store = format!("--store={url}");
    let mut servers = Vec::with_capacity(count);
    for (i, dir) in dirs.iter().enumerate() {
        let mut args = vec!["--listen", "127.0.0.1:0", &store, "--lease-s", lease_s];
        args.push(if i == 0 { "--one-owner" } else { "--standby" });
        servers.push(ChildServer::start_args(dir.path(), &args).await);
    }
    let (first, last) = (&servers[0], &servers[count - 1]);
    assert_eq!(owner(last).await, Some(member_of(first).await));
    (dirs, servers)
}

/// Asks `server` (bounded by `WAIT`) until the live members are exactly
/// `members`, each holding shards, and every shard is held.
pub async fn wait_until_spread(server: &impl Server, members: &[&str]) {
    let cluster = server.cluster().await;
    wait_until_spread_by(cluster, members).await
}

/// [`wait_until_spread`] through this cluster client (one with a
/// principal's token, when auth is on).
pub async fn wait_until_spread_by<T>(mut client: ClusterServiceClient<T>, members: &[&str])
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        let cluster = client
            .get_cluster(aaa::proto::GetClusterRequest {})
            .await
            .expect("GetCluster")
            .into_inner();
        let live: Vec<_> = cluster.members.iter().filter(|m| m.alive).collect();
        let spread = live.len() == members.len()
            && live
                .iter()
                .all(|m| members.contains(&m.server.as_str()) && m.shards > 0)
            && live.iter().map(|m| m.shards).sum::<u32>() == cluster.shards;
        if spread {
            return;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "never spread: {cluster:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `count` servers on `url` that share the shards out (the default, lease
/// `lease_s`), once every shard is held and each has its share.
pub async fn spread_members(
    url: &str,
    count: usize,
    lease_s: &str,
) -> (Vec<tempfile::TempDir>, Vec<ChildServer>) {
    let dirs: Vec<_> = (0..count).map(|_| tempfile::tempdir().unwrap()).collect();
    let store = format!("--store={url}");
    let args = ["--listen", "127.0.0.1:0", &store, "--lease-s", lease_s];
    let mut servers = Vec::with_capacity(count);
    for dir in &dirs {
        servers.push(ChildServer::start_args(dir.path(), &args).await);
    }
    let mut names = Vec::new();
    for server in &servers {
        names.push(member_of(server).await);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    wait_until_spread(&servers[0], &names).await;
    (dirs, servers)
}

/// The server's member name, as GetCluster reports it.
pub async fn member_of(server: &impl Server) -> String {
    cluster_of(server).await.this_server
}

pub async fn cluster_of(server: &impl Server) -> aaa::proto::GetClusterResponse {
    server
        .cluster()
        .await
        .get_cluster(aaa::proto::GetClusterRequest {})
        .await
        .expect("GetCluster")
        .into_inner()
}

/// The member that holds every shard with a live lease, if one does.
pub async fn owner(server: &impl Server) -> Option<String> {
    let cluster = cluster_of(server).await;
    cluster
        .members
        .into_iter()
        .find(|m| m.alive && m.shards == cluster.shards)
        .map(|m| m.server)
}

/// Asks `server` (bounded by [`WAIT`]) until it reports `member` as the
/// owner of the runs. Ownership moves by leases in the database, which no
/// stream announces, so this asks every 50 ms.
pub async fn wait_until_owner(server: &impl Server, member: &str) {
    let give_up = tokio::time::Instant::now() + WAIT;
    loop {
        if owner(server).await.as_deref() == Some(member) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{member} never owned the runs: {:?}",
            cluster_of(server).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a client retries the call: UNAVAILABLE, or a call the
/// connection failed under before any answer came, as when a server stops
/// and its HTTP/2 GOAWAY refuses the streams it did not take. Tonic makes
/// such a status itself (CANCELLED or INTERNAL, with the transport error
/// as its source; a status a server sent has none); gRPC's core libraries
/// retry these calls transparently.
pub fn is_retryable(status: &Status) -> bool {
    use std::error::Error;
    status.code() == Code::Unavailable || status.source().is_some()
}

/// The pause before a client tries again, as the SDKs' retry has: not a
/// wait for a state, which the next attempt asks the servers about.
pub async fn backoff() {
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
}

/// Retries a call while it [`is_retryable`] (the owner died and no other
/// server holds the runs yet, a server stopped), as the SDKs do.
pub async fn retrying<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(status) if is_retryable(&status) && std::time::Instant::now() < give_up => {
                backoff().await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
}

// ----------------------------------------------------------------- signals

pub async fn signal(
    runs: &mut RunClient,
    run_id: &str,
    ty: &str,
    data: serde_json::Value,
) -> Result<SignalResponse, Status> {
    runs.signal(SignalRequest {
        run_id: run_id.into(),
        r#type: ty.into(),
        data_json: data.to_string(),
        request_id: String::new(),
    })
    .await
    .map(|r| r.into_inner())
}

/// Grants the reference run's waiting call, serves it as a worker, and
/// checks the run completes with the reference text.
pub async fn grant_and_finish(
    runs: &mut RunClient,
    workers: &mut WorkerClient,
    run_id: &str,
    call_id: &str,
) {
    grant(runs, run_id, call_id).await;
    finish_granted(runs, workers, run_id).await;
}

/// Serves the granted reference call as worker "w" and waits for the run's
/// reference completion; returns its history.
pub async fn finish_granted(
    runs: &mut RunClient,
    workers: &mut WorkerClient,
    run_id: &str,
) -> Vec<Event> {
    let task = poll_until_task(workers, "w", &["wire_money"], &[]).await;
    complete_tool(workers, &task.token, REFERENCE_OUTPUT)
        .await
        .expect("CompleteTask");
    let events = wait_for_end(runs, run_id).await;
    assert_eq!(completed_text(&events), REFERENCE_TEXT);
    events
}

/// Grants the call with [`grant_request`], [`retrying`] while no server
/// can take it yet (the owner died, its engine is starting).
pub async fn grant_retrying(runs: &RunClient, run_id: &str, call_id: &str) {
    retrying(|| {
        let mut granting = runs.clone();
        let request = grant_request(run_id, call_id);
        async move { granting.signal(request).await }
    })
    .await;
}

/// A grant with a request id of its own, so that a retry after an
/// UNAVAILABLE answer cannot append a second one.
pub fn grant_request(run_id: &str, call_id: &str) -> SignalRequest {
    SignalRequest {
        run_id: run_id.into(),
        r#type: "aaa.approval.granted".into(),
        data_json: serde_json::json!({ "call_id": call_id }).to_string(),
        request_id: format!("grant-{run_id}-{call_id}"),
    }
}

pub async fn grant(runs: &mut RunClient, run_id: &str, call_id: &str) -> SignalResponse {
    signal(
        runs,
        run_id,
        "aaa.approval.granted",
        serde_json::json!({ "call_id": call_id }),
    )
    .await
    .expect("grant")
}

pub async fn deny(
    runs: &mut RunClient,
    run_id: &str,
    call_id: &str,
    reason: &str,
) -> SignalResponse {
    let data = serde_json::json!({ "call_id": call_id, "reason": reason });
    signal(runs, run_id, "aaa.approval.denied", data)
        .await
        .expect("deny")
}

/// Asserts the status code and the ErrorInfo (domain "aaa.v1", `reason`).
#[track_caller]
pub fn assert_error(status: &Status, code: Code, reason: &str) -> ErrorInfo {
    assert_eq!(status.code(), code, "wrong code: {status:?}");
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "aaa.v1", "wrong ErrorInfo domain: {status:?}");
    assert_eq!(info.reason, reason, "wrong ErrorInfo reason: {status:?}");
    info
}

/// Unwraps the error of a call that must fail.
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(result: Result<T, Status>) -> Status {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(status) => status,
    }
}

// --------------------------------------------------------------- approvals

pub type ApprovalWatch = tonic::Streaming<WatchApprovalsResponse>;

pub async fn watch_approvals(
    approvals: &mut ApprovalClient,
    request: WatchApprovalsRequest,
) -> ApprovalWatch {
    approvals
        .watch_approvals(request)
        .await
        .expect("WatchApprovals")
        .into_inner()
}

/// The watch's next item, heartbeats included.
pub async fn next_watch_item(watch: &mut ApprovalWatch) -> watch_approvals_response::Item {
    tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("WatchApprovals sent nothing")
        .expect("WatchApprovals failed")
        .expect("WatchApprovals ended")
        .item
        .expect("WatchApprovalsResponse without item")
}

/// The watch's next item that is not a heartbeat, with its position.
pub async fn next_watch_change(watch: &mut ApprovalWatch) -> WatchApprovalsResponse {
    loop {
        let response = tokio::time::timeout(WAIT, watch.message())
            .await
            .expect("WatchApprovals sent nothing but heartbeats")
            .expect("WatchApprovals failed")
            .expect("WatchApprovals ended");
        if !matches!(
            response.item,
            Some(watch_approvals_response::Item::Heartbeat(_))
        ) {
            return response;
        }
    }
}

/// Reads the snapshot up to snapshot_complete, whose count must match.
pub async fn read_snapshot(watch: &mut ApprovalWatch) -> Vec<Approval> {
    let mut pending = Vec::new();
    loop {
        match next_watch_change(watch).await.item {
            Some(watch_approvals_response::Item::Requested(approval)) => pending.push(approval),
            Some(watch_approvals_response::Item::SnapshotComplete(done)) => {
                assert_eq!(
                    done.pending as usize,
                    pending.len(),
                    "snapshot_complete.pending"
                );
                return pending;
            }
            other => panic!("unexpected item in the snapshot: {other:?}"),
        }
    }
}

pub async fn list_approvals(
    approvals: &mut ApprovalClient,
    request: ListApprovalsRequest,
) -> Vec<Approval> {
    approvals
        .list_approvals(request)
        .await
        .expect("ListApprovals")
        .into_inner()
        .approvals
}

// ----------------------------------------------------------------- workers

/// One PollTask; `None` when the wait ended with nothing to do.
pub async fn poll(
    workers: &mut WorkerClient,
    identity: &str,
    tools: &[&str],
    models: &[&str],
    wait_s: f64,
) -> Option<Task> {
    let request = PollTaskRequest {
        identity: identity.into(),
        tools: tools.iter().map(|t| t.to_string()).collect(),
        models: models.iter().map(|m| m.to_string()).collect(),
        wait_s,
    };
    tokio::time::timeout(WAIT, workers.poll_task(request))
        .await
        .expect("PollTask did not answer")
        .expect("PollTask")
        .into_inner()
        .task
}

/// Polls until a task comes (bounded by [`WAIT`]).
pub async fn poll_until_task(
    workers: &mut WorkerClient,
    identity: &str,
    tools: &[&str],
    models: &[&str],
) -> Task {
    let give_up = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < give_up {
        if let Some(task) = poll(workers, identity, tools, models, 1.0).await {
            return task;
        }
    }
    panic!("no task for {tools:?} {models:?} within {WAIT:?}");
}

pub fn tool_task(task: &Task) -> &aaa::proto::ToolTask {
    match &task.kind {
        Some(task::Kind::Tool(tool)) => tool,
        other => panic!("expected a tool task, got {other:?}"),
    }
}

pub fn model_task(task: &Task) -> &ModelTask {
    match &task.kind {
        Some(task::Kind::Model(model)) => model,
        other => panic!("expected a model task, got {other:?}"),
    }
}

pub async fn complete_tool(
    workers: &mut WorkerClient,
    token: &str,
    output_json: &str,
) -> Result<(), Status> {
    workers
        .complete_task(CompleteTaskRequest {
            token: token.into(),
            result: Some(complete_task_request::Result::OutputJson(
                output_json.into(),
            )),
        })
        .await
        .map(|_| ())
}

pub async fn complete_model(
    workers: &mut WorkerClient,
    token: &str,
    reply: ModelReply,
) -> Result<(), Status> {
    workers
        .complete_task(CompleteTaskRequest {
            token: token.into(),
            result: Some(complete_task_request::Result::Reply(reply)),
        })
        .await
        .map(|_| ())
}

/// A worker loop in a task: tool tasks are completed with
/// [`REFERENCE_OUTPUT`], model tasks with [`seed_reply`]. It records every
/// task it got. Aborted on drop; `stop` also checks it saw no error.
pub struct Worker {
    handle: Option<JoinHandle<()>>,
    tasks: Arc<Mutex<Vec<Task>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Worker {
    pub async fn spawn(
        server: &impl Server,
        identity: &str,
        tools: &[&str],
        models: &[&str],
    ) -> Self {
        let mut workers = server.workers().await;
        let identity = identity.to_string();
        let tools: Vec<String> = tools.iter().map(|t| t.to_string()).collect();
        let models: Vec<String> = models.iter().map(|m| m.to_string()).collect();
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (tasks_seen, errors_seen) = (tasks.clone(), errors.clone());
        let handle = tokio::spawn(async move {
            loop {
                let request = PollTaskRequest {
                    identity: identity.clone(),
                    tools: tools.clone(),
                    models: models.clone(),
                    wait_s: 1.0,
                };
                let task = match workers.poll_task(request).await {
                    Ok(response) => response.into_inner().task,
                    Err(status) => {
                        errors_seen
                            .lock()
                            .unwrap()
                            .push(format!("PollTask: {status:?}"));
                        return;
                    }
                };
                let Some(task) = task else { continue };
                tasks_seen.lock().unwrap().push(task.clone());
                let result = match &task.kind {
                    Some(task::Kind::Tool(_)) => {
                        complete_tool(&mut workers, &task.token, REFERENCE_OUTPUT).await
                    }
                    Some(task::Kind::Model(model)) => {
                        complete_model(&mut workers, &task.token, seed_reply(model)).await
                    }
                    None => Err(Status::internal("task without kind")),
                };
                if let Err(status) = result {
                    errors_seen
                        .lock()
                        .unwrap()
                        .push(format!("CompleteTask: {status:?}"));
                }
            }
        });
        Worker {
            handle: Some(handle),
            tasks,
            errors,
        }
    }

    /// The tasks handed out so far.
    pub fn tasks(&self) -> Vec<Task> {
        self.tasks.lock().unwrap().clone()
    }

    /// Tool tasks handed out so far for `run_id`.
    pub fn tool_tasks_of(&self, run_id: &str) -> Vec<Task> {
        self.tasks()
            .into_iter()
            .filter(|t| t.run_id == run_id && matches!(t.kind, Some(task::Kind::Tool(_))))
            .collect()
    }

    /// Model tasks handed out so far for `run_id`.
    pub fn model_tasks_of(&self, run_id: &str) -> Vec<ModelTask> {
        self.tasks()
            .into_iter()
            .filter(|t| t.run_id == run_id)
            .filter_map(|t| match t.kind {
                Some(task::Kind::Model(model)) => Some(model),
                _ => None,
            })
            .collect()
    }

    /// Stops the loop; panics if any of its calls failed. Returns its tasks.
    pub async fn stop(mut self) -> Vec<Task> {
        if let Some(handle) = self.handle.take() {
            handle.abort();
            let _ = handle.await;
        }
        let errors = self.errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "worker loop errors: {errors:?}");
        self.tasks()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

// -------------------------------------------------------------- credentials

/// Sends `authorization: Bearer TOKEN` with every call (none for `None`).
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Self {
        Bearer(token.map(|t| format!("Bearer {t}").parse().expect("ASCII token")))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

pub type Authed = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// The three clients of one principal, on one connection.
#[derive(Clone)]
pub struct Clients {
    pub runs: RunServiceClient<Authed>,
    pub approvals: ApprovalServiceClient<Authed>,
    pub workers: WorkerServiceClient<Authed>,
    pub grants: aaa::proto::grant_service_client::GrantServiceClient<Authed>,
    pub cluster: aaa::proto::cluster_service_client::ClusterServiceClient<Authed>,
}

impl Clients {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let bearer = Bearer::new(token);
        Clients {
            runs: RunServiceClient::with_interceptor(channel.clone(), bearer.clone()),
            approvals: ApprovalServiceClient::with_interceptor(channel.clone(), bearer.clone()),
            workers: WorkerServiceClient::with_interceptor(channel.clone(), bearer.clone()),
            grants: aaa::proto::grant_service_client::GrantServiceClient::with_interceptor(
                channel.clone(),
                bearer.clone(),
            ),
            cluster: aaa::proto::cluster_service_client::ClusterServiceClient::with_interceptor(
                channel, bearer,
            ),
        }
    }

    /// Connects to `server` and sends `token` with every call.
    pub async fn with_token(server: &impl Server, token: &str) -> Self {
        Clients::new(server.channel().await, Some(token))
    }

    /// The run's stored events (no follow).
    pub async fn history(&mut self, run_id: &str) -> Vec<Event> {
        self.follow_until(run_id, false, |_| false).await
    }

    /// Follows the run until an event of type `ty`; returns the events up
    /// to and including it.
    pub async fn wait_for_event(&mut self, run_id: &str, ty: &str) -> Vec<Event> {
        ending_with(
            self.follow_until(run_id, true, |e| e.r#type == ty).await,
            ty,
        )
    }

    pub async fn follow_until(
        &mut self,
        run_id: &str,
        follow: bool,
        until: impl Fn(&Event) -> bool,
    ) -> Vec<Event> {
        let request = StreamEventsRequest {
            run_id: run_id.into(),
            follow,
            ..Default::default()
        };
        read_stream(run_id, follow, self.runs.stream_events(request), until).await
    }
}
