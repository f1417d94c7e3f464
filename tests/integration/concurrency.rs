//! Many runs through the full approval cycle at once: no deadlock, all complete.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aaa::proto::{ListRunsRequest, RunStatus};

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn fifty_concurrent_runs_complete() {
    const RUNS: usize = 50;
    let server = TestServer::start().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let labels = HashMap::from([("batch".to_string(), "fifty".to_string())]);

    let all = async {
        let mut cycles = Vec::new();
        for _ in 0..RUNS {
            let mut runs = server.runs().await;
            let mut request = scripted_reference_run();
            request.labels = labels.clone();
            cycles.push(tokio::spawn(async move {
                let run_id = start_run(&mut runs, request).await;
                let call_id = wait_for_approval(&mut runs, &run_id).await;
                grant(&mut runs, &run_id, &call_id).await;
                let events = wait_for_end(&mut runs, &run_id).await;
                (run_id, events)
            }));
        }
        let mut done = Vec::new();
        for cycle in cycles {
            done.push(cycle.await.expect("run cycle panicked"));
        }
        done
    };
    let done = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("50 runs did not complete within 120 s (deadlock?)");

    for (run_id, events) in &done {
        assert_eq!(types(events), REFERENCE_TYPES, "run {run_id}");
        assert_eq!(completed_text(events), REFERENCE_TEXT, "run {run_id}");
        assert_eq!(
            worker.tool_tasks_of(run_id).len(),
            1,
            "tool tasks of {run_id}"
        );
    }
    assert_eq!(worker.stop().await.len(), RUNS);

    // ListRuns pages through exactly these runs.
    let mut runs = server.runs().await;
    let mut listed = HashSet::new();
    let mut page_token = String::new();
    loop {
        let page = runs
            .list_runs(ListRunsRequest {
                status: RunStatus::Completed as i32,
                labels: labels.clone(),
                page_size: 20,
                page_token: page_token.clone(),
            })
            .await
            .expect("ListRuns")
            .into_inner();
        assert!(page.runs.len() <= 20);
        for run in page.runs {
            assert!(
                listed.insert(run.run_id.clone()),
                "run {} listed twice",
                run.run_id
            );
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let expected: HashSet<String> = done.into_iter().map(|(run_id, _)| run_id).collect();
    assert_eq!(listed, expected);
    server.shutdown().await;
}
