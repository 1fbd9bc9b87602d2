//! Concurrency leases: [`Limiter::acquire`] and the [`LeaseGuard`] it returns.

use std::future::{Future, IntoFuture};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::decision::{decision_from_reply, Decision};
use crate::error::Error;
use crate::limiter::{BoxFuture, Limiter, Outcome, Release};
use crate::limits::{check_token, InvalidLimit, Lease, Limit};
use crate::memory::LocalOptions;
use crate::policy::Counter;
use crate::protocol::{ints, Op};

/// A fresh token: 32 hex digits, unique per process and call (the standard library's
/// randomly keyed hasher over the process id, the time and a counter).
fn new_token() -> Vec<u8> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = String::with_capacity(32);
    for salt in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(salt);
        h.write_u32(std::process::id());
        h.write_u128(nanos);
        h.write_u64(n);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.into_bytes()
}

/// One [`Limiter::acquire`], with its options; `.await` it.
#[must_use = "an acquire does nothing until it is awaited"]
pub struct Acquire<'a> {
    limiter: &'a Limiter,
    key: String,
    lease: Lease,
    token: Option<Vec<u8>>,
    slots: u64,
    on_lost: Option<LostHook>,
}

type LostHook = Arc<dyn Fn(&LeaseLost) + Send + Sync>;

/// Why a lease was lost ([`LeaseLost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// A renewal found that the token no longer held a lease (`LEASELOST`): it lapsed while
    /// no renewal reached Redis, and another holder may have had the slots meanwhile.
    NotHeld,
    /// No renewal reached Redis within the lease time, judged by this process's clock
    /// (a server that predates `RENEW` would grant the lapsed lease again).
    Lapsed,
    /// A renewal was denied: the limit was lowered below what is held.
    Denied,
    /// No renewal reached Redis for a whole lease time (Redis unreachable).
    Unreachable,
}

/// A lease that was lost while held: the work it guarded may have run without its slot.
///
/// Passed to the [`on_lost`](Acquire::on_lost) hook, given by [`LeaseGuard::lost`], and
/// returned by [`LeaseGuard::release`] as [`Error::LeaseLost`].
///
/// ```
/// use redis_rl_client::{Error, LeaseLost, LostReason};
///
/// fn report(result: Result<(), Error>) -> String {
///     match result {
///         Err(Error::LeaseLost(lost)) if lost.reason == LostReason::NotHeld => lost.to_string(),
///         _ => "guarded".into(),
///     }
/// }
/// let lost = LeaseLost { key: "jobs".into(), token: b"t1".to_vec(), reason: LostReason::NotHeld };
/// assert_eq!(
///     report(Err(Error::LeaseLost(lost))),
///     "lease 't1' on key 'jobs' was lost: it lapsed before a renewal reached Redis (LEASELOST)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    /// The key, as sent (with the limiter's prefix).
    pub key: String,
    /// The holder's token.
    pub token: Vec<u8>,
    /// Why.
    pub reason: LostReason,
}

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.reason {
            LostReason::NotHeld => "it lapsed before a renewal reached Redis (LEASELOST)",
            LostReason::Lapsed => "no renewal reached Redis within the lease time",
            LostReason::Denied => "a renewal was denied (the limit is below what is held)",
            LostReason::Unreachable => "no renewal reached Redis for a whole lease time",
        };
        write!(
            f,
            "lease '{}' on key '{}' was lost: {why}",
            String::from_utf8_lossy(&self.token),
            self.key
        )
    }
}

impl std::error::Error for LeaseLost {}

impl Acquire<'_> {
    /// Names the holder (1 to 64 bytes; default: a fresh random token). A retried acquire
    /// with the same token renews instead of taking a second lease.
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.token = Some(token.as_ref().to_vec());
        self
    }

    /// Slots to take (default 1).
    pub fn slots(mut self, n: u64) -> Self {
        self.slots = n;
        self
    }

    /// Called once, from the renewal task, when the lease is found lost (see
    /// [`LeaseGuard::is_lost`]); e.g. to cancel the work it guards. It must be cheap and
    /// must not panic.
    pub fn on_lost(mut self, hook: impl Fn(&LeaseLost) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(hook));
        self
    }
}

impl<'a> IntoFuture for Acquire<'a> {
    type Output = Result<LeaseGuard, Error>;
    type IntoFuture = BoxFuture<'a, Result<LeaseGuard, Error>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            if self.slots == 0 {
                return Err(InvalidLimit::new("QUANTITY must be a positive integer").into());
            }
            let generated = self.token.is_none();
            let token = self.token.unwrap_or_else(new_token);
            check_token(&token)?;
            let full = self.limiter.full_key(&self.key)?;
            let d = if generated {
                detached_lease_call(self.limiter, &full, &self.lease, &token, self.slots).await?
            } else {
                // A token the caller chose is the caller's to release if this future is
                // dropped: it may already hold a lease that this call only renews.
                self.limiter
                    .lease_call(&full, &self.lease, &token, self.slots)
                    .await?
            };
            if !d.allowed {
                return Err(Error::RateLimited(Box::new(d)));
            }
            let (lost_tx, _) = watch::channel(None);
            Ok(LeaseGuard::start(GuardState {
                limiter: self.limiter.clone(),
                key: full,
                lease: self.lease,
                token,
                slots: self.slots,
                decision: d,
                lost: lost_tx,
                on_lost: self.on_lost,
                released: AtomicBool::new(false),
                last_renewed: Mutex::new(Instant::now()),
            }))
        })
    }
}

impl Limiter {
    /// Takes slots of the concurrency limit `lease` on `key` (`RL.LEASE`). `.await` the
    /// [`Acquire`] (options `.token(t)`, `.slots(n)`) for a [`LeaseGuard`], which renews the
    /// lease in the background while held and releases it when dropped or on
    /// [`LeaseGuard::release`]. Fails with [`Error::RateLimited`] when no slot is free (its
    /// decision says when one may be).
    ///
    /// ```no_run
    /// # async fn demo(limiter: redis_rl_client::Limiter) -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_rl_client::{Error, Lease};
    ///
    /// let exports = Lease::new(2, 30)?; // two at once; a crashed holder frees its slot in 30 s
    /// match limiter.acquire("exports", &exports).await {
    ///     Ok(guard) => {
    ///         // … long work: the guard renews every 10 s …
    ///         guard.release().await?; // or just drop it
    ///     }
    ///     Err(Error::RateLimited(d)) => println!("busy, retry in {:?}", d.retry_after),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, key: impl Into<String>, lease: &Lease) -> Acquire<'_> {
        Acquire {
            limiter: self,
            key: key.into(),
            lease: lease.clone(),
            token: None,
            slots: 1,
            on_lost: None,
        }
    }

    pub(crate) async fn lease_call(
        &self,
        full: &str,
        lease: &Lease,
        token: &[u8],
        slots: u64,
    ) -> Result<Decision, Error> {
        let limit = Limit::Lease(lease.clone());
        let mut args: Vec<Vec<u8>> = limit.args().into_iter().map(String::into_bytes).collect();
        args.push(token.to_vec());
        if slots != 1 {
            args.push(b"QUANTITY".to_vec());
            args.push(slots.to_string().into_bytes());
        }
        if self.skip() {
            return self.degraded(
                Some(&limit),
                full,
                None,
                slots,
                LocalOptions::default(),
                Some(token),
            );
        }
        match self.guarded(Op::Lease, &[full], &args).await? {
            Outcome::Down(e) => self.degraded(
                Some(&limit),
                full,
                Some(&e),
                slots,
                LocalOptions::default(),
                Some(token),
            ),
            Outcome::Reply(v, mode) => {
                let reply = ints::<5>(&v).map_err(Error::Redis)?;
                Ok(self.decided(decision_from_reply(
                    reply,
                    Some(limit),
                    Some(full.to_owned()),
                    mode.source(),
                    false,
                )))
            }
        }
    }
}

/// [`Limiter::lease_call`] under a token this crate generated, run as its own task: when the
/// [`Acquire`] future is dropped while `RL.LEASE` is in flight (a timeout around it, a
/// cancelled request), the call goes on, and a slot it still grants is released as soon as
/// its reply arrives (nobody else has the token, so the slot would otherwise stay held until
/// the lease ran out). Outside a tokio runtime the call runs inline.
async fn detached_lease_call(
    limiter: &Limiter,
    full: &str,
    lease: &Lease,
    token: &[u8],
    slots: u64,
) -> Result<Decision, Error> {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return limiter.lease_call(full, lease, token, slots).await;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (limiter, full, lease, token) = (
        limiter.clone(),
        full.to_owned(),
        lease.clone(),
        token.to_vec(),
    );
    rt.spawn(async move {
        let got = limiter.lease_call(&full, &lease, &token, slots).await;
        if let Err(Ok(d)) = tx.send(got) {
            // Nobody awaits the acquire any more: give back what it took (a failed release
            // only under-admits: the slot lapses with its lease).
            if d.allowed && !d.degraded {
                let _ = limiter.release_full(&full, &token, false).await;
            } else if d.allowed && !d.blind {
                limiter.release_in_memory(&full, &token);
            }
        }
    });
    rx.await.unwrap_or_else(|_| {
        Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Io,
            "the lease call's task ended without a reply",
        ))))
    })
}

/// A renewal's outcome.
enum Renewal {
    Renewed(Decision),
    Denied(Decision),
    NotHeld,
    Down(redis::RedisError),
    /// The server predates `RENEW`: ask again (now without it).
    Unsupported,
}

impl Limiter {
    /// One renewal (`RL.LEASE … RENEW`): outside the failure policy (an outage is
    /// [`Renewal::Down`], not an admission), counted as a Redis call. A server whose
    /// module or library predates `RENEW` gets a plain renewal (with one warning).
    async fn renew_call(
        &self,
        full: &str,
        lease: &Lease,
        token: &[u8],
        slots: u64,
    ) -> Result<Renewal, Error> {
        let limit = Limit::Lease(lease.clone());
        let mut args: Vec<Vec<u8>> = limit.args().into_iter().map(String::into_bytes).collect();
        args.push(token.to_vec());
        if slots != 1 {
            args.push(b"QUANTITY".to_vec());
            args.push(slots.to_string().into_bytes());
        }
        let plain = self.renew_unsupported();
        if !plain {
            args.push(b"RENEW".to_vec());
        }
        let reply = match self.guarded(Op::Lease, &[full], &args).await {
            Ok(Outcome::Down(e)) => return Ok(Renewal::Down(e)),
            Ok(Outcome::Reply(v, mode)) => (v, mode),
            Err(Error::Redis(e)) if e.code() == Some("LEASELOST") => {
                self.healthy();
                return Ok(Renewal::NotHeld);
            }
            Err(Error::Redis(e))
                if !plain && e.to_string().contains("unknown argument 'RENEW'") =>
            {
                self.mark_renew_unsupported();
                return Ok(Renewal::Unsupported);
            }
            Err(e) => return Err(e),
        };
        self.healthy();
        let (v, mode) = reply;
        let d = decision_from_reply(
            ints::<5>(&v).map_err(Error::Redis)?,
            Some(limit),
            Some(full.to_owned()),
            mode.source(),
            false,
        );
        Ok(if d.allowed {
            Renewal::Renewed(d)
        } else {
            Renewal::Denied(d)
        })
    }
}

struct GuardState {
    limiter: Limiter,
    key: String,
    lease: Lease,
    token: Vec<u8>,
    slots: u64,
    decision: Decision,
    lost: watch::Sender<Option<LeaseLost>>,
    on_lost: Option<LostHook>,
    released: AtomicBool,
    last_renewed: Mutex<Instant>,
}

impl GuardState {
    fn lost_lease(&self) -> Option<LeaseLost> {
        self.lost.borrow().clone()
    }

    /// Marks the lease lost (once): the flag, the counter, one warning, the hook, the
    /// `lost()` futures.
    fn mark_lost(&self, reason: LostReason) {
        let lost = LeaseLost {
            key: self.key.clone(),
            token: self.token.clone(),
            reason,
        };
        let first = self.lost.send_if_modified(|v| {
            if v.is_some() {
                return false;
            }
            *v = Some(lost.clone());
            true
        });
        if !first {
            return;
        }
        self.limiter.counters().add(Counter::LeasesLost, 1);
        tracing::warn!(target: "redis_rl_client", key = %self.key, "redis-rl: {lost}");
        if let Some(hook) = &self.on_lost {
            hook(&lost);
        }
    }

    async fn renew(&self) -> Result<Decision, Error> {
        if let Some(lost) = self.lost_lease() {
            return Err(Error::LeaseLost(lost));
        }
        let last = *self.last_renewed.lock().unwrap_or_else(|e| e.into_inner());
        let mut outcome = Renewal::Unsupported;
        for _ in 0..2 {
            if self.limiter.renew_unsupported() && last.elapsed() > self.lease.lease() {
                // Without RENEW the server would grant a lapsed lease again as a fresh one:
                // judge by this clock instead (the last renewal's reply came after Redis
                // extended the lease, so the lease has certainly ended by now).
                return Err(self.lost_error(LostReason::Lapsed));
            }
            outcome = self
                .limiter
                .renew_call(&self.key, &self.lease, &self.token, self.slots)
                .await?;
            if !matches!(outcome, Renewal::Unsupported) {
                break;
            }
        }
        match outcome {
            Renewal::Renewed(d) => {
                *self.last_renewed.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                Ok(d)
            }
            Renewal::Denied(d) => {
                self.mark_lost(LostReason::Denied);
                Ok(d)
            }
            Renewal::NotHeld | Renewal::Unsupported => Err(self.lost_error(LostReason::NotHeld)),
            Renewal::Down(e) => {
                // The lease is lost once a whole lease time has passed without a renewal.
                if last.elapsed() > self.lease.lease() {
                    self.mark_lost(LostReason::Unreachable);
                }
                Err(Error::Unavailable(e))
            }
        }
    }

    fn lost_error(&self, reason: LostReason) -> Error {
        self.mark_lost(reason);
        Error::LeaseLost(self.lost_lease().unwrap_or(LeaseLost {
            key: self.key.clone(),
            token: self.token.clone(),
            reason,
        }))
    }
}

/// A lease taken by [`Limiter::acquire`]: renewed in the background while held (every third
/// of the lease time, with `RL.LEASE … RENEW`), released on drop or on
/// [`LeaseGuard::release`].
///
/// A lease is **lost** when a renewal finds that the token no longer holds it (`LEASELOST`:
/// it lapsed, e.g. while this process was stalled, and another holder may have had the slots
/// meanwhile), when a renewal is denied (the limit was lowered), or when no renewal reached
/// Redis for a whole lease time. Then [`is_lost`](LeaseGuard::is_lost) is true, the
/// [`on_lost`](Acquire::on_lost) hook is called and [`lost`](LeaseGuard::lost) resolves,
/// `leases_lost` is counted, renewals stop, and [`release`](LeaseGuard::release) returns
/// [`Error::LeaseLost`]: work that ran without its slot is never reported as guarded.
///
/// A degraded guard (Redis down under the open policy) holds nothing in Redis; under the
/// local policy it holds a slot of the in-memory limiter. Dropping a guard outside a Tokio
/// runtime cannot release it; the lease then ends by itself, as it does when Redis cannot be
/// reached at the drop.
///
/// ```no_run
/// # async fn demo(limiter: redis_rl_client::Limiter) -> Result<(), redis_rl_client::Error> {
/// use redis_rl_client::{Error, Lease};
///
/// let exports = Lease::new(2, 30)?; // two per customer at once
/// let guard = limiter
///     .acquire("exports:acme", &exports)
///     .on_lost(|lost| eprintln!("{lost}"))
///     .await?;
/// tokio::select! {
///     _ = run_export() => {}                  // the guard renews every 10 s meanwhile
///     lost = guard.lost() => eprintln!("stopped: {lost}"),
/// }
/// match guard.release().await {
///     Ok(_) => {}                                 // the work was guarded all along
///     Err(Error::LeaseLost(lost)) => eprintln!("ran without its slot: {lost}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// # async fn run_export() {}
/// ```
pub struct LeaseGuard {
    state: Arc<GuardState>,
    renewer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.state.key)
            .field("token", &String::from_utf8_lossy(&self.state.token))
            .field("slots", &self.state.slots)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LeaseGuard {
    fn start(state: GuardState) -> LeaseGuard {
        let state = Arc::new(state);
        let renewer = (!state.decision.degraded).then(|| {
            let s = Arc::clone(&state);
            let every = (s.lease.lease() / 3).max(Duration::from_millis(1));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let _ = s.renew().await;
                    if s.lost_lease().is_some() {
                        break;
                    }
                }
            })
        });
        LeaseGuard { state, renewer }
    }

    /// The acquire's decision (`remaining` slots, `reset_after`, `degraded`).
    pub fn decision(&self) -> &Decision {
        &self.state.decision
    }

    /// The key, as sent (with the limiter's prefix).
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The holder's token.
    pub fn token(&self) -> &[u8] {
        &self.state.token
    }

    /// Slots held.
    pub fn slots(&self) -> u64 {
        self.state.slots
    }

    /// True once the lease is lost (see [`LeaseGuard`]): the slots may be someone else's
    /// now.
    pub fn is_lost(&self) -> bool {
        self.state.lost.borrow().is_some()
    }

    /// Resolves when the lease is found lost (at once if it already is), with why; never
    /// while it is held. For `tokio::select!` against the work it guards. The future owns
    /// what it needs (`'static`).
    pub fn lost(&self) -> impl Future<Output = LeaseLost> + Send + 'static {
        let mut rx = self.state.lost.subscribe();
        async move {
            let got = match rx.wait_for(Option::is_some).await {
                Ok(v) => (*v).clone(),
                Err(_) => None,
            };
            match got {
                Some(lost) => lost,
                None => std::future::pending().await,
            }
        }
    }

    /// Extends the lease to a full lease time from now with `RL.LEASE … RENEW` (the
    /// background task does this). Errors: [`Error::LeaseLost`] when the token no longer
    /// holds it (the guard is then lost), [`Error::Unavailable`] when Redis does not answer.
    pub async fn renew(&self) -> Result<Decision, Error> {
        self.state.renew().await
    }

    /// Frees the slots now. `Ok(None)` for a degraded guard (it held nothing in Redis).
    /// Errors: [`Error::LeaseLost`] when the lease was lost while held (nothing is sent: the
    /// token holds nothing), or the release's own error.
    pub async fn release(mut self) -> Result<Option<Release>, Error> {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
        if self.state.released.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        if let Some(lost) = self.state.lost_lease() {
            return Err(Error::LeaseLost(lost));
        }
        if self.state.decision.degraded {
            if !self.state.decision.blind {
                self.state
                    .limiter
                    .release_in_memory(&self.state.key, &self.state.token);
            }
            return Ok(None);
        }
        self.state
            .limiter
            .release_full(&self.state.key, &self.state.token, false)
            .await
            .map(Some)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
        if self.state.released.swap(true, Ordering::AcqRel) || self.state.lost_lease().is_some() {
            return;
        }
        if self.state.decision.degraded {
            if !self.state.decision.blind {
                self.state
                    .limiter
                    .release_in_memory(&self.state.key, &self.state.token);
            }
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let state = Arc::clone(&self.state);
            rt.spawn(async move {
                let _ = state
                    .limiter
                    .release_full(&state.key, &state.token, false)
                    .await;
            });
        }
    }
}
