//! Requests with a request_id (StartRun, Signal, DecideApprovals,
//! CreateGrant, a worker identity's claim): done once, answered alike on
//! every retry.
//!
//! A try takes the id's lock, reads the answer recorded for the id and,
//! when there is none, does the work, whose commit records the answer with
//! the effect it answers (`WriteBatch::put_request`). The lock and the work
//! go into a task of their own, so a caller that goes away mid-commit (a
//! client's deadline, a forwarding server killed) leaves the lock held
//! until that commit has landed or failed: a retry waits for it, then reads
//! the answer it recorded, and nothing a client cancels makes a second
//! effect. Across servers (the runs changed owner between two tries) the
//! store is the last line: it never records a second answer
//! (`StoreError::RequestRecorded`), and the try then answers with the
//! first. A request without a request_id takes none of this.

use std::future::Future;
use std::hash::Hash;

use super::{stripe, Engine, Error, RUN_LOCK_STRIPES};

/// Where a method's request ids are kept: per method (and run), and per
/// principal when auth is on, so that one caller's id never answers
/// another's request.
pub(super) fn request_scope(method: &[u8], principal: &str) -> Vec<u8> {
    match principal {
        "" => method.to_vec(),
        name => [method, b"/", name.as_bytes()].concat(),
    }
}

impl Engine {
    /// Runs `work` in a task of its own under the lock of `key` (a scope
    /// and a request id): the lock is let go once the work has ended, its
    /// commit landed or failed, whether or not the caller still waits.
    pub(super) async fn under_request_lock<T: Send + 'static>(
        &self,
        key: impl Hash,
        work: impl Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<T, Error> {
        // Waiting for the lock is cancellable: a try that goes away before
        // it holds the lock has done nothing.
        let guard = self.inner.request_locks[stripe(&key, RUN_LOCK_STRIPES)]
            .clone()
            .lock_owned()
            .await;
        tokio::spawn(async move {
            let _guard = guard;
            work.await
        })
        .await
        .map_err(|e| Error::Internal(format!("request task failed: {e}")))?
    }

    /// A request whose answer is one record: the recorded answer
    /// (`decode`d) if there is one, else `work`'s, which records it in its
    /// commit. When the work fails, an answer recorded meanwhile still
    /// answers: the store refused to record a second one, or the commit's
    /// outcome was unknown and it did land. So does it when the work found
    /// its effect already there and recorded nothing (`already` says which
    /// answers those are): a first try whose outcome was unknown may land
    /// after this try looked for its answer and before the work read the
    /// run, and then the effect is that first try's. The flag says the
    /// answer is a recorded one: its effects may be owed (see
    /// [`Engine::act_again_soon`]).
    pub(super) async fn once<T: Send + 'static>(
        &self,
        scope: Vec<u8>,
        request_id: String,
        decode: fn(&[u8]) -> Result<T, Error>,
        already: fn(&T) -> bool,
        work: impl Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<(T, bool), Error> {
        let engine = self.clone();
        let key = (scope.clone(), request_id.clone());
        self.under_request_lock(key, async move {
            let recorded = async || match engine.inner.store.request(&scope, &request_id).await {
                Ok(Some(bytes)) => decode(&bytes).map(Some),
                Ok(None) => Ok(None),
                Err(e) => Err(Error::from(e)),
            };
            if let Some(answer) = recorded().await? {
                return Ok((answer, true));
            }
            match work.await {
                Ok(answer) if already(&answer) => match recorded().await? {
                    Some(first) => Ok((first, true)),
                    None => Ok((answer, false)),
                },
                Ok(answer) => Ok((answer, false)),
                Err(e) => match recorded().await {
                    Ok(Some(answer)) => Ok((answer, true)),
                    _ => Err(e),
                },
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::store::{Settings, Shards, SharedStore, WriteBatch};

    /// An engine on an embedded store in a temp dir (kept while it lives).
    async fn started() -> (tempfile::TempDir, SharedStore, Engine, CancellationToken) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::open(&Settings::new(dir.path()))
            .await
            .expect("open");
        let shutdown = CancellationToken::new();
        let settings = crate::Config::new(dir.path()).engine_settings();
        let engine = Engine::start(store.clone(), settings, Shards::all(), shutdown.clone())
            .await
            .expect("engine");
        (dir, store, engine, shutdown)
    }

    /// Another server's try of the request committed between this try's
    /// check and its commit (the runs changed owner): the store refuses
    /// this try's answer, and the first one answers.
    #[tokio::test]
    async fn a_try_answered_first_elsewhere_answers_with_that_answer() {
        let (_dir, store, engine, shutdown) = started().await;
        let commit = |answer: &'static [u8]| {
            let store = store.clone();
            async move {
                let mut batch = WriteBatch::default();
                batch.put_request(b"scope", "r1", answer.to_vec());
                store.commit(batch).await.map_err(Error::from)
            }
        };
        let elsewhere = commit(b"first");
        let mine = commit(b"mine");
        let work = async move {
            elsewhere.await?;
            mine.await?;
            Ok(b"mine".to_vec())
        };
        let answer = engine
            .once(
                b"scope".to_vec(),
                "r1".into(),
                |b| Ok(b.to_vec()),
                |_| false,
                work,
            )
            .await
            .expect("the recorded answer");
        assert_eq!(answer, (b"first".to_vec(), true));
        shutdown.cancel();
        engine.stopped().await;
        store.close().await;
    }

    /// The first try's outcome was unknown to it (its commit outlasted the
    /// round's timeout) and it landed after the retry looked for its
    /// answer: the retry's work finds the effect there and records
    /// nothing ("already decided"). The answer is the first try's, not
    /// "already". (Found by `chaos::a_grant_that_landed_unanswered_still_sends_the_call_to_a_worker`,
    /// which failed once in a fresh-clone CI run with the retry answered
    /// seq 0.)
    #[tokio::test]
    async fn a_first_try_that_landed_during_the_retry_answers_it() {
        let (_dir, store, engine, shutdown) = started().await;
        let first_lands = {
            let store = store.clone();
            async move {
                let mut batch = WriteBatch::default();
                batch.put_request(b"scope", "r1", b"seq 9".to_vec());
                store.commit(batch).await.map_err(Error::from)
            }
        };
        let work = async move {
            first_lands.await?;
            Ok(b"already".to_vec())
        };
        let answer = engine
            .once(
                b"scope".to_vec(),
                "r1".into(),
                |b| Ok(b.to_vec()),
                |answer| answer == b"already",
                work,
            )
            .await
            .expect("an answer");
        assert_eq!(answer, (b"seq 9".to_vec(), true));
        shutdown.cancel();
        engine.stopped().await;
        store.close().await;
    }
}
