//! The runs of MCP sessions and the model that drives them.
//!
//! An MCP session's run is driven by the worker-served model
//! [`super::MODEL`], which only the gateway serves. The run asks its model
//! for a turn (`aaa.llm.requested`); the gateway holds that turn (keeping
//! its lease) until the session's next `tools/call`, and answers it with
//! exactly that call as the model's one proposed tool call. From there the
//! call is the engine's like any other: `aaa.tool.requested`, the policy,
//! the gate, `aaa.approval.requested`, the decision, an attempt served by
//! [`super::worker`], `aaa.tool.completed` or `aaa.tool.failed`. The
//! gateway follows the run's events and answers the MCP request with the
//! outcome. When the session ends, its held turn is answered with text and
//! no call, which completes the run; a turn of a run no session follows
//! (the session ended, or aaa restarted) is answered the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Gateway, MODEL};
use crate::domain::event::*;
use crate::engine::{Engine, Error, QueueKey, Report, StartRun, Task, ToolRef};
use crate::store::{EventRecord, RunId};

/// How long one poll for turns waits before polling again.
const POLL_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting `tools/call` tells its client it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Model turns one session's run may take: one per `tools/call`. A session
/// that makes more calls continues in a new run.
const MAX_CALLS_PER_RUN: u32 = 1_000;
/// What the model says when the session is over.
const SESSION_ENDED: &str = "The MCP session ended.";

/// The runs that sessions follow, by run.
#[derive(Default)]
pub struct Routes {
    links: tokio::sync::Mutex<HashMap<RunId, Arc<Link>>>,
}

/// Between a session and the gateway's model turns of its run.
#[derive(Default)]
struct Link {
    /// The turn the run waits on, held for the session's next call.
    turn: Mutex<Option<Task>>,
    arrived: Notify,
    /// The session is over: its held turn ends the run.
    closed: CancellationToken,
}

impl Link {
    /// Whether the held turn is `task`.
    fn holds(&self, task: &Task) -> bool {
        let turn = self.turn.lock().expect("poisoned");
        turn.as_ref().is_some_and(|t| t.token == task.token)
    }

    /// Takes the held turn if it is still `task`.
    fn take_if(&self, task: &Task) -> bool {
        let mut turn = self.turn.lock().expect("poisoned");
        if turn.as_ref().is_some_and(|t| t.token == task.token) {
            *turn = None;
            return true;
        }
        false
    }

    async fn next_turn(&self) -> Task {
        loop {
            if let Some(task) = self.turn.lock().expect("poisoned").take() {
                return task;
            }
            self.arrived.notified().await;
        }
    }
}

/// Takes the turns of the sessions' runs until the engine stops.
pub async fn serve_turns(gateway: Arc<Gateway>, engine: Engine) {
    let worker = super::worker::identity();
    let queue = [QueueKey::Model(MODEL.to_string())];
    let mut keepers = tokio::task::JoinSet::new();
    loop {
        while keepers.try_join_next().is_some() {}
        match engine.poll_task(&worker, &queue, POLL_WAIT).await {
            Ok(Some(task)) => {
                let link = gateway.sessions.links.lock().await.get(&task.run).cloned();
                match link.filter(|l| !l.closed.is_cancelled()) {
                    Some(link) => {
                        *link.turn.lock().expect("poisoned") = Some(task.clone());
                        link.arrived.notify_one();
                        keepers.spawn(keep_turn(gateway.clone(), engine.clone(), link, task));
                    }
                    None => {
                        keepers.spawn(end_run(gateway.clone(), engine.clone(), task));
                    }
                }
            }
            Ok(None) if engine.shutdown_token().is_cancelled() => break,
            Ok(None) => {}
            Err(Error::ShuttingDown) => break,
            Err(e) => {
                tracing::error!("mcp: taking a model turn failed: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = engine.shutdown_token().cancelled() => break,
                }
            }
        }
    }
    while keepers.join_next().await.is_some() {}
}

/// Keeps a held turn's lease until the session uses it, or ends the run
/// when the session is over.
async fn keep_turn(gateway: Arc<Gateway>, engine: Engine, link: Arc<Link>, task: Task) {
    let every = (task.heartbeat_timeout / 3).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {
                if !link.holds(&task) {
                    return;
                }
                match engine.heartbeat(&task.token, "").await {
                    Ok(false) => {}
                    Ok(true) | Err(_) => {
                        link.take_if(&task);
                        return;
                    }
                }
            }
            _ = link.closed.cancelled() => {
                if link.take_if(&task) {
                    end_run(gateway, engine, task).await;
                }
                return;
            }
            _ = engine.shutdown_token().cancelled() => return,
        }
    }
}

/// Answers a turn with text and no call: the run completes.
async fn end_run(gateway: Arc<Gateway>, engine: Engine, task: Task) {
    let reply = Report::ModelReply {
        content: SESSION_ENDED.into(),
        calls: Vec::new(),
        facts: Default::default(),
    };
    if let Err(e) = engine.report_builtin(&task.token, reply).await {
        tracing::debug!(run = %task.run, "mcp: ending the run of a closed session: {e}");
    }
    gateway.sessions.links.lock().await.remove(&task.run);
}

/// Who calls, as the run records it.
pub struct Caller {
    /// The authenticated principal (empty with auth off).
    pub principal: String,
    /// The MCP client's name (`clientInfo.name`), if it gave one.
    pub client: String,
}

/// Where progress goes while a call waits.
pub struct Progress {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

impl Progress {
    async fn say(&self, step: u32, message: String) {
        let mut param = ProgressNotificationParam::new(self.token.clone(), f64::from(step));
        param.message = Some(message);
        // A client that went away is seen when the call returns.
        let _ = self.peer.notify_progress(param).await;
    }
}

/// One MCP session: its run (started at the first call) and the link to
/// the gateway's turns of that run. Calls of one session take turns.
pub struct Session {
    gateway: Arc<Gateway>,
    current: tokio::sync::Mutex<Option<Current>>,
}

struct Current {
    run: RunId,
    link: Arc<Link>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(current) = self.current.get_mut().take() {
            current.link.closed.cancel();
        }
    }
}

/// What waiting for the run gave.
enum Waited {
    Turn(Task),
    Done(CallToolResult),
}

/// The answer to a `tools/call`.
pub enum Answer {
    /// The call's outcome.
    Result(CallToolResult),
    /// The call waits for a person: the client polls its task (with the
    /// time the call was requested).
    Task(TaskId, i64),
}

impl From<CallToolResult> for Answer {
    fn from(result: CallToolResult) -> Answer {
        Answer::Result(result)
    }
}

/// A call that an MCP client follows as a task (the tasks extension): the
/// run and the call the session proposed. Its outcome is read from the
/// run's events, so it outlives the session and aaa itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskId {
    pub run: RunId,
    pub call: String,
}

impl TaskId {
    const PREFIX: &'static str = "aaa-call:";

    /// `aaa-call:RUN:CALL`.
    pub fn parse(text: &str) -> Option<TaskId> {
        let (run, call) = text.strip_prefix(Self::PREFIX)?.split_once(':')?;
        let run = RunId::parse(run)?;
        crate::domain::check::name("call", call).ok()?;
        Some(TaskId {
            run,
            call: call.to_string(),
        })
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}:{}", Self::PREFIX, self.run, self.call)
    }
}

/// Follows one proposed call through its run's events (an approver's
/// edits included) to its outcome as an MCP result.
#[derive(Default)]
struct CallWatch {
    /// The proposed call, then the calls edits made of it.
    ours: Vec<String>,
    /// How long each of our approval requests could wait (ms), for an
    /// expiry's text.
    could_wait: HashMap<String, i64>,
    /// Our call whose approval request expired.
    expired: Option<String>,
}

/// What one event meant for the call a [`CallWatch`] follows.
enum Seen {
    Nothing,
    /// This call of ours waits for approval.
    AwaitsApproval(String),
    /// Its outcome (or the run's end before one).
    Done(CallToolResult),
}

impl CallWatch {
    fn of(call: &str) -> CallWatch {
        CallWatch {
            ours: vec![call.to_string()],
            ..CallWatch::default()
        }
    }

    fn see(&mut self, run: RunId, event: &EventRecord, typed: &Typed) -> Seen {
        let ours = |call: &String| self.ours.contains(call);
        match typed {
            Typed::ToolRequested(e) if !self.ours.is_empty() && ours(&e.edited_from) => {
                self.ours.push(e.call_id.clone())
            }
            Typed::ApprovalRequested(e) if ours(&e.call_id) => {
                if let Some(at) = e.expires_at_ms {
                    self.could_wait
                        .insert(e.call_id.clone(), at - event.time_ms);
                }
                return Seen::AwaitsApproval(e.call_id.clone());
            }
            Typed::ApprovalDenied(e) if ours(&e.call_id) && timed_out(event, e) => {
                self.expired = Some(e.call_id.clone())
            }
            Typed::ToolCompleted(e) if ours(&e.call_id) => {
                return Seen::Done(completed(e.output.clone(), call_meta(run, &e.call_id)));
            }
            Typed::ToolFailed(e) if ours(&e.call_id) => {
                let mut meta = call_meta(run, &e.call_id);
                let text = match self.expired.as_ref() == Some(&e.call_id) {
                    true => {
                        meta["aaa/error_type"] = Value::String("ApprovalExpired".into());
                        let could_wait = self.could_wait.get(&e.call_id).copied();
                        expired_text(could_wait, &e.error.message)
                    }
                    false => {
                        meta["aaa/error_type"] = Value::String(e.error.error_type.clone());
                        e.error.message.clone()
                    }
                };
                return Seen::Done(error_result(&text, meta));
            }
            _ if run_ended(typed) => return Seen::Done(ended_result(typed, run)),
            _ => {}
        }
        Seen::Nothing
    }
}

impl Session {
    pub fn new(gateway: Arc<Gateway>) -> Session {
        Session {
            gateway,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// One `tools/call`: a turn of the session's run proposing exactly
    /// this call, then its outcome as an MCP result. With `as_task` (the
    /// client takes tasks), a call that comes to wait for a person is
    /// answered at once with its task instead.
    pub async fn call(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Value,
        progress: Option<Progress>,
        as_task: bool,
    ) -> Answer {
        let Some(engine) = self.gateway.engine() else {
            return error_result(
                "aaa does not serve runs on this server now; try again shortly",
                json!({}),
            )
            .into();
        };
        let mut current = self.current.lock().await;
        // A run that ended (an approval expired, its deadline, a cancel)
        // takes no more calls: the session goes on in a new one.
        if let Some(c) = current.as_ref() {
            let finished = match engine.store().run(c.run).await {
                Ok(Some(record)) => record.status >= 3,
                Ok(None) => true,
                Err(e) => {
                    let text = format!("aaa cannot read the run: {e}");
                    return error_result(&text, json!({})).into();
                }
            };
            if finished {
                if let Some(old) = current.take() {
                    old.link.closed.cancel();
                }
            }
        }
        if current.is_none() {
            match self.start(&engine, caller, name).await {
                Ok(started) => *current = Some(started),
                Err(e) => {
                    let text = format!("aaa cannot start the session's run: {e}");
                    return error_result(&text, json!({})).into();
                }
            }
        }
        let Current { run, link } = current.as_ref().expect("set above");
        let (run, link) = (*run, link.clone());
        let meta = json!({"aaa/run_id": run.to_string()});
        let mut follower = Follower::new(&engine, run).await;
        let mut step = 0;
        // The run's turn (it may still be busy with an earlier call whose
        // client gave up waiting).
        let turn = loop {
            let waited = tokio::select! {
                task = link.next_turn() => Waited::Turn(task),
                ended = follower.finished(&engine) => Waited::Done(ended),
                _ = tokio::time::sleep(PROGRESS_EVERY) => {
                    step += 1;
                    if let Some(p) = &progress {
                        p.say(step, format!("waiting for run {run} to take the call")).await;
                    }
                    continue;
                }
            };
            match waited {
                Waited::Turn(task) => break task,
                Waited::Done(result) => {
                    current.take();
                    return result.into();
                }
            }
        };
        let from = follower.seen;
        let reply = Report::ModelReply {
            content: String::new(),
            calls: vec![ProposedCall {
                name: name.to_string(),
                arguments,
            }],
            facts: Default::default(),
        };
        if let Err(e) = engine.report_builtin(&turn.token, reply).await {
            return error_result(&format!("aaa cannot record the call: {e}"), meta).into();
        }
        let mut follower = Follower::at(&engine, run, from);
        let mut watch = CallWatch::default();
        let mut replied = false;
        let mut requested_ms = 0;
        loop {
            let event = tokio::select! {
                event = follower.next(&engine) => event,
                _ = tokio::time::sleep(PROGRESS_EVERY) => {
                    step += 1;
                    if let Some(p) = &progress {
                        p.say(step, waiting_text(run, &watch.ours)).await;
                    }
                    continue;
                }
            };
            let Some(event) = event else {
                return error_result("aaa stopped while the call waited", meta).into();
            };
            let Ok(typed) = Typed::decode(&event.event_type, &event.data_json) else {
                continue;
            };
            match &typed {
                // Our turn's reply, then the call it proposed.
                Typed::LlmCompleted(e) if e.call_id == turn.call_id => replied = true,
                Typed::ToolRequested(e) if replied && watch.ours.is_empty() => {
                    watch.ours.push(e.call_id.clone());
                    requested_ms = event.time_ms;
                    continue;
                }
                _ => {}
            }
            match watch.see(run, &event, &typed) {
                Seen::Nothing => {}
                Seen::AwaitsApproval(call) => {
                    if as_task {
                        let task = TaskId {
                            run,
                            call: watch.ours[0].clone(),
                        };
                        return Answer::Task(task, requested_ms);
                    }
                    step += 1;
                    if let Some(p) = &progress {
                        p.say(
                            step,
                            format!("call {call} of run {run} waits for approval (aaa approvals)"),
                        )
                        .await;
                    }
                }
                Seen::Done(result) => {
                    if run_ended(&typed) {
                        current.take();
                    }
                    return result.into();
                }
            }
        }
    }

    /// Starts the session's run, its link routed before the run's first
    /// turn can be delivered.
    async fn start(&self, engine: &Engine, caller: &Caller, tool: &str) -> Result<Current, Error> {
        let mut labels = BTreeMap::new();
        labels.insert("mcp.client".to_string(), label(&caller.client));
        if !caller.principal.is_empty() {
            labels.insert("mcp.principal".to_string(), label(&caller.principal));
        }
        let client = match caller.client.as_str() {
            "" => "an MCP client",
            named => named,
        };
        let start = StartRun {
            task: format!("MCP session of {client}: first call {tool}"),
            system: String::new(),
            model: ModelChoice::Worker(MODEL.to_string()),
            tools: self
                .gateway
                .tools()
                .map(|t| ToolRef {
                    name: t.spec.name.clone(),
                    requires_approval: false,
                    approval_timeout_s: 0.0,
                    approvals_required: 0,
                })
                .collect(),
            budget: Budget {
                deadline_s: 0.0,
                max_model_calls: MAX_CALLS_PER_RUN,
                max_tokens: 0,
            },
            labels,
            request_id: String::new(),
            principal: caller.principal.clone(),
            traceparent: None,
        };
        let actor = match caller.principal.as_str() {
            "" => format!("mcp:{}", label(client)),
            principal => principal.to_string(),
        };
        let link = Arc::new(Link::default());
        let mut links = self.gateway.sessions.links.lock().await;
        let (run, _) = engine.start_run(start, Actor::Client(actor)).await?;
        links.insert(run, link.clone());
        Ok(Current { run, link })
    }
}

/// A label value: printable, at most 64 bytes.
fn label(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::domain::clip::prefix(&clean, 64).to_string()
}

fn waiting_text(run: RunId, ours: &[String]) -> String {
    match ours.last() {
        Some(call) => format!("call {call} of run {run} is waiting"),
        None => format!("run {run} is taking the call"),
    }
}

fn run_ended(typed: &Typed) -> bool {
    matches!(
        typed,
        Typed::RunFailed(_) | Typed::RunCancelled(_) | Typed::RunCompleted(_)
    )
}

/// Whether a denial is the engine's answer to an approval request whose
/// time passed: the engine denies nothing else without a policy rule.
fn timed_out(event: &EventRecord, denied: &ApprovalDenied) -> bool {
    const ENGINE: i32 = 1;
    event.actor_kind == ENGINE && denied.policy.is_none() && denied.approver.is_none()
}

/// What the model reads when nobody decided in time: an expiry, not a
/// person's refusal. `could_wait_ms`: from the request to its expiry.
fn expired_text(could_wait_ms: Option<i64>, reason: &str) -> String {
    let within = match could_wait_ms {
        Some(ms) => format!("within the approval timeout of {} s", ms as f64 / 1000.0),
        None => "in time".to_string(),
    };
    format!(
        "the approval request expired: nobody decided {within} (expiry reason: {reason}); the call was not run"
    )
}

fn call_meta(run: RunId, call: &str) -> Value {
    json!({"aaa/run_id": run.to_string(), "aaa/call_id": call})
}

/// The upstream's result as the worker recorded it.
fn completed(output: Value, meta: Value) -> CallToolResult {
    let mut result =
        serde_json::from_value::<CallToolResult>(output.clone()).unwrap_or_else(|_| {
            CallToolResult::success(vec![ContentBlock::text(canonical_json(&output))])
        });
    // Required from 2026-07-28 on; rmcp clears it for older revisions.
    result.result_type = Some(rmcp::model::ResultType::COMPLETE);
    result.meta = meta_object(meta);
    result
}

/// An MCP tool error (`isError`) whose text is the reason.
fn error_result(text: &str, meta: Value) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text.to_string())]);
    result.meta = meta_object(meta);
    result
}

fn meta_object(meta: Value) -> Option<rmcp::model::MetaObject> {
    match meta {
        Value::Object(map) if !map.is_empty() => Some(rmcp::model::MetaObject(map)),
        _ => None,
    }
}

/// The answer to a call whose run ended before the call did.
fn ended_result(event: &Typed, run: RunId) -> CallToolResult {
    let meta = json!({"aaa/run_id": run.to_string()});
    match event {
        Typed::RunFailed(e) => error_result(
            &format!("{}: {}", e.error.error_type, e.error.message),
            meta,
        ),
        Typed::RunCancelled(e) => {
            error_result(&format!("the run was cancelled: {}", e.reason), meta)
        }
        _ => error_result("the run ended before the call", meta),
    }
}

/// Reads a run's events as they become durable.
struct Follower {
    run: RunId,
    seen: u64,
    head: tokio::sync::watch::Receiver<u64>,
    buffered: VecDeque<EventRecord>,
    read_once: bool,
}

impl Follower {
    /// From the run's head now.
    async fn new(engine: &Engine, run: RunId) -> Follower {
        let head = engine.reads().follow(run);
        let seen = match engine.store().run(run).await {
            Ok(Some(record)) => record.last_seq,
            _ => 0,
        };
        Follower {
            run,
            seen,
            head,
            buffered: VecDeque::new(),
            read_once: false,
        }
    }

    /// From the events after `seq`.
    fn at(engine: &Engine, run: RunId, seq: u64) -> Follower {
        Follower {
            run,
            seen: seq,
            head: engine.reads().follow(run),
            buffered: VecDeque::new(),
            read_once: false,
        }
    }

    /// The next event; `None` when the engine stops.
    async fn next(&mut self, engine: &Engine) -> Option<EventRecord> {
        loop {
            if let Some(event) = self.buffered.pop_front() {
                return Some(event);
            }
            let head = *self.head.borrow_and_update();
            if head > self.seen || !self.read_once {
                self.read_once = true;
                match engine.store().run_events(self.run, self.seen, 256).await {
                    Ok(events) => {
                        if let Some(last) = events.last() {
                            self.seen = last.seq;
                        }
                        let more = events.len() == 256;
                        self.buffered.extend(events);
                        if more {
                            self.read_once = false;
                        }
                        continue;
                    }
                    Err(_) => return None,
                }
            }
            tokio::select! {
                changed = self.head.changed() => if changed.is_err() { return None },
                _ = engine.shutdown_token().cancelled() => return None,
            }
        }
    }

    /// Waits until the run ends; the answer to a call made meanwhile.
    async fn finished(&mut self, engine: &Engine) -> CallToolResult {
        loop {
            let Some(event) = self.next(engine).await else {
                return error_result("aaa stopped while the call waited", json!({}));
            };
            if let Ok(
                typed @ (Typed::RunFailed(_) | Typed::RunCancelled(_) | Typed::RunCompleted(_)),
            ) = Typed::decode(&event.event_type, &event.data_json)
            {
                return ended_result(&typed, self.run);
            }
        }
    }
}

/// Where a task's call is, as its run's events tell.
pub enum TaskState {
    /// Waiting (for a person, or for its attempt): what it waits for.
    Working { message: String, updated_ms: i64 },
    /// The call's outcome as its MCP result.
    Done {
        result: CallToolResult,
        updated_ms: i64,
    },
}

/// A task's call and its state, read from its run's events (so it
/// answers after the session ended and after aaa restarted). `None`: the
/// run has no such call; else also when the call was requested.
pub async fn task_state(engine: &Engine, task: &TaskId) -> Result<Option<(TaskState, i64)>, Error> {
    let mut watch = CallWatch::of(&task.call);
    let mut requested_ms = None;
    let mut state = TaskState::Working {
        message: format!("call {} of run {} is taking its turn", task.call, task.run),
        updated_ms: 0,
    };
    let mut after = 0;
    loop {
        let events = engine.store().run_events(task.run, after, 256).await?;
        let Some(last) = events.last() else { break };
        after = last.seq;
        for event in &events {
            let Ok(typed) = Typed::decode(&event.event_type, &event.data_json) else {
                continue;
            };
            if let Typed::ToolRequested(e) = &typed {
                if e.call_id == task.call {
                    requested_ms = Some(event.time_ms);
                }
            }
            if requested_ms.is_none() {
                continue;
            }
            match watch.see(task.run, event, &typed) {
                Seen::Nothing => {}
                Seen::AwaitsApproval(call) => {
                    state = TaskState::Working {
                        message: format!(
                            "call {call} of run {} waits for approval (aaa approvals)",
                            task.run
                        ),
                        updated_ms: event.time_ms,
                    }
                }
                Seen::Done(result) => {
                    let state = TaskState::Done {
                        result,
                        updated_ms: event.time_ms,
                    };
                    return Ok(requested_ms.map(|at| (state, at)));
                }
            }
        }
    }
    Ok(requested_ms.map(|at| (state, at)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_names_its_run_and_call() {
        let task = TaskId {
            run: RunId::new(),
            call: "call-3".into(),
        };
        let text = task.to_string();
        assert_eq!(text, format!("aaa-call:{}:call-3", task.run));
        assert_eq!(TaskId::parse(&text), Some(task));
        for bad in [
            "",
            "aaa-call:",
            "aaa-call:nope:call-1",
            "call-1",
            "aaa-call:x",
        ] {
            assert_eq!(TaskId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_expiry_reads_as_one() {
        assert_eq!(
            expired_text(Some(1500), "timeout"),
            "the approval request expired: nobody decided within the approval timeout of 1.5 s \
             (expiry reason: timeout); the call was not run"
        );
    }
}
