//! The page acts through this server's own gRPC API, over a loopback
//! channel, as the signed-in person: each call carries the principal
//! signed with the store's key for that one request (as a server
//! forwarding a call does, see `auth::forwarded`), so the auth layer checks its roles, and the services
//! apply approver groups, separation of duties, the digest check and
//! cluster forwarding exactly as for any gRPC client. With auth off the
//! signed name is the browser's address, which becomes the actor.

use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::auth::forwarded;
use crate::proto::approval_service_client::ApprovalServiceClient;
use crate::proto::run_service_client::RunServiceClient;
use crate::proto::{
    stream_events_response, Approval, Event, GetRunRequest, ListApprovalsRequest,
    ListApprovalsResponse, ListRunsRequest, ListRunsResponse, Run, SignalRequest, SignalResponse,
    StreamEventsRequest, StreamEventsResponse, WatchApprovalsRequest, WatchApprovalsResponse,
};

/// Who calls: a principal's name (auth on) or the browser's address (auth off).
#[derive(Clone)]
pub struct Caller {
    channel: Channel,
    key: [u8; 32],
    /// This server's advertised address, which each call is signed for.
    address: String,
    name: String,
}

impl Caller {
    pub fn new(channel: Channel, key: [u8; 32], address: String, name: String) -> Caller {
        Caller {
            channel,
            key,
            address,
            name,
        }
    }

    /// The name decisions are recorded under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The call signed for this one request (its message, as the channel
    /// sends it uncompressed), once.
    fn request<T: prost::Message>(&self, message: T, method: &str) -> Request<T> {
        let mut headers = http::HeaderMap::new();
        let body = forwarded::unary_body(&message);
        let call = forwarded::Call {
            method,
            to: &self.address,
            body: &body,
        };
        forwarded::sign(
            &mut headers,
            &self.key,
            &self.name,
            &call,
            crate::clock::now_ms(),
        );
        Request::from_parts(
            MetadataMap::from_headers(headers),
            Default::default(),
            message,
        )
    }

    fn runs(&self) -> RunServiceClient<Channel> {
        RunServiceClient::new(self.channel.clone())
    }

    fn approvals(&self) -> ApprovalServiceClient<Channel> {
        ApprovalServiceClient::new(self.channel.clone())
    }

    pub async fn get_run(&self, run_id: &str) -> Result<Run, Status> {
        let request = GetRunRequest {
            run_id: run_id.to_string(),
        };
        let response = self
            .runs()
            .get_run(self.request(request, "/aaa.v1.RunService/GetRun"))
            .await?;
        response
            .into_inner()
            .run
            .ok_or_else(|| Status::internal("GetRun answered without a run"))
    }

    pub async fn list_runs(&self, request: ListRunsRequest) -> Result<ListRunsResponse, Status> {
        let response = self
            .runs()
            .list_runs(self.request(request, "/aaa.v1.RunService/ListRuns"))
            .await?;
        Ok(response.into_inner())
    }

    pub async fn stream_events(
        &self,
        request: StreamEventsRequest,
    ) -> Result<tonic::Streaming<StreamEventsResponse>, Status> {
        let response = self
            .runs()
            .stream_events(self.request(request, "/aaa.v1.RunService/StreamEvents"))
            .await?;
        Ok(response.into_inner())
    }

    /// The run's stored events, oldest first (at most `limit`).
    pub async fn history(&self, run_id: &str, limit: usize) -> Result<Vec<Event>, Status> {
        let request = StreamEventsRequest {
            run_id: run_id.to_string(),
            ..Default::default()
        };
        let mut stream = self.stream_events(request).await?;
        let mut events = Vec::new();
        while let Some(item) = stream.message().await? {
            if let Some(stream_events_response::Item::Event(event)) = item.item {
                events.push(event);
                if events.len() >= limit {
                    break;
                }
            }
        }
        Ok(events)
    }

    /// The pending approval of a call, if it is pending (ListApprovals of
    /// its run, which approvers may call).
    pub async fn pending(&self, run_id: &str, call_id: &str) -> Result<Option<Approval>, Status> {
        let mut page_token = String::new();
        loop {
            let page = self
                .list_approvals(ListApprovalsRequest {
                    run_id: run_id.to_string(),
                    page_size: 1000,
                    page_token,
                    ..Default::default()
                })
                .await?;
            if let Some(found) = page.approvals.into_iter().find(|a| a.call_id == call_id) {
                return Ok(Some(found));
            }
            if page.next_page_token.is_empty() {
                return Ok(None);
            }
            page_token = page.next_page_token;
        }
    }

    pub async fn signal(&self, request: SignalRequest) -> Result<SignalResponse, Status> {
        let response = self
            .runs()
            .signal(self.request(request, "/aaa.v1.RunService/Signal"))
            .await?;
        Ok(response.into_inner())
    }

    pub async fn list_approvals(
        &self,
        request: ListApprovalsRequest,
    ) -> Result<ListApprovalsResponse, Status> {
        let response = self
            .approvals()
            .list_approvals(self.request(request, "/aaa.v1.ApprovalService/ListApprovals"))
            .await?;
        Ok(response.into_inner())
    }

    pub async fn watch_approvals(
        &self,
        request: WatchApprovalsRequest,
    ) -> Result<tonic::Streaming<WatchApprovalsResponse>, Status> {
        let response = self
            .approvals()
            .watch_approvals(self.request(request, "/aaa.v1.ApprovalService/WatchApprovals"))
            .await?;
        Ok(response.into_inner())
    }
}
