//! The engine: the tool loop, the approval gate, leases and timers.
//!
//! Each request for a run takes that run's lock, loads its state (from a
//! bounded cache, or by folding its events), asks the pure `decide_*`
//! functions what to append, folds the new events (which may emit engine
//! follow-ups), commits them with their index changes in one durable batch,
//! and only then acts: offers tasks to workers, wakes timers and followers.
//! A run that waits (for a human, say) holds no task and no lock; at most its
//! state sits in the cache until evicted.

mod decisions;
mod dispatch;
pub mod error;
mod facts;
mod gate;
pub mod grants;
mod heads;
mod leases;
mod observed;
mod reads;
mod recorded;
mod requests;
mod settings;
pub mod retention;
pub mod schema;
pub mod state;
mod traced;

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use decisions::{Batch, BatchItem, ItemOutcome, SignalAnswer};
use dispatch::{Dispatcher, Reservation, TaskRef};
pub use dispatch::{Poller, QueueKey};
pub use error::Error;
use crate::domain::event::*;
use crate::domain::token::{TaskKind, Token};
pub use facts::RunFacts;
use leases::Leases;
pub use reads::Reads;
pub use settings::Settings;
use requests::request_scope;
pub use state::Reviewer;
use state::{Action, Message, RunState, ToolOutcome};

use crate::policy::{CallFacts, Verdict};
use crate::store::{ApprovalRecord, EventRecord, RunId, Shards, SharedStore, WriteBatch};

/// Largest event data (JSON text) the engine appends. sled keeps pages up to
/// a quarter segment in its main file; see `Store::open`.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// Most events one input may cause (a guard against a runaway fold).
const MAX_EVENTS_PER_BATCH: usize = 4096;
const RUN_LOCK_STRIPES: usize = 1024;
/// When recording a lost attempt failed (the store refused the write), how
/// soon it is tried again.
const LOST_LEASE_RETRY: Duration = Duration::from_secs(1);
/// How often an engine that serves some of a cluster's shards reads the
/// standing grants other servers may have made or revoked.
const GRANTS_READ_EVERY: Duration = Duration::from_secs(1);

/// Wall time in Unix milliseconds, for what is not the engine's to time
/// (subscriptions, the bench); the engine reads its configured clock.
pub fn now_ms() -> i64 {
    crate::clock::Clock::system().now_ms()
}

/// A tool reference in StartRun, resolved against the registry.
#[derive(Debug, Clone)]
pub struct ToolRef {
    pub name: String,
    pub requires_approval: bool,
    pub approval_timeout_s: f64,
    /// Raises the tool's approvals_required for the run (0: keep it).
    pub approvals_required: u32,
}

/// StartRun, validated by the api.
#[derive(Debug, Clone)]
pub struct StartRun {
    pub task: String,
    pub system: String,
    pub model: ModelChoice,
    pub tools: Vec<ToolRef>,
    pub budget: Budget,
    pub labels: std::collections::BTreeMap<String, String>,
    pub request_id: String,
    /// The principal that asks (empty with auth off): request ids are its
    /// own, never shared with another principal's.
    pub principal: String,
    /// The caller's W3C trace context, checked (see [`crate::otel`]).
    pub traceparent: Option<String>,
}

/// A task handed to a worker.
#[derive(Debug, Clone)]
pub struct Task {
    pub token: String,
    pub run: RunId,
    pub call_id: String,
    pub attempt: u32,
    pub heartbeat_timeout: Duration,
    pub deadline_at_ms: Option<i64>,
    pub work: Work,
    /// The W3C trace context of the server's span of this attempt.
    pub traceparent: String,
}

#[derive(Debug, Clone)]
pub enum Work {
    Tool {
        name: String,
        arguments: Value,
    },
    Model {
        model: String,
        messages: Vec<Message>,
        tools: Vec<ToolSpec>,
        /// The run's model as it snapshotted it (the built-in model's
        /// provider and settings).
        spec: ModelChoice,
    },
}

/// What a worker reports for a task.
#[derive(Debug, Clone)]
pub enum Report {
    ToolOutput(Value),
    ModelReply {
        content: String,
        calls: Vec<ProposedCall>,
        /// Usage and the like, from built-in models.
        facts: ReplyFacts,
    },
    Failure {
        error: ErrorData,
        retryable: bool,
    },
}

/// Refuses a caller other than the principal the task was handed to.
fn check_holder(token: &Token, caller: &str) -> Result<(), Error> {
    if token.principal == caller {
        return Ok(());
    }
    Err(crate::auth::Refusal::NotTaskHolder {
        principal: caller.to_string(),
    }
    .into())
}

/// What one append collects on its way to the commit.
struct Staged {
    now: i64,
    /// seq of the batch's first event of this run.
    first_seq: u64,
    /// Events still to fold, in order.
    queue: VecDeque<NewEvent>,
    batch: WriteBatch,
    /// Calls to offer to workers once the batch is durable.
    offers: Vec<TaskRef>,
    /// Attempts started in the batch for polls already waiting, to hand over
    /// once it is durable.
    handoffs: Vec<(Reservation, TaskRef, Task)>,
    timers_changed: bool,
    /// What the batch means for the metrics, counted once it is durable.
    observed: Vec<observed::Observed>,
    /// The spans its events end, exported once it is durable.
    spans: Vec<opentelemetry_sdk::trace::SpanData>,
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

/// Handle to the engine. Cheap to clone.
/// Worker identities whose owner is kept in memory.
const IDENTITIES_CACHED: usize = 4096;

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    settings: Settings,
    /// Tasks that hold the engine beyond a request (timers, the built-in
    /// model): [`Engine::stopped`] awaits them, so that no engine handle,
    /// and no open store, outlives the server.
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    run_locks: Box<[Arc<tokio::sync::Mutex<()>>]>,
    request_locks: Box<[Arc<tokio::sync::Mutex<()>>]>,
    cache: Mutex<lru::LruCache<RunId, RunState>>,
    dispatcher: Dispatcher,
    leases: Leases,
    /// The store, run heads, facts and the stop signal, as the api's
    /// reads see them.
    reads: Reads,
    /// Worker identities and the principals they belong to (auth on).
    identities: Mutex<lru::LruCache<String, String>>,
    timers_changed: Notify,
    /// Set when durable timers were armed or cancelled: the timer loop reads
    /// the earliest one again (not at every lease change, which on a
    /// database would be a query per attempt).
    durable_timers_changed: std::sync::atomic::AtomicBool,
    /// The standing grants, and their uses (see [`grants`]).
    grants: grants::Grants,
    /// The shards whose runs this engine serves: all of them, unless the
    /// server is one of a cluster's that share them out. Fixed for the
    /// engine's life; another set is another engine (see `Engine::close`).
    shards: Shards,
    /// Held (read) by each commit of a run's events; `close` takes it and
    /// turns it false, so that no commit of this engine follows its close.
    open: tokio::sync::RwLock<bool>,
}

/// Which of `stripes` locks guards `key`. DefaultHasher::new() has fixed
/// keys, so the same key maps to the same stripe on every thread.
fn stripe(key: &impl std::hash::Hash, stripes: usize) -> usize {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % stripes as u64) as usize
}

fn locks(n: usize) -> Box<[Arc<tokio::sync::Mutex<()>>]> {
    (0..n)
        .map(|_| Arc::new(tokio::sync::Mutex::new(())))
        .collect()
}

impl Engine {
    /// Starts the engine on an open store: recovers in-flight work and starts
    /// the timer task. Everything stops when `shutdown` fires.
    /// It serves the runs of `shards` only (see `Inner::shards`).
    pub async fn start(
        store: SharedStore,
        settings: Settings,
        shards: Shards,
        shutdown: CancellationToken,
    ) -> Result<Engine, Error> {
        let cache_size = NonZeroUsize::new(settings.run_cache_size.max(1)).expect("non-zero");
        let leases = Leases::new(settings.clock.clone());
        let reads = Reads::new(store.clone(), shutdown);
        let engine = Engine {
            inner: Arc::new(Inner {
                store,
                settings,
                background: Mutex::new(Vec::new()),
                run_locks: locks(RUN_LOCK_STRIPES),
                request_locks: locks(RUN_LOCK_STRIPES),
                cache: Mutex::new(lru::LruCache::new(cache_size)),
                dispatcher: Dispatcher::default(),
                leases,
                reads,
                identities: Mutex::new(lru::LruCache::new(
                    NonZeroUsize::new(IDENTITIES_CACHED).expect("non-zero"),
                )),
                timers_changed: Notify::new(),
                durable_timers_changed: std::sync::atomic::AtomicBool::new(true),
                grants: grants::Grants::default(),
                shards,
                open: tokio::sync::RwLock::new(true),
            }),
        };
        // Before any call is reviewed; a standby loads them as it takes over.
        engine.inner.grants.load(&engine.inner.store).await?;
        let metrics = &engine.inner.settings.metrics;
        // Only the owner of the runs has an engine, so only it reports
        // what waits (on a shared database the counts are the database's).
        metrics.refresh_from(Arc::downgrade(&engine.inner), |inner, metrics| async move {
            let families = metrics.families();
            inner.dispatcher.observe(families);
            match inner.store.waiting(&inner.shards).await {
                Ok(waiting) => observed::waiting(families, waiting, inner.settings.clock.now_ms()),
                Err(e) => tracing::warn!("metrics: cannot count what waits: {e}"),
            }
        });
        engine.recover().await?;
        engine.spawn_background(engine.clone().run_timers());
        engine.spawn_background(engine.clone().run_retention());
        if !shards.is_all() {
            // Other servers create and revoke grants too; the store refuses
            // a use of a grant revoked or used up there (see
            // `store::postgres::grant_uses`), and this keeps the copy fresh.
            engine.spawn_background(engine.clone().follow_grants());
        }
        Ok(engine)
    }

    /// Runs `task` until it ends; it must end soon after the engine's
    /// shutdown token fires. [`Engine::stopped`] waits for it.
    pub fn spawn_background(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        self.inner.background.lock().expect("poisoned").push(handle);
    }

    /// Waits for the background tasks, once the shutdown token has fired.
    pub async fn stopped(&self) {
        let tasks = std::mem::take(&mut *self.inner.background.lock().expect("poisoned"));
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Reads the standing grants again every [`GRANTS_READ_EVERY`] until
    /// the engine stops.
    async fn follow_grants(self) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(GRANTS_READ_EVERY) => self.reload_grants().await,
                () = self.shutdown_token().cancelled() => return,
            }
        }
    }

    /// Stops this engine for good, before another takes its shards (or
    /// some of them) over in this process: its background tasks and polls
    /// end, commits already under way finish, and no commit follows.
    /// `shutdown` must be this engine's own token (a child of the
    /// server's); it is cancelled here.
    pub async fn close(&self) {
        self.shutdown_token().cancel();
        *self.inner.open.write().await = false;
        self.stopped().await;
    }

    /// The longest a poll waits.
    pub fn poll_wait_cap(&self) -> Duration {
        self.inner.settings.poll_wait_cap
    }

    /// The shards whose runs this engine serves.
    pub fn shards(&self) -> Shards {
        self.inner.shards
    }

    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.settings.metrics
    }

    /// The engine's clock (see [`crate::clock`]).
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.inner.settings.clock
    }

    fn now_ms(&self) -> i64 {
        self.clock().now_ms()
    }

    pub fn shutdown_token(&self) -> &CancellationToken {
        self.inner.reads.shutdown_token()
    }

    /// What the api's reads use: the store, run heads, run facts.
    pub fn reads(&self) -> &Reads {
        &self.inner.reads
    }

    /// Re-offers the work of runs that were active when the server stopped,
    /// and gives their running attempts a fresh lease. A built-in model's
    /// attempt in flight died with the server that made it: it is recorded
    /// as lost and the call goes on as the next attempt, so no two attempts
    /// of one call are ever in flight.
    async fn recover(&self) -> Result<(), Error> {
        let now = self.now_ms();
        let mut lost = Vec::new();
        let mut reoffered = Vec::new();
        for run in self.inner.store.active_runs(&self.inner.shards).await? {
            let state = self.load(run).await?;
            if let Some(pending) = state.builtin_model_pending() {
                lost.push((run, pending.call_id.clone(), pending.attempt));
            }
            let served = state.served_model_pending();
            if let Some(pending) = served {
                reoffered.push((run, pending.call_id.clone(), pending.attempt));
            }
            for call in &state.calls {
                if call.phase == state::Phase::Running {
                    let timeout = self.heartbeat_timeout(call.spec.as_ref());
                    self.inner.leases.grant(
                        run,
                        &call.call_id,
                        call.attempt,
                        &call.worker,
                        TaskKind::Tool,
                        timeout,
                    );
                }
            }
            // A served model's call is offered by its request again, below.
            let mut actions = state.dispatchable(now);
            if served.is_some() {
                actions.retain(|a| !matches!(a, Action::DispatchModel { .. }));
            }
            self.offer_all(run, actions);
            self.cache_put(state);
        }
        for (run, call_id, attempt) in reoffered {
            self.update(run, |state, _| {
                Ok((vec![state.decide_model_reoffer(&call_id, attempt)?], ()))
            })
            .await?;
        }
        for (run, call_id, attempt) in lost {
            let error = ErrorData::new(
                "AttemptLost",
                format!("the server that made attempt {attempt} stopped before it was answered"),
            );
            self.update(run, |state, _| {
                let event =
                    state.decide_model_failure(&call_id, attempt, error, true, Actor::Engine)?;
                Ok((vec![event], ()))
            })
            .await?;
        }
        Ok(())
    }

    /// The built-in model's result for an attempt it holds, recorded as the
    /// engine's.
    pub async fn report_builtin(&self, token: &str, report: Report) -> Result<(), Error> {
        let token = Token::decode(token, &self.inner.store.token_key())?;
        self.record_report(&token, &report, Actor::Engine).await?;
        let (run, call, attempt) = (token.run, &token.call_id, token.attempt);
        self.inner.leases.release(run, call, attempt);
        Ok(())
    }

    /// A run's built-in model, checked against the server's providers: the
    /// provider and model filled in, and the attempts its policy allows.
    fn resolve_model(&self, model: ModelChoice) -> Result<ModelChoice, Error> {
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

    fn heartbeat_timeout(&self, spec: Option<&ToolSpec>) -> Duration {
        match spec {
            Some(spec) if spec.heartbeat_timeout_s > 0.0 => {
                crate::seconds::duration(spec.heartbeat_timeout_s)
            }
            _ => self.inner.settings.default_heartbeat_timeout,
        }
    }

    // ---- run state: lock, cache, fold ----

    async fn lock_run(&self, run: RunId) -> tokio::sync::OwnedMutexGuard<()> {
        self.inner.run_locks[stripe(&run, RUN_LOCK_STRIPES)]
            .clone()
            .lock_owned()
            .await
    }

    /// The run's state; the caller holds the run's lock and puts it back.
    async fn load(&self, run: RunId) -> Result<RunState, Error> {
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
    fn serves(&self, run: RunId) -> Result<(), Error> {
        match self.inner.shards.contains(run.shard()) {
            true => Ok(()),
            false => Err(Error::OwnershipLost(format!(
                "this server does not own the shard of run '{run}' now"
            ))),
        }
    }

    fn cache_put(&self, state: RunState) {
        self.inner
            .cache
            .lock()
            .expect("poisoned")
            .put(state.id, state);
    }

    /// Reads a run's state under its lock without changing it.
    async fn read_run<T>(&self, run: RunId, read: impl FnOnce(&RunState) -> T) -> Result<T, Error> {
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
    async fn update<T>(
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
    async fn commit_detached(
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
    async fn append(
        &self,
        state: &mut RunState,
        events: Vec<NewEvent>,
        batch: WriteBatch,
        actions: Vec<Action>,
    ) -> Result<(), Error> {
        let mut staged = self.stage(state, events, batch, actions)?;
        let batch = std::mem::take(&mut staged.batch);
        let positions = self.commit_with_grants(batch).await?;
        self.act(state, staged, &positions);
        Ok(())
    }

    /// Commits a batch; the standing grants it uses count for good once
    /// it is durable, and are given back if it is not.
    async fn commit_with_grants(&self, batch: WriteBatch) -> Result<Vec<u64>, Error> {
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
    fn stage(
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

    fn stage_into(
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
    fn act(&self, state: &mut RunState, staged: Staged, positions: &[u64]) {
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
    fn fold(&self, state: &mut RunState, staged: &mut Staged) -> Result<(), Error> {
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
    fn start_for_waiting_poll(&self, state: &RunState, task: TaskRef, staged: &mut Staged) {
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

    fn record(
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
    fn route(&self, state: &RunState, actions: Vec<Action>, staged: &mut Staged) {
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
    fn verdict(
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
    fn offer_all(&self, run: RunId, actions: Vec<Action>) {
        for action in actions {
            if let Some(task) = TaskRef::for_action(run, action) {
                self.inner.dispatcher.offer(task);
            }
        }
    }

    // ---- RunService ----

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
        self.once(scope, request_id, recorded, work).await
    }

    /// Starts a run; with a request id, its commit records the run as the
    /// request's answer.
    async fn start_new_run(&self, start: StartRun, actor: Actor) -> Result<RunId, Error> {
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

    async fn resolve_tools(&self, refs: &[ToolRef]) -> Result<Vec<ToolSpec>, Error> {
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
            spec.requires_approval |= tool.requires_approval;
            spec.approvals_required = spec.approvals_required.max(tool.approvals_required);
            if tool.approval_timeout_s > 0.0 {
                spec.approval_timeout_s = tool.approval_timeout_s;
            }
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
    /// on), so that no other principal can act or be recorded under it.
    /// Bindings are durable and never change, so they are cached.
    pub async fn claim_identity(&self, worker: &WorkerId) -> Result<(), Error> {
        const SCOPE: &[u8] = b"identity";
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
                self.once(SCOPE.to_vec(), worker.identity.clone(), recorded, work)
                    .await?
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
            undelivered: true,
        });
    }

    /// Turns a queued call into an attempt, if the run still wants it.
    async fn claim(&self, task: TaskRef, worker: &WorkerId) -> Result<Option<Task>, Error> {
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
                                None if task.undelivered
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
                if task.undelivered {
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
    fn tool_attempt(
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
    fn task(
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
        let current = self
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
            .await??;
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
            recorded::Recorded::Same => Ok(true),
            // The attempt's result that counts is another one, also when
            // the run has finished since.
            recorded::Recorded::Different => Err(Error::StaleAttempt {
                call: token.call_id,
                attempt: token.attempt,
            }),
            recorded::Recorded::Nothing => Err(refusal),
        }
    }

    async fn record_report(
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

    async fn run_timers(self) {
        let clock = self.clock().clone();
        let mut advances = clock.advances();
        let mut next_durable = None;
        loop {
            advances.mark_seen();
            let now = clock.now();
            let next_lease = self.inner.leases.next_expiry();
            // When reading timers failed, try again in a second.
            let mut retry = None;
            if self
                .inner
                .durable_timers_changed
                .swap(false, Ordering::AcqRel)
            {
                next_durable = match self.inner.store.next_timer(&self.inner.shards).await {
                    Ok(timer) => timer,
                    Err(e) => {
                        tracing::error!("reading timers failed: {e}");
                        self.inner
                            .durable_timers_changed
                            .store(true, Ordering::Release);
                        retry = Some(Duration::from_secs(1));
                        None
                    }
                };
            }
            let durable_wait = next_durable
                .as_ref()
                .map(|t| Duration::from_millis((t.due_ms - clock.now_ms()).max(0) as u64));
            let lease_wait = next_lease.map(|at| at.saturating_duration_since(now));
            let wait = [durable_wait, lease_wait, retry]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(Duration::from_secs(3600));
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = self.inner.timers_changed.notified() => continue,
                    _ = advances.next() => continue,
                    _ = self.shutdown_token().cancelled() => return,
                }
            }
            if self.shutdown_token().is_cancelled() {
                return;
            }
            for expired in self.inner.leases.take_expired() {
                self.lease_lost(expired).await;
            }
            if let Some(timer) = next_durable.take_if(|t| t.due_ms <= clock.now_ms()) {
                // Whatever happens, the next one is read again.
                self.inner
                    .durable_timers_changed
                    .store(true, Ordering::Release);
                if let Err(e) = self.fire_timer(timer.run, &timer.name, timer.due_ms).await {
                    tracing::error!(run = %timer.run, timer = %timer.name, "timer failed: {e}");
                    if matches!(e, Error::ShuttingDown) {
                        return;
                    }
                    // Do not spin on a timer that cannot fire.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Makes the timer loop read the earliest durable timer again.
    fn durable_timers_changed(&self) {
        self.inner
            .durable_timers_changed
            .store(true, Ordering::Release);
        self.inner.timers_changed.notify_one();
    }

    async fn fire_timer(&self, run: RunId, name: &str, due_ms: i64) -> Result<(), Error> {
        let now = self.now_ms();
        let result = self
            .update(run, |state, batch| {
                batch.delete_timer(due_ms, run, name);
                Ok((state.decide_timer(name, now), state.dispatchable(now)))
            })
            .await;
        match result {
            Ok((dispatchable, _)) => {
                self.offer_all(run, dispatchable);
                Ok(())
            }
            Err(e) if e.is_missing_run() => {
                // A timer of a run that does not exist: drop it.
                let mut batch = WriteBatch::default();
                batch.delete_timer(due_ms, run, name);
                self.inner.store.commit(batch).await?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn lease_lost(&self, lost: leases::Expired) {
        tracing::info!(run = %lost.run, call = %lost.call_id, attempt = lost.attempt, holder = %lost.worker, "lease lapsed: attempt lost");
        let error = ErrorData::new(
            "AttemptLost",
            format!(
                "attempt {} sent no heartbeat or result within its heartbeat timeout",
                lost.attempt
            ),
        );
        let result = self
            .update(lost.run, |state, _| {
                let event = match lost.kind {
                    TaskKind::Tool => state.decide_tool_outcome(
                        &lost.call_id,
                        lost.attempt,
                        ToolOutcome::Failure {
                            error,
                            retryable: true,
                        },
                        Actor::Engine,
                    ),
                    TaskKind::Model => state.decide_model_failure(
                        &lost.call_id,
                        lost.attempt,
                        error,
                        true,
                        Actor::Engine,
                    ),
                };
                match event {
                    Ok(event) => Ok((vec![event], ())),
                    // Already reported, or the run ended: nothing was lost.
                    Err(Error::StaleAttempt { .. } | Error::RunFinished(_)) => Ok((Vec::new(), ())),
                    Err(e) => Err(e),
                }
            })
            .await;
        if let Err(e) = result {
            tracing::error!(run = %lost.run, call = %lost.call_id, "recording a lost attempt failed: {e}");
            // The attempt is still running in the log: expire it again
            // soon, or it would wait for a result that never comes.
            self.inner.leases.grant(
                lost.run,
                &lost.call_id,
                lost.attempt,
                &lost.worker,
                lost.kind,
                LOST_LEASE_RETRY,
            );
        }
    }
}

/// The index entry of a pending approval.
fn approval_record(state: &RunState, call: &state::Call) -> ApprovalRecord {
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
