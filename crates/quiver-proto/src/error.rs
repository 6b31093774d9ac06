//! The metadata keys of Quiver's gRPC errors; the error-code vocabulary itself
//! ([`ErrorCode`], [`ServiceError`]) lives in `quiver-common`, re-exported here
//! with its gRPC mapping.

pub use quiver_common::{
    ErrorCode, RETRY_AFTER_MS_HEADER, ServiceError, retry_after_of_status, status_of,
};

/// Response metadata key carrying the Raft leader's address when a metadata follower
/// refuses a request that only the leader can serve.
pub const LEADER_ADDRESS_HEADER: &str = "x-quiver-leader";

/// Response metadata key carrying the Raft leader's node id next to
/// [`LEADER_ADDRESS_HEADER`].
pub const LEADER_ID_HEADER: &str = "x-quiver-leader-id";
