//! ApprovalService: list pending approvals, watch them change, and decide
//! several at once.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::runs::page_size;
use super::{client_actor, convert, principal, status::to_status, unavailable, STREAM_BUFFER};
use crate::cluster::{Cluster, Owner};
use crate::domain::check;
use crate::domain::event::*;
use crate::domain::may_decide;
use crate::engine::{Batch, BatchItem, Engine, Error, ItemOutcome, Reads, Reviewer};
use crate::proto::{self, approval_service_server::ApprovalService};
use crate::seconds;
use crate::store::{labels_match, ApprovalQuery, BadToken, Cursor, EventRecord, RunId};

const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(15);
const LOG_CHUNK: usize = 512;
/// Pending approvals read at once for a watch's snapshot.
const SNAPSHOT_CHUNK: usize = 512;

/// Reads are answered from `reads` on any server (see [`Reads`]); batch
/// decisions need the engine, which only the owner of the runs has.
pub struct ApprovalApi {
    reads: Reads,
    engine: Option<Engine>,
    /// The cluster, when its shards are spread: a batch's items of other
    /// servers' shards are sent to their owners.
    cluster: Option<std::sync::Arc<Cluster>>,
}

impl ApprovalApi {
    /// The owner's: reads and decisions.
    pub fn serving(engine: Engine) -> ApprovalApi {
        ApprovalApi {
            reads: engine.reads().clone(),
            engine: Some(engine),
            cluster: None,
        }
    }

    /// On a shared store: sends the items of other servers' shards to
    /// their owners.
    pub fn in_cluster(self, cluster: Option<std::sync::Arc<Cluster>>) -> ApprovalApi {
        ApprovalApi { cluster, ..self }
    }

    /// Any other server's: reads only (decisions are forwarded).
    pub fn reading(reads: Reads) -> ApprovalApi {
        ApprovalApi {
            reads,
            engine: None,
            cluster: None,
        }
    }
}

/// The groups whose calls a `decidable` filter keeps: the caller's; None
/// (every call) when the filter is off or auth is (no identities).
fn decidable_by<T>(request: &Request<T>, decidable: bool) -> Option<Vec<String>> {
    let principal = principal(request).filter(|_| decidable)?;
    Some(principal.groups.clone())
}

/// Most items one DecideApprovals may name.
const MAX_BATCH_ITEMS: usize = 1000;

/// The filters both RPCs take.
struct Filter {
    tool: String,
    run: Option<RunId>,
    labels: BTreeMap<String, String>,
    /// Only calls members of these groups may decide (`decidable`, auth on).
    decidable_by: Option<Vec<String>>,
}

impl Filter {
    fn new(
        tool: String,
        run_id: &str,
        labels: HashMap<String, String>,
        decidable_by: Option<Vec<String>>,
    ) -> Result<Filter, Error> {
        let run = match run_id {
            "" => None,
            text => Some(
                RunId::parse(text)
                    .ok_or_else(|| Error::invalid("run_id", format!("'{text}' is not a run id")))?,
            ),
        };
        let labels = labels.into_iter().collect();
        Ok(Filter {
            tool,
            run,
            labels,
            decidable_by,
        })
    }

    /// The store query for pending approvals these filters pass.
    fn query(&self, after: Option<(RunId, String)>, limit: usize) -> ApprovalQuery {
        ApprovalQuery {
            after,
            newest_first: false,
            run: self.run,
            tool: self.tool.clone(),
            labels: self.labels.clone(),
            at_or_below: None,
            decidable_by: self.decidable_by.clone(),
            limit,
        }
    }

    /// Whether a watch item (of `run`, for `tool`) passes; the labels are
    /// the run's: the item's own when it carries them (a request), else
    /// read from the run.
    async fn passes(
        &self,
        reads: &Reads,
        run: &[u8],
        tool: &str,
        item: &proto::watch_approvals_response::Item,
    ) -> Result<bool, Status> {
        if !self.tool.is_empty() && self.tool != tool {
            return Ok(false);
        }
        if let Some(wanted) = self.run {
            if wanted.as_bytes() != run {
                return Ok(false);
            }
        }
        if let proto::watch_approvals_response::Item::Requested(approval) = item {
            if !may_decide(self.decidable_by.as_deref(), &approval.approvers) {
                return Ok(false);
            }
        }
        if self.labels.is_empty() {
            return Ok(true);
        }
        if let proto::watch_approvals_response::Item::Requested(approval) = item {
            let labels = approval.labels.clone().into_iter().collect();
            return Ok(labels_match(&self.labels, &labels));
        }
        let Some(id) = RunId::from_slice(run) else {
            return Ok(false);
        };
        let facts = reads.run_facts(id).await?;
        Ok(facts.is_some_and(|f| labels_match(&self.labels, &f.labels)))
    }
}

type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::WatchApprovalsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn list_approvals(
        &self,
        request: Request<proto::ListApprovalsRequest>,
    ) -> Result<Response<proto::ListApprovalsResponse>, Status> {
        let groups = decidable_by(&request, request.get_ref().decidable);
        let request = request.into_inner();
        let filter = Filter::new(request.tool, &request.run_id, request.labels, groups)?;
        let after = match request.page_token.split_once('/') {
            _ if request.page_token.is_empty() => None,
            Some((run, call)) => Some((
                RunId::parse(run).ok_or_else(|| {
                    Error::invalid("page_token", "not a token ListApprovals returned")
                })?,
                call.to_string(),
            )),
            None => {
                return Err(
                    Error::invalid("page_token", "not a token ListApprovals returned").into(),
                )
            }
        };
        let limit = page_size(request.page_size);
        // One more than a page: whether there is a next page.
        let query = ApprovalQuery {
            newest_first: request.newest_first,
            ..filter.query(after, limit + 1)
        };
        let mut records = self
            .reads
            .store()
            .approvals(&query)
            .await
            .map_err(|e| to_status(e.into()))?;
        let more = records.len() > limit;
        records.truncate(limit);
        let approvals: Vec<proto::Approval> = records.into_iter().map(convert::approval).collect();
        let next_page_token = match (more, approvals.last()) {
            (true, Some(last)) => format!("{}/{}", last.run_id, last.call_id),
            _ => String::new(),
        };
        Ok(Response::new(proto::ListApprovalsResponse {
            approvals,
            next_page_token,
        }))
    }

    async fn decide_approvals(
        &self,
        request: Request<proto::DecideApprovalsRequest>,
    ) -> Result<Response<proto::DecideApprovalsResponse>, Status> {
        let reviewer = Reviewer {
            actor: client_actor(&request),
            principal: principal(&request).map_or_else(String::new, |p| p.name.clone()),
            groups: principal(&request).map(|p| p.groups.clone()),
        };
        let signer = crate::cluster::forward::caller(request.extensions());
        let request = request.into_inner();
        let grant = match proto::BatchDecision::try_from(request.decision) {
            Ok(proto::BatchDecision::Grant) => true,
            Ok(proto::BatchDecision::Deny) => false,
            _ => {
                return Err(Error::invalid(
                    "decision",
                    "required: BATCH_DECISION_GRANT or BATCH_DECISION_DENY",
                )
                .into())
            }
        };
        let items = batch_items(&request.items)?;
        let text = if grant {
            &request.comment
        } else {
            &request.reason
        };
        check::check_size(if grant { "comment" } else { "reason" }, text, 4 * 1024)?;
        check::check_size("approver", &request.approver, 256)?;
        check::check_size("request_id", &request.request_id, check::MAX_NAME_BYTES)?;
        let engine = self.engine.as_ref().ok_or_else(super::not_serving)?;
        let decide = |part: Vec<BatchItem>| {
            let batch = Batch {
                items: part,
                grant,
                text: text.clone(),
                approver: request.approver.clone(),
                all_or_nothing: request.all_or_nothing,
                request_id: request.request_id.clone(),
            };
            let reviewer = reviewer.clone();
            async move {
                let mut outcomes = engine.decide_approvals(batch.clone(), reviewer).await?;
                // An item of a run this server does not serve after all
                // (its shard moved, or is being taken over here) was not
                // decided: the batch is UNAVAILABLE, as when its owner
                // cannot be reached, and its retry with the request id
                // reaches the owner. (Answered as a REFUSED item, a client
                // took it for final; the chaos suite met it.)
                if let Some(i) = outcomes
                    .iter()
                    .position(|o| matches!(o, ItemOutcome::Refused(Error::OwnershipLost(_))))
                {
                    if let ItemOutcome::Refused(error) = outcomes.swap_remove(i) {
                        return Err(error.into());
                    }
                }
                Ok::<_, Status>(
                    batch
                        .items
                        .iter()
                        .zip(outcomes)
                        .map(|(item, outcome)| decision_result(item, outcome))
                        .collect::<Vec<_>>(),
                )
            }
        };
        let cluster = match &self.cluster {
            Some(cluster) if !engine.shards().is_all() => cluster,
            _ => {
                let results = decide(items).await?;
                return Ok(Response::new(proto::DecideApprovalsResponse { results }));
            }
        };
        // With spread shards, each owner decides the items of its runs.
        let mut by_owner: BTreeMap<String, (Option<Owner>, Vec<usize>)> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let shard = item.run.shard();
            let owner = match engine.shards().contains(shard) {
                true => None,
                // `None` too while this server is taking the shard over:
                // its engine then refuses the item, to be decided again.
                false => cluster.owner_of(shard).await?,
            };
            let key = owner
                .as_ref()
                .map_or_else(String::new, |o| o.server.clone());
            by_owner.entry(key).or_insert((owner, Vec::new())).1.push(i);
        }
        if request.all_or_nothing && by_owner.len() > 1 {
            return Err(Error::invalid(
                "all_or_nothing",
                "the items' runs are served by different servers of the cluster; decide each \
                 server's runs in a batch of their own, or without all_or_nothing",
            )
            .into());
        }
        let mut results = vec![proto::DecisionResult::default(); items.len()];
        for (owner, part) in by_owner.into_values() {
            let answered = match owner {
                None => decide(part.iter().map(|i| items[*i].clone()).collect()).await?,
                Some(owner) => {
                    let sent = proto::DecideApprovalsRequest {
                        items: part.iter().map(|i| request.items[*i].clone()).collect(),
                        ..request.clone()
                    };
                    decide_at(cluster, &owner, sent, signer.clone()).await?
                }
            };
            for (i, result) in part.into_iter().zip(answered) {
                results[i] = result;
            }
        }
        Ok(Response::new(proto::DecideApprovalsResponse { results }))
    }

    type WatchApprovalsStream = WatchStream;

    async fn watch_approvals(
        &self,
        request: Request<proto::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let groups = decidable_by(&request, request.get_ref().decidable);
        let request = request.into_inner();
        let filter = Filter::new(request.tool, &request.run_id, request.labels, groups)?;
        let heartbeat =
            match convert::seconds("heartbeat_s", request.heartbeat_s, seconds::WATCH_HEARTBEAT)? {
                0.0 => DEFAULT_HEARTBEAT,
                s => seconds::duration(s.max(0.05)),
            };
        let head = self.reads.store().durable().most();
        let older_form = request
            .after_position
            .filter(|_| request.resume_token.is_none());
        if let Some(after) = older_form.filter(|after| *after > head) {
            return Err(Error::invalid(
                "after_position",
                format!("{after} is past the end of the log (position {head}); was it from another server?"),
            )
            .into());
        }
        let after = match request.resume_token.as_deref() {
            Some(token) => Some(Cursor::decode(token).map_err(|BadToken(why)| {
                Error::invalid(
                    "resume_token",
                    format!("is not a token this server gave: {why}; pass the resume_token of the last item received, unchanged"),
                )
            })?),
            // A position from before the log was partitioned, or of a log
            // with one committer: everything at or below it.
            None => request.after_position.map(Cursor::at),
        };
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let reads = self.reads.clone();
        tokio::spawn(async move {
            if let Err(status) = watch(&reads, filter, after, heartbeat, &sender).await {
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// The batch's items, checked: each names a run, a call and the digest
/// the reviewer saw, and no call appears twice.
fn batch_items(items: &[proto::DecisionItem]) -> Result<Vec<BatchItem>, Error> {
    if items.is_empty() || items.len() > MAX_BATCH_ITEMS {
        return Err(Error::invalid(
            "items",
            format!(
                "{} items: a batch names 1 to {MAX_BATCH_ITEMS} calls",
                items.len()
            ),
        ));
    }
    let mut out: Vec<BatchItem> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let run = convert::run_id(&format!("items[{i}].run_id"), &item.run_id)?;
        if item.call_id.is_empty() {
            return Err(Error::invalid(&format!("items[{i}].call_id"), "required"));
        }
        check::check_size(&format!("items[{i}].call_id"), &item.call_id, 256)?;
        let digest = &item.arguments_sha256;
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                &format!("items[{i}].arguments_sha256"),
                "required: the hex SHA-256 of the arguments the reviewer was shown (Approval.arguments_sha256); a batch never decides by filter alone",
            ));
        }
        if let Some(first) = out
            .iter()
            .position(|o| o.run == run && o.call_id == item.call_id)
        {
            return Err(Error::invalid(
                &format!("items[{i}]"),
                format!("names the same call as items[{first}]"),
            ));
        }
        out.push(BatchItem {
            run,
            call_id: item.call_id.clone(),
            arguments_sha256: digest.clone(),
        });
    }
    Ok(out)
}

/// The owner's results for its items. An owner that did not answer (it
/// died, its database is gone) makes the whole batch UNAVAILABLE, as a
/// local item that cannot be decided does: the parts other owners decided
/// are durable, and the batch sent again with its request id answers them
/// `DECIDED` with their seqs and decides the rest. (Until the chaos suite
/// of issue 41 these items were answered `REFUSED` in an OK answer, which a
/// client retrying UNAVAILABLE took for final: the call was never granted.)
async fn decide_at(
    cluster: &Cluster,
    owner: &Owner,
    request: proto::DecideApprovalsRequest,
    signer: Option<String>,
) -> Result<Vec<proto::DecisionResult>, Status> {
    const METHOD: &str = "/aaa.v1.ApprovalService/DecideApprovals";
    let body = crate::auth::forwarded::unary_body(&request);
    let mut call = Request::new(request);
    *call.metadata_mut() =
        crate::cluster::forward::signed_for(cluster, signer, METHOD, &owner.address, &body);
    let mut client =
        proto::approval_service_client::ApprovalServiceClient::new(owner.channel.clone());
    match client.decide_approvals(call).await {
        Ok(answer) => Ok(answer.into_inner().results),
        // Unanswered: the connection failed (tonic made the status), or
        // the owner could not decide now.
        Err(status)
            if status.code() == tonic::Code::Unavailable
                || std::error::Error::source(&status).is_some() =>
        {
            cluster.forget(owner);
            Err(crate::cluster::unavailable(
                &format!(
                    "the owner of the run, {}, did not decide the batch's items ({}); send \
                     the batch again with the same request_id",
                    owner.server,
                    status.message()
                ),
                &owner.server,
            ))
        }
        Err(status) => Err(status),
    }
}

fn decision_result(item: &BatchItem, outcome: ItemOutcome) -> proto::DecisionResult {
    use proto::DecisionStatus;
    let mut result = proto::DecisionResult {
        run_id: item.run.to_string(),
        call_id: item.call_id.clone(),
        ..Default::default()
    };
    let status = match outcome {
        ItemOutcome::Decided { recorded, seq } => {
            result.decision = recorded.to_string();
            result.seq = seq;
            DecisionStatus::Decided
        }
        ItemOutcome::AlreadyDecided(decision) => {
            result.decision = decision.to_string();
            DecisionStatus::AlreadyDecided
        }
        ItemOutcome::NotApplied => DecisionStatus::NotApplied,
        ItemOutcome::Refused(error) => {
            let status = match &error {
                Error::ArgumentsMismatch { .. } => DecisionStatus::Mismatch,
                Error::RunNotFound(_) | Error::RunExpired { .. } | Error::CallNotFound { .. } => {
                    DecisionStatus::NotFound
                }
                Error::AlreadyVoted { .. } => DecisionStatus::AlreadyDecided,
                _ => DecisionStatus::Refused,
            };
            let (reason, message) = super::status::reason_and_message(error);
            result.error_reason = reason;
            result.error_message = message;
            status
        }
    };
    result.status = status as i32;
    result
}

type Sender = mpsc::Sender<Result<proto::WatchApprovalsResponse, Status>>;

/// Sends an item, with the cursor a resume after it starts from (none:
/// the snapshot's items); false when the client has gone.
async fn send(
    sender: &Sender,
    position: u64,
    resume: Option<&Cursor>,
    item: proto::watch_approvals_response::Item,
) -> bool {
    let message = proto::WatchApprovalsResponse {
        position,
        resume_token: resume.map(Cursor::encode).unwrap_or_default(),
        item: Some(item),
    };
    sender.send(Ok(message)).await.is_ok()
}

async fn watch(
    reads: &Reads,
    filter: Filter,
    after: Option<Cursor>,
    heartbeat: Duration,
    sender: &Sender,
) -> Result<(), Status> {
    use proto::watch_approvals_response::Item;
    let store = reads.store();
    let mut durable = store.watch_durable();
    let mut cursor = match after {
        Some(cursor) => cursor,
        None => {
            // Everything pending up to the durable cursor, then changes after it.
            let snapshot = store.durable();
            let mut pending = 0;
            let mut after = None;
            loop {
                let mut query = filter.query(after.take(), SNAPSHOT_CHUNK);
                query.at_or_below = Some(snapshot.clone());
                let page = store
                    .approvals(&query)
                    .await
                    .map_err(|e| to_status(e.into()))?;
                let full = page.len() == SNAPSHOT_CHUNK;
                for record in page {
                    pending += 1;
                    after = RunId::from_slice(&record.run_id).map(|r| (r, record.call_id.clone()));
                    let position = record.position;
                    let item = Item::Requested(convert::approval(record));
                    if !send(sender, position, None, item).await {
                        return Ok(());
                    }
                }
                if !full || after.is_none() {
                    break;
                }
            }
            let done = Item::SnapshotComplete(proto::SnapshotComplete { pending });
            if !send(sender, snapshot.most(), Some(&snapshot), done).await {
                return Ok(());
            }
            snapshot
        }
    };
    loop {
        durable.borrow_and_update();
        let entries = store
            .log_after(&cursor, LOG_CHUNK)
            .await
            .map_err(|e| to_status(e.into()))?;
        let full = entries.len() == LOG_CHUNK;
        for event in entries {
            let position = event.position;
            store.read_past(&mut cursor, &event);
            if !event.event_type.starts_with("aaa.approval.") {
                reads.learn_from(&event);
                continue;
            }
            let run_id = event.run_id.clone();
            let Some((tool, item)) = approval_item(reads, event).await? else {
                continue;
            };
            if !filter.passes(reads, &run_id, &tool, &item).await? {
                continue;
            }
            if !send(sender, position, Some(&cursor), item).await {
                return Ok(());
            }
        }
        if full {
            continue;
        }
        tokio::select! {
            changed = durable.changed() => if changed.is_err() { return Err(unavailable()) },
            _ = tokio::time::sleep(heartbeat) => {
                let heartbeat = Item::Heartbeat(proto::Heartbeat {});
                if !send(sender, cursor.most(), Some(&cursor), heartbeat).await {
                    return Ok(());
                }
            }
            _ = reads.shutdown_token().cancelled() => return Err(unavailable()),
            _ = sender.closed() => return Ok(()),
        }
    }
}

/// The watch item an approval event stands for, with its tool's name.
async fn approval_item(
    reads: &Reads,
    event: EventRecord,
) -> Result<Option<(String, proto::watch_approvals_response::Item)>, Status> {
    use proto::watch_approvals_response::Item;
    let run_id = RunId::from_slice(&event.run_id)
        .map(|r| r.to_string())
        .unwrap_or_default();
    let bad =
        |e: serde_json::Error| to_status(Error::Internal(format!("approval event data: {e}")));
    let resolution =
        |call_id: String, tool: String, outcome: proto::ApprovalOutcome, reason: String| {
            let item = Item::Resolved(proto::ApprovalResolution {
                run_id: run_id.clone(),
                call_id,
                tool: tool.clone(),
                outcome: outcome as i32,
                reason,
                seq: event.seq,
                time: convert::timestamp(event.time_ms),
                replaced_by: String::new(),
            });
            Some((tool, item))
        };
    Ok(match event.event_type.as_str() {
        APPROVAL_REQUESTED => {
            let data: ApprovalRequested = serde_json::from_str(&event.data_json).map_err(bad)?;
            let facts = match RunId::from_slice(&event.run_id) {
                Some(run) => reads.run_facts(run).await?,
                None => None,
            };
            let (labels, task) = facts
                .map(|f| (f.labels.clone(), f.task.clone()))
                .unwrap_or_default();
            let approval = proto::Approval {
                run_id: run_id.clone(),
                call_id: data.call_id,
                tool: data.name.clone(),
                arguments_json: canonical_json(&data.arguments),
                arguments_sha256: data.arguments_sha256,
                requested_at: convert::timestamp(event.time_ms),
                expires_at: data.expires_at_ms.and_then(convert::timestamp),
                labels: labels.into_iter().collect(),
                seq: event.seq,
                position: event.position,
                task,
                approvals_required: data.approvals_required.max(1),
                votes: Vec::new(),
                edited_from: data.edited_from,
                approvers: data.approvers,
            };
            Some((data.name, Item::Requested(approval)))
        }
        APPROVAL_VOTED => {
            let data: ApprovalVoted = serde_json::from_str(&event.data_json).map_err(bad)?;
            let item = Item::Voted(proto::ApprovalVoted {
                run_id: run_id.clone(),
                call_id: data.call_id,
                tool: data.name.clone(),
                vote: Some(proto::Vote {
                    approver: data.approver,
                    time: convert::timestamp(event.time_ms),
                    comment: data.comment.unwrap_or_default(),
                }),
                votes: data.votes,
                approvals_required: data.approvals_required,
                seq: event.seq,
            });
            Some((data.name, item))
        }
        APPROVAL_EDITED => {
            let data: ApprovalEdited = serde_json::from_str(&event.data_json).map_err(bad)?;
            let item = Item::Resolved(proto::ApprovalResolution {
                run_id: run_id.clone(),
                call_id: data.call_id,
                tool: data.name.clone(),
                outcome: proto::ApprovalOutcome::Edited as i32,
                reason: data.reason,
                seq: event.seq,
                time: convert::timestamp(event.time_ms),
                replaced_by: data.new_call_id,
            });
            Some((data.name, item))
        }
        APPROVAL_GRANTED => {
            let data: ApprovalGranted = serde_json::from_str(&event.data_json).map_err(bad)?;
            resolution(
                data.call_id,
                data.name,
                proto::ApprovalOutcome::Granted,
                data.comment.unwrap_or_default(),
            )
        }
        APPROVAL_DENIED => {
            let data: ApprovalDenied = serde_json::from_str(&event.data_json).map_err(bad)?;
            resolution(
                data.call_id,
                data.name,
                proto::ApprovalOutcome::Denied,
                data.reason,
            )
        }
        APPROVAL_EXPIRED => {
            let data: ApprovalExpired = serde_json::from_str(&event.data_json).map_err(bad)?;
            resolution(
                data.call_id,
                data.name,
                proto::ApprovalOutcome::Expired,
                data.reason,
            )
        }
        _ => None,
    })
}
