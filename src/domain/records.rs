//! The records the engine and every store backend share: events, run
//! summaries, pending approvals, timers, consumer groups and grants. They
//! are not the wire types (the api converts at the edge); they derive
//! prost's encoding because the embedded store keeps them that way.

use std::collections::BTreeMap;
use std::fmt;

use super::{Cursor, RunId};

/// A durable timer: due at `due_ms` (Unix milliseconds), for `run`, named
/// by the engine (an approval timeout, the run's deadline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    pub due_ms: i64,
    pub run: RunId,
    pub name: String,
}

/// One event of a run's log.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventRecord {
    /// Run id (16 bytes).
    #[prost(bytes = "vec", tag = "1")]
    pub run_id: Vec<u8>,
    #[prost(uint64, tag = "2")]
    pub seq: u64,
    /// Global position; assigned by the committer.
    #[prost(uint64, tag = "3")]
    pub position: u64,
    /// Event id (16 bytes, a UUID).
    #[prost(bytes = "vec", tag = "4")]
    pub id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub event_type: String,
    /// JSON object as text.
    #[prost(string, tag = "6")]
    pub data_json: String,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "7")]
    pub time_ms: i64,
    /// 1 engine, 2 worker, 3 client (the wire ActorKind numbers).
    #[prost(int32, tag = "8")]
    pub actor_kind: i32,
    #[prost(string, tag = "9")]
    pub actor_name: String,
    /// The principal behind a worker actor (auth on); empty otherwise.
    #[prost(string, tag = "10")]
    pub actor_principal: String,
}

/// A run's summary, written when its status changes. `last_seq` and
/// `updated_ms` are as of that write; a store's `run` read fills in the
/// current ones.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RunRecord {
    #[prost(bytes = "vec", tag = "1")]
    pub run_id: Vec<u8>,
    /// The wire RunStatus number.
    #[prost(int32, tag = "2")]
    pub status: i32,
    #[prost(string, tag = "3")]
    pub task: String,
    #[prost(string, tag = "4")]
    pub model: String,
    #[prost(string, repeated, tag = "5")]
    pub tools: Vec<String>,
    #[prost(btree_map = "string, string", tag = "6")]
    pub labels: BTreeMap<String, String>,
    #[prost(int64, tag = "7")]
    pub created_ms: i64,
    #[prost(int64, tag = "8")]
    pub updated_ms: i64,
    /// 0: no deadline.
    #[prost(int64, tag = "9")]
    pub deadline_ms: i64,
    #[prost(uint64, tag = "10")]
    pub last_seq: u64,
    #[prost(string, tag = "11")]
    pub result_json: String,
    #[prost(string, tag = "12")]
    pub error_type: String,
    #[prost(string, tag = "13")]
    pub error_message: String,
    /// The client principal that started the run; empty when the engine or
    /// an unauthenticated caller did, and in summaries written before this
    /// field existed (a store then reads the run's first event).
    #[prost(string, tag = "14")]
    pub started_by: String,
    /// Tokens the run's model calls used (built-in models).
    #[prost(uint64, tag = "15")]
    pub prompt_tokens: u64,
    #[prost(uint64, tag = "16")]
    pub completion_tokens: u64,
}

/// Whether an approver in `groups` may decide a call that `approvers` may
/// decide: any approver when the call names no groups; anyone with auth
/// off (`groups` None: there are no identities to check). The one rule
/// behind decisions, grants and the `decidable` filter.
pub fn may_decide(groups: Option<&[String]>, approvers: &[String]) -> bool {
    match groups {
        None => true,
        Some(_) if approvers.is_empty() => true,
        Some(groups) => groups.iter().any(|g| approvers.contains(g)),
    }
}

/// A pending approval request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ApprovalRecord {
    #[prost(bytes = "vec", tag = "1")]
    pub run_id: Vec<u8>,
    #[prost(string, tag = "2")]
    pub call_id: String,
    #[prost(string, tag = "3")]
    pub tool: String,
    #[prost(string, tag = "4")]
    pub arguments_json: String,
    #[prost(string, tag = "5")]
    pub arguments_sha256: String,
    #[prost(int64, tag = "6")]
    pub requested_ms: i64,
    /// 0: does not expire.
    #[prost(int64, tag = "7")]
    pub expires_ms: i64,
    #[prost(btree_map = "string, string", tag = "8")]
    pub labels: BTreeMap<String, String>,
    /// seq of the aaa.approval.requested event.
    #[prost(uint64, tag = "9")]
    pub seq: u64,
    /// The run's task.
    #[prost(string, tag = "10")]
    pub task: String,
    /// Global position of that event, filled in by the store at commit.
    #[prost(uint64, tag = "15")]
    pub position: u64,
    /// Grants from distinct approvers the call needs (0 in records written
    /// before this field existed: read as 1).
    #[prost(uint32, tag = "16")]
    pub approvals_required: u32,
    /// Grants cast so far.
    #[prost(message, repeated, tag = "17")]
    pub votes: Vec<VoteRecord>,
    /// For an edited call: the call it replaces.
    #[prost(string, tag = "18")]
    pub edited_from: String,
    /// The approver groups that may decide it; empty: any approver.
    #[prost(string, repeated, tag = "19")]
    pub approvers: Vec<String>,
}

/// One approver's grant of a call that needs several. Also JSON (the
/// PostgreSQL store's `votes` column: `{approver, time_ms, comment}`).
#[derive(Clone, PartialEq, prost::Message, serde::Serialize, serde::Deserialize)]
pub struct VoteRecord {
    #[prost(string, tag = "1")]
    pub approver: String,
    #[prost(int64, tag = "2")]
    pub time_ms: i64,
    #[prost(string, tag = "3")]
    #[serde(default)]
    pub comment: String,
}

/// A consumer group: what it subscribes to, and how far it has got.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GroupRecord {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Exact types, prefixes ending in ".*", or "*"; sorted, no duplicates.
    #[prost(string, repeated, tag = "2")]
    pub event_types: Vec<String>,
    #[prost(btree_map = "string, string", tag = "3")]
    pub labels: BTreeMap<String, String>,
    #[prost(uint64, tag = "4")]
    pub ack_timeout_ms: u64,
    #[prost(uint32, tag = "5")]
    pub max_deliveries: u32,
    /// Every matching event at or below this position, in any shard, is
    /// acked or dead-lettered: the lowest of [`GroupRecord::log_cursor`]'s.
    #[prost(uint64, tag = "6")]
    pub cursor: u64,
    #[prost(int64, tag = "7")]
    pub created_ms: i64,
    /// The cursor per shard (an encoded [`Cursor`]); empty in a group saved
    /// before the log was partitioned, whose cursor is `cursor` in every
    /// shard.
    #[prost(bytes = "vec", tag = "8")]
    pub shard_cursor: Vec<u8>,
}

impl GroupRecord {
    /// Where the group stands in each shard: every matching event at or
    /// below it is acked or dead-lettered.
    pub fn log_cursor(&self) -> Cursor {
        match self.shard_cursor.is_empty() {
            true => Cursor::at(self.cursor),
            // Written by this server: it reads back, or the lowest of it
            // still holds.
            false => Cursor::from_bytes(&self.shard_cursor).unwrap_or(Cursor::at(self.cursor)),
        }
    }

    pub fn set_log_cursor(&mut self, cursor: &Cursor) {
        self.cursor = cursor.least();
        self.shard_cursor = cursor.to_bytes();
    }
}

/// An event a group gave up on after its max deliveries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeadLetterRecord {
    #[prost(bytes = "vec", tag = "1")]
    pub run_id: Vec<u8>,
    #[prost(uint64, tag = "2")]
    pub seq: u64,
    #[prost(uint64, tag = "3")]
    pub position: u64,
    #[prost(uint32, tag = "4")]
    pub deliveries: u32,
    #[prost(string, tag = "5")]
    pub last_error: String,
    #[prost(int64, tag = "6")]
    pub dead_ms: i64,
    /// Put back into delivery by a replay; deleted once acked.
    #[prost(bool, tag = "7")]
    pub replaying: bool,
}

/// A standing grant: an approver's decision made in advance for the calls
/// of one tool that fall in its scope and meet its condition. Written when
/// created and again when revoked; its uses are records of their own (see
/// [`GrantUse`]), so that no two commits can lose a count.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GrantRecord {
    /// A UUIDv7 in text form: id order is creation order.
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub tool: String,
    /// Scope: only this run's calls (empty: any run's).
    #[prost(string, tag = "3")]
    pub run_id: String,
    /// Scope: only runs with every one of these labels.
    #[prost(btree_map = "string, string", tag = "4")]
    pub labels: BTreeMap<String, String>,
    /// Scope: only runs this principal started (empty: anyone's).
    #[prost(string, tag = "5")]
    pub started_by: String,
    /// A CEL expression over the call, as policy rules see it (empty: true).
    #[prost(string, tag = "6")]
    pub condition: String,
    /// Only calls with exactly these arguments (hex SHA-256 of their
    /// canonical JSON); empty: any arguments.
    #[prost(string, tag = "7")]
    pub arguments_sha256: String,
    /// 0: does not expire.
    #[prost(int64, tag = "8")]
    pub expires_ms: i64,
    /// 0: unlimited.
    #[prost(uint64, tag = "9")]
    pub max_uses: u64,
    #[prost(string, tag = "10")]
    pub reason: String,
    /// The approver that made it (with auth off, the caller's address).
    #[prost(string, tag = "11")]
    pub created_by: String,
    #[prost(int64, tag = "12")]
    pub created_ms: i64,
    /// With auth on, the creator's approver groups: the grant decides only
    /// calls they may decide.
    #[prost(string, repeated, tag = "13")]
    pub creator_groups: Vec<String>,
    /// False with auth off: groups were not known, so not enforced.
    #[prost(bool, tag = "14")]
    pub groups_enforced: bool,
    /// 0: in force.
    #[prost(int64, tag = "15")]
    pub revoked_ms: i64,
    #[prost(string, tag = "16")]
    pub revoked_by: String,
    #[prost(string, tag = "17")]
    pub revoke_reason: String,
}

/// One use of a grant: the call it granted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrantUse {
    pub grant: String,
    pub run: RunId,
    pub call_id: String,
}

/// The run label that sets a run's own retention, in place of the
/// server's `--retention` (see docs/retention.md): a duration such as
/// `7d`, `12h`, `30m`, `45s` or `500ms`, or `0` / `forever` to keep the
/// run for good. StartRun refuses any other value.
pub const RETENTION_LABEL: &str = "aaa.retention";

/// How long a finished run is kept after it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Never deleted.
    Forever,
    /// Deleted once it finished longer ago than this many milliseconds.
    Ms(i64),
}

impl Retention {
    /// Parses `30d`, `12h`, `30m`, `45s`, `500ms` (a whole number and a
    /// unit), `0` or `forever`.
    pub fn parse(text: &str) -> Result<Retention, String> {
        let text = text.trim();
        if text == "0" || text.eq_ignore_ascii_case("forever") {
            return Ok(Retention::Forever);
        }
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let unit_ms: i64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => {
                return Err(format!(
                    "'{text}' is not a retention: give a whole number and a unit (ms, s, m, h, d), e.g. 30d, or 0 / forever"
                ))
            }
        };
        let number: i64 = number.parse().map_err(|_| {
            format!(
                "'{text}' is not a retention: it needs a whole number before its unit, e.g. 30d"
            )
        })?;
        // At most about 100 years: larger is forever in all but name, and
        // keeps every sum with a time in range.
        const MAX_MS: i64 = 100 * 366 * 86_400_000;
        match number.checked_mul(unit_ms) {
            Some(0) => Ok(Retention::Forever),
            Some(ms) if ms <= MAX_MS => Ok(Retention::Ms(ms)),
            _ => Err(format!(
                "'{text}' is longer than 100 years: use forever to keep runs for good"
            )),
        }
    }

    /// The run's own retention, from its [`RETENTION_LABEL`]; `None` when
    /// it has none (or one that does not parse, which StartRun refuses).
    pub fn of_labels(labels: &BTreeMap<String, String>) -> Option<Retention> {
        labels
            .get(RETENTION_LABEL)
            .and_then(|text| Retention::parse(text).ok())
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Retention::Forever => f.write_str("forever"),
            Retention::Ms(ms) if ms % 86_400_000 == 0 => write!(f, "{}d", ms / 86_400_000),
            Retention::Ms(ms) if ms % 3_600_000 == 0 => write!(f, "{}h", ms / 3_600_000),
            Retention::Ms(ms) if ms % 60_000 == 0 => write!(f, "{}m", ms / 60_000),
            Retention::Ms(ms) if ms % 1_000 == 0 => write!(f, "{}s", ms / 1_000),
            Retention::Ms(ms) => write!(f, "{ms}ms"),
        }
    }
}

/// Whether a wire RunStatus number is a finished run's (completed, failed,
/// cancelled): the only runs retention ever deletes.
pub fn is_finished_status(status: i32) -> bool {
    matches!(status, 3..=5)
}

/// When a finished run stops being kept, as its summary says: its finish
/// time (the summary written at the end has its last event's time) plus
/// its own retention. `Some(None)`: it follows the server's default;
/// `None`: kept for good, or not finished.
pub fn own_expiry(run: &RunRecord) -> Option<Option<i64>> {
    if !is_finished_status(run.status) {
        return None;
    }
    match Retention::of_labels(&run.labels) {
        None => Some(None),
        Some(Retention::Forever) => None,
        Some(Retention::Ms(ms)) => Some(Some(run.updated_ms.saturating_add(ms))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retentions_parse_and_bad_ones_say_why() {
        assert_eq!(Retention::parse("30d"), Ok(Retention::Ms(30 * 86_400_000)));
        assert_eq!(Retention::parse("12h"), Ok(Retention::Ms(12 * 3_600_000)));
        assert_eq!(Retention::parse("1s"), Ok(Retention::Ms(1_000)));
        assert_eq!(Retention::parse("250ms"), Ok(Retention::Ms(250)));
        for forever in ["0", "forever", "FOREVER", "0d"] {
            assert_eq!(Retention::parse(forever), Ok(Retention::Forever));
        }
        for bad in ["", "d", "30", "-1d", "1.5h", "30 days", "99999999999d"] {
            assert!(Retention::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Retention::Ms(30 * 86_400_000).to_string(), "30d");
        assert_eq!(Retention::Ms(90_000).to_string(), "90s");
    }
}
