//! Task queues: calls ready for a worker, by tool or model name, and the
//! long polls waiting for them. In memory only: what is queued can always be
//! derived again from the runs' state (see `Engine::recover`).
//!
//! A call usually reaches a poll as a `TaskRef` the engine then starts. When
//! a poll is already waiting as the call becomes ready, the engine reserves
//! that poll and starts the attempt in the same commit (one fsync fewer on
//! the approval path), then delivers the started attempt.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::state::Action;
use super::Task;
use crate::domain::event::WorkerId;
use crate::store::RunId;

/// What a queue serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum QueueKey {
    Tool(String),
    Model(String),
    /// Model calls of the server's built-in model; no worker polls these.
    BuiltinModel,
}

/// A call a worker may take. Taking it does not start it: the engine checks
/// the run's state first, so a stale or duplicate entry is harmless.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRef {
    pub run: RunId,
    pub call_id: String,
    pub key: QueueKey,
    /// The attempt of this call that was started for a poll and never
    /// handed over (its task was made, and given back unread): the next
    /// poll gets that attempt as it is. Set only where that task is in
    /// hand, never on a guess: a call whose start failed or was cut off
    /// goes back without it, so an attempt that did start meanwhile (its
    /// commit landed unanswered) waits for its lease instead, and an entry
    /// left over from before never hands out an attempt that another entry
    /// started and delivered.
    pub undelivered: Option<u32>,
}

/// What a poll receives: a call to start, or an attempt already started for
/// it.
pub struct Delivery {
    pub task: TaskRef,
    pub started: Option<Task>,
}

impl Delivery {
    /// The call to offer again when this delivery cannot be handed over. A
    /// started attempt goes out again as it is (see `TaskRef::undelivered`).
    pub(super) fn into_offer(self) -> TaskRef {
        let mut task = self.task;
        if let Some(started) = &self.started {
            task.undelivered = Some(started.attempt);
        }
        task
    }
}

/// A waiting poll set aside for an attempt being committed. Dropped
/// undelivered (the commit failed), the poll ends empty.
pub struct Reservation {
    sender: oneshot::Sender<Delivery>,
    pub worker: WorkerId,
}

impl Reservation {
    /// Hands the started attempt over, or queues the call again if the poll
    /// has gone away meanwhile.
    pub fn deliver(self, dispatcher: &Dispatcher, task: TaskRef, started: Task) {
        let delivery = Delivery {
            task,
            started: Some(started),
        };
        if let Err(returned) = self.sender.send(delivery) {
            tracing::debug!(run = %returned.task.run, call = %returned.task.call_id, "its poll went away: the started attempt is offered again");
            dispatcher.offer(returned.into_offer());
        }
    }
}

impl TaskRef {
    /// The call a dispatch action offers; None for other actions.
    pub fn for_action(run: RunId, action: Action) -> Option<TaskRef> {
        let (call_id, key) = match action {
            Action::DispatchTool { call_id, tool } => (call_id, QueueKey::Tool(tool)),
            Action::DispatchModel { call_id, model } => (call_id, QueueKey::Model(model)),
            Action::DispatchBuiltinModel { call_id } => (call_id, QueueKey::BuiltinModel),
            _ => return None,
        };
        Some(TaskRef {
            run,
            call_id,
            key,
            undelivered: None,
        })
    }
}

#[derive(Default)]
pub struct Dispatcher {
    queues: Mutex<HashMap<QueueKey, Queue>>,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<TaskRef>,
    waiters: VecDeque<Arc<Waiter>>,
}

/// Who waits in a poll, which decides what it may be handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poller {
    /// A worker's own poll: a commit may start an attempt for it (see
    /// [`Dispatcher::reserve`]), which it then must deliver.
    Worker,
    /// Another server's poll (`cluster::peers`): it only holds a call, not
    /// yet started, until that server accepts it. A started attempt it
    /// could not deliver would go back to a queue that may close unread
    /// (the shards move), and be lost when its lease lapsed.
    Peer,
}

/// One long poll, registered on every queue it serves; the first offer wins.
struct Waiter {
    slot: Mutex<Option<oneshot::Sender<Delivery>>>,
    /// The polling worker, for attempts started on its behalf.
    worker: WorkerId,
    poller: Poller,
}

impl Waiter {
    fn is_gone(&self) -> bool {
        self.slot.lock().expect("poisoned").is_none()
    }
}

impl Dispatcher {
    /// Sets the queue gauges: polls waiting and calls ready, by queue.
    pub fn observe(&self, families: &crate::metrics::Families) {
        families.poll_waiters.clear();
        families.ready_tasks.clear();
        let queues = self.queues.lock().expect("poisoned");
        for (key, queue) in queues.iter() {
            let (kind, name) = match key {
                QueueKey::Tool(name) => ("tool", families.tools.label(name)),
                QueueKey::Model(name) => ("model", families.models.label(name)),
                QueueKey::BuiltinModel => ("model", "builtin".to_string()),
            };
            let label = crate::metrics::QueueLabel { kind, name };
            let waiting = queue.waiters.iter().filter(|w| !w.is_gone()).count();
            families
                .poll_waiters
                .get_or_create(&label)
                .inc_by(waiting as i64);
            families
                .ready_tasks
                .get_or_create(&label)
                .inc_by(queue.ready.len() as i64);
        }
    }

    /// Hands the task to a waiting poll, or queues it.
    pub fn offer(&self, task: TaskRef) {
        let mut queues = self.queues.lock().expect("poisoned");
        let queue = queues.entry(task.key.clone()).or_default();
        let mut delivery = Delivery {
            task,
            started: None,
        };
        while let Some(waiter) = queue.waiters.pop_front() {
            let sender = waiter.slot.lock().expect("poisoned").take();
            if let Some(sender) = sender {
                match sender.send(delivery) {
                    Ok(()) => return,
                    Err(returned) => delivery = returned,
                }
            }
        }
        queue.ready.push_back(delivery.task);
    }

    /// Sets aside a worker's poll waiting on `key`, if there is one.
    pub fn reserve(&self, key: &QueueKey) -> Option<Reservation> {
        let mut queues = self.queues.lock().expect("poisoned");
        let queue = queues.get_mut(key)?;
        loop {
            let at = queue
                .waiters
                .iter()
                .position(|w| w.poller == Poller::Worker && !w.is_gone())?;
            let waiter = queue.waiters.remove(at).expect("found above");
            let sender = waiter.slot.lock().expect("poisoned").take();
            if let Some(sender) = sender.filter(|s| !s.is_closed()) {
                return Some(Reservation {
                    sender,
                    worker: waiter.worker.clone(),
                });
            }
        }
    }

    /// Takes a task from any of `keys` for `worker`, in a poll of
    /// `poller`, waiting up to `wait`. None when the wait ends (or `cancel`
    /// fires) with nothing to do.
    pub async fn take(
        &self,
        poller: Poller,
        keys: &[QueueKey],
        worker: &WorkerId,
        wait: Duration,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Option<Delivery> {
        let (sender, receiver) = oneshot::channel();
        let waiter = Arc::new(Waiter {
            slot: Mutex::new(Some(sender)),
            worker: worker.clone(),
            poller,
        });
        {
            let mut queues = self.queues.lock().expect("poisoned");
            for key in keys {
                if let Some(task) = queues.get_mut(key).and_then(|q| q.ready.pop_front()) {
                    return Some(Delivery {
                        task,
                        started: None,
                    });
                }
            }
            for key in keys {
                let queue = queues.entry(key.clone()).or_default();
                queue.waiters.retain(|w| !w.is_gone());
                queue.waiters.push_back(waiter.clone());
            }
        }
        let mut pending = PendingTake {
            dispatcher: self,
            waiter,
            receiver: Some(receiver),
        };
        let receiver = pending.receiver.as_mut().expect("set above");
        tokio::select! {
            task = receiver => return task.ok(),
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => {}
        }
        pending.end().await
    }
}

/// A registered wait. Withdrawing (or dropping it, when the poll's caller
/// goes away) makes sure a task handed over at the last moment is not lost.
struct PendingTake<'a> {
    dispatcher: &'a Dispatcher,
    waiter: Arc<Waiter>,
    receiver: Option<oneshot::Receiver<Delivery>>,
}

impl PendingTake<'_> {
    /// Ends the wait. A poll a commit has set aside (see [`Reservation`])
    /// waits for that commit instead, however short its wait or cancelled:
    /// the attempt it starts is this poll's to deliver. Offered again, it
    /// would go to a queue that nobody takes from once the engine closes
    /// (closing cancels the polls, then lets the commits under way finish),
    /// and the attempt would be lost when its lease lapsed.
    async fn end(&mut self) -> Option<Delivery> {
        let reserved = self.waiter.slot.lock().expect("poisoned").take().is_none();
        if !reserved {
            return self.withdraw();
        }
        // Awaited in place, so a caller that goes away meanwhile still
        // gives the delivery back (`Drop`).
        let delivery = self.receiver.as_mut()?.await.ok();
        self.receiver = None;
        delivery
    }

    fn withdraw(&mut self) -> Option<Delivery> {
        self.waiter.slot.lock().expect("poisoned").take();
        self.receiver.take()?.try_recv().ok()
    }
}

impl Drop for PendingTake<'_> {
    fn drop(&mut self) {
        if let Some(delivery) = self.withdraw() {
            tracing::debug!(run = %delivery.task.run, call = %delivery.task.call_id, started = delivery.started.is_some(), "its poll went away: offered again");
            self.dispatcher.offer(delivery.into_offer());
        }
    }
}

/// A task taken from a queue while the engine decides whether to start it.
/// If the caller goes away before `done`, the task goes back to its queue.
pub struct Taken<'a> {
    dispatcher: &'a Dispatcher,
    task: Option<TaskRef>,
}

impl<'a> Taken<'a> {
    pub fn new(dispatcher: &'a Dispatcher, task: TaskRef) -> Self {
        Taken {
            dispatcher,
            task: Some(task),
        }
    }

    pub fn task(&self) -> &TaskRef {
        self.task.as_ref().expect("not done yet")
    }

    /// The engine has decided: the task is started, or stale.
    pub fn done(mut self) {
        self.task = None;
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        // As it was taken: whether an attempt started meanwhile is not
        // known here (see `TaskRef::undelivered`).
        if let Some(task) = self.task.take() {
            self.dispatcher.offer(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(n: u8) -> TaskRef {
        TaskRef {
            run: RunId::from_slice(&[n; 16]).unwrap(),
            call_id: format!("call-{n}"),
            key: QueueKey::Tool("t".into()),
            undelivered: None,
        }
    }

    fn started(n: u8) -> Task {
        let task = task(n);
        Task {
            token: format!("token-{n}"),
            run: task.run,
            call_id: task.call_id,
            attempt: 1,
            heartbeat_timeout: Duration::from_secs(1),
            deadline_at_ms: None,
            work: super::super::Work::Tool {
                name: "t".into(),
                arguments: serde_json::Value::Null,
            },
            traceparent: String::new(),
        }
    }

    /// A wait longer than any test.
    const MINUTE: Duration = Duration::from_secs(60);

    /// A poll of `poller` for `worker`, in a task of its own.
    fn spawn_take(
        d: &Arc<Dispatcher>,
        poller: Poller,
        keys: &[QueueKey],
        worker: &'static str,
        wait: Duration,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<Option<Delivery>> {
        let (d, cancel, keys) = (d.clone(), cancel.clone(), keys.to_vec());
        tokio::spawn(async move { d.take(poller, &keys, &worker.into(), wait, &cancel).await })
    }

    /// Waits until a poll is registered on `key`.
    async fn registered(d: &Dispatcher, key: &QueueKey) {
        registered_polls(d, key, 1).await;
    }

    /// Waits until `polls` polls are registered on `key`.
    async fn registered_polls(d: &Dispatcher, key: &QueueKey, polls: usize) {
        while d
            .queues
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |q| q.waiters.len())
            < polls
        {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn offer_before_take_is_queued_and_taken_in_order() {
        let d = Dispatcher::default();
        let cancel = Default::default();
        d.offer(task(1));
        d.offer(task(2));
        let keys = [QueueKey::Tool("t".into())];
        assert_eq!(
            d.take(Poller::Worker, &keys, &"w".into(), Duration::ZERO, &cancel)
                .await
                .map(|d| d.task),
            Some(task(1))
        );
        assert_eq!(
            d.take(Poller::Worker, &keys, &"w".into(), Duration::ZERO, &cancel)
                .await
                .map(|d| d.task),
            Some(task(2))
        );
        assert_eq!(
            d.take(
                Poller::Worker,
                &keys,
                &"w".into(),
                Duration::from_millis(1),
                &cancel
            )
            .await
            .map(|d| d.task),
            None
        );
    }

    #[tokio::test]
    async fn a_waiting_take_gets_the_offer_and_a_dropped_one_gives_it_back() {
        let d = Arc::new(Dispatcher::default());
        let cancel = tokio_util::sync::CancellationToken::new();
        let keys = [QueueKey::Tool("t".into()), QueueKey::Model("m".into())];
        let waiting = spawn_take(&d, Poller::Worker, &keys, "w", MINUTE, &cancel);
        registered(&d, &keys[0]).await;
        d.offer(task(7));
        assert_eq!(waiting.await.unwrap().map(|d| d.task), Some(task(7)));

        // A poll that goes away loses nothing.
        let abandoned = spawn_take(&d, Poller::Worker, &keys, "w", MINUTE, &cancel);
        abandoned.abort();
        let _ = abandoned.await;
        d.offer(task(8));
        assert_eq!(
            d.take(Poller::Worker, &keys, &"w".into(), Duration::ZERO, &cancel)
                .await
                .map(|d| d.task),
            Some(task(8))
        );
    }

    #[tokio::test]
    async fn a_reserved_poll_gets_the_started_attempt_or_it_is_offered_again() {
        let d = Arc::new(Dispatcher::default());
        let cancel = tokio_util::sync::CancellationToken::new();
        let keys = [QueueKey::Tool("t".into())];
        let poll = |worker| spawn_take(&d, Poller::Worker, &keys, worker, MINUTE, &cancel);

        let waiting = poll("w1");
        registered(&d, &keys[0]).await;
        let reservation = d.reserve(&keys[0]).expect("a poll waits");
        assert_eq!(reservation.worker.identity, "w1");
        assert!(d.reserve(&keys[0]).is_none(), "a poll is reserved once");
        reservation.deliver(&d, task(3), started(3));
        let delivery = waiting.await.unwrap().expect("delivered");
        assert_eq!(delivery.task, task(3));
        assert_eq!(delivery.started.map(|t| t.token), Some("token-3".into()));

        // The poll goes away while its attempt is being committed: the call
        // is offered again, marked as started but never delivered.
        let abandoned = poll("w2");
        registered(&d, &keys[0]).await;
        let reservation = d.reserve(&keys[0]).expect("a poll waits");
        abandoned.abort();
        let _ = abandoned.await;
        reservation.deliver(&d, task(4), started(4));
        let again = d
            .take(Poller::Worker, &keys, &"w3".into(), Duration::ZERO, &cancel)
            .await
            .expect("offered again");
        assert!(again.started.is_none());
        assert_eq!(
            again.task,
            TaskRef {
                undelivered: Some(1),
                ..task(4)
            }
        );
    }

    #[tokio::test]
    async fn a_reserved_poll_waits_for_its_attempt_when_cancelled_or_out_of_time() {
        let d = Arc::new(Dispatcher::default());
        let keys = [QueueKey::Tool("t".into())];
        for wait in [Duration::from_secs(60), Duration::from_millis(1)] {
            let cancel = tokio_util::sync::CancellationToken::new();
            let waiting = spawn_take(&d, Poller::Worker, &keys, "w", wait, &cancel);
            registered(&d, &keys[0]).await;
            let reservation = d.reserve(&keys[0]).expect("a poll waits");
            // The engine closes (or the wait ends) while the attempt commits.
            cancel.cancel();
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert!(!waiting.is_finished(), "the poll waits for its commit");
            reservation.deliver(&d, task(5), started(5));
            let delivery = waiting.await.unwrap().expect("delivered");
            assert_eq!(delivery.started.map(|t| t.token), Some("token-5".into()));
            assert!(d.queues.lock().unwrap()[&keys[0]].ready.is_empty());
        }

        // A commit that fails drops its reservation: the poll ends empty.
        let cancel = tokio_util::sync::CancellationToken::new();
        let waiting = spawn_take(&d, Poller::Worker, &keys, "w", MINUTE, &cancel);
        registered(&d, &keys[0]).await;
        let reservation = d.reserve(&keys[0]).expect("a poll waits");
        cancel.cancel();
        drop(reservation);
        assert!(waiting.await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_peers_poll_is_never_set_aside_for_an_attempt() {
        let d = Arc::new(Dispatcher::default());
        let cancel = tokio_util::sync::CancellationToken::new();
        let keys = [QueueKey::Tool("t".into())];
        let poll = |poller, worker| spawn_take(&d, poller, &keys, worker, MINUTE, &cancel);
        let peer = poll(Poller::Peer, "peer");
        registered(&d, &keys[0]).await;
        assert!(d.reserve(&keys[0]).is_none(), "only a peer's poll waits");
        let worker = poll(Poller::Worker, "worker");
        registered_polls(&d, &keys[0], 2).await;
        let reservation = d.reserve(&keys[0]).expect("the worker's poll");
        assert_eq!(reservation.worker.identity, "worker");
        reservation.deliver(&d, task(6), started(6));
        assert!(worker.await.unwrap().unwrap().started.is_some());
        // The peer's poll still gets a call to hold, not started.
        d.offer(task(7));
        let held = peer.await.unwrap().expect("offered");
        assert_eq!((held.task, held.started.is_none()), (task(7), true));
    }
}
