//! Shards: the unit of ownership a server holds on a shared database,
//! the stable hashes that put a run's request or a consumer group on one,
//! and the records of who holds which (members and their leases).

use std::fmt;

/// How many shards runs are spread over, by [`RunId::shard`]: the unit of
/// ownership a server holds on a shared database (see
/// `store::postgres::ownership`). Fixed: a run never changes shard.
pub const SHARDS: usize = 256;

/// A consumer group's shard: owned and fenced like runs' shards, so that
/// one server at a time moves a group's cursor. A stable hash of the name
/// (FNV-1a), the same on every server and version.
pub fn group_shard(name: &str) -> u8 {
    fnv_shard(name.as_bytes())
}

/// A set of shards: those a server owns, or wants. A fixed-size bit set,
/// cheap to copy and compare.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Shards([u64; SHARDS / 64]);

impl Shards {
    /// Every shard (the embedded store's one server owns them all).
    pub fn all() -> Self {
        Shards([u64::MAX; SHARDS / 64])
    }

    pub fn none() -> Self {
        Shards::default()
    }

    pub fn contains(&self, shard: u8) -> bool {
        self.0[usize::from(shard) / 64] & (1 << (shard % 64)) != 0
    }

    pub fn insert(&mut self, shard: u8) {
        self.0[usize::from(shard) / 64] |= 1 << (shard % 64);
    }

    pub fn remove(&mut self, shard: u8) {
        self.0[usize::from(shard) / 64] &= !(1 << (shard % 64));
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|word| word.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|word| *word == 0)
    }

    pub fn is_all(&self) -> bool {
        *self == Shards::all()
    }

    /// The shards of `self` that are not in `other`.
    pub fn minus(&self, other: &Shards) -> Shards {
        Shards(std::array::from_fn(|i| self.0[i] & !other.0[i]))
    }

    pub fn union(&self, other: &Shards) -> Shards {
        Shards(std::array::from_fn(|i| self.0[i] | other.0[i]))
    }

    /// The shards in order.
    pub fn iter(&self) -> impl Iterator<Item = u8> + '_ {
        (0..=u8::MAX).filter(|shard| self.contains(*shard))
    }
}

impl FromIterator<u8> for Shards {
    fn from_iter<I: IntoIterator<Item = u8>>(shards: I) -> Self {
        let mut set = Shards::none();
        for shard in shards {
            set.insert(shard);
        }
        set
    }
}

impl fmt::Debug for Shards {
    /// Runs of consecutive shards: `0-41,200,255`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ranges: Vec<(u8, u8)> = Vec::new();
        for shard in self.iter() {
            match ranges.last_mut() {
                Some((_, end)) if u16::from(*end) + 1 == u16::from(shard) => *end = shard,
                _ => ranges.push((shard, shard)),
            }
        }
        let text: Vec<String> = ranges
            .iter()
            .map(|(a, b)| match a == b {
                true => a.to_string(),
                false => format!("{a}-{b}"),
            })
            .collect();
        write!(f, "[{}]", text.join(","))
    }
}

/// The shard of the run a StartRun with a request id makes: a stable hash
/// of the principal and the id, so that a retry (on any server of a
/// cluster) reaches the one owner that checks the id, and finds the run.
pub fn request_shard(principal: &str, request_id: &str) -> u8 {
    let key = [principal.as_bytes(), b"\0", request_id.as_bytes()].concat();
    fnv_shard(&key)
}

/// FNV-1a of `bytes`, reduced to a shard.
fn fnv_shard(bytes: &[u8]) -> u8 {
    let hash = bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    });
    (hash % SHARDS as u32) as u8
}

/// How a server claims the runs of a shared store (see
/// `Store::claim_runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The claim lapses unless renewed within this time; the server renews
    /// it every third of it.
    pub lease: std::time::Duration,
    /// Wait until no other server holds a live claim, instead of taking
    /// the runs over at once.
    pub standby: bool,
}

/// A server of a shared store, as its membership row says (see
/// `Store::join`). Times are the database's, in Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The name it claims shards under: its address and process id.
    pub server: String,
    /// Where the other servers reach it (`--advertise`).
    pub address: String,
    pub started_ms: i64,
    /// It counts as alive until then; it renews every third of its lease.
    pub seen_until_ms: i64,
    /// It shares the shards out with the other members that do (the
    /// default), rather than taking part in one owner's cluster.
    pub spreads: bool,
}

/// Who holds a shard, with which epoch, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLease {
    pub shard: u8,
    /// The holder's [`Member::server`]; empty if never claimed.
    pub owner: String,
    pub epoch: i64,
    pub lease_until_ms: i64,
}

/// The members and shard leases of a shared store, read at one moment of
/// the database's clock. Empty for a store that belongs to one server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The database's time when it was read.
    pub now_ms: i64,
    pub members: Vec<Member>,
    /// In shard order (a lookup per call routed depends on it).
    pub shards: Vec<ShardLease>,
}

impl ClusterView {
    /// The live member whose live lease covers `shard`, if any.
    pub fn owner_of(&self, shard: u8) -> Option<&Member> {
        let at = self.shards.binary_search_by_key(&shard, |l| l.shard).ok()?;
        self.holder(&self.shards[at])
    }

    /// The live member that holds `lease`, if the lease is live.
    pub fn holder(&self, lease: &ShardLease) -> Option<&Member> {
        if lease.lease_until_ms <= self.now_ms {
            return None;
        }
        self.live().find(|member| member.server == lease.owner)
    }

    /// The members alive at the view's time (renewed within their lease).
    pub fn live(&self) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .filter(|member| member.seen_until_ms > self.now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard's owner is the live member of a live lease; the lookup is by
    /// shard over leases in shard order.
    #[test]
    fn a_shard_is_owned_by_the_live_member_of_a_live_lease() {
        let member = |server: &str, seen_until_ms| Member {
            server: server.into(),
            address: format!("{server}:1"),
            started_ms: 0,
            seen_until_ms,
            spreads: false,
        };
        let view = ClusterView {
            now_ms: 1_000,
            members: vec![member("a", 2_000), member("b", 2_000), member("gone", 500)],
            shards: (0..=u8::MAX)
                .map(|shard| ShardLease {
                    shard,
                    owner: ["a", "b", "gone"][usize::from(shard % 3)].into(),
                    epoch: 1,
                    lease_until_ms: if shard == 9 { 999 } else { 1_500 },
                })
                .collect(),
        };
        let owner = |shard| view.owner_of(shard).map(|m| m.server.as_str());
        assert_eq!(owner(0), Some("a"));
        assert_eq!(owner(255), Some("a"));
        assert_eq!(owner(4), Some("b"));
        assert_eq!(owner(2), None, "its member is no longer seen");
        assert_eq!(owner(9), None, "its lease lapsed");
    }

    /// Servers of one cluster must agree on a group's shard, across
    /// versions too: these values may never change.
    #[test]
    fn a_groups_shard_is_fixed_by_its_name() {
        assert_eq!(group_shard(""), 197);
        assert_eq!(group_shard("audit"), 168);
        assert_eq!(group_shard("billing.approvals"), 26);
    }
}
