//! Checking a connection out of a `bb8` pool, for the stores that pool their connections
//! (PostgreSQL, SQL Server): one mapping of the pool's errors to [`StoreError`].

use bb8::{ManageConnection, Pool, PooledConnection, RunError};

use crate::ports::{ErrorKind, StoreError};

/// A connection from `pool`, owned (it may outlive the borrow, as a transaction does). The
/// manager's own error comes back as it is; waiting past the pool's connection timeout is
/// [`ErrorKind::Unavailable`] (every connection busy, or none can be made): transient.
///
/// # Errors
/// The manager's classified error, or the timeout above.
pub(crate) async fn checkout<M>(pool: &Pool<M>) -> Result<PooledConnection<'static, M>, StoreError>
where
    M: ManageConnection<Error = StoreError>,
{
    pool.get_owned().await.map_err(|error| match error {
        RunError::User(error) => error,
        RunError::TimedOut => StoreError::of_kind(
            ErrorKind::Unavailable,
            "timed out waiting for a pooled connection",
        ),
    })
}
