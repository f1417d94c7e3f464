//! What never changes about a run once it started (its labels and task),
//! kept in a small bounded cache so that the approval watch does not read
//! the run's summary from the store for every request it shows. The cache
//! is filled when this server starts a run and on a miss; since the facts
//! are immutable, an entry can never be stale, on one server or many.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use crate::store::RunId;

/// Runs whose facts are kept: the watch reads approvals near the log's
/// head, so recent runs are the ones asked for.
const FACTS_CACHED: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFacts {
    pub labels: BTreeMap<String, String>,
    pub task: String,
}

pub struct FactsCache {
    runs: Mutex<lru::LruCache<RunId, Arc<RunFacts>>>,
}

impl Default for FactsCache {
    fn default() -> Self {
        let size = NonZeroUsize::new(FACTS_CACHED).expect("non-zero");
        FactsCache {
            runs: Mutex::new(lru::LruCache::new(size)),
        }
    }
}

impl FactsCache {
    pub fn get(&self, run: RunId) -> Option<Arc<RunFacts>> {
        self.runs.lock().expect("poisoned").get(&run).cloned()
    }

    pub fn put(&self, run: RunId, facts: Arc<RunFacts>) {
        self.runs.lock().expect("poisoned").put(run, facts);
    }
}
