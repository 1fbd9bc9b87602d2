//! Concurrency leases: [`Limiter::acquire`] and the [`LeaseGuard`] it returns.

use std::future::IntoFuture;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;

use crate::decision::{decision_from_reply, Decision};
use crate::error::Error;
use crate::limiter::{BoxFuture, Limiter, Outcome, Release};
use crate::limits::{check_token, InvalidLimit, Lease, Limit};
use crate::memory::LocalOptions;
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
}

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
}

impl<'a> IntoFuture for Acquire<'a> {
    type Output = Result<LeaseGuard, Error>;
    type IntoFuture = BoxFuture<'a, Result<LeaseGuard, Error>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            if self.slots == 0 {
                return Err(InvalidLimit::new("QUANTITY must be a positive integer").into());
            }
            let token = self.token.unwrap_or_else(new_token);
            check_token(&token)?;
            let full = self.limiter.full_key(&self.key)?;
            let d = self
                .limiter
                .lease_call(&full, &self.lease, &token, self.slots)
                .await?;
            if !d.allowed {
                return Err(Error::RateLimited(Box::new(d)));
            }
            Ok(LeaseGuard::start(GuardState {
                limiter: self.limiter.clone(),
                key: full,
                lease: self.lease,
                token,
                slots: self.slots,
                decision: d,
                lost: AtomicBool::new(false),
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

struct GuardState {
    limiter: Limiter,
    key: String,
    lease: Lease,
    token: Vec<u8>,
    slots: u64,
    decision: Decision,
    lost: AtomicBool,
    released: AtomicBool,
    last_renewed: Mutex<Instant>,
}

impl GuardState {
    async fn renew(&self) -> Result<Decision, Error> {
        let r = self
            .limiter
            .lease_call(&self.key, &self.lease, &self.token, self.slots)
            .await;
        let last = *self.last_renewed.lock().unwrap_or_else(|e| e.into_inner());
        match &r {
            Ok(d) if d.allowed && !d.degraded => {
                *self.last_renewed.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            }
            Ok(d) if !d.degraded => {
                self.lost.store(true, Ordering::Relaxed);
                tracing::warn!(target: "redis_rl_client", key = %self.key, "redis-rl: lease on '{}' could not be renewed", self.key);
            }
            _ => {
                // Redis did not answer: the lease is lost once a whole lease time has passed.
                if last.elapsed() > self.lease.lease() {
                    self.lost.store(true, Ordering::Relaxed);
                }
            }
        }
        r
    }
}

/// A lease taken by [`Limiter::acquire`]: renewed in the background while held (every third
/// of the lease time), released on drop or on [`LeaseGuard::release`].
///
/// A degraded guard (failure policy "open" while Redis was down) holds nothing in Redis.
/// Dropping a guard outside a Tokio runtime cannot release it; the lease then ends by itself,
/// as it does when Redis cannot be reached at the drop.
///
/// ```no_run
/// # async fn demo(limiter: redis_rl_client::Limiter) -> Result<(), redis_rl_client::Error> {
/// use redis_rl_client::Lease;
///
/// let exports = Lease::new(2, 30)?; // two per customer at once
/// {
///     let guard = limiter.acquire("exports:acme", &exports).await?;
///     // … the export; the guard renews the lease every 10 s …
///     if guard.is_lost() {
///         // a renewal was refused, or Redis was out of reach for 30 s: stop the work
///     }
/// } // dropped: released in the background
/// # Ok(()) }
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

    /// True once a renewal was denied (the limit was lowered below what is held) or Redis
    /// could not be reached for a whole lease time: the slots may be someone else's now.
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::Relaxed)
    }

    /// Extends the lease to a full lease time from now (the background task does this).
    pub async fn renew(&self) -> Result<Decision, Error> {
        self.state.renew().await
    }

    /// Frees the slots now. `Ok(None)` for a degraded guard (it held nothing).
    pub async fn release(mut self) -> Result<Option<Release>, Error> {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
        if self.state.released.swap(true, Ordering::AcqRel) || self.state.decision.degraded {
            return Ok(None);
        }
        self.state
            .limiter
            .release_full(&self.state.key, &self.state.token)
            .await
            .map(Some)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
        if self.state.released.swap(true, Ordering::AcqRel) || self.state.decision.degraded {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let state = Arc::clone(&self.state);
            rt.spawn(async move {
                let _ = state.limiter.release_full(&state.key, &state.token).await;
            });
        }
    }
}
