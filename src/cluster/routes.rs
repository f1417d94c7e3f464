//! Which server of a cluster serves each rpc, as proto/ declares it: every
//! rpc of aaa.v1 carries the `aaa.v1.route` option (proto/aaa/v1/routing.proto)
//! and build.rs generates [`ROUTES`] from it, with a function per keyed rpc
//! that decodes its request with its prost type and reads the key field.
//! An rpc without the option fails the build, so a new one cannot be served
//! by the wrong server by omission. `forward` routes calls by it.

use crate::domain::{group_shard, request_shard};
use crate::store::RunId;

/// How a call's server is chosen (`aaa.v1.RouteKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A read: answered from the database by the server the call reaches.
    Read,
    /// For the run whose id is the key: served by its shard's owner.
    Run,
    /// For the run a task token names: served by its shard's owner.
    TaskToken,
    /// An idempotency key: served by the owner of the shard of the caller
    /// and the key; with none, as [`Kind::AnyOwner`].
    RequestId,
    /// For a consumer group: served by the owner of its name's shard.
    Group,
    /// Names no run: served by any server that owns a shard.
    AnyOwner,
    /// Served by the server asked, never forwarded; its service is not
    /// wrapped by `forward::Routed`.
    Local,
}

/// How a cluster routes one rpc.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    /// The gRPC path, `/aaa.v1.Service/Method`.
    pub method: &'static str,
    pub kind: Kind,
    /// Whether the request is a stream of messages (keyed by its first).
    pub request_stream: bool,
    /// The request field that holds the key, for the keyed kinds.
    pub key: Option<Key>,
}

/// The request field a keyed rpc is routed by.
#[derive(Clone, Copy)]
pub struct Key {
    /// Its path in the request message, as the proto names it.
    pub field: &'static str,
    /// Decodes a request message and answers the field; `None` if the
    /// message does not decode, or does not reach the field (a oneof set
    /// to another member).
    of: fn(&[u8]) -> Option<String>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("field", &self.field).finish()
    }
}

include!(concat!(env!("OUT_DIR"), "/aaa_routes.rs"));

/// The route of the rpc at `path`; `None` for a path proto/ does not have.
pub fn find(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|route| route.method == path)
}

impl Route {
    /// The shard of the run (or group) a request message names; `None` if
    /// the rpc is not keyed, the request names none (StartRun without a
    /// request id: any server's shard will do) or none that parses (the
    /// service then answers the error). `caller` is the principal's name, a
    /// request id's shard is the caller's and the id's.
    pub fn shard(&self, message: &[u8], caller: &str) -> Option<u8> {
        let key = (self.key?.of)(message)?;
        match self.kind {
            Kind::Run => RunId::parse(&key).map(|run| run.shard()),
            // `kind.mac.run.attempt.principal.call` (see `engine::Token`)
            Kind::TaskToken => RunId::parse(key.split('.').nth(2)?).map(|run| run.shard()),
            Kind::Group => Some(group_shard(&key)),
            Kind::RequestId if key.is_empty() => None,
            Kind::RequestId => Some(request_shard(caller, &key)),
            Kind::Read | Kind::AnyOwner | Kind::Local => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::collections::BTreeSet;

    /// Every rpc of every aaa.v1 service in the descriptor set the server
    /// serves (and reflects), as `/package.Service/Method`, with whether its
    /// request is a stream.
    fn described() -> BTreeSet<(String, bool)> {
        let set = prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set decodes");
        let mut rpcs = BTreeSet::new();
        for file in set.file.iter().filter(|f| f.package() == "aaa.v1") {
            for service in &file.service {
                for method in &service.method {
                    rpcs.insert((
                        format!("/aaa.v1.{}/{}", service.name(), method.name()),
                        method.client_streaming(),
                    ));
                }
            }
        }
        rpcs
    }

    #[test]
    fn every_rpc_of_every_service_has_a_route() {
        let routed: BTreeSet<(String, bool)> = ROUTES
            .iter()
            .map(|route| (route.method.to_string(), route.request_stream))
            .collect();
        let described = described();
        assert!(described.len() >= 24, "{described:?}");
        assert_eq!(routed, described);
        assert_eq!(ROUTES.len(), routed.len(), "one route per rpc");
    }

    #[test]
    fn the_keyed_kinds_have_a_key_and_only_they() {
        for route in ROUTES {
            let keyed = matches!(
                route.kind,
                Kind::Run | Kind::TaskToken | Kind::RequestId | Kind::Group
            );
            assert_eq!(route.key.is_some(), keyed, "{route:?}");
        }
    }

    /// The server registers ClusterService and PolicyService as they are
    /// and wraps every other aaa service in `forward::Routed` (see
    /// `server::serve`): a LOCAL rpc must be in the former, every other in
    /// the latter.
    #[test]
    fn the_local_rpcs_are_those_of_the_services_served_unwrapped() {
        use crate::proto::{cluster_service_server, policy_service_server};
        let unwrapped = [
            cluster_service_server::SERVICE_NAME,
            policy_service_server::SERVICE_NAME,
        ];
        for route in ROUTES {
            let service = route.method[1..].split('/').next().unwrap();
            assert_eq!(
                route.kind == Kind::Local,
                unwrapped.contains(&service),
                "{route:?}"
            );
        }
    }

    /// `auth::forwarded` signs request streams without their body; its list
    /// must be the proto's.
    #[test]
    fn the_request_streams_are_those_auth_signs_without_a_body() {
        let streams: BTreeSet<&str> = ROUTES
            .iter()
            .filter(|route| route.request_stream)
            .map(|route| route.method)
            .collect();
        let signed: BTreeSet<&str> = crate::auth::forwarded::REQUEST_STREAMS
            .into_iter()
            .collect();
        assert_eq!(streams, signed);
    }

    /// What routing did before the table was generated, call by call.
    #[test]
    fn the_routes_are_those_the_cluster_had() {
        let kinds: Vec<(&str, Kind, Option<&str>)> = ROUTES
            .iter()
            .map(|r| (r.method, r.kind, r.key.map(|k| k.field)))
            .collect();
        for (method, kind, field) in [
            ("/aaa.v1.RunService/GetRun", Kind::Read, None),
            ("/aaa.v1.RunService/ListRuns", Kind::Read, None),
            ("/aaa.v1.RunService/StreamEvents", Kind::Read, None),
            ("/aaa.v1.ApprovalService/ListApprovals", Kind::Read, None),
            ("/aaa.v1.ApprovalService/WatchApprovals", Kind::Read, None),
            ("/aaa.v1.GrantService/ListGrants", Kind::Read, None),
            (
                "/aaa.v1.SubscriptionService/Subscribe",
                Kind::Group,
                Some("open.group"),
            ),
            (
                "/aaa.v1.SubscriptionService/ListDeadLetters",
                Kind::Group,
                Some("group"),
            ),
            (
                "/aaa.v1.SubscriptionService/ReplayDeadLetters",
                Kind::Group,
                Some("group"),
            ),
            (
                "/aaa.v1.RunService/StartRun",
                Kind::RequestId,
                Some("request_id"),
            ),
            ("/aaa.v1.RunService/Signal", Kind::Run, Some("run_id")),
            ("/aaa.v1.RunService/CancelRun", Kind::Run, Some("run_id")),
            (
                "/aaa.v1.WorkerService/HeartbeatTask",
                Kind::TaskToken,
                Some("token"),
            ),
            (
                "/aaa.v1.WorkerService/CompleteTask",
                Kind::TaskToken,
                Some("token"),
            ),
            (
                "/aaa.v1.WorkerService/FailTask",
                Kind::TaskToken,
                Some("token"),
            ),
        ] {
            assert!(
                kinds.contains(&(method, kind, field)),
                "{method}: {kind:?} by {field:?}"
            );
        }
        let any_owner: BTreeSet<&str> = ROUTES
            .iter()
            .filter(|r| r.kind == Kind::AnyOwner)
            .map(|r| r.method)
            .collect();
        assert_eq!(
            any_owner,
            BTreeSet::from([
                "/aaa.v1.ApprovalService/DecideApprovals",
                "/aaa.v1.GrantService/CreateGrant",
                "/aaa.v1.GrantService/RevokeGrant",
                "/aaa.v1.WorkerService/RegisterWorker",
                "/aaa.v1.WorkerService/PollTask",
            ])
        );
    }

    #[test]
    fn a_keyed_request_names_its_shard() {
        use crate::proto::{
            subscribe_request, Ack, CompleteTaskRequest, SignalRequest, StartRunRequest,
            SubscribeRequest, SubscriptionOpen,
        };
        let run = RunId::new_in_shard(7);
        let route = |method: &str| find(method).expect(method);

        let signal = SignalRequest {
            run_id: run.to_string(),
            ..Default::default()
        };
        let signal_route = route("/aaa.v1.RunService/Signal");
        assert_eq!(signal_route.shard(&signal.encode_to_vec(), ""), Some(7));
        // Not a run id: the service answers the error.
        let bad = SignalRequest {
            run_id: "nope".into(),
            ..Default::default()
        };
        assert_eq!(signal_route.shard(&bad.encode_to_vec(), ""), None);
        assert_eq!(signal_route.shard(b"\xff\xff", ""), None);

        let complete = CompleteTaskRequest {
            token: format!("t.mac.{run}.1.alice.call-1"),
            ..Default::default()
        };
        assert_eq!(
            route("/aaa.v1.WorkerService/CompleteTask").shard(&complete.encode_to_vec(), ""),
            Some(7)
        );

        let start = route("/aaa.v1.RunService/StartRun");
        let with_id = StartRunRequest {
            request_id: "r-1".into(),
            ..Default::default()
        };
        assert_eq!(
            start.shard(&with_id.encode_to_vec(), "alice"),
            Some(request_shard("alice", "r-1"))
        );
        assert_eq!(
            start.shard(&StartRunRequest::default().encode_to_vec(), "alice"),
            None
        );

        let subscribe = route("/aaa.v1.SubscriptionService/Subscribe");
        let open = SubscribeRequest {
            kind: Some(subscribe_request::Kind::Open(SubscriptionOpen {
                group: "billing".into(),
                ..Default::default()
            })),
        };
        assert_eq!(
            subscribe.shard(&open.encode_to_vec(), ""),
            Some(group_shard("billing"))
        );
        let ack = SubscribeRequest {
            kind: Some(subscribe_request::Kind::Ack(Ack::default())),
        };
        assert_eq!(subscribe.shard(&ack.encode_to_vec(), ""), None);

        assert_eq!(route("/aaa.v1.RunService/GetRun").shard(&[], ""), None);
        assert!(find("/aaa.v1.RunService/Made-Up").is_none());
    }
}
