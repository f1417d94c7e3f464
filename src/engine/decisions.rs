//! Approval decisions and application signals: one through Signal, many at
//! once through DecideApprovals. Every decision goes through
//! `RunState::decide_approval`, so a batch item obeys exactly the rules of
//! a single Signal (digest binding, distinct voters, separation of duties).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::event::{is_decision, NewEvent, APPROVAL_DENIED, APPROVAL_GRANTED};
use super::state::{DecisionOutcome, Reviewer, RunState};
use super::{request_scope, stripe, Engine, Error, RUN_LOCK_STRIPES};
use crate::store::{RunId, WriteBatch};

/// Signal's answer (also kept as the answer of an idempotent retry).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SignalAnswer {
    pub seq: u64,
    pub already_decided: bool,
    pub decision: String,
    #[serde(default)]
    pub votes: u32,
    #[serde(default)]
    pub approvals_required: u32,
    #[serde(default)]
    pub new_call_id: String,
    #[serde(default)]
    pub new_arguments_sha256: String,
}

/// One call of a batch decision, as the reviewer was shown it.
#[derive(Debug, Clone)]
pub struct BatchItem {
    pub run: RunId,
    pub call_id: String,
    pub arguments_sha256: String,
}

/// How one item of a batch went.
#[derive(Debug)]
pub enum ItemOutcome {
    /// Recorded as this event type at this seq.
    Decided { recorded: &'static str, seq: u64 },
    /// Already decided: the decision that stands (an event type).
    AlreadyDecided(&'static str),
    /// Refused; nothing recorded.
    Refused(Error),
    /// all_or_nothing, and another item was refused.
    NotApplied,
}

impl Engine {
    /// Signal: an approval decision or an application event.
    pub async fn signal(
        &self,
        run: RunId,
        event_type: &str,
        data: Value,
        request_id: &str,
        reviewer: Reviewer,
    ) -> Result<SignalAnswer, Error> {
        let scope = request_scope(
            &[b"signal".as_slice(), run.as_bytes()].concat(),
            &reviewer.principal,
        );
        // Retries of one request wait for each other here, so the second
        // reads the answer the first recorded.
        let _request_guard = match request_id.is_empty() {
            true => None,
            false => Some(
                self.inner.request_locks[stripe(&(&scope, request_id), RUN_LOCK_STRIPES)]
                    .lock()
                    .await,
            ),
        };
        if !request_id.is_empty() {
            if let Some(bytes) = self.inner.store.request(&scope, request_id).await? {
                return serde_json::from_slice(&bytes)
                    .map_err(|e| Error::Internal(format!("bad idempotency record: {e}")));
            }
        }
        let (answer, _) = self
            .update(run, |state, batch| {
                let seq = state.last_seq + 1;
                let (events, answer) = if is_decision(event_type) {
                    match state.decide_approval(event_type, &data, &reviewer)? {
                        DecisionOutcome::AlreadyDecided(d) => (
                            Vec::new(),
                            SignalAnswer {
                                already_decided: true,
                                decision: d.event_type().to_string(),
                                ..Default::default()
                            },
                        ),
                        DecisionOutcome::Append(decided) => (
                            decided.events,
                            SignalAnswer {
                                seq,
                                already_decided: false,
                                decision: decided.recorded.to_string(),
                                votes: decided.votes,
                                approvals_required: decided.approvals_required,
                                new_call_id: decided.new_call_id,
                                new_arguments_sha256: decided.new_arguments_sha256,
                            },
                        ),
                    }
                } else {
                    if state.is_finished() {
                        return Err(Error::RunFinished(run.to_string()));
                    }
                    let event = NewEvent {
                        event_type: event_type.to_string(),
                        data,
                        actor: reviewer.actor,
                    };
                    (
                        vec![event],
                        SignalAnswer {
                            seq,
                            ..Default::default()
                        },
                    )
                };
                if !events.is_empty() && !request_id.is_empty() {
                    let bytes = serde_json::to_vec(&answer).expect("serializes");
                    batch.put_request(&scope, request_id, bytes);
                }
                Ok((events, answer))
            })
            .await?;
        Ok(answer)
    }

    /// DecideApprovals: grants (or denies) every item, each bound to its
    /// digest, in one atomic commit. The runs' locks are held from the
    /// first check to the commit, so no other decision slips in between;
    /// with `all_or_nothing`, one refused item leaves every item undecided.
    /// Items must name distinct calls (the api checks).
    pub async fn decide_approvals(
        &self,
        items: &[BatchItem],
        grant: bool,
        text: &str,
        approver: &str,
        reviewer: &Reviewer,
        all_or_nothing: bool,
    ) -> Result<Vec<ItemOutcome>, Error> {
        // Locks in stripe order, each once, so batches cannot deadlock.
        let mut stripes: Vec<usize> = items
            .iter()
            .map(|item| stripe(&item.run, RUN_LOCK_STRIPES))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for index in stripes {
            guards.push(self.inner.run_locks[index].clone().lock_owned().await);
        }

        let mut states: BTreeMap<RunId, Result<RunState, Error>> = BTreeMap::new();
        for item in items {
            if !states.contains_key(&item.run) {
                let loaded = self.load(item.run).await;
                if let Err(e @ (Error::StorageUnavailable(_) | Error::Internal(_))) = &loaded {
                    // The store is in trouble: refuse the whole batch.
                    let error = Error::StorageUnavailable(e.to_string());
                    self.put_back(states);
                    return Err(error);
                }
                states.insert(item.run, loaded);
            }
        }

        let (event_type, text_key) = match grant {
            true => (APPROVAL_GRANTED, "comment"),
            false => (APPROVAL_DENIED, "reason"),
        };
        let mut outcomes = Vec::with_capacity(items.len());
        let mut to_append: BTreeMap<RunId, Vec<NewEvent>> = BTreeMap::new();
        for item in items {
            let state = match &states[&item.run] {
                Ok(state) => state,
                // A run of a shard another server of the cluster owns.
                Err(Error::OwnershipLost(why)) => {
                    outcomes.push(ItemOutcome::Refused(Error::OwnershipLost(why.clone())));
                    continue;
                }
                Err(_) => {
                    outcomes.push(ItemOutcome::Refused(Error::RunNotFound(
                        item.run.to_string(),
                    )));
                    continue;
                }
            };
            let mut data = json!({
                "call_id": item.call_id,
                "arguments_sha256": item.arguments_sha256,
                text_key: text,
            });
            if !approver.is_empty() {
                data["approver"] = json!(approver);
            }
            let outcome = match state.decide_approval(event_type, &data, reviewer) {
                Ok(DecisionOutcome::Append(decided)) => {
                    let pending = to_append.entry(item.run).or_default();
                    pending.extend(decided.events);
                    // Decisions are the batch's first events of their run,
                    // in item order: their seqs follow the run's last.
                    let seq = state.last_seq + pending.len() as u64;
                    ItemOutcome::Decided {
                        recorded: decided.recorded,
                        seq,
                    }
                }
                Ok(DecisionOutcome::AlreadyDecided(d)) => {
                    ItemOutcome::AlreadyDecided(d.event_type())
                }
                Err(e) => ItemOutcome::Refused(e),
            };
            outcomes.push(outcome);
        }

        let refused = outcomes
            .iter()
            .any(|o| !matches!(o, ItemOutcome::Decided { .. }));
        if all_or_nothing && refused {
            for outcome in &mut outcomes {
                if matches!(outcome, ItemOutcome::Decided { .. }) {
                    *outcome = ItemOutcome::NotApplied;
                }
            }
            to_append.clear();
        }
        if to_append.is_empty() {
            self.put_back(states);
            return Ok(outcomes);
        }

        // One commit for every run: the batch is durable as a whole or not at all.
        let mut staged_runs = Vec::new();
        let mut batch = WriteBatch::default();
        for (run, events) in to_append {
            let Some(Ok(mut state)) = states.remove(&run) else {
                unreachable!("decided items have a loaded state")
            };
            // On error the states may be ahead of the store: drop them, the
            // next load folds the log again.
            let mut staged = match self.stage(&mut state, events, WriteBatch::default(), Vec::new())
            {
                Ok(staged) => staged,
                Err(e) => {
                    // The runs staged before this one commit nothing.
                    self.inner.grants.release(&batch.grant_uses());
                    return Err(e);
                }
            };
            batch.extend(std::mem::take(&mut staged.batch));
            staged_runs.push((state, staged));
        }
        self.put_back(states);
        let engine = self.clone();
        tokio::spawn(async move {
            let _guards = guards;
            let positions = engine.commit_with_grants(batch).await?;
            let mut offset = 0;
            for (mut state, staged) in staged_runs {
                let count = (state.last_seq + 1 - staged.first_seq) as usize;
                let end = (offset + count).min(positions.len());
                engine.act(&mut state, staged, &positions[offset..end]);
                offset = end;
                engine.cache_put(state);
            }
            Ok::<(), Error>(())
        })
        .await
        .map_err(|e| Error::Internal(format!("commit task failed: {e}")))??;
        Ok(outcomes)
    }

    /// Returns loaded states to the cache.
    fn put_back(&self, states: BTreeMap<RunId, Result<RunState, Error>>) {
        for state in states.into_values().flatten() {
            self.cache_put(state);
        }
    }
}
