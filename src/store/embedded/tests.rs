//! Tests of the embedded store as a whole: layouts refused and upgraded,
//! reads across span lists, recent spans and log segments, conflicts, and
//! the pending approvals in memory against sled.

use super::layout::{sled_config, LAYOUT};
use super::*;
use crate::store::Store;

#[tokio::test]
async fn released_waits_for_the_last_handle_and_for_the_lock() {
    use futures_util::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    let other = store.clone();
    let mut released = Box::pin(store.released().wait());
    store.close().await;
    drop(store);
    assert!((&mut released).now_or_never().is_none(), "a handle is left");
    drop(other);
    // Someone else's copy of the locked file, as sled's I/O threads may
    // keep one a moment after its last handle is gone.
    let straggler = std::fs::File::open(dir.path().join("db")).unwrap();
    let straggler = tokio::task::spawn_blocking(move || {
        straggler.lock().unwrap();
        straggler
    })
    .await
    .unwrap();
    for _ in 0..3 {
        tokio::task::yield_now().await;
        assert!(
            (&mut released).now_or_never().is_none(),
            "released while locked"
        );
    }
    drop(straggler);
    released.await;
    EmbeddedStore::open(dir.path(), 1 << 20).expect("opens again");
}

#[test]
fn a_data_dir_of_the_first_layout_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wal"), b"").unwrap();
    let error = EmbeddedStore::open(dir.path(), 1 << 20)
        .err()
        .expect("refused");
    assert!(matches!(error, StoreError::Format(_)), "{error}");
    assert!(error.to_string().contains("layout version 1"), "{error}");
}

#[test]
fn data_dirs_of_the_second_and_third_layouts_are_refused_by_name() {
    for old in ["2", "3"] {
        let dir = tempfile::tempdir().unwrap();
        let tree = sled_config(dir.path(), 1 << 20).open().unwrap();
        tree.insert(keys::meta("format"), old.as_bytes()).unwrap();
        tree.flush().unwrap();
        drop(tree);
        let error = EmbeddedStore::open(dir.path(), 1 << 20)
            .err()
            .expect("refused");
        assert!(matches!(error, StoreError::Format(_)), "{error}");
        let expected = format!("layout version {old}; this aaa reads version {LAYOUT} only");
        assert!(error.to_string().contains(&expected), "{error}");
    }
}

/// A directory of layout 4 (before retention) is upgraded in place: its
/// finished runs are indexed for retention, its running ones are not.
#[tokio::test]
async fn a_data_dir_of_layout_4_is_upgraded_and_its_finished_runs_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let (done, running) = (RunId::new(), RunId::new());
    {
        let tree = sled_config(dir.path(), 1 << 20).open().unwrap();
        tree.insert(keys::meta("format"), b"4").unwrap();
        for (run, status) in [(done, 3), (running, 2)] {
            let record = RunRecord {
                run_id: run.as_bytes().to_vec(),
                status,
                updated_ms: 5_000,
                ..Default::default()
            };
            tree.insert(keys::run_scoped(keys::RUN, run), record.encode_to_vec())
                .unwrap();
        }
        tree.flush().unwrap();
    }
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    let format = store.inner.tree.get(keys::meta("format")).unwrap().unwrap();
    assert_eq!(&format[..], LAYOUT.as_bytes());
    assert_eq!(store.expired_runs(5_000, Some(0), 10).unwrap(), [done]);
    assert!(store.expired_runs(4_999, Some(0), 10).unwrap().is_empty());
    assert!(store.expired_runs(i64::MAX, None, 10).unwrap().is_empty());
    store.close().await;
}

/// A crash during a checkpoint leaves span lists in sled that the replay
/// makes again and the next checkpoint writes again, longer; recent
/// spans follow the lists. Every read sees each event once, in order.
#[tokio::test]
async fn reads_merge_overlapping_span_lists_and_recent_spans() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    let run = RunId::new();
    let append = |seq: u64| {
        let mut batch = WriteBatch::default();
        if seq == 1 {
            batch.put_run(&RunRecord {
                run_id: run.as_bytes().to_vec(),
                ..Default::default()
            });
        }
        batch.push_event(EventRecord {
            run_id: run.as_bytes().to_vec(),
            seq,
            event_type: "app.test".into(),
            time_ms: 1000 + seq as i64,
            ..Default::default()
        });
        store.commit(batch)
    };
    let (tree, recent) = (&store.inner.tree, &store.inner.recent);
    for seq in 1..=3 {
        append(seq).await.unwrap();
    }
    let written = recent.of(run);
    recent.write_out(tree).unwrap();
    // The replay after the crash: the same spans again, then more.
    recent.add(&written.iter().map(|&s| (run, s)).collect::<Vec<_>>());
    append(4).await.unwrap();
    recent.write_out(tree).unwrap();
    append(5).await.unwrap();
    assert_eq!(
        tree.scan_prefix(keys::run_scoped(keys::EVENT, run)).count(),
        2
    );
    assert_eq!(recent.of(run).len(), 1);

    let seqs = |events: Vec<EventRecord>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let all = store.run_events(run, 0, usize::MAX).await.unwrap();
    assert_eq!(seqs(all), [1, 2, 3, 4, 5]);
    assert_eq!(seqs(store.run_events(run, 2, 10).await.unwrap()), [3, 4, 5]);
    assert_eq!(seqs(store.run_events(run, 0, 2).await.unwrap()), [1, 2]);
    for seq in 1..=5 {
        assert_eq!(store.event(run, seq).await.unwrap().unwrap().seq, seq);
    }
    assert!(store.event(run, 6).await.unwrap().is_none());
    let head = store.run(run).await.unwrap().unwrap();
    assert_eq!((head.last_seq, head.updated_ms), (5, 1005));
    recent.write_out(tree).unwrap();
    let head = store.run(run).await.unwrap().unwrap();
    assert_eq!((head.last_seq, head.updated_ms), (5, 1005));
    assert_eq!(seqs(store.run_events(run, 3, 10).await.unwrap()), [4, 5]);
    store.close().await;
}

/// A run's events, one per commit and interleaved with another run's,
/// are read back whole and in order when reads take many spans at once,
/// also where the spans cross from one log segment to the next.
#[tokio::test]
async fn reads_of_many_spans_cross_segments_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = crate::metrics::Metrics::new();
    let store = EmbeddedStore::open_with(dir.path(), 1 << 20, 64 * 1024, &metrics, None).unwrap();
    let (long, other) = (RunId::new(), RunId::new());
    let event = |run: RunId, seq: u64| EventRecord {
        run_id: run.as_bytes().to_vec(),
        seq,
        event_type: "app.test".into(),
        data_json: format!(r#"{{"pad":"{}"}}"#, "x".repeat(200)),
        ..Default::default()
    };
    for seq in 1..=600 {
        for run in [long, other] {
            let mut batch = WriteBatch::default();
            batch.push_event(event(run, seq));
            store.commit(batch).await.unwrap();
        }
    }
    assert!(
        store.inner.segments.segment_of(200 * 1024).is_some(),
        "several segments"
    );
    let seqs = |events: Vec<EventRecord>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let all = store.run_events(long, 0, usize::MAX).await.unwrap();
    assert!(all.iter().all(|e| e.run_id == long.as_bytes()));
    assert_eq!(seqs(all), (1..=600).collect::<Vec<_>>());
    let page = store.run_events(long, 250, 256).await.unwrap();
    assert_eq!(seqs(page), (251..=506).collect::<Vec<_>>());
    store.inner.recent.write_out(&store.inner.tree).unwrap();
    let tail = store.run_events(long, 590, 256).await.unwrap();
    assert_eq!(seqs(tail), (591..=600).collect::<Vec<_>>());
    store.close().await;
}

/// A batch expecting a run's last seq that another writer moved is
/// refused whole, also within one round, and the history never forks.
#[tokio::test]
async fn a_batch_behind_the_runs_head_is_refused_as_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    let run = RunId::new();
    let event = |seq: u64, text: &str| EventRecord {
        run_id: run.as_bytes().to_vec(),
        seq,
        event_type: "app.test".into(),
        data_json: format!(r#"{{"by":"{text}"}}"#),
        ..Default::default()
    };
    let batch = |seq: u64, text: &str| {
        let mut batch = WriteBatch::default();
        batch.push_event(event(seq, text));
        batch.put_tool(text, Vec::new());
        batch
    };
    store.commit(batch(1, "first")).await.unwrap();
    // Two writers both append seq 2, in one round: one wins.
    let (a, b) = tokio::join!(store.commit(batch(2, "a")), store.commit(batch(2, "b")));
    let (won, lost) = match (&a, &b) {
        (Ok(_), Err(e)) => ("a", e),
        (Err(e), Ok(_)) => ("b", e),
        other => panic!("expected one conflict, got {other:?}"),
    };
    assert!(
        matches!(lost, StoreError::Conflict { run: r, expected: 1, actual: 2 } if *r == run),
        "{lost}"
    );
    // A writer far behind, or ahead, is refused too.
    for seq in [1, 4] {
        let error = store.commit(batch(seq, "late")).await.unwrap_err();
        assert!(matches!(error, StoreError::Conflict { .. }), "{error}");
    }
    let events = store.run_events(run, 0, usize::MAX).await.unwrap();
    let data: Vec<&str> = events.iter().map(|e| e.data_json.as_str()).collect();
    assert_eq!(data, [r#"{"by":"first"}"#, &format!(r#"{{"by":"{won}"}}"#)]);
    // Nothing of a refused batch was written: not its index writes either.
    let tools: Vec<String> = store
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.0)
        .collect();
    let mut expected = vec!["first", won];
    expected.sort();
    assert_eq!(tools, expected);
    store.close().await;
}

/// A copy of `from` into `to`, taken while a store runs on `from`: what
/// its disk holds after a kill -9 at that point (the page cache survives
/// a process, and only the committer writes, between commits).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Every page of `query` (3 at a time), read as the store reads, or
/// from sled.
async fn all_pages(store: &EmbeddedStore, query: &ApprovalQuery, sled: bool) -> Vec<String> {
    let mut query = ApprovalQuery {
        limit: 3,
        ..query.clone()
    };
    let mut out = Vec::new();
    loop {
        let page = if sled {
            store.select_approvals(&query, None).unwrap()
        } else {
            store.approvals(&query).await.unwrap()
        };
        let Some(last) = page.last() else {
            return out;
        };
        query.after = Some((
            RunId::from_slice(&last.run_id).unwrap(),
            last.call_id.clone(),
        ));
        out.extend(page.iter().map(|a| format!("{:?}", a)));
    }
}

/// Answers from the copy in memory and from sled, for queries across
/// runs, of one run and of one tool, both ways; they must agree.
async fn approvals_read_both_ways(store: &EmbeddedStore, one_run: RunId) -> Vec<Vec<String>> {
    let mut answers = Vec::new();
    for newest_first in [false, true] {
        for (run, tool) in [(None, ""), (Some(one_run), ""), (None, "b")] {
            let query = ApprovalQuery {
                newest_first,
                run,
                tool: tool.into(),
                limit: 3,
                ..Default::default()
            };
            let memory = all_pages(store, &query, false).await;
            let sled = all_pages(store, &query, true).await;
            assert_eq!(memory, sled, "{query:?}");
            answers.push(memory);
        }
    }
    answers
}

/// The pending approvals in memory answer as sled does after commits
/// that add, rewrite and delete approvals and after retention deletes
/// a run's; after a kill -9, the copy built from sled again holds the
/// same.
#[tokio::test]
async fn pending_approvals_in_memory_answer_as_sled_does_and_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(
        store.inner.pending.phase(),
        pending::Phase::Ready,
        "empty at open"
    );
    let runs: Vec<RunId> = (0..20).map(|_| RunId::new()).collect();
    let approval = |run: RunId, call: &str, tool: &str| ApprovalRecord {
        run_id: run.as_bytes().to_vec(),
        call_id: call.into(),
        tool: tool.into(),
        arguments_json: "{}".into(),
        ..Default::default()
    };
    let mut batch = WriteBatch::default();
    for (i, run) in runs.iter().enumerate() {
        batch.put_approval(&approval(*run, "c1", ["a", "b"][i % 2]));
        if i % 3 == 0 {
            batch.put_approval(&approval(*run, "c2", "b"));
        }
    }
    store.commit(batch).await.unwrap();
    let mut batch = WriteBatch::default();
    batch.put_approval(&ApprovalRecord {
        arguments_json: r#"{"edited":1}"#.into(),
        ..approval(runs[0], "c1", "a")
    });
    batch.delete_approval(runs[1], "c1");
    let finished = runs[3];
    batch.put_run(&RunRecord {
        run_id: finished.as_bytes().to_vec(),
        status: 3,
        updated_ms: 1_000,
        ..Default::default()
    });
    store.commit(batch).await.unwrap();
    let mut batch = WriteBatch::default();
    batch.expire_run(finished, 2_000, 3_000);
    store.commit(batch).await.unwrap();

    let before = approvals_read_both_ways(&store, runs[0]).await;
    let all = &before[0];
    assert_eq!(all.len(), 20 - 2 + 7 - 1, "{all:?}");
    assert!(all.iter().any(|a| a.contains("edited")));
    assert!(store.run_approvals(finished).await.unwrap().is_empty());

    let crashed = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), crashed.path());
    store.close().await;
    let store = EmbeddedStore::open(crashed.path(), 1 << 20).unwrap();
    assert_eq!(store.inner.pending.phase(), pending::Phase::Off);
    assert!(store.inner.pending.start_build());
    pending::build(&store.inner.tree, &store.inner.pending).unwrap();
    assert_eq!(store.inner.pending.phase(), pending::Phase::Ready);
    assert_eq!(approvals_read_both_ways(&store, runs[0]).await, before);
    store.close().await;
}

/// What waits is counted the same from sled and from the copy in
/// memory (read in chunks), per tool, with the oldest request, runs
/// at work apart, and only in the shards asked for.
#[tokio::test]
async fn what_waits_is_counted_alike_from_sled_and_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    let mut batch = WriteBatch::default();
    // More approvals than a chunk, over runs of two shards; the runs of
    // shard 1 are at work.
    let mut runs = Vec::new();
    for n in 0..(COUNT_CHUNK as i64 + 100) {
        let run = RunId::new_in_shard((n % 2) as u8);
        runs.push(run);
        for call in ["c1", "c2"] {
            batch.put_approval(&ApprovalRecord {
                run_id: run.as_bytes().to_vec(),
                call_id: call.into(),
                tool: if n % 3 == 0 { "wire" } else { "email" }.into(),
                requested_ms: 1_000 + n,
                ..Default::default()
            });
        }
        batch.set_active(run, n % 2 == 1);
    }
    store.commit(batch).await.unwrap();
    store.close().await;
    drop(store);
    // Reopened, the copy is off until a query builds it.
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.inner.pending.phase(), pending::Phase::Off);
    let count = |shards| count_waiting(&store.inner.tree, &store.inner.pending, shards).unwrap();
    let from_sled = count(Shards::all());
    let mut shard_0 = Shards::none();
    shard_0.insert(0);
    let shard_0_from_sled = count(shard_0);
    assert!(store.inner.pending.start_build());
    pending::build(&store.inner.tree, &store.inner.pending).unwrap();
    assert_eq!(store.inner.pending.phase(), pending::Phase::Ready);
    assert_eq!(count(Shards::all()), from_sled);
    assert_eq!(count(shard_0), shard_0_from_sled);

    let runs = runs.len() as u64;
    let tool = |name: &str, pending: u64, oldest| ToolWaiting {
        tool: name.into(),
        pending,
        oldest_requested_ms: oldest,
    };
    let thirds = runs.div_ceil(3);
    assert_eq!(
        from_sled,
        Waiting {
            approvals_by_tool: vec![
                tool("email", 2 * (runs - thirds), 1_001),
                tool("wire", 2 * thirds, 1_000)
            ],
            running: runs / 2,
            waiting: runs.div_ceil(2),
        }
    );
    assert_eq!(shard_0_from_sled.running, 0);
    assert_eq!(shard_0_from_sled.waiting, runs.div_ceil(2));
    store.close().await;
}

/// The counts the ready copy keeps follow every write: each step's
/// counts equal a fresh count from sled.
#[tokio::test]
async fn what_waits_is_kept_counted_as_approvals_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    // An empty store is ready at once, with its counts.
    assert_eq!(store.inner.pending.phase(), pending::Phase::Ready);
    let approval = |run: RunId, call: &str, tool: &str, requested_ms| ApprovalRecord {
        run_id: run.as_bytes().to_vec(),
        call_id: call.into(),
        tool: tool.into(),
        requested_ms,
        ..Default::default()
    };
    let (a, b, c) = (RunId::new(), RunId::new(), RunId::new());
    let batch = |write: &dyn Fn(&mut WriteBatch)| {
        let mut batch = WriteBatch::default();
        write(&mut batch);
        batch
    };
    let steps = [
        batch(&|w| w.put_approval(&approval(a, "c1", "wire", 30))),
        batch(&|w| w.put_approval(&approval(a, "c2", "wire", 10))),
        batch(&|w| w.put_approval(&approval(b, "c1", "email", 20))),
        // The oldest goes: the next oldest of its tool shows.
        batch(&|w| w.delete_approval(a, "c2")),
        // A rewrite that moves a call to another tool and time.
        batch(&|w| w.put_approval(&approval(a, "c1", "email", 5))),
        // A run at work counts as running, whatever it has pending.
        batch(&|w| {
            w.put_approval(&approval(c, "c1", "wire", 40));
            w.set_active(c, true);
        }),
        batch(&|w| w.set_active(c, false)),
        // A run's last approval goes: it no longer waits; the tool with
        // none left is not listed.
        batch(&|w| w.delete_approval(b, "c1")),
        batch(&|w| {
            w.delete_approval(a, "c1");
            w.delete_approval(c, "c1");
        }),
    ];
    for (n, batch) in steps.into_iter().enumerate() {
        store.commit(batch).await.unwrap();
        let counted = store.inner.pending.waiting(&Default::default());
        assert!(counted.is_some(), "the copy keeps its counts at step {n}");
        let kept = count_waiting(&store.inner.tree, &store.inner.pending, Shards::all());
        let off = pending::Pending::default();
        let scanned = count_waiting(&store.inner.tree, &off, Shards::all());
        assert_eq!(kept.unwrap(), scanned.unwrap(), "after step {n}");
    }
    let last = count_waiting(&store.inner.tree, &store.inner.pending, Shards::all()).unwrap();
    assert_eq!(last, Waiting::default());
    store.close().await;
}

/// An expiry's entries reach sled one by one, and readers see each as it
/// lands: the run's tombstone lands before its summary goes, so a reader
/// always finds the run or its tombstone (before, the tombstone came last
/// and a read in between answered RUN_NOT_FOUND for a run that expired).
#[tokio::test]
async fn an_expired_run_is_never_missing_both_its_summary_and_its_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), 1 << 20).unwrap();
    let run = RunId::new();
    let mut batch = WriteBatch::default();
    batch.push_event(EventRecord {
        run_id: run.as_bytes().to_vec(),
        seq: 1,
        event_type: "aaa.run.started".into(),
        ..Default::default()
    });
    batch.put_run(&RunRecord {
        run_id: run.as_bytes().to_vec(),
        status: 3,
        updated_ms: 1_000,
        ..Default::default()
    });
    store.commit(batch).await.unwrap();

    let (summary, tombstone) = (
        keys::run_scoped(keys::RUN, run),
        keys::run_scoped(keys::TOMBSTONE, run),
    );
    let mut writes = store.inner.tree.watch_prefix(vec![]);
    let mut batch = WriteBatch::default();
    batch.expire_run(run, 2_000, 3_000);
    store.commit(batch).await.unwrap();
    let mut seen = Vec::new();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !(seen.contains(&"summary deleted") && seen.contains(&"tombstone written")) {
        assert!(std::time::Instant::now() < give_up, "saw only {seen:?}");
        // A write that changed nothing (a delete of a key that is not
        // there) leaves its slot empty: sled answers Disconnected for it.
        let Ok(write) = writes.next_timeout(std::time::Duration::from_secs(10)) else {
            continue;
        };
        match write {
            sled::Event::Remove { key } if *key == summary[..] => {
                assert_eq!(
                    seen,
                    ["tombstone written"],
                    "the summary was deleted before the tombstone was written"
                );
                seen.push("summary deleted")
            }
            sled::Event::Insert { key, .. } if *key == tombstone[..] => {
                seen.push("tombstone written")
            }
            _ => {}
        }
    }
    assert_eq!(seen, ["tombstone written", "summary deleted"]);
    assert_eq!(store.run(run).await.unwrap(), None);
    assert_eq!(Store::expired_at(&store, run).await.unwrap(), Some(2_000));
    store.close().await;
}
