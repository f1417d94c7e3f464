//! A worker's poll when the shards are spread: the server it reached waits
//! for a task of its own shards and, at the same time, for one another
//! owner offers (the owner's side is [`super::offers`]).
//!
//! Offers come over links: one per other owner and worker (its identity,
//! principal and what it serves), kept open across the worker's polls. A
//! link has up to [`LANES`] PeerPoll streams, each asking for one task at a
//! time, and as many rounds open as polls of its worker wait here. An owner
//! holds a task for a round without starting it and offers it; the link
//! hands the offer to one waiting poll, which accepts it (only then is the
//! attempt started, by its owner) or declines it (the owner puts the task
//! back). So a task is never started for a poll that does not deliver it,
//! whichever server it is on, and it costs a few messages on one stream
//! rather than a stream to every owner for every poll.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::{Cluster, Owner};
use crate::domain::event::WorkerId;
use crate::engine::{Engine, Poller, QueueKey};
use crate::proto::cluster_service_client::ClusterServiceClient;
use crate::proto::peer_poll_request::Step as Asked;
use crate::proto::peer_poll_response::Step as Answer;
use crate::proto::{PeerPollRequest, PeerPollResponse, PollTaskRequest, Task};

/// The method, as forwarded calls are signed for it.
pub const PEER_POLL: &str = "/aaa.v1.ClusterService/PeerPoll";
/// The longest one round lasts: a poll looks the owners up again after
/// it, so it reaches shards that moved while it waited.
const ROUND: Duration = Duration::from_secs(5);
/// How soon a link whose owner could not be asked asks again.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// How long a link's stream stays open with no poll of its worker waiting.
const IDLE: Duration = Duration::from_secs(10);
/// The most rounds one link has open at once.
const LANES: usize = 8;

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
    cluster: &Arc<Cluster>,
    poll: Poll<'_>,
) -> Result<Option<Task>, Status> {
    let until =
        crate::seconds::instant_after(Instant::now(), poll.wait.min(engine.poll_wait_cap()));
    loop {
        let round = until.saturating_duration_since(Instant::now()).min(ROUND);
        let owners = cluster.other_owners().await;
        let found = wait_round(engine, cluster, &owners, &poll, round).await?;
        if found.is_some() || Instant::now() >= until || engine.shutdown_token().is_cancelled() {
            return Ok(found);
        }
    }
}

/// One round of a poll: this server's wait, and the links to `owners`.
async fn wait_round(
    engine: &Engine,
    cluster: &Arc<Cluster>,
    owners: &[Owner],
    poll: &Poll<'_>,
    round: Duration,
) -> Result<Option<Task>, Status> {
    let (offer_to, mut offers) = mpsc::channel(LANES * owners.len().max(1));
    let waiting = cluster.links.join(cluster, owners, poll, offer_to);
    let stop_local = engine.shutdown_token().child_token();
    let local = engine.hold_task(Poller::Worker, poll.worker, poll.keys, round, &stop_local);
    tokio::pin!(local);
    let (held, offer) = tokio::select! {
        held = &mut local => (held, None),
        Some(offer) = offers.recv() => {
            // The local wait ends first: an attempt a commit started for
            // it meanwhile is kept, and the offer declined.
            stop_local.cancel();
            (local.await, Some(offer))
        }
    };
    // No more offers: those already made are declined as they drop.
    drop(waiting);
    drop(offers);
    match (held, offer) {
        (Some(held), _) => Ok(engine
            .start_held(held, poll.worker)
            .await?
            .map(crate::api::convert::task)),
        (None, Some(offer)) => Ok(offer.accept().await),
        (None, None) => Ok(None),
    }
}

/// An owner's offer, handed to one waiting poll: accepted, or declined
/// when dropped.
struct Offer {
    decision: Option<oneshot::Sender<Decision>>,
}

enum Decision {
    /// Where the started attempt goes (`None`: the call no longer wanted one).
    Accept(oneshot::Sender<Option<Task>>),
    Decline,
}

impl Offer {
    /// The started attempt; `None` if the call no longer wanted one, or the
    /// owner could not be heard (its attempt, if started, is lost when its
    /// lease lapses, as with a worker that died holding it). Dropped while
    /// waiting (the worker's poll went away), the link hands it back.
    async fn accept(mut self) -> Option<Task> {
        let (deliver, task) = oneshot::channel();
        let decision = self.decision.take()?;
        decision.send(Decision::Accept(deliver)).ok()?;
        task.await.ok().flatten()
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if let Some(decision) = self.decision.take() {
            let _ = decision.send(Decision::Decline);
        }
    }
}

/// The links of this server, by owner and worker.
#[derive(Default)]
pub struct Links {
    links: Mutex<HashMap<LinkKey, Arc<Link>>>,
    next_waiter: AtomicU64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct LinkKey {
    owner: String,
    signer: Option<String>,
    /// The worker's poll without its wait, encoded.
    poll: Vec<u8>,
}

impl Links {
    /// Puts the poll in the queue of each owner's link (started if new).
    fn join(
        &self,
        cluster: &Arc<Cluster>,
        owners: &[Owner],
        poll: &Poll<'_>,
        offer_to: mpsc::Sender<Offer>,
    ) -> Waiting {
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        let request = PollTaskRequest {
            wait_s: 0.0,
            ..poll.request.clone()
        };
        let encoded = request.encode_to_vec();
        let mut joined = Vec::with_capacity(owners.len());
        let mut links = self.links.lock().expect("poisoned");
        for owner in owners {
            let key = LinkKey {
                owner: owner.server.clone(),
                signer: poll.signer.clone(),
                poll: encoded.clone(),
            };
            let link = links
                .entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(Link {
                        key,
                        owner: owner.clone(),
                        request: request.clone(),
                        queue: Mutex::default(),
                        changed: Notify::new(),
                    })
                })
                .clone();
            if let Some(lane) = link.add(id, offer_to.clone()) {
                tokio::spawn(run_lane(link.clone(), lane, Arc::downgrade(cluster)));
            }
            joined.push(link);
        }
        Waiting { links: joined, id }
    }
}

/// A poll's place in the links' queues; it leaves them when dropped.
struct Waiting {
    links: Vec<Arc<Link>>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        for link in &self.links {
            link.leave(self.id);
        }
    }
}

/// The streams to one owner for one worker, and that worker's polls
/// waiting here.
struct Link {
    key: LinkKey,
    owner: Owner,
    request: PollTaskRequest,
    queue: Mutex<Queue>,
    /// A poll joined or left.
    changed: Notify,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    /// Lanes running, numbered 0.. (lane `n` keeps a round open while more
    /// than `n` polls wait).
    lanes: usize,
}

impl Queue {
    /// Polls that wait and have not been offered a task by this link: as
    /// many rounds are kept open.
    fn unoffered(&self) -> usize {
        self.waiting.iter().filter(|w| !w.offered).count()
    }
}

struct Waiter {
    id: u64,
    offer_to: mpsc::Sender<Offer>,
    /// Given an offer by this link already (it then leaves, or declined).
    offered: bool,
}

impl Link {
    /// Queues a poll; the number of a lane to start, if it needs one more.
    fn add(&self, id: u64, offer_to: mpsc::Sender<Offer>) -> Option<usize> {
        let mut queue = self.queue.lock().expect("poisoned");
        queue.waiting.push(Waiter {
            id,
            offer_to,
            offered: false,
        });
        self.changed.notify_waiters();
        let more = queue.unoffered() > queue.lanes && queue.lanes < LANES;
        more.then(|| {
            queue.lanes += 1;
            queue.lanes - 1
        })
    }

    fn leave(&self, id: u64) {
        let mut queue = self.queue.lock().expect("poisoned");
        queue.waiting.retain(|w| w.id != id);
        self.changed.notify_waiters();
    }

    fn waiting(&self) -> usize {
        self.queue.lock().expect("poisoned").unoffered()
    }

    /// Waits until more than `lane` polls wait; false after `within` without.
    async fn wait_for_polls(&self, lane: usize, within: Duration) -> bool {
        tokio::time::timeout(within, self.until(|waiting| waiting > lane))
            .await
            .is_ok()
    }

    /// Returns once no more than `lane` polls wait.
    async fn until_too_few(&self, lane: usize) {
        self.until(|waiting| waiting <= lane).await;
    }

    /// Returns once the number of polls waiting passes `check`.
    async fn until(&self, check: impl Fn(usize) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if check(self.waiting()) {
                return;
            }
            changed.await;
        }
    }

    /// Offers a held task to the waiting polls in turn, until one accepts:
    /// where to send the task then. `None` if none takes it.
    async fn hand_out(&self) -> Option<oneshot::Sender<Option<Task>>> {
        loop {
            let (decide, decision) = oneshot::channel();
            {
                let mut queue = self.queue.lock().expect("poisoned");
                let waiter = queue.waiting.iter_mut().find(|w| !w.offered)?;
                waiter.offered = true;
                // One poll fewer to keep rounds open for.
                self.changed.notify_waiters();
                // Refused (the poll took another task), the offer declines
                // as it drops.
                let offer = Offer {
                    decision: Some(decide),
                };
                let _ = waiter.offer_to.try_send(offer);
            }
            if let Ok(Decision::Accept(deliver)) = decision.await {
                return Some(deliver);
            }
        }
    }

    /// Ends `lane` if it is the last one and has not been needed: true
    /// then. The last lane of all removes the link.
    fn retire(&self, lane: usize, cluster: &Weak<Cluster>) -> bool {
        let cluster = cluster.upgrade();
        // The links' lock first, as `join` takes them.
        let mut links = cluster
            .as_ref()
            .map(|c| c.links.links.lock().expect("poisoned"));
        let mut queue = self.queue.lock().expect("poisoned");
        if queue.unoffered() > lane || queue.lanes != lane + 1 {
            return false;
        }
        queue.lanes -= 1;
        if queue.lanes == 0 {
            if let Some(links) = links.as_mut() {
                links.remove(&self.key);
            }
        }
        true
    }
}

/// One lane of a link: a stream to the owner, one round at a time while
/// more than `lane` polls wait, until it is not needed for [`IDLE`].
async fn run_lane(link: Arc<Link>, lane: usize, cluster: Weak<Cluster>) {
    let mut stream: Option<Stream> = None;
    loop {
        if !link.wait_for_polls(lane, IDLE).await {
            if link.retire(lane, &cluster) {
                return;
            }
            continue;
        }
        let open = match stream.as_mut() {
            Some(open) => open,
            None => {
                let Some(cluster) = cluster.upgrade() else {
                    return;
                };
                match Stream::open(&link, &cluster).await {
                    Ok(opened) => stream.insert(opened),
                    Err(e) => {
                        tracing::debug!("could not ask {} for tasks: {e}", link.owner.server);
                        tokio::time::sleep(RETRY_AFTER).await;
                        continue;
                    }
                }
            }
        };
        if let Err(e) = open.round(&link, lane).await {
            tracing::debug!("a stream asking {} for tasks ended: {e}", link.owner.server);
            stream = None;
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }
}

/// A PeerPoll stream to the owner.
struct Stream {
    requests: mpsc::Sender<PeerPollRequest>,
    answers: Streaming<PeerPollResponse>,
}

impl Stream {
    async fn open(link: &Link, cluster: &Cluster) -> Result<Stream, Status> {
        let (requests, outgoing) = mpsc::channel(4);
        let mut call = tonic::Request::new(ReceiverStream::new(outgoing));
        // A request stream: signed for the owner, once, over no body.
        *call.metadata_mut() = super::forward::signed_for(
            cluster,
            link.key.signer.clone(),
            PEER_POLL,
            &link.owner.address,
            &[],
        );
        let mut client = ClusterServiceClient::new(link.owner.channel.clone());
        let answers = client.peer_poll(call).await?.into_inner();
        Ok(Stream { requests, answers })
    }

    /// One round: ask for a task, and hand it to a waiting poll; withdraw
    /// when too few polls wait. An error ends the stream.
    async fn round(&mut self, link: &Link, lane: usize) -> Result<(), Status> {
        let poll = PollTaskRequest {
            wait_s: ROUND.as_secs_f64(),
            ..link.request.clone()
        };
        self.send(Asked::Poll(poll)).await?;
        let mut withdrawn = false;
        loop {
            let answer = tokio::select! {
                answer = self.answer() => answer?,
                () = link.until_too_few(lane), if !withdrawn => {
                    self.send(Asked::Withdraw(true)).await?;
                    withdrawn = true;
                    continue;
                }
            };
            match answer {
                Answer::Ended(_) => return Ok(()),
                // The withdraw, sent already, declines it; the end follows.
                Answer::Offered(_) if withdrawn => {}
                Answer::Offered(_) => match link.hand_out().await {
                    Some(deliver) => return self.accept(deliver).await,
                    None => {
                        self.send(Asked::Withdraw(true)).await?;
                        withdrawn = true;
                    }
                },
                Answer::Task(_) => return Err(Status::internal("a task that was not accepted")),
            }
        }
    }

    /// Accepts the offer and sends the task on to the poll that took it;
    /// hands it back to the owner if that poll went away meanwhile.
    async fn accept(&mut self, deliver: oneshot::Sender<Option<Task>>) -> Result<(), Status> {
        self.send(Asked::Accept(true)).await?;
        let task = match self.answer().await {
            Ok(Answer::Task(task)) => Some(task),
            Ok(Answer::Ended(_)) => None,
            Ok(Answer::Offered(_)) => return Err(Status::internal("an offer instead of the task")),
            Err(e) => {
                tracing::warn!("an owner's offered task was lost before it arrived: {e}");
                return Err(e);
            }
        };
        if let Err(Some(task)) = deliver.send(task) {
            tracing::debug!(run = %task.run_id, call = %task.call_id, "handing back to its owner an attempt whose poll went away");
            self.send(Asked::Returned(true)).await?;
        }
        Ok(())
    }

    async fn answer(&mut self) -> Result<Answer, Status> {
        match self.answers.message().await? {
            Some(PeerPollResponse { step: Some(step) }) => Ok(step),
            Some(_) => Err(Status::internal("an answer without its step")),
            None => Err(Status::unavailable("the owner ended the stream")),
        }
    }

    async fn send(&self, step: Asked) -> Result<(), Status> {
        let request = PeerPollRequest { step: Some(step) };
        self.requests
            .send(request)
            .await
            .map_err(|_| Status::cancelled("the stream to the owner closed"))
    }
}
