//! Starting and cancelling runs: StartRun's tools and model resolved, a
//! request id answered once.

use super::*;

impl Engine {
    /// A run's built-in model, checked against the server's providers: the
    /// provider and model filled in, and the attempts its policy allows.
    pub(super) fn resolve_model(&self, model: ModelChoice) -> Result<ModelChoice, Error> {
        let ModelChoice::Openai(mut choice) = model else {
            return Ok(model);
        };
        let models = self.inner.settings.models.as_deref().ok_or_else(|| {
            Error::invalid(
                "model.openai",
                "this server has no model providers: start it with --models FILE (see docs/models.md)",
            )
        })?;
        let provider = models
            .provider(&choice.provider)
            .map_err(|message| Error::invalid("model.openai.provider", message))?;
        choice.provider = provider.name.clone();
        if choice.model.is_empty() {
            choice.model = provider.default_model.clone();
        }
        if choice.model.is_empty() {
            return Err(Error::invalid(
                "model.openai.model",
                format!(
                    "required: provider '{}' has no default_model",
                    provider.name
                ),
            ));
        }
        choice.max_attempts = provider.retry.max_attempts;
        Ok(ModelChoice::Openai(choice))
    }

    /// Starts a run, or returns the one an earlier call with the same
    /// request_id started (see [`requests`]). Returns (run, created).
    pub async fn start_run(&self, start: StartRun, actor: Actor) -> Result<(RunId, bool), Error> {
        if start.request_id.is_empty() {
            return Ok((self.start_new_run(start, actor).await?, true));
        }
        let scope = request_scope(b"start", &start.principal);
        let request_id = start.request_id.clone();
        let engine = self.clone();
        let work = async move { Ok((engine.start_new_run(start, actor).await?, true)) };
        let recorded = |bytes: &[u8]| match RunId::from_slice(bytes) {
            Some(run) => Ok((run, false)),
            None => Err(Error::Internal("bad idempotency record".into())),
        };
        // A start always makes a run: never "already".
        let (answer, from_record) = self
            .once(scope, request_id, recorded, |_| false, work)
            .await?;
        if from_record {
            self.act_again_soon(answer.0);
        }
        Ok(answer)
    }

    /// Starts a run; with a request id, its commit records the run as the
    /// request's answer.
    pub(super) async fn start_new_run(
        &self,
        start: StartRun,
        actor: Actor,
    ) -> Result<RunId, Error> {
        let tools = self.resolve_tools(&start.tools).await?;
        let model = self.resolve_model(start.model)?;
        let now = self.now_ms();
        let deadline_at_ms = (start.budget.deadline_s > 0.0)
            .then(|| crate::seconds::after_ms(now, start.budget.deadline_s));
        let facts = Arc::new(RunFacts {
            labels: start.labels.clone(),
            task: start.task.clone(),
        });
        let started = RunStarted {
            task: start.task,
            system: start.system,
            model,
            tools,
            budget: start.budget,
            labels: start.labels,
            deadline_at_ms,
            traceparent: start.traceparent,
        };
        // A run with a request id lives in the id's shard, whose owner alone
        // checks the id (see `domain::request_shard`).
        let run = match start.request_id.is_empty() {
            true => RunId::new_in(&self.inner.shards),
            false => Some(RunId::new_in_shard(crate::domain::request_shard(
                &start.principal,
                &start.request_id,
            ))),
        };
        let run = run.ok_or_else(|| {
            Error::OwnershipLost("this server owns no shard of the runs now".into())
        })?;
        self.serves(run)?;
        let guard = self.lock_run(run).await;
        let record = self.record(
            run,
            1,
            NewEvent::engine(RUN_STARTED, started).by(actor),
            now,
        )?;
        let (state, actions) = RunState::start(run, &record)?;
        let mut batch = WriteBatch::default();
        batch.push_event(record);
        if !start.request_id.is_empty() {
            let scope = request_scope(b"start", &start.principal);
            batch.put_request(&scope, &start.request_id, run.as_bytes().to_vec());
        }
        self.commit_detached(guard, state, Vec::new(), batch, actions)
            .await?;
        self.inner.reads.remember(run, facts);
        Ok(run)
    }

    pub(super) async fn resolve_tools(&self, refs: &[ToolRef]) -> Result<Vec<ToolSpec>, Error> {
        let mut specs: Vec<ToolSpec> = Vec::with_capacity(refs.len());
        for (i, tool) in refs.iter().enumerate() {
            let field = format!("tools[{i}].name");
            if specs.iter().any(|s| s.name == tool.name) {
                return Err(Error::invalid(
                    &field,
                    format!("tool '{}' is listed twice", tool.name),
                ));
            }
            let bytes = self.inner.store.tool(&tool.name).await?.ok_or_else(|| {
                Error::ToolNotRegistered {
                    field,
                    name: tool.name.clone(),
                }
            })?;
            let mut spec: ToolSpec = serde_json::from_slice(&bytes)
                .map_err(|e| Error::Internal(format!("stored tool {}: {e}", tool.name)))?;
            // A run may tighten its tools' gates, never loosen them (the
            // same rule as a registration's, see `gate`): StartRun is open
            // to every runner.
            let requires = spec.requires_approval || tool.requires_approval;
            let required = spec.approvals_required.max(tool.approvals_required);
            let timeout = match tool.approval_timeout_s {
                t if t > 0.0 => t,
                _ => spec.approval_timeout_s,
            };
            let stored = spec.gate();
            let asked = super::gate::Gate {
                requires_approval: requires,
                approvals_required: required,
                approval_timeout_s: timeout,
                ..stored
            };
            if let Some(loosening) = asked.loosening_from(&stored) {
                return Err(Error::invalid(
                    &format!("tools[{i}].{}", loosening.field),
                    format!(
                        "{} (tool '{}'): a run may tighten a tool's gate, never loosen it; \
                         ask for no more than the tool's, or have an admin register the tool \
                         with the gate you need",
                        loosening.detail, tool.name
                    ),
                ));
            }
            spec.requires_approval = requires;
            spec.approvals_required = required;
            spec.approval_timeout_s = timeout;
            specs.push(spec);
        }
        Ok(specs)
    }

    /// CancelRun; returns the seq of aaa.run.cancelled (0 if already cancelled).
    pub async fn cancel_run(&self, run: RunId, reason: &str, actor: Actor) -> Result<u64, Error> {
        let (last, _) = self
            .update(run, |state, _| {
                let events = state.decide_cancel(reason, actor)?;
                let last = state.last_seq + events.len() as u64;
                let last = if events.is_empty() { 0 } else { last };
                Ok((events, last))
            })
            .await?;
        Ok(last)
    }

    // ---- WorkerService ----
}
