//! The queue between a store's callers and its one committer, the same for
//! every backend: callers send a batch with a reply channel (or ask the
//! committer to close) and wait; the committer takes what waits as one
//! round (group commit).

use tokio::sync::{mpsc, oneshot};

use super::{Compacted, Result, StoreError, WriteBatch};

/// Batches waiting at once before a caller's send waits.
const CAPACITY: usize = 4096;

/// A batch to commit and where to answer.
pub(crate) struct Request {
    pub batch: WriteBatch,
    pub reply: oneshot::Sender<Result<Vec<u64>>>,
}

/// What a committer is asked to do.
pub(crate) enum Message {
    Commit(Request),
    /// Commit what is queued, then stop and say so.
    Close(oneshot::Sender<()>),
    /// Take one compaction step between rounds and say what it did (the
    /// embedded store's; see `Store::compact`).
    Compact(oneshot::Sender<Result<Compacted>>),
}

/// The callers' end. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Queue(mpsc::Sender<Message>);

impl Queue {
    /// A queue and the committer's end of it.
    pub fn new() -> (Queue, mpsc::Receiver<Message>) {
        let (sender, receiver) = mpsc::channel(CAPACITY);
        (Queue(sender), receiver)
    }

    /// Sends the batch and waits for the committer's answer.
    pub async fn commit(&self, batch: WriteBatch) -> Result<Vec<u64>> {
        let (reply, answer) = oneshot::channel();
        let request = Request { batch, reply };
        self.0
            .send(Message::Commit(request))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Asks the committer for one compaction step.
    pub async fn compact(&self) -> Result<Compacted> {
        let (reply, answer) = oneshot::channel();
        self.0
            .send(Message::Compact(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Lets the committer finish what it has, then stop; later commits fail
    /// with [`StoreError::Closed`].
    pub async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.0.send(Message::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
    }
}

/// Adds `first` and every message already waiting (up to `max` requests in
/// the round) to `round`, compaction requests to `compactions`; returns
/// the close request if one came.
pub(crate) fn gather(
    first: Message,
    messages: &mut mpsc::Receiver<Message>,
    round: &mut Vec<Request>,
    compactions: &mut Vec<oneshot::Sender<Result<Compacted>>>,
    max: usize,
) -> Option<oneshot::Sender<()>> {
    let mut message = first;
    loop {
        match message {
            Message::Commit(request) => round.push(request),
            Message::Close(done) => return Some(done),
            Message::Compact(reply) => compactions.push(reply),
        }
        if round.len() >= max {
            return None;
        }
        match messages.try_recv() {
            Ok(next) => message = next,
            Err(_) => return None,
        }
    }
}
