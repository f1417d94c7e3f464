//! StreamEvents: history, caught_up, live events; resumable with no gap and
//! no duplicate.

use aaa::proto::stream_events_response::Item;
use aaa::proto::{Event, StreamEventsRequest};
use tonic::Streaming;

use crate::support::*;

/// The next item, or `None` when the server ended the stream.
async fn next_item(stream: &mut Streaming<aaa::proto::StreamEventsResponse>) -> Option<Item> {
    let message = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("StreamEvents sent nothing")
        .expect("StreamEvents failed");
    message.map(|m| m.item.expect("StreamEventsResponse without item"))
}

/// Reads events until caught_up; returns them and caught_up.last_seq.
async fn read_until_caught_up(
    stream: &mut Streaming<aaa::proto::StreamEventsResponse>,
) -> (Vec<Event>, u64) {
    let mut events = Vec::new();
    loop {
        match next_item(stream).await {
            Some(Item::Event(event)) => events.push(event),
            Some(Item::CaughtUp(caught_up)) => return (events, caught_up.last_seq),
            None => panic!("stream ended before caught_up: {:?}", types(&events)),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resuming_from_a_cursor_yields_exactly_the_rest() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let waiting_seq = history(&mut runs, &run_id).await.last().unwrap().seq;

    // Resume from mid-history, then follow the live rest.
    let cursor = 3;
    let request = StreamEventsRequest {
        run_id: run_id.clone(),
        after_seq: cursor,
        follow: true,
        stop_at_end: true,
        ..Default::default()
    };
    let mut stream = runs
        .stream_events(request)
        .await
        .expect("StreamEvents")
        .into_inner();
    let (mut events, caught_up) = read_until_caught_up(&mut stream).await;
    assert_eq!(caught_up, waiting_seq);
    assert_eq!(events.last().map(|e| e.seq), Some(waiting_seq));

    grant(&mut server.runs().await, &run_id, &call_id).await;
    while let Some(item) = next_item(&mut stream).await {
        match item {
            Item::Event(event) => events.push(event),
            Item::CaughtUp(_) => panic!("a second caught_up marker"),
        }
    }
    assert_dense(&events, cursor + 1);
    assert_eq!(types(&events), REFERENCE_TYPES[cursor as usize..]);

    // The same events as the full log's tail.
    let full = history(&mut runs, &run_id).await;
    let ids = |events: &[Event]| events.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&events), ids(&full[cursor as usize..]));
    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resuming_a_dropped_live_stream_has_no_gap_and_no_duplicate() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;

    // A live follower that drops after aaa.tool.started.
    let request = StreamEventsRequest {
        run_id: run_id.clone(),
        follow: true,
        ..Default::default()
    };
    let mut stream = runs
        .stream_events(request)
        .await
        .expect("StreamEvents")
        .into_inner();
    let (mut events, _) = read_until_caught_up(&mut stream).await;
    grant(&mut server.runs().await, &run_id, &call_id).await;
    loop {
        match next_item(&mut stream).await {
            Some(Item::Event(event)) => {
                let done = event.r#type == "aaa.tool.started";
                events.push(event);
                if done {
                    break;
                }
            }
            other => panic!("expected live events, got {other:?}"),
        }
    }
    drop(stream);

    // Resume from the last event received.
    let cursor = events.last().unwrap().seq;
    let request = StreamEventsRequest {
        run_id: run_id.clone(),
        after_seq: cursor,
        follow: true,
        stop_at_end: true,
        ..Default::default()
    };
    let mut stream = runs
        .stream_events(request)
        .await
        .expect("StreamEvents")
        .into_inner();
    while let Some(item) = next_item(&mut stream).await {
        if let Item::Event(event) = item {
            events.push(event);
        }
    }
    assert_eq!(
        types(&events),
        REFERENCE_TYPES,
        "before the drop and after the resume from seq {cursor}"
    );
    assert_dense(&events, 1);
    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn type_prefix_filters_events_but_not_the_cursor() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    grant(&mut runs, &run_id, &call_id).await;
    let last_seq = wait_for_end(&mut runs, &run_id).await.last().unwrap().seq;

    // Without follow: the filtered history, caught_up at the run's head, end.
    let request = StreamEventsRequest {
        run_id: run_id.clone(),
        type_prefix: "aaa.approval.".into(),
        ..Default::default()
    };
    let mut stream = runs
        .stream_events(request)
        .await
        .expect("StreamEvents")
        .into_inner();
    let (events, caught_up) = read_until_caught_up(&mut stream).await;
    assert_eq!(
        types(&events),
        ["aaa.approval.requested", "aaa.approval.granted"]
    );
    assert_eq!(caught_up, last_seq);
    assert!(
        next_item(&mut stream).await.is_none(),
        "a stream without follow must end after caught_up"
    );
    worker.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cursors_at_and_past_the_end_and_unknown_runs() {
    let server = TestServer::start().await;
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let worker = Worker::spawn(&server, "payments-1", &["wire_money"], &[]).await;
    let follow_from = |run_id: &str, after_seq: u64| StreamEventsRequest {
        run_id: run_id.to_string(),
        after_seq,
        follow: true,
        stop_at_end: true,
        ..Default::default()
    };

    let unknown = runs
        .stream_events(follow_from(&aaa::store::RunId::new().to_string(), 0))
        .await;
    assert_error(&expect_err(unknown), tonic::Code::NotFound, "RUN_NOT_FOUND");

    // A waiting run, followed from its last event: caught_up there, then the
    // events that come after the grant, to the end.
    let run_id = start_run(&mut runs, scripted_reference_run()).await;
    let call_id = wait_for_approval(&mut runs, &run_id).await;
    let waiting_seq = history(&mut runs, &run_id).await.last().unwrap().seq;
    let past = runs
        .stream_events(follow_from(&run_id, waiting_seq + 1))
        .await;
    let status = expect_err(past);
    assert_error(&status, tonic::Code::InvalidArgument, "INVALID_FIELD");
    assert!(status.message().contains("after_seq"), "{status:?}");
    let mut stream = runs
        .stream_events(follow_from(&run_id, waiting_seq))
        .await
        .expect("StreamEvents")
        .into_inner();
    let (events, caught_up) = read_until_caught_up(&mut stream).await;
    assert!(events.is_empty());
    assert_eq!(caught_up, waiting_seq);
    grant(&mut runs, &run_id, &call_id).await;
    let mut rest = Vec::new();
    while let Some(item) = next_item(&mut stream).await {
        if let Item::Event(event) = item {
            rest.push(event);
        }
    }
    assert_dense(&rest, waiting_seq + 1);
    assert!(is_terminal(&rest.last().unwrap().r#type));

    // A finished run followed from its terminal event ends at once.
    let last_seq = rest.last().unwrap().seq;
    let mut stream = runs
        .stream_events(follow_from(&run_id, last_seq))
        .await
        .expect("StreamEvents")
        .into_inner();
    assert_eq!(
        read_until_caught_up(&mut stream).await,
        (Vec::new(), last_seq)
    );
    assert!(next_item(&mut stream).await.is_none());
    worker.stop().await;
    server.shutdown().await;
}
