//! What the store keeps, encoded with prost: one record type per key family.
//! These are storage records, not the wire types: the api converts at the edge.

use std::collections::BTreeMap;

/// Tag of the `position` field that the committer appends to stamped records
/// (see [`super::WriteBatch::put_approval`]): protobuf merges a field appended
/// to an encoded message, so stamping needs no re-encoding.
pub(super) const STAMPED_POSITION_TAG: u32 = 15;

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
}

/// A run's summary, written when its status changes. `last_seq` and
/// `updated_ms` are as of that write; [`super::Store::run`] fills in the
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
    /// Global position of that event, stamped by the committer.
    #[prost(uint64, tag = "15")]
    pub position: u64,
}
