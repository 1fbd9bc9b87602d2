//! rl-gateway: a rate-limit service for gateways, deciding with redis-rl.
//!
//! * [`config`]: envoyproxy/ratelimit's YAML format, with fields of our own.
#![warn(missing_docs)]

pub mod config;
