//! Leases of running attempts, in memory. A lease ends when its worker
//! reports, or expires when no heartbeat came in time; the engine then
//! records the lost attempt. Times come from the engine's clock. After a restart every running attempt gets a
//! fresh lease, so a worker that survived the restart can still report.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::domain::token::TaskKind;
use crate::seconds;
use crate::store::RunId;

#[derive(Debug, Clone)]
struct Lease {
    attempt: u32,
    /// Identity of the worker holding the attempt.
    worker: String,
    kind: TaskKind,
    timeout: Duration,
    expires: Instant,
}

/// An expired lease: the attempt it covered is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    pub run: RunId,
    pub call_id: String,
    pub attempt: u32,
    pub kind: TaskKind,
    pub worker: String,
}

pub struct Leases {
    clock: Clock,
    leases: Mutex<HashMap<(RunId, String), Lease>>,
}

impl Leases {
    pub fn new(clock: Clock) -> Leases {
        Leases {
            clock,
            leases: Mutex::default(),
        }
    }

    pub fn grant(
        &self,
        run: RunId,
        call_id: &str,
        attempt: u32,
        worker: &str,
        kind: TaskKind,
        timeout: Duration,
    ) {
        let lease = self.lease(attempt, worker, kind, timeout);
        self.leases
            .lock()
            .expect("poisoned")
            .insert((run, call_id.to_string()), lease);
    }

    fn lease(&self, attempt: u32, worker: &str, kind: TaskKind, timeout: Duration) -> Lease {
        Lease {
            attempt,
            worker: worker.to_string(),
            kind,
            timeout,
            expires: seconds::instant_after(self.clock.now(), timeout),
        }
    }

    /// Leases the attempt unless it is leased already: a model attempt
    /// offered twice (a timer re-offers what is dispatchable) is still
    /// handed out once. False when another holds it.
    pub fn grant_if_free(
        &self,
        run: RunId,
        call_id: &str,
        attempt: u32,
        worker: &str,
        kind: TaskKind,
        timeout: Duration,
    ) -> bool {
        let lease = self.lease(attempt, worker, kind, timeout);
        let mut leases = self.leases.lock().expect("poisoned");
        let key = (run, call_id.to_string());
        if leases.get(&key).is_some_and(|l| l.attempt == attempt) {
            return false;
        }
        leases.insert(key, lease);
        true
    }

    /// Extends the lease of this attempt; false when it holds none.
    pub fn renew(&self, run: RunId, call_id: &str, attempt: u32) -> bool {
        let now = self.clock.now();
        let mut leases = self.leases.lock().expect("poisoned");
        match leases.get_mut(&(run, call_id.to_string())) {
            Some(lease) if lease.attempt == attempt => {
                lease.expires = seconds::instant_after(now, lease.timeout);
                true
            }
            _ => false,
        }
    }

    /// The worker holding the call's lease.
    pub fn holder(&self, run: RunId, call_id: &str) -> Option<String> {
        self.leases
            .lock()
            .expect("poisoned")
            .get(&(run, call_id.to_string()))
            .map(|lease| lease.worker.clone())
    }

    /// Ends the lease of this attempt. A lease of a later attempt stays: the
    /// call's next attempt may have been handed out (and leased) between
    /// this one's result being recorded and this release.
    pub fn release(&self, run: RunId, call_id: &str, attempt: u32) {
        let mut leases = self.leases.lock().expect("poisoned");
        let key = (run, call_id.to_string());
        if leases.get(&key).is_some_and(|l| l.attempt == attempt) {
            leases.remove(&key);
        }
    }

    pub fn next_expiry(&self) -> Option<Instant> {
        self.leases
            .lock()
            .expect("poisoned")
            .values()
            .map(|l| l.expires)
            .min()
    }

    /// Removes and returns the leases expired by now.
    pub fn take_expired(&self) -> Vec<Expired> {
        let now = self.clock.now();
        let mut leases = self.leases.lock().expect("poisoned");
        let expired: Vec<(RunId, String)> = leases
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(key, _)| key.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|key| {
                let lease = leases.remove(&key)?;
                Some(Expired {
                    run: key.0,
                    call_id: key.1,
                    attempt: lease.attempt,
                    kind: lease.kind,
                    worker: lease.worker,
                })
            })
            .collect()
    }
}
