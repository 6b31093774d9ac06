//! Real `quiver` processes over real sockets: the standalone server end to end
//! through its REST API, restarts and kill -9; its front door: TLS, hostile
//! input on both ports, API keys, secrets and request ids.

mod hostile;
mod security;
mod standalone;
mod support;
mod tls;
