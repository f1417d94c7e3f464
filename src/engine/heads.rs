//! "Head moved" notifications for followers of a run. A follower subscribes,
//! then reads the store; the driver publishes a run's last seq after each
//! durable append. A slow follower only delays its own reads.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::store::RunId;

#[derive(Default)]
pub struct Heads {
    runs: Mutex<HashMap<RunId, watch::Sender<u64>>>,
}

impl Heads {
    /// A receiver that changes whenever the run's durable head moves.
    pub fn subscribe(&self, run: RunId) -> watch::Receiver<u64> {
        let mut runs = self.runs.lock().expect("poisoned");
        // Forget runs nobody follows any more, now and then.
        if runs.len() >= 1024 && runs.len().is_power_of_two() {
            runs.retain(|_, sender| sender.receiver_count() > 0);
        }
        runs.entry(run)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Tells every follower to look again (which runs moved is unknown).
    pub fn touch_all(&self) {
        let runs = self.runs.lock().expect("poisoned");
        for sender in runs.values() {
            sender.send_modify(|_| {});
        }
    }

    pub fn publish(&self, run: RunId, last_seq: u64) {
        let mut runs = self.runs.lock().expect("poisoned");
        if let Some(sender) = runs.get(&run) {
            if sender.receiver_count() == 0 {
                runs.remove(&run);
            } else {
                sender.send_replace(last_seq);
            }
        }
    }
}
