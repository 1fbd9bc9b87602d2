//! Envoy's v3 rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) over
//! gRPC, with the API types of the `envoy-types` crate.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status as GrpcStatus};

use crate::config::Unit;
use crate::decide::{Code, DescriptorIn, Engine, Refusal, RequestIn, Status};

/// The gRPC service: decides every `ShouldRateLimit` with the [`Engine`].
#[derive(Debug, Clone)]
pub struct Service {
    engine: Arc<Engine>,
    /// Add the RateLimit response fields to `response_headers_to_add`.
    headers: bool,
}

impl Service {
    /// The service; with `headers`, every answer carries the RateLimit fields (and
    /// `Retry-After` when denied) in `response_headers_to_add`.
    pub fn new(engine: Arc<Engine>, headers: bool) -> Service {
        Service { engine, headers }
    }

    /// The tonic server of this service.
    pub fn server(self) -> RateLimitServiceServer<Service> {
        RateLimitServiceServer::new(self)
    }
}

fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn pb_duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn pb_code(c: Code) -> i32 {
    match c {
        Code::Ok => PbCode::Ok as i32,
        Code::OverLimit => PbCode::OverLimit as i32,
    }
}

fn pb_status(s: &Status) -> DescriptorStatus {
    DescriptorStatus {
        code: pb_code(s.code),
        current_limit: s.current_limit.as_ref().map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: pb_unit(l.unit) as i32,
        }),
        limit_remaining: s.limit_remaining,
        duration_until_reset: s.duration_until_reset.map(pb_duration),
        quota: None,
    }
}

/// Reads Envoy's request: the request's `hits_addend` (0 is 1), each descriptor's own
/// `hits_addend` and `is_negative_hits`.
pub fn request_in(r: &RateLimitRequest) -> RequestIn {
    RequestIn {
        domain: r.domain.clone(),
        descriptors: r
            .descriptors
            .iter()
            .map(|d| DescriptorIn {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect(),
                hits: d.hits_addend.as_ref().map(|h| h.value),
                negative: d.is_negative_hits,
            })
            .collect(),
        hits_addend: u64::from(r.hits_addend),
    }
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, GrpcStatus> {
        let req = request_in(request.get_ref());
        let answer = match self.engine.decide(&req).await {
            Ok(a) => a,
            Err(Refusal::Invalid(m)) => return Err(GrpcStatus::invalid_argument(m)),
            Err(Refusal::Internal(m)) => return Err(GrpcStatus::internal(m)),
        };
        let response_headers_to_add = if self.headers {
            answer
                .headers
                .iter()
                .map(|(name, value)| HeaderValue {
                    key: name.as_str().to_owned(),
                    value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    raw_value: Vec::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: pb_code(answer.overall),
            statuses: answer.statuses.iter().map(pb_status).collect(),
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}
