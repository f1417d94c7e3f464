//! A test's hold on the embedded store's commits: while held, the
//! committer waits before it writes a round, as if the disk were slow, so
//! that a test can cancel or retry a call whose commit is in flight. A
//! real server has none (`Config::commit_hold` is `None`); the committer
//! then pays one branch per round. PostgreSQL tests hold commits in the
//! database instead (a lock on the row every commit locks first).

use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::watch;

/// Cheap to clone; every clone is the same hold.
#[derive(Clone, Default)]
pub struct CommitHold {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    held: Mutex<bool>,
    released: Condvar,
    /// Rounds waiting on the hold now.
    waiting: watch::Sender<usize>,
}

impl std::fmt::Debug for CommitHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = *self.inner.held.lock().expect("poisoned");
        f.debug_struct("CommitHold").field("held", &held).finish()
    }
}

impl CommitHold {
    /// Holds every round from now on, until [`CommitHold::release`].
    pub fn hold(&self) {
        *self.inner.held.lock().expect("poisoned") = true;
    }

    /// Lets the waiting rounds, and every later one, go.
    pub fn release(&self) {
        *self.inner.held.lock().expect("poisoned") = false;
        self.inner.released.notify_all();
    }

    /// Returns once a round waits on the hold.
    pub async fn until_waiting(&self) {
        let mut waiting = self.inner.waiting.subscribe();
        let _ = waiting.wait_for(|n| *n > 0).await;
    }

    /// The committer's side: blocks its thread while the hold is on.
    pub(crate) fn wait(&self) {
        let mut held = self.inner.held.lock().expect("poisoned");
        if !*held {
            return;
        }
        self.inner.waiting.send_modify(|n| *n += 1);
        while *held {
            held = self.inner.released.wait(held).expect("poisoned");
        }
        self.inner.waiting.send_modify(|n| *n -= 1);
    }
}
