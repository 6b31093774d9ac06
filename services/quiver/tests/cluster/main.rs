//! Real `quiver` processes over real sockets: the standalone server end to end
//! through its REST API, restarts and kill -9; its front door: TLS, hostile
//! input on both ports, API keys, secrets and request ids; roles started
//! in-process against the S3 server (the orphan sweep).

mod hostile;
mod orphans;
mod security;
mod standalone;
mod support;
mod tls;
