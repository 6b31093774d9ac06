//! Real `quiver` processes over real sockets: the standalone server end to end
//! through its REST API, restarts and kill -9.

mod standalone;
mod support;
