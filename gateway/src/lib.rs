//! rl-gateway: a rate-limit service for gateways, deciding with redis-rl.
#![warn(missing_docs)]
