//! The [`Limiter`]: decisions in Redis, the failure policy, and the local fast path.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::Slot;
use redis::{Cmd, RedisError, Value};
use tokio::task::JoinHandle;

use crate::decision::{decision_from_reply, Decision, RetryAfter, Source};
use crate::error::{is_unavailable, Error};
use crate::limits::{Algorithm, InvalidLimit, Limit, MAX_SECONDS};
use crate::local::{credit_deadlines, Credit, Credits, DenyCache};
use crate::memory::{LocalItem, LocalOptions, Memory};
use crate::policy::{Counter, Counters, FailurePolicy, Health, Hook};
use crate::protocol::{
    all_reply, command_exists, configured_code, frame_with, ints, is_missing_function, is_noscript,
    is_oom, is_refused, is_unknown_command, library_plan, library_version, listed_library,
    script_text, twin_frame, Connection, LibraryPlan, Mode, Op, Script, LIBRARY_NAME, LUA_LIBRARY,
};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// `RL.REFUND`'s reply: units given back, the key's remaining and reset time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refund {
    /// Units actually given back (0 for a missing key), wherever they went.
    pub refunded: u64,
    /// Requests of cost 1 allowed now (Redis's figure; 0 when Redis took no part).
    pub remaining: u64,
    /// Until the key is idle again (Redis's figure; zero when Redis took no part).
    pub reset_after: Duration,
    /// Redis gave nothing back: it did not answer (nothing was refunded, except in the
    /// `Local` policy's memory), or under [`FailurePolicy::Local`] the whole refund went back
    /// to the in-memory limiter that took the charge.
    pub degraded: bool,
}

/// `RL.RELEASE`'s reply: slots freed, the key's remaining and reset time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// Slots freed (0 when the token held no live lease: releasing twice is harmless), in
    /// Redis and, under [`FailurePolicy::Local`], in memory.
    pub released: u64,
    /// Slots free now.
    pub remaining: u64,
    /// Until the last live lease ends.
    pub reset_after: Duration,
    /// Redis did not answer; nothing was released in Redis (the lease ends by itself).
    pub degraded: bool,
}

/// How a [`LimiterBuilder`] reaches Redis.
enum Target {
    Url(String),
    Cluster(Vec<String>),
    Connection(Connection),
}

/// Configures and builds a [`Limiter`]; from [`Limiter::builder`],
/// [`Limiter::cluster_builder`] or [`Limiter::with_connection`].
///
/// ```no_run
/// # async fn demo() -> Result<(), redis_rl_client::Error> {
/// use std::time::Duration;
/// use redis_rl_client::{FailurePolicy, Limiter, Mode};
///
/// let limiter = Limiter::builder("redis://127.0.0.1:6379/")
///     .on_error(FailurePolicy::Closed)   // deny while Redis is down (login limits)
///     .timeout(Duration::from_millis(200))
///     .mode(Mode::Auto)                  // the module if loaded, else the Lua fallback
///     .prefix("rl:")
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct LimiterBuilder {
    target: Target,
    mode: Mode,
    on_error: FailurePolicy,
    prefix: String,
    timeout: Duration,
    deny_cache: bool,
    batch: Option<u64>,
    batch_hold: Duration,
    probe_interval: Duration,
    closed_retry_after: Duration,
    load_library: bool,
    hook: Option<Hook>,
    fleet_size: u64,
}

impl LimiterBuilder {
    fn new(target: Target) -> LimiterBuilder {
        LimiterBuilder {
            target,
            mode: Mode::Auto,
            on_error: FailurePolicy::Open,
            prefix: String::new(),
            timeout: Duration::from_millis(500),
            deny_cache: true,
            batch: None,
            batch_hold: Duration::from_millis(100),
            probe_interval: Duration::from_secs(1),
            closed_retry_after: Duration::from_secs(1),
            load_library: true,
            hook: None,
            fleet_size: 1,
        }
    }

    /// [`Mode::Auto`] (default): detect the module once per connection; or force
    /// [`Mode::Module`] / [`Mode::Fallback`].
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// What a check answers when Redis does not (default [`FailurePolicy::Open`]).
    pub fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = policy;
        self
    }

    /// How many processes share the limits, for [`FailurePolicy::Local`]: while Redis is
    /// away each process enforces `limit / n` (rounding down, at least 1; GCRA: its burst and
    /// its rate), so the fleet as a whole stays near the limit (default 1). At least 1: 0 is
    /// [`Error::Usage`] at [`build`](LimiterBuilder::build).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_rl_client::{FailurePolicy, Gcra, Limiter, Source};
    ///
    /// // Nothing listens on port 1: every decision comes from this process's memory.
    /// let limiter = Limiter::builder("redis://127.0.0.1:1/")
    ///     .on_error(FailurePolicy::Local)
    ///     .fleet_size(4)                       // four replicas share each limit
    ///     .build()
    ///     .await?;
    /// let per_user = Gcra::new(8, 4, 1)?;      // locally: 2 at once, then 1 per second
    /// let first = limiter.check("user:42", &per_user).await?;
    /// assert!(first.allowed && first.degraded && !first.blind);
    /// assert_eq!((first.source, first.limit, first.remaining), (Source::Local, 2, 1));
    /// assert!(limiter.check("user:42", &per_user).await?.allowed);
    /// let third = limiter.check("user:42", &per_user).await?;
    /// assert!(!third.allowed && third.headers(None).contains_key("ratelimit"));
    /// # Ok(()) }
    /// ```
    pub fn fleet_size(mut self, n: u64) -> Self {
        self.fleet_size = n;
        self
    }

    /// Prepended to every key. It may not contain `{` or `}` (it would become the hash tag:
    /// hash tags belong to the caller's keys).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The connect and command timeout (default 500 ms). Every Redis call is bounded by it
    /// and a timeout is never retried (retries make an outage slow to detect). A call that
    /// failed at the connection level (refused, reset, a broken pipe: Redis restarted while
    /// the limiter was idle) is retried once on a fresh connection before it counts as an
    /// outage, so the first call after a restart is decided by Redis.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Answer denied keys locally until their `retry_after` runs out (default on).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }

    /// Take up to `k` units per Redis call and admit locally from them (GCRA, FIXED and
    /// SLIDING limits, single checks; default off). See the crate README for the trade-off.
    pub fn batch(mut self, k: u64) -> Self {
        self.batch = Some(k);
        self
    }

    /// How long unused batch units are held before they are refunded (default 100 ms).
    pub fn batch_hold(mut self, hold: Duration) -> Self {
        self.batch_hold = hold;
        self
    }

    /// During an outage, how often a call tries Redis again (default 1 s); the others are
    /// answered by the policy at once.
    pub fn probe_interval(mut self, every: Duration) -> Self {
        self.probe_interval = every;
        self
    }

    /// The `retry_after` of a [`FailurePolicy::Closed`] denial (default 1 s).
    pub fn closed_retry_after(mut self, wait: Duration) -> Self {
        self.closed_retry_after = wait;
        self
    }

    /// Whether the client may `FUNCTION LOAD` the fallback library when the server lacks it
    /// or holds another version (default true). With `false`, a missing library is
    /// [`Error::Library`].
    pub fn load_library(mut self, allowed: bool) -> Self {
        self.load_library = allowed;
        self
    }

    /// Called as `hook(counter_name, n)` on every counter increment (for Prometheus,
    /// StatsD, …). It must be cheap and must not panic.
    pub fn hook(mut self, hook: impl Fn(&'static str, u64) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Builds the limiter (inside a Tokio runtime). For one server the connection is made
    /// lazily, so a limiter can be built while Redis is down (the failure policy answers
    /// until it is up); a cluster client connects now and returns [`Error::Unavailable`] if
    /// it cannot. A prefix with braces, or a duration setting that is zero or longer than
    /// [`MAX_SECONDS`](crate::MAX_SECONDS), is [`Error::Usage`].
    pub async fn build(self) -> Result<Limiter, Error> {
        if self.prefix.contains('{') || self.prefix.contains('}') {
            return Err(Error::Usage(
                "prefix must not contain '{' or '}' (it would become the hash tag)".into(),
            ));
        }
        for (d, name) in [
            (self.timeout, "timeout"),
            (self.batch_hold, "batch_hold"),
            (self.probe_interval, "probe_interval"),
            (self.closed_retry_after, "closed_retry_after"),
        ] {
            // The upper bound keeps `Instant + d` from overflowing (a panic) on every platform.
            if d.is_zero() || d > Duration::from_secs(MAX_SECONDS) {
                return Err(Error::Usage(format!(
                    "{name} must be a positive duration of at most {MAX_SECONDS} s"
                )));
            }
        }
        if self.batch == Some(0) {
            return Err(InvalidLimit::new("batch must be a positive integer").into());
        }
        if self.fleet_size == 0 {
            return Err(Error::Usage("fleet_size must be at least 1".into()));
        }
        let conn = match self.target {
            Target::Connection(c) => c,
            Target::Url(url) => {
                let client = redis::Client::open(url.as_str()).map_err(Error::Redis)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(0);
                Connection::Single(
                    ConnectionManager::new_lazy_with_config(client, config)
                        .map_err(Error::Redis)?,
                )
            }
            Target::Cluster(urls) => {
                let client = ClusterClientBuilder::new(urls)
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .retries(3)
                    .build()
                    .map_err(Error::Redis)?;
                let c = tokio::time::timeout(self.timeout * 4, client.get_async_connection())
                    .await
                    .map_err(|_| Error::Unavailable(timed_out(self.timeout * 4)))?
                    .map_err(|e| {
                        if is_unavailable(&e) {
                            Error::Unavailable(e)
                        } else {
                            Error::Redis(e)
                        }
                    })?;
                Connection::Cluster(c)
            }
        };
        let batching = self.batch.is_some_and(|k| k > 1);
        Ok(Limiter {
            inner: Arc::new(Inner {
                conn,
                mode_setting: self.mode,
                resolved: AtomicU8::new(0),
                library_ready: AtomicBool::new(false),
                detect: tokio::sync::Mutex::new(()),
                prefix: self.prefix,
                timeout: self.timeout,
                load_library: self.load_library,
                counters: Counters::new(self.hook),
                health: Health::new(self.on_error, self.probe_interval, self.closed_retry_after),
                deny_cache: self.deny_cache.then(|| DenyCache::new(10_000)),
                memory: (self.on_error == FailurePolicy::Local)
                    .then(|| Memory::new(self.fleet_size)),
                renew_plain: AtomicBool::new(false),
                scripts: AtomicBool::new(false),
                script_cached: AtomicBool::new(false),
                eval_refused: AtomicBool::new(false),
                evalsha_refused: AtomicBool::new(false),
                batch: self.batch,
                batch_hold: self.batch_hold,
                credits: batching.then(Credits::new),
                rtt_ns: AtomicU64::new(1_000_000),
                hints: Mutex::new(HashMap::new()),
                pending: Mutex::new(Vec::new()),
                sweeper: Mutex::new(None),
            }),
        })
    }
}

/// A failure of the connection, not of the command or of the server: refused, reset,
/// aborted, a broken pipe, an end of file. Not a timeout.
fn is_connection_level(e: &RedisError) -> bool {
    !e.is_timeout() && (e.is_connection_dropped() || e.is_connection_refusal())
}

/// How a call sent as a script goes on after an error ([`Limiter::script_recovery`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScriptStep {
    /// Send the call again, in the (updated) form.
    Retry,
    /// `SCRIPT LOAD` the text on the key's node, then send the call again by SHA1.
    Load,
}

fn timed_out(after: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("redis-rl: no reply within {after:?}"),
    ))
}

struct Inner {
    conn: Connection,
    mode_setting: Mode,
    /// 0: not detected yet; 1: module; 2: fallback.
    resolved: AtomicU8,
    library_ready: AtomicBool,
    detect: tokio::sync::Mutex<()>,
    prefix: String,
    timeout: Duration,
    load_library: bool,
    counters: Counters,
    health: Health,
    deny_cache: Option<DenyCache>,
    memory: Option<Memory>,
    renew_plain: AtomicBool,
    /// The fallback runs as a script (no FUNCTION here): `EVAL` first, `EVALSHA` once the
    /// servers were sent the text (`script_cached`).
    scripts: AtomicBool,
    script_cached: AtomicBool,
    /// `EVAL` is refused (renamed away, denied by ACL): the text goes by `SCRIPT LOAD`,
    /// calls by `EVALSHA`.
    eval_refused: AtomicBool,
    /// `EVALSHA` is refused: every call sends the text (`EVAL`).
    evalsha_refused: AtomicBool,
    batch: Option<u64>,
    batch_hold: Duration,
    credits: Option<Credits>,
    rtt_ns: AtomicU64,
    hints: Mutex<HashMap<String, (u64, Instant)>>,
    pending: Mutex<Vec<Credit>>,
    sweeper: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .sweeper
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes rate-limit decisions in Redis, shared by every process of a service.
///
/// Cheap to clone (the clones share the connection, counters and local state). Decisions
/// come from the redis-rl module when the server has it, else from the project's Lua
/// Functions library (same replies; [`Mode`]). When Redis does not answer, the
/// [`FailurePolicy`] does.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use redis_rl_client::{Gcra, Limiter, Window, Entry};
///
/// let limiter = Limiter::builder("redis://127.0.0.1:6379/").build().await?;
/// let per_user = Gcra::new(10, 5, 1)?; // 10 at once, then 5 per second
///
/// let d = limiter.check("user:42", &per_user).await?;
/// if !d.allowed {
///     let status = if d.never() { 413 } else { 429 };
///     let headers = d.headers(Some("api")); // Retry-After, RateLimit-Policy, RateLimit
///     # let _ = (status, headers);
/// }
///
/// // Options on the same call: cost, peek, max_wait (GCRA reservations), force.
/// let big = limiter.check("user:42", &per_user).cost(3).peek().await?;
///
/// // Several limits, one atomic decision (RL.ALL), with per-limit costs:
/// let rpm = Window::sliding(600, 60)?.named("rpm")?;
/// let tpm = Window::sliding(90_000, 60)?.named("tpm")?;
/// let d = limiter
///     .check_all([Entry::new("{t42}:rpm", &rpm), Entry::new("{t42}:tpm", &tpm).cost(1200)])
///     .await?;
/// # let _ = (big, d);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("conn", &self.inner.conn)
            .field("mode", &self.inner.mode_setting)
            .field("on_error", &self.inner.health.policy)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// One limit of a [`Limiter::check_all`]: a key, its limit, and optionally its own cost and
/// (for a [`Lease`](crate::Lease)) the holder's token.
///
/// ```
/// use redis_rl_client::{Entry, Lease, Window};
///
/// let tpm = Window::sliding(90_000, 60).unwrap();
/// let slots = Lease::new(4, 30).unwrap();
/// let tokens = Entry::new("{t42}:tpm", &tpm).cost(1200); // charged 1,200, not the quantity
/// let slot = Entry::new("{t42}:jobs", &slots).token("job-7");
/// # let _ = (tokens, slot);
/// ```
#[derive(Debug, Clone)]
pub struct Entry {
    key: String,
    limit: Limit,
    cost: Option<u64>,
    token: Option<Vec<u8>>,
}

impl Entry {
    /// A key and its limit, charged the call's cost.
    pub fn new(key: impl Into<String>, limit: impl Into<Limit>) -> Entry {
        Entry {
            key: key.into(),
            limit: limit.into(),
            cost: None,
            token: None,
        }
    }

    /// Charges this limit `n` instead of the call's cost (`COST n`; 0 only reports).
    pub fn cost(mut self, n: u64) -> Entry {
        self.cost = Some(n);
        self
    }

    /// The holder's token, for a [`Lease`](crate::Lease) limit (1 to 64 bytes).
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Entry {
        self.token = Some(token.as_ref().to_vec());
        self
    }
}

impl<K: Into<String>, L: Into<Limit>> From<(K, L)> for Entry {
    fn from((key, limit): (K, L)) -> Entry {
        Entry::new(key, limit)
    }
}

impl<K: Into<String>, L: Into<Limit>> From<(K, L, u64)> for Entry {
    fn from((key, limit, cost): (K, L, u64)) -> Entry {
        Entry::new(key, limit).cost(cost)
    }
}

/// One [`Limiter::check`], with its options; `.await` it.
///
/// ```no_run
/// # async fn demo(limiter: redis_rl_client::Limiter) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use redis_rl_client::Gcra;
///
/// let g = Gcra::new(1, 1, 1)?;
/// let plain = limiter.check("k", &g).await?;
/// let dry_run = limiter.check("k", &g).peek().await?;
/// let reserved = limiter.check("k", &g).max_wait(Duration::from_secs(2)).await?;
/// let recorded = limiter.check("k", &g).cost(8).force().await?;
/// # let _ = (plain, dry_run, reserved, recorded);
/// # Ok(()) }
/// ```
#[must_use = "a check does nothing until it is awaited"]
pub struct Check<'a> {
    limiter: &'a Limiter,
    key: String,
    limit: Limit,
    cost: u64,
    peek: bool,
    max_wait: Option<Duration>,
    force: bool,
}

impl Check<'_> {
    /// Units this request costs (default 1; 0 only reports the key's state).
    pub fn cost(mut self, n: u64) -> Self {
        self.cost = n;
        self
    }

    /// Evaluate exactly as a real request, write nothing (a dry run).
    pub fn peek(mut self) -> Self {
        self.peek = true;
        self
    }

    /// GCRA reservation (`MAXWAIT`): admit a request that would be allowed within `wait`;
    /// the decision's `retry_after` is the wait before acting.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = Some(wait);
        self
    }

    /// Record usage that already happened, allowed or not (`FORCE`; not for LOG).
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }

    fn local_options(&self) -> LocalOptions {
        LocalOptions {
            peek: self.peek,
            force: self.force,
            max_wait: self.max_wait,
            renew: false,
        }
    }
}

impl<'a> IntoFuture for Check<'a> {
    type Output = Result<Decision, Error>;
    type IntoFuture = BoxFuture<'a, Result<Decision, Error>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.limiter.run_check(self).await })
    }
}

/// One [`Limiter::check_all`], with its options; `.await` it.
#[must_use = "a check does nothing until it is awaited"]
pub struct CheckAll<'a> {
    limiter: &'a Limiter,
    entries: Vec<Entry>,
    cost: u64,
    peek: bool,
    force: bool,
    across_slots: bool,
}

impl CheckAll<'_> {
    /// The request's quantity on every limit without its own cost (default 1).
    pub fn cost(mut self, n: u64) -> Self {
        self.cost = n;
        self
    }

    /// Evaluate exactly as a real request, write nothing.
    pub fn peek(mut self) -> Self {
        self.peek = true;
        self
    }

    /// Record usage that already happened on every limit (`FORCE`).
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }

    /// On a Redis Cluster, accept keys in several slots: the limits are checked one slot
    /// group at a time, in key order (one `RL.ALL` each), and when a later group denies,
    /// what the earlier groups took is refunded (`RL.REFUND` with exactly the charge; a
    /// lease is released), so a denied request leaves no charge; the later groups are then
    /// peeked, and the decision is combined as `RL.ALL` combines. Not atomic: between the
    /// charge and the refund another request may see the earlier limits charged (it can
    /// only be denied for it, never admitted past a limit). Keys in one slot, and every call
    /// on one server, are still one `RL.ALL`. Without this, keys in several slots are
    /// [`Error::Redis`] (`CROSSSLOT`). The layer's rules use it.
    ///
    /// ```no_run
    /// # async fn demo(cluster: redis_rl_client::Limiter) -> Result<(), redis_rl_client::Error> {
    /// use redis_rl_client::{Entry, Gcra, Window};
    ///
    /// let per_key = Gcra::new(10, 1, 60)?;
    /// let per_ip = Window::sliding(100, 60)?;
    /// let d = cluster
    ///     .check_all([Entry::new("{key:k1}:api", &per_key), Entry::new("{ip:192.0.2.7}:ip", &per_ip)])
    ///     .across_slots()
    ///     .await?;
    /// # let _ = d;
    /// # Ok(()) }
    /// ```
    pub fn across_slots(mut self) -> Self {
        self.across_slots = true;
        self
    }

    fn local_options(&self) -> LocalOptions {
        LocalOptions {
            peek: self.peek,
            force: self.force,
            max_wait: None,
            renew: false,
        }
    }
}

impl<'a> IntoFuture for CheckAll<'a> {
    type Output = Result<Decision, Error>;
    type IntoFuture = BoxFuture<'a, Result<Decision, Error>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.limiter.run_check_all(self).await })
    }
}

/// The outcome of one guarded Redis call: a reply, or the outage that prevented it.
pub(crate) enum Outcome {
    Reply(Value, Mode),
    Down(RedisError),
}

#[derive(Clone)]
struct Item {
    key: String,
    limit: Limit,
    cost: Option<u64>,
    token: Option<Vec<u8>>,
}

/// Combines per-key decisions as `RL.ALL` does (the project's core rule: the binding limit
/// admits the fewest further calls of this shape; the longest wait among the denying ones;
/// `Never` if any can never pass), each with the charge it was asked.
fn combine_decisions(per: Vec<Decision>, charges: &[u64]) -> Decision {
    use redis_rl::decision::{combine, Decision as Core, Verdict};
    use redis_rl::time::Span;
    let span = |d: Duration| Span::from_ns(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    let core: Vec<(Core, u64)> = per
        .iter()
        .zip(charges)
        .map(|(d, &charge)| {
            let verdict = match (d.allowed, d.retry_after) {
                (true, _) => Verdict::Allowed,
                (false, RetryAfter::Never) => Verdict::Never,
                (false, RetryAfter::Wait(w)) => Verdict::Denied {
                    retry_after: span(w),
                },
            };
            let decision = Core {
                verdict,
                limit: d.limit,
                remaining: d.remaining,
                reset_after: span(d.reset_after),
            };
            (decision, charge)
        })
        .collect();
    let c = combine(&core);
    let (allowed, retry_after) = match c.verdict {
        Verdict::Allowed | Verdict::Reserved { .. } => (true, RetryAfter::Wait(Duration::ZERO)),
        Verdict::Never => (false, RetryAfter::Never),
        Verdict::Denied { retry_after } => (
            false,
            RetryAfter::Wait(Duration::from_nanos(retry_after.as_ns())),
        ),
    };
    let binding = per
        .iter()
        .find(|d| d.limit == c.limit && d.remaining == c.remaining)
        .and_then(|d| d.policy.clone());
    Decision {
        allowed,
        limit: c.limit,
        remaining: c.remaining,
        retry_after,
        reset_after: Duration::from_nanos(c.reset_after.as_ns()),
        degraded: per.iter().any(|d| d.degraded),
        blind: per.iter().any(|d| d.blind),
        source: per.first().map_or(Source::Local, |d| d.source),
        policy: binding,
        key: None,
        per_key: per,
    }
}

fn bytes(s: impl Into<String>) -> Vec<u8> {
    s.into().into_bytes()
}

impl Limiter {
    /// A builder for a limiter on one server (`redis://host:port/db`, `rediss://…`).
    pub fn builder(url: impl Into<String>) -> LimiterBuilder {
        LimiterBuilder::new(Target::Url(url.into()))
    }

    /// A builder for a limiter on a Redis Cluster, from one or more nodes' URLs.
    pub fn cluster_builder<I, S>(urls: I) -> LimiterBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LimiterBuilder::new(Target::Cluster(urls.into_iter().map(Into::into).collect()))
    }

    /// A builder over a connection you made (a `ConnectionManager` or a cluster
    /// connection). The limiter still bounds every call by its `timeout`; give your
    /// connection matching timeouts and no retries.
    pub fn with_connection(conn: impl Into<Connection>) -> LimiterBuilder {
        LimiterBuilder::new(Target::Connection(conn.into()))
    }

    /// The counters (allowed, denied, locally, degraded, errors, Redis calls, refunded).
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.health.policy
    }

    /// The `retry_after` of a [`FailurePolicy::Closed`] denial.
    pub fn closed_retry_after(&self) -> Duration {
        self.inner.health.closed_retry_after
    }

    /// The bound on every Redis call ([`LimiterBuilder::timeout`]).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The connection this limiter talks through.
    pub fn connection(&self) -> &Connection {
        &self.inner.conn
    }

    /// The mode in use ([`Mode::Module`] or [`Mode::Fallback`]), detecting it if needed
    /// (and loading the fallback library if it is missing and allowed).
    pub async fn resolved_mode(&self) -> Result<Mode, Error> {
        self.mode().await
    }

    // -- decisions ------------------------------------------------------------------------

    /// Asks whether one request (cost 1, unless `.cost(n)`) of `limit` on `key` may go
    /// ahead now, and takes it (`RL.GCRA` / `RL.WINDOW`). `.await` the returned [`Check`];
    /// its options are `.cost(n)`, `.peek()`, `.max_wait(d)` (GCRA) and `.force()`.
    pub fn check(&self, key: impl Into<String>, limit: impl Into<Limit>) -> Check<'_> {
        Check {
            limiter: self,
            key: key.into(),
            limit: limit.into(),
            cost: 1,
            peek: false,
            max_wait: None,
            force: false,
        }
    }

    /// Records `cost` units of usage that already happened, allowed or not
    /// (`RL.GCRA … FORCE`, `RL.WINDOW … FORCE`; not for LOG).
    pub async fn force(
        &self,
        key: impl Into<String>,
        limit: impl Into<Limit>,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.check(key, limit).cost(cost).force().await
    }

    /// Decides one request against several limits atomically (`RL.ALL`): every limit admits
    /// it and all are charged, or none is. The combined decision has each key's decision in
    /// `per_key`. On a cluster, give the keys one hash tag: `{user42}:rpm`, `{user42}:tpm`
    /// (see [`tag`](crate::tag)).
    pub fn check_all<I>(&self, entries: I) -> CheckAll<'_>
    where
        I: IntoIterator,
        I::Item: Into<Entry>,
    {
        CheckAll {
            limiter: self,
            entries: entries.into_iter().map(Into::into).collect(),
            cost: 1,
            peek: false,
            force: false,
            across_slots: false,
        }
    }

    /// Gives back up to `n` units to `key` (`RL.REFUND`), and forgets this limiter's local
    /// denials of it.
    ///
    /// Under [`FailurePolicy::Local`] a refund goes back where the charge was taken: the
    /// units the in-memory limiter charged `key` during an outage and has not given back are
    /// given back there first, also once Redis answers again (Redis never had them: refunding
    /// them there would give back other requests' units), and only the rest of `n` goes to
    /// Redis. The in-memory limiter remembers those units as long as it holds the key (until
    /// the key is idle, as its Redis twin would expire). A key charged both during an outage
    /// and after it is refunded in memory first; a refund misplaced that way only
    /// under-admits. [`Limiter::refund_decision`] gives back the charge of one decision
    /// exactly where it was taken.
    pub async fn refund(&self, key: &str, n: u64) -> Result<Refund, Error> {
        let full = self.full_key(key)?;
        self.refund_full(&full, n).await
    }

    pub(crate) async fn refund_full(&self, full: &str, n: u64) -> Result<Refund, Error> {
        if n == 0 {
            return Err(InvalidLimit::new("quantity must be a positive integer").into());
        }
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(full);
        }
        let mut rest = n;
        let mut local = None;
        if let Some(memory) = &self.inner.memory {
            let m = memory.refund_owed(full, n, true);
            if m.taken > 0 {
                self.inner.counters.add(Counter::Refunded, m.refunded);
                local = Some(m);
                rest -= m.taken;
            }
        }
        if let Some(m) = local.filter(|_| rest == 0) {
            return Ok(memory_refund(m));
        }
        let mut r = self.refund_redis(full, rest, true).await?;
        r.refunded += local.map_or(0, |m| m.refunded);
        Ok(r)
    }

    /// Gives back up to `n` units of the charge `decision` took, where it took it: to the
    /// in-memory limiter of [`FailurePolicy::Local`] when it is its decision (degraded, not
    /// [`blind`](Decision::blind): taken in memory during an outage), also once Redis
    /// answers again; nothing when it is blind (the open or closed policy charged nothing);
    /// else to Redis (`RL.REFUND`), and when Redis does not answer the refund is lost (it
    /// only under-admits), never taken from memory ([`Error::Unavailable`] under
    /// [`FailurePolicy::Error`]). Forgets this limiter's local denials of its key.
    ///
    /// `decision` is one key's decision this limiter returned (a check, a force, or one of a
    /// `check_all`'s [`per_key`](Decision::per_key)); a combined decision, a lease's and a
    /// decision without a key are refused ([`Error::Usage`]). `n` must be at least 1.
    pub async fn refund_decision(&self, decision: &Decision, n: u64) -> Result<Refund, Error> {
        if n == 0 {
            return Err(InvalidLimit::new("quantity must be a positive integer").into());
        }
        let full = match &decision.key {
            Some(k) if !k.is_empty() && decision.per_key.is_empty() => k.as_str(),
            _ => return Err(Error::Usage(
                "refund_decision needs one key's decision (of a check_all, each of its per_key)"
                    .into(),
            )),
        };
        if matches!(decision.policy, Some(Limit::Lease(_))) {
            return Err(Error::Usage(
                "a lease is given back with release, not refund_decision".into(),
            ));
        }
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(full);
        }
        if decision.blind {
            return Ok(Refund {
                refunded: 0,
                remaining: 0,
                reset_after: Duration::ZERO,
                degraded: true,
            });
        }
        if let Some(memory) = self.memory_of(decision) {
            let m = memory.refund(full, n);
            self.inner.counters.add(Counter::Refunded, m.refunded);
            return Ok(memory_refund(m));
        }
        self.refund_redis(full, n, false).await
    }

    /// The in-memory limiter, when it took `decision`'s charge (the local policy's degraded,
    /// not blind, decision).
    fn memory_of(&self, decision: &Decision) -> Option<&crate::memory::Memory> {
        self.inner
            .memory
            .as_ref()
            .filter(|_| decision.degraded && !decision.blind)
    }

    /// `RL.REFUND` of `n` units of `full` in Redis. When Redis does not answer, the
    /// failure policy answers; with `in_memory`, the local policy's memory gives the units
    /// back (to what it charged), else the refund is lost (it only under-admits).
    async fn refund_redis(&self, full: &str, n: u64, in_memory: bool) -> Result<Refund, Error> {
        match self
            .guarded_unless_down(Op::Refund, full, bytes(n.to_string()))
            .await?
        {
            Err(cause) => {
                self.inner.health.answer(None, Some(full), cause.as_ref())?;
                if let Some(memory) = self.inner.memory.as_ref().filter(|_| in_memory) {
                    // Under the local policy, what the in-memory limiter took comes back.
                    let m = memory.refund(full, n);
                    self.inner.counters.add(Counter::Refunded, m.refunded);
                    return Ok(memory_refund(m));
                }
                Ok(Refund {
                    refunded: 0,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    degraded: true,
                })
            }
            Ok(v) => {
                self.inner.health.success();
                let r = ints::<3>(&v).map_err(Error::Redis)?;
                self.inner
                    .counters
                    .add(Counter::Refunded, r[0].max(0) as u64);
                Ok(Refund {
                    refunded: r[0].max(0) as u64,
                    remaining: r[1].max(0) as u64,
                    reset_after: Duration::from_millis(r[2].max(0) as u64),
                    degraded: false,
                })
            }
        }
    }

    /// Frees the lease `token` holds on `key` (`RL.RELEASE`); harmless twice. Under
    /// [`FailurePolicy::Local`] a lease the in-memory limiter granted during an outage is
    /// freed there too, also once Redis answers again (`released` counts the slots freed in
    /// both).
    pub async fn release(&self, key: &str, token: impl AsRef<[u8]>) -> Result<Release, Error> {
        let full = self.full_key(key)?;
        crate::limits::check_token(token.as_ref())?;
        let mut r = self.release_full(&full, token.as_ref(), true).await?;
        if !r.degraded {
            if let Some(memory) = &self.inner.memory {
                // Redis answered: a lease memory granted meanwhile is held there, not in Redis.
                r.released += memory.release(&full, token.as_ref());
            }
        }
        Ok(r)
    }

    /// `RL.RELEASE` of `token`'s lease on `full`. When Redis does not answer, the failure
    /// policy answers; with `in_memory`, the local policy's memory frees a lease it holds.
    pub(crate) async fn release_full(
        &self,
        full: &str,
        token: &[u8],
        in_memory: bool,
    ) -> Result<Release, Error> {
        match self
            .guarded_unless_down(Op::Release, full, token.to_vec())
            .await?
        {
            Err(cause) => {
                self.inner.health.answer(None, Some(full), cause.as_ref())?;
                let released = self
                    .inner
                    .memory
                    .as_ref()
                    .filter(|_| in_memory)
                    .map_or(0, |m| m.release(full, token));
                Ok(Release {
                    released,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    degraded: true,
                })
            }
            Ok(v) => {
                self.inner.health.success();
                let r = ints::<3>(&v).map_err(Error::Redis)?;
                Ok(Release {
                    released: r[0].max(0) as u64,
                    remaining: r[1].max(0) as u64,
                    reset_after: Duration::from_millis(r[2].max(0) as u64),
                    degraded: false,
                })
            }
        }
    }

    /// Gives back batch units whose hold has passed (every held unit with `everything`),
    /// where that is still safe; returns the units refunded. A background task does this
    /// every `batch_hold / 2` while batching is on.
    pub async fn refund_leftovers(&self, everything: bool) -> u64 {
        let Some(credits) = &self.inner.credits else {
            return 0;
        };
        let mut todo = if everything {
            credits.drain()
        } else {
            credits.expired(Instant::now())
        };
        todo.append(&mut lock(&self.inner.pending));
        let mut total = 0u64;
        for c in todo {
            if Instant::now() >= c.refund_until {
                continue; // the window rolled over / the bucket may have drained: let it lapse
            }
            match self
                .call(Op::Refund, &[&c.key], &[bytes(c.units.to_string())])
                .await
            {
                Ok((v, _)) => {
                    if let Ok(r) = ints::<3>(&v) {
                        // Counted as each reply lands, so the counter never lags Redis by
                        // more than the reply in flight.
                        let n = r[0].max(0) as u64;
                        total += n;
                        if n > 0 {
                            self.inner.counters.add(Counter::Refunded, n);
                        }
                    }
                }
                Err(Error::Redis(e)) if is_unavailable(&e) => {} // a lost refund only under-admits
                Err(e) => {
                    tracing::warn!(target: "redis_rl_client", "redis-rl: refund of batch leftovers failed: {e}");
                }
            }
        }
        total
    }

    /// Refunds held batch units and stops the background refunds. The limiter still works
    /// afterwards (batching restarts the background task when needed).
    pub async fn close(&self) {
        let task = lock(&self.inner.sweeper).take();
        if let Some(task) = task {
            task.abort();
        }
        self.refund_leftovers(true).await;
    }

    // -- internals ------------------------------------------------------------------------

    pub(crate) fn full_key(&self, key: &str) -> Result<String, Error> {
        if key.is_empty() {
            return Err(Error::Usage("key must be a non-empty string".into()));
        }
        Ok(format!("{}{key}", self.inner.prefix))
    }

    async fn raw(&self, cmd: &Cmd, route_key: Option<&str>) -> Result<Value, RedisError> {
        let query = self.inner.conn.query(cmd, route_key);
        match tokio::time::timeout(self.inner.timeout, query).await {
            Ok(r) => r,
            Err(_) => Err(timed_out(self.inner.timeout)),
        }
    }

    async fn mode(&self) -> Result<Mode, Error> {
        let inner = &self.inner;
        let mode = if inner.mode_setting != Mode::Auto {
            inner.mode_setting
        } else {
            match inner.resolved.load(Ordering::Acquire) {
                1 => Mode::Module,
                2 => Mode::Fallback,
                _ => {
                    let _guard = inner.detect.lock().await;
                    match inner.resolved.load(Ordering::Acquire) {
                        1 => Mode::Module,
                        2 => Mode::Fallback,
                        _ => {
                            let mut cmd = redis::cmd("COMMAND");
                            cmd.arg("INFO").arg("RL.GCRA");
                            // A user whose ACL admits the limiter's commands but not
                            // `COMMAND` (`+@ratelimit`, or `+rl.gcra …` on 7.0) gets NOPERM:
                            // try the module; an unknown command moves to the fallback.
                            let m = match self.raw(&cmd, None).await {
                                Ok(reply) if !command_exists(&reply) => Mode::Fallback,
                                Ok(_) => Mode::Module,
                                Err(e) if e.code() == Some("NOPERM") => Mode::Module,
                                Err(e) => return Err(Error::Redis(e)),
                            };
                            inner
                                .resolved
                                .store(if m == Mode::Module { 1 } else { 2 }, Ordering::Release);
                            m
                        }
                    }
                }
            }
        };
        if mode == Mode::Fallback && !inner.library_ready.load(Ordering::Acquire) {
            let _guard = inner.detect.lock().await;
            if !inner.library_ready.load(Ordering::Acquire) {
                self.ensure_library().await?;
                inner.library_ready.store(true, Ordering::Release);
            }
        }
        Ok(mode)
    }

    /// Makes every master run our library version, per its `rl_version`: loads it where it
    /// is missing, replaces an older one (keeping its settings), leaves a newer one (a
    /// rolling deploy) in place. Where `FCALL` is refused (Redis 6.x, an ACL, a service that
    /// disables Functions) or the library is missing and `FUNCTION` is refused, the
    /// fallback runs as a script.
    async fn ensure_library(&self) -> Result<(), Error> {
        let mut probe = redis::cmd("FCALL_RO");
        probe.arg("rl_version").arg(0);
        let replies = tokio::time::timeout(self.inner.timeout, self.inner.conn.on_masters(probe))
            .await
            .map_err(|_| Error::Redis(timed_out(self.inner.timeout)))?
            .map_err(Error::Redis)?;
        let ours = library_version(LUA_LIBRARY).unwrap_or("");
        for (node, reply) in replies {
            let theirs = match reply {
                Ok(v) => Some(redis::from_redis_value::<String>(v).unwrap_or_default()),
                Err(e) if is_missing_function(&e) => None,
                Err(e) if is_refused(&e) => {
                    self.use_scripts(&e);
                    return Ok(());
                }
                Err(e) => return Err(Error::Redis(e)),
            };
            if !self.load_on(node.as_ref(), ours, theirs).await? {
                return Ok(()); // FUNCTION refused where the library is missing: scripts
            }
        }
        Ok(())
    }

    /// Loads our library on one node (`None`: the one server) as [`library_plan`] says for
    /// the version there (`theirs`). A missing library is loaded without `REPLACE`, so one
    /// another client loaded since we looked (maybe newer) is never overwritten: it is
    /// looked at again, and replaced only if older. Returns false when the fallback moved to
    /// scripts.
    async fn load_on(
        &self,
        node: Option<&(String, u16)>,
        ours: &str,
        mut theirs: Option<String>,
    ) -> Result<bool, Error> {
        let at = node.map_or_else(String::new, |(h, p)| format!(" on {h}:{p}"));
        for _ in 0..2 {
            let plan = library_plan(theirs.as_deref(), ours);
            match plan {
                LibraryPlan::Keep => return Ok(true),
                LibraryPlan::Newer => {
                    // A newer client loaded it (a rolling deploy): it answers our calls too.
                    tracing::warn!(target: "redis_rl_client", "redis-rl: the server{at} runs redis_rl library {}, newer than this client's ({ours}): left in place", theirs.as_deref().unwrap_or(""));
                    return Ok(true);
                }
                _ if !self.inner.load_library => {
                    if plan == LibraryPlan::Load {
                        return Err(Error::Library(format!(
                            "the redis_rl Functions library is not loaded{at} and load_library is false"
                        )));
                    }
                    tracing::warn!(target: "redis_rl_client", "redis-rl: the server{at} runs an older redis_rl library than this client's ({ours}); load_library is false: not replaced");
                    return Ok(true);
                }
                _ => {}
            }
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD");
            if plan == LibraryPlan::Replace {
                load.arg("REPLACE").arg(self.configured_for(node).await);
            } else {
                load.arg(LUA_LIBRARY);
            }
            match self.node_query(&load, node).await? {
                Ok(_) => {
                    tracing::info!(target: "redis_rl_client", "redis-rl: loaded redis_rl library {ours}{at} (it had: {})", theirs.as_deref().unwrap_or("none"));
                    return Ok(true);
                }
                Err(e) if plan == LibraryPlan::Load && e.to_string().contains("already exists") => {
                    // Another client loaded it since we looked: "" (no rl_version) is older.
                    let mut probe = redis::cmd("FCALL_RO");
                    probe.arg("rl_version").arg(0);
                    theirs = Some(match self.node_query(&probe, node).await? {
                        Ok(v) => redis::from_redis_value::<String>(v).unwrap_or_default(),
                        Err(e) if is_missing_function(&e) => String::new(),
                        Err(e) => return Err(Error::Redis(e)),
                    });
                }
                Err(e) if is_refused(&e) => {
                    if theirs.is_some() {
                        // FUNCTION denied: the library there will do.
                        tracing::warn!(target: "redis_rl_client", "redis-rl: cannot load library {ours}{at} ({e}); using the one there");
                        return Ok(true);
                    }
                    self.use_scripts(&e);
                    return Ok(false);
                }
                Err(e) => return Err(Error::Redis(e)),
            }
        }
        Ok(true)
    }

    /// Our library's code with the settings of the library on `node` kept (an operator's
    /// edited lines), read with `FUNCTION LIST … WITHCODE`; ours as it is if that fails.
    async fn configured_for(&self, node: Option<&(String, u16)>) -> String {
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST")
            .arg("LIBRARYNAME")
            .arg(LIBRARY_NAME)
            .arg("WITHCODE");
        match self.node_query(&list, node).await {
            Ok(Ok(listing)) => match listed_library(&listing) {
                Some((_, theirs)) => configured_code(LUA_LIBRARY, &theirs),
                None => LUA_LIBRARY.to_owned(),
            },
            _ => LUA_LIBRARY.to_owned(),
        }
    }

    /// Runs `cmd` on one node within the timeout: `Ok(Err(_))` is the server's error reply,
    /// `Err` one that reached no server.
    async fn node_query(
        &self,
        cmd: &Cmd,
        node: Option<&(String, u16)>,
    ) -> Result<Result<Value, RedisError>, Error> {
        match tokio::time::timeout(self.inner.timeout, self.inner.conn.on_node(cmd, node, None))
            .await
        {
            Err(_) => Err(Error::Redis(timed_out(self.inner.timeout))),
            Ok(Err(e)) if e.code().is_none() => Err(Error::Redis(e)),
            Ok(r) => Ok(r),
        }
    }

    /// Switches the fallback to scripts: `EVAL` first, `EVALSHA` once a server has the text.
    fn use_scripts(&self, why: &RedisError) {
        if !self.inner.scripts.swap(true, Ordering::AcqRel) {
            tracing::info!(target: "redis_rl_client", "redis-rl: no Functions library on this server ({why}): the Lua fallback runs as a script (EVAL, then EVALSHA)");
        }
    }

    /// How the fallback is sent now: `FCALL`, or as a script (see [`Inner::scripts`]).
    fn script_form(&self) -> Script {
        let inner = &self.inner;
        if !inner.scripts.load(Ordering::Acquire) {
            Script::Functions
        } else if inner.eval_refused.load(Ordering::Acquire) {
            Script::Sha
        } else if inner.evalsha_refused.load(Ordering::Acquire)
            || !inner.script_cached.load(Ordering::Acquire)
        {
            Script::Text
        } else {
            Script::Sha
        }
    }

    /// How a call sent as a script goes on after error `e` (docs/clients.md#the-fallback-where-users-are):
    /// NOSCRIPT (a node without the text: a restart, a failover, a node added to a Cluster)
    /// sends the text there (`EVAL`, or `SCRIPT LOAD` where `EVAL` is refused); a refused
    /// `EVAL` moves to `SCRIPT LOAD` + `EVALSHA`, a refused `EVALSHA` to `EVAL`. `None`: not
    /// a scripting problem, or nothing left to try.
    ///
    /// Concurrent first calls (tasks) are sent `EVAL` (or `EVALSHA`) together and refused
    /// together: the refusal another call recorded first sends this one again in the form
    /// that is left (by SHA1 after a refused `EVAL`: the first call's `SCRIPT LOAD` sent the
    /// text, or `NOSCRIPT` loads it here). Only a call that was refused and knows the other
    /// form is refused too (it saw it, or another call recorded it) gets `None`.
    fn script_recovery(&self, sent: Script, e: &RedisError) -> Option<ScriptStep> {
        let inner = &self.inner;
        if sent == Script::Sha && is_noscript(e) {
            if inner.eval_refused.load(Ordering::Acquire) {
                return Some(ScriptStep::Load);
            }
            inner.script_cached.store(false, Ordering::Release);
            return Some(ScriptStep::Retry);
        }
        if !is_refused(e) {
            return None;
        }
        match sent {
            Script::Text => {
                let first = !inner.eval_refused.swap(true, Ordering::AcqRel);
                if inner.evalsha_refused.load(Ordering::Acquire) {
                    None
                } else if first {
                    Some(ScriptStep::Load)
                } else {
                    Some(ScriptStep::Retry)
                }
            }
            Script::Sha => {
                inner.evalsha_refused.store(true, Ordering::Release);
                (!inner.eval_refused.load(Ordering::Acquire)).then_some(ScriptStep::Retry)
            }
            Script::Functions => None,
        }
    }

    /// The one clear error of a server with neither the module nor any way to run the fallback.
    fn no_scripting(e: &RedisError) -> Error {
        Error::Library(format!(
            "redis-rl cannot decide on this server: it has no redis-rl module (RL.GCRA is not \
             there) and refuses the Lua fallback both as a Functions library (FUNCTION/FCALL) and \
             as scripts (EVAL/EVALSHA): {e}. Load the module, or allow FCALL and FUNCTION, or \
             EVAL and EVALSHA, for this client"
        ))
    }

    /// Runs one command in the resolved mode, detecting again once when the module
    /// disappeared or the library was flushed (a restart, a failover), and, as a script,
    /// going on as [`Limiter::script_recovery`] says.
    async fn call(&self, op: Op, keys: &[&str], args: &[Vec<u8>]) -> Result<(Value, Mode), Error> {
        let (mut reconnected, mut redetected) = (false, false);
        for _ in 0..5 {
            let mut form = Script::Functions;
            let (e, mode) = match self.mode().await {
                Err(Error::Redis(e)) => (e, None),
                Err(other) => return Err(other),
                Ok(mode) => {
                    self.inner.counters.add(Counter::RedisCalls, 1);
                    let sent = Instant::now();
                    if mode == Mode::Fallback {
                        form = self.script_form();
                    }
                    let cmd = frame_with(mode, form, op, keys, args);
                    match self.raw(&cmd, keys.first().copied()).await {
                        Ok(v) => {
                            self.observe_rtt(sent);
                            if mode == Mode::Fallback && form == Script::Text {
                                self.inner.script_cached.store(true, Ordering::Release);
                            }
                            return Ok((v, mode));
                        }
                        Err(e)
                            if mode == Mode::Fallback
                                && form == Script::Functions
                                && is_oom(&e) =>
                        {
                            // Out of memory the server refuses the writing function whole: its
                            // no-writes twin answers denials, PEEK and QUANTITY 0
                            // (docs/clients.md#out-of-memory).
                            let Some(twin) = twin_frame(op, keys, args) else {
                                return Err(Error::Redis(e));
                            };
                            self.inner.counters.add(Counter::RedisCalls, 1);
                            return match self.raw(&twin, keys.first().copied()).await {
                                Ok(v) => {
                                    self.observe_rtt(sent);
                                    Ok((v, mode))
                                }
                                // A library older than 1.3.0 has no twin: the OOM error stands.
                                Err(again) if is_missing_function(&again) || is_refused(&again) => {
                                    Err(Error::Redis(e))
                                }
                                Err(again) => Err(Error::Redis(again)),
                            };
                        }
                        Err(e) => (e, Some(mode)),
                    }
                }
            };
            // A connection-level failure is retried once, on a fresh connection, before it
            // counts as an outage (docs/clients.md#recovery). Redis restarted while this
            // limiter was idle: the pooled connection it closed answers the next call with a
            // broken pipe, a reset or an end of file, and the connection manager starts the
            // new connection as it reports it. After a failed connect, the manager answers
            // the next call with that stale refusal without sending it. Either way the call
            // that saw it reaches the server on its second try. Never a timeout (the server
            // may be working on the command, and waiting twice makes an outage slow to
            // detect).
            if !reconnected && is_connection_level(&e) {
                reconnected = true;
                continue;
            }
            if !redetected
                && mode == Some(Mode::Module)
                && self.inner.mode_setting == Mode::Auto
                && is_unknown_command(&e)
            {
                // The module is not (or no longer) there: the fallback answers.
                redetected = true;
                self.inner.resolved.store(2, Ordering::Release);
                continue;
            }
            if mode == Some(Mode::Fallback) && form != Script::Functions {
                match self.script_recovery(form, &e) {
                    Some(ScriptStep::Retry) => continue,
                    Some(ScriptStep::Load) => {
                        self.script_load(keys.first().copied()).await?;
                        continue;
                    }
                    None if is_refused(&e) => return Err(Self::no_scripting(&e)),
                    None => {}
                }
            }
            if !redetected
                && mode == Some(Mode::Fallback)
                && form == Script::Functions
                && is_missing_function(&e)
            {
                redetected = true;
                self.inner.library_ready.store(false, Ordering::Release);
                continue;
            }
            return Err(Error::Redis(e));
        }
        Err(Error::Library(format!(
            "redis-rl: the fallback kept failing on this server ({op:?})"
        )))
    }

    /// Sends the script's text with `SCRIPT LOAD` to the master of `key`'s slot (the one
    /// server), where `EVAL` is refused.
    async fn script_load(&self, key: Option<&str>) -> Result<(), Error> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(script_text());
        match self.raw(&load, key).await {
            Ok(_) => Ok(()),
            Err(e) if is_refused(&e) => Err(Self::no_scripting(&e)),
            Err(e) => Err(Error::Redis(e)),
        }
    }

    /// A one-key call that reports without deciding (refund, release): inside the probe
    /// interval of an outage it does not touch the network, like a check. `Err(cause)`: Redis
    /// is down (`None`: known down, not tried).
    async fn guarded_unless_down(
        &self,
        op: Op,
        key: &str,
        arg: Vec<u8>,
    ) -> Result<Result<Value, Option<RedisError>>, Error> {
        if self.skip() {
            return Ok(Err(None));
        }
        Ok(match self.guarded(op, &[key], &[arg]).await? {
            Outcome::Reply(v, _) => Ok(v),
            Outcome::Down(e) => Err(Some(e)),
        })
    }

    /// [`Limiter::call`], with outages counted and turned into [`Outcome::Down`].
    pub(crate) async fn guarded(
        &self,
        op: Op,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> Result<Outcome, Error> {
        match self.call(op, keys, args).await {
            Ok((v, mode)) => Ok(Outcome::Reply(v, mode)),
            Err(Error::Redis(e)) if is_unavailable(&e) => {
                self.inner.health.failure(&self.inner.counters, &e);
                Ok(Outcome::Down(e))
            }
            Err(e) => Err(e),
        }
    }

    fn observe_rtt(&self, sent: Instant) {
        let rtt = sent.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.inner.rtt_ns.load(Ordering::Relaxed);
        self.inner
            .rtt_ns
            .store((old / 5) * 4 + rtt / 5, Ordering::Relaxed);
    }

    /// The safety gap kept before a window boundary or a GCRA refund deadline.
    fn margin(&self) -> Duration {
        Duration::from_millis(5)
            + Duration::from_nanos(3 * self.inner.rtt_ns.load(Ordering::Relaxed))
    }

    /// The failure policy's answer for one limit; under [`FailurePolicy::Local`] the
    /// in-memory limiter's decision for `cost` units with `opts`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn degraded(
        &self,
        limit: Option<&Limit>,
        key: &str,
        cause: Option<&RedisError>,
        cost: u64,
        opts: LocalOptions,
        token: Option<&[u8]>,
    ) -> Result<Decision, Error> {
        if let (Some(memory), Some(limit)) = (&self.inner.memory, limit) {
            let item = LocalItem {
                key,
                limit,
                cost,
                token,
            };
            let d = memory.decide(&[item], opts)?;
            self.inner.counters.add(Counter::Local, 1);
            self.inner.counters.count_decision(&d);
            return Ok(d);
        }
        let d = self.inner.health.answer(limit, Some(key), cause)?;
        self.inner.counters.count_decision(&d);
        Ok(d)
    }

    pub(crate) fn decided(&self, d: Decision) -> Decision {
        self.inner.health.success();
        self.inner.counters.count_decision(&d);
        d
    }

    /// A reply arrived outside a decision (a renewal): ends an outage, counts nothing.
    pub(crate) fn healthy(&self) {
        self.inner.health.success();
    }

    /// Whether this server's module or library predates `RL.LEASE … RENEW`.
    pub(crate) fn renew_unsupported(&self) -> bool {
        self.inner.renew_plain.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_renew_unsupported(&self) {
        if !self.inner.renew_plain.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "redis_rl_client", "redis-rl: the server predates RL.LEASE … RENEW: leases are renewed without it, so a lapsed lease is granted again instead of being reported lost (upgrade the module or the library)");
        }
    }

    /// Frees, in this process's memory, the lease `token` holds on `full` (a guard taken by
    /// the local failure policy).
    pub(crate) fn release_in_memory(&self, full: &str, token: &[u8]) {
        if let Some(memory) = &self.inner.memory {
            memory.release(full, token);
        }
    }

    pub(crate) fn skip(&self) -> bool {
        self.inner.health.skip()
    }

    fn local_denial(&self, ck: &str, cost: u64) -> Option<Decision> {
        let d = self
            .inner
            .deny_cache
            .as_ref()?
            .lookup(ck, cost, Instant::now())?;
        self.inner.counters.add(Counter::DeniedLocally, 1);
        self.inner.counters.count_decision(&d);
        Some(d)
    }

    fn remember(&self, ck: &str, keys: &[&str], cost: u64, d: &Decision, sent: Instant) {
        if let Some(cache) = &self.inner.deny_cache {
            if !d.allowed {
                cache.store(ck, keys, cost, d, sent);
            }
        }
    }

    /// The deny cache's and the credits' key: the key as sent and the limit (with its name).
    fn cache_key(full: &str, limit: &Limit) -> String {
        let mut ck = String::with_capacity(full.len() + 48);
        ck.push_str(full);
        ck.push('\0');
        limit.write_ident(&mut ck);
        ck
    }

    async fn run_check(&self, c: Check<'_>) -> Result<Decision, Error> {
        let limit = &c.limit;
        if matches!(limit, Limit::Lease(_)) {
            return Err(Error::Usage(
                "a Lease is taken with acquire(), not check()".into(),
            ));
        }
        if c.max_wait.is_some() && !matches!(limit, Limit::Gcra(_)) {
            return Err(Error::Usage(
                "max_wait (MAXWAIT) is offered by GCRA limits only".into(),
            ));
        }
        let full = self.full_key(&c.key)?;
        let op = if matches!(limit, Limit::Gcra(_)) {
            Op::Gcra
        } else {
            Op::Window
        };
        // A request larger than the limit goes to Redis, which answers Never (HTTP 413).
        let plain = !(c.peek || c.force || c.max_wait.is_some())
            && (1..=limit.capacity()).contains(&c.cost);
        let ck = if plain {
            Self::cache_key(&full, limit)
        } else {
            String::new()
        };
        if plain {
            // Units this limiter already paid for in Redis are its to hand out whatever the
            // deny cache says: the credit answers first (a denial one task cached must not
            // strand another's batch).
            let k = self.batch_size(limit, c.cost);
            if k > 0 {
                if let Some(d) = self.take_credit(&ck, limit, &full, c.cost) {
                    return Ok(d);
                }
            }
            if let Some(d) = self.local_denial(&ck, c.cost) {
                return Ok(d);
            }
            if k > 0 {
                return self.check_batched(&ck, &full, limit, c.cost, k).await;
            }
        }
        if self.skip() {
            return self.degraded(Some(limit), &full, None, c.cost, c.local_options(), None);
        }
        let mut args: Vec<Vec<u8>> = limit.args().into_iter().map(bytes).collect();
        if c.cost != 1 {
            args.push(bytes("QUANTITY"));
            args.push(bytes(c.cost.to_string()));
        }
        if c.peek {
            args.push(bytes("PEEK"));
        }
        if let Some(w) = c.max_wait {
            args.push(bytes("MAXWAIT"));
            // The module takes up to u64::MAX ms (past 2^64 ns: any wait); more is the same.
            let ms = u64::try_from(w.as_millis()).unwrap_or(u64::MAX);
            args.push(bytes(ms.to_string()));
        }
        if c.force {
            args.push(bytes("FORCE"));
        }
        let sent = Instant::now();
        let (v, mode) = match self.guarded(op, &[&full], &args).await? {
            Outcome::Down(e) => {
                return self.degraded(
                    Some(limit),
                    &full,
                    Some(&e),
                    c.cost,
                    c.local_options(),
                    None,
                )
            }
            Outcome::Reply(v, mode) => (v, mode),
        };
        let reply = ints::<5>(&v).map_err(Error::Redis)?;
        let d = decision_from_reply(
            reply,
            Some(limit.clone()),
            Some(full.clone()),
            mode.source(),
            c.max_wait.is_some(),
        );
        if plain {
            self.remember(&ck, &[&full], c.cost, &d, sent);
        }
        Ok(self.decided(d))
    }

    // -- batching ---------------------------------------------------------------------------

    /// How many units one batched call takes (0: do not batch).
    fn batch_size(&self, limit: &Limit, cost: u64) -> u64 {
        let (Some(_), Some(batch)) = (&self.inner.credits, self.inner.batch) else {
            return 0;
        };
        if !limit.batchable() {
            return 0;
        }
        let k = batch.min(limit.capacity());
        if cost < k {
            k
        } else {
            0
        }
    }

    fn take_credit(&self, ck: &str, limit: &Limit, full: &str, cost: u64) -> Option<Decision> {
        let c = self
            .inner
            .credits
            .as_ref()?
            .take(ck, cost, Instant::now())?;
        let d = Decision {
            allowed: true,
            limit: limit.capacity(),
            remaining: c.remaining_seen + c.units,
            retry_after: RetryAfter::Wait(Duration::ZERO),
            reset_after: Duration::ZERO,
            degraded: false,
            blind: false,
            source: Source::Local,
            policy: Some(limit.clone()),
            key: Some(full.to_owned()),
            per_key: Vec::new(),
        };
        self.inner.counters.add(Counter::AllowedLocally, 1);
        self.inner.counters.count_decision(&d);
        Some(d)
    }

    /// Stores what a batched call took beyond `cost`; returns the caller's decision and a
    /// replaced credit to refund (if any).
    #[allow(clippy::too_many_arguments)]
    fn keep_credit(
        &self,
        ck: &str,
        limit: &Limit,
        full: &str,
        taken: u64,
        cost: u64,
        d: Decision,
        sent: Instant,
    ) -> (Decision, Option<Credit>) {
        let units = taken.saturating_sub(cost);
        let Some(credits) = &self.inner.credits else {
            return (d, None);
        };
        if units == 0 {
            return (d, None);
        }
        let (use_until, refund_until) = credit_deadlines(
            limit,
            taken,
            sent,
            d.reset_after,
            self.inner.batch_hold,
            self.margin(),
        );
        if use_until <= Instant::now() {
            return (d, None); // too close to a window's end: the units lapse with it
        }
        let old = credits.put(
            ck,
            Credit {
                key: full.to_owned(),
                units,
                use_until,
                refund_until,
                remaining_seen: d.remaining,
            },
            Instant::now(),
        );
        (
            Decision {
                remaining: d.remaining + units,
                policy: Some(limit.clone()),
                key: Some(full.to_owned()),
                ..d
            },
            old,
        )
    }

    /// How many units to ask for: `k`, unless the last reply for this key (plus what GCRA
    /// refilled since) says fewer are there, so that a key running at its limit costs one
    /// call per admission, not two.
    fn first_take(&self, ck: &str, limit: &Limit, cost: u64, k: u64) -> u64 {
        let Some((mut remaining, at)) = lock(&self.inner.hints).get(ck).copied() else {
            return k;
        };
        let elapsed = at.elapsed();
        match limit {
            Limit::Gcra(g) => {
                remaining = remaining.saturating_add(
                    (elapsed.as_nanos() / u128::from(g.interval_ns())).min(u128::from(u64::MAX))
                        as u64,
                );
            }
            _ if elapsed > self.inner.batch_hold => return k,
            _ => {}
        }
        cost.max(k.min(remaining))
    }

    fn note_remaining(&self, ck: &str, remaining: u64) {
        let mut hints = lock(&self.inner.hints);
        if hints.len() > 10_000 {
            hints.clear();
        }
        hints.insert(ck.to_owned(), (remaining, Instant::now()));
    }

    /// From Redis's denial of a batch of `taken` units, its answer for `cost` units without
    /// a second call, where the algorithm allows: GCRA (the wait shrinks by (taken − cost)·T)
    /// and FIXED (the wait is the window's end for any quantity). `None`: ask Redis
    /// (SLIDING, or `cost` might pass now).
    fn denial_for_cost(limit: &Limit, d: &Decision, taken: u64, cost: u64) -> Option<Decision> {
        let RetryAfter::Wait(retry) = d.retry_after else {
            return None;
        };
        if d.allowed || d.remaining >= cost {
            return None;
        }
        let mut retry_us = retry.as_micros() as i128;
        match limit {
            Limit::Gcra(g) => {
                retry_us -= i128::from(taken - cost) * i128::from(g.interval_ns()) / 1000;
                if retry_us <= 1000 {
                    return None;
                }
                retry_us = (retry_us + 999) / 1000 * 1000;
            }
            Limit::Window(w) if w.algorithm() == Algorithm::Fixed => {}
            _ => return None,
        }
        Some(Decision {
            allowed: false,
            limit: d.limit,
            remaining: d.remaining,
            retry_after: RetryAfter::Wait(Duration::from_micros(retry_us as u64)),
            reset_after: d.reset_after,
            degraded: false,
            blind: false,
            source: d.source,
            policy: Some(limit.clone()),
            key: d.key.clone(),
            per_key: Vec::new(),
        })
    }

    async fn check_batched(
        &self,
        ck: &str,
        full: &str,
        limit: &Limit,
        cost: u64,
        k: u64,
    ) -> Result<Decision, Error> {
        if self.skip() {
            return self.degraded(Some(limit), full, None, cost, LocalOptions::default(), None);
        }
        let op = if matches!(limit, Limit::Gcra(_)) {
            Op::Gcra
        } else {
            Op::Window
        };
        let mut want = self.first_take(ck, limit, cost, k);
        let mut last = None;
        for _ in 0..3 {
            let mut args: Vec<Vec<u8>> = limit.args().into_iter().map(bytes).collect();
            if want != 1 {
                args.push(bytes("QUANTITY"));
                args.push(bytes(want.to_string()));
            }
            let sent = Instant::now();
            let (v, mode) = match self.guarded(op, &[full], &args).await? {
                Outcome::Down(e) => {
                    return self.degraded(
                        Some(limit),
                        full,
                        Some(&e),
                        cost,
                        LocalOptions::default(),
                        None,
                    )
                }
                Outcome::Reply(v, mode) => (v, mode),
            };
            let reply = ints::<5>(&v).map_err(Error::Redis)?;
            let mut d = decision_from_reply(
                reply,
                Some(limit.clone()),
                Some(full.to_owned()),
                mode.source(),
                false,
            );
            self.note_remaining(ck, d.remaining);
            if d.allowed {
                let (d, old) = self.keep_credit(ck, limit, full, want, cost, d, sent);
                if let Some(old) = old {
                    lock(&self.inner.pending).push(old);
                }
                self.ensure_sweeper();
                return Ok(self.decided(d));
            }
            self.remember(ck, &[full], want, &d, sent);
            if d.never() || want == cost {
                last = Some(d);
                break;
            }
            if let Some(derived) = Self::denial_for_cost(limit, &d, want, cost) {
                let earlier = sent.checked_sub(Duration::from_millis(1)).unwrap_or(sent);
                self.remember(ck, &[full], cost, &derived, earlier);
                d = derived;
                last = Some(d);
                break;
            }
            want = cost.max((want - 1).min(d.remaining));
            last = Some(d);
        }
        // The loop runs at least once; no panic path even so.
        let d = last.ok_or_else(|| Error::Usage("batching made no call".into()))?;
        Ok(self.decided(d))
    }

    fn ensure_sweeper(&self) {
        if self.inner.credits.is_none() {
            return;
        }
        let mut sweeper = lock(&self.inner.sweeper);
        if sweeper.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let every = self.inner.batch_hold / 2;
        *sweeper = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else {
                    break;
                };
                Limiter { inner }.refund_leftovers(false).await;
            }
        }));
    }

    // -- check_all --------------------------------------------------------------------------

    async fn run_check_all(&self, c: CheckAll<'_>) -> Result<Decision, Error> {
        if c.entries.is_empty() {
            return Err(Error::Usage("check_all needs at least one limit".into()));
        }
        let opts = c.local_options();
        let (cost, peek, force, across) = (c.cost, c.peek, c.force, c.across_slots);
        let mut items = Vec::with_capacity(c.entries.len());
        for e in c.entries {
            let full = self.full_key(&e.key)?;
            let token = match (&e.limit, e.token) {
                (Limit::Lease(_), Some(t)) => {
                    crate::limits::check_token(&t)?;
                    Some(t)
                }
                (Limit::Lease(_), None) => {
                    return Err(Error::Usage(format!(
                        "the Lease for '{}' needs a token (Entry::token)",
                        e.key
                    )))
                }
                (_, _) => None,
            };
            items.push(Item {
                key: full,
                limit: e.limit,
                cost: e.cost,
                token,
            });
        }
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        let plain = !(peek || force)
            && items
                .iter()
                .all(|i| i.cost.unwrap_or(cost) <= i.limit.capacity());
        let ck = if plain {
            let mut ck = String::from("ALL");
            for i in &items {
                ck.push('\0');
                ck.push_str(&Self::cache_key(&i.key, &i.limit));
                ck.push_str(&format!("\0{:?}\0{:?}", i.cost, i.token));
            }
            ck.push_str(&format!("\0{cost}"));
            ck
        } else {
            String::new()
        };
        if plain {
            if let Some(d) = self.local_denial(&ck, cost) {
                return Ok(d);
            }
        }
        if self.skip() {
            return self.degraded_all(&items, None, cost, opts);
        }
        let sent = Instant::now();
        let all: Vec<&Item> = items.iter().collect();
        let d = if across && self.spans_slots(&items) {
            self.check_ordered(&items, cost, peek, force, opts).await?
        } else {
            self.all_once(&all, cost, peek, force, opts).await?
        };
        // A lease's retry_after assumes no holder releases early: it is no lower bound on
        // when Redis admits again, so a denial a full lease took part in is not cached.
        let lease_denied = items
            .iter()
            .zip(&d.per_key)
            .any(|(i, p)| matches!(i.limit, Limit::Lease(_)) && !p.allowed);
        if plain && !lease_denied && !d.degraded {
            self.remember(&ck, &keys, cost, &d, sent);
        }
        Ok(d)
    }

    /// Whether the keys live in more than one Cluster slot (never on one server).
    fn spans_slots(&self, items: &[Item]) -> bool {
        if !matches!(self.inner.conn, Connection::Cluster(_)) {
            return false;
        }
        let first = Slot::for_key(items[0].key.as_bytes());
        items
            .iter()
            .any(|i| Slot::for_key(i.key.as_bytes()) != first)
    }

    /// One `RL.ALL` over `items` (counted, with the failure policy on an outage).
    async fn all_once(
        &self,
        items: &[&Item],
        cost: u64,
        peek: bool,
        force: bool,
        opts: LocalOptions,
    ) -> Result<Decision, Error> {
        let mut args: Vec<Vec<u8>> = Vec::new();
        for it in items {
            args.extend(it.limit.spec().into_iter().map(bytes));
            if let Some(t) = &it.token {
                args.push(t.clone());
            }
            if let Some(own) = it.cost {
                if own != cost {
                    args.push(bytes("COST"));
                    args.push(bytes(own.to_string()));
                }
            }
        }
        if cost != 1 {
            args.push(bytes("QUANTITY"));
            args.push(bytes(cost.to_string()));
        }
        if peek {
            args.push(bytes("PEEK"));
        }
        if force {
            args.push(bytes("FORCE"));
        }
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        let (v, mode) = match self.guarded(Op::All, &keys, &args).await? {
            Outcome::Down(e) => {
                let owned: Vec<Item> = items.iter().map(|i| (*i).clone()).collect();
                return self.degraded_all(&owned, Some(&e), cost, opts);
            }
            Outcome::Reply(v, mode) => (v, mode),
        };
        let (combined, each) = all_reply(&v).map_err(Error::Redis)?;
        let src = mode.source();
        let per_key: Vec<Decision> = items
            .iter()
            .zip(each)
            .map(|(i, r)| {
                decision_from_reply(r, Some(i.limit.clone()), Some(i.key.clone()), src, false)
            })
            .collect();
        let binding = per_key
            .iter()
            .find(|d| d.limit as i64 == combined[1] && d.remaining as i64 == combined[2])
            .and_then(|d| d.policy.clone());
        let mut d = decision_from_reply(combined, binding, None, src, false);
        d.per_key = per_key;
        Ok(self.decided(d))
    }

    /// Keys in several Cluster slots: one `RL.ALL` per slot group, in key order; when a
    /// group denies, what the earlier groups took is refunded (leases released) and the
    /// later groups are only peeked, so a denied request leaves no charge, and its decision
    /// is combined as `RL.ALL` combines.
    async fn check_ordered(
        &self,
        items: &[Item],
        cost: u64,
        peek: bool,
        force: bool,
        opts: LocalOptions,
    ) -> Result<Decision, Error> {
        let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let slot = Slot::for_key(it.key.as_bytes());
            match groups.iter_mut().find(|g| g.0 == slot) {
                Some(g) => g.1.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        let mut per: Vec<Option<Decision>> = vec![None; items.len()];
        let mut denied_at = None;
        for (gi, (_, idx)) in groups.iter().enumerate() {
            let group: Vec<&Item> = idx.iter().map(|&k| &items[k]).collect();
            let d = self.all_once(&group, cost, peek, force, opts).await?;
            let allowed = d.allowed;
            for (&k, sub) in idx.iter().zip(d.per_key) {
                per[k] = Some(sub);
            }
            if !allowed {
                denied_at = Some(gi);
                break;
            }
        }
        if let Some(g) = denied_at {
            if !peek {
                for (_, idx) in &groups[..g] {
                    for &k in idx {
                        self.give_back(&items[k], cost, per[k].as_ref()).await;
                    }
                }
            }
            let peeked = LocalOptions { peek: true, ..opts };
            for (_, idx) in &groups[g + 1..] {
                let group: Vec<&Item> = idx.iter().map(|&k| &items[k]).collect();
                let d = self.all_once(&group, cost, true, false, peeked).await?;
                for (&k, sub) in idx.iter().zip(d.per_key) {
                    per[k] = Some(sub);
                }
            }
        }
        let per: Vec<Decision> = per.into_iter().flatten().collect();
        let charges: Vec<u64> = items.iter().map(|i| i.cost.unwrap_or(cost)).collect();
        Ok(combine_decisions(per, &charges))
    }

    /// Undoes what a group that admitted took for `item` (a denied request elsewhere):
    /// refunds its charge, or releases its lease. Its decision stays what it was, which is
    /// what `RL.ALL` reports for a limit of a denied request (its answer without consuming).
    /// Each give-back goes where the group's decision took it (Redis, or the local policy's
    /// memory), as [`Limiter::refund_decision`] gives back.
    async fn give_back(&self, item: &Item, cost: u64, decision: Option<&Decision>) {
        if let (Limit::Lease(_), Some(token)) = (&item.limit, &item.token) {
            if decision.is_some_and(|d| d.blind) {
                return; // the open policy's lease holds nothing
            }
            if let Some(memory) = decision.and_then(|d| self.memory_of(d)) {
                memory.release(&item.key, token);
            } else if let Err(e) = self.release_full(&item.key, token, false).await {
                tracing::warn!(target: "redis_rl_client", "redis-rl: releasing '{}' after a denial failed: {e}", item.key);
            }
            return;
        }
        let n = item.cost.unwrap_or(cost);
        let Some(decision) = decision else {
            return;
        };
        if n == 0 {
            return; // nothing was charged
        }
        if let Err(e) = self.refund_decision(decision, n).await {
            tracing::warn!(target: "redis_rl_client", "redis-rl: refunding '{}' after a denial failed: {e}", item.key);
        }
    }

    fn degraded_all(
        &self,
        items: &[Item],
        cause: Option<&RedisError>,
        cost: u64,
        opts: LocalOptions,
    ) -> Result<Decision, Error> {
        if let Some(memory) = &self.inner.memory {
            let local: Vec<LocalItem<'_>> = items
                .iter()
                .map(|i| LocalItem {
                    key: &i.key,
                    limit: &i.limit,
                    cost: i.cost.unwrap_or(cost),
                    token: i.token.as_deref(),
                })
                .collect();
            let d = memory.decide(&local, opts)?;
            self.inner.counters.add(Counter::Local, 1);
            self.inner.counters.count_decision(&d);
            return Ok(d);
        }
        let per: Vec<Decision> = items
            .iter()
            .map(|i| {
                self.inner
                    .health
                    .answer(Some(&i.limit), Some(&i.key), cause)
            })
            .collect::<Result<_, _>>()?;
        let first = &per[0];
        let d = Decision {
            allowed: first.allowed,
            limit: per.iter().map(|d| d.limit).min().unwrap_or(0),
            remaining: 0,
            retry_after: first.retry_after,
            reset_after: first.reset_after,
            degraded: true,
            blind: true,
            source: Source::Local,
            policy: None,
            key: None,
            per_key: per.clone(),
        };
        self.inner.counters.count_decision(&d);
        Ok(d)
    }
}

/// A refund the local policy's memory answered, with its figures (as `RL.REFUND` replies).
fn memory_refund(m: crate::memory::MemoryRefund) -> Refund {
    Refund {
        refunded: m.refunded,
        remaining: m.remaining,
        reset_after: m.reset_after,
        degraded: true,
    }
}
