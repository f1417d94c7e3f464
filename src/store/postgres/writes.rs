//! A round's writes as rows: the batches' events, and their typed ops
//! folded so the last change to each key wins, in columns ready for one
//! multi-row statement per table (`UNNEST` of arrays). Folding first keeps
//! every key once per statement, which `ON CONFLICT DO UPDATE` requires, and
//! makes a round of many batches a handful of statements.

use std::collections::BTreeMap;

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::store::{
    ApprovalRecord, DeadLetterRecord, GrantRecord, GrantUse, GroupRecord, Op, Result, RunId,
    RunRecord, StoreError, WriteBatch,
};

/// One statement to run: its SQL and its parameters.
pub(super) struct Statement {
    pub sql: &'static str,
    pub params: Vec<Box<dyn ToSql + Sync + Send>>,
}

/// The events' columns.
#[derive(Default)]
struct Events {
    position: Vec<i64>,
    run_id: Vec<Uuid>,
    seq: Vec<i64>,
    id: Vec<Vec<u8>>,
    event_type: Vec<String>,
    data: Vec<String>,
    time_ms: Vec<i64>,
    actor_kind: Vec<i32>,
    actor_name: Vec<String>,
    actor_principal: Vec<String>,
}

/// An idempotency record's answer and the run it belongs to.
type RequestRow = (Vec<u8>, Option<Uuid>);

/// What a set of batches writes. `None` (or `false`) marks a deletion.
#[derive(Default)]
pub(super) struct Writes {
    events: Events,
    runs: BTreeMap<Uuid, RunRecord>,
    approvals: BTreeMap<(Uuid, String), Option<ApprovalRecord>>,
    active: BTreeMap<Uuid, bool>,
    timers: BTreeMap<(i64, Uuid, String), bool>,
    tools: BTreeMap<String, Vec<u8>>,
    /// Each answer and the run it belongs to (see `WriteBatch::request_run`).
    requests: BTreeMap<(Vec<u8>, String), RequestRow>,
    /// Runs to delete (retention): run, expired_ms, until_ms.
    expire: Vec<(Uuid, i64, i64)>,
    groups: BTreeMap<String, GroupRecord>,
    dead_letters: BTreeMap<(String, u64), Option<DeadLetterRecord>>,
    token_key: Option<[u8; 32]>,
    grants: BTreeMap<String, GrantRecord>,
    grant_uses: std::collections::BTreeSet<GrantUse>,
}

/// A record's run id as a uuid, or why not.
fn run_uuid(bytes: &[u8], what: &str) -> Result<Uuid> {
    RunId::from_slice(bytes)
        .map(|r| r.as_uuid())
        .ok_or_else(|| StoreError::Corrupt(format!("{what} with a bad run id {bytes:?}")))
}

/// Refuses a batch that names a run by something not a run id, before any
/// of it is added to a round.
pub(super) fn check(batch: &WriteBatch) -> Result<()> {
    for event in batch.events() {
        run_uuid(&event.run_id, "an event")?;
    }
    for op in batch.ops() {
        match op {
            Op::PutRun(run) => {
                run_uuid(&run.run_id, "a run summary")?;
            }
            Op::PutApproval(approval) => {
                run_uuid(&approval.run_id, "an approval")?;
            }
            _ => {}
        }
    }
    Ok(())
}

impl Writes {
    /// Adds a checked batch whose events have their positions, after the
    /// batches added before it.
    pub fn add(&mut self, batch: &WriteBatch) {
        for event in batch.events() {
            let e = &mut self.events;
            e.position.push(event.position as i64);
            e.run_id
                .push(run_uuid(&event.run_id, "").unwrap_or_default());
            e.seq.push(event.seq as i64);
            e.id.push(event.id.clone());
            e.event_type.push(event.event_type.clone());
            e.data.push(event.data_json.clone());
            e.time_ms.push(event.time_ms);
            e.actor_kind.push(event.actor_kind);
            e.actor_name.push(event.actor_name.clone());
            e.actor_principal.push(event.actor_principal.clone());
        }
        for op in batch.ops() {
            self.add_op(batch, op);
        }
    }

    fn add_op(&mut self, batch: &WriteBatch, op: &Op) {
        match op {
            Op::PutRun(run) => {
                let id = run_uuid(&run.run_id, "").unwrap_or_default();
                self.runs.insert(id, run.clone());
            }
            Op::PutApproval(approval) => {
                let mut approval = approval.clone();
                approval.position = batch
                    .events()
                    .iter()
                    .find(|e| e.seq == approval.seq && e.run_id == approval.run_id)
                    .map_or(approval.position, |e| e.position);
                let id = run_uuid(&approval.run_id, "").unwrap_or_default();
                self.approvals
                    .insert((id, approval.call_id.clone()), Some(approval));
            }
            Op::DeleteApproval { run, call_id } => {
                self.approvals
                    .insert((run.as_uuid(), call_id.clone()), None);
            }
            Op::SetActive { run, active } => {
                self.active.insert(run.as_uuid(), *active);
            }
            Op::PutTimer(t) => {
                self.timers
                    .insert((t.due_ms, t.run.as_uuid(), t.name.clone()), true);
            }
            Op::DeleteTimer(t) => {
                self.timers
                    .insert((t.due_ms, t.run.as_uuid(), t.name.clone()), false);
            }
            Op::PutTool { name, definition } => {
                self.tools.insert(name.clone(), definition.clone());
            }
            Op::PutRequest {
                scope,
                request_id,
                answer,
                run,
            } => {
                let run = run.or_else(|| batch.request_run()).map(|run| run.as_uuid());
                self.requests
                    .insert((scope.clone(), request_id.clone()), (answer.clone(), run));
            }
            Op::PutGroup(group) => {
                self.groups.insert(group.name.clone(), group.clone());
            }
            Op::PutDeadLetter { group, letter } => {
                self.dead_letters
                    .insert((group.clone(), letter.position), Some(letter.clone()));
            }
            Op::DeleteDeadLetter { group, position } => {
                self.dead_letters.insert((group.clone(), *position), None);
            }
            Op::PutTokenKey(key) => self.token_key = Some(*key),
            Op::PutGrant(grant) => {
                self.grants.insert(grant.id.clone(), grant.clone());
            }
            Op::UseGrant(used) => {
                self.grant_uses.insert(used.clone());
            }
            Op::ExpireRun {
                run,
                expired_ms,
                until_ms,
            } => self.expire.push((run.as_uuid(), *expired_ms, *until_ms)),
        }
    }

    /// The statements that write all of it, none for a table untouched.
    pub fn statements(self) -> Vec<Statement> {
        let mut out = Vec::new();
        let e = self.events;
        if !e.position.is_empty() {
            out.push(statement(
                INSERT_EVENTS,
                vec![
                    Box::new(e.position),
                    Box::new(e.run_id),
                    Box::new(e.seq),
                    Box::new(e.id),
                    Box::new(e.event_type),
                    Box::new(e.data),
                    Box::new(e.time_ms),
                    Box::new(e.actor_kind),
                    Box::new(e.actor_name),
                    Box::new(e.actor_principal),
                ],
            ));
        }
        runs(self.runs, &mut out);
        approvals(self.approvals, &mut out);
        let (put, delete) = split(self.active.into_iter().map(|(k, v)| (k, v.then_some(()))));
        if !put.is_empty() {
            let ids: Vec<Uuid> = put.into_iter().map(|(k, ())| k).collect();
            out.push(statement(INSERT_ACTIVE, vec![Box::new(ids)]));
        }
        if !delete.is_empty() {
            out.push(statement(DELETE_ACTIVE, vec![Box::new(delete)]));
        }
        timers(self.timers, &mut out);
        if !self.tools.is_empty() {
            let (names, definitions): (Vec<_>, Vec<_>) = self.tools.into_iter().unzip();
            out.push(statement(
                UPSERT_TOOLS,
                vec![Box::new(names), Box::new(definitions)],
            ));
        }
        if !self.requests.is_empty() {
            let (mut scopes, mut ids, mut answers, mut runs) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for ((scope, id), (answer, run)) in self.requests {
                scopes.push(scope);
                ids.push(id);
                answers.push(answer);
                runs.push(run);
            }
            out.push(statement(
                INSERT_REQUESTS,
                vec![
                    Box::new(scopes),
                    Box::new(ids),
                    Box::new(answers),
                    Box::new(runs),
                ],
            ));
        }
        if !self.expire.is_empty() {
            let mut columns = (Vec::new(), Vec::new(), Vec::new());
            for (run, expired_ms, until_ms) in self.expire {
                columns.0.push(run);
                columns.1.push(expired_ms);
                columns.2.push(until_ms);
            }
            out.push(statement(
                EXPIRE_RUNS,
                vec![
                    Box::new(columns.0),
                    Box::new(columns.1),
                    Box::new(columns.2),
                ],
            ));
        }
        groups(self.groups, &mut out);
        dead_letters(self.dead_letters, &mut out);
        if let Some(key) = self.token_key {
            out.push(statement(UPSERT_TOKEN_KEY, vec![Box::new(key.to_vec())]));
        }
        grants(self.grants, self.grant_uses, &mut out);
        out
    }
}

fn grants(
    grants: BTreeMap<String, GrantRecord>,
    uses: std::collections::BTreeSet<GrantUse>,
    out: &mut Vec<Statement>,
) {
    if !grants.is_empty() {
        let (mut ids, mut tools, mut created, mut revoked, mut records) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (id, g) in grants {
            ids.push(id);
            tools.push(g.tool.clone());
            created.push(g.created_ms);
            revoked.push(g.revoked_ms);
            records.push(prost::Message::encode_to_vec(&g));
        }
        out.push(statement(
            UPSERT_GRANTS,
            vec![
                Box::new(ids),
                Box::new(tools),
                Box::new(created),
                Box::new(revoked),
                Box::new(records),
            ],
        ));
    }
    if !uses.is_empty() {
        let (mut grants, mut runs, mut calls) = (Vec::new(), Vec::new(), Vec::new());
        for used in uses {
            grants.push(used.grant);
            runs.push(used.run.as_uuid());
            calls.push(used.call_id);
        }
        out.push(statement(
            INSERT_GRANT_USES,
            vec![Box::new(grants), Box::new(runs), Box::new(calls)],
        ));
    }
}

fn statement(sql: &'static str, params: Vec<Box<dyn ToSql + Sync + Send>>) -> Statement {
    Statement { sql, params }
}

/// Puts (`Some`) and deletes (`None`), apart.
fn split<K, V>(entries: impl Iterator<Item = (K, Option<V>)>) -> (Vec<(K, V)>, Vec<K>) {
    let (mut put, mut delete) = (Vec::new(), Vec::new());
    for (key, value) in entries {
        match value {
            Some(value) => put.push((key, value)),
            None => delete.push(key),
        }
    }
    (put, delete)
}

/// A label map as the jsonb object the filters compare with `@>`.
pub(super) fn labels_json(labels: &BTreeMap<String, String>) -> serde_json::Value {
    serde_json::Value::Object(
        labels
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}

/// A list of strings as a jsonb array (arrays of arrays do not UNNEST).
fn strings_json(strings: &[String]) -> serde_json::Value {
    serde_json::Value::Array(
        strings
            .iter()
            .map(|s| serde_json::Value::String(s.clone()))
            .collect(),
    )
}

fn runs(runs: BTreeMap<Uuid, RunRecord>, out: &mut Vec<Statement>) {
    if runs.is_empty() {
        return;
    }
    let mut c = RunColumns::default();
    for (id, r) in runs {
        let (finished, expires) = match crate::domain::own_expiry(&r) {
            Some(None) => (Some(r.updated_ms), None),
            Some(Some(at)) => (None, Some(at)),
            None => (None, None),
        };
        c.finished_ms.push(finished);
        c.expires_ms.push(expires);
        c.id.push(id);
        c.status.push(r.status);
        c.tools.push(strings_json(&r.tools));
        c.labels.push(labels_json(&r.labels));
        c.task.push(r.task);
        c.model.push(r.model);
        c.created_ms.push(r.created_ms);
        c.updated_ms.push(r.updated_ms);
        c.deadline_ms.push(r.deadline_ms);
        c.last_seq.push(r.last_seq as i64);
        c.result_json.push(r.result_json);
        c.error_type.push(r.error_type);
        c.error_message.push(r.error_message);
        c.started_by.push(r.started_by);
        c.prompt_tokens
            .push(r.prompt_tokens.min(i64::MAX as u64) as i64);
        c.completion_tokens
            .push(r.completion_tokens.min(i64::MAX as u64) as i64);
    }
    out.push(statement(
        UPSERT_RUNS,
        vec![
            Box::new(c.id),
            Box::new(c.status),
            Box::new(c.task),
            Box::new(c.model),
            Box::new(c.tools),
            Box::new(c.labels),
            Box::new(c.created_ms),
            Box::new(c.updated_ms),
            Box::new(c.deadline_ms),
            Box::new(c.last_seq),
            Box::new(c.result_json),
            Box::new(c.error_type),
            Box::new(c.error_message),
            Box::new(c.started_by),
            Box::new(c.prompt_tokens),
            Box::new(c.completion_tokens),
            Box::new(c.finished_ms),
            Box::new(c.expires_ms),
        ],
    ));
}

#[derive(Default)]
struct RunColumns {
    id: Vec<Uuid>,
    status: Vec<i32>,
    task: Vec<String>,
    model: Vec<String>,
    tools: Vec<serde_json::Value>,
    labels: Vec<serde_json::Value>,
    created_ms: Vec<i64>,
    updated_ms: Vec<i64>,
    deadline_ms: Vec<i64>,
    last_seq: Vec<i64>,
    result_json: Vec<String>,
    error_type: Vec<String>,
    error_message: Vec<String>,
    started_by: Vec<String>,
    prompt_tokens: Vec<i64>,
    completion_tokens: Vec<i64>,
    finished_ms: Vec<Option<i64>>,
    expires_ms: Vec<Option<i64>>,
}

#[derive(Default)]
struct ApprovalColumns {
    run_id: Vec<Uuid>,
    call_id: Vec<String>,
    tool: Vec<String>,
    arguments_json: Vec<String>,
    arguments_sha256: Vec<String>,
    requested_ms: Vec<i64>,
    expires_ms: Vec<i64>,
    labels: Vec<serde_json::Value>,
    seq: Vec<i64>,
    task: Vec<String>,
    position: Vec<i64>,
    approvals_required: Vec<i32>,
    votes: Vec<serde_json::Value>,
    edited_from: Vec<String>,
    approvers: Vec<serde_json::Value>,
}

fn approvals(
    approvals: BTreeMap<(Uuid, String), Option<ApprovalRecord>>,
    out: &mut Vec<Statement>,
) {
    let (put, delete) = split(approvals.into_iter());
    if !put.is_empty() {
        let mut c = ApprovalColumns::default();
        for ((run, call), a) in put {
            c.run_id.push(run);
            c.call_id.push(call);
            c.labels.push(labels_json(&a.labels));
            c.tool.push(a.tool);
            c.arguments_json.push(a.arguments_json);
            c.arguments_sha256.push(a.arguments_sha256);
            c.requested_ms.push(a.requested_ms);
            c.expires_ms.push(a.expires_ms);
            c.seq.push(a.seq as i64);
            c.task.push(a.task);
            c.position.push(a.position as i64);
            c.approvals_required
                .push(i32::try_from(a.approvals_required.max(1)).unwrap_or(i32::MAX));
            c.votes.push(serde_json::json!(a.votes));
            c.edited_from.push(a.edited_from);
            c.approvers.push(serde_json::json!(a.approvers));
        }
        out.push(statement(
            UPSERT_APPROVALS,
            vec![
                Box::new(c.run_id),
                Box::new(c.call_id),
                Box::new(c.tool),
                Box::new(c.arguments_json),
                Box::new(c.arguments_sha256),
                Box::new(c.requested_ms),
                Box::new(c.expires_ms),
                Box::new(c.labels),
                Box::new(c.seq),
                Box::new(c.task),
                Box::new(c.position),
                Box::new(c.approvals_required),
                Box::new(c.votes),
                Box::new(c.edited_from),
                Box::new(c.approvers),
            ],
        ));
    }
    if !delete.is_empty() {
        let (runs, calls): (Vec<_>, Vec<_>) = delete.into_iter().unzip();
        out.push(statement(
            DELETE_APPROVALS,
            vec![Box::new(runs), Box::new(calls)],
        ));
    }
}

fn timers(timers: BTreeMap<(i64, Uuid, String), bool>, out: &mut Vec<Statement>) {
    let (put, delete) = split(timers.into_iter().map(|(k, v)| (k, v.then_some(()))));
    for (sql, keys) in [
        (INSERT_TIMERS, put.into_iter().map(|(k, ())| k).collect()),
        (DELETE_TIMERS, delete),
    ] {
        if keys.is_empty() {
            continue;
        }
        let (mut due, mut runs, mut names) = (Vec::new(), Vec::new(), Vec::new());
        for (d, r, n) in keys {
            due.push(d);
            runs.push(r);
            names.push(n);
        }
        out.push(statement(
            sql,
            vec![Box::new(due), Box::new(runs), Box::new(names)],
        ));
    }
}

fn groups(groups: BTreeMap<String, GroupRecord>, out: &mut Vec<Statement>) {
    if groups.is_empty() {
        return;
    }
    let (mut names, mut types, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ack, mut max, mut cursor, mut created, mut shard_cursor) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, g) in groups {
        names.push(name);
        types.push(strings_json(&g.event_types));
        labels.push(labels_json(&g.labels));
        ack.push(g.ack_timeout_ms as i64);
        max.push(i64::from(g.max_deliveries));
        cursor.push(g.cursor as i64);
        created.push(g.created_ms);
        shard_cursor.push((!g.shard_cursor.is_empty()).then_some(g.shard_cursor));
    }
    out.push(statement(
        UPSERT_GROUPS,
        vec![
            Box::new(names),
            Box::new(types),
            Box::new(labels),
            Box::new(ack),
            Box::new(max),
            Box::new(cursor),
            Box::new(created),
            Box::new(shard_cursor),
        ],
    ));
}

fn dead_letters(
    letters: BTreeMap<(String, u64), Option<DeadLetterRecord>>,
    out: &mut Vec<Statement>,
) {
    let (put, delete) = split(letters.into_iter());
    if !put.is_empty() {
        let (mut groups, mut positions, mut runs, mut seqs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut deliveries, mut errors, mut dead, mut replaying) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for ((group, position), l) in put {
            groups.push(group);
            positions.push(position as i64);
            runs.push(l.run_id);
            seqs.push(l.seq as i64);
            deliveries.push(i64::from(l.deliveries));
            errors.push(l.last_error);
            dead.push(l.dead_ms);
            replaying.push(l.replaying);
        }
        out.push(statement(
            UPSERT_DEAD_LETTERS,
            vec![
                Box::new(groups),
                Box::new(positions),
                Box::new(runs),
                Box::new(seqs),
                Box::new(deliveries),
                Box::new(errors),
                Box::new(dead),
                Box::new(replaying),
            ],
        ));
    }
    if !delete.is_empty() {
        let (groups, positions): (Vec<_>, Vec<_>) =
            delete.into_iter().map(|(g, p)| (g, p as i64)).unzip();
        out.push(statement(
            DELETE_DEAD_LETTERS,
            vec![Box::new(groups), Box::new(positions)],
        ));
    }
}

/// An event's shard is its run id's last byte (`RunId::shard`).
const INSERT_EVENTS: &str = "INSERT INTO aaa_events \
    (position, run_id, seq, id, type, data, time_ms, actor_kind, actor_name, actor_principal, \
    shard) \
    SELECT e.*, get_byte(uuid_send(e.run_id), 15)::int2 FROM UNNEST($1::bigint[], $2::uuid[], \
    $3::bigint[], $4::bytea[], $5::text[], $6::text[], $7::bigint[], $8::int[], $9::text[], \
    $10::text[]) AS e(position, run_id, seq, id, type, data, time_ms, actor_kind, actor_name, \
    actor_principal)";

const UPSERT_RUNS: &str = "INSERT INTO aaa_runs \
    (run_id, status, task, model, tools, labels, created_ms, updated_ms, deadline_ms, \
    last_seq, result_json, error_type, error_message, started_by, prompt_tokens, \
    completion_tokens, finished_ms, expires_ms) \
    SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::text[], $4::text[], $5::jsonb[], \
    $6::jsonb[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::text[], \
    $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[], $17::bigint[], \
    $18::bigint[]) \
    ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status, task = EXCLUDED.task, \
    model = EXCLUDED.model, tools = EXCLUDED.tools, labels = EXCLUDED.labels, \
    created_ms = EXCLUDED.created_ms, updated_ms = EXCLUDED.updated_ms, \
    deadline_ms = EXCLUDED.deadline_ms, last_seq = EXCLUDED.last_seq, \
    result_json = EXCLUDED.result_json, error_type = EXCLUDED.error_type, \
    error_message = EXCLUDED.error_message, started_by = EXCLUDED.started_by, \
    prompt_tokens = EXCLUDED.prompt_tokens, completion_tokens = EXCLUDED.completion_tokens, \
    finished_ms = EXCLUDED.finished_ms, expires_ms = EXCLUDED.expires_ms";

const UPSERT_APPROVALS: &str = "INSERT INTO aaa_approvals \
    (run_id, call_id, tool, arguments_json, arguments_sha256, requested_ms, expires_ms, \
    labels, seq, task, position, approvals_required, votes, edited_from, approvers) \
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], \
    $6::bigint[], $7::bigint[], $8::jsonb[], $9::bigint[], $10::text[], $11::bigint[], \
    $12::integer[], $13::jsonb[], $14::text[], $15::jsonb[]) \
    ON CONFLICT (run_id, call_id) DO UPDATE SET tool = EXCLUDED.tool, \
    arguments_json = EXCLUDED.arguments_json, arguments_sha256 = EXCLUDED.arguments_sha256, \
    requested_ms = EXCLUDED.requested_ms, expires_ms = EXCLUDED.expires_ms, \
    labels = EXCLUDED.labels, seq = EXCLUDED.seq, task = EXCLUDED.task, \
    position = EXCLUDED.position, approvals_required = EXCLUDED.approvals_required, \
    votes = EXCLUDED.votes, edited_from = EXCLUDED.edited_from, approvers = EXCLUDED.approvers";

const DELETE_APPROVALS: &str = "DELETE FROM aaa_approvals a \
    USING UNNEST($1::uuid[], $2::text[]) AS d(run_id, call_id) \
    WHERE a.run_id = d.run_id AND a.call_id = d.call_id";

const INSERT_ACTIVE: &str =
    "INSERT INTO aaa_active (run_id) SELECT * FROM UNNEST($1::uuid[]) ON CONFLICT DO NOTHING";

const DELETE_ACTIVE: &str = "DELETE FROM aaa_active WHERE run_id = ANY($1::uuid[])";

const INSERT_TIMERS: &str = "INSERT INTO aaa_timers (due_ms, run_id, name) \
    SELECT * FROM UNNEST($1::bigint[], $2::uuid[], $3::text[]) ON CONFLICT DO NOTHING";

const DELETE_TIMERS: &str = "DELETE FROM aaa_timers t \
    USING UNNEST($1::bigint[], $2::uuid[], $3::text[]) AS d(due_ms, run_id, name) \
    WHERE t.due_ms = d.due_ms AND t.run_id = d.run_id AND t.name = d.name";

const UPSERT_TOKEN_KEY: &str = "INSERT INTO aaa_meta (name, value) VALUES ('token-key', $1) \
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value";

const UPSERT_TOOLS: &str = "INSERT INTO aaa_tools (name, definition) \
    SELECT * FROM UNNEST($1::text[], $2::bytea[]) \
    ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition";

/// A recorded answer is never replaced (see `super::answered`, which
/// refuses the batch before it gets here).
const INSERT_REQUESTS: &str = "INSERT INTO aaa_requests (scope, request_id, answer, run_id) \
    SELECT * FROM UNNEST($1::bytea[], $2::text[], $3::bytea[], $4::uuid[]) \
    ON CONFLICT (scope, request_id) DO NOTHING";

/// Deletes finished runs whole (retention) and leaves their tombstones:
/// a run that is not finished is not in `gone`, so nothing of it goes.
/// Grant uses stay (they are the grants' counts). Timers are not looked
/// for (no index by run): a finished run's are cancelled as it finishes,
/// and one left would drop itself when it fires.
const EXPIRE_RUNS: &str = "WITH d AS (SELECT * FROM UNNEST($1::uuid[], $2::bigint[], \
    $3::bigint[]) AS d(run_id, expired_ms, until_ms)), \
    gone AS (DELETE FROM aaa_runs r USING d WHERE r.run_id = d.run_id \
    AND r.status IN (3, 4, 5) RETURNING d.*), \
    events AS (DELETE FROM aaa_events WHERE run_id IN (SELECT run_id FROM gone)), \
    approvals AS (DELETE FROM aaa_approvals WHERE run_id IN (SELECT run_id FROM gone)), \
    active AS (DELETE FROM aaa_active WHERE run_id IN (SELECT run_id FROM gone)), \
    requests AS (DELETE FROM aaa_requests WHERE run_id IN (SELECT run_id FROM gone)) \
    INSERT INTO aaa_expired (run_id, expired_ms, until_ms) \
    SELECT run_id, expired_ms, until_ms FROM gone \
    ON CONFLICT (run_id) DO UPDATE SET expired_ms = EXCLUDED.expired_ms, \
    until_ms = EXCLUDED.until_ms";

const UPSERT_GROUPS: &str = "INSERT INTO aaa_groups \
    (name, event_types, labels, ack_timeout_ms, max_deliveries, cursor, created_ms, shard_cursor) \
    SELECT * FROM UNNEST($1::text[], $2::jsonb[], $3::jsonb[], $4::bigint[], $5::bigint[], \
    $6::bigint[], $7::bigint[], $8::bytea[]) \
    ON CONFLICT (name) DO UPDATE SET event_types = EXCLUDED.event_types, \
    labels = EXCLUDED.labels, ack_timeout_ms = EXCLUDED.ack_timeout_ms, \
    max_deliveries = EXCLUDED.max_deliveries, cursor = EXCLUDED.cursor, \
    created_ms = EXCLUDED.created_ms, shard_cursor = EXCLUDED.shard_cursor";

const UPSERT_DEAD_LETTERS: &str = "INSERT INTO aaa_dead_letters \
    (group_name, position, run_id, seq, deliveries, last_error, dead_ms, replaying) \
    SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[], $4::bigint[], $5::bigint[], \
    $6::text[], $7::bigint[], $8::bool[]) \
    ON CONFLICT (group_name, position) DO UPDATE SET run_id = EXCLUDED.run_id, \
    seq = EXCLUDED.seq, deliveries = EXCLUDED.deliveries, last_error = EXCLUDED.last_error, \
    dead_ms = EXCLUDED.dead_ms, replaying = EXCLUDED.replaying";

const DELETE_DEAD_LETTERS: &str = "DELETE FROM aaa_dead_letters l \
    USING UNNEST($1::text[], $2::bigint[]) AS d(group_name, position) \
    WHERE l.group_name = d.group_name AND l.position = d.position";

const UPSERT_GRANTS: &str = "INSERT INTO aaa_grants (id, tool, created_ms, revoked_ms, record) \
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bytea[]) \
    ON CONFLICT (id) DO UPDATE SET tool = EXCLUDED.tool, created_ms = EXCLUDED.created_ms, \
    revoked_ms = EXCLUDED.revoked_ms, record = EXCLUDED.record";

const INSERT_GRANT_USES: &str = "INSERT INTO aaa_grant_uses (grant_id, run_id, call_id) \
    SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::text[]) ON CONFLICT DO NOTHING";
