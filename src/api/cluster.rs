//! ClusterService: the members of the deployment and who owns the runs,
//! read from the store by whichever server is asked; and the polls other
//! servers send on for their workers (see `cluster::peers`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::principal;
use super::workers::worker_id;
use crate::auth::forwarded::FromServer;
use crate::cluster::forward::Slot;
use crate::cluster::offers::Rounds;
use crate::cluster::Cluster;
use crate::domain::{ClusterView, SHARDS};
use crate::engine::Engine;
use crate::proto::cluster_service_server::ClusterService;
use crate::proto::{
    ClusterMember, GetClusterRequest, GetClusterResponse, PeerPollRequest, PeerPollResponse,
};

pub struct ClusterApi {
    pub cluster: Arc<Cluster>,
    /// "embedded" or "postgres".
    pub store: &'static str,
    /// This server's engine, while it serves shards.
    pub engine: Slot<Engine>,
}

#[tonic::async_trait]
impl ClusterService for ClusterApi {
    type PeerPollStream = ReceiverStream<Result<PeerPollResponse, Status>>;

    /// Rounds of holding a task of this server's shards for another
    /// server's worker, offering it, and starting it only once accepted
    /// (see `cluster::offers`).
    async fn peer_poll(
        &self,
        request: Request<Streaming<PeerPollRequest>>,
    ) -> Result<Response<Self::PeerPollStream>, Status> {
        if request.extensions().get::<FromServer>().is_none() {
            return Err(Status::permission_denied(
                "PeerPoll is for the servers of a cluster; workers call PollTask",
            ));
        }
        let (answers, stream) = mpsc::channel(2);
        let rounds = Rounds {
            caller: principal(&request).cloned(),
            anonymous: worker_id(&request, ""),
            inbound: request.into_inner(),
            answers,
            engine: self.engine.clone(),
        };
        tokio::spawn(rounds.serve());
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn get_cluster(
        &self,
        _request: Request<GetClusterRequest>,
    ) -> Result<Response<GetClusterResponse>, Status> {
        let view = self
            .cluster
            .store()
            .cluster()
            .await
            .map_err(|e| super::status::to_status(e.into()))?;
        Ok(Response::new(answer(&self.cluster, self.store, &view)))
    }
}

fn answer(cluster: &Cluster, store: &str, view: &ClusterView) -> GetClusterResponse {
    let now = view.now_ms;
    if view.members.is_empty() {
        // The embedded store: this server is the deployment.
        return GetClusterResponse {
            this_server: cluster.server.clone(),
            store: store.to_string(),
            members: vec![ClusterMember {
                server: cluster.server.clone(),
                address: cluster.address.clone(),
                alive: true,
                shards: SHARDS as u32,
                ..Default::default()
            }],
            shards: SHARDS as u32,
            unowned_shards: 0,
            shard_owners: vec![cluster.address.clone(); SHARDS],
        };
    }
    let live = |lease: &&crate::domain::ShardLease| lease.lease_until_ms > now;
    let members = view
        .members
        .iter()
        .map(|member| {
            let held: Vec<_> = view
                .shards
                .iter()
                .filter(live)
                .filter(|lease| lease.owner == member.server)
                .collect();
            ClusterMember {
                server: member.server.clone(),
                address: member.address.clone(),
                alive: member.seen_until_ms > now,
                shards: held.len() as u32,
                epoch: held.iter().map(|l| l.epoch).max().unwrap_or(0),
                lease_left_ms: held
                    .iter()
                    .map(|l| l.lease_until_ms - now)
                    .min()
                    .unwrap_or(0),
                gone_for_ms: (now - member.seen_until_ms).max(0),
                up_ms: (now - member.started_ms).max(0),
                spreads: member.spreads,
            }
        })
        .collect();
    let shard_owners: Vec<String> = (0..SHARDS)
        .map(|shard| {
            view.owner_of(shard as u8)
                .map_or_else(String::new, |owner| owner.address.clone())
        })
        .collect();
    let owned = shard_owners.iter().filter(|a| !a.is_empty()).count();
    GetClusterResponse {
        this_server: cluster.server.clone(),
        store: store.to_string(),
        members,
        shards: SHARDS as u32,
        unowned_shards: (SHARDS - owned) as u32,
        shard_owners,
    }
}
