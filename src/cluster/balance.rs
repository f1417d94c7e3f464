//! How the servers of a cluster share the shards out (the default on
//! PostgreSQL; `--one-owner` makes one server own them all instead).
//! Each shard belongs to the live member that ranks highest for it
//! (rendezvous hashing: when a member comes or goes, only the shards it
//! ranks highest for move). Every server looks every third of its lease:
//! it gives up at once the shards that now belong to another live member,
//! so that member need not wait for a lease to lapse, and claims the
//! shards that belong to it once their lease has lapsed (given up, or
//! left by a server that died). The views of two servers may differ for a
//! moment; the store's fence keeps them from ever writing one shard both.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{Claim, ClusterView, Shards, SharedStore};

/// The most a server waits between two looks.
const LOOK_AT_MOST_EVERY: Duration = Duration::from_millis(500);

/// The shards that belong to `server` among the live members of `view`
/// that spread (none if it is not one of them).
pub fn share_of(view: &ClusterView, server: &str) -> Shards {
    let live: Vec<&str> = view
        .live()
        .filter(|member| member.spreads)
        .map(|member| member.server.as_str())
        .collect();
    (0..=u8::MAX)
        .filter(|shard| {
            live.iter()
                .max_by_key(|member| (rank(member, *shard), **member))
                .is_some_and(|best| *best == server)
        })
        .collect()
}

/// The live members of `view` other than `server` that run the other way
/// (one owner where `spreads`, or spreading where not). A server must not
/// join them: one owner's standbys would wait for shards the spreading
/// servers never give up, and the spreading ones would leave the owner's
/// shards to a claim that never comes.
pub fn other_way<'a>(view: &'a ClusterView, server: &str, spreads: bool) -> Vec<&'a str> {
    view.live()
        .filter(|m| m.server != server && m.spreads != spreads)
        .map(|m| m.server.as_str())
        .collect()
}

/// How much `server` wants `shard`: a stable hash of both (FNV-1a, then a
/// mix so that nearby names spread), the same on every server and version.
fn rank(server: &str, shard: u8) -> u64 {
    let fnv = server
        .bytes()
        .chain([0, shard])
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    // splitmix64's finaliser.
    let mut z = fnv;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Keeps this server's share of the shards until `stop`: gives up what
/// belongs elsewhere, claims what belongs here. The server's engine
/// follows what the store holds (`Store::held_shards`).
pub async fn keep_share(store: SharedStore, server: String, claim: Claim, stop: CancellationToken) {
    let every = (claim.lease / 3).min(LOOK_AT_MOST_EVERY);
    loop {
        if let Err(e) = look(&store, &server, claim).await {
            tracing::warn!("could not balance the shards: {e}");
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// One look: release the surplus, claim the lapsed shards of the share.
async fn look(store: &SharedStore, server: &str, claim: Claim) -> crate::store::Result<()> {
    let view = store.cluster().await?;
    let share = share_of(&view, server);
    if share.is_empty() {
        // Not (yet, or any more) a live member: keep what is held until
        // the view says who takes it.
        return Ok(());
    }
    let held = *store.held_shards().borrow();
    let surplus = held.minus(&share);
    if !surplus.is_empty() {
        tracing::info!("giving shards {surplus:?} up to the servers they now belong to");
        store.release_shards(surplus).await?;
    }
    let missing = share.minus(&held);
    if !missing.is_empty() {
        let claimed = store.claim_shards(server, claim, missing).await?;
        if !claimed.is_empty() {
            tracing::info!("claimed shards {claimed:?}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Member;

    fn view(servers: &[&str]) -> ClusterView {
        ClusterView {
            now_ms: 1_000,
            members: servers
                .iter()
                .map(|server| Member {
                    server: server.to_string(),
                    address: String::new(),
                    started_ms: 0,
                    seen_until_ms: 2_000,
                    spreads: true,
                })
                .collect(),
            shards: Vec::new(),
        }
    }

    #[test]
    fn every_shard_belongs_to_exactly_one_live_member_and_shares_are_even() {
        let servers = [
            "10.0.0.1:50051 pid 7",
            "10.0.0.2:50051 pid 8",
            "10.0.0.3:50051 pid 9",
        ];
        let view = view(&servers);
        let shares: Vec<Shards> = servers.iter().map(|s| share_of(&view, s)).collect();
        let total: usize = shares.iter().map(Shards::len).sum();
        assert_eq!(total, crate::domain::SHARDS);
        assert_eq!(shares[0].union(&shares[1]).union(&shares[2]), Shards::all());
        for share in &shares {
            // 85 each would be exact; rendezvous is within a few of it.
            assert!((60..=110).contains(&share.len()), "{share:?}");
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_shards() {
        let three = ["a:1 pid 1", "b:1 pid 2", "c:1 pid 3"];
        let before: Vec<Shards> = three.iter().map(|s| share_of(&view(&three), s)).collect();
        let two = view(&three[..2]);
        for (i, server) in three[..2].iter().enumerate() {
            let after = share_of(&two, server);
            assert_eq!(after.minus(&before[i]).minus(&before[2]), Shards::none());
            assert_eq!(before[i].minus(&after), Shards::none(), "kept what it had");
        }
    }

    #[test]
    fn only_members_that_spread_get_a_share_and_the_others_are_named() {
        let mut view = view(&["a:1 pid 1", "b:1 pid 2", "old:1 pid 3"]);
        view.members[2].spreads = false;
        assert!(share_of(&view, "old:1 pid 3").is_empty());
        let shares = share_of(&view, "a:1 pid 1").union(&share_of(&view, "b:1 pid 2"));
        assert!(shares.is_all(), "the two that spread share every shard");
        assert_eq!(other_way(&view, "a:1 pid 1", true), ["old:1 pid 3"]);
        assert_eq!(
            other_way(&view, "old:1 pid 3", false),
            ["a:1 pid 1", "b:1 pid 2"]
        );
        view.members[2].seen_until_ms = 999;
        assert!(
            other_way(&view, "a:1 pid 1", true).is_empty(),
            "its row lapsed"
        );
    }

    #[test]
    fn a_member_whose_row_lapsed_gets_nothing() {
        let mut view = view(&["a:1 pid 1", "b:1 pid 2"]);
        view.members[1].seen_until_ms = 999;
        assert!(share_of(&view, "a:1 pid 1").is_all());
        assert!(share_of(&view, "b:1 pid 2").is_empty());
    }
}
