//! ClusterService: the members of the deployment and who owns the runs,
//! read from the store by whichever server is asked.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::cluster::Cluster;
use crate::domain::{ClusterView, SHARDS};
use crate::proto::cluster_service_server::ClusterService;
use crate::proto::{ClusterMember, GetClusterRequest, GetClusterResponse};

pub struct ClusterApi {
    pub cluster: Arc<Cluster>,
    /// "embedded" or "postgres".
    pub store: &'static str,
}

#[tonic::async_trait]
impl ClusterService for ClusterApi {
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
            }
        })
        .collect();
    let owned = view.shards.iter().filter(live).count();
    GetClusterResponse {
        this_server: cluster.server.clone(),
        store: store.to_string(),
        members,
        shards: SHARDS as u32,
        unowned_shards: (SHARDS - owned) as u32,
    }
}
