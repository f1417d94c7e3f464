//! The gRPC edge: tonic services that convert wire types, call the engine
//! or read the store, and map errors once (see `status`).

mod approvals;
mod convert;
mod runs;
pub mod status;
mod workers;

use tonic::{Request, Status};

pub use approvals::ApprovalApi;
pub use runs::RunApi;
pub use workers::WorkerApi;

use crate::engine::event::Actor;
use crate::engine::Error;

/// Items a stream buffers for a slow client before its reader waits.
const STREAM_BUFFER: usize = 64;

/// How a caller is named in the events it causes: its address, until
/// authentication gives callers names.
fn peer_name<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "unknown".to_string(), |addr| addr.to_string())
}

fn client_actor<T>(request: &Request<T>) -> Actor {
    Actor::Client(peer_name(request))
}

fn unavailable() -> Status {
    status::to_status(Error::ShuttingDown)
}
