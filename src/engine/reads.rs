//! What serving reads needs, on any server of a deployment: the store, a
//! "head moved" signal per followed run, the run-facts cache and the stop
//! signal. The engine's own [`Reads`] hear of each of its commits as it
//! makes it. A server that does not own the runs (a standby of a cluster,
//! or one fenced out) answers reads from the shared database with
//! [`Reads::from_database`]: the database tells it which runs the other
//! servers' commits moved ([`crate::store::Store::heads_moved`]), and it
//! tells their followers.

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::facts::{FactsCache, RunFacts};
use super::heads::Heads;
use super::Error;
use crate::domain::event::{RunStarted, RUN_STARTED};
use crate::store::{EventRecord, HeadsMoved, RunId, SharedStore};

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

    /// Reads fed by the database: a task publishes the heads other
    /// servers' commits moved, until `shutdown`.
    pub fn from_database(store: SharedStore, shutdown: CancellationToken) -> Reads {
        let reads = Reads::new(store, shutdown);
        tokio::spawn(reads.clone().follow_database());
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

    /// Takes a run's facts from its `aaa.run.started` event, read anyway by
    /// a reader of the whole log (the approval watch), so that a run started
    /// on another server costs no summary read when it asks for approval.
    pub fn learn_from(&self, event: &EventRecord) {
        if event.event_type != RUN_STARTED {
            return;
        }
        let Some(run) = RunId::from_slice(&event.run_id) else {
            return;
        };
        if self.inner.facts.get(run).is_some() {
            return;
        }
        // A start it cannot read is left to `run_facts`, which reads the
        // summary.
        if let Ok(RunStarted { task, labels, .. }) = serde_json::from_str(&event.data_json) {
            self.remember(run, Arc::new(RunFacts { labels, task }));
        }
    }

    /// Publishes the heads of followed runs as the database says commits
    /// moved them; when it cannot say which (too many, a notification
    /// missed, this reader lagged), every follower looks again.
    async fn follow_database(self) {
        let mut moved = self.inner.store.heads_moved();
        loop {
            let heard = tokio::select! {
                heard = moved.recv() => heard,
                () = self.inner.shutdown.cancelled() => return,
            };
            match heard {
                Ok(HeadsMoved::Runs(runs)) => {
                    for &(run, seq) in runs.iter() {
                        self.publish(run, seq);
                    }
                }
                Ok(HeadsMoved::Unknown) | Err(RecvError::Lagged(_)) => {
                    self.inner.heads.touch_all();
                }
                Err(RecvError::Closed) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{Budget, ModelChoice};

    fn started(run: RunId, data: &str) -> EventRecord {
        EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq: 1,
            event_type: RUN_STARTED.into(),
            data_json: data.into(),
            ..Default::default()
        }
    }

    /// The approval watch learns a run's facts from its start in the log:
    /// the store has no summary of these runs, so only the event can have
    /// told them.
    #[tokio::test]
    async fn a_run_start_in_the_log_gives_its_facts_without_a_summary_read() {
        let dir = tempfile::tempdir().unwrap();
        let settings = crate::store::Settings::new(dir.path());
        let store: SharedStore = crate::store::open(&settings).await.unwrap();
        let reads = Reads::from_database(store, CancellationToken::new());
        let (run, unreadable) = (RunId::new(), RunId::new());
        let data = serde_json::to_string(&RunStarted {
            task: "pay".into(),
            system: String::new(),
            model: ModelChoice::Worker("m".into()),
            tools: Vec::new(),
            budget: Budget {
                deadline_s: 0.0,
                max_model_calls: 1,
                max_tokens: 0,
            },
            labels: [("team".to_string(), "a".to_string())].into(),
            deadline_at_ms: None,
            traceparent: None,
        })
        .unwrap();
        reads.learn_from(&started(run, &data));
        reads.learn_from(&started(unreadable, "{"));
        let facts = reads.run_facts(run).await.unwrap().expect("learned");
        assert_eq!(facts.task, "pay");
        assert_eq!(facts.labels.get("team").map(String::as_str), Some("a"));
        assert!(reads.run_facts(unreadable).await.unwrap().is_none());
        reads.store().close().await;
    }
}
