//! Reads in SQL: the WHERE clause of a filtered read, the columns each
//! read selects, and its rows decoded back into domain records.

use std::collections::BTreeMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use super::errors::corrupt;
use super::{
    ApprovalRecord, DeadLetterRecord, EventRecord, GroupRecord, Result, RunId, RunRecord, Shards,
    Timer,
};

/// The WHERE clause of a filtered read, made of only the conditions the
/// query has. A `$1 IS NULL OR run_id > $1` form would be one statement for
/// all, but PostgreSQL's generic plan for it cannot use the index for a
/// keyset page: a WatchApprovals snapshot of 100,000 requests took 5.7 s,
/// each page scanning and sorting the whole table.
#[derive(Default)]
pub(super) struct Conditions {
    sql: Vec<String>,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Conditions {
    /// A parameter's placeholder (`$n`).
    pub(super) fn bind(&mut self, value: impl ToSql + Sync + Send + 'static) -> String {
        self.params.push(Box::new(value));
        format!("${}", self.params.len())
    }

    /// A condition whose one `$?` is `value`.
    pub(super) fn add(&mut self, condition: &str, value: impl ToSql + Sync + Send + 'static) {
        let placeholder = self.bind(value);
        self.sql.push(condition.replacen("$?", &placeholder, 1));
    }

    /// A condition whose two `$?` are `first` and `second`, in order.
    pub(super) fn add2(
        &mut self,
        condition: &str,
        first: impl ToSql + Sync + Send + 'static,
        second: impl ToSql + Sync + Send + 'static,
    ) {
        let first = self.bind(first);
        let second = self.bind(second);
        let condition = condition
            .replacen("$?", &first, 1)
            .replacen("$?", &second, 1);
        self.sql.push(condition);
    }

    pub(super) fn where_clause(&self) -> String {
        match self.sql.is_empty() {
            true => String::new(),
            false => format!(" WHERE {}", self.sql.join(" AND ")),
        }
    }

    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// A `usize` limit as SQL's bigint.
pub(super) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: usize,
) -> Result<T> {
    row.try_get(column).map_err(corrupt)
}

fn labels(value: serde_json::Value) -> Result<BTreeMap<String, String>> {
    serde_json::from_value(value).map_err(|e| corrupt(format!("labels: {e}")))
}

fn strings(value: serde_json::Value) -> Result<Vec<String>> {
    serde_json::from_value(value).map_err(|e| corrupt(format!("a list of strings: {e}")))
}

pub(super) const EVENT_COLUMNS: &str =
    "position, run_id, seq, id, type, data, time_ms, actor_kind, actor_name, actor_principal";

pub(super) fn event(row: &Row) -> Result<EventRecord> {
    Ok(EventRecord {
        position: get::<i64>(row, 0)? as u64,
        run_id: get::<Uuid>(row, 1)?.as_bytes().to_vec(),
        seq: get::<i64>(row, 2)? as u64,
        id: get(row, 3)?,
        event_type: get(row, 4)?,
        data_json: get(row, 5)?,
        time_ms: get(row, 6)?,
        actor_kind: get(row, 7)?,
        actor_name: get(row, 8)?,
        actor_principal: get(row, 9)?,
    })
}

/// A run summary with its head: the newest event's seq and time.
pub(super) const RUN_SELECT: &str =
    "SELECT r.run_id, r.status, r.task, r.model, r.tools, r.labels, \
    r.created_ms, r.updated_ms, r.deadline_ms, r.last_seq, r.result_json, r.error_type, \
    r.error_message, r.started_by, h.seq, h.time_ms, r.prompt_tokens, r.completion_tokens \
    FROM aaa_runs r \
    LEFT JOIN LATERAL (SELECT seq, time_ms FROM aaa_events e WHERE e.run_id = r.run_id \
    ORDER BY seq DESC LIMIT 1) h ON true";

pub(super) fn run(row: &Row) -> Result<RunRecord> {
    let head_seq: Option<i64> = get(row, 14)?;
    let head_time: Option<i64> = get(row, 15)?;
    let mut record = RunRecord {
        run_id: get::<Uuid>(row, 0)?.as_bytes().to_vec(),
        status: get(row, 1)?,
        task: get(row, 2)?,
        model: get(row, 3)?,
        tools: strings(get(row, 4)?)?,
        labels: labels(get(row, 5)?)?,
        created_ms: get(row, 6)?,
        updated_ms: get(row, 7)?,
        deadline_ms: get(row, 8)?,
        last_seq: get::<i64>(row, 9)? as u64,
        result_json: get(row, 10)?,
        error_type: get(row, 11)?,
        error_message: get(row, 12)?,
        started_by: get(row, 13)?,
        prompt_tokens: get::<i64>(row, 16)? as u64,
        completion_tokens: get::<i64>(row, 17)? as u64,
    };
    if let (Some(seq), Some(time)) = (head_seq, head_time) {
        record.last_seq = seq as u64;
        record.updated_ms = time;
    }
    Ok(record)
}

pub(super) const APPROVAL_COLUMNS: &str =
    "run_id, call_id, tool, arguments_json, arguments_sha256, \
    requested_ms, expires_ms, labels, seq, task, position, approvals_required, votes, edited_from, \
    approvers";

pub(super) fn approval(row: &Row) -> Result<ApprovalRecord> {
    Ok(ApprovalRecord {
        run_id: get::<Uuid>(row, 0)?.as_bytes().to_vec(),
        call_id: get(row, 1)?,
        tool: get(row, 2)?,
        arguments_json: get(row, 3)?,
        arguments_sha256: get(row, 4)?,
        requested_ms: get(row, 5)?,
        expires_ms: get(row, 6)?,
        labels: labels(get(row, 7)?)?,
        seq: get::<i64>(row, 8)? as u64,
        task: get(row, 9)?,
        position: get::<i64>(row, 10)? as u64,
        approvals_required: u32::try_from(get::<i32>(row, 11)?).map_err(corrupt)?,
        votes: votes(get(row, 12)?)?,
        edited_from: get(row, 13)?,
        approvers: strings(get(row, 14)?)?,
    })
}

/// The votes column: a JSON array of {approver, time_ms, comment}.
fn votes(value: serde_json::Value) -> Result<Vec<crate::domain::VoteRecord>> {
    serde_json::from_value(value).map_err(corrupt)
}

pub(super) fn group(row: &Row) -> Result<GroupRecord> {
    Ok(GroupRecord {
        name: get(row, 0)?,
        event_types: strings(get(row, 1)?)?,
        labels: labels(get(row, 2)?)?,
        ack_timeout_ms: get::<i64>(row, 3)? as u64,
        max_deliveries: u32::try_from(get::<i64>(row, 4)?).map_err(corrupt)?,
        cursor: get::<i64>(row, 5)? as u64,
        created_ms: get(row, 6)?,
        shard_cursor: get::<Option<Vec<u8>>>(row, 7)?.unwrap_or_default(),
    })
}

pub(super) fn dead_letter(row: &Row) -> Result<DeadLetterRecord> {
    Ok(DeadLetterRecord {
        position: get::<i64>(row, 0)? as u64,
        run_id: get(row, 1)?,
        seq: get::<i64>(row, 2)? as u64,
        deliveries: u32::try_from(get::<i64>(row, 3)?).map_err(corrupt)?,
        last_error: get(row, 4)?,
        dead_ms: get(row, 5)?,
        replaying: get(row, 6)?,
    })
}

/// A timer from a row of (due_ms, run_id, name).
pub(super) fn timer(row: &Row) -> Result<Timer> {
    Ok(Timer {
        due_ms: get(row, 0)?,
        run: run_id(row, 1)?,
        name: get(row, 2)?,
    })
}

/// A condition that a row's `run_id` is in `shards` (its last byte, see
/// `RunId::shard`), with `$n` bound to the shard list. True for every
/// shard, without looking at the ids, when the set is all of them.
pub(super) fn in_shards(shards: &Shards, n: usize) -> (String, Vec<i16>) {
    let list: Vec<i16> = shards.iter().map(i16::from).collect();
    match shards.is_all() {
        true => (format!("(${n}::int2[] IS NOT NULL)"), list),
        false => (
            format!("get_byte(uuid_send(run_id), 15) = ANY(${n}::int2[])"),
            list,
        ),
    }
}

pub(super) fn run_id(row: &Row, column: usize) -> Result<RunId> {
    let id: Uuid = get(row, column)?;
    RunId::from_slice(id.as_bytes()).ok_or_else(|| corrupt("a bad run id"))
}
