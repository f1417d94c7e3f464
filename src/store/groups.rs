//! Consumer groups' durable state: each group's definition and cursor, and
//! its dead letters. Written through the committer like everything else, so
//! a cursor and the dead letters it passes land in one atomic batch.

use std::collections::BTreeMap;

use super::{decode, keys, Op, Result, Store, WriteBatch};

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
    /// Every matching event at or below this global position is acked or
    /// dead-lettered.
    #[prost(uint64, tag = "6")]
    pub cursor: u64,
    #[prost(int64, tag = "7")]
    pub created_ms: i64,
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

impl WriteBatch {
    pub fn put_group(&mut self, group: &GroupRecord) {
        self.ops.push(Op::Put(
            keys::group(&group.name),
            prost::Message::encode_to_vec(group),
        ));
    }

    pub fn put_dead_letter(&mut self, group: &str, letter: &DeadLetterRecord) {
        self.ops.push(Op::Put(
            keys::dead_letter(group, letter.position),
            prost::Message::encode_to_vec(letter),
        ));
    }

    pub fn delete_dead_letter(&mut self, group: &str, position: u64) {
        self.ops
            .push(Op::Delete(keys::dead_letter(group, position)));
    }
}

impl Store {
    pub fn group(&self, name: &str) -> Result<Option<GroupRecord>> {
        self.get(&keys::group(name))
    }

    /// A group's dead letters with positions after `after`, at most `limit`.
    pub fn dead_letters(
        &self,
        group: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetterRecord>> {
        let start = keys::dead_letter(group, after.saturating_add(1));
        let end = keys::prefix_end(&keys::dead_letters(group));
        self.inner
            .tree
            .range(start..end)
            .take(limit)
            .map(|entry| {
                let (key, value) = entry?;
                decode(&key, &value)
            })
            .collect()
    }
}
