//! `rl-gateway`: Envoy's rate limit service over gRPC and a forward-auth HTTP endpoint,
//! deciding with redis-rl. See gateway/README.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use redis_rl_client::{FailurePolicy, Limiter, LimiterBuilder};
use rl_gateway::config::Config;
use rl_gateway::decide::{Caps, Engine};

/// Command-line options.
#[derive(Debug, Parser)]
#[command(name = "rl-gateway", version, about)]
struct Args {
    /// Redis URL (`redis://host:port/db`); repeat it, with --cluster, for a Cluster's nodes.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: Vec<String>,
    /// The --redis URLs are Redis Cluster nodes.
    #[arg(long)]
    cluster: bool,
    /// The configuration: a YAML file (one domain) or a directory of them.
    #[arg(long)]
    config: PathBuf,
    /// gRPC listen address (Envoy's rate limit service); port 0 picks a free one.
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// HTTP listen address (forward-auth, /metrics, /healthz); port 0 picks a free one.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// How long one Redis call may take before the domain's failure policy answers.
    #[arg(long, default_value_t = 200)]
    redis_timeout_ms: u64,
    /// Add the RateLimit response fields to gRPC answers (`response_headers_to_add`).
    #[arg(long)]
    ratelimit_headers: bool,
    /// Most descriptors in one request.
    #[arg(long, default_value_t = 64)]
    max_descriptors: usize,
    /// Most entries in one descriptor.
    #[arg(long, default_value_t = 32)]
    max_entries: usize,
    /// A trusted proxy (address or CIDR network; repeat it): its X-Forwarded-For names the
    /// client of a forward-auth request. Default: loopback.
    #[arg(long = "trusted-proxy", default_values_t = ["127.0.0.0/8".to_owned(), "::1".to_owned()])]
    trusted_proxies: Vec<String>,
    /// Do not watch the configuration for changes (SIGHUP still reloads it).
    #[arg(long)]
    no_watch: bool,
    /// Prefix of every Redis key.
    #[arg(long, default_value = "rl-gateway:")]
    prefix: String,
}

fn builder(args: &Args) -> LimiterBuilder {
    let b = if args.cluster {
        Limiter::cluster_builder(args.redis.clone())
    } else {
        Limiter::builder(args.redis.first().cloned().unwrap_or_default())
    };
    b.prefix(args.prefix.clone())
        .timeout(Duration::from_millis(args.redis_timeout_ms.max(1)))
        .deny_cache(false)
}

#[tokio::main]
async fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal, and never with NO_COLOR set (https://no-color.org): a log
    // file or a collector gets plain lines.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("rl-gateway: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    if args.grpc.is_none() && args.http.is_none() {
        return Err("nothing to serve: give --grpc, --http or both".into());
    }
    if args.redis.len() > 1 && !args.cluster {
        return Err("several --redis URLs are a Cluster's nodes: add --cluster".into());
    }
    let config = Config::load(&args.config).map_err(|e| e.to_string())?;
    let open = builder(&args)
        .on_error(FailurePolicy::Open)
        .build()
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let closed = builder(&args)
        .on_error(FailurePolicy::Closed)
        .build()
        .await
        .map_err(|e| format!("redis: {e}"))?;
    let caps = Caps {
        max_descriptors: args.max_descriptors.max(1),
        max_entries: args.max_entries.max(1),
    };
    let engine = Arc::new(Engine::new(config, open, closed, caps));
    engine.metrics.config_load_success.inc();
    tracing::info!(
        "configuration loaded: domains {:?}",
        engine.config().domain_names()
    );

    let mut tasks = tokio::task::JoinSet::new();
    // The watch and the SIGHUP handler are in place before the listeners are announced.
    tasks.spawn(rl_gateway::reload::start(
        engine.clone(),
        args.config.clone(),
        !args.no_watch,
    )?);
    if let Some(addr) = args.grpc {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("grpc: bind {addr}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        println!("rl-gateway: grpc listening on {bound}");
        let service = rl_gateway::grpc::Service::new(engine.clone(), args.ratelimit_headers);
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tasks.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service.server())
                .serve_with_incoming(incoming)
                .await
                .map_err(|e| format!("grpc: {e}"))
        });
    }
    if let Some(addr) = args.http {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("http: bind {addr}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        println!("rl-gateway: http listening on {bound}");
        let client_ip = redis_rl_client::http::ClientIp::new()
            .trusted(&args.trusted_proxies)
            .map_err(|e| format!("--trusted-proxy: {e}"))?;
        let app =
            rl_gateway::web::router(engine.clone(), rl_gateway::web::WebOptions { client_ip });
        tasks.spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .map_err(|e| format!("http: {e}"))
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(format!("a server task failed: {e}")),
        }
    }
    Ok(())
}
