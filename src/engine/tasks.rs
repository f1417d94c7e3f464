//! Work handed to workers: tool registration (the gate only tightens),
//! worker identities, polls, attempts with their signed tokens, heartbeats
//! and results.

use super::*;

/// Refuses a caller other than the principal the task was handed to.
pub(super) fn check_holder(token: &Token, caller: &str) -> Result<(), Error> {
    if token.principal == caller {
        return Ok(());
    }
    Err(crate::auth::Refusal::NotTaskHolder {
        principal: caller.to_string(),
    }
    .into())
}

/// A task taken from its queue for one poll and not yet started: started
/// with [`Engine::start_held`], or put back in its queue when dropped (the
/// poll went away, or kept a task of another server).
pub struct Held {
    engine: Engine,
    delivery: Option<dispatch::Delivery>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(delivery) = self.delivery.take() {
            self.engine.inner.dispatcher.offer(delivery.into_offer());
        }
    }
}

impl Engine {
    /// The built-in model's result for an attempt it holds, recorded as the
    /// engine's.
    pub async fn report_builtin(&self, token: &str, report: Report) -> Result<(), Error> {
        let token = Token::decode(token, &self.inner.store.token_key())?;
        self.record_report(&token, &report, Actor::Engine).await?;
        let (run, call, attempt) = (token.run, &token.call_id, token.attempt);
        self.inner.leases.release(run, call, attempt);
        Ok(())
    }

    pub(super) fn heartbeat_timeout(&self, spec: Option<&ToolSpec>) -> Duration {
        match spec {
            Some(spec) if spec.heartbeat_timeout_s > 0.0 => {
                crate::seconds::duration(spec.heartbeat_timeout_s)
            }
            _ => self.inner.settings.default_heartbeat_timeout,
        }
    }

    // ---- run state: lock, cache, fold ----

    /// Stores tool definitions. A tool's gate only tightens unless
    /// `may_loosen` (an admin registers): a looser one is refused, naming
    /// the field (see [`gate`]), and nothing of the registration is stored.
    /// A changed gate records `by` (who registers) and when.
    pub async fn register_tools(
        &self,
        tools: Vec<ToolSpec>,
        by: &str,
        may_loosen: bool,
    ) -> Result<Vec<ToolSpec>, Error> {
        // A tool's check and the write it allows go together: registrations
        // of the same tool on this server wait for each other (locks taken
        // in stripe order, each once, so that they cannot deadlock).
        let mut stripes: Vec<usize> = tools
            .iter()
            .map(|tool| stripe(&(b"tool", &tool.name), RUN_LOCK_STRIPES))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for index in stripes {
            guards.push(self.inner.request_locks[index].lock().await);
        }
        let now = self.now_ms();
        let mut stored = Vec::with_capacity(tools.len());
        let mut batch = WriteBatch::default();
        for (i, mut tool) in tools.into_iter().enumerate() {
            let previous = match self.inner.store.tool(&tool.name).await? {
                Some(bytes) => Some(
                    serde_json::from_slice::<ToolSpec>(&bytes)
                        .map_err(|e| Error::Internal(format!("stored tool {}: {e}", tool.name)))?,
                ),
                None => None,
            };
            // The first declaration sets the gate; later ones may only
            // tighten it, unless an admin registers them.
            let old = previous.as_ref().map(ToolSpec::gate);
            let loosening = old.and_then(|old| tool.gate().loosening_from(&old));
            if let Some(loosening) = loosening.as_ref().filter(|_| !may_loosen) {
                return Err(Error::invalid(
                    &format!("tools[{i}].{}", loosening.field),
                    format!(
                        "{} (tool '{}'): a tool's gate only tightens unless an admin changes \
                         it; declare it at least as tight as it is, or have an admin \
                         principal (auth config) register the change",
                        loosening.detail, tool.name
                    ),
                ));
            }
            if tool.gate() == old.unwrap_or_else(gate::Gate::open) {
                tool.gate_changed = previous.as_ref().and_then(|p| p.gate_changed.clone());
            } else {
                let loosened = loosening.map(|l| l.field);
                tracing::info!(tool = %tool.name, by, loosened, "a tool's gate changed");
                tool.gate_changed = Some(GateChange {
                    by: by.to_string(),
                    at_ms: now,
                });
            }
            batch.put_tool(&tool.name, serde_json::to_vec(&tool).expect("serializes"));
            stored.push(tool);
        }
        self.inner.store.commit(batch).await?;
        drop(guards);
        Ok(stored)
    }

    /// Binds a worker identity to the principal that first uses it (auth
    /// on), so that no other principal can act or be recorded under it; the
    /// MCP gateway's identity is nobody else's, auth on or off.
    /// Bindings are durable and never change, so they are cached.
    pub async fn claim_identity(&self, worker: &WorkerId) -> Result<(), Error> {
        const SCOPE: &[u8] = b"identity";
        crate::domain::check::worker_identity("identity", &worker.identity)?;
        if worker.principal.is_empty() {
            return Ok(());
        }
        let cached = (self.inner.identities.lock().expect("poisoned"))
            .get(&worker.identity)
            .cloned();
        let owner = match cached {
            Some(owner) => owner,
            // The first principal to claim the identity owns it: a claim
            // is a request whose id is the identity (see [`requests`]).
            None => {
                let store = self.inner.store.clone();
                let (identity, principal) = (worker.identity.clone(), worker.principal.clone());
                let work = async move {
                    let mut batch = WriteBatch::default();
                    batch.put_request(SCOPE, &identity, principal.as_bytes().to_vec());
                    store.commit(batch).await?;
                    Ok(principal)
                };
                let recorded = |bytes: &[u8]| {
                    String::from_utf8(bytes.to_vec())
                        .map_err(|_| Error::Internal("bad identity record".into()))
                };
                let identity = worker.identity.clone();
                self.once(SCOPE.to_vec(), identity, recorded, |_| false, work)
                    .await?
                    .0
            }
        };
        self.inner
            .identities
            .lock()
            .expect("poisoned")
            .put(worker.identity.clone(), owner.clone());
        if owner != worker.principal {
            return Err(crate::auth::Refusal::IdentityTaken {
                identity: worker.identity.clone(),
            }
            .into());
        }
        Ok(())
    }

    /// Long poll for a task of the named tools and models.
    pub async fn poll_task(
        &self,
        worker: &WorkerId,
        keys: &[QueueKey],
        wait: Duration,
    ) -> Result<Option<Task>, Error> {
        let wait = wait.min(self.inner.settings.poll_wait_cap);
        let until = crate::seconds::instant_after(Instant::now(), wait);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let cancel = self.shutdown_token();
            let Some(held) = self
                .hold_task(Poller::Worker, worker, keys, left, cancel)
                .await
            else {
                return Ok(None);
            };
            if let Some(task) = self.start_held(held, worker).await? {
                return Ok(Some(task));
            }
        }
    }

    /// Takes a task from any of `keys` for `worker`, waiting up to `wait`
    /// (cut to the server's cap) or until `cancel` (a child of the engine's
    /// [`Engine::shutdown_token`]), and holds it without starting it: the
    /// first half of a poll, for a server that asks several owners and
    /// starts only the task it keeps (see `cluster::peers`).
    ///
    /// End the wait with `cancel` and await it, rather than dropping it: a
    /// commit may have started an attempt for this poll, which the
    /// cancelled wait still returns (see `dispatch::PendingTake::end`);
    /// dropped, the attempt goes back to a queue that may close unread.
    pub async fn hold_task(
        &self,
        poller: Poller,
        worker: &WorkerId,
        keys: &[QueueKey],
        wait: Duration,
        cancel: &CancellationToken,
    ) -> Option<Held> {
        let wait = wait.min(self.inner.settings.poll_wait_cap);
        let delivery = self
            .inner
            .dispatcher
            .take(poller, keys, worker, wait, cancel)
            .await?;
        Some(Held {
            engine: self.clone(),
            delivery: Some(delivery),
        })
    }

    /// Starts the held task's attempt for `worker`; `None` if its call no
    /// longer wants one (it was decided, cancelled or started meanwhile).
    pub async fn start_held(
        &self,
        mut held: Held,
        worker: &WorkerId,
    ) -> Result<Option<Task>, Error> {
        let Some(delivery) = held.delivery.take() else {
            return Ok(None);
        };
        // An attempt a commit already started for this poll.
        if let Some(started) = delivery.started {
            return Ok(Some(started));
        }
        let taken = dispatch::Taken::new(&self.inner.dispatcher, delivery.task);
        // On error the task goes back to its queue (`Taken` drops).
        let claimed = self.claim(taken.task().clone(), worker).await?;
        taken.done();
        Ok(claimed)
    }

    /// Offers again an attempt started for a poll that could not take it
    /// (another server's worker poll went away before the task arrived):
    /// the next poll of its queue gets the same attempt.
    pub fn hand_back(&self, task: Task) {
        let key = match task.work {
            Work::Tool { name, .. } => QueueKey::Tool(name),
            Work::Model { model, .. } => QueueKey::Model(model),
        };
        self.inner.dispatcher.offer(TaskRef {
            run: task.run,
            call_id: task.call_id,
            key,
            undelivered: Some(task.attempt),
        });
    }

    /// Turns a queued call into an attempt, if the run still wants it.
    pub(super) async fn claim(
        &self,
        task: TaskRef,
        worker: &WorkerId,
    ) -> Result<Option<Task>, Error> {
        let now = self.now_ms();
        match task.key {
            QueueKey::Tool(_) => {
                let claimed = self
                    .update(task.run, |state, _| {
                        let Some(call) = state.call(&task.call_id) else {
                            return Ok((Vec::new(), None));
                        };
                        let (events, attempt) =
                            match state.decide_tool_start(&task.call_id, worker, now) {
                                Some(event) => (vec![event], call.attempt + 1),
                                // Started for a poll that went away before
                                // it could answer: hand out the same attempt.
                                None if task.undelivered == Some(call.attempt)
                                    && !state.is_finished()
                                    && call.phase == state::Phase::Running =>
                                {
                                    (Vec::new(), call.attempt)
                                }
                                None => return Ok((Vec::new(), None)),
                            };
                        Ok((
                            events,
                            Some(self.tool_attempt(state, call, attempt, worker)),
                        ))
                    })
                    .await;
                match claimed {
                    Ok((claimed, _)) => Ok(claimed),
                    Err(e) if e.is_missing_run() => Ok(None),
                    Err(e) => Err(e),
                }
            }
            QueueKey::Model(_) | QueueKey::BuiltinModel => {
                let claimed = self
                    .read_run(task.run, |state| {
                        let pending = state.model_call.as_ref()?;
                        if state.is_finished() || pending.call_id != task.call_id {
                            return None;
                        }
                        let work = Work::Model {
                            model: state.spec.model.name(),
                            messages: state.messages().to_vec(),
                            tools: state.spec.tools.clone(),
                            spec: state.spec.model.clone(),
                        };
                        let span = crate::otel::context::chat_span(state.id, &pending.call_id);
                        let traceparent = state.trace().traceparent(span);
                        Some((
                            work,
                            pending.attempt,
                            state.spec.deadline_at_ms,
                            traceparent,
                        ))
                    })
                    .await;
                let (work, attempt, deadline, traceparent) = match claimed {
                    Ok(Some(claimed)) => claimed,
                    Ok(None) => return Ok(None),
                    Err(e) if e.is_missing_run() => return Ok(None),
                    Err(e) => return Err(e),
                };
                let timeout = self.inner.settings.default_heartbeat_timeout;
                // One holder per attempt: a second offer of the same attempt
                // finds it leased (unless a poll took it and went away
                // before it could hand it over).
                let leases = &self.inner.leases;
                let (run, call, holder) = (task.run, task.call_id.as_str(), &worker.identity);
                if task.undelivered == Some(attempt) {
                    leases.grant(run, call, attempt, holder, TaskKind::Model, timeout);
                } else if !leases.grant_if_free(
                    run,
                    call,
                    attempt,
                    holder,
                    TaskKind::Model,
                    timeout,
                ) {
                    return Ok(None);
                }
                self.inner.timers_changed.notify_one();
                let token = Token {
                    kind: TaskKind::Model,
                    run: task.run,
                    attempt,
                    principal: worker.principal.clone(),
                    call_id: task.call_id,
                };
                Ok(Some(self.task(token, timeout, deadline, work, traceparent)))
            }
        }
    }

    /// Attempt `attempt` of a tool call for `worker`. Leased before its
    /// commit: if the poll goes away mid-commit, the lease still runs out.
    pub(super) fn tool_attempt(
        &self,
        state: &RunState,
        call: &state::Call,
        attempt: u32,
        worker: &WorkerId,
    ) -> Task {
        let timeout = self.heartbeat_timeout(call.spec.as_ref());
        self.inner.leases.grant(
            state.id,
            &call.call_id,
            attempt,
            &worker.identity,
            TaskKind::Tool,
            timeout,
        );
        self.inner.timers_changed.notify_one();
        let work = Work::Tool {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        };
        let token = Token {
            kind: TaskKind::Tool,
            run: state.id,
            attempt,
            principal: worker.principal.clone(),
            call_id: call.call_id.clone(),
        };
        tracing::debug!(run = %state.id, call = %call.call_id, attempt, worker = %worker.identity, "attempt handed out");
        let span = crate::otel::context::attempt_span(state.id, &call.call_id, attempt);
        let traceparent = state.trace().traceparent(span);
        self.task(token, timeout, state.spec.deadline_at_ms, work, traceparent)
    }

    /// The task handed out for an attempt, with its signed token.
    pub(super) fn task(
        &self,
        token: Token,
        heartbeat_timeout: Duration,
        deadline_at_ms: Option<i64>,
        work: Work,
        traceparent: String,
    ) -> Task {
        Task {
            token: token.encode(&self.inner.store.token_key()),
            run: token.run,
            call_id: token.call_id,
            attempt: token.attempt,
            heartbeat_timeout,
            deadline_at_ms,
            work,
            traceparent,
        }
    }

    /// Renews the attempt's lease; answers whether the run wants it stopped.
    /// `caller` is the principal that sends it (empty with auth off).
    pub async fn heartbeat(&self, token: &str, caller: &str) -> Result<bool, Error> {
        let token = Token::decode(token, &self.inner.store.token_key())?;
        check_holder(&token, caller)?;
        let judged = self
            .read_run(token.run, |state| {
                if state.is_finished() {
                    return Ok(false);
                }
                match token.kind {
                    TaskKind::Tool => state
                        .check_tool_attempt(&token.call_id, token.attempt)
                        .map(|_| true),
                    TaskKind::Model => state
                        .check_model_attempt(&token.call_id, token.attempt)
                        .map(|_| true),
                }
            })
            .await?;
        let current = match judged {
            Err(refusal @ Error::StaleAttempt { .. }) => {
                let events = self
                    .inner
                    .store
                    .run_events(token.run, 0, usize::MAX)
                    .await?;
                return Err(self.confirmed(&token, &events, refusal));
            }
            judged => judged?,
        };
        if !current {
            return Ok(true);
        }
        if !self
            .inner
            .leases
            .renew(token.run, &token.call_id, token.attempt)
        {
            // The attempt is current but holds no lease (it expired this
            // very moment and its loss is being recorded): it is over.
            return Err(Error::StaleAttempt {
                call: token.call_id,
                attempt: token.attempt,
            });
        }
        Ok(false)
    }

    /// CompleteTask / FailTask. The event names the worker holding the
    /// attempt's lease (or the caller's identity when no lease is known) and
    /// the caller's principal, which must be the one the task was handed to.
    /// Answers true when the log holds this very result already (a retry
    /// after a lost answer); another result for a finished attempt stays
    /// refused.
    pub async fn report(
        &self,
        token: &str,
        report: Report,
        caller: &WorkerId,
    ) -> Result<bool, Error> {
        let token = Token::decode(token, &self.inner.store.token_key())?;
        check_holder(&token, &caller.principal)?;
        let holder = self.inner.leases.holder(token.run, &token.call_id);
        let actor = Actor::Worker(WorkerId {
            identity: holder.unwrap_or_else(|| caller.identity.clone()),
            principal: caller.principal.clone(),
        });
        let refusal = match self.record_report(&token, &report, actor).await {
            Ok(()) => {
                let (run, call, attempt) = (token.run, &token.call_id, token.attempt);
                self.inner.leases.release(run, call, attempt);
                return Ok(false);
            }
            Err(refusal @ (Error::StaleAttempt { .. } | Error::RunFinished(_))) => refusal,
            Err(other) => return Err(other),
        };
        let events = self
            .inner
            .store
            .run_events(token.run, 0, usize::MAX)
            .await?;
        match recorded::compare(&events, token.kind, &token.call_id, token.attempt, &report)? {
            recorded::Recorded::Same => {
                self.act_again_soon(token.run);
                Ok(true)
            }
            // The attempt's result that counts is another one, also when
            // the run has finished since.
            recorded::Recorded::Different => Err(Error::StaleAttempt {
                call: token.call_id,
                attempt: token.attempt,
            }),
            recorded::Recorded::Nothing => Err(self.confirmed(&token, &events, refusal)),
        }
    }

    /// A refusal of an attempt judged from this engine's view of the run
    /// (its cache), checked against the log: when the log says the attempt
    /// is current, another server wrote the run since, so this one lost
    /// the run's shard and has not noticed yet. It cannot judge the
    /// attempt, and must not drop a result that counts: the worker is told
    /// to try again (UNAVAILABLE), which reaches the owner. Its stale view
    /// of the run is dropped.
    fn confirmed(&self, token: &Token, events: &[EventRecord], refusal: Error) -> Error {
        let Ok(logged) = RunState::replay(token.run, events) else {
            return refusal;
        };
        let current = match token.kind {
            TaskKind::Tool => logged
                .check_tool_attempt(&token.call_id, token.attempt)
                .is_ok(),
            TaskKind::Model => logged
                .check_model_attempt(&token.call_id, token.attempt)
                .is_ok(),
        };
        if !current {
            return refusal;
        }
        self.inner.cache.lock().expect("poisoned").pop(&token.run);
        Error::OwnershipLost(format!(
            "run '{}' was written by another server since this one read it: this server no \
             longer owns the run's shard",
            token.run
        ))
    }

    pub(super) async fn record_report(
        &self,
        token: &Token,
        report: &Report,
        actor: Actor,
    ) -> Result<(), Error> {
        let report = report.clone();
        self.update(token.run, |state, _| {
            let event = match (token.kind, report) {
                (TaskKind::Tool, Report::ToolOutput(output)) => state.decide_tool_outcome(
                    &token.call_id,
                    token.attempt,
                    ToolOutcome::Output(output),
                    actor,
                )?,
                (TaskKind::Tool, Report::Failure { error, retryable }) => state
                    .decide_tool_outcome(
                        &token.call_id,
                        token.attempt,
                        ToolOutcome::Failure { error, retryable },
                        actor,
                    )?,
                (
                    TaskKind::Model,
                    Report::ModelReply {
                        content,
                        calls,
                        facts,
                    },
                ) => state.decide_model_reply(
                    &token.call_id,
                    token.attempt,
                    content,
                    calls,
                    facts,
                    actor,
                )?,
                (TaskKind::Model, Report::Failure { error, retryable }) => state
                    .decide_model_failure(&token.call_id, token.attempt, error, retryable, actor)?,
                (TaskKind::Tool, Report::ModelReply { .. }) => {
                    return Err(Error::invalid(
                        "reply",
                        "this task is a tool call: send output_json",
                    ))
                }
                (TaskKind::Model, Report::ToolOutput(_)) => {
                    return Err(Error::invalid(
                        "output_json",
                        "this task is a model call: send reply",
                    ))
                }
            };
            Ok((vec![event], ()))
        })
        .await?;
        Ok(())
    }

    // ---- timers and leases ----
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_principal_a_task_was_handed_to_holds_its_token() {
        let token = Token {
            kind: TaskKind::Tool,
            run: RunId::new(),
            attempt: 2,
            principal: "payments.worker".into(),
            call_id: "call".into(),
        };
        assert!(check_holder(&token, "payments.worker").is_ok());
        assert!(matches!(
            check_holder(&token, "other-worker"),
            Err(Error::Refused(_))
        ));
    }
}
