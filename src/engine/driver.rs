//! The driver of a run's changes: the run lock, the cache of run states,
//! staging new events, the pure fold (`state`), the commit, and the actions
//! performed once the commit is durable. Every write of a run goes through
//! `Engine::update` or `Engine::append` here.

use super::*;

/// What one append collects on its way to the commit.
pub(super) struct Staged {
    pub(super) now: i64,
    /// seq of the batch's first event of this run.
    pub(super) first_seq: u64,
    /// Events still to fold, in order.
    pub(super) queue: VecDeque<NewEvent>,
    pub(super) batch: WriteBatch,
    /// Calls to offer to workers once the batch is durable.
    pub(super) offers: Vec<TaskRef>,
    /// Attempts started in the batch for polls already waiting, to hand over
    /// once it is durable.
    pub(super) handoffs: Vec<(Reservation, TaskRef, Task)>,
    pub(super) timers_changed: bool,
    /// What the batch means for the metrics, counted once it is durable.
    pub(super) observed: Vec<observed::Observed>,
    /// The spans its events end, exported once it is durable.
    pub(super) spans: Vec<opentelemetry_sdk::trace::SpanData>,
}

/// Which of `stripes` locks guards `key`. DefaultHasher::new() has fixed
/// keys, so the same key maps to the same stripe on every thread.
pub(super) fn stripe(key: &impl std::hash::Hash, stripes: usize) -> usize {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % stripes as u64) as usize
}

pub(super) fn locks(n: usize) -> Box<[Arc<tokio::sync::Mutex<()>>]> {
    (0..n)
        .map(|_| Arc::new(tokio::sync::Mutex::new(())))
        .collect()
}

impl Engine {
    pub(super) async fn lock_run(&self, run: RunId) -> tokio::sync::OwnedMutexGuard<()> {
        self.inner.run_locks[stripe(&run, RUN_LOCK_STRIPES)]
            .clone()
            .lock_owned()
            .await
    }

    /// The run's state; the caller holds the run's lock and puts it back.
    pub(super) async fn load(&self, run: RunId) -> Result<RunState, Error> {
        self.serves(run)?;
        if let Some(state) = self.inner.cache.lock().expect("poisoned").pop(&run) {
            return Ok(state);
        }
        let events = self.inner.store.run_events(run, 0, usize::MAX).await?;
        if events.is_empty() {
            return Err(Error::missing_run(&self.inner.store, run).await);
        }
        RunState::replay(run, &events)
    }

    /// Refuses a run of a shard this engine does not serve: another server
    /// of the cluster owns it (the call is retried, and reaches it).
    pub(super) fn serves(&self, run: RunId) -> Result<(), Error> {
        match self.inner.shards.contains(run.shard()) {
            true => Ok(()),
            false => Err(Error::OwnershipLost(format!(
                "this server does not own the shard of run '{run}' now"
            ))),
        }
    }

    pub(super) fn cache_put(&self, state: RunState) {
        self.inner
            .cache
            .lock()
            .expect("poisoned")
            .put(state.id, state);
    }

    /// Reads a run's state under its lock without changing it.
    pub(super) async fn read_run<T>(
        &self,
        run: RunId,
        read: impl FnOnce(&RunState) -> T,
    ) -> Result<T, Error> {
        let _guard = self.lock_run(run).await;
        let state = self.load(run).await?;
        let answer = read(&state);
        self.cache_put(state);
        Ok(answer)
    }

    /// The one way a run changes: under its lock, `decide` says what to
    /// append (and may add index writes); the events are folded and
    /// committed, then acted on. Returns decide's answer and the seq of the
    /// first appended event (0 when nothing was appended).
    pub(super) async fn update<T>(
        &self,
        run: RunId,
        decide: impl FnOnce(&RunState, &mut WriteBatch) -> Result<(Vec<NewEvent>, T), Error>,
    ) -> Result<(T, u64), Error> {
        let guard = self.lock_run(run).await;
        let state = self.load(run).await?;
        let mut batch = WriteBatch::default();
        let (events, answer) = match decide(&state, &mut batch) {
            Ok(decided) => decided,
            Err(e) => {
                self.cache_put(state);
                return Err(e);
            }
        };
        let first_seq = if events.is_empty() {
            0
        } else {
            state.last_seq + 1
        };
        if events.is_empty() && batch.is_empty() {
            self.cache_put(state);
            return Ok((answer, 0));
        }
        self.commit_detached(guard, state, events, batch, Vec::new())
            .await?;
        Ok((answer, first_seq))
    }

    /// Appends and acts in a task of its own, holding the run's lock, so that
    /// a caller that goes away mid-commit (a cancelled RPC) cannot leave a
    /// durable event whose effects (a dispatch, a timer) never happened.
    pub(super) async fn commit_detached(
        &self,
        guard: tokio::sync::OwnedMutexGuard<()>,
        mut state: RunState,
        events: Vec<NewEvent>,
        batch: WriteBatch,
        actions: Vec<Action>,
    ) -> Result<(), Error> {
        let engine = self.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let open = engine.inner.open.read().await;
            if !*open {
                return Err(Error::OwnershipLost(
                    "this server stopped serving the run's shard".into(),
                ));
            }
            // On error the state may be ahead of the store: drop it, the
            // next load folds the log again.
            engine.append(&mut state, events, batch, actions).await?;
            engine.cache_put(state);
            Ok(())
        })
        .await
        .map_err(|e| Error::Internal(format!("commit task failed: {e}")))?
    }

    /// Folds `events` into `state`, commits them with `batch`, then acts.
    /// `actions` are actions already produced (by `RunState::start`).
    pub(super) async fn append(
        &self,
        state: &mut RunState,
        events: Vec<NewEvent>,
        batch: WriteBatch,
        actions: Vec<Action>,
    ) -> Result<(), Error> {
        let mut staged = self.stage(state, events, batch, actions)?;
        let batch = std::mem::take(&mut staged.batch);
        let positions = match self.commit_with_grants(batch).await {
            Ok(positions) => positions,
            Err(e) => {
                if matches!(e, Error::StorageUnavailable(_)) {
                    self.act_again_later(state.id);
                }
                return Err(e);
            }
        };
        self.act(state, staged, &positions);
        Ok(())
    }

    /// After a commit of `run` refused for the store: it may have landed
    /// all the same (PostgreSQL committed and the answer was lost), and then
    /// what it made ready (a granted call, the next model call) was never
    /// offered. So once the store answers again, the run's log is folded
    /// afresh and its dispatchable calls are offered, as a restart's
    /// recovery does. A commit that lands later still (it outlasted the
    /// committer's wait) is met by the retry with its request id or token,
    /// which finds it recorded: see [`Engine::act_again_soon`].
    fn act_again_later(&self, run: RunId) {
        self.act_again_after(run, std::time::Duration::from_millis(200));
    }

    /// A request found its answer recorded (a retry): the commit that
    /// recorded it may have been refused to this server all the same
    /// (landed, its answer lost), with its effects never done. Does them
    /// again, as [`Engine::act_again_later`] does; offering a call twice is
    /// harmless, its start decides once. (The long chaos suite found runs
    /// granted and never served.)
    pub(super) fn act_again_soon(&self, run: RunId) {
        self.act_again_after(run, std::time::Duration::ZERO);
    }

    /// Acts again on the run after `pause`, retrying while the store cannot
    /// answer; gives up when the run is not this engine's any more or the
    /// engine closed.
    fn act_again_after(&self, run: RunId, mut pause: std::time::Duration) {
        let engine = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(pause).await;
                let open = engine.inner.open.read().await;
                if !*open {
                    return;
                }
                match engine.act_again(run).await {
                    Err(Error::StorageUnavailable(_)) => {
                        pause = (pause * 2).clamp(
                            std::time::Duration::from_millis(200),
                            std::time::Duration::from_secs(5),
                        );
                    }
                    _ => return,
                }
            }
        });
    }

    /// Folds the run's log afresh and offers what is dispatchable.
    async fn act_again(&self, run: RunId) -> Result<(), Error> {
        let _guard = self.lock_run(run).await;
        self.inner.cache.lock().expect("poisoned").pop(&run);
        let state = self.load(run).await?;
        self.offer_all(run, state.dispatchable(self.now_ms()));
        self.durable_timers_changed();
        self.inner.reads.publish(run, state.last_seq);
        self.cache_put(state);
        Ok(())
    }

    /// Commits a batch; the standing grants it uses count for good once
    /// it is durable, and are given back if it is not.
    pub(super) async fn commit_with_grants(&self, batch: WriteBatch) -> Result<Vec<u64>, Error> {
        let uses = batch.grant_uses();
        match self.inner.store.commit(batch).await {
            Ok(positions) => {
                self.inner.grants.confirm(&uses);
                Ok(positions)
            }
            Err(e) => {
                if !uses.is_empty() {
                    self.inner.grants.release(&uses);
                    self.reload_grants().await;
                }
                Err(e.into())
            }
        }
    }

    /// Folds `events` into `state` and the batch (with the engine's
    /// follow-ups and the index writes they imply), ready to commit.
    pub(super) fn stage(
        &self,
        state: &mut RunState,
        events: Vec<NewEvent>,
        batch: WriteBatch,
        actions: Vec<Action>,
    ) -> Result<Staged, Error> {
        let mut staged = Staged {
            now: self.now_ms(),
            first_seq: state.last_seq + 1,
            queue: events.into(),
            batch,
            offers: Vec::new(),
            handoffs: Vec::new(),
            timers_changed: false,
            observed: Vec::new(),
            spans: Vec::new(),
        };
        match self.stage_into(state, actions, &mut staged) {
            Ok(()) => Ok(staged),
            Err(e) => {
                // Nothing of it will commit: the grant uses it reserved go back.
                self.inner.grants.release(&staged.batch.grant_uses());
                Err(e)
            }
        }
    }

    pub(super) fn stage_into(
        &self,
        state: &mut RunState,
        actions: Vec<Action>,
        staged: &mut Staged,
    ) -> Result<(), Error> {
        // The active index changes rarely: write it when the run starts or
        // stops being active. A new run (the batch holds its first event)
        // has no mark yet.
        let is_new = staged.batch.events().first().is_some_and(|e| e.seq == 1);
        let was_active = !is_new && state.is_active();
        let status_before = (!is_new).then(|| state.status_code());
        let usage_before = state.usage;
        if is_new {
            staged.first_seq = 1;
            staged.observed.push(observed::Observed::RunStarted);
        }
        self.route(state, actions, staged);
        self.fold(state, staged)?;
        // Calls ready for a worker that is already polling start now, in
        // this commit, rather than in one more after the poll claims them.
        let ready = std::mem::take(&mut staged.offers);
        for task in ready {
            self.start_for_waiting_poll(state, task, staged);
        }
        self.fold(state, staged)?;
        // The summary changes with the status and the tokens used only; the
        // store reads the run's head (last seq, update time) from its newest span.
        if status_before != Some(state.status_code()) || state.usage != usage_before {
            staged.batch.put_run(&state.summary());
        }
        if state.usage != usage_before {
            staged.observed.push(observed::Observed::Tokens {
                model: state.spec.model.name(),
                input: (state.usage.prompt_tokens).saturating_sub(usage_before.prompt_tokens),
                output: (state.usage.completion_tokens)
                    .saturating_sub(usage_before.completion_tokens),
            });
        }
        if state.is_active() != was_active {
            staged.batch.set_active(state.id, state.is_active());
        }
        Ok(())
    }

    /// The staged batch is durable (its events got `positions`): now act.
    pub(super) fn act(&self, state: &mut RunState, staged: Staged, positions: &[u64]) {
        state.committed(staged.first_seq, positions);
        for (reservation, task, started) in staged.handoffs {
            reservation.deliver(&self.inner.dispatcher, task, started);
        }
        for task in staged.offers {
            self.inner.dispatcher.offer(task);
        }
        if staged.timers_changed {
            self.durable_timers_changed();
        }
        observed::count(self.inner.settings.metrics.families(), staged.observed);
        if let Some(tracer) = &self.inner.settings.tracer {
            for span in staged.spans {
                tracer.emit(span);
            }
        }
        self.inner.reads.publish(state.id, state.last_seq);
    }

    /// Folds the queued events into `state` and the batch, queueing the
    /// engine's follow-ups until there are none.
    pub(super) fn fold(&self, state: &mut RunState, staged: &mut Staged) -> Result<(), Error> {
        while let Some(event) = staged.queue.pop_front() {
            if staged.batch.events().len() >= MAX_EVENTS_PER_BATCH {
                return Err(Error::Internal(format!(
                    "run {} produced more than {MAX_EVENTS_PER_BATCH} events for one input",
                    state.id
                )));
            }
            let record = self.record(state.id, state.last_seq + 1, event, staged.now)?;
            observed::observe(state, &record, &mut staged.observed);
            if let Some(tracer) = &self.inner.settings.tracer {
                staged.spans.extend(traced::span(tracer, state, &record));
            }
            let actions = state.apply(&record)?;
            staged.batch.push_event(record);
            self.route(state, actions, staged);
        }
        Ok(())
    }

    /// Starts a ready tool call for a poll waiting on its queue, if there is
    /// one; otherwise leaves it to be offered after the commit.
    pub(super) fn start_for_waiting_poll(
        &self,
        state: &RunState,
        task: TaskRef,
        staged: &mut Staged,
    ) {
        let call = match task.key {
            QueueKey::Tool(_) => state.startable(&task.call_id, staged.now),
            QueueKey::Model(_) | QueueKey::BuiltinModel => None,
        };
        let reserved =
            call.and_then(|call| Some((call, self.inner.dispatcher.reserve(&task.key)?)));
        let Some((call, reservation)) = reserved else {
            staged.offers.push(task);
            return;
        };
        let event = state
            .decide_tool_start(&call.call_id, &reservation.worker, staged.now)
            .expect("startable");
        let started = self.tool_attempt(state, call, call.attempt + 1, &reservation.worker);
        staged.queue.push_back(event);
        staged.handoffs.push((reservation, task, started));
    }

    pub(super) fn record(
        &self,
        run: RunId,
        seq: u64,
        event: NewEvent,
        now: i64,
    ) -> Result<EventRecord, Error> {
        let data_json = canonical_json(&event.data);
        if data_json.len() > MAX_EVENT_BYTES {
            return Err(Error::PayloadTooLarge {
                field: format!("data of the {} event", event.event_type),
                size: data_json.len(),
                limit: MAX_EVENT_BYTES,
            });
        }
        Ok(EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            position: 0,
            id: uuid::Uuid::now_v7().as_bytes().to_vec(),
            event_type: event.event_type,
            data_json,
            time_ms: now,
            actor_kind: event.actor.kind(),
            actor_name: event.actor.name().to_string(),
            actor_principal: event.actor.principal().to_string(),
        })
    }

    /// Sorts the fold's actions: follow-up events, index writes for this
    /// batch, and calls to offer to workers after the commit.
    pub(super) fn route(&self, state: &RunState, actions: Vec<Action>, staged: &mut Staged) {
        for action in actions {
            match action {
                Action::Emit(event) => staged.queue.push_back(event),
                Action::ArmTimer { due_ms, name } => {
                    staged.batch.put_timer(due_ms, state.id, &name);
                    staged.timers_changed = true;
                }
                Action::CancelTimer { due_ms, name } => {
                    staged.batch.delete_timer(due_ms, state.id, &name);
                    staged.timers_changed = true;
                }
                Action::ApprovalPending { call_id } => {
                    if let Some(call) = state.call(&call_id) {
                        staged.batch.put_approval(&approval_record(state, call));
                    }
                }
                Action::ApprovalResolved { call_id } => {
                    staged.batch.delete_approval(state.id, &call_id)
                }
                Action::Review { call_id } => {
                    // One budget for every CEL expression this review
                    // evaluates: the policy's rules and the grants' conditions.
                    let budget = crate::policy::Budget::new();
                    let (verdict, sha256) = self.verdict(state, &call_id, staged.now, &budget);
                    // A standing grant may stand in for the person the
                    // call would wait for; its use commits with the grant.
                    let granted = self.take_grant(state, &call_id, &verdict, staged.now, &budget);
                    let stamp = granted.as_ref().map(|(stamp, _)| stamp);
                    let follow = state.review(&call_id, &verdict, &sha256, stamp, staged.now);
                    if let Some((stamp, used)) = granted {
                        tracing::info!(grant = %stamp.id, run = %state.id, call = %call_id, "call granted by a standing grant");
                        staged.batch.use_grant(used);
                    }
                    self.route(state, follow, staged);
                }
                dispatch => staged
                    .offers
                    .extend(TaskRef::for_action(state.id, dispatch)),
            }
        }
    }

    /// What the approval policy says of a requested call, and the
    /// policy's sha256 (`NoMatch` and "" without a policy). Evaluated
    /// only here, as the call is requested: its outcome is recorded, and a
    /// replay reads the record.
    pub(super) fn verdict(
        &self,
        state: &RunState,
        call_id: &str,
        now: i64,
        budget: &Arc<crate::policy::Budget>,
    ) -> (Verdict, String) {
        let policy = self.inner.settings.policy.as_ref().map(|p| p.current());
        let (Some(policy), Some(call)) = (policy, state.call(call_id)) else {
            return (Verdict::NoMatch, String::new());
        };
        let facts = CallFacts {
            tool: &call.name,
            arguments: &call.arguments,
            labels: &state.spec.labels,
            task: &state.spec.task,
            started_by: &state.started_by,
            now_ms: now,
        };
        (policy.evaluate(&facts, budget), policy.sha256.clone())
    }

    /// Offers the dispatch actions' calls to workers.
    pub(super) fn offer_all(&self, run: RunId, actions: Vec<Action>) {
        for action in actions {
            if let Some(task) = TaskRef::for_action(run, action) {
                self.inner.dispatcher.offer(task);
            }
        }
    }

    // ---- RunService ----
}

/// The index entry of a pending approval.
pub(super) fn approval_record(state: &RunState, call: &state::Call) -> ApprovalRecord {
    let timeout_due = call.approval_timer_ms;
    let expires_ms = match (timeout_due, state.spec.deadline_at_ms) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(0),
    };
    ApprovalRecord {
        run_id: state.id.as_bytes().to_vec(),
        call_id: call.call_id.clone(),
        tool: call.name.clone(),
        arguments_json: canonical_json(&call.arguments),
        arguments_sha256: sha256_hex(&call.arguments),
        requested_ms: call.requested_ms,
        expires_ms,
        labels: state.spec.labels.clone(),
        seq: call.approval_seq,
        task: state.spec.task.clone(),
        // Set by the store when the batch holds the request; a later
        // update (a vote) keeps the one it got.
        position: call.approval_position,
        approvals_required: call.approvals_required,
        votes: call
            .votes
            .iter()
            .map(|v| crate::domain::VoteRecord {
                approver: v.approver.clone(),
                time_ms: v.time_ms,
                comment: v.comment.clone(),
            })
            .collect(),
        edited_from: call.edited_from.clone(),
        approvers: call.approvers.clone(),
    }
}
