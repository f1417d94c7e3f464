//! The ground floor: what every other part of the server shares and that
//! imports nothing of the server above it. Ids and shards, the records the
//! engine and the stores exchange, the event catalogue (type names, the
//! data each carries, decoded once), the task token's format, checks of
//! client names and sizes, and clipping of quoted client values.

pub mod check;
pub mod clip;
mod cursor;
pub mod event;
mod id;
mod records;
mod shard;
pub mod token;

pub use cursor::{BadToken, Cursor};
pub use id::{random_key, RunId};
pub use records::*;
pub use shard::*;
