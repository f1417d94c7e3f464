//! Wiring: open the store, start the engine, serve the api until shutdown.

use std::future::Future;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::api::{malformed, ApprovalApi, RunApi, SubscriptionApi, WorkerApi};
use crate::auth::AuthLayer;
use crate::config::Config;
use crate::connections;
use crate::engine::Engine;
use crate::proto::approval_service_server::ApprovalServiceServer;
use crate::proto::run_service_server::RunServiceServer;
use crate::proto::subscription_service_server::SubscriptionServiceServer;
use crate::proto::worker_service_server::WorkerServiceServer;
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
    #[error("cannot start webhooks: {0}")]
    Webhooks(#[from] crate::subscriptions::Error),
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
pub async fn serve(
    listener: TcpListener,
    config: Config,
    ready: impl FnOnce() + Send,
    shutdown: impl Future<Output = ()> + Send + 'static,
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
    // In front of every service: authentication and roles, and the one
    // answer to requests that do not decode.
    let mut builder = builder
        .layer(tower::util::option_layer(
            config.auth.clone().map(AuthLayer::new),
        ))
        .layer(malformed::layer());
    let separation_of_duties = config
        .auth
        .as_ref()
        .is_some_and(|auth| auth.separation_of_duties);
    let max_message = config.max_message_bytes;
    match &config.auth {
        Some(auth) => tracing::info!("callers must authenticate: {auth:?}"),
        None => tracing::warn!("no auth config: every caller may call every RPC"),
    }

    let webhooks = config.webhooks.clone();
    let store = crate::store::open(&config)
        .await
        .map_err(|source| ServeError::Store {
            place: store_place(&config),
            source,
        })?;
    // This server writes every run from now on; on a shared database a
    // server that wrote them before is fenced out.
    let name = match listener.local_addr() {
        Ok(addr) => format!("aaa pid {} on {addr}", std::process::id()),
        Err(_) => format!("aaa pid {}", std::process::id()),
    };
    let claim = crate::store::Claim {
        lease: config.lease,
        standby: config.standby,
    };
    // A standby may wait here a long time: a stop signal ends the wait.
    let mut shutdown = Box::pin(shutdown);
    let claimed = tokio::select! {
        claimed = store.claim_runs(&name, claim) => claimed,
        () = &mut shutdown => {
            store.close().await;
            return Ok(());
        }
    };
    if let Err(source) = claimed {
        store.close().await;
        return Err(ServeError::Store {
            place: store_place(&config),
            source,
        });
    }
    let stopping = CancellationToken::new();
    let grace = config.shutdown_grace;
    let engine = match Engine::start(store.clone(), config, stopping.clone()).await {
        Ok(engine) => engine,
        Err(e) => {
            store.close().await;
            return Err(e.into());
        }
    };
    let subscriptions = SubscriptionApi::new(&engine);
    if let Err(e) = subscriptions.start_webhooks(&webhooks).await {
        stopping.cancel();
        drop((engine, subscriptions));
        store.close().await;
        return Err(e.into());
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
    let server = builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            RunServiceServer::new(RunApi {
                engine: engine.clone(),
                separation_of_duties,
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            ApprovalServiceServer::new(ApprovalApi {
                engine: engine.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            WorkerServiceServer::new(WorkerApi {
                engine: engine.clone(),
            })
            .max_decoding_message_size(max_message),
        )
        .add_service(
            SubscriptionServiceServer::new(subscriptions).max_decoding_message_size(max_message),
        )
        .serve_with_incoming_shutdown(incoming, signal);
    tokio::pin!(server);
    let served = tokio::select! {
        served = &mut server => served,
        _ = async { stopping.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!("calls still running after the {grace:?} grace period are dropped");
            Ok(())
        }
    };
    stopping.cancel();
    drop(engine);
    store.close().await;
    served?;
    Ok(())
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
