//! Prometheus metrics (`GET /metrics`), per domain and descriptor key (the configured
//! descriptor path, as envoyproxy/ratelimit names its statistics; every value of the
//! request with `detailed_metric`).
//!
//! * `rl_gateway_total_hits_total{domain,key}`: hits asked (the quantity, summed).
//! * `rl_gateway_over_limit_total{domain,key}`: hits denied.
//! * `rl_gateway_near_limit_total{domain,key}`: hits admitted with less than 20% of the limit
//!   left (envoyproxy/ratelimit's near-limit ratio, 0.8).
//! * `rl_gateway_shadow_mode_total{domain,key}`: hits a shadow-mode limit would have denied.
//! * `rl_gateway_redis_errors_total{domain,key}`: decisions Redis did not make (an outage
//!   answered by the failure policy, or an error).
//! * `rl_gateway_domain_not_found_total`: requests for a domain not in the configuration.
//! * `rl_gateway_config_load_success_total`, `rl_gateway_config_load_error_total`.
//! * `rl_gateway_decision_latency_seconds{domain}`: a histogram of decision latency.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use redis_rl_client::Decision;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyLabels {
    domain: String,
    key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

type LatencyFamily = Family<DomainLabels, Histogram, fn() -> Histogram>;

/// The gateway's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    total_hits: Family<KeyLabels, Counter>,
    over_limit: Family<KeyLabels, Counter>,
    near_limit: Family<KeyLabels, Counter>,
    shadow_mode: Family<KeyLabels, Counter>,
    redis_errors: Family<KeyLabels, Counter>,
    not_found: Counter,
    /// Configuration loads that succeeded.
    pub config_load_success: Counter,
    /// Configuration loads refused.
    pub config_load_error: Counter,
    latency: LatencyFamily,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

fn latency_histogram() -> Histogram {
    // 50 µs to about 1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("rl_gateway");
        let total_hits = Family::<KeyLabels, Counter>::default();
        let over_limit = Family::<KeyLabels, Counter>::default();
        let near_limit = Family::<KeyLabels, Counter>::default();
        let shadow_mode = Family::<KeyLabels, Counter>::default();
        let redis_errors = Family::<KeyLabels, Counter>::default();
        let not_found = Counter::default();
        let config_load_success = Counter::default();
        let config_load_error = Counter::default();
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "total_hits",
            "Hits asked (the quantity)",
            total_hits.clone(),
        );
        registry.register("over_limit", "Hits denied", over_limit.clone());
        registry.register(
            "near_limit",
            "Hits admitted with less than 20% of the limit left",
            near_limit.clone(),
        );
        registry.register(
            "shadow_mode",
            "Hits a shadow-mode limit would have denied",
            shadow_mode.clone(),
        );
        registry.register(
            "redis_errors",
            "Decisions Redis did not make (outage or error)",
            redis_errors.clone(),
        );
        registry.register(
            "domain_not_found",
            "Requests for a domain not in the configuration",
            not_found.clone(),
        );
        registry.register(
            "config_load_success",
            "Configuration loads that succeeded",
            config_load_success.clone(),
        );
        registry.register(
            "config_load_error",
            "Configuration loads refused",
            config_load_error.clone(),
        );
        registry.register(
            "decision_latency_seconds",
            "Time to decide one request",
            latency.clone(),
        );
        Metrics {
            registry,
            total_hits,
            over_limit,
            near_limit,
            shadow_mode,
            redis_errors,
            not_found,
            config_load_success,
            config_load_error,
            latency,
        }
    }

    fn labels(domain: &str, key: &str) -> KeyLabels {
        KeyLabels {
            domain: domain.to_owned(),
            key: key.to_owned(),
        }
    }

    /// Counts `hits` asked of a descriptor that only records (a usage report, a refund).
    pub fn hit(&self, domain: &str, key: &str, hits: u64) {
        self.total_hits
            .get_or_create(&Self::labels(domain, key))
            .inc_by(hits);
    }

    /// Counts a decided descriptor: its hits, and whether they were over, near the limit, or
    /// (`shadow`) would have been denied.
    pub fn observe(&self, domain: &str, key: &str, hits: u64, d: &Decision, shadow: bool) {
        let l = Self::labels(domain, key);
        self.total_hits.get_or_create(&l).inc_by(hits);
        if !d.allowed {
            if shadow {
                self.shadow_mode.get_or_create(&l).inc_by(hits);
            } else {
                self.over_limit.get_or_create(&l).inc_by(hits);
            }
        } else if d.limit > 0 && d.remaining.saturating_mul(5) < d.limit {
            self.near_limit.get_or_create(&l).inc_by(hits);
        }
    }

    /// Counts a decision Redis did not make.
    pub fn redis_error(&self, domain: &str, key: &str) {
        self.redis_errors
            .get_or_create(&Self::labels(domain, key))
            .inc();
    }

    /// Counts a request for an unknown domain.
    pub fn domain_not_found(&self, _domain: &str) {
        // No domain label: a caller could make its values unbounded.
        self.not_found.inc();
    }

    /// Records one decision's latency.
    pub fn latency(&self, domain: &str, seconds: f64) {
        self.latency
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .observe(seconds);
    }

    /// The metrics in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
