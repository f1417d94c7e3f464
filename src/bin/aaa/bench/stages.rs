//! Where one approval cycle's time goes, at one run in flight: the moment
//! each party of the cycle (driver, approver, worker) sees its step, after
//! the driver sent StartRun. With one run at a time nothing queues, so the
//! gaps between the steps are the path's own costs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::stats::Summary;

/// The steps of a cycle, in the order of the path (the StartRun answer and
/// the approval request race: both follow the run's first commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The driver sent StartRun.
    Sent,
    /// The driver has StartRun's answer.
    Started,
    /// The approver saw the request on WatchApprovals.
    Requested,
    /// The approver has the grant's (Signal's) answer.
    Granted,
    /// The worker's poll answered with the task.
    Polled,
    /// The worker has CompleteTask's answer.
    Reported,
    /// The driver saw `aaa.run.completed` on StreamEvents.
    Completed,
}

const STEPS: [Step; 7] = [
    Step::Sent,
    Step::Started,
    Step::Requested,
    Step::Granted,
    Step::Polled,
    Step::Reported,
    Step::Completed,
];

impl Step {
    fn index(self) -> usize {
        STEPS.iter().position(|s| *s == self).expect("listed")
    }

    fn name(self) -> &'static str {
        match self {
            Step::Sent => "sent",
            Step::Started => "started",
            Step::Requested => "requested",
            Step::Granted => "granted",
            Step::Polled => "polled",
            Step::Reported => "reported",
            Step::Completed => "completed",
        }
    }
}

/// The moments of each run's steps, as the parties saw them.
#[derive(Default)]
pub struct Stamps {
    runs: Mutex<HashMap<String, [Option<Instant>; STEPS.len()]>>,
}

impl Stamps {
    pub fn mark(&self, run_id: &str, step: Step) {
        self.mark_at(run_id, step, Instant::now());
    }

    /// For the driver, which knows the run's id only once StartRun answers.
    pub fn mark_at(&self, run_id: &str, step: Step, at: Instant) {
        let mut runs = self.runs.lock().expect("poisoned");
        runs.entry(run_id.to_string()).or_default()[step.index()] = Some(at);
    }

    /// For each step, the time from StartRun sent to it, over the runs
    /// every step of which was seen.
    pub fn since_sent(&self) -> Vec<Offset> {
        let runs = self.runs.lock().expect("poisoned");
        let whole: Vec<Vec<Duration>> = runs
            .values()
            .filter_map(|moments| {
                let moments: Option<Vec<Instant>> = moments.iter().copied().collect();
                let moments = moments?;
                Some(
                    moments
                        .iter()
                        .map(|m| m.duration_since(moments[0]))
                        .collect(),
                )
            })
            .collect();
        STEPS
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, step)| {
                let mut samples: Vec<Duration> = whole.iter().map(|run| run[i]).collect();
                Offset {
                    step: step.name(),
                    since_sent: Summary::of(&mut samples),
                }
            })
            .collect()
    }
}

/// When a step came, after StartRun was sent.
#[derive(Debug, Serialize)]
pub struct Offset {
    pub step: &'static str,
    pub since_sent: Summary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_count_only_runs_seen_whole() {
        let stamps = Stamps::default();
        let t0 = Instant::now();
        for (i, step) in STEPS.iter().enumerate() {
            stamps.mark_at("whole", *step, t0 + Duration::from_millis(i as u64));
        }
        stamps.mark_at("partial", Step::Sent, t0);
        stamps.mark_at("partial", Step::Started, t0 + Duration::from_secs(9));
        let offsets = stamps.since_sent();
        assert_eq!(offsets.len(), STEPS.len() - 1);
        for (i, offset) in offsets.iter().enumerate() {
            assert_eq!(offset.since_sent.count, 1, "{}", offset.step);
            assert_eq!(offset.since_sent.p50_ms, (i + 1) as f64);
        }
        assert_eq!(offsets[0].step, "started");
    }
}
