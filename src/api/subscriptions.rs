//! SubscriptionService: consumer groups over the global log. The edge reads
//! the opening request, checks it, joins the group, then pumps deliveries out
//! and acks in for as long as the member's stream lives.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::runs::page_size;
use super::{convert, malformed, status, STREAM_BUFFER};
use crate::domain::check;
use crate::engine::{Engine, Error};
use crate::proto::subscription_service_server::SubscriptionService;
use crate::proto::{self, subscribe_request, subscribe_response, ErrorReason};
use crate::subscriptions::{
    self, Definition, Membership, Outbound, Start, Subscriptions, WebhookConfig,
};

pub struct SubscriptionApi {
    subscriptions: Subscriptions,
}

impl SubscriptionApi {
    pub fn new(engine: &Engine) -> Self {
        let subscriptions = Subscriptions::new(
            engine.store().clone(),
            engine.shutdown_token().clone(),
            engine.metrics().clone(),
        );
        SubscriptionApi { subscriptions }
    }

    /// The registry of groups, to wait for when the engine closes.
    pub fn groups(&self) -> Subscriptions {
        self.subscriptions.clone()
    }

    /// Starts server-configured webhooks on this service's registry, so that
    /// ListDeadLetters and ReplayDeadLetters reach their groups too.
    pub async fn start_webhooks(
        &self,
        hooks: &[WebhookConfig],
    ) -> Result<(), subscriptions::Error> {
        for hook in hooks {
            self.subscriptions.start_webhook(hook.clone()).await?;
        }
        Ok(())
    }
}

impl From<subscriptions::Error> for Status {
    fn from(error: subscriptions::Error) -> Self {
        let mut metadata = HashMap::new();
        let (code, reason) = match error {
            subscriptions::Error::Engine(inner) => return status::to_status(inner),
            subscriptions::Error::GroupNotFound(ref group) => {
                metadata.insert("group".to_string(), group.clone());
                (Code::NotFound, ErrorReason::GroupNotFound)
            }
            subscriptions::Error::GroupMismatch {
                ref group,
                ref field,
                ..
            } => {
                metadata.insert("group".to_string(), group.clone());
                metadata.insert("field".to_string(), field.clone());
                (Code::FailedPrecondition, ErrorReason::GroupMismatch)
            }
            subscriptions::Error::MemberTooSlow => {
                (Code::ResourceExhausted, ErrorReason::MemberTooSlow)
            }
        };
        status::error_status(code, reason, &error.to_string(), metadata)
    }
}

/// Checks the opening request: the group's definition, where a new group
/// starts, and the member's cap on unacked deliveries.
fn open(open: proto::SubscriptionOpen) -> Result<(Definition, Start, u32), Error> {
    check::name("open.group", &open.group)?;
    if open.event_types.is_empty() {
        return Err(Error::invalid(
            "open.event_types",
            "required: at least one type or pattern",
        ));
    }
    for (i, pattern) in open.event_types.iter().enumerate() {
        subscriptions::check_pattern(&format!("open.event_types[{i}]"), pattern)?;
    }
    convert::labels("open.labels", &open.labels)?;
    let ack_timeout = match open.ack_timeout_s {
        0.0 => None,
        s if s.is_finite() && s > 0.0 && s <= subscriptions::MAX_ACK_TIMEOUT.as_secs_f64() => {
            Some(Duration::from_millis((s * 1000.0).ceil() as u64))
        }
        s => {
            return Err(Error::invalid(
                "open.ack_timeout_s",
                format!("{s} is not a number of seconds in (0, 3600]"),
            ))
        }
    };
    let max_deliveries = match open.max_deliveries {
        0 => None,
        n if n <= subscriptions::MAX_MAX_DELIVERIES => Some(n),
        n => {
            return Err(Error::invalid(
                "open.max_deliveries",
                format!("{n} is more than {}", subscriptions::MAX_MAX_DELIVERIES),
            ))
        }
    };
    let start = match open.start_from() {
        proto::StartFrom::Unspecified | proto::StartFrom::Now => Start::Now,
        proto::StartFrom::Beginning => Start::Beginning,
        proto::StartFrom::AfterPosition => Start::After(open.start_after_position),
    };
    let max_in_flight = match open.max_in_flight {
        0 => subscriptions::DEFAULT_MAX_IN_FLIGHT,
        n => n.min(subscriptions::MAX_IN_FLIGHT),
    };
    let definition = Definition {
        group: open.group,
        event_types: open.event_types,
        labels: open.labels.into_iter().collect(),
        ack_timeout,
        max_deliveries,
    };
    Ok((definition, start, max_in_flight))
}

type SubscribeStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<proto::SubscribeResponse, Status>> + Send>>;
type Sender = mpsc::Sender<Result<proto::SubscribeResponse, Status>>;

#[tonic::async_trait]
impl SubscriptionService for SubscriptionApi {
    type SubscribeStream = SubscribeStream;

    async fn subscribe(
        &self,
        request: Request<Streaming<proto::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound.message().await.map_err(malformed::from_stream)?;
        let Some(subscribe_request::Kind::Open(opening)) = first.and_then(|r| r.kind) else {
            return Err(Error::invalid("open", "the first message must be `open`").into());
        };
        let (definition, start, max_in_flight) = open(opening)?;
        let membership = self
            .subscriptions
            .join(definition, start, max_in_flight)
            .await?;
        let group = &membership.group;
        let subscribed = proto::Subscribed {
            group: group.name.clone(),
            created: membership.created,
            member_id: membership.member_id.to_string(),
            cursor: membership.cursor,
            event_types: group.event_types.clone(),
            labels: group.labels.clone().into_iter().collect(),
            ack_timeout_s: group.ack_timeout_ms as f64 / 1000.0,
            max_deliveries: group.max_deliveries,
            max_in_flight: membership.max_in_flight,
        };
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        sender
            .try_send(Ok(response(subscribe_response::Item::Subscribed(
                subscribed,
            ))))
            .expect("a new channel has room");
        tokio::spawn(serve_member(membership, inbound, sender));
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn list_dead_letters(
        &self,
        request: Request<proto::ListDeadLettersRequest>,
    ) -> Result<Response<proto::ListDeadLettersResponse>, Status> {
        let request = request.into_inner();
        check::name("group", &request.group)?;
        let after = match request.page_token.as_str() {
            "" => 0,
            token => token.parse().map_err(|_| {
                Error::invalid("page_token", "not a token ListDeadLetters returned")
            })?,
        };
        let limit = page_size(request.page_size);
        let letters = self
            .subscriptions
            .dead_letters(&request.group, after, limit + 1)
            .await?;
        let more = letters.len() > limit;
        let dead_letters: Vec<proto::DeadLetter> = letters
            .into_iter()
            .take(limit)
            .map(|(letter, event)| proto::DeadLetter {
                event: Some(convert::event(event)),
                deliveries: letter.deliveries,
                last_error: letter.last_error,
                dead_at: convert::timestamp(letter.dead_ms),
                replaying: letter.replaying,
            })
            .collect();
        let next_page_token = match dead_letters.last() {
            Some(last) if more => last.event.as_ref().map_or(0, |e| e.position).to_string(),
            _ => String::new(),
        };
        Ok(Response::new(proto::ListDeadLettersResponse {
            dead_letters,
            next_page_token,
        }))
    }

    async fn replay_dead_letters(
        &self,
        request: Request<proto::ReplayDeadLettersRequest>,
    ) -> Result<Response<proto::ReplayDeadLettersResponse>, Status> {
        let request = request.into_inner();
        check::name("group", &request.group)?;
        let replayed = self
            .subscriptions
            .replay(&request.group, request.positions)
            .await?;
        Ok(Response::new(proto::ReplayDeadLettersResponse { replayed }))
    }
}

fn response(item: subscribe_response::Item) -> proto::SubscribeResponse {
    proto::SubscribeResponse { item: Some(item) }
}

/// Pumps one member's deliveries out and its acks in. A slow client slows
/// only itself: its unread deliveries stay in its own channel. Returning
/// drops the membership, which gives its unacked deliveries to others.
async fn serve_member(
    mut membership: Membership,
    mut inbound: Streaming<proto::SubscribeRequest>,
    sender: Sender,
) {
    // A client may half-close after `open` (grpcurl -d does): it still gets
    // deliveries, it just cannot ack them.
    let mut reading = true;
    loop {
        tokio::select! {
            out = membership.next() => {
                let item = match out {
                    Ok(Outbound::Delivery { delivery_id, event, attempt, ack_deadline_ms, replayed }) => {
                        subscribe_response::Item::Delivery(proto::Delivery {
                            delivery_id,
                            event: Some(convert::event(event)),
                            attempt,
                            ack_deadline: convert::timestamp(ack_deadline_ms),
                            replayed,
                        })
                    }
                    Ok(Outbound::AckResult { delivery_id, stale, reason }) => {
                        subscribe_response::Item::AckResult(proto::AckResult { delivery_id, stale, reason })
                    }
                    Err(error) => {
                        let _ = sender.send(Err(error.into())).await;
                        return;
                    }
                };
                if sender.send(Ok(response(item))).await.is_err() {
                    return;
                }
            }
            request = inbound.message(), if reading => {
                let answer = match request {
                    Ok(Some(proto::SubscribeRequest { kind: Some(subscribe_request::Kind::Ack(ack)) })) => {
                        membership.answer(ack.delivery_id, None).await
                    }
                    Ok(Some(proto::SubscribeRequest { kind: Some(subscribe_request::Kind::Nack(nack)) })) => {
                        membership.answer(nack.delivery_id, Some(nack.reason)).await
                    }
                    Ok(Some(_)) => Err(Error::invalid("kind", "after `open`, send only `ack` and `nack`").into()),
                    Ok(None) => {
                        reading = false;
                        Ok(())
                    }
                    Err(failed) => {
                        // A message that does not decode is the client's
                        // fault and told so; a reset stream has no one to tell.
                        let _ = sender.send(Err(malformed::from_stream(failed))).await;
                        return;
                    }
                };
                if let Err(error) = answer {
                    let _ = sender.send(Err(error.into())).await;
                    return;
                }
            }
            _ = sender.closed() => return,
        }
    }
}
