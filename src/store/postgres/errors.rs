//! What the PostgreSQL store says when the database fails: its errors as
//! [`StoreError`]s, their text (never the password), and which of them
//! mean the database itself is in trouble.

use deadpool_postgres::PoolError;

use super::StoreError;
use crate::causes::with_causes;

/// A database error's text: PostgreSQL's code and message when it said
/// one, else what failed (the connection, a timeout). Never the password,
/// which tokio-postgres errors do not carry.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => with_causes(e),
    }
}

/// Whether an error is the database's trouble (unreachable, shutting down,
/// out of resources, read-only) rather than a statement's: such an error
/// fails a whole round and makes the store unwritable until one succeeds.
pub(super) fn is_down(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return true;
    };
    let code = db.code().code();
    // 25006: read-only transaction (a standby, after a failover).
    code == "25006"
        || ["08", "40", "53", "55", "57", "58", "XX"]
            .iter()
            .any(|class| code.starts_with(class))
}

/// A failed read or open.
pub(super) fn database_error(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("postgres: {}", describe(&e)))
}

pub(super) fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Closed => StoreError::Closed,
        PoolError::Backend(e) => database_error(e),
        other => StoreError::Unavailable(format!("postgres: {}", with_causes(&other))),
    }
}

pub(super) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("postgres: {what}"))
}
