//! Real `quiver` processes over real sockets: the standalone server end to end
//! through its REST API, restarts and kill -9; roles started in-process against
//! the S3 server (the orphan sweep).

mod orphans;
mod standalone;
mod support;
