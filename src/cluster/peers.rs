//! A worker's poll when the shards are spread: the server it reached
//! waits for a task of its own shards and, at the same time, asks every
//! other owner for one of theirs (`ClusterService.PeerPoll`). An owner
//! holds a task for such a poll without starting it, and offers it; the
//! asking server keeps the first task it gets, accepts that offer alone
//! (only then is the attempt started, by its owner), and closes the other
//! polls, whose owners put their held tasks back. So a task is never
//! started for a poll that does not deliver it, whichever server it is on.

use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::{Cluster, Owner};
use crate::engine::event::WorkerId;
use crate::engine::{Engine, Poller, QueueKey};
use crate::proto::cluster_service_client::ClusterServiceClient;
use crate::proto::{
    peer_poll_request, peer_poll_response, PeerPollRequest, PeerPollResponse, PollTaskRequest, Task,
};

/// The method, as forwarded calls are signed for it.
pub const PEER_POLL: &str = "/aaa.v1.ClusterService/PeerPoll";
/// The longest one round of asking lasts: the owners are looked up again
/// after it, so a poll reaches shards that moved while it waited.
const ROUND: Duration = Duration::from_secs(5);
/// How soon an owner that could not be asked is asked again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// A worker's poll, checked.
pub struct Poll<'a> {
    pub worker: &'a WorkerId,
    pub keys: &'a [QueueKey],
    pub wait: Duration,
    /// The poll as it came, sent on to the other owners.
    pub request: PollTaskRequest,
    /// Who the other owners are told the caller is (see `forward::caller`).
    pub signer: Option<String>,
}

/// A task for the poll, from this server's shards or another owner's, or
/// `None` when the wait ends with nothing.
pub async fn poll(
    engine: &Engine,
    cluster: &Cluster,
    poll: Poll<'_>,
) -> Result<Option<Task>, Status> {
    let until =
        crate::seconds::instant_after(Instant::now(), poll.wait.min(engine.poll_wait_cap()));
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let round = left.min(ROUND);
        let owners = cluster.other_owners().await;
        let mut offers: FuturesUnordered<_> = owners
            .into_iter()
            .map(|owner| offer_from(cluster, owner, &poll, round))
            .collect();
        let stop_local = engine.shutdown_token().child_token();
        let local = engine.hold_task(Poller::Worker, poll.worker, poll.keys, round, &stop_local);
        tokio::pin!(local);
        let mut local_done = false;
        let found = loop {
            let next = tokio::select! {
                held = &mut local, if !local_done => Next::Local(held),
                offer = offers.next(), if !offers.is_empty() => match offer {
                    Some(Some(offer)) if local_done => Next::Offer(offer),
                    // The local wait ends first: an attempt a commit
                    // started for it meanwhile is kept, and the offer
                    // dropped (its owner puts the task back).
                    Some(Some(offer)) => {
                        stop_local.cancel();
                        match local.as_mut().await {
                            Some(held) => Next::Local(Some(held)),
                            None => Next::Offer(offer),
                        }
                    }
                    _ => continue,
                },
                else => break None,
            };
            match next {
                // Closing the other owners' polls puts their tasks back.
                Next::Local(Some(held)) => {
                    drop(offers);
                    break engine
                        .start_held(held, poll.worker)
                        .await?
                        .map(crate::api::convert::task);
                }
                Next::Offer(offer) => {
                    drop(offers);
                    break offer.accept().await;
                }
                // The engine closed (the server stops, or its shards
                // change): the worker polls again, maybe elsewhere.
                Next::Local(None) if engine.shutdown_token().is_cancelled() => break None,
                Next::Local(None) => local_done = true,
            }
        };
        if found.is_some() || Instant::now() >= until || engine.shutdown_token().is_cancelled() {
            return Ok(found);
        }
    }
}

/// What a round of a poll found first.
enum Next {
    /// This server's wait ended: with a task, or with none.
    Local(Option<crate::engine::Held>),
    /// Another owner holds a task for the poll.
    Offer(Offer),
}

/// An owner's offer: its stream, held open until accepted or dropped.
struct Offer {
    requests: mpsc::Sender<PeerPollRequest>,
    answers: Streaming<PeerPollResponse>,
    /// Accepted, and the task not yet here: dropped now (the worker's poll
    /// went away), the offer hands the task back (see `Drop`).
    awaiting_task: bool,
}

impl Offer {
    /// The started attempt; `None` if the call no longer wanted one, or the
    /// owner could not be heard (its attempt, if started, is lost when its
    /// lease lapses, as with a worker that died holding it).
    async fn accept(mut self) -> Option<Task> {
        let accept = PeerPollRequest {
            step: Some(peer_poll_request::Step::Accept(true)),
        };
        self.requests.send(accept).await.ok()?;
        self.awaiting_task = true;
        let answer = self.answers.message().await;
        self.awaiting_task = false;
        match answer {
            Ok(Some(PeerPollResponse {
                step: Some(peer_poll_response::Step::Task(task)),
            })) => Some(task),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("an owner's offered task was lost before it arrived: {e}");
                None
            }
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if self.awaiting_task {
            // Sent before the stream closes, so the owner reads it after
            // sending the task, and offers the attempt to the next poll.
            let returned = PeerPollRequest {
                step: Some(peer_poll_request::Step::Returned(true)),
            };
            let _ = self.requests.try_send(returned);
        }
    }
}

/// Asks `owner` for a task within `wait`; `None` if it has none then. An
/// owner that cannot be asked is asked again until the wait ends.
async fn offer_from(
    cluster: &Cluster,
    owner: Owner,
    poll: &Poll<'_>,
    wait: Duration,
) -> Option<Offer> {
    let until = crate::seconds::instant_after(Instant::now(), wait);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match ask(cluster, &owner, poll, left).await {
            Ok(offer) => return offer,
            Err(e) => {
                tracing::debug!("could not ask {} for a task: {e}", owner.server);
                if left < RETRY_AFTER {
                    return None;
                }
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

async fn ask(
    cluster: &Cluster,
    owner: &Owner,
    poll: &Poll<'_>,
    wait: Duration,
) -> Result<Option<Offer>, Status> {
    // Room for every request a PeerPoll sends: poll, accept, returned.
    let (sender, receiver) = mpsc::channel(3);
    let request = PollTaskRequest {
        wait_s: wait.as_secs_f64().max(0.001),
        ..poll.request.clone()
    };
    let first = PeerPollRequest {
        step: Some(peer_poll_request::Step::Poll(request)),
    };
    sender
        .send(first)
        .await
        .map_err(|_| Status::internal("the poll could not be sent"))?;
    let mut call = tonic::Request::new(ReceiverStream::new(receiver));
    *call.metadata_mut() = super::forward::signed_for(cluster, poll.signer.clone(), PEER_POLL);
    let mut client = ClusterServiceClient::new(owner.channel.clone());
    let mut answers = client.peer_poll(call).await?.into_inner();
    match answers.message().await? {
        Some(PeerPollResponse {
            step: Some(peer_poll_response::Step::Offered(true)),
        }) => Ok(Some(Offer {
            requests: sender,
            answers,
            awaiting_task: false,
        })),
        _ => Ok(None),
    }
}
