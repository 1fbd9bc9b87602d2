//! rl-gateway: a rate-limit service for gateways, deciding with redis-rl (the module, or
//! its Lua fallback, found by asking the server; one server or a Cluster), through the
//! project's Rust client.
//!
//! * [`config`]: envoyproxy/ratelimit's YAML format, with fields of our own.
//! * [`decide`]: the decision engine both front ends share.
//! * [`grpc`]: Envoy's v3 rate limit service.
//! * [`web`]: the HTTP side (forward-auth, `/metrics`, `/healthz`).
//! * [`metrics`]: the Prometheus metrics.
//! * [`reload`]: reloading on file change and SIGHUP.
#![warn(missing_docs)]

pub mod config;
pub mod decide;
pub mod grpc;
pub mod metrics;
pub mod reload;
pub mod web;
