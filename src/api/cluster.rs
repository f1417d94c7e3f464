//! ClusterService: the members of the deployment and who owns the runs,
//! read from the store by whichever server is asked; and the polls other
//! servers send on for their workers (see `cluster::peers`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::workers::{named, poll_of, worker_id};
use super::{convert, principal};
use crate::auth::forwarded::FromServer;
use crate::cluster::forward::Slot;
use crate::cluster::Cluster;
use crate::domain::{ClusterView, SHARDS};
use crate::engine::{Engine, Poller};
use crate::proto::cluster_service_server::ClusterService;
use crate::proto::{
    peer_poll_request, peer_poll_response, ClusterMember, GetClusterRequest, GetClusterResponse,
    PeerPollRequest, PeerPollResponse,
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

    /// Holds a task of this server's shards for another server's poll,
    /// offers it, and starts it only once accepted (see `cluster::peers`).
    async fn peer_poll(
        &self,
        request: Request<Streaming<PeerPollRequest>>,
    ) -> Result<Response<Self::PeerPollStream>, Status> {
        if request.extensions().get::<FromServer>().is_none() {
            return Err(Status::permission_denied(
                "PeerPoll is for the servers of a cluster; workers call PollTask",
            ));
        }
        let caller = principal(&request).cloned();
        let anonymous = worker_id(&request, "");
        let mut inbound = request.into_inner();
        let poll = match inbound.message().await? {
            Some(PeerPollRequest {
                step: Some(peer_poll_request::Step::Poll(poll)),
            }) => poll,
            _ => return Err(Status::invalid_argument("PeerPoll starts with the poll")),
        };
        let (keys, wait) = poll_of(&poll, caller.as_ref())?;
        let worker = named(anonymous, &poll.identity);
        let engine = self.engine.read().expect("poisoned").clone();
        let Some(engine) = engine else {
            return Err(crate::cluster::unavailable(
                "this server serves no shard now; ask again shortly",
                "",
            ));
        };
        engine.claim_identity(&worker).await?;
        let (answers, stream) = mpsc::channel(2);
        tokio::spawn(async move {
            // The asking server closes the stream when it needs no task.
            let cancel = engine.shutdown_token().child_token();
            let hold = engine.hold_task(Poller::Peer, &worker, &keys, wait, &cancel);
            tokio::pin!(hold);
            let held = tokio::select! {
                held = &mut hold => held,
                _ = inbound.message() => {
                    cancel.cancel();
                    hold.await
                }
            };
            let Some(held) = held else {
                return;
            };
            let offered = PeerPollResponse {
                step: Some(peer_poll_response::Step::Offered(true)),
            };
            if answers.send(Ok(offered)).await.is_err() {
                return;
            }
            let accepted = matches!(
                inbound.message().await,
                Ok(Some(PeerPollRequest {
                    step: Some(peer_poll_request::Step::Accept(true)),
                }))
            );
            if !accepted {
                return; // `held` drops: the task goes back to its queue.
            }
            let task = match engine.start_held(held, &worker).await {
                Ok(Some(task)) => task,
                Ok(None) => return,
                Err(e) => {
                    let _ = answers.send(Err(super::status::to_status(e))).await;
                    return;
                }
            };
            let answer = PeerPollResponse {
                step: Some(peer_poll_response::Step::Task(convert::task(task.clone()))),
            };
            tracing::debug!(run = %task.run, call = %task.call_id, attempt = task.attempt, "attempt sent to the server that asked");
            let _ = answers.send(Ok(answer)).await;
            // Only a return says the task was not delivered. A stream that
            // breaks says nothing: the attempt may have reached a worker,
            // so it is never handed out twice (its lease lapses instead).
            if let Ok(Some(PeerPollRequest {
                step: Some(peer_poll_request::Step::Returned(true)),
            })) = inbound.message().await
            {
                tracing::debug!(run = %task.run, call = %task.call_id, "handed back by the server that asked");
                engine.hand_back(task);
            }
        });
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
