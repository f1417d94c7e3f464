//! Wiring: open the store, start the engine, serve the api until shutdown.

use std::future::Future;
use std::net::SocketAddr;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::api::{
    malformed, ApprovalApi, ClusterApi, GrantApi, PolicyApi, RunApi, SubscriptionApi, WorkerApi,
};
use crate::auth::forwarded::Verifier;
use crate::auth::{AuthLayer, Throttle};
use crate::cluster::forward::{Routed, Slot};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::connections;
use crate::engine::{Engine, Reads};
use crate::proto::approval_service_server::ApprovalServiceServer;
use crate::proto::cluster_service_server::ClusterServiceServer;
use crate::proto::grant_service_server::GrantServiceServer;
use crate::proto::policy_service_server::PolicyServiceServer;
use crate::proto::run_service_server::RunServiceServer;
use crate::proto::subscription_service_server::SubscriptionServiceServer;
use crate::proto::worker_service_server::WorkerServiceServer;
use crate::store::{ClusterView, Shards, SharedStore};
use crate::subscriptions::Subscriptions;
use tonic::server::NamedService;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the store ({place}): {source}")]
    Store {
        /// The data directory, or the database URL without its password.
        place: String,
        source: crate::store::StoreError,
    },
    #[error("cannot recover runs: {0}")]
    Engine(#[from] crate::engine::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("cannot start the built-in model: {0}")]
    Models(String),
    #[error("cannot start webhooks: {0}")]
    Webhooks(#[from] crate::subscriptions::Error),
    #[error("cannot serve the web inbox: {0}")]
    Web(String),
    /// Settings that cannot work together; nothing was started.
    #[error("{0}")]
    Config(String),
    #[error("cannot serve MCP: {0}")]
    Mcp(String),
}

/// Where the store is, as errors and logs name it (no password).
fn store_place(config: &Config) -> String {
    match &config.store_url {
        Some(url) => crate::store::redact(url),
        None => config.data_dir.display().to_string(),
    }
}

/// Serves aaa on `listener` until `shutdown` completes, then stops
/// gracefully: health turns NOT_SERVING, streams and long polls end,
/// in-flight calls get `config.shutdown_grace` to finish, and the store
/// commits what it has and closes. `ready` runs once the store is open and
/// the services are about to take calls (connections made before wait in
/// the listener's backlog).
///
/// On a shared database a server that finds no live claim on the runs
/// claims them before it serves; one that finds a live owner (or started
/// with `--standby`) is a standby: it serves at once by forwarding every
/// call to the owner and claims the runs when the owner's lease lapses.
/// Only `--take-over` claims them at once, fencing the owner out (see
/// [`crate::cluster`]).
pub async fn serve(
    listener: TcpListener,
    config: Config,
    ready: impl FnOnce() + Send,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let grace = config.shutdown_grace;
    let mut released = None;
    let served = serve_store(listener, config, ready, shutdown, &mut released).await;
    // Tasks that saw the stop may still hold the store for a moment: once
    // `serve` returns, the same data directory opens again (a restart in
    // the same process, as tests and embedders do).
    if let Some(released) = released {
        if tokio::time::timeout(grace, released.wait()).await.is_err() {
            tracing::warn!("the store was still in use {grace:?} after the stop");
        }
    }
    served
}

/// [`serve`], telling through `released` when the store it opened is let go.
async fn serve_store(
    listener: TcpListener,
    config: Config,
    ready: impl FnOnce() + Send,
    shutdown: impl Future<Output = ()> + Send + 'static,
    released: &mut Option<crate::store::Released>,
) -> Result<(), ServeError> {
    // Transport settings first: a bad TLS key fails before the store opens.
    // Keepalive pings close an established connection whose client stopped
    // answering; `connections` closes one that never finished its handshake.
    let mut builder = Server::builder()
        .max_concurrent_streams(Some(config.max_streams_per_connection))
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .http2_keepalive_timeout(Some(config.keepalive_interval));
    let tls = config.auth.as_ref().and_then(|auth| auth.tls.as_ref());
    let limits = connections::Limits {
        max_connections: config.max_connections,
        handshake_timeout: config.handshake_timeout,
        tls: tls.is_some(),
    };
    if let Some(tls) = tls {
        builder = builder.tls_config(tls.server_config())?;
    }
    match &config.auth {
        Some(auth) => tracing::info!("callers must authenticate: {auth:?}"),
        None => tracing::warn!("no auth config: every caller may call every RPC"),
    }
    check_forwarding_hop(&config, listener.local_addr().ok())?;

    let store = crate::store::open(&config.store_settings())
        .await
        .map_err(|source| ServeError::Store {
            place: store_place(&config),
            source,
        })?;
    *released = Some(store.released());
    let joined = async {
        let store_error = |source| ServeError::Store {
            place: store_place(&config),
            source,
        };
        let cluster = join(&listener, &config, &store)
            .await
            .map_err(store_error)?;
        // One read of who is on the database serves both decisions.
        let view = store.cluster().await.map_err(store_error)?;
        refuse_mixing(&config, &view, &cluster.server)?;
        Ok((cluster, stands_by(&config, &view)))
    };
    let (cluster, config) = match joined.await {
        Ok((cluster, standby)) => (cluster, Config { standby, ..config }),
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    // In front of every service: the caller's deadline (answered
    // DEADLINE_EXCEEDED), authentication and roles (with auth off,
    // only the caller a forwarding server names), and the one answer to
    // requests that do not decode.
    // Plain HTTP (browsers, Prometheus) shares the port: HTTP/1.1 is
    // accepted beside HTTP/2, and the requests that are not gRPC leave
    // before the gRPC auth layer for a router that checks its callers.
    let stopping = CancellationToken::new();
    // Wrong credentials are counted per address across every door.
    let throttle = Arc::new(Throttle::new(config.clock.clone()));
    let web = match web_settings(
        &config,
        &cluster,
        &stopping,
        &throttle,
        listener.local_addr().ok(),
    ) {
        Ok(web) => web,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    // A forwarded request is buffered whole (to send it, and to verify its
    // signature): one message and its framing.
    let forward_limit = config.max_message_bytes + 64;
    // The upstream MCP servers are reached before anything is served: a
    // tool that cannot be served fails the start, naming it.
    let gateway = match &config.mcp {
        Some(mcp) => match crate::mcp::Gateway::connect(mcp).await {
            Ok(gateway) => Some(gateway),
            Err(e) => {
                store.close().await;
                return Err(ServeError::Mcp(e));
            }
        },
        None => None,
    };
    let hosts = web.hosts.clone();
    let mut http = crate::metrics::scrape::router(
        config.metrics.clone(),
        config.auth.clone(),
        throttle.clone(),
    )
    .merge(crate::web::router(web));
    if let Some(gateway) = &gateway {
        http = http.merge(crate::mcp::server::router(crate::mcp::server::Settings {
            gateway: gateway.clone(),
            auth: config.auth.clone(),
            throttle: throttle.clone(),
            hosts,
            stopping: stopping.clone(),
        }));
    }
    let mut builder = builder
        .accept_http1(true)
        .layer(crate::api::deadline::layer())
        .layer(crate::http::HttpLayer::new(http))
        .layer(crate::metrics::ApiMetricsLayer::new(config.metrics.clone()))
        .layer(AuthLayer::new(
            config.auth.clone(),
            throttle,
            Verifier::new(
                store.token_key(),
                cluster.address.clone(),
                crate::clock::now_ms(),
            ),
            forward_limit,
            crate::api::status::refused,
        ))
        .layer(malformed::layer());

    let grace = config.shutdown_grace;
    let local = LocalServices {
        mcp: gateway,
        ..Default::default()
    };
    let mut shutdown = Box::pin(shutdown);
    let owning = own_runs(
        cluster.clone(),
        config.clone(),
        stopping.clone(),
        local.clone(),
    );
    let mut owning = Box::pin(owning);
    // A standby serves at once (by forwarding) and owns the runs later;
    // any other server owns them before it serves. Either may wait long
    // for the database: a stop signal ends the wait.
    let mut owned = !config.standby;
    if owned {
        let result = tokio::select! {
            result = &mut owning => result,
            () = &mut shutdown => {
                store.close().await;
                return Ok(());
            }
        };
        if let Err(e) = result {
            stopping.cancel();
            store.close().await;
            return Err(e);
        }
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::Serving).await;
    tokio::spawn(follow_store(
        store.watch_writable(),
        health.clone(),
        stopping.clone(),
    ));
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    ready();
    let incoming = connections::incoming(listener, limits, stopping.clone());
    let signal = {
        let stopping = stopping.clone();
        let health = health.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            // Cancelled first, so the store's follower cannot say SERVING
            // again; this also ends streams and long polls, so the graceful
            // stop is quick.
            stopping.cancel();
            set_health(&health, ServingStatus::NotServing).await;
        }
    };
    // On a shared store, reads are answered here from the database while
    // another server owns the runs.
    let readers = config.store_url.is_some().then(|| {
        ReadServices::new(
            &config,
            Reads::from_database(store.clone(), stopping.clone()),
        )
    });
    let store_kind = match config.store_url {
        Some(_) => "postgres",
        None => "embedded",
    };
    let server = builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            Routed::new(local.runs.clone(), cluster.clone(), forward_limit)
                .with_reads(readers.as_ref().map(|r| r.runs.clone())),
        )
        .add_service(
            Routed::new(local.approvals.clone(), cluster.clone(), forward_limit)
                .with_reads(readers.as_ref().map(|r| r.approvals.clone())),
        )
        .add_service(
            Routed::new(local.grants.clone(), cluster.clone(), forward_limit)
                .with_reads(readers.map(|r| r.grants)),
        )
        .add_service(Routed::new(
            local.workers.clone(),
            cluster.clone(),
            forward_limit,
        ))
        .add_service(Routed::new(
            local.subscriptions.clone(),
            cluster.clone(),
            forward_limit,
        ))
        .add_service(ClusterServiceServer::new(ClusterApi {
            cluster: cluster.clone(),
            store: store_kind,
            engine: local.current.clone(),
        }))
        .add_service(PolicyServiceServer::new(PolicyApi {
            policy: config.policy.clone(),
        }))
        .serve_with_incoming_shutdown(incoming, signal);
    tokio::pin!(server);
    let served = loop {
        tokio::select! {
            served = &mut server => break served,
            result = &mut owning, if !owned => {
                owned = true;
                if let Err(e) = result {
                    stopping.cancel();
                    store.close().await;
                    return Err(e);
                }
            }
            _ = async { stopping.cancelled().await; tokio::time::sleep(grace).await } => {
                tracing::warn!("calls still running after the {grace:?} grace period are dropped");
                break Ok(());
            }
        }
    };
    stopping.cancel();
    let engine = local.engine.lock().await.take();
    if let Some((engine, _)) = engine {
        // Its tasks stop at once on `stopping`; bounded all the same.
        let _ = tokio::time::timeout(grace, engine.stopped()).await;
    }
    drop(local);
    store.close().await;
    served?;
    Ok(())
}

/// What the web inbox needs: it calls this server's gRPC API over a
/// loopback channel as the signed-in person, keeps sign-outs in the store,
/// and answers to the loopback names, `--allow-host`, and with auth on the
/// names it is reached at (`--public-url`, the listening and advertised
/// addresses); with auth off a public name would only serve a rebinding
/// page (see `web::hosts`).
fn web_settings(
    config: &Config,
    cluster: &Cluster,
    stopping: &CancellationToken,
    throttle: &Arc<Throttle>,
    listening: Option<std::net::SocketAddr>,
) -> Result<crate::web::Settings, ServeError> {
    let channel = cluster
        .loopback()
        .map_err(|e| ServeError::Web(e.message().to_string()))?;
    let mut hosts = crate::web::hosts::AllowedHosts::new(listening.map_or(0, |a| a.port()));
    for name in &config.allowed_hosts {
        hosts.add_name(name);
    }
    if config.auth.is_some() {
        hosts.add_url(&public_url(config, cluster));
        if let Some(listening) = listening {
            hosts.add_address(&listening.to_string());
        }
        hosts.add_address(&cluster.address);
    }
    Ok(crate::web::Settings {
        auth: config.auth.clone(),
        tls: config.auth.as_ref().is_some_and(|a| a.tls.is_some()),
        key: cluster.store().token_key(),
        address: cluster.address.clone(),
        channel,
        stopping: stopping.clone(),
        store: cluster.store().clone(),
        clock: config.clock.clone(),
        throttle: throttle.clone(),
        hosts,
    })
}

/// The base URL of this server's pages: `--public-url`, or the scheme and
/// advertised address clients reach it at.
pub fn public_url(config: &Config, cluster: &Cluster) -> String {
    match &config.public_url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => format!("{}://{}", cluster.scheme(), cluster.address),
    }
}

/// The aaa services of this server, filled while its engine serves some
/// shards; empty before, while one engine makes way for another, and once
/// it holds none (calls are forwarded to the owners meanwhile).
#[derive(Clone, Default)]
struct LocalServices {
    runs: Slot<RunServiceServer<RunApi>>,
    approvals: Slot<ApprovalServiceServer<ApprovalApi>>,
    grants: Slot<GrantServiceServer<GrantApi>>,
    workers: Slot<WorkerServiceServer<WorkerApi>>,
    subscriptions: Slot<SubscriptionServiceServer<SubscriptionApi>>,
    /// The engine and its consumer groups, closed when another replaces
    /// them, awaited at shutdown.
    engine: Arc<tokio::sync::Mutex<Option<(Engine, Subscriptions)>>>,
    /// The same engine, for the calls that use it directly (PeerPoll).
    current: Slot<Engine>,
    /// The MCP gateway (`--mcp`), which works with each engine started here.
    mcp: Option<Arc<crate::mcp::Gateway>>,
}

impl LocalServices {
    /// Serves the runs of `shards` here: closes the engine serving the
    /// previous set (its commits under way finish, none follows), and
    /// starts one on this set, which recovers their runs as a restart does.
    async fn serve(
        &self,
        cluster: &Arc<Cluster>,
        config: &Config,
        shards: Shards,
        stopping: &CancellationToken,
    ) -> Result<(), ServeError> {
        let mut engine = self.engine.lock().await;
        cluster.serve(Shards::none());
        self.fill(None);
        *self.current.write().expect("poisoned") = None;
        if let Some((previous, groups)) = engine.take() {
            previous.close().await;
            groups.closed().await;
        }
        if shards.is_empty() {
            return Ok(());
        }
        let started = Engine::start(
            cluster.store().clone(),
            config.engine_settings(),
            shards,
            stopping.child_token(),
        )
        .await?;
        let subscriptions = SubscriptionApi::new(&started);
        // A webhook delivers from its consumer group, served by the owner
        // of the group's shard.
        let hooks: Vec<_> = webhooks(config, cluster)
            .into_iter()
            .filter(|hook| shards.contains(crate::domain::group_shard(&hook.group())))
            .collect();
        let helpers = async {
            crate::openai::start(started.clone(), config.models.clone())
                .map_err(ServeError::Models)?;
            if let Some(gateway) = &self.mcp {
                gateway
                    .start(started.clone())
                    .await
                    .map_err(ServeError::Mcp)?;
            }
            subscriptions.start_webhooks(&hooks).await?;
            Ok::<(), ServeError>(())
        };
        if let Err(e) = helpers.await {
            // No engine may run unseen: its timers would still fire.
            started.close().await;
            subscriptions.groups().closed().await;
            return Err(e);
        }
        let groups = subscriptions.groups();
        // On a shared store, calls reach the other servers' shards too.
        let shared = config.store_url.is_some().then(|| cluster.clone());
        let max_message = config.max_message_bytes;
        self.fill(Some(Services {
            runs: RunServiceServer::new(RunApi::serving(started.clone()))
                .max_decoding_message_size(max_message),
            approvals: ApprovalServiceServer::new(
                ApprovalApi::serving(started.clone()).in_cluster(shared.clone()),
            )
            .max_decoding_message_size(max_message),
            grants: GrantServiceServer::new(GrantApi::serving(started.clone()))
                .max_decoding_message_size(max_message),
            workers: WorkerServiceServer::new(WorkerApi {
                engine: started.clone(),
                cluster: shared,
            })
            .max_decoding_message_size(max_message),
            subscriptions: SubscriptionServiceServer::new(subscriptions)
                .max_decoding_message_size(max_message),
        }));
        *self.current.write().expect("poisoned") = Some(started.clone());
        *engine = Some((started, groups));
        cluster.serve(shards);
        tracing::info!("{} serves shards {shards:?}", cluster.server);
        Ok(())
    }

    fn fill(&self, services: Option<Services>) {
        fn put<S>(slot: &Slot<S>, service: Option<S>) {
            *slot.write().expect("poisoned") = service;
        }
        match services {
            Some(s) => {
                put(&self.runs, Some(s.runs));
                put(&self.approvals, Some(s.approvals));
                put(&self.grants, Some(s.grants));
                put(&self.workers, Some(s.workers));
                put(&self.subscriptions, Some(s.subscriptions));
            }
            None => {
                put(&self.runs, None);
                put(&self.approvals, None);
                put(&self.grants, None);
                put(&self.workers, None);
                put(&self.subscriptions, None);
            }
        }
    }
}

/// The services of one engine.
struct Services {
    runs: RunServiceServer<RunApi>,
    approvals: ApprovalServiceServer<ApprovalApi>,
    grants: GrantServiceServer<GrantApi>,
    workers: WorkerServiceServer<WorkerApi>,
    subscriptions: SubscriptionServiceServer<SubscriptionApi>,
}

/// The configured webhooks, their bodies linking to the web inbox.
fn webhooks(config: &Config, cluster: &Cluster) -> Vec<crate::subscriptions::WebhookConfig> {
    let base = public_url(config, cluster);
    config
        .webhooks
        .iter()
        .cloned()
        .map(|hook| crate::subscriptions::WebhookConfig {
            public_url: Some(base.clone()),
            ..hook
        })
        .collect()
}

/// The services' reads, answered from the database without an engine.
struct ReadServices {
    runs: RunServiceServer<RunApi>,
    approvals: ApprovalServiceServer<ApprovalApi>,
    grants: GrantServiceServer<GrantApi>,
}

impl ReadServices {
    fn new(config: &Config, reads: Reads) -> ReadServices {
        let runs = RunApi::reading(reads.clone());
        ReadServices {
            runs: RunServiceServer::new(runs).max_decoding_message_size(config.max_message_bytes),
            approvals: ApprovalServiceServer::new(ApprovalApi::reading(reads.clone()))
                .max_decoding_message_size(config.max_message_bytes),
            grants: GrantServiceServer::new(GrantApi::reading(reads, config.clock.clone()))
                .max_decoding_message_size(config.max_message_bytes),
        }
    }
}

/// With auth on, the servers of one database forward calls to each other
/// at their advertised addresses, with the caller's identity signed for one
/// use. A hop that can leave the machine must be private too: without
/// `[tls]`, a server that advertises anything but a loopback address
/// refuses to start.
fn check_forwarding_hop(config: &Config, listening: Option<SocketAddr>) -> Result<(), ServeError> {
    let auth_without_tls = config.auth.as_ref().is_some_and(|auth| auth.tls.is_none());
    if !auth_without_tls || config.store_url.is_none() {
        return Ok(());
    }
    let advertised = match (&config.advertise, listening) {
        (Some(address), _) => address.clone(),
        (None, Some(addr)) if addr.ip().is_unspecified() => return Ok(()),
        (None, Some(addr)) => addr.to_string(),
        (None, None) => return Ok(()),
    };
    let host = advertised
        .rsplit_once(':')
        .map_or(advertised.as_str(), |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    Err(ServeError::Config(format!(
        "with auth on, the servers of a database forward calls to each other at their \
         advertised address ({advertised}), carrying callers' identities: that hop must use \
         TLS. Add [tls] to the auth config (see docs/auth.md), or advertise a loopback \
         address (--advertise 127.0.0.1:PORT) for servers on one machine"
    )))
}

/// Makes this server a member of the store's deployment, under a name made
/// of its advertised address and process id.
async fn join(
    listener: &TcpListener,
    config: &Config,
    store: &SharedStore,
) -> Result<Arc<Cluster>, crate::store::StoreError> {
    let listening = listener.local_addr().ok();
    let address = match (&config.advertise, listening) {
        (Some(address), _) => address.clone(),
        (None, Some(addr)) if addr.ip().is_unspecified() => format!("127.0.0.1:{}", addr.port()),
        (None, Some(addr)) => addr.to_string(),
        (None, None) => "unknown".to_string(),
    };
    let server = format!("{address} pid {}", std::process::id());
    store
        .join(&server, &address, config.lease, config.spread_shards)
        .await?;
    // Servers with TLS reach each other with it, trusting what the
    // server's own certificate file holds (its chain up to the CA).
    let ca = config
        .auth
        .as_ref()
        .and_then(|auth| auth.tls.as_ref())
        .map(|tls| tls.cert_pem.as_slice());
    Ok(Cluster::new(
        store.clone(),
        server,
        address,
        ca,
        config.lease,
    ))
}

/// Refuses to start a server that would mix the two ways of sharing on
/// one database (see [`crate::cluster::balance::other_way`]). A server
/// that died counts until its membership lapses (one lease).
fn refuse_mixing(config: &Config, view: &ClusterView, server: &str) -> Result<(), ServeError> {
    let others = crate::cluster::balance::other_way(view, server, config.spread_shards);
    if others.is_empty() {
        return Ok(());
    }
    let others = others.join(", ");
    Err(ServeError::Config(match config.spread_shards {
        true => format!(
            "the servers on this database run with one owner ({others}): start this one with \
             --one-owner (or --standby) to join them, or stop them first to share the shards \
             out (a server that died counts until its lease lapses; see docs/cluster.md)"
        ),
        false => format!(
            "the servers on this database share the shards out ({others}): start this one \
             without --one-owner, --standby or --take-over to join them, or stop them first to \
             run with one owner (a server that died counts until its lease lapses; see \
             docs/cluster.md)"
        ),
    }))
}

/// Whether this server starts as a standby: told to, or, unless told to
/// take over, it finds another server's live claim on the runs. Joining a
/// cluster the plain way never takes the writes from a healthy owner; a
/// lone server restarting after a crash waits out its dead predecessor's
/// lease (at most one) and takes the runs.
fn stands_by(config: &Config, view: &ClusterView) -> bool {
    if config.standby {
        return true;
    }
    // Spreading, each claims only lapsed shards of its share.
    if config.take_over || config.spread_shards || config.store_url.is_none() {
        return false;
    }
    let live = view
        .shards
        .iter()
        .find(|shard| shard.lease_until_ms > view.now_ms);
    if let Some(shard) = live {
        tracing::info!(
            "{} holds the runs: standing by until its claim lapses \
             (--take-over takes them at once)",
            shard.owner
        );
    }
    live.is_some()
}

/// The first wait before an engine that failed to start is started again,
/// and the longest (it doubles in between).
const SERVE_RETRY_FIRST: Duration = Duration::from_millis(500);
const SERVE_RETRY_MOST: Duration = Duration::from_secs(30);

/// Claims the runs (a standby waits until the owner's lease lapses; with
/// `--spread-shards`, the server claims its share in the background, see
/// [`crate::cluster::balance`]), starts an engine on the shards it holds,
/// and from then on follows what it holds: when the shards change (some
/// are lost to another server's claim, given up or gained) the engine is
/// closed and another started on the new set, as a restart would. Calls
/// for runs of other shards are forwarded to their owner. A server fenced
/// out of every shard stands by again (the store claims them back once no
/// lease is live) and forwards every call meanwhile.
async fn own_runs(
    cluster: Arc<Cluster>,
    config: Config,
    stopping: CancellationToken,
    local: LocalServices,
) -> Result<(), ServeError> {
    let store = cluster.store().clone();
    let place = store_place(&config);
    // Only --take-over claims shards another server holds live.
    let claim = crate::store::Claim {
        lease: config.lease,
        standby: !config.take_over,
    };
    let mut held = match config.spread_shards {
        true => {
            tokio::spawn(crate::cluster::balance::keep_share(
                store.clone(),
                cluster.server.clone(),
                claim,
                stopping.clone(),
            ));
            store.held_shards()
        }
        false => store
            .claim_runs(&cluster.server, claim)
            .await
            .map_err(|source| ServeError::Store { place, source })?,
    };
    let shards = *held.borrow_and_update();
    // After a failed start (the database unreachable meanwhile, say), how
    // long until the next try: the shards stay held, and calls for them are
    // answered UNAVAILABLE until an engine serves them.
    let mut retry_in: Option<Duration> = None;
    if let Err(e) = local.serve(&cluster, &config, shards, &stopping).await {
        // A server that claims the runs as it starts fails before it says
        // it serves. A standby has served for a while (by forwarding) when
        // it takes over, maybe because the owner met the same trouble: it
        // keeps trying, as on any later change.
        if !config.standby {
            return Err(e);
        }
        retry_in = Some(retry_after(retry_in, shards, &e));
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = held.changed() => if changed.is_err() { return },
                () = stopping.cancelled() => return,
                () = tokio::time::sleep(retry_in.unwrap_or_default()), if retry_in.is_some() => {}
            }
            let shards = *held.borrow_and_update();
            if shards == cluster.serving() && retry_in.is_none() {
                continue;
            }
            match local.serve(&cluster, &config, shards, &stopping).await {
                Ok(()) => retry_in = None,
                Err(e) => retry_in = Some(retry_after(retry_in, shards, &e)),
            }
        }
    });
    Ok(())
}

/// The wait before the next try to serve `shards` after a failed one (the
/// last wait, if any, doubled up to a bound); says so in the log.
fn retry_after(last: Option<Duration>, shards: Shards, e: &ServeError) -> Duration {
    let next = last.map_or(SERVE_RETRY_FIRST, |d| (d * 2).min(SERVE_RETRY_MOST));
    tracing::error!("cannot serve shards {shards:?}: {e}; trying again in {next:?}");
    next
}

/// Sets the status of every aaa service and of the server as a whole ("").
async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health
        .set_service_status(<RunServiceServer<RunApi> as NamedService>::NAME, status)
        .await;
    health
        .set_service_status(
            <ApprovalServiceServer<ApprovalApi> as NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(<GrantServiceServer<GrantApi> as NamedService>::NAME, status)
        .await;
    health
        .set_service_status(
            <WorkerServiceServer<WorkerApi> as NamedService>::NAME,
            status,
        )
        .await;
    health
        .set_service_status(
            <SubscriptionServiceServer<SubscriptionApi> as NamedService>::NAME,
            status,
        )
        .await;
    health.set_service_status("", status).await;
}

/// NOT_SERVING while the store refuses writes (disk full, an I/O error),
/// SERVING again once it takes them; until shutdown.
async fn follow_store(
    mut writable: tokio::sync::watch::Receiver<bool>,
    health: HealthReporter,
    stopping: CancellationToken,
) {
    // A store may start refusing writes (an embedded store on a full disk).
    writable.mark_changed();
    loop {
        tokio::select! {
            changed = writable.changed() => if changed.is_err() { return },
            _ = stopping.cancelled() => return,
        }
        let status = if *writable.borrow_and_update() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if !stopping.is_cancelled() {
            set_health(&health, status).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Auth on without `[tls]`, on a database.
    fn with_auth(advertise: Option<&str>) -> Config {
        let text = format!(
            "[[principal]]\nname = \"a\"\nroles = [\"admin\"]\ntoken_sha256 = \"{}\"\n",
            "0".repeat(64)
        );
        let mut config = Config::new("");
        config.auth = Some(Arc::new(
            crate::auth::AuthConfig::parse(&text, std::path::Path::new(".")).expect("auth"),
        ));
        config.store_url = Some("postgres://x@127.0.0.1/x".into());
        config.advertise = advertise.map(String::from);
        config
    }

    #[test]
    fn only_a_loopback_hop_goes_without_tls_when_auth_is_on() {
        let any: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let lan: SocketAddr = "192.168.1.5:50051".parse().unwrap();
        for fine in [
            Some("127.0.0.1:7"),
            Some("localhost:7"),
            Some("[::1]:7"),
            None,
        ] {
            assert!(
                check_forwarding_hop(&with_auth(fine), Some(any)).is_ok(),
                "{fine:?}"
            );
        }
        for refused in [Some("10.1.2.3:7"), Some("aaa-1.internal:7")] {
            assert!(
                check_forwarding_hop(&with_auth(refused), Some(any)).is_err(),
                "{refused:?}"
            );
        }
        assert!(check_forwarding_hop(&with_auth(None), Some(lan)).is_err());
        let mut embedded = with_auth(Some("10.1.2.3:7"));
        embedded.store_url = None;
        assert!(check_forwarding_hop(&embedded, Some(lan)).is_ok());
        let mut open = with_auth(Some("10.1.2.3:7"));
        open.auth = None;
        assert!(check_forwarding_hop(&open, Some(lan)).is_ok());
    }
}
