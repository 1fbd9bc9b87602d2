//! The one place that reads a clock.

use redis_module::raw;

use crate::time::{Instant, NANOS_PER_MICRO};

/// Returns the server's time for this command, at microsecond resolution:
/// `RedisModule_CachedMicroseconds` (the command's cached time, Redis 7.2+ and Valkey) when
/// the server exports it, else `clock_gettime(CLOCK_REALTIME)` truncated to microseconds
/// (Redis 7.0 gives modules only millisecond wall-clock time). Call it once per command. A
/// clock before the epoch reads as the epoch.
#[inline(always)]
pub fn now() -> Instant {
    // SAFETY: the API table is filled at load and never changed; the function takes no
    // arguments and only reads the server's cached time.
    let cached = unsafe { raw::RedisModule_CachedMicroseconds.map(|f| f()) };
    if let Some(micros) = cached {
        let micros = u64::try_from(micros).unwrap_or(0);
        return Instant::from_ns(micros.saturating_mul(NANOS_PER_MICRO));
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME always exists on Linux.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 {
        return Instant::EPOCH;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec).unwrap_or(0) / NANOS_PER_MICRO;
    Instant::from_ns(
        secs.saturating_mul(1_000_000)
            .saturating_add(micros)
            .saturating_mul(NANOS_PER_MICRO),
    )
}
