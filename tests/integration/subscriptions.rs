//! SubscriptionService: consumer groups over the global log. One delivery
//! per group, redelivery when a member drops or nacks or misses its ack
//! deadline, dead letters and replay, stale acks, a durable cursor across
//! kill -9, and the errors.

use std::collections::{BTreeSet, HashMap, VecDeque};

use aaa::proto::subscription_service_client::SubscriptionServiceClient;
use aaa::proto::{
    subscribe_request, subscribe_response, watch_approvals_response, Ack, AckResult, Delivery,
    ListDeadLettersRequest, Nack, ReplayDeadLettersRequest, StartFrom, SubscribeRequest,
    SubscribeResponse, Subscribed, SubscriptionOpen, WatchApprovalsRequest,
};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::support::*;

type SubscriptionClient = SubscriptionServiceClient<Channel>;

async fn subscriptions(server: &impl Server) -> SubscriptionClient {
    SubscriptionServiceClient::new(server.channel().await)
}

/// An `open` for `group` over app events, from the beginning of the log.
fn open(group: &str) -> SubscriptionOpen {
    SubscriptionOpen {
        group: group.into(),
        event_types: vec!["app.*".into()],
        start_from: StartFrom::Beginning as i32,
        ..Default::default()
    }
}

/// One member of a group, on its own connection.
pub(crate) struct Consumer {
    requests: mpsc::Sender<SubscribeRequest>,
    responses: Streaming<SubscribeResponse>,
    subscribed: Subscribed,
    /// Deliveries that came while an ack result was awaited.
    early: VecDeque<Delivery>,
}

async fn try_subscribe(server: &impl Server, open: SubscriptionOpen) -> Result<Consumer, Status> {
    let (requests, outgoing) = mpsc::channel(1024);
    let first = SubscribeRequest {
        kind: Some(subscribe_request::Kind::Open(open)),
    };
    requests.send(first).await.expect("request channel");
    let mut client = subscriptions(server).await;
    let outgoing = tokio_stream::wrappers::ReceiverStream::new(outgoing);
    let mut responses = client.subscribe(outgoing).await?.into_inner();
    let subscribed = match next_item(&mut responses).await {
        subscribe_response::Item::Subscribed(subscribed) => subscribed,
        other => panic!("expected `subscribed` first, got {other:?}"),
    };
    Ok(Consumer {
        requests,
        responses,
        subscribed,
        early: VecDeque::new(),
    })
}

/// Subscribes, retrying while no server serves the group's shard yet (a
/// restarted server on a database waits out its dead predecessor's lease),
/// as the SDKs do.
pub(crate) async fn subscribe(server: &impl Server, open: SubscriptionOpen) -> Consumer {
    retrying(|| try_subscribe(server, open.clone())).await
}

async fn next_item(responses: &mut Streaming<SubscribeResponse>) -> subscribe_response::Item {
    tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("Subscribe sent nothing")
        .expect("Subscribe failed")
        .expect("Subscribe ended")
        .item
        .expect("SubscribeResponse without item")
}

impl Consumer {
    async fn next(&mut self) -> subscribe_response::Item {
        next_item(&mut self.responses).await
    }

    pub(crate) async fn delivery(&mut self) -> Delivery {
        if let Some(delivery) = self.early.pop_front() {
            return delivery;
        }
        match self.next().await {
            subscribe_response::Item::Delivery(delivery) => delivery,
            other => panic!("expected a delivery, got {other:?}"),
        }
    }

    /// The next ack result; deliveries before it are kept for [`Self::delivery`].
    async fn ack_result(&mut self) -> AckResult {
        loop {
            match self.next().await {
                subscribe_response::Item::AckResult(result) => return result,
                subscribe_response::Item::Delivery(delivery) => self.early.push_back(delivery),
                other => panic!("expected an ack result, got {other:?}"),
            }
        }
    }

    async fn send(&self, kind: subscribe_request::Kind) {
        self.requests
            .send(SubscribeRequest { kind: Some(kind) })
            .await
            .expect("request stream closed");
    }

    async fn ack(&self, delivery: &Delivery) {
        let ack = Ack {
            delivery_id: delivery.delivery_id.clone(),
        };
        self.send(subscribe_request::Kind::Ack(ack)).await;
    }

    async fn nack(&self, delivery: &Delivery, reason: &str) {
        let nack = Nack {
            delivery_id: delivery.delivery_id.clone(),
            reason: reason.into(),
        };
        self.send(subscribe_request::Kind::Nack(nack)).await;
    }

    /// Acks and checks the ack was not stale.
    pub(crate) async fn ack_ok(&mut self, delivery: &Delivery) {
        self.ack(delivery).await;
        let result = self.ack_result().await;
        assert_eq!(result.delivery_id, delivery.delivery_id);
        assert!(!result.stale, "{result:?}");
    }
}

/// (run_id, seq): what identifies an event across deliveries.
fn key(delivery: &Delivery) -> (String, u64) {
    let event = delivery.event.as_ref().expect("delivery without event");
    (event.run_id.clone(), event.seq)
}

/// A run that waits for its approval, so it takes app events; with `labels`.
async fn waiting_run(server: &impl Server, labels: &[(&str, &str)]) -> String {
    let mut runs = server.runs().await;
    register(&mut server.workers().await, vec![wire_money()], &[]).await;
    let mut request = scripted_reference_run();
    request.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let run_id = start_run(&mut runs, request).await;
    wait_for_approval(&mut runs, &run_id).await;
    run_id
}

/// Appends `count` events of type `ty` to the run with Signal; returns their seqs.
async fn append(server: &impl Server, run_id: &str, ty: &str, count: usize) -> Vec<u64> {
    let mut runs = server.runs().await;
    let mut seqs = Vec::with_capacity(count);
    for n in 0..count {
        let answer = signal(&mut runs, run_id, ty, serde_json::json!({ "n": n }))
            .await
            .expect("Signal");
        seqs.push(answer.seq);
    }
    seqs
}

/// A consumer in a task that acks everything and reports what it got.
fn spawn_acker(
    mut consumer: Consumer,
    name: &'static str,
    seen: mpsc::UnboundedSender<(&'static str, (String, u64))>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match consumer.next().await {
                subscribe_response::Item::Delivery(delivery) => {
                    let _ = seen.send((name, key(&delivery)));
                    consumer.ack(&delivery).await;
                }
                subscribe_response::Item::AckResult(result) => {
                    assert!(!result.stale, "{name}: {result:?}");
                }
                other => panic!("{name}: unexpected {other:?}"),
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn each_group_gets_each_event_once() {
    let server = TestServer::start().await;
    let labelled = waiting_run(&server, &[("team", "payments")]).await;
    let other = waiting_run(&server, &[]).await;

    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for name in ["a1", "a2", "a3"] {
        let consumer = subscribe(
            &server,
            SubscriptionOpen {
                max_in_flight: 8,
                ..open("workers")
            },
        )
        .await;
        tasks.push(spawn_acker(consumer, name, seen_tx.clone()));
    }
    let consumer = subscribe(&server, open("audit")).await;
    tasks.push(spawn_acker(consumer, "b", seen_tx.clone()));
    // Narrowed by labels: only the labelled run's events.
    let consumer = subscribe(
        &server,
        SubscriptionOpen {
            labels: HashMap::from([("team".to_string(), "payments".to_string())]),
            ..open("payments-only")
        },
    )
    .await;
    tasks.push(spawn_acker(consumer, "p", seen_tx.clone()));

    let mut expected: BTreeSet<(String, u64)> = BTreeSet::new();
    let (first, second) = tokio::join!(
        append(&server, &labelled, "app.tick", 500),
        append(&server, &other, "app.tick", 500),
    );
    expected.extend(first.iter().map(|seq| (labelled.clone(), *seq)));
    expected.extend(second.iter().map(|seq| (other.clone(), *seq)));
    assert_eq!(expected.len(), 1000);

    let mut workers: Vec<(String, u64)> = Vec::new();
    let mut by_member: HashMap<&str, usize> = HashMap::new();
    let mut audit = Vec::new();
    let mut payments = Vec::new();
    while workers.len() < 1000 || audit.len() < 1000 || payments.len() < 500 {
        let (name, key) = tokio::time::timeout(WAIT, seen.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "stuck at workers {}, audit {}, payments {}",
                    workers.len(),
                    audit.len(),
                    payments.len()
                )
            })
            .expect("consumers ended");
        match name {
            "b" => audit.push(key),
            "p" => payments.push(key),
            _ => {
                *by_member.entry(name).or_default() += 1;
                workers.push(key);
            }
        }
    }
    for task in tasks {
        task.abort();
    }
    // Exactly once per group: as many deliveries as distinct events, all of them.
    for (group, got) in [("workers", &workers), ("audit", &audit)] {
        let distinct: BTreeSet<_> = got.iter().cloned().collect();
        assert_eq!(distinct.len(), got.len(), "{group} got duplicates");
        assert_eq!(distinct, expected, "{group} lost events");
    }
    let distinct: BTreeSet<_> = payments.iter().cloned().collect();
    assert_eq!(distinct.len(), 500);
    assert!(payments.iter().all(|(run, _)| *run == labelled));
    assert!(
        ["a1", "a2", "a3"]
            .iter()
            .all(|m| by_member.get(m).copied().unwrap_or(0) > 0),
        "every member shares the work: {by_member:?}"
    );
    server.shutdown().await;
}

/// Events that come one at a time, each acked before the next, take turns
/// over the members instead of all going to the first.
#[tokio::test(flavor = "multi_thread")]
async fn a_trickle_of_events_takes_turns_over_the_members() {
    let server = TestServer::start().await;
    let run_id = waiting_run(&server, &[]).await;
    let (served_tx, mut served) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for name in ["m1", "m2", "m3"] {
        let mut consumer = subscribe(&server, open("turns")).await;
        let served_tx = served_tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let delivery = consumer.delivery().await;
                // Reported once the group has its ack: the member is idle again.
                consumer.ack_ok(&delivery).await;
                let _ = served_tx.send(name);
            }
        }));
    }
    let mut order = Vec::new();
    for _ in 0..6 {
        append(&server, &run_id, "app.tick", 1).await;
        let name = tokio::time::timeout(WAIT, served.recv())
            .await
            .expect("no member got the event")
            .expect("members ended");
        order.push(name);
    }
    for task in tasks {
        task.abort();
    }
    assert_eq!(order, ["m1", "m2", "m3", "m1", "m2", "m3"]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unacked_deliveries_of_a_dropped_member_reach_another() {
    let server = TestServer::start().await;
    let run_id = waiting_run(&server, &[]).await;
    let mut first = subscribe(
        &server,
        SubscriptionOpen {
            max_in_flight: 5,
            ..open("g")
        },
    )
    .await;
    assert!(first.subscribed.created);
    assert_eq!(first.subscribed.max_in_flight, 5);
    let seqs = append(&server, &run_id, "app.job", 5).await;
    let mut held = BTreeSet::new();
    for _ in 0..5 {
        let delivery = first.delivery().await;
        assert_eq!(delivery.attempt, 1);
        held.insert(key(&delivery));
    }

    // The second member joins while everything is leased to the first.
    let mut second = subscribe(&server, open("g")).await;
    assert!(!second.subscribed.created);
    drop(first);

    let mut redelivered = BTreeSet::new();
    for _ in 0..5 {
        let delivery = second.delivery().await;
        assert_eq!(delivery.attempt, 2, "{delivery:?}");
        redelivered.insert(key(&delivery));
        second.ack_ok(&delivery).await;
    }
    assert_eq!(redelivered, held);
    let expected: BTreeSet<_> = seqs.into_iter().map(|seq| (run_id.clone(), seq)).collect();
    assert_eq!(redelivered, expected);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_stream_skips_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ChildServer::start(dir.path()).await;
    let run_id = waiting_run(&server, &[]).await;
    let seqs = append(&server, &run_id, "app.job", 200).await;
    let mut consumer = subscribe(
        &server,
        SubscriptionOpen {
            max_in_flight: 20,
            ..open("durable")
        },
    )
    .await;
    // Ack 100 events without waiting, then wait for the 100 answers; the
    // deliveries that keep coming meanwhile stay unacked.
    let mut handled = BTreeSet::new();
    let mut answered = 0;
    while answered < 100 {
        match consumer.next().await {
            subscribe_response::Item::Delivery(delivery) if handled.len() < 100 => {
                handled.insert(key(&delivery));
                consumer.ack(&delivery).await;
            }
            subscribe_response::Item::Delivery(_) => {}
            subscribe_response::Item::AckResult(result) => {
                assert!(!result.stale, "{result:?}");
                answered += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    server.kill9();

    let server = ChildServer::start(dir.path()).await;
    let mut consumer = subscribe(&server, open("durable")).await;
    assert!(!consumer.subscribed.created);
    let expected: BTreeSet<_> = seqs.into_iter().map(|seq| (run_id.clone(), seq)).collect();
    // The cursor may be behind the last acks (at least once), never past an unacked event.
    let mut after_restart = BTreeSet::new();
    while handled.union(&after_restart).count() < expected.len() {
        let delivery = consumer.delivery().await;
        assert!(expected.contains(&key(&delivery)), "{delivery:?}");
        after_restart.insert(key(&delivery));
        consumer.ack_ok(&delivery).await;
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_event_is_dead_lettered_listed_and_replayed() {
    let server = TestServer::start().await;
    let run_id = waiting_run(&server, &[]).await;
    let mut consumer = subscribe(
        &server,
        SubscriptionOpen {
            max_deliveries: 3,
            ..open("poison")
        },
    )
    .await;
    assert_eq!(consumer.subscribed.max_deliveries, 3);
    let poison_seq = append(&server, &run_id, "app.poison", 1).await[0];

    for attempt in 1..=3 {
        let delivery = consumer.delivery().await;
        assert_eq!(delivery.attempt, attempt);
        assert_eq!(key(&delivery), (run_id.clone(), poison_seq));
        consumer.nack(&delivery, "cannot parse").await;
        assert!(!consumer.ack_result().await.stale);
    }
    // The group moves on: the next event comes, not the poison again.
    let ok_seq = append(&server, &run_id, "app.ok", 1).await[0];
    let delivery = consumer.delivery().await;
    assert_eq!(key(&delivery), (run_id.clone(), ok_seq));
    consumer.ack_ok(&delivery).await;

    let mut client = subscriptions(&server).await;
    let listed = client
        .list_dead_letters(ListDeadLettersRequest {
            group: "poison".into(),
            ..Default::default()
        })
        .await
        .expect("ListDeadLetters")
        .into_inner();
    assert_eq!(listed.dead_letters.len(), 1, "{listed:?}");
    let letter = &listed.dead_letters[0];
    let event = letter.event.as_ref().expect("event");
    assert_eq!(
        (event.run_id.as_str(), event.seq),
        (run_id.as_str(), poison_seq)
    );
    assert_eq!(event.r#type, "app.poison");
    assert_eq!(letter.deliveries, 3);
    assert_eq!(letter.last_error, "cannot parse");
    assert!(!letter.replaying);

    let replayed = client
        .replay_dead_letters(ReplayDeadLettersRequest {
            group: "poison".into(),
            positions: vec![event.position],
        })
        .await
        .expect("ReplayDeadLetters")
        .into_inner();
    assert_eq!(replayed.replayed, 1);
    let delivery = consumer.delivery().await;
    assert!(delivery.replayed);
    assert_eq!(delivery.attempt, 1);
    assert_eq!(key(&delivery), (run_id.clone(), poison_seq));
    consumer.ack_ok(&delivery).await;

    let listed = client
        .list_dead_letters(ListDeadLettersRequest {
            group: "poison".into(),
            ..Default::default()
        })
        .await
        .expect("ListDeadLetters")
        .into_inner();
    assert!(listed.dead_letters.is_empty(), "{listed:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ack_after_the_deadline_is_stale() {
    let server = TestServer::start().await;
    let run_id = waiting_run(&server, &[]).await;
    let mut consumer = subscribe(
        &server,
        SubscriptionOpen {
            ack_timeout_s: 0.2,
            ..open("slow")
        },
    )
    .await;
    append(&server, &run_id, "app.job", 1).await;
    let first = consumer.delivery().await;
    assert_eq!(first.attempt, 1);
    // Not acked in time: the server delivers it again.
    let second = consumer.delivery().await;
    assert_eq!(second.attempt, 2);
    assert_eq!(key(&first), key(&second));
    assert_ne!(first.delivery_id, second.delivery_id);

    consumer.ack(&first).await;
    let result = consumer.ack_result().await;
    assert_eq!(result.delivery_id, first.delivery_id);
    assert!(result.stale, "{result:?}");
    assert!(result.reason.contains("superseded"), "{result:?}");
    // Other acks about the same delivery: stale too, once it is acked.
    consumer.ack_ok(&second).await;
    consumer.ack(&second).await;
    assert!(consumer.ack_result().await.stale);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_refused_with_their_field() {
    let server = TestServer::start().await;
    let field = |status: &Status, code: Code, reason: &str| {
        assert_error(status, code, reason)
            .metadata
            .get("field")
            .cloned()
            .unwrap_or_default()
    };
    let refused = |open: SubscriptionOpen| {
        let server = &server;
        async move {
            match try_subscribe(server, open).await {
                Ok(_) => panic!("Subscribe was accepted"),
                Err(status) => status,
            }
        }
    };

    for pattern in ["app.*.x", "", "app*", "a b", ".*"] {
        let status = refused(SubscriptionOpen {
            event_types: vec!["app.ok".into(), pattern.into()],
            ..open("g")
        })
        .await;
        let field = field(&status, Code::InvalidArgument, "INVALID_FIELD");
        assert_eq!(field, "open.event_types[1]", "{pattern}: {status:?}");
    }
    let status = refused(open("")).await;
    assert_eq!(
        field(&status, Code::InvalidArgument, "INVALID_FIELD"),
        "open.group"
    );
    let status = refused(SubscriptionOpen {
        event_types: vec![],
        ..open("g")
    })
    .await;
    assert_eq!(
        field(&status, Code::InvalidArgument, "INVALID_FIELD"),
        "open.event_types"
    );
    let status = refused(SubscriptionOpen {
        start_from: StartFrom::AfterPosition as i32,
        start_after_position: 1_000_000,
        ..open("g")
    })
    .await;
    assert_eq!(
        field(&status, Code::InvalidArgument, "INVALID_FIELD"),
        "open.start_after_position"
    );

    let status = refused(SubscriptionOpen {
        labels: HashMap::from([("team".to_string(), "x".repeat(10_000))]),
        ..open("g")
    })
    .await;
    let info = assert_error(&status, Code::InvalidArgument, "PAYLOAD_TOO_LARGE");
    assert_eq!(info.metadata["field"], "open.labels[team]");

    // A group's definition is fixed by its first member.
    let _member = subscribe(&server, open("fixed")).await;
    let status = refused(SubscriptionOpen {
        event_types: vec!["aaa.approval.*".into()],
        ..open("fixed")
    })
    .await;
    assert_eq!(
        field(&status, Code::FailedPrecondition, "GROUP_MISMATCH"),
        "open.event_types"
    );

    let mut client = subscriptions(&server).await;
    let status = expect_err(
        client
            .list_dead_letters(ListDeadLettersRequest {
                group: "nobody".into(),
                ..Default::default()
            })
            .await,
    );
    assert_error(&status, Code::NotFound, "GROUP_NOT_FOUND");
    let status = expect_err(
        client
            .replay_dead_letters(ReplayDeadLettersRequest {
                group: "nobody".into(),
                positions: vec![],
            })
            .await,
    );
    assert_error(&status, Code::NotFound, "GROUP_NOT_FOUND");
    let status = expect_err(
        client
            .list_dead_letters(ListDeadLettersRequest::default())
            .await,
    );
    assert_eq!(
        field(&status, Code::InvalidArgument, "INVALID_FIELD"),
        "group"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_holds_at_most_max_in_flight() {
    let server = TestServer::start().await;
    let run_id = waiting_run(&server, &[]).await;
    let mut small = subscribe(
        &server,
        SubscriptionOpen {
            max_in_flight: 2,
            ..open("capped")
        },
    )
    .await;
    append(&server, &run_id, "app.job", 5).await;
    let held = [small.delivery().await, small.delivery().await];
    // Everything else waits for a member with room.
    let mut big = subscribe(&server, open("capped")).await;
    let mut rest = BTreeSet::new();
    for _ in 0..3 {
        rest.insert(key(&big.delivery().await));
    }
    // Had the capped member got a third delivery, it would come before these answers.
    for delivery in &held {
        small.ack(delivery).await;
    }
    for delivery in &held {
        match small.next().await {
            subscribe_response::Item::AckResult(result) => {
                assert_eq!(result.delivery_id, delivery.delivery_id);
                assert!(!result.stale);
            }
            other => panic!("the capped member got more than 2: {other:?}"),
        }
    }
    assert!(held.iter().all(|d| !rest.contains(&key(d))));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn where_a_group_starts_is_fixed_when_it_is_created() {
    let server = TestServer::start().await;
    let run_id = waiting_run(&server, &[]).await;
    append(&server, &run_id, "app.old", 3).await;
    let now = SubscriptionOpen {
        start_from: StartFrom::Now as i32,
        ..open("late")
    };
    let mut first = subscribe(&server, now).await;
    assert!(first.subscribed.created);
    let new_seq = append(&server, &run_id, "app.new", 1).await[0];
    // Deliveries go lowest position first: an old event would come first.
    let delivery = first.delivery().await;
    assert_eq!(key(&delivery), (run_id.clone(), new_seq));
    first.ack_ok(&delivery).await;
    drop(first);

    // The group exists: start_from BEGINNING changes nothing.
    let mut again = subscribe(&server, open("late")).await;
    assert!(!again.subscribed.created);
    let newer_seq = append(&server, &run_id, "app.new", 1).await[0];
    let delivery = again.delivery().await;
    assert_eq!(key(&delivery), (run_id.clone(), newer_seq));
    server.shutdown().await;
}

/// How a webhook receiver is down at first.
#[derive(Clone, Copy)]
enum Down {
    /// It closes its first N connections without reading them.
    Closing(usize),
    /// It answers its first N POSTs with 503.
    Answering503(usize),
}

/// A webhook receiver on an ephemeral port (over TLS with `tls`), `down`
/// at first, then answering 200; reports each POST it accepts.
async fn webhook_receiver(
    down: Down,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (
    std::net::SocketAddr,
    mpsc::UnboundedReceiver<(http::HeaderMap, bytes::Bytes)>,
) {
    use http_body_util::{BodyExt, Full};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (posts, received) = mpsc::unbounded_channel();
    let seen = Arc::new(AtomicUsize::new(0));
    let (close_first, down_for) = match down {
        Down::Closing(n) => (n, 0),
        Down::Answering503(n) => (0, n),
    };
    tokio::spawn(async move {
        for connection in 0.. {
            let (socket, _) = listener.accept().await.unwrap();
            if connection < close_first {
                drop(socket);
                continue;
            }
            let (posts, seen, tls) = (posts.clone(), seen.clone(), tls.clone());
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let (posts, seen) = (posts.clone(), seen.clone());
                    async move {
                        let (parts, body) = request.into_parts();
                        let body = body.collect().await?.to_bytes();
                        let status = match seen.fetch_add(1, Ordering::SeqCst) < down_for {
                            true => 503,
                            false => {
                                let _ = posts.send((parts.headers, body));
                                200
                            }
                        };
                        let answer = http::Response::builder().status(status);
                        Ok::<_, hyper::Error>(answer.body(Full::new(bytes::Bytes::new())).unwrap())
                    }
                });
            tokio::spawn(async move {
                let http1 = hyper::server::conn::http1::Builder::new();
                let _ = match tls {
                    Some(tls) => match tls.accept(socket).await {
                        Ok(stream) => {
                            let io = hyper_util::rt::TokioIo::new(stream);
                            http1.serve_connection(io, service).await
                        }
                        Err(_) => return,
                    },
                    None => {
                        let io = hyper_util::rt::TokioIo::new(socket);
                        http1.serve_connection(io, service).await
                    }
                };
            });
        }
    });
    (addr, received)
}

/// A TLS acceptor with the certificate `make_pki` wrote to `dir`.
fn tls_acceptor(dir: &std::path::Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_gets_every_event_signed_even_after_its_receiver_was_down() {
    webhook_delivers_everything(false, Down::Closing(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_webhook_trusts_its_ca_cert_and_retries_a_503() {
    webhook_delivers_everything(true, Down::Answering503(3)).await;
}

/// A webhook over http, or https with a private CA (`ca_cert`), whose
/// receiver is down at first: every event arrives, signed.
async fn webhook_delivers_everything(https: bool, down: Down) {
    const EVENTS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    crate::auth::make_pki(dir.path());
    let tls = https.then(|| tls_acceptor(dir.path()));
    let (receiver, mut posts) = webhook_receiver(down, tls).await;
    let url = match https {
        true => format!(
            "https://localhost:{}/hook\"\nca_cert = \"ca.pem",
            receiver.port()
        ),
        false => format!("http://{receiver}/hook"),
    };
    let hooks = dir.path().join("webhooks.toml");
    std::fs::write(
        &hooks,
        format!(
            "[[webhook]]\nname = \"notify\"\nurl = \"{url}\"\n\
             event_types = [\"app.*\"]\nsecret = \"s3cret\"\n"
        ),
    )
    .unwrap();
    let server = ChildServer::start_args(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--webhooks",
            hooks.to_str().unwrap(),
        ],
    )
    .await;
    let run_id = waiting_run(&server, &[]).await;
    let seqs = append(&server, &run_id, "app.paid", EVENTS).await;

    // Every event arrives (at least once), signed with the secret.
    let mut arrived = BTreeSet::new();
    let mut retried = false;
    while arrived.len() < EVENTS {
        let (headers, body) = tokio::time::timeout(WAIT, posts.recv())
            .await
            .expect("every event is POSTed in time")
            .expect("receiver runs");
        let signature = headers["x-aaa-signature-256"].to_str().unwrap();
        assert_eq!(signature, aaa::subscriptions::signature("s3cret", &body));
        let post: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(post["event"]["type"], "app.paid");
        assert_eq!(post["group"], "webhook.notify");
        retried |= post["attempt"] != 1;
        let event = headers["x-aaa-event"].to_str().unwrap();
        let (run, seq) = event.split_once('/').unwrap();
        assert_eq!(run, run_id);
        arrived.insert(seq.parse::<u64>().unwrap());
    }
    assert_eq!(arrived, seqs.into_iter().collect::<BTreeSet<_>>());
    assert!(retried, "the POSTs that failed were delivered again");
    server.kill9();
}

/// `count` runs waiting for their approval, started through `servers` in
/// turn (with spread shards, each in a shard of the server that started
/// it); their ids.
async fn waiting_runs(servers: &[&TestServer], count: usize) -> BTreeSet<String> {
    let mut started = BTreeSet::new();
    for i in 0..count {
        let mut runs = servers[i % servers.len()].runs().await;
        let run_id = start_run(&mut runs, scripted_reference_run()).await;
        wait_for_approval(&mut runs, &run_id).await;
        started.insert(run_id);
    }
    started
}

/// The next `count` approval requests a watch sends: their runs, and the
/// resume token of the last.
async fn watched_requests(watch: &mut ApprovalWatch, count: usize) -> (Vec<String>, String) {
    let (mut runs, mut token) = (Vec::new(), String::new());
    while runs.len() < count {
        let response = next_watch_change(watch).await;
        if let Some(watch_approvals_response::Item::Requested(approval)) = response.item {
            runs.push(approval.run_id);
            token = response.resume_token;
        }
    }
    (runs, token)
}

/// The log partitioned by shard (issue 45): a watch's resume token and a
/// group's cursor hold a position per shard, valid on every server. After
/// the shards change owners (one of two spread servers leaves, the other
/// takes its share over), a watch resumed on the other server with the last
/// token it got, and the group's next member there, get exactly what came
/// after: nothing missed, nothing repeated.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_and_a_group_resume_on_another_server_after_the_shards_change_owners() {
    let Some(url) = fresh_postgres_store() else {
        return;
    };
    let member = |url: String| {
        TestServer::start_with(move |config| {
            config.store_url = Some(url.clone());
            config.spread_shards = true;
            config.lease = std::time::Duration::from_secs(1);
        })
    };
    let (a, b) = (member(url.clone()).await, member(url.clone()).await);
    let (name_a, name_b) = (member_of(&a).await, member_of(&b).await);
    wait_until_spread(&a, &[&name_a, &name_b]).await;
    register(&mut a.workers().await, vec![wire_money()], &[]).await;
    let group = SubscriptionOpen {
        group: "resumed".into(),
        event_types: vec!["aaa.approval.requested".into()],
        start_from: StartFrom::Beginning as i32,
        ..Default::default()
    };

    // Watch and consume through b while runs start on both servers.
    let mut watch = watch_approvals(&mut b.approvals().await, Default::default()).await;
    assert!(read_snapshot(&mut watch).await.is_empty());
    let mut consumer = subscribe(&b, group.clone()).await;
    let first = waiting_runs(&[&a, &b], 8).await;
    let (watched, token) = watched_requests(&mut watch, 8).await;
    assert_eq!(watched.iter().cloned().collect::<BTreeSet<_>>(), first);
    assert_eq!(watched.len(), 8, "no request twice: {watched:?}");
    let mut delivered = BTreeSet::new();
    let mut acked = Vec::new();
    for _ in 0..8 {
        let delivery = consumer.delivery().await;
        consumer.ack_ok(&delivery).await;
        assert!(
            delivered.insert(key(&delivery)),
            "{:?} twice",
            key(&delivery)
        );
        let event = delivery.event.as_ref().expect("an event");
        acked.push((
            aaa::store::RunId::parse(&event.run_id).unwrap(),
            event.position,
        ));
    }
    drop((watch, consumer));
    // Acks are at least once until the group's cursor is committed (a
    // moment after them): wait until it passes every acked event.
    let store = aaa::store::postgres::PostgresStore::open(&url)
        .await
        .unwrap();
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        let record = aaa::store::Store::group(&store, "resumed").await.unwrap();
        let cursor = record.map(|g| g.log_cursor()).unwrap_or_default();
        if acked
            .iter()
            .all(|(run, position)| !cursor.passes(*run, *position))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the acks were never committed"
        );
        backoff().await;
    }
    aaa::store::Store::close(&store).await;

    // b leaves: a takes its shards over; more runs start there.
    b.shutdown().await;
    wait_until_spread(&a, &[&name_a]).await;
    let second = waiting_runs(&[&a], 8).await;

    let resume = WatchApprovalsRequest {
        resume_token: Some(token),
        ..Default::default()
    };
    let mut watch = watch_approvals(&mut a.approvals().await, resume).await;
    let (after, _) = watched_requests(&mut watch, 8).await;
    assert_eq!(
        after.iter().cloned().collect::<BTreeSet<_>>(),
        second,
        "the resumed watch sent what came after its token, and only that"
    );
    let mut consumer = subscribe(&a, group).await;
    for _ in 0..8 {
        let delivery = consumer.delivery().await;
        let (run, seq) = key(&delivery);
        assert!(
            second.contains(&run),
            "delivered again after the handover: {run} seq {seq}"
        );
        consumer.ack_ok(&delivery).await;
    }
}
