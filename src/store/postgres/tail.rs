//! The newest events this server committed, kept in memory so that the
//! readers that follow the log (StreamEvents followers, WatchApprovals,
//! consumer groups, the engine loading a young run) are answered without a
//! query. A follower reads each run about three times per approval cycle;
//! on PostgreSQL each read was a round trip and a statement, more database
//! time than committing the cycle's approval.
//!
//! A store answers from it only the shards it holds, and only while their
//! leases cannot have lapsed (see `Ownership::holds_for_sure`: a paused
//! owner that wakes reads the database until it renewed them): then every
//! commit to those shards is its own. Per shard, the tail knows from which
//! position on it holds every event of the shard (the head its first
//! commit there found); a read it cannot answer whole from there (a run of
//! a shard held by another server, a log read past another's commits) goes
//! to the database. A store holding none never answers from it, and any
//! change of the shards held empties it, so events another server
//! committed meanwhile are never missed. (Until spread shards became the
//! default only a store holding every shard used it; a spread server then
//! read every run from the database.)

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::store::{Cursor, EventRecord, RunId, Shards};

/// Most events kept, and most bytes of their data: enough for readers that
/// follow close behind the commits, small beside the engine's caches.
const MOST_EVENTS: usize = 16_384;
const MOST_BYTES: usize = 16 << 20;

pub(super) struct Tail {
    state: Mutex<State>,
}

/// What the tail holds of one shard: every event after `from`, up to
/// `last`.
#[derive(Clone, Copy)]
struct Held {
    from: u64,
    last: u64,
}

struct State {
    /// The shards this store holds; the tail empties when they change.
    holding: watch::Receiver<Shards>,
    /// Events in commit order (positions rising), this store's newest
    /// commit's last.
    events: VecDeque<EventRecord>,
    /// How many events were ever dropped from the front: an event's index
    /// in `events` is its number minus this.
    dropped: u64,
    /// Each run's seqs in `events`, oldest first, with their numbers.
    runs: HashMap<RunId, VecDeque<(u64, u64)>>,
    /// Per shard, what is held of it (none: nothing can be answered).
    shards: HashMap<u8, Held>,
    bytes: usize,
}

impl Tail {
    pub fn new(holding: watch::Receiver<Shards>) -> Tail {
        Tail {
            state: Mutex::new(State {
                holding,
                events: VecDeque::new(),
                dropped: 0,
                runs: HashMap::new(),
                shards: HashMap::new(),
                bytes: 0,
            }),
        }
    }

    /// Keeps the events of a commit, in position order; `before` holds the
    /// heads of the shards the commit touched as it found them. A commit
    /// that does not follow what is kept of a shard (another server
    /// committed there in between) starts the tail again.
    pub fn committed(
        &self,
        events: impl IntoIterator<Item = EventRecord>,
        before: &BTreeMap<u8, u64>,
    ) {
        let mut state = self.state.lock().expect("poisoned");
        if !state.serves() {
            return;
        }
        let follows = before
            .iter()
            .all(|(shard, head)| state.shards.get(shard).is_none_or(|h| h.last == *head));
        if !follows {
            state.clear();
        }
        for (&shard, &head) in before {
            state.shards.entry(shard).or_insert(Held {
                from: head,
                last: head,
            });
        }
        for event in events {
            state.push(event);
        }
    }

    /// Events past `after`, at most `limit`, if the tail holds every one
    /// of them up to `durable` in each shard.
    pub fn log_after(
        &self,
        after: &Cursor,
        limit: usize,
        durable: &Cursor,
    ) -> Option<Vec<EventRecord>> {
        let mut state = self.state.lock().expect("poisoned");
        if !state.serves() {
            return None;
        }
        // Shards whose events past the cursor are all held, and the lowest
        // position a read must look at.
        let mut answered = [false; crate::domain::SHARDS];
        let mut lowest = u64::MAX;
        for (shard, durable) in durable.shards() {
            let after = after.after(shard);
            match state.shards.get(&shard) {
                Some(held) if held.from <= after && held.last >= durable => {
                    answered[usize::from(shard)] = true;
                    lowest = lowest.min(after);
                }
                // Nothing new there as far as anyone knows: skip it now.
                _ if durable <= after => {}
                _ => return None,
            }
        }
        let start = state.events.partition_point(|e| e.position <= lowest);
        let events = state
            .events
            .range(start..)
            .filter(|e| {
                RunId::from_slice(&e.run_id).is_some_and(|run| {
                    answered[usize::from(run.shard())] && after.passes(run, e.position)
                })
            })
            .take(limit)
            .cloned()
            .collect();
        Some(events)
    }

    /// `run`'s events with seq > `after_seq`, at most `limit`, if the tail
    /// holds all of them up to `durable` (the run's shard's): it must hold
    /// the run's event at `after_seq + 1` or an earlier one, for those come
    /// before the rest.
    pub fn run_events(
        &self,
        run: RunId,
        after_seq: u64,
        limit: usize,
        durable: u64,
    ) -> Option<Vec<EventRecord>> {
        let mut state = self.state.lock().expect("poisoned");
        if !state.serves() {
            return None;
        }
        let held = state.shards.get(&run.shard())?;
        if held.last < durable {
            return None;
        }
        let seqs = state.runs.get(&run)?;
        let (oldest, _) = *seqs.front()?;
        if oldest > after_seq.saturating_add(1) {
            return None;
        }
        let events = seqs
            .iter()
            .filter(|(seq, _)| *seq > after_seq)
            .take(limit)
            .map(|(_, number)| state.events[(number - state.dropped) as usize].clone())
            .collect();
        Some(events)
    }

    /// `run`'s event at `seq`, if the tail holds it.
    pub fn event(&self, run: RunId, seq: u64) -> Option<EventRecord> {
        let mut state = self.state.lock().expect("poisoned");
        if !state.serves() {
            return None;
        }
        let seqs = state.runs.get(&run)?;
        let &(_, number) = seqs.iter().find(|(s, _)| *s == seq)?;
        Some(state.events[(number - state.dropped) as usize].clone())
    }

    /// Forgets everything (a commit deleted runs: retention).
    pub fn clear(&self) {
        self.state.lock().expect("poisoned").clear();
    }

    /// The heads of `shards` as this store's own commits left them, if it
    /// holds each of them still and committed to each since the tail
    /// started (their heads then are what its commits found and made).
    pub fn heads(&self, shards: &[i16]) -> Option<BTreeMap<u8, u64>> {
        let mut state = self.state.lock().expect("poisoned");
        if !state.serves() {
            return None;
        }
        shards
            .iter()
            .map(|&shard| {
                let shard = u8::try_from(shard).ok()?;
                Some((shard, state.shards.get(&shard)?.last))
            })
            .collect()
    }
}

impl State {
    /// Whether this store holds shards; empties the tail first when the
    /// shards held changed since it last looked. (What it keeps is of
    /// shards it held since: those of its own commits.)
    fn serves(&mut self) -> bool {
        if self.holding.has_changed().unwrap_or(true) {
            self.holding.borrow_and_update();
            self.clear();
        }
        !self.holding.borrow().is_empty()
    }

    fn push(&mut self, event: EventRecord) {
        let Some(run) = RunId::from_slice(&event.run_id) else {
            // Not a run's (never written so): keep nothing rather than a gap.
            self.clear();
            return;
        };
        let rises = self
            .events
            .back()
            .is_none_or(|l| l.position < event.position);
        let Some(held) = self.shards.get_mut(&run.shard()).filter(|_| rises) else {
            // A commit's events come with their shards' heads: never here.
            self.clear();
            return;
        };
        held.last = event.position;
        self.bytes += size(&event);
        let number = self.dropped + self.events.len() as u64;
        self.runs
            .entry(run)
            .or_default()
            .push_back((event.seq, number));
        self.events.push_back(event);
        while self.events.len() > MOST_EVENTS || self.bytes > MOST_BYTES {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        let Some(event) = self.events.pop_front() else {
            return;
        };
        self.dropped += 1;
        self.bytes -= size(&event);
        if let Some(run) = RunId::from_slice(&event.run_id) {
            // What came before the oldest kept is the database's.
            if let Some(held) = self.shards.get_mut(&run.shard()) {
                held.from = held.from.max(event.position);
            }
            if let Some(seqs) = self.runs.get_mut(&run) {
                seqs.pop_front();
                if seqs.is_empty() {
                    self.runs.remove(&run);
                }
            }
        }
    }

    fn clear(&mut self) {
        self.dropped += self.events.len() as u64;
        self.events.clear();
        self.runs.clear();
        self.shards.clear();
        self.bytes = 0;
    }
}

/// What an event weighs in the tail: its text fields.
fn size(event: &EventRecord) -> usize {
    event.data_json.len()
        + event.event_type.len()
        + event.actor_name.len()
        + event.actor_principal.len()
        + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run in shard `shard`.
    fn run(n: u8, shard: u8) -> RunId {
        let mut bytes = [n; 16];
        bytes[15] = shard;
        RunId::from_slice(&bytes).unwrap()
    }

    fn event(run: RunId, seq: u64, position: u64) -> EventRecord {
        EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            position,
            event_type: format!("t.{seq}"),
            data_json: "{}".into(),
            ..Default::default()
        }
    }

    fn owning_all() -> (watch::Sender<Shards>, Tail) {
        let (holding, receiver) = watch::channel(Shards::all());
        (holding, Tail::new(receiver))
    }

    fn seqs(events: Option<Vec<EventRecord>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|e| e.seq).collect())
    }

    fn heads(pairs: &[(u8, u64)]) -> BTreeMap<u8, u64> {
        pairs.iter().copied().collect()
    }

    /// The durable heads: `at` everywhere, `moved` where given.
    fn durable(at: u64, moved: &[(u8, u64)]) -> Cursor {
        let mut cursor = Cursor::at(at);
        for &(shard, head) in moved {
            cursor.advance(shard, head);
        }
        cursor
    }

    #[test]
    fn answers_what_it_holds_whole_and_nothing_else() {
        let (_holding, tail) = owning_all();
        let (a, b) = (run(1, 1), run(2, 2));
        // Run a's first two events came before the tail started; shard 1's
        // head was 9, shard 2's 0.
        tail.committed(
            [event(a, 3, 10), event(b, 1, 11), event(a, 4, 12)],
            &heads(&[(1, 9), (2, 0)]),
        );
        let now = durable(0, &[(1, 12), (2, 11)]);
        assert_eq!(seqs(tail.run_events(a, 2, 100, 12)), Some(vec![3, 4]));
        assert_eq!(seqs(tail.run_events(a, 3, 100, 12)), Some(vec![4]));
        assert_eq!(seqs(tail.run_events(a, 4, 100, 12)), Some(vec![]));
        assert_eq!(
            seqs(tail.run_events(a, 0, 100, 12)),
            None,
            "seqs 1, 2 are not held"
        );
        assert_eq!(seqs(tail.run_events(b, 0, 1, 11)), Some(vec![1]));
        assert_eq!(seqs(tail.run_events(run(3, 3), 0, 100, 0)), None);
        let mut after = durable(0, &[(1, 9)]);
        assert_eq!(seqs(tail.log_after(&after, 2, &now)), Some(vec![3, 1]));
        after.advance(1, 10);
        assert_eq!(seqs(tail.log_after(&after, 100, &now)), Some(vec![1, 4]));
        assert_eq!(seqs(tail.log_after(&now, 100, &now)), Some(vec![]));
        assert_eq!(
            seqs(tail.log_after(&durable(0, &[(1, 8)]), 100, &now)),
            None,
            "shard 1's position 9 is not held"
        );
        assert_eq!(tail.event(a, 4).map(|e| e.position), Some(12));
        // The database is further on in shard 1 (another commit was heard
        // of): the tail cannot say what is after its end there.
        let further = durable(0, &[(1, 13), (2, 11)]);
        assert_eq!(seqs(tail.run_events(a, 2, 100, 13)), None);
        assert_eq!(
            seqs(tail.log_after(&durable(0, &[(1, 9)]), 100, &further)),
            None
        );
        // Shard 7 had events long ago, none since: reads need not go there.
        let old = durable(0, &[(1, 12), (2, 11), (7, 5)]);
        let past_old = durable(0, &[(1, 9), (7, 5)]);
        assert_eq!(
            seqs(tail.log_after(&past_old, 100, &old)),
            Some(vec![3, 1, 4])
        );
    }

    #[test]
    fn a_commit_that_does_not_follow_starts_it_again() {
        let (_holding, tail) = owning_all();
        let a = run(1, 1);
        tail.committed([event(a, 1, 1), event(a, 2, 2)], &heads(&[(1, 0)]));
        // Positions 3 and 4 were someone else's, in shard 1.
        tail.committed([event(a, 5, 5)], &heads(&[(1, 4)]));
        assert_eq!(seqs(tail.run_events(a, 0, 100, 5)), None);
        assert_eq!(seqs(tail.run_events(a, 4, 100, 5)), Some(vec![5]));
        let now = durable(0, &[(1, 5)]);
        assert_eq!(seqs(tail.log_after(&Cursor::at(2), 100, &now)), None);
        assert_eq!(
            seqs(tail.log_after(&Cursor::at(4), 100, &now)),
            Some(vec![5])
        );
    }

    #[test]
    fn commits_of_other_shards_between_do_not_break_it() {
        let (_holding, tail) = owning_all();
        let (a, b) = (run(1, 1), run(2, 2));
        tail.committed([event(a, 1, 1)], &heads(&[(1, 0)]));
        // Positions 2 to 6 went to rounds that were refused, or to shard 9.
        tail.committed([event(b, 1, 7)], &heads(&[(2, 0)]));
        tail.committed([event(a, 2, 8)], &heads(&[(1, 1)]));
        let now = durable(0, &[(1, 8), (2, 7)]);
        assert_eq!(seqs(tail.run_events(a, 0, 100, 8)), Some(vec![1, 2]));
        assert_eq!(
            seqs(tail.log_after(&Cursor::start(), 100, &now)),
            Some(vec![1, 1, 2])
        );
    }

    #[test]
    fn holding_a_share_or_a_change_of_shards_empties_it() {
        let (holding, tail) = owning_all();
        let a = run(1, 1);
        tail.committed([event(a, 1, 1)], &heads(&[(1, 0)]));
        holding.send_replace(Shards::none());
        let one = durable(0, &[(1, 1)]);
        assert_eq!(seqs(tail.log_after(&Cursor::start(), 100, &one)), None);
        tail.committed([event(a, 2, 2)], &heads(&[(1, 1)]));
        let two = durable(0, &[(1, 2)]);
        assert_eq!(
            seqs(tail.log_after(&Cursor::at(1), 100, &two)),
            None,
            "a standby keeps nothing"
        );
        // Claimed again: what it held before is gone, for others may have
        // committed while it did not hold the shards.
        holding.send_replace(Shards::all());
        assert_eq!(seqs(tail.run_events(a, 0, 100, 2)), None);
        tail.committed([event(a, 3, 3)], &heads(&[(1, 2)]));
        assert_eq!(seqs(tail.run_events(a, 2, 100, 3)), Some(vec![3]));
    }

    /// The heads a committer may use instead of reading them: those of
    /// shards it committed to since the tail started, and none once the
    /// shards held change.
    #[test]
    fn it_knows_the_heads_of_the_shards_it_committed_to() {
        let (holding, tail) = owning_all();
        let (a, b) = (run(1, 1), run(2, 2));
        assert_eq!(tail.heads(&[]), Some(heads(&[])));
        assert_eq!(tail.heads(&[1]), None, "never committed to");
        tail.committed([event(a, 1, 4), event(a, 2, 6)], &heads(&[(1, 3)]));
        // A round whose batch for shard 2 was refused: its head as found.
        tail.committed(Vec::new(), &heads(&[(2, 5)]));
        assert_eq!(tail.heads(&[1, 2]), Some(heads(&[(1, 6), (2, 5)])));
        assert_eq!(tail.heads(&[1, 3]), None);
        tail.committed([event(b, 1, 9)], &heads(&[(2, 5)]));
        assert_eq!(tail.heads(&[2]), Some(heads(&[(2, 9)])));
        holding.send_replace(Shards::none());
        holding.send_replace(Shards::all());
        assert_eq!(tail.heads(&[1]), None, "the shards held changed");
    }

    /// A spread server holds a share: it answers its own runs from memory
    /// and leaves everything else (another server's run, a log read that
    /// another server's commits moved) to the database.
    #[test]
    fn a_share_is_answered_for_its_own_shards_only() {
        let share: Shards = [1, 2].into_iter().collect();
        let (_holding, receiver) = watch::channel(share);
        let tail = Tail::new(receiver);
        let (mine, theirs) = (run(1, 1), run(2, 3));
        tail.committed([event(mine, 1, 10)], &heads(&[(1, 9)]));
        assert_eq!(seqs(tail.run_events(mine, 0, 100, 10)), Some(vec![1]));
        assert_eq!(seqs(tail.run_events(theirs, 0, 100, 0)), None);
        assert_eq!(tail.event(mine, 1).map(|e| e.position), Some(10));
        let only_mine = durable(9, &[(1, 10)]);
        assert_eq!(
            seqs(tail.log_after(&Cursor::at(9), 100, &only_mine)),
            Some(vec![1])
        );
        let theirs_moved = durable(9, &[(1, 10), (3, 11)]);
        assert_eq!(
            seqs(tail.log_after(&Cursor::at(9), 100, &theirs_moved)),
            None
        );
    }

    #[test]
    fn the_oldest_go_first_past_the_bound() {
        let (_holding, tail) = owning_all();
        let a = run(1, 1);
        let many: Vec<EventRecord> = (1..=MOST_EVENTS as u64 + 2)
            .map(|n| event(a, n, n))
            .collect();
        tail.committed(many, &heads(&[(1, 0)]));
        let last = MOST_EVENTS as u64 + 2;
        assert_eq!(seqs(tail.run_events(a, 1, 100, last)), None);
        assert_eq!(
            seqs(tail.run_events(a, 2, 1, last)),
            Some(vec![3]),
            "seq 3 is the oldest kept"
        );
        let now = durable(0, &[(1, last)]);
        assert_eq!(seqs(tail.log_after(&Cursor::at(1), 100, &now)), None);
        assert_eq!(
            tail.log_after(&Cursor::at(2), usize::MAX, &now)
                .map(|e| e.len()),
            Some(MOST_EVENTS)
        );
    }
}
