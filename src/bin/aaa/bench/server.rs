//! What the bench connects to and cleans up: scratch directories, the `aaa
//! serve` child process (spawn, read its address, RSS, kill -9, restart on the
//! same data) and a pool of gRPC channels used round-robin, over one server
//! or several.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use aaa::proto::approval_service_client::ApprovalServiceClient;
use aaa::proto::cluster_service_client::ClusterServiceClient;
use aaa::proto::run_service_client::RunServiceClient;
use aaa::proto::worker_service_client::WorkerServiceClient;

/// How long a child may take to print its address, or to answer SERVING.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A directory under the system temp dir, removed on drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> anyhow::Result<ScratchDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("aaa-bench-{}-{nanos}-{tag}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ScratchDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `aaa serve` (this very executable) as a child process on an ephemeral
/// port, with its data and log in a scratch dir. Killed and reaped on drop;
/// the dir goes after it.
pub struct ChildServer {
    child: Option<Child>,
    addr: String,
    dir: ScratchDir,
    /// `--store`: a PostgreSQL URL, or `None` for the embedded store.
    store_url: Option<String>,
    /// More `aaa serve` arguments (`--standby`, `--lease-s`, ...).
    extra_args: Vec<String>,
}

impl ChildServer {
    pub async fn start(tag: &str, store_url: Option<String>) -> anyhow::Result<ChildServer> {
        Self::start_with(tag, store_url, Vec::new()).await
    }

    /// [`Self::start`] with more `aaa serve` arguments.
    pub async fn start_with(
        tag: &str,
        store_url: Option<String>,
        extra_args: Vec<String>,
    ) -> anyhow::Result<ChildServer> {
        let mut server = ChildServer {
            child: None,
            addr: String::new(),
            dir: ScratchDir::new(tag)?,
            store_url,
            extra_args,
        };
        server.resume().await?;
        Ok(server)
    }

    /// "host:port" the child serves on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Starts the server on the data dir, on a new ephemeral port, and
    /// returns once it printed where it listens, which it does once its
    /// store is open (then [`wait_serving`] checks it answers).
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("the server is already running");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut child = Command::new(std::env::current_exe()?)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.data_dir())
            .args(self.store_url.iter().map(|url| format!("--store={url}")))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("spawning `aaa serve`")?;
        let stdout = child.stdout.take().context("child stdout")?;
        self.child = Some(child);
        // Read stdout on a thread: report the address, then drain until exit.
        let (tx, rx) = oneshot::channel::<String>();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("serving on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.to_string());
                    }
                }
            }
        });
        match tokio::time::timeout(START_TIMEOUT, rx).await {
            Ok(Ok(addr)) => {
                self.addr = addr;
                Ok(())
            }
            _ => {
                self.kill9();
                bail!(
                    "`aaa serve` printed no `serving on ADDR` line; its log:\n{}",
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                )
            }
        }
    }

    /// The child's data directory (the embedded store's).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Resident memory of the child (VmRSS), in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// CPU time the child used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        super::proc::cpu_seconds(self.pid()?)
    }

    /// The child's process id (none for a server the bench did not start).
    pub fn pid(&self) -> Option<u32> {
        Some(self.child.as_ref()?.id())
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Calls Health/Check until the server answers SERVING. Each call waits on
/// the server (a listener that is not yet served holds the connection), so
/// this loop only repeats when the server answers "not yet".
pub async fn wait_serving(addr: &str) -> anyhow::Result<()> {
    let wait = async {
        let mut last = String::new();
        for _ in 0..1000 {
            let answer = async {
                let channel = endpoint(addr)?.connect().await?;
                let response = HealthClient::new(channel)
                    .check(HealthCheckRequest::default())
                    .await?;
                anyhow::Ok(response.into_inner().status)
            };
            match answer.await {
                Ok(status) if status == ServingStatus::Serving as i32 => return Ok(()),
                Ok(status) => last = format!("status {status}"),
                Err(e) => last = format!("{e:#}"),
            }
        }
        bail!("{addr} never answered SERVING: {last}")
    };
    tokio::time::timeout(START_TIMEOUT, wait)
        .await
        .with_context(|| format!("{addr} did not answer SERVING within {START_TIMEOUT:?}"))?
}

fn endpoint(addr: &str) -> anyhow::Result<Endpoint> {
    let uri = match addr.starts_with("http") {
        true => addr.to_string(),
        false => format!("http://{addr}"),
    };
    Endpoint::from_shared(uri).with_context(|| format!("bad server address {addr}"))
}

/// Several HTTP/2 connections, handed out round-robin, so one connection is
/// not the bottleneck (and so many streams stay under the server's 200
/// concurrent streams per connection).
///
/// Once [`Pool::route`] has read who owns which shard, the calls of one run
/// ([`Pool::runs_of`], [`Pool::workers_of`]) go to its owner, as a client
/// that routes by shard does, instead of to the next server in turn.
#[derive(Clone)]
pub struct Pool {
    channels: Arc<[Channel]>,
    /// The server address of each channel.
    addrs: Arc<[String]>,
    next: Arc<AtomicUsize>,
    /// For each shard, the channel to its owner (empty: not routing).
    owners: Arc<std::sync::RwLock<Vec<Option<Channel>>>>,
}

pub type RunClient = RunServiceClient<Channel>;
pub type WorkerClient = WorkerServiceClient<Channel>;
pub type ApprovalClient = ApprovalServiceClient<Channel>;

impl Pool {
    pub async fn connect(addr: &str, connections: usize) -> anyhow::Result<Pool> {
        Self::connect_all(&[addr], connections).await
    }

    /// `connections` to each of `addrs`, used in turn: a load spread evenly
    /// over the servers of a cluster.
    pub async fn connect_all(addrs: &[&str], connections: usize) -> anyhow::Result<Pool> {
        let mut channels = Vec::with_capacity(addrs.len() * connections);
        let mut of = Vec::with_capacity(channels.capacity());
        for _ in 0..connections.max(1) {
            for addr in addrs {
                let channel = endpoint(addr)?
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {addr}"))?;
                channels.push(channel);
                of.push(addr.to_string());
            }
        }
        Ok(Pool {
            channels: channels.into(),
            addrs: of.into(),
            next: Arc::new(AtomicUsize::new(0)),
            owners: Arc::default(),
        })
    }

    /// Reads who owns each shard (GetCluster) and sends each run's calls to
    /// its owner from now on; a shard whose owner is not among the pool's
    /// servers (or has none) keeps the turn. Returns how many shards it
    /// routes.
    pub async fn route(&self) -> anyhow::Result<usize> {
        let view = self
            .cluster()
            .get_cluster(aaa::proto::GetClusterRequest {})
            .await?
            .into_inner();
        let owners: Vec<Option<Channel>> = view
            .shard_owners
            .iter()
            .map(|owner| {
                let at = self.addrs.iter().position(|addr| addr == owner)?;
                Some(self.channels[at].clone())
            })
            .collect();
        let routed = owners.iter().flatten().count();
        *self.owners.write().expect("poisoned") = owners;
        Ok(routed)
    }

    fn channel(&self) -> Channel {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.channels[i % self.channels.len()].clone()
    }

    /// The channel to `run_id`'s owner when routing, else the next one.
    fn channel_of(&self, run_id: &str) -> Channel {
        let shard = aaa::store::RunId::parse(run_id).map(|run| run.shard());
        let owners = self.owners.read().expect("poisoned");
        let owner = shard.and_then(|shard| owners.get(usize::from(shard))?.clone());
        drop(owners);
        owner.unwrap_or_else(|| self.channel())
    }

    /// A run's calls: to its owner when routing.
    pub fn runs_of(&self, run_id: &str) -> RunClient {
        RunServiceClient::new(self.channel_of(run_id))
    }

    /// A run's task calls: to its owner when routing.
    pub fn workers_of(&self, run_id: &str) -> WorkerClient {
        WorkerServiceClient::new(self.channel_of(run_id))
    }

    pub fn runs(&self) -> RunClient {
        RunServiceClient::new(self.channel())
    }

    pub fn workers(&self) -> WorkerClient {
        WorkerServiceClient::new(self.channel())
    }

    pub fn approvals(&self) -> ApprovalClient {
        ApprovalServiceClient::new(self.channel())
    }

    pub fn cluster(&self) -> ClusterServiceClient<Channel> {
        ClusterServiceClient::new(self.channel())
    }

    pub fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(self.channel())
    }
}
