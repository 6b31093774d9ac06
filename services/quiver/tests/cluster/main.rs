//! Real `quiver` processes over real sockets: the standalone server end to end
//! through its REST API, restarts and kill -9; its front door: TLS, hostile
//! input on both ports, API keys, secrets and request ids; a cluster of
//! separate role processes with mutual TLS between them; roles started
//! in-process against a real metadata service and the S3 server (the orphan
//! sweep, the indexer's gRPC write API, the searcher's watch stream). Tests that
//! start a metadata service live here, in the package that links every role, so
//! the data-node crates never link the Raft server.

mod cluster_tls;
mod create_then_serve;
mod hostile;
mod in_process;
mod indexer_api;
mod joined_searches;
mod orphans;
mod quiverctl;
mod rows_warm;
mod same_rows;
mod searcher_outage;
mod searcher_watch;
mod security;
mod slow_open;
mod standalone;
mod support;
mod tls;
mod workload_identity;
