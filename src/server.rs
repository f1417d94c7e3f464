//! Wiring: open the store, start the engine, serve the api until shutdown.

use std::future::Future;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::api::{ApprovalApi, RunApi, WorkerApi};
use crate::config::Config;
use crate::engine::Engine;
use crate::proto::approval_service_server::ApprovalServiceServer;
use crate::proto::run_service_server::RunServiceServer;
use crate::proto::worker_service_server::WorkerServiceServer;
use crate::store::Store;

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the data directory: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("cannot recover runs: {0}")]
    Engine(#[from] crate::engine::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Serves aaa on `listener` until `shutdown` completes, then stops
/// gracefully: health turns NOT_SERVING, streams and long polls end,
/// in-flight calls get `config.shutdown_grace` to finish, and the store
/// commits what it has and closes.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let store = Store::open(&config.data_dir, config.store_cache_bytes)?;
    let stopping = CancellationToken::new();
    let grace = config.shutdown_grace;
    let engine = match Engine::start(store.clone(), config, stopping.clone()) {
        Ok(engine) => engine,
        Err(e) => {
            store.close().await;
            return Err(e.into());
        }
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RunServiceServer<RunApi>>().await;
    health
        .set_serving::<ApprovalServiceServer<ApprovalApi>>()
        .await;
    health.set_serving::<WorkerServiceServer<WorkerApi>>().await;
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

    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let signal = {
        let stopping = stopping.clone();
        let health = health.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            health.set_not_serving::<RunServiceServer<RunApi>>().await;
            health
                .set_not_serving::<ApprovalServiceServer<ApprovalApi>>()
                .await;
            health
                .set_not_serving::<WorkerServiceServer<WorkerApi>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            // Ends streams and long polls so the graceful stop is quick.
            stopping.cancel();
        }
    };
    let server = Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RunServiceServer::new(RunApi {
            engine: engine.clone(),
        }))
        .add_service(ApprovalServiceServer::new(ApprovalApi {
            engine: engine.clone(),
        }))
        .add_service(WorkerServiceServer::new(WorkerApi {
            engine: engine.clone(),
        }))
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
