//! The gRPC edge: tonic services that convert wire types, call the engine
//! or read the store, and map errors once (see `status`).

mod approvals;
mod cluster;
pub(crate) mod convert;
pub mod deadline;
mod grants;
pub mod malformed;
mod policy;
mod runs;
pub mod status;
mod subscriptions;
pub(crate) mod workers;

use tonic::{Request, Status};

pub use approvals::ApprovalApi;
pub use cluster::ClusterApi;
pub use grants::GrantApi;
pub use policy::PolicyApi;
pub use runs::RunApi;
pub use subscriptions::SubscriptionApi;
pub use workers::WorkerApi;

use crate::auth::Principal;
use crate::domain::event::Actor;
use crate::engine::Error;

/// Items a stream buffers for a slow client before its reader waits.
const STREAM_BUFFER: usize = 64;

/// How a caller is named in the events it causes: its principal's name when
/// the server authenticates callers, else its address.
fn peer_name<T>(request: &Request<T>) -> String {
    if let Some(principal) = principal(request) {
        return principal.name.clone();
    }
    // Auth off, a call another server forwarded: the client it came from.
    if let Some(peer) = request.extensions().get::<crate::auth::ForwardedPeer>() {
        return peer.0.clone();
    }
    request
        .remote_addr()
        .map_or_else(|| "unknown".to_string(), |addr| addr.to_string())
}

/// The caller, as the auth layer authenticated it (`None` without auth).
fn principal<T>(request: &Request<T>) -> Option<&Principal> {
    request.extensions().get::<Principal>()
}

fn client_actor<T>(request: &Request<T>) -> Actor {
    Actor::Client(peer_name(request))
}

/// A write reached a server without an engine (one that does not own the
/// runs); in a cluster such writes are forwarded before they get here.
fn not_serving() -> Status {
    Status::unavailable("this server does not own the runs; send writes to one that does")
}

fn unavailable() -> Status {
    status::to_status(Error::ShuttingDown)
}
