//! What listens: the Sync service Envoy watches, the admin API over HTTP and gRPC, Prometheus
//! metrics, and the one error table they answer with.

pub mod admin;
pub mod console;
pub mod error;
pub mod http_server;
pub mod metrics;
pub mod pulse;
pub mod shares;
pub mod sync;

#[cfg(test)]
mod grpc_socket_tests;
