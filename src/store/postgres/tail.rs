//! The newest events this server committed, kept in memory so that the
//! readers that follow the log (StreamEvents followers, WatchApprovals,
//! consumer groups, the engine loading a young run) are answered without a
//! query. A follower reads each run about three times per approval cycle;
//! on PostgreSQL each read was a round trip and a statement, more database
//! time than committing the cycle's approval.
//!
//! Only a store that holds every shard uses it (a single server, or the
//! owner of a one-owner cluster), and only while its leases cannot have
//! lapsed (see `Ownership::holds_all_for_sure`: a paused owner that wakes
//! reads the database until it renewed them): then every commit on the
//! database is its own, and the tail, kept contiguous by position up to
//! its last commit, is the log's end. A store holding a share, or none,
//! never answers from it, and any change of the shards held empties it,
//! so events another server committed meanwhile are never missed: a read
//! the tail cannot answer whole goes to the database as before.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::store::{EventRecord, RunId, Shards};

/// Most events kept, and most bytes of their data: enough for readers that
/// follow close behind the commits, small beside the engine's caches.
const MOST_EVENTS: usize = 16_384;
const MOST_BYTES: usize = 16 << 20;

pub(super) struct Tail {
    state: Mutex<State>,
}

struct State {
    /// The shards this store holds; the tail empties when they change.
    holding: watch::Receiver<Shards>,
    /// Events at consecutive positions, the last one this store's newest
    /// commit's.
    events: VecDeque<EventRecord>,
    /// Each run's seqs in `events`, oldest first, with their positions.
    runs: HashMap<RunId, VecDeque<(u64, u64)>>,
    bytes: usize,
}

impl Tail {
    pub fn new(holding: watch::Receiver<Shards>) -> Tail {
        Tail {
            state: Mutex::new(State {
                holding,
                events: VecDeque::new(),
                runs: HashMap::new(),
                bytes: 0,
            }),
        }
    }

    /// Keeps the events of a commit, in position order. A commit that does
    /// not follow the last one kept (another server committed in between)
    /// starts the tail again.
    pub fn committed(&self, events: impl IntoIterator<Item = EventRecord>) {
        let mut state = self.state.lock().expect("poisoned");
        if !state.serves() {
            return;
        }
        for event in events {
            state.push(event);
        }
    }

    /// Events with positions after `after`, at most `limit`, if the tail
    /// holds all of them up to `durable`.
    pub fn log_after(&self, after: u64, limit: usize, durable: u64) -> Option<Vec<EventRecord>> {
        let mut state = self.state.lock().expect("poisoned");
        let first = state.covers(durable)?;
        let skip = after.checked_add(1)?.checked_sub(first)?;
        let skip = usize::try_from(skip).ok()?;
        if skip > state.events.len() {
            return None;
        }
        Some(
            state
                .events
                .iter()
                .skip(skip)
                .take(limit)
                .cloned()
                .collect(),
        )
    }

    /// `run`'s events with seq > `after_seq`, at most `limit`, if the tail
    /// holds all of them up to `durable`: it must hold the run's event at
    /// `after_seq + 1` or an earlier one, for those come before the rest.
    pub fn run_events(
        &self,
        run: RunId,
        after_seq: u64,
        limit: usize,
        durable: u64,
    ) -> Option<Vec<EventRecord>> {
        let mut state = self.state.lock().expect("poisoned");
        let first = state.covers(durable)?;
        let held = state.runs.get(&run)?;
        let (oldest, _) = *held.front()?;
        if oldest > after_seq.saturating_add(1) {
            return None;
        }
        let events = held
            .iter()
            .filter(|(seq, _)| *seq > after_seq)
            .take(limit)
            .map(|(_, position)| state.events[(position - first) as usize].clone())
            .collect();
        Some(events)
    }

    /// `run`'s event at `seq`, if the tail holds it.
    pub fn event(&self, run: RunId, seq: u64) -> Option<EventRecord> {
        let mut state = self.state.lock().expect("poisoned");
        let first = state.covers(0)?;
        let held = state.runs.get(&run)?;
        let &(_, position) = held.iter().find(|(s, _)| *s == seq)?;
        Some(state.events[(position - first) as usize].clone())
    }

    /// Forgets everything (a commit deleted runs: retention).
    pub fn clear(&self) {
        self.state.lock().expect("poisoned").clear();
    }
}

impl State {
    /// Whether this store holds every shard; empties the tail first when
    /// the shards held changed since it last looked.
    fn serves(&mut self) -> bool {
        if self.holding.has_changed().unwrap_or(true) {
            self.holding.borrow_and_update();
            self.clear();
        }
        self.holding.borrow().is_all()
    }

    /// The first position held, when the tail may answer a read at the
    /// durable position `durable`: it serves and reaches that far.
    fn covers(&mut self, durable: u64) -> Option<u64> {
        if !self.serves() {
            return None;
        }
        let first = self.events.front()?.position;
        let last = self.events.back()?.position;
        (last >= durable).then_some(first)
    }

    fn push(&mut self, event: EventRecord) {
        let follows = self
            .events
            .back()
            .is_none_or(|last| last.position + 1 == event.position);
        if !follows {
            self.clear();
        }
        let Some(run) = RunId::from_slice(&event.run_id) else {
            // Not a run's (never written so): keep nothing rather than a gap.
            self.clear();
            return;
        };
        self.bytes += size(&event);
        self.runs
            .entry(run)
            .or_default()
            .push_back((event.seq, event.position));
        self.events.push_back(event);
        while self.events.len() > MOST_EVENTS || self.bytes > MOST_BYTES {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        let Some(event) = self.events.pop_front() else {
            return;
        };
        self.bytes -= size(&event);
        if let Some(run) = RunId::from_slice(&event.run_id) {
            if let Some(held) = self.runs.get_mut(&run) {
                held.pop_front();
                if held.is_empty() {
                    self.runs.remove(&run);
                }
            }
        }
    }

    fn clear(&mut self) {
        self.events.clear();
        self.runs.clear();
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

    fn run(n: u8) -> RunId {
        RunId::from_slice(&[n; 16]).unwrap()
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

    #[test]
    fn answers_what_it_holds_whole_and_nothing_else() {
        let (_holding, tail) = owning_all();
        let (a, b) = (run(1), run(2));
        // Run a's first two events came before the tail started.
        tail.committed([event(a, 3, 10), event(b, 1, 11), event(a, 4, 12)]);
        assert_eq!(seqs(tail.run_events(a, 2, 100, 12)), Some(vec![3, 4]));
        assert_eq!(seqs(tail.run_events(a, 3, 100, 12)), Some(vec![4]));
        assert_eq!(seqs(tail.run_events(a, 4, 100, 12)), Some(vec![]));
        assert_eq!(
            seqs(tail.run_events(a, 0, 100, 12)),
            None,
            "seqs 1, 2 are not held"
        );
        assert_eq!(seqs(tail.run_events(b, 0, 1, 12)), Some(vec![1]));
        assert_eq!(seqs(tail.run_events(run(3), 0, 100, 12)), None);
        assert_eq!(seqs(tail.log_after(9, 2, 12)), Some(vec![3, 1]));
        assert_eq!(seqs(tail.log_after(12, 100, 12)), Some(vec![]));
        assert_eq!(
            seqs(tail.log_after(8, 100, 12)),
            None,
            "position 9 is not held"
        );
        assert_eq!(tail.event(a, 4).map(|e| e.position), Some(12));
        // The database is further on (another commit was heard of): the
        // tail cannot say what is after its end.
        assert_eq!(seqs(tail.run_events(a, 2, 100, 13)), None);
        assert_eq!(seqs(tail.log_after(9, 100, 13)), None);
    }

    #[test]
    fn a_commit_that_does_not_follow_starts_it_again() {
        let (_holding, tail) = owning_all();
        let a = run(1);
        tail.committed([event(a, 1, 1), event(a, 2, 2)]);
        // Positions 3 and 4 were someone else's.
        tail.committed([event(a, 5, 5)]);
        assert_eq!(seqs(tail.run_events(a, 0, 100, 5)), None);
        assert_eq!(seqs(tail.run_events(a, 4, 100, 5)), Some(vec![5]));
        assert_eq!(seqs(tail.log_after(2, 100, 5)), None);
        assert_eq!(seqs(tail.log_after(4, 100, 5)), Some(vec![5]));
    }

    #[test]
    fn holding_a_share_or_a_change_of_shards_empties_it() {
        let (holding, tail) = owning_all();
        let a = run(1);
        tail.committed([event(a, 1, 1)]);
        holding.send_replace(Shards::none());
        assert_eq!(seqs(tail.log_after(0, 100, 1)), None);
        tail.committed([event(a, 2, 2)]);
        assert_eq!(
            seqs(tail.log_after(1, 100, 2)),
            None,
            "a standby keeps nothing"
        );
        // Claimed again: what it held before is gone, for others may have
        // committed while it did not hold the shards.
        holding.send_replace(Shards::all());
        assert_eq!(seqs(tail.run_events(a, 0, 100, 2)), None);
        tail.committed([event(a, 3, 3)]);
        assert_eq!(seqs(tail.run_events(a, 2, 100, 3)), Some(vec![3]));
    }

    #[test]
    fn the_oldest_go_first_past_the_bound() {
        let (_holding, tail) = owning_all();
        let a = run(1);
        let many: Vec<EventRecord> = (1..=MOST_EVENTS as u64 + 2)
            .map(|n| event(a, n, n))
            .collect();
        tail.committed(many);
        let last = MOST_EVENTS as u64 + 2;
        assert_eq!(seqs(tail.run_events(a, 1, 100, last)), None);
        assert_eq!(
            seqs(tail.run_events(a, 2, 1, last)),
            Some(vec![3]),
            "seq 3 is the oldest kept"
        );
        assert_eq!(
            tail.log_after(2, usize::MAX, last).map(|e| e.len()),
            Some(MOST_EVENTS)
        );
    }
}
