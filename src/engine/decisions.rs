//! Approval decisions and application signals: one through Signal, many at
//! once through DecideApprovals. Every decision goes through
//! `RunState::decide_approval`, so a batch item obeys exactly the rules of
//! a single Signal (digest binding, distinct voters, separation of duties).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::guard::Reviewer;
use super::requests::request_scope;
use super::state::{DecisionOutcome, RunState};
use super::{stripe, Engine, Error, RUN_LOCK_STRIPES};
use crate::domain::event::{
    is_decision, NewEvent, APPROVAL_DENIED, APPROVAL_EDITED, APPROVAL_GRANTED, APPROVAL_VOTED,
};
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

/// A batch decision, as the api checked it.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Distinct calls (the api checks).
    pub items: Vec<BatchItem>,
    /// Grant every item, or deny every item.
    pub grant: bool,
    /// The grant's comment or the denial's reason.
    pub text: String,
    /// With auth off: the approver's name for the votes.
    pub approver: String,
    pub all_or_nothing: bool,
    /// Optional idempotency key (see [`super::requests`]).
    pub request_id: String,
}

/// What a batch's request id records for each item it decided: the item's
/// first answer, kept with the item's run.
#[derive(serde::Serialize, serde::Deserialize)]
struct ItemAnswer {
    decision: String,
    seq: u64,
}

/// Where a batch's request id keeps an item's answer: per run and call
/// (the call's length first, so that no two calls and principals make
/// the same scope), and per principal.
fn item_scope(item: &BatchItem, principal: &str) -> Vec<u8> {
    let call = item.call_id.as_bytes();
    let length = u16::try_from(call.len()).unwrap_or(u16::MAX).to_be_bytes();
    let method = [b"decide".as_slice(), item.run.as_bytes(), &length, call].concat();
    request_scope(&method, principal)
}

/// A decision's event type, as the `&'static str` outcomes carry.
fn decision_type(recorded: &str) -> Option<&'static str> {
    [
        APPROVAL_GRANTED,
        APPROVAL_VOTED,
        APPROVAL_DENIED,
        APPROVAL_EDITED,
    ]
    .into_iter()
    .find(|t| *t == recorded)
}

impl Engine {
    /// Signal: an approval decision or an application event. With a
    /// request id, a retry answers what the first try recorded (see
    /// [`super::requests`]).
    pub async fn signal(
        &self,
        run: RunId,
        event_type: &str,
        data: Value,
        request_id: &str,
        reviewer: Reviewer,
    ) -> Result<SignalAnswer, Error> {
        if request_id.is_empty() {
            return self.signal_now(run, event_type, data, None, reviewer).await;
        }
        let scope = request_scope(
            &[b"signal".as_slice(), run.as_bytes()].concat(),
            &reviewer.principal,
        );
        let engine = self.clone();
        let (event_type, record) = (
            event_type.to_string(),
            (scope.clone(), request_id.to_string()),
        );
        let work = async move {
            engine
                .signal_now(run, &event_type, data, Some(record), reviewer)
                .await
        };
        let recorded = |bytes: &[u8]| {
            serde_json::from_slice(bytes)
                .map_err(|e| Error::Internal(format!("bad idempotency record: {e}")))
        };
        let already = |answer: &SignalAnswer| answer.already_decided;
        let (answer, from_record) = self
            .once(scope, request_id.to_string(), recorded, already, work)
            .await?;
        if from_record {
            self.act_again_soon(run);
        }
        Ok(answer)
    }

    /// Signal's work; `record`: where the answer is recorded, with the
    /// event it answers (scope and request id).
    async fn signal_now(
        &self,
        run: RunId,
        event_type: &str,
        data: Value,
        record: Option<(Vec<u8>, String)>,
        reviewer: Reviewer,
    ) -> Result<SignalAnswer, Error> {
        let (answer, _) = self
            .update(run, |state, batch| {
                let seq = state.last_seq + 1;
                let (events, answer) = if is_decision(event_type) {
                    match state.decide_approval(event_type, &data, &reviewer, &self.rules())? {
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
                if let (false, Some((scope, request_id))) = (events.is_empty(), &record) {
                    let bytes = serde_json::to_vec(&answer).expect("serializes");
                    batch.put_request(scope, request_id, bytes);
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
    /// With a request id, an item a first try decided answers with that
    /// first outcome, and the others are decided as asked (see
    /// [`super::requests`]).
    pub async fn decide_approvals(
        &self,
        batch: Batch,
        reviewer: Reviewer,
    ) -> Result<Vec<ItemOutcome>, Error> {
        if batch.request_id.is_empty() {
            let recorded = batch.items.iter().map(|_| None).collect();
            return self.decide_now(&batch, &reviewer, recorded).await;
        }
        let key = (
            request_scope(b"decide", &reviewer.principal),
            batch.request_id.clone(),
        );
        let engine = self.clone();
        self.under_request_lock(key, async move {
            let recorded = engine.recorded_items(&batch, &reviewer.principal).await?;
            for (item, recorded) in batch.items.iter().zip(&recorded) {
                if recorded.is_some() {
                    engine.act_again_soon(item.run);
                }
            }
            let outcomes = engine.decide_now(&batch, &reviewer, recorded).await?;
            engine
                .landed_meanwhile(&batch, &reviewer.principal, outcomes)
                .await
        })
        .await
    }

    /// An item answered "already decided" may have been decided by this
    /// batch's own first try, landed after this try looked for its
    /// outcomes (as [`super::requests`]' `once` says of one answer): its
    /// recorded outcome answers it then.
    async fn landed_meanwhile(
        &self,
        batch: &Batch,
        principal: &str,
        mut outcomes: Vec<ItemOutcome>,
    ) -> Result<Vec<ItemOutcome>, Error> {
        let already = |o: &ItemOutcome| matches!(o, ItemOutcome::AlreadyDecided(_));
        if !outcomes.iter().any(already) {
            return Ok(outcomes);
        }
        let recorded = self.recorded_items(batch, principal).await?;
        for ((outcome, first), item) in outcomes.iter_mut().zip(recorded).zip(&batch.items) {
            if let (true, Some(first)) = (already(outcome), first) {
                *outcome = first;
                self.act_again_soon(item.run);
            }
        }
        Ok(outcomes)
    }

    /// The outcome a first try of the batch recorded for each item, if any.
    async fn recorded_items(
        &self,
        batch: &Batch,
        principal: &str,
    ) -> Result<Vec<Option<ItemOutcome>>, Error> {
        let reads = batch.items.iter().map(|item| async move {
            let scope = item_scope(item, principal);
            let Some(bytes) = self.inner.store.request(&scope, &batch.request_id).await? else {
                return Ok(None);
            };
            let bad = |why: String| Error::Internal(format!("bad idempotency record: {why}"));
            let answer: ItemAnswer =
                serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
            let recorded = decision_type(&answer.decision).ok_or_else(|| bad(answer.decision))?;
            Ok::<_, Error>(Some(ItemOutcome::Decided {
                recorded,
                seq: answer.seq,
            }))
        });
        futures_util::future::try_join_all(reads).await
    }

    /// Decides the items `recorded` has no outcome for; the others answer
    /// with theirs. Decided items record their outcomes under the batch's
    /// request id, if it has one.
    async fn decide_now(
        &self,
        batch: &Batch,
        reviewer: &Reviewer,
        recorded: Vec<Option<ItemOutcome>>,
    ) -> Result<Vec<ItemOutcome>, Error> {
        let items = &batch.items;
        let fresh: Vec<bool> = recorded.iter().map(Option::is_none).collect();
        let to_decide = |i: &usize| fresh[*i];
        // Locks in stripe order, each once, so batches cannot deadlock.
        let mut stripes: Vec<usize> = (0..items.len())
            .filter(to_decide)
            .map(|i| stripe(&items[i].run, RUN_LOCK_STRIPES))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for index in stripes {
            guards.push(self.inner.run_locks[index].clone().lock_owned().await);
        }

        let mut states: BTreeMap<RunId, Result<RunState, Error>> = BTreeMap::new();
        for item in (0..items.len()).filter(to_decide).map(|i| &items[i]) {
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

        let rules = self.rules();
        let (event_type, text_key) = match batch.grant {
            true => (APPROVAL_GRANTED, "comment"),
            false => (APPROVAL_DENIED, "reason"),
        };
        let mut outcomes = Vec::with_capacity(items.len());
        let mut to_append: BTreeMap<RunId, Vec<NewEvent>> = BTreeMap::new();
        for (item, recorded) in items.iter().zip(recorded) {
            if let Some(outcome) = recorded {
                outcomes.push(outcome);
                continue;
            }
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
                text_key: batch.text,
            });
            if !batch.approver.is_empty() {
                data["approver"] = json!(batch.approver);
            }
            let outcome = match state.decide_approval(event_type, &data, reviewer, &rules) {
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
        if batch.all_or_nothing && refused {
            for (i, outcome) in outcomes.iter_mut().enumerate() {
                if to_decide(&i) && matches!(outcome, ItemOutcome::Decided { .. }) {
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
        let mut writes = WriteBatch::default();
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
                    self.inner.grants.release(&writes.grant_uses());
                    return Err(e);
                }
            };
            writes.extend(std::mem::take(&mut staged.batch));
            staged_runs.push((state, staged));
        }
        if !batch.request_id.is_empty() {
            for (i, (item, outcome)) in items.iter().zip(&outcomes).enumerate() {
                if let (true, ItemOutcome::Decided { recorded, seq }) = (to_decide(&i), outcome) {
                    let answer = ItemAnswer {
                        decision: recorded.to_string(),
                        seq: *seq,
                    };
                    let bytes = serde_json::to_vec(&answer).expect("serializes");
                    let scope = item_scope(item, &reviewer.principal);
                    writes.put_request_of(item.run, &scope, &batch.request_id, bytes);
                }
            }
        }
        self.put_back(states);
        let engine = self.clone();
        tokio::spawn(async move {
            let _guards = guards;
            let positions = engine.commit_with_grants(writes).await?;
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
