//! Task queues: calls ready for a worker, by tool or model name, and the
//! long polls waiting for them. In memory only: what is queued can always be
//! derived again from the runs' state (see `Engine::recover`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::store::RunId;

/// What a queue serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum QueueKey {
    Tool(String),
    Model(String),
}

/// A call a worker may take. Taking it does not start it: the engine checks
/// the run's state first, so a stale or duplicate entry is harmless.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRef {
    pub run: RunId,
    pub call_id: String,
    pub key: QueueKey,
    /// A poll claimed this call and went away before it could answer: if
    /// the attempt was started, it was never delivered and may be handed
    /// out again as it is.
    pub undelivered: bool,
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

/// One long poll, registered on every queue it serves; the first offer wins.
struct Waiter {
    slot: Mutex<Option<oneshot::Sender<TaskRef>>>,
}

impl Waiter {
    fn is_gone(&self) -> bool {
        self.slot.lock().expect("poisoned").is_none()
    }
}

impl Dispatcher {
    /// Hands the task to a waiting poll, or queues it.
    pub fn offer(&self, mut task: TaskRef) {
        let mut queues = self.queues.lock().expect("poisoned");
        let queue = queues.entry(task.key.clone()).or_default();
        while let Some(waiter) = queue.waiters.pop_front() {
            let sender = waiter.slot.lock().expect("poisoned").take();
            if let Some(sender) = sender {
                match sender.send(task) {
                    Ok(()) => return,
                    Err(returned) => task = returned,
                }
            }
        }
        queue.ready.push_back(task);
    }

    /// Takes a task from any of `keys`, waiting up to `wait`. None when the
    /// wait ends (or `cancel` fires) with nothing to do.
    pub async fn take(
        &self,
        keys: &[QueueKey],
        wait: Duration,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Option<TaskRef> {
        let (sender, receiver) = oneshot::channel();
        let waiter = Arc::new(Waiter {
            slot: Mutex::new(Some(sender)),
        });
        {
            let mut queues = self.queues.lock().expect("poisoned");
            for key in keys {
                if let Some(task) = queues.get_mut(key).and_then(|q| q.ready.pop_front()) {
                    return Some(task);
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
            task = receiver => task.ok(),
            _ = tokio::time::sleep(wait) => pending.withdraw(),
            _ = cancel.cancelled() => pending.withdraw(),
        }
    }
}

/// A registered wait. Withdrawing (or dropping it, when the poll's caller
/// goes away) makes sure a task handed over at the last moment is not lost.
struct PendingTake<'a> {
    dispatcher: &'a Dispatcher,
    waiter: Arc<Waiter>,
    receiver: Option<oneshot::Receiver<TaskRef>>,
}

impl PendingTake<'_> {
    fn withdraw(&mut self) -> Option<TaskRef> {
        self.waiter.slot.lock().expect("poisoned").take();
        self.receiver.take()?.try_recv().ok()
    }
}

impl Drop for PendingTake<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.withdraw() {
            self.dispatcher.offer(task);
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
        if let Some(mut task) = self.task.take() {
            task.undelivered = true;
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
            undelivered: false,
        }
    }

    #[tokio::test]
    async fn offer_before_take_is_queued_and_taken_in_order() {
        let d = Dispatcher::default();
        let cancel = Default::default();
        d.offer(task(1));
        d.offer(task(2));
        let keys = [QueueKey::Tool("t".into())];
        assert_eq!(d.take(&keys, Duration::ZERO, &cancel).await, Some(task(1)));
        assert_eq!(d.take(&keys, Duration::ZERO, &cancel).await, Some(task(2)));
        assert_eq!(d.take(&keys, Duration::from_millis(1), &cancel).await, None);
    }

    #[tokio::test]
    async fn a_waiting_take_gets_the_offer_and_a_dropped_one_gives_it_back() {
        let d = Arc::new(Dispatcher::default());
        let cancel = tokio_util::sync::CancellationToken::new();
        let keys = [QueueKey::Tool("t".into()), QueueKey::Model("m".into())];
        let waiting = {
            let (d, cancel, keys) = (d.clone(), cancel.clone(), keys.clone());
            tokio::spawn(async move { d.take(&keys, Duration::from_secs(60), &cancel).await })
        };
        // Wait until the poll is registered, then offer.
        while d
            .queues
            .lock()
            .unwrap()
            .get(&keys[0])
            .map_or(0, |q| q.waiters.len())
            == 0
        {
            tokio::task::yield_now().await;
        }
        d.offer(task(7));
        assert_eq!(waiting.await.unwrap(), Some(task(7)));

        // A poll that goes away loses nothing.
        let abandoned = {
            let (d, cancel, keys) = (d.clone(), cancel.clone(), keys.clone());
            tokio::spawn(async move { d.take(&keys, Duration::from_secs(60), &cancel).await })
        };
        abandoned.abort();
        let _ = abandoned.await;
        d.offer(task(8));
        assert_eq!(d.take(&keys, Duration::ZERO, &cancel).await, Some(task(8)));
    }
}
