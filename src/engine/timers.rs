//! The timer loop: durable timers (deadlines, approval timeouts, reminders,
//! retries) fired at their due time, and attempts whose lease expired
//! recorded as lost.

use super::*;

impl Engine {
    pub(super) async fn run_timers(self) {
        let clock = self.clock().clone();
        let mut advances = clock.advances();
        let mut next_durable = None;
        loop {
            advances.mark_seen();
            let now = clock.now();
            let next_lease = self.inner.leases.next_expiry();
            // When reading timers failed, try again in a second.
            let mut retry = None;
            if self
                .inner
                .durable_timers_changed
                .swap(false, Ordering::AcqRel)
            {
                next_durable = match self.inner.store.next_timer(&self.inner.shards).await {
                    Ok(timer) => timer,
                    Err(e) => {
                        tracing::error!("reading timers failed: {e}");
                        self.inner
                            .durable_timers_changed
                            .store(true, Ordering::Release);
                        retry = Some(Duration::from_secs(1));
                        None
                    }
                };
            }
            let durable_wait = next_durable
                .as_ref()
                .map(|t| Duration::from_millis((t.due_ms - clock.now_ms()).max(0) as u64));
            let lease_wait = next_lease.map(|at| at.saturating_duration_since(now));
            let wait = [durable_wait, lease_wait, retry]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(Duration::from_secs(3600));
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = self.inner.timers_changed.notified() => continue,
                    _ = advances.next() => continue,
                    _ = self.shutdown_token().cancelled() => return,
                }
            }
            if self.shutdown_token().is_cancelled() {
                return;
            }
            for expired in self.inner.leases.take_expired() {
                self.lease_lost(expired).await;
            }
            if let Some(timer) = next_durable.take_if(|t| t.due_ms <= clock.now_ms()) {
                // Whatever happens, the next one is read again.
                self.inner
                    .durable_timers_changed
                    .store(true, Ordering::Release);
                if let Err(e) = self.fire_timer(timer.run, &timer.name, timer.due_ms).await {
                    tracing::error!(run = %timer.run, timer = %timer.name, "timer failed: {e}");
                    if matches!(e, Error::ShuttingDown) {
                        return;
                    }
                    // Do not spin on a timer that cannot fire.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Makes the timer loop read the earliest durable timer again.
    pub(super) fn durable_timers_changed(&self) {
        self.inner
            .durable_timers_changed
            .store(true, Ordering::Release);
        self.inner.timers_changed.notify_one();
    }

    pub(super) async fn fire_timer(
        &self,
        run: RunId,
        name: &str,
        due_ms: i64,
    ) -> Result<(), Error> {
        let now = self.now_ms();
        let result = self
            .update(run, |state, batch| {
                batch.delete_timer(due_ms, run, name);
                Ok((state.decide_timer(name, now), state.dispatchable(now)))
            })
            .await;
        match result {
            Ok((dispatchable, _)) => {
                self.offer_all(run, dispatchable);
                Ok(())
            }
            Err(e) if e.is_missing_run() => {
                // A timer of a run that does not exist: drop it.
                let mut batch = WriteBatch::default();
                batch.delete_timer(due_ms, run, name);
                self.inner.store.commit(batch).await?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(super) async fn lease_lost(&self, lost: leases::Expired) {
        tracing::info!(run = %lost.run, call = %lost.call_id, attempt = lost.attempt, holder = %lost.worker, "lease lapsed: attempt lost");
        let error = ErrorData::new(
            "AttemptLost",
            format!(
                "attempt {} sent no heartbeat or result within its heartbeat timeout",
                lost.attempt
            ),
        );
        let result = self
            .update(lost.run, |state, _| {
                let event = match lost.kind {
                    TaskKind::Tool => state.decide_tool_outcome(
                        &lost.call_id,
                        lost.attempt,
                        ToolOutcome::Failure {
                            error,
                            retryable: true,
                        },
                        Actor::Engine,
                    ),
                    TaskKind::Model => state.decide_model_failure(
                        &lost.call_id,
                        lost.attempt,
                        error,
                        true,
                        Actor::Engine,
                    ),
                };
                match event {
                    Ok(event) => Ok((vec![event], ())),
                    // Already reported, or the run ended: nothing was lost.
                    Err(Error::StaleAttempt { .. } | Error::RunFinished(_)) => Ok((Vec::new(), ())),
                    Err(e) => Err(e),
                }
            })
            .await;
        if let Err(e) = result {
            tracing::error!(run = %lost.run, call = %lost.call_id, "recording a lost attempt failed: {e}");
            // The attempt is still running in the log: expire it again
            // soon, or it would wait for a result that never comes.
            self.inner.leases.grant(
                lost.run,
                &lost.call_id,
                lost.attempt,
                &lost.worker,
                lost.kind,
                LOST_LEASE_RETRY,
            );
        }
    }
}
