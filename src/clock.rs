//! The engine's clock: wall time for events, deadlines and durable timers,
//! and monotonic time for leases, both read through one handle so a test
//! can move time forward instead of waiting for it.
//!
//! A server runs on [`Clock::system`]. [`Clock::manual`] is real time plus
//! an offset that only [`Clock::advance`] changes: a test starts a run with
//! a one-hour deadline, advances the clock by an hour, and the engine's
//! timer loop (which listens to [`Clock::advances`]) fires the deadline at
//! once. Time never goes back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A cheap, cloneable clock handle.
#[derive(Clone, Default)]
pub struct Clock {
    /// `None` on the system clock.
    offset: Option<Arc<Offset>>,
}

struct Offset {
    ms: AtomicU64,
    /// Bumped at each advance, for sleepers to wake.
    advanced: watch::Sender<u64>,
}

/// Wall time now, in Unix milliseconds: for what is compared across
/// servers and clients (signatures, grant expiry shown to a user), never
/// for the engine's own times (those come from its [`Clock`]).
pub fn now_ms() -> i64 {
    Clock::system().now_ms()
}

impl Clock {
    /// Real time.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// Real time plus an offset that [`Clock::advance`] moves forward.
    pub fn manual() -> Clock {
        Clock {
            offset: Some(Arc::new(Offset {
                ms: AtomicU64::new(0),
                advanced: watch::channel(0).0,
            })),
        }
    }

    fn offset(&self) -> Duration {
        self.offset.as_ref().map_or(Duration::ZERO, |o| {
            Duration::from_millis(o.ms.load(Ordering::Acquire))
        })
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (wall + self.offset()).as_millis() as i64
    }

    /// Monotonic time, for leases and waits.
    pub fn now(&self) -> Instant {
        Instant::now() + self.offset()
    }

    /// Moves a manual clock forward (whole milliseconds); does nothing on
    /// the system clock.
    pub fn advance(&self, by: Duration) {
        if let Some(offset) = &self.offset {
            offset.ms.fetch_add(by.as_millis() as u64, Ordering::AcqRel);
            offset.advanced.send_modify(|n| *n += 1);
        }
    }

    /// Advances from now on: a sleeper takes this before it computes how
    /// long to sleep, so an advance in between still wakes it.
    pub fn advances(&self) -> Advances {
        Advances(self.offset.as_ref().map(|o| o.advanced.subscribe()))
    }
}

/// See [`Clock::advances`].
pub struct Advances(Option<watch::Receiver<u64>>);

impl Advances {
    /// Marks the advances so far as seen.
    pub fn mark_seen(&mut self) {
        if let Some(advances) = &mut self.0 {
            advances.borrow_and_update();
        }
    }

    /// Completes at the first advance not yet seen; never on the system
    /// clock.
    pub async fn next(&mut self) {
        match &mut self.0 {
            Some(advances) => {
                if advances.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.offset {
            None => f.write_str("Clock::system"),
            Some(_) => write!(f, "Clock::manual(+{:?})", self.offset()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_moves_only_forward_and_wakes_sleepers() {
        let clock = Clock::manual();
        let (wall, mono) = (clock.now_ms(), clock.now());
        let mut advances = clock.advances();
        advances.mark_seen();
        clock.advance(Duration::from_secs(3600));
        advances.next().await;
        assert!(clock.now_ms() >= wall + 3_600_000);
        assert!(clock.now() >= mono + Duration::from_secs(3600));
        // The system clock ignores advances.
        let system = Clock::system();
        system.advance(Duration::from_secs(3600));
        assert!(system.now_ms() < wall + 3_600_000);
    }
}
