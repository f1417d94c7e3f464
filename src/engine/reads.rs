//! What serving reads needs, on any server of a deployment: the store, a
//! "head moved" signal per followed run, the run-facts cache and the stop
//! signal. The engine's own [`Reads`] hear of each of its commits as it
//! makes it. A server that does not own the runs (a standby of a cluster,
//! or one fenced out) answers reads from the shared database with
//! [`Reads::from_log`]: it follows the log, woken by the other servers'
//! commits, and tells the followers of the runs it finds there.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::facts::{FactsCache, RunFacts};
use super::heads::Heads;
use super::Error;
use crate::store::{RunId, SharedStore};

/// Events read from the log at once while following it.
const LOG_CHUNK: usize = 1024;

#[derive(Clone)]
pub struct Reads {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    heads: Heads,
    facts: FactsCache,
    shutdown: CancellationToken,
}

impl Reads {
    /// Reads whose heads the caller publishes (the engine, as it commits).
    pub(super) fn new(store: SharedStore, shutdown: CancellationToken) -> Reads {
        Reads {
            inner: Arc::new(Inner {
                store,
                heads: Heads::default(),
                facts: FactsCache::default(),
                shutdown,
            }),
        }
    }

    /// Reads fed from the log: a task follows the durable position (moved
    /// by every server's commits) until `shutdown`, and publishes the
    /// heads of the followed runs it finds in the new events.
    pub fn from_log(store: SharedStore, shutdown: CancellationToken) -> Reads {
        let reads = Reads::new(store, shutdown);
        tokio::spawn(reads.clone().follow_log());
        reads
    }

    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// Changes whenever the run's durable head moves.
    pub fn follow(&self, run: RunId) -> watch::Receiver<u64> {
        self.inner.heads.subscribe(run)
    }

    pub(super) fn publish(&self, run: RunId, last_seq: u64) {
        self.inner.heads.publish(run, last_seq);
    }

    /// The run's labels and task (`None` for an unknown run), from the
    /// cache when it has them.
    pub async fn run_facts(&self, run: RunId) -> Result<Option<Arc<RunFacts>>, Error> {
        if let Some(facts) = self.inner.facts.get(run) {
            return Ok(Some(facts));
        }
        let Some(record) = self.inner.store.run(run).await? else {
            return Ok(None);
        };
        let facts = Arc::new(RunFacts {
            labels: record.labels,
            task: record.task,
        });
        self.remember(run, facts.clone());
        Ok(Some(facts))
    }

    pub(super) fn remember(&self, run: RunId, facts: Arc<RunFacts>) {
        self.inner.facts.put(run, facts);
    }

    /// Publishes the heads of followed runs from the log, after each move
    /// of the durable position. While nobody follows a run, the log is not
    /// read: a follower reads the store itself after subscribing.
    async fn follow_log(self) {
        let store = &self.inner.store;
        let mut durable = store.watch_durable();
        let mut read_to = *durable.borrow_and_update();
        loop {
            tokio::select! {
                changed = durable.changed() => if changed.is_err() { return },
                () = self.inner.shutdown.cancelled() => return,
            }
            let head = *durable.borrow_and_update();
            while read_to < head {
                if self.inner.heads.is_empty() {
                    read_to = head;
                    break;
                }
                match store.log_after(read_to, LOG_CHUNK).await {
                    Ok(events) if !events.is_empty() => {
                        for event in &events {
                            if let Some(run) = RunId::from_slice(&event.run_id) {
                                self.publish(run, event.seq);
                            }
                            read_to = event.position;
                        }
                    }
                    Ok(_) => break,
                    Err(e) => {
                        // The next move of the position reads from here again.
                        tracing::warn!("following the log for readers here failed: {e}");
                        break;
                    }
                }
            }
        }
    }
}
