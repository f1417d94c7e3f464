//! The owner's side of PeerPoll (the asking side is [`super::peers`]): the
//! rounds of one stream from another server, for one of its workers. Each
//! round holds a task of this server's shards without starting it, offers
//! it, and starts the attempt only when the asking server accepts it; a
//! withdraw, or the stream's end, before that puts the task back.

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::forward::Slot;
use crate::api::convert;
use crate::api::workers::{named, poll_of};
use crate::auth::Principal;
use crate::domain::event::WorkerId;
use crate::engine::{Engine, Poller, QueueKey};
use crate::proto::peer_poll_request::Step as Asked;
use crate::proto::peer_poll_response::Step as Answer;
use crate::proto::{PeerPollRequest, PeerPollResponse, PollTaskRequest};

/// One PeerPoll stream, as the owner serves it.
pub struct Rounds {
    pub inbound: Streaming<PeerPollRequest>,
    pub answers: mpsc::Sender<Result<PeerPollResponse, Status>>,
    /// This server's engine, read again for every round (shards move).
    pub engine: Slot<Engine>,
    /// The worker's principal, and the worker as the stream's caller.
    pub caller: Option<Principal>,
    pub anonymous: WorkerId,
}

/// What a round's hold came to.
enum Holding {
    Task(Box<crate::engine::Held>),
    /// The wait ended, the engine closed, or the round was withdrawn.
    Nothing,
    /// The asking server closed the stream.
    StreamEnded,
}

/// How a round ended.
enum Then {
    /// The next round may follow; with the request already read, if any.
    Next(Option<Asked>),
    /// The stream is over: the asking server closed it, or the engine
    /// closed (the asking server opens another, maybe to a new owner).
    Close,
}

impl Rounds {
    /// Serves rounds until the stream ends; a bad request ends it with its error.
    pub async fn serve(mut self) {
        if let Err(status) = self.rounds().await {
            let _ = self.answers.send(Err(status)).await;
        }
    }

    async fn rounds(&mut self) -> Result<(), Status> {
        let mut read_ahead = None;
        // The engine of the last round: when it closes, so does the stream.
        let mut last: Option<Engine> = None;
        loop {
            let asked = match read_ahead.take() {
                Some(asked) => Some(asked),
                None => self.next_between_rounds(last.as_ref()).await?,
            };
            let poll = match asked {
                None => return Ok(()),
                Some(Asked::Poll(poll)) => poll,
                // A withdraw that crossed the end of its round.
                Some(Asked::Withdraw(_)) => continue,
                Some(_) => {
                    return Err(Status::invalid_argument(
                        "PeerPoll: a round starts with its poll",
                    ))
                }
            };
            let engine = self.engine.read().expect("poisoned").clone();
            let Some(engine) = engine else {
                return Err(super::unavailable(
                    "this server serves no shard now; ask again shortly",
                    "",
                ));
            };
            match self.round(&engine, poll).await? {
                Then::Next(asked) => read_ahead = asked,
                Then::Close => return Ok(()),
            }
            last = Some(engine);
        }
    }

    /// One round: hold, offer, and start the task if accepted.
    async fn round(&mut self, engine: &Engine, poll: PollTaskRequest) -> Result<Then, Status> {
        let (keys, wait) = poll_of(&poll, self.caller.as_ref())?;
        let worker = named(self.anonymous.clone(), &poll.identity);
        engine.claim_identity(&worker).await?;
        let held = match self.hold(engine, &worker, &keys, wait).await? {
            Holding::Task(held) => *held,
            Holding::Nothing if engine.shutdown_token().is_cancelled() => return Ok(Then::Close),
            Holding::Nothing => {
                self.send(Answer::Ended(true)).await?;
                return Ok(Then::Next(None));
            }
            Holding::StreamEnded => return Ok(Then::Close),
        };
        self.send(Answer::Offered(true)).await?;
        match self.next().await? {
            Some(Asked::Accept(true)) => {}
            // Declined: `held` drops, and the task goes back to its queue.
            Some(Asked::Withdraw(_)) => {
                self.send(Answer::Ended(true)).await?;
                return Ok(Then::Next(None));
            }
            None => return Ok(Then::Close),
            Some(_) => {
                return Err(Status::invalid_argument(
                    "PeerPoll: an offer is answered with accept or withdraw",
                ))
            }
        }
        let Some(task) = engine.start_held(held, &worker).await? else {
            // The call no longer wanted an attempt.
            self.send(Answer::Ended(true)).await?;
            return Ok(Then::Next(None));
        };
        tracing::debug!(run = %task.run, call = %task.call_id, attempt = task.attempt, "attempt sent to the server that asked");
        self.send(Answer::Task(convert::task(task.clone()))).await?;
        // Only a return says the task was not delivered; it comes before
        // the next round's poll. A stream that breaks says nothing: the
        // attempt may have reached a worker, so it is never handed out
        // twice (its lease lapses instead).
        match self.next_between_rounds(Some(engine)).await {
            Ok(Some(Asked::Returned(true))) => {
                tracing::debug!(run = %task.run, call = %task.call_id, "handed back by the server that asked");
                engine.hand_back(task);
                Ok(Then::Next(None))
            }
            Ok(None) | Err(_) => Ok(Then::Close),
            Ok(asked) => Ok(Then::Next(asked)),
        }
    }

    /// Holds a task for the round until it comes, the wait ends (or the
    /// engine closes), or the asking server withdraws.
    async fn hold(
        &mut self,
        engine: &Engine,
        worker: &WorkerId,
        keys: &[QueueKey],
        wait: std::time::Duration,
    ) -> Result<Holding, Status> {
        let cancel = engine.shutdown_token().child_token();
        let hold = engine.hold_task(Poller::Peer, worker, keys, wait, &cancel);
        tokio::pin!(hold);
        let asked = tokio::select! {
            held = &mut hold => return Ok(held.map_or(Holding::Nothing, |held| Holding::Task(Box::new(held)))),
            asked = self.next() => asked,
        };
        // A task held meanwhile drops here: back to its queue.
        cancel.cancel();
        drop(hold.await);
        match asked? {
            Some(Asked::Withdraw(_)) => Ok(Holding::Nothing),
            None => Ok(Holding::StreamEnded),
            Some(_) => Err(Status::invalid_argument(
                "PeerPoll: a held round is only withdrawn",
            )),
        }
    }

    /// The next request, waiting no longer than `engine` is open.
    async fn next_between_rounds(
        &mut self,
        engine: Option<&Engine>,
    ) -> Result<Option<Asked>, Status> {
        let Some(engine) = engine else {
            return self.next().await;
        };
        tokio::select! {
            asked = self.next() => asked,
            () = engine.shutdown_token().cancelled() => Ok(None),
        }
    }

    async fn next(&mut self) -> Result<Option<Asked>, Status> {
        match self.inbound.message().await? {
            None => Ok(None),
            Some(PeerPollRequest { step: Some(step) }) => Ok(Some(step)),
            Some(_) => Err(Status::invalid_argument(
                "PeerPoll: a request without its step",
            )),
        }
    }

    async fn send(&self, answer: Answer) -> Result<(), Status> {
        let answer = PeerPollResponse { step: Some(answer) };
        self.answers
            .send(Ok(answer))
            .await
            .map_err(|_| Status::cancelled("the asking server went away"))
    }
}
