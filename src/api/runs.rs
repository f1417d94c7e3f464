//! RunService: start, read, follow, signal and cancel runs.

use std::pin::Pin;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{client_actor, convert, principal, status::to_status, unavailable, STREAM_BUFFER};
use crate::auth::{self, Principal, Refusal};
use crate::domain::check;
use crate::domain::event::{is_decision, is_reserved, RUN_CANCELLED, RUN_COMPLETED, RUN_FAILED};
use crate::engine::{Engine, Error, Reads, Reviewer};
use crate::proto::{self, run_service_server::RunService};
use crate::store::{EventRecord, RunId, RunQuery, RunRecord};

/// How long a runner waits for "no such run" (see `RunApi::check_owner`):
/// longer than finding it out takes either way, on either store, on a
/// busy machine. Only such answers wait; a run's owner never does.
const HIDDEN_FLOOR: std::time::Duration = std::time::Duration::from_millis(5);

const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 1000;
const READ_CHUNK: usize = 256;

/// Reads are answered from `reads` on any server; writes need the engine,
/// which only the server that owns the runs has (the others forward them).
pub struct RunApi {
    reads: Reads,
    engine: Option<Engine>,
    /// The last run a runner's check found, whose first event a miss
    /// reads (see `RunApi::check_owner`).
    decoy: std::sync::Mutex<Option<RunId>>,
}

type EventStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::StreamEventsResponse, Status>> + Send>>;

pub fn page_size(requested: u32) -> usize {
    let size = match requested {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    };
    size as usize
}

fn is_terminal(event_type: &str) -> bool {
    matches!(event_type, RUN_COMPLETED | RUN_FAILED | RUN_CANCELLED)
}

impl RunApi {
    /// The owner's: reads and writes, with its engine.
    pub fn serving(engine: Engine) -> RunApi {
        RunApi {
            reads: engine.reads().clone(),
            engine: Some(engine),
            decoy: Default::default(),
        }
    }

    /// Any other server's: reads only.
    pub fn reading(reads: Reads) -> RunApi {
        RunApi {
            reads,
            engine: None,
            decoy: Default::default(),
        }
    }

    /// The engine, for a write; a server without one forwards writes
    /// rather than call this.
    fn engine(&self) -> Result<&Engine, Status> {
        self.engine.as_ref().ok_or_else(super::not_serving)
    }

    /// The run as the API shows it, with the approvals it waits for.
    async fn run_with_approvals(
        &self,
        run: RunId,
        record: RunRecord,
    ) -> Result<proto::Run, Status> {
        let mut out = convert::run(record);
        out.pending_approvals = self
            .reads
            .store()
            .run_approvals(run)
            .await
            .map_err(|e| to_status(e.into()))?
            .into_iter()
            .map(convert::approval)
            .collect();
        Ok(out)
    }

    async fn known_run(&self, text: &str) -> Result<(RunId, RunRecord), Error> {
        let run = convert::run_id("run_id", text)?;
        match self.reads.store().run(run).await? {
            Some(record) => Ok((run, record)),
            None => Err(Error::missing_run(self.reads.store(), run).await),
        }
    }

    /// Runners read (`read`), signal and cancel only the runs they started.
    /// A caller that may not read every run hears of another's run exactly
    /// as of an unknown one, and at the same time: the same reads are made
    /// either way (the run's first event and its tombstone), and one more
    /// read makes it one hit and one miss either way: a miss reads and
    /// decodes the first event of the last run found (the decoy), a hit
    /// reads a fresh id of its shard. So what the reads leave behind
    /// (caches, and on PostgreSQL which reads went to the database) is
    /// alike too. The answer is held until [`HIDDEN_FLOOR`]
    /// after the check began, longer than either way takes.
    async fn check_owner(
        &self,
        principal: Option<&Principal>,
        run: RunId,
        read: bool,
    ) -> Result<(), Status> {
        let Some(principal) = principal else {
            return Ok(());
        };
        if principal.sees_every_run(read) {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        let store = self.reads.store();
        let first = store.event(run, 1).await.map_err(|e| to_status(e.into()))?;
        // The other read: a hit reads a miss (a fresh id of its shard), a
        // miss reads a hit (the decoy), so either way is one of each.
        let other = {
            let mut last_found = self.decoy.lock().expect("poisoned");
            if first.is_some() {
                *last_found = Some(run);
                Some(RunId::new_in_shard(run.shard()))
            } else {
                *last_found
            }
        };
        if let Some(other) = other {
            // What it says is not used.
            let _ = store.event(other, 1).await;
        }
        // The starter, if a client started the run.
        let starter = |e: &EventRecord| {
            (e.actor_kind == proto::ActorKind::Client as i32).then(|| e.actor_name.clone())
        };
        match first.as_ref().map(starter) {
            Some(None) => Ok(()),
            Some(Some(starter)) if starter == principal.name => Ok(()),
            Some(Some(_)) if principal.sees_every_run(true) => Err(Refusal::NotRunOwner {
                principal: principal.name.clone(),
                run: run.to_string(),
            }
            .into()),
            found => {
                let missing = Error::missing_run(store, run).await;
                tokio::time::sleep_until(started + HIDDEN_FLOOR).await;
                match found {
                    Some(_) => Err(Error::RunNotFound(run.to_string()).into()),
                    None => Err(missing.into()),
                }
            }
        }
    }
}

#[tonic::async_trait]
impl RunService for RunApi {
    async fn start_run(
        &self,
        request: Request<proto::StartRunRequest>,
    ) -> Result<Response<proto::StartRunResponse>, Status> {
        let actor = client_actor(&request);
        let principal = principal(&request).map_or_else(String::new, |p| p.name.clone());
        let traceparent = convert::traceparent(request.metadata());
        let mut start = convert::start_run(request.into_inner())?;
        start.principal = principal;
        start.traceparent = traceparent;
        let (run, created) = self.engine()?.start_run(start, actor).await?;
        Ok(Response::new(proto::StartRunResponse {
            run_id: run.to_string(),
            created,
        }))
    }

    async fn get_run(
        &self,
        request: Request<proto::GetRunRequest>,
    ) -> Result<Response<proto::GetRunResponse>, Status> {
        // The owner first: a runner hears of an unknown run as of another's.
        let run = convert::run_id("run_id", &request.get_ref().run_id)?;
        self.check_owner(principal(&request), run, true).await?;
        let (run, record) = self.known_run(&request.get_ref().run_id).await?;
        let out = self.run_with_approvals(run, record).await?;
        Ok(Response::new(proto::GetRunResponse { run: Some(out) }))
    }

    async fn list_runs(
        &self,
        request: Request<proto::ListRunsRequest>,
    ) -> Result<Response<proto::ListRunsResponse>, Status> {
        // A runner lists only the runs it started.
        let only_started_by = principal(&request)
            .filter(|p| !p.sees_every_run(true))
            .map(|p| p.name.clone());
        let request = request.into_inner();
        let before = match request.page_token.as_str() {
            "" => None,
            token => Some(
                RunId::parse(token)
                    .ok_or_else(|| Error::invalid("page_token", "not a token ListRuns returned"))?,
            ),
        };
        let limit = page_size(request.page_size);
        // One more than a page: whether there is a next page.
        let query = RunQuery {
            before,
            status: request.status,
            labels: request.labels.into_iter().collect(),
            started_by: only_started_by,
            limit: limit + 1,
        };
        let mut records = self
            .reads
            .store()
            .list_runs(&query)
            .await
            .map_err(|e| to_status(e.into()))?;
        let more = records.len() > limit;
        records.truncate(limit);
        let mut runs = Vec::with_capacity(records.len());
        for record in records {
            let run = RunId::from_slice(&record.run_id)
                .ok_or_else(|| Error::Internal("run record with a bad id".into()))?;
            runs.push(self.run_with_approvals(run, record).await?);
        }
        let next_page_token = match (more, runs.last()) {
            (true, Some(last)) => last.run_id.clone(),
            _ => String::new(),
        };
        Ok(Response::new(proto::ListRunsResponse {
            runs,
            next_page_token,
        }))
    }

    type StreamEventsStream = EventStream;

    async fn stream_events(
        &self,
        request: Request<proto::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let principal = principal(&request).cloned();
        let request = request.into_inner();
        let run = convert::run_id("run_id", &request.run_id)?;
        self.check_owner(principal.as_ref(), run, true).await?;
        // Subscribe, then read: no append is missed in between. Only when the
        // first read is empty is the run's summary needed, to tell an unknown
        // run or a cursor past the end from a run with nothing new yet.
        let head = self.reads.follow(run);
        let first = read_events(&self.reads, run, request.after_seq).await?;
        let mut ended = false;
        if first.is_empty() {
            let (_, record) = self.known_run(&request.run_id).await?;
            if request.after_seq > record.last_seq {
                return Err(Error::invalid(
                    "after_seq",
                    format!(
                        "run '{run}' has {} events; after_seq {} is past its end",
                        record.last_seq, request.after_seq
                    ),
                )
                .into());
            }
            ended = record.status >= proto::RunStatus::Completed as i32
                && record.last_seq == request.after_seq;
        }
        let start = Start { head, first, ended };
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let reads = self.reads.clone();
        tokio::spawn(async move {
            if let Err(status) = follow_events(&reads, run, request, start, &sender).await {
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn signal(
        &self,
        request: Request<proto::SignalRequest>,
    ) -> Result<Response<proto::SignalResponse>, Status> {
        let actor = client_actor(&request);
        let principal = principal(&request).cloned();
        let request = request.into_inner();
        // Which role a signal needs depends on its type, so the auth layer
        // lets runners and approvers through and the check is made here.
        if let Some(principal) = &principal {
            auth::authorize_signal(principal, &request.r#type)?;
        }
        let run = convert::run_id("run_id", &request.run_id)?;
        // An approver decides calls of any run (separation of duties is
        // checked with the decision, by the engine); other signals are the
        // starter's.
        if !is_decision(&request.r#type) {
            self.check_owner(principal.as_ref(), run, false).await?;
        }
        if request.r#type.is_empty() {
            return Err(Error::invalid("type", "required").into());
        }
        check::name("type", &request.r#type)?;
        if is_reserved(&request.r#type) {
            return Err(Error::ReservedEventType(request.r#type).into());
        }
        let data = convert::json_object("data_json", &request.data_json)?;
        let reviewer = Reviewer {
            actor,
            groups: principal.as_ref().map(|p| p.groups.clone()),
            principal: principal.map_or_else(String::new, |p| p.name),
        };
        let answer = self
            .engine()?
            .signal(run, &request.r#type, data, &request.request_id, reviewer)
            .await?;
        Ok(Response::new(proto::SignalResponse {
            seq: answer.seq,
            already_decided: answer.already_decided,
            decision: answer.decision,
            votes: answer.votes,
            approvals_required: answer.approvals_required,
            new_call_id: answer.new_call_id,
            new_arguments_sha256: answer.new_arguments_sha256,
        }))
    }

    async fn cancel_run(
        &self,
        request: Request<proto::CancelRunRequest>,
    ) -> Result<Response<proto::CancelRunResponse>, Status> {
        let actor = client_actor(&request);
        let principal = principal(&request).cloned();
        let request = request.into_inner();
        let run = convert::run_id("run_id", &request.run_id)?;
        self.check_owner(principal.as_ref(), run, false).await?;
        let reason = if request.reason.is_empty() {
            "cancelled by a client".to_string()
        } else {
            request.reason
        };
        let seq = self.engine()?.cancel_run(run, &reason, actor).await?;
        Ok(Response::new(proto::CancelRunResponse { seq }))
    }
}

/// Where a stream starts: the head subscribed to before the first read, that
/// read, and whether the run had already ended at the client's cursor (known
/// only when the first read was empty).
struct Start {
    head: tokio::sync::watch::Receiver<u64>,
    first: Vec<EventRecord>,
    ended: bool,
}

async fn read_events(reads: &Reads, run: RunId, after: u64) -> Result<Vec<EventRecord>, Status> {
    reads
        .store()
        .run_events(run, after, READ_CHUNK)
        .await
        .map_err(|e| to_status(e.into()))
}

/// Sends the run's events after the cursor, the caught-up marker, then live
/// events. Subscribes before each read, so no append is missed in between.
async fn follow_events(
    reads: &Reads,
    run: RunId,
    request: proto::StreamEventsRequest,
    start: Start,
    sender: &mpsc::Sender<Result<proto::StreamEventsResponse, Status>>,
) -> Result<(), Status> {
    use proto::stream_events_response::Item;
    let Start {
        mut head,
        first,
        ended,
    } = start;
    let mut next = Some(first);
    let mut cursor = request.after_seq;
    let mut caught_up = false;
    loop {
        let events = match next.take() {
            Some(events) => events,
            None => {
                head.borrow_and_update();
                read_events(reads, run, cursor).await?
            }
        };
        let full = events.len() == READ_CHUNK;
        for record in events {
            cursor = record.seq;
            let terminal = is_terminal(&record.event_type);
            if record.event_type.starts_with(&request.type_prefix) {
                let item = Item::Event(convert::event(record));
                let message = proto::StreamEventsResponse { item: Some(item) };
                if sender.send(Ok(message)).await.is_err() {
                    return Ok(());
                }
            }
            if terminal && request.stop_at_end {
                // The history ends here: mark it, then end.
                if !caught_up {
                    let item = Item::CaughtUp(proto::CaughtUp { last_seq: cursor });
                    let _ = sender
                        .send(Ok(proto::StreamEventsResponse { item: Some(item) }))
                        .await;
                }
                return Ok(());
            }
        }
        if full {
            continue;
        }
        if !caught_up {
            caught_up = true;
            let item = Item::CaughtUp(proto::CaughtUp { last_seq: cursor });
            let message = proto::StreamEventsResponse { item: Some(item) };
            if sender.send(Ok(message)).await.is_err() || !request.follow {
                return Ok(());
            }
            // The terminal event may be at or before the cursor the client
            // gave, so that no read shows it (nothing follows a terminal
            // event). One appended later is read like any other (also when
            // type_prefix filters it out) and ends the stream above.
            if request.stop_at_end && ended {
                return Ok(());
            }
        }
        tokio::select! {
            changed = head.changed() => if changed.is_err() { return Err(unavailable()) },
            _ = reads.shutdown_token().cancelled() => return Err(unavailable()),
            _ = sender.closed() => return Ok(()),
        }
    }
}
