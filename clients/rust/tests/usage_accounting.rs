//! Leases (acquire with a guard that renews in the background and releases on drop or on
//! `release().await`), FORCE and per-limit COST, per docs/reference.md "Usage accounting", against a
//! real server in both modes.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::future::IntoFuture;
use std::time::Duration;

use redis_rl_client::{Algorithm, Entry, Error, Gcra, Lease, RetryAfter, Window};
use support::{limiter, limiter_with, signal, Kind};

both_modes!(
    acquire_holds_a_slot_and_releases_it,
    acquire_renews_in_the_background,
    dropping_the_guard_releases_it,
    a_crashed_holder_frees_its_slot_when_the_lease_ends,
    acquire_with_the_same_token_renews_instead_of_taking_twice,
    force_records_usage_past_the_limit,
    force_on_log_is_an_error,
    check_all_with_per_limit_costs,
    check_all_with_a_lease_spec,
    a_released_slot_is_not_denied_locally,
    check_all_force,
    a_lapsed_lease_is_reported_lost,
    an_acquire_dropped_in_flight_releases_the_slot_it_took,
    an_acquire_dropped_in_flight_leaves_a_callers_token_to_the_caller,
);

fn rate_limited(r: Result<redis_rl_client::LeaseGuard, Error>) -> Box<redis_rl_client::Decision> {
    match r {
        Err(Error::RateLimited(d)) => d,
        other => panic!("expected RateLimited, got {other:?}"),
    }
}

async fn acquire_holds_a_slot_and_releases_it(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let lease = Lease::new(2, 10).unwrap();
    let a = lim.acquire("jobs", &lease).await.unwrap();
    assert!(a.decision().allowed && a.decision().remaining == 1);
    let b = lim.acquire("jobs", &lease).await.unwrap();
    assert_eq!(b.decision().remaining, 0);
    let d = rate_limited(lim.acquire("jobs", &lease).await);
    assert!(!d.allowed && !d.never());
    let wait = d.retry_after.duration().unwrap().as_millis();
    assert!((9_000..=10_000).contains(&wait), "{wait}");
    let released = b.release().await.unwrap().unwrap();
    assert_eq!(released.released, 1);
    a.release().await.unwrap();
    let both = lim.acquire("jobs", &lease).slots(2).await.unwrap();
    assert_eq!(both.decision().remaining, 0);
    both.release().await.unwrap();
}

async fn acquire_renews_in_the_background(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    // A lease time long enough that a loaded machine still renews in time (every 0.5 s).
    let lease = Lease::new(1, "1.5").unwrap();
    let held = lim.acquire("long", &lease).await.unwrap();
    tokio::time::sleep(Duration::from_millis(4500)).await; // three lease times: held only through renewals
    rate_limited(lim.acquire("long", &lease).await);
    assert!(!held.is_lost());
    held.release().await.unwrap();
    lim.acquire("long", &lease)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

async fn dropping_the_guard_releases_it(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let lease = Lease::new(1, 30).unwrap();
    {
        let _held = lim.acquire("drop", &lease).await.unwrap();
        rate_limited(lim.acquire("drop", &lease).await);
    }
    // The release runs on the runtime right after the drop.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match lim.acquire("drop", &lease).await {
            Ok(g) => {
                g.release().await.unwrap();
                break;
            }
            Err(Error::RateLimited(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the dropped guard was not released: {e}"),
        }
    }
}

async fn a_crashed_holder_frees_its_slot_when_the_lease_ends(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let key = format!("{}crash", lim.prefix());
    assert_eq!(lim.resolved_mode().await.unwrap(), kind.expected()); // loads the fallback
    let mut con = server.conn();
    // A holder that took a lease and died (no renewal, no release).
    let _: Vec<i64> = kind
        .command("lease", &key)
        .arg(1)
        .arg("0.2")
        .arg("dead-process")
        .query(&mut con)
        .unwrap();
    let lease = Lease::new(1, "0.2").unwrap();
    rate_limited(lim.acquire("crash", &lease).await);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let held = lim.acquire("crash", &lease).await.unwrap();
    assert!(held.decision().allowed);
    held.release().await.unwrap();
}

async fn acquire_with_the_same_token_renews_instead_of_taking_twice(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let lease = Lease::new(2, 10).unwrap();
    let a = lim.acquire("tok", &lease).token("job-7").await.unwrap();
    let again = lim.acquire("tok", &lease).token("job-7").await.unwrap();
    assert_eq!(again.decision().remaining, 1, "still one lease of one slot");
    assert_eq!(a.token(), b"job-7");
    assert_eq!(again.release().await.unwrap().unwrap().released, 1);
    assert_eq!(
        a.release().await.unwrap().unwrap().released,
        0,
        "harmless twice"
    );
    assert_eq!(lim.release("tok", "job-7").await.unwrap().released, 0);
}

async fn force_records_usage_past_the_limit(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let g = Gcra::new(5, 1, 1).unwrap();
    let d = lim.force("f", &g, 8).await.unwrap();
    assert!(d.allowed && d.remaining == 0);
    assert_eq!(d.retry_after, RetryAfter::Wait(Duration::ZERO));
    assert!(
        !lim.check("f", &g).await.unwrap().allowed,
        "until the excess has drained"
    );
    let w = Window::new(10, 60, Algorithm::Fixed).unwrap();
    let d = lim.check("fw", &w).cost(25).force().await.unwrap();
    assert!(d.allowed && d.remaining == 0);
}

async fn force_on_log_is_an_error(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let r = lim
        .force("fl", Window::new(10, 60, Algorithm::Log).unwrap(), 1)
        .await;
    assert!(matches!(r, Err(Error::Redis(_))), "{r:?}");
}

async fn check_all_with_per_limit_costs(kind: Kind) {
    // One request and 1,200 tokens: requests per minute and tokens per minute together.
    let server = kind.server();
    let lim = limiter(&server).await;
    let rpm = Window::new(600, 60, Algorithm::Fixed)
        .unwrap()
        .named("rpm")
        .unwrap();
    let tpm = Window::new(2000, 60, Algorithm::Fixed)
        .unwrap()
        .named("tpm")
        .unwrap();
    let call = |tokens: u64| {
        lim.check_all([
            Entry::new("{t}:rpm", &rpm),
            Entry::new("{t}:tpm", &tpm).cost(tokens),
        ])
    };
    let d = call(1200).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.per_key[0].remaining, 599);
    assert_eq!(d.per_key[1].remaining, 800);
    // The binding limit is tokens: 800 left admit no further call of 1,200.
    assert_eq!(d.policy, Some(tpm.clone().into()));
    assert_eq!(d.remaining, 800);
    assert!(!call(1200).await.unwrap().allowed);
    assert!(call(0).await.unwrap().allowed, "a cost of 0 only reports");
}

async fn check_all_with_a_lease_spec(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let rate = Gcra::new(10, 1, 1).unwrap();
    let slots = Lease::new(1, 10).unwrap();
    let d = lim
        .check_all([
            Entry::new("{j}:rate", &rate),
            Entry::new("{j}:slots", &slots).token("w1"),
        ])
        .await
        .unwrap();
    assert!(d.allowed);
    let d2 = lim
        .check_all([
            Entry::new("{j}:rate", &rate),
            Entry::new("{j}:slots", &slots).token("w2"),
        ])
        .await
        .unwrap();
    assert!(!d2.allowed);
    // Nothing was taken from the rate limit by the denied call.
    assert_eq!(
        lim.check("{j}:rate", &rate)
            .cost(0)
            .await
            .unwrap()
            .remaining,
        9
    );
    assert_eq!(lim.release("{j}:slots", "w1").await.unwrap().released, 1);
}

/// A lease's `retry_after` assumes nobody releases early, so it is no bound on when Redis
/// admits again: a denial by a full lease must not be repeated by the deny cache after the
/// holder (here another process) released its slot.
async fn a_released_slot_is_not_denied_locally(kind: Kind) {
    let server = kind.server();
    let a = limiter(&server).await;
    let b = redis_rl_client::Limiter::builder(support::url(&server))
        .prefix(a.prefix())
        .build()
        .await
        .unwrap();
    let rate = Gcra::new(100, 100, 1).unwrap();
    let slots = Lease::new(1, 30).unwrap();
    let job = |token: &str| {
        [
            Entry::new("{j}:rate", &rate),
            Entry::new("{j}:slots", &slots).token(token),
        ]
    };
    assert!(a.check_all(job("a")).await.unwrap().allowed);
    let denied = b.check_all(job("b")).await.unwrap();
    assert!(!denied.allowed);
    assert!(denied.retry_after.duration().unwrap() > Duration::from_secs(20));
    assert_eq!(a.release("{j}:slots", "a").await.unwrap().released, 1);
    let d = b.check_all(job("b")).await.unwrap();
    assert!(d.allowed, "the slot is free in Redis: {d:?}");
    assert_ne!(d.source, redis_rl_client::Source::Local);
    assert_eq!(b.release("{j}:slots", "b").await.unwrap().released, 1);
}

async fn check_all_force(kind: Kind) {
    let server = kind.server();
    let lim = limiter(&server).await;
    let a = Gcra::new(2, 1, 60).unwrap();
    let b = Window::new(2, 60, Algorithm::Fixed).unwrap();
    let d = lim
        .check_all([Entry::new("{u}:a", &a), Entry::new("{u}:b", &b)])
        .cost(5)
        .force()
        .await
        .unwrap();
    assert!(d.allowed && d.remaining == 0);
    let after = lim
        .check_all([Entry::new("{u}:a", &a), Entry::new("{u}:b", &b)])
        .await
        .unwrap();
    assert!(!after.allowed);
}

/// Issue 23, 3 (docs/clients.md#leases-that-know-they-are-lost): `Lease(1, 0.3 s)`; holder
/// A's runtime is blocked, so its renewal task cannot run (a stalled event loop); B acquires
/// once A's lease has lapsed, and releases; when A's runtime runs again its overdue
/// renewal (`RENEW`) finds the lease gone: A is lost (flag, hook, `lost()`, counter), and
/// `release()` says so instead of reporting the work as guarded. Before, the late renewal
/// was granted as a fresh acquire and A never knew.
async fn a_lapsed_lease_is_reported_lost(kind: Kind) {
    use std::sync::{mpsc, Arc, Mutex};

    use redis_rl_client::{Limiter, LostReason};

    let server = kind.server();
    let url = support::url(&server);
    let prefix = support::prefix();
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (url_a, prefix_a) = (url.clone(), prefix.clone());
    let a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let lim = Limiter::builder(url_a)
                .prefix(prefix_a)
                .build()
                .await
                .unwrap();
            let hooked = Arc::new(Mutex::new(Vec::new()));
            let seen = Arc::clone(&hooked);
            let guard = lim
                .acquire("job", &Lease::new(1, "0.3").unwrap())
                .on_lost(move |lost| seen.lock().unwrap().push(lost.clone()))
                .await
                .unwrap();
            assert!(!guard.is_lost());
            held_tx.send(()).unwrap();
            // Blocks this thread, and with it the whole runtime: the renewal task cannot run.
            go_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("B did not finish");
            // The runtime runs again: the overdue renewal reaches Redis and finds no lease.
            let lost = tokio::time::timeout(Duration::from_secs(30), guard.lost())
                .await
                .expect("the lease was not reported lost");
            assert_eq!(lost.reason, LostReason::NotHeld);
            assert!(guard.is_lost());
            assert_eq!(
                hooked.lock().unwrap().as_slice(),
                std::slice::from_ref(&lost)
            );
            assert_eq!(lim.counters().snapshot().leases_lost, 1);
            match guard.release().await {
                Err(Error::LeaseLost(l)) => {
                    assert_eq!(l, lost);
                    assert!(l.to_string().contains("was lost"), "{l}");
                }
                other => panic!("release must report the loss, got {other:?}"),
            }
        });
    });
    held_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("A did not acquire");
    let b = Limiter::builder(url).prefix(prefix).build().await.unwrap();
    let lease = Lease::new(1, "0.3").unwrap();
    // B gets the slot once A's lease lapses (A cannot renew while blocked).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let guard = loop {
        match b.acquire("job", &lease).await {
            Ok(g) => break g,
            Err(Error::RateLimited(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("B could not acquire: {e:?}"),
        }
    };
    guard.release().await.unwrap();
    go_tx.send(()).unwrap();
    a.join().expect("holder A's checks failed");
}

/// Drops `lim.acquire(key)` (a timeout around it) while the server is paused with the call
/// sent, then lets the server go on: the call is answered after its future is gone.
async fn drop_in_flight(
    server: &common::Server,
    lim: &redis_rl_client::Limiter,
    key: &str,
    token: Option<&str>,
) {
    let lease = Lease::new(1, 3600).unwrap();
    signal(server, "-STOP");
    let acquire = match token {
        Some(t) => lim.acquire(key, &lease).token(t),
        None => lim.acquire(key, &lease),
    };
    let abandoned = tokio::time::timeout(Duration::from_millis(300), acquire.into_future()).await;
    signal(server, "-CONT");
    assert!(
        abandoned.is_err(),
        "the acquire finished while the server was paused: {abandoned:?}"
    );
}

async fn an_acquire_dropped_in_flight_releases_the_slot_it_took(kind: Kind) {
    let server = kind.server();
    // The client's own timeout far beyond the pause: the call is answered, not timed out.
    let lim = limiter_with(&server, |b| b.timeout(Duration::from_secs(10))).await;
    let lease = Lease::new(1, 3600).unwrap(); // held for the whole test unless released
    lim.acquire("warm", &lease)
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // mode detected
    drop_in_flight(&server, &lim, "job", None).await;
    // The slot comes free as soon as the reply arrives (in the background).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match lim.acquire("job", &lease).await {
            Ok(g) => {
                g.release().await.unwrap();
                break;
            }
            Err(Error::RateLimited(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the dropped acquire's slot is still held: {e}"),
        }
    }
}

async fn an_acquire_dropped_in_flight_leaves_a_callers_token_to_the_caller(kind: Kind) {
    let server = kind.server();
    let lim = limiter_with(&server, |b| b.timeout(Duration::from_secs(10))).await;
    let lease = Lease::new(1, 3600).unwrap();
    let held = lim.acquire("job", &lease).token("job-7").await.unwrap();
    // A dropped re-acquire under the same token (a renewal) must not free the lease.
    drop_in_flight(&server, &lim, "job", Some("job-7")).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // time for a release, were there one
    rate_limited(lim.acquire("job", &lease).await);
    assert_eq!(lim.release("job", "job-7").await.unwrap().released, 1);
    drop(held);
}
