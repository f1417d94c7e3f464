//! Ids and secrets: a run's id, and fresh random keys.

use std::fmt;

use super::Shards;

/// A run's id: a time-ordered UUID (v7), so id order is start order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(uuid::Uuid);

impl RunId {
    /// A new id, later than every id minted before it by this process.
    pub fn new() -> Self {
        RunId(uuid::Uuid::now_v7())
    }

    /// A new id in `shard`, later than every id minted before it by this
    /// process.
    pub fn new_in_shard(shard: u8) -> Self {
        let mut bytes = *RunId::new().0.as_bytes();
        bytes[15] = shard;
        RunId(uuid::Uuid::from_bytes(bytes))
    }

    /// A new id in one of `shards` (chosen at random among them), later
    /// than every id minted before it by this process; `None` if the set
    /// is empty. The last byte of a UUIDv7 is random, so it may be chosen.
    pub fn new_in(shards: &Shards) -> Option<Self> {
        let id = RunId::new();
        if shards.is_all() {
            return Some(id);
        }
        let pick = shards
            .iter()
            .nth(usize::from(id.shard()) % shards.len().max(1))?;
        let mut bytes = *id.0.as_bytes();
        bytes[15] = pick;
        Some(RunId(uuid::Uuid::from_bytes(bytes)))
    }

    /// The run's shard: its id's last byte, which is random in a UUIDv7, so
    /// runs spread evenly over the [`SHARDS`].
    pub fn shard(&self) -> u8 {
        self.0.as_bytes()[15]
    }

    /// Parses the hyphenated text form clients see.
    pub fn parse(text: &str) -> Option<Self> {
        uuid::Uuid::try_parse(text).ok().map(RunId)
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        uuid::Uuid::from_slice(bytes).ok().map(RunId)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// 32 random bytes for a new secret (the task-token key): two v4 UUIDs,
/// 244 bits from the thread's CSPRNG.
pub fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}
