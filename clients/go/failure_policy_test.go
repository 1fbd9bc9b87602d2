package redisrl

// The failure policy (docs/clients.md#failure-policy) with Redis stopped, paused and
// restarted mid-run, in both modes, each test on a server of its own.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// logCapture collects what the client logs.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logCapture) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), substr)
}

const (
	outageLine   = "Redis unavailable; the failure policy answers"
	recoveryLine = "Redis answers again"
)

// ownServer is a server of the test's own, and a client of it with a 50 ms probe interval
// and a 300 ms timeout.
func ownServer(t *testing.T, k testMode, policy FailurePolicy, rdbOpts *redis.Options, opts ...Option) (*server, *Client, *logCapture) {
	t.Helper()
	s := testserver.StartServer(t, k.module)
	logs := &logCapture{}
	o := redis.Options{MaxRetries: -1, DialTimeout: 300 * time.Millisecond}
	if rdbOpts != nil {
		o = *rdbOpts
	}
	o.Addr = s.Addr()
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { _ = rdb.Close() })
	all := append([]Option{
		WithPrefix(testserver.UniquePrefix(t)),
		WithFailurePolicy(policy),
		WithProbeInterval(50 * time.Millisecond),
		WithTimeout(300 * time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
	}, opts...)
	c, err := New(rdb, all...)
	if err != nil {
		t.Fatal(err)
	}
	return s, c, logs
}

func eachMode(t *testing.T, f func(t *testing.T, k testMode)) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// decidedByRedis checks until Redis decides (the probe interval lets one call through
// after it), with a deadline.
func decidedByRedis(t *testing.T, c *Client, key string, g Spec) Decision {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := c.Check(ctxT(t), key, g)
		if err == nil && !d.Degraded {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis did not decide within 5 s: %+v %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOpenAdmitsDegradedThenRecovers(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, logs := ownServer(t, k, FailOpen, nil)
		g := MustGCRA(1, 1, time.Minute)
		if d := ok(c.Check(ctxT(t), "o", g)); !d.Allowed || d.Degraded {
			t.Fatalf("%+v", d)
		}
		s.Stop()
		for range 5 {
			d := ok(c.Check(ctxT(t), "o", g))
			if !d.Allowed || !d.Degraded || !d.Blind || d.Source != SourceLocal || d.Limit != 1 {
				t.Fatalf("%+v", d)
			}
			if h := d.Headers(""); len(h) != 0 {
				t.Errorf("an open degraded answer carries no field: %v", h)
			}
		}
		snap := c.Counters().Snapshot()
		if snap["degraded"] != 5 || snap["errors"] < 1 || snap["allowed"] != 6 {
			t.Errorf("%v", snap)
		}
		if n := logs.count(outageLine); n != 1 {
			t.Errorf("%d outage lines, want 1:\n%s", n, logs.buf.String())
		}
		s.Start(t)
		d := decidedByRedis(t, c, "o", g)
		if !d.Allowed || d.Source != k.source() {
			t.Errorf("after the restart (empty): %+v", d)
		}
		if n := logs.count(recoveryLine); n != 1 {
			t.Errorf("%d recovery lines, want 1", n)
		}
	})
}

func TestClosedDeniesWithAShortRetryThenRecovers(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, logs := ownServer(t, k, FailClosed, nil, WithClosedRetryAfter(2*time.Second))
		g := MustGCRA(5, 1, time.Minute)
		ok(c.Check(ctxT(t), "c", g))
		s.Stop()
		d := ok(c.Check(ctxT(t), "c", g))
		if d.Allowed || !d.Degraded || !d.Blind || d.Never || d.RetryAfter != 2*time.Second {
			t.Fatalf("%+v", d)
		}
		h := d.Headers("")
		if h.Get("Retry-After") != "2" || h.Get("RateLimit") != "" || h.Get("RateLimit-Policy") != "" {
			t.Errorf("%v", h)
		}
		// A denial of the policy is never cached as Redis's.
		s.Start(t)
		if d := decidedByRedis(t, c, "c", g); !d.Allowed {
			t.Errorf("%+v", d)
		}
		if logs.count(outageLine) != 1 || logs.count(recoveryLine) != 1 {
			t.Errorf("logs:\n%s", logs.buf.String())
		}
	})
}

func TestErrorPolicyReturnsUnavailableThenRecovers(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailError, nil)
		g := MustGCRA(1, 1, time.Minute)
		ok(c.Check(ctxT(t), "e", g))
		s.Stop()
		for range 3 { // the first reaches for Redis, the next are inside the probe interval
			_, err := c.Check(ctxT(t), "e", g)
			var ue *UnavailableError
			if !errors.Is(err, ErrUnavailable) || !errors.As(err, &ue) || ue.Cause == nil {
				t.Fatalf("%v", err)
			}
		}
		if _, err := c.Refund(ctxT(t), "e", 1); !errors.Is(err, ErrUnavailable) {
			t.Errorf("refund: %v", err)
		}
		s.Start(t)
		if d := decidedByRedis(t, c, "e", g); !d.Allowed {
			t.Errorf("%+v", d)
		}
	})
}

// A server that stops answering (SIGSTOP: the connection stays open) costs a check no more
// than the timeout, whether or not go-redis is told to honour context deadlines.
func TestAStalledServerTimesOutIntoThePolicy(t *testing.T) {
	for _, ctxTimeouts := range []bool{false, true} {
		name := "go-redis-read-timeout"
		if ctxTimeouts {
			name = "context-timeout-enabled"
		}
		t.Run(name, func(t *testing.T) {
			eachMode(t, func(t *testing.T, k testMode) {
				s, c, _ := ownServer(t, k, FailOpen, &redis.Options{MaxRetries: -1, ContextTimeoutEnabled: ctxTimeouts})
				g := MustGCRA(1, 1, time.Minute)
				ok(c.Check(ctxT(t), "st", g))
				s.Pause(t)
				start := time.Now()
				d := ok(c.Check(ctxT(t), "st", g))
				took := time.Since(start)
				if !d.Degraded || !d.Allowed {
					t.Errorf("%+v", d)
				}
				if took > time.Second {
					t.Errorf("the check took %v with a 300 ms timeout", took)
				}
				// Inside the probe interval: no Redis call at all.
				calls, _ := c.Counters().Get("redis_calls")
				ok(c.Check(ctxT(t), "st", g))
				if after, _ := c.Counters().Get("redis_calls"); after != calls {
					t.Errorf("a check inside the probe interval called Redis")
				}
				s.Resume(t)
				if d := decidedByRedis(t, c, "st", g); d.Allowed {
					t.Errorf("the key is still limited after the pause: %+v", d)
				}
			})
		})
	}
}

// The caller's deadline, when earlier than the client's timeout, is the caller's: its error
// comes back, not a policy answer, and nothing counts as an outage.
func TestTheCallersDeadlineIsReturnedNotAnswered(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailOpen, nil, WithTimeout(2*time.Second))
		g := MustGCRA(1, 1, time.Minute)
		ok(c.Check(ctxT(t), "dl", g))
		s.Pause(t)
		defer s.Resume(t)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Check(ctx, "dl", g)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%v", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("took %v", took)
		}
		if n, _ := c.Counters().Get("degraded"); n != 0 {
			t.Errorf("degraded %d", n)
		}
	})
}

func TestServerRestartedEmptyIsDetectedAgain(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailError, nil)
		g := MustGCRA(2, 1, time.Minute)
		ok(c.Check(ctxT(t), "rs", g))
		s.Restart(t) // the fallback's library is gone with the data
		d := ok(c.Check(ctxT(t), "rs", g))
		if !d.Allowed || d.Remaining != 1 || d.Source != k.source() {
			t.Errorf("%+v", d)
		}
		if !k.module {
			if got := ok(c.ResolvedMode(ctxT(t))); got != ModeFallback {
				t.Errorf("%v", got)
			}
		}
	})
}

// Redis restarted while the client was idle: the pooled connection it closed is replaced
// on the spot, and the first call after it is decided by Redis (docs/clients.md#recovery).
func TestARestartWhileIdleIsNotAnOutage(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, logs := ownServer(t, k, FailClosed, nil)
		g := MustGCRA(2, 1, time.Minute)
		ok(c.Check(ctxT(t), "idle", g))
		s.Restart(t)
		d := ok(c.Check(ctxT(t), "idle", g))
		if d.Degraded || !d.Allowed {
			t.Errorf("%+v", d)
		}
		if logs.count(outageLine) != 0 {
			t.Errorf("logged an outage:\n%s", logs.buf.String())
		}
	})
}

func TestBuiltWhileRedisIsDown(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, logs := ownServer(t, k, FailOpen, nil)
		s.Stop()
		g := MustGCRA(1, 1, time.Minute)
		if d := ok(c.Check(ctxT(t), "b", g)); !d.Degraded || !d.Allowed {
			t.Fatalf("%+v", d)
		}
		s.Start(t)
		d := decidedByRedis(t, c, "b", g)
		if d.Source != k.source() {
			t.Errorf("%+v", d)
		}
		if logs.count(outageLine) != 1 {
			t.Errorf("logs:\n%s", logs.buf.String())
		}
	})
}

func TestRefundInsideTheProbeIntervalDoesNotWait(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailOpen, nil, WithProbeInterval(10*time.Second))
		g := MustGCRA(1, 1, time.Minute)
		ok(c.Check(ctxT(t), "rf", g))
		s.Pause(t)
		defer s.Resume(t)
		ok(c.Check(ctxT(t), "rf", g)) // meets the outage
		calls, _ := c.Counters().Get("redis_calls")
		r := ok(c.Refund(ctxT(t), "rf", 1))
		if !r.Degraded || r.Units != 0 {
			t.Errorf("%+v", r)
		}
		if _, err := c.Release(ctxT(t), "rf", "tok"); err != nil {
			t.Errorf("%v", err)
		}
		if after, _ := c.Counters().Get("redis_calls"); after != calls {
			t.Errorf("a refund or release inside the probe interval called Redis")
		}
	})
}

// FailLocal (docs/clients.md#failure-policy-local): with Redis stopped mid-run each process
// enforces the same limits in memory, divided by the fleet size, with the local figures
// (Degraded, not Blind, Source local, RateLimit fields from them); RL.ALL's all-or-nothing,
// refunds and leases in memory too; the first call after Redis answers again is decided by
// Redis. As clients/rust/tests/failure_policy.rs'
// local_enforces_the_limits_in_memory_then_returns_to_redis.
func TestLocalEnforcesTheLimitsInMemoryThenReturnsToRedis(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, logs := ownServer(t, k, FailLocal, nil, WithFleetSize(2))
		g := MustGCRA(6, 2, time.Minute)       // locally: burst 3, 1 per 60 s
		w := MustWindow(4, time.Minute, Fixed) // locally: 2
		l := MustLease(2, time.Minute)         // locally: 1
		if d := ok(c.Check(ctxT(t), "g", g)); d.Degraded {
			t.Fatalf("%+v", d)
		}
		s.Stop()
		firstLocal := time.Now()
		var got []Decision
		for range 4 {
			got = append(got, ok(c.Check(ctxT(t), "g", g)))
		}
		elapsed := time.Since(firstLocal)
		want := [][3]any{{true, uint64(3), uint64(2)}, {true, uint64(3), uint64(1)}, {true, uint64(3), uint64(0)}, {false, uint64(3), uint64(0)}}
		for i, d := range got {
			if !d.Degraded || d.Blind || d.Source != SourceLocal || [3]any{d.Allowed, d.Limit, d.Remaining} != want[i] {
				t.Fatalf("local %d: %+v", i, d)
			}
		}
		// 60 s from the first local charge, less the time these calls took (measured, not
		// assumed small), rounded to milliseconds.
		denied := got[3]
		if denied.RetryAfter+elapsed+time.Millisecond < time.Minute || denied.RetryAfter > time.Minute {
			t.Errorf("retry after %v (%v after the first)", denied.RetryAfter, elapsed)
		}
		h := denied.Headers("g")
		if h.Get("RateLimit-Policy") != `"g";q=3;w=180` || !strings.HasPrefix(h.Get("RateLimit"), `"g";r=0;t=`) {
			t.Errorf("%v", h)
		}
		if retry, err := strconv.Atoi(h.Get("Retry-After")); err != nil || retry > 60 || time.Duration(retry+1)*time.Second+elapsed < time.Minute {
			t.Errorf("Retry-After %q", h.Get("Retry-After"))
		}
		// Several limits in memory: all or nothing, as RL.ALL.
		both := []Entry{NewEntry("{u}:g", g), NewEntry("{u}:w", w)}
		var all []Decision
		for range 3 {
			all = append(all, ok(c.CheckAll(ctxT(t), both)))
		}
		if !all[0].Allowed || !all[1].Allowed || all[2].Allowed || !all[2].Degraded || all[2].Source != SourceLocal {
			t.Fatalf("%+v", all)
		}
		if all[2].PerKey[0].Remaining != 0 || all[1].PerKey[0].Remaining != 1 || all[2].PerKey[1].Remaining != 0 {
			t.Errorf("the GCRA was charged twice, not three times: %+v", all)
		}
		// A refund during the outage goes back to memory.
		if r := ok(c.Refund(ctxT(t), "g", 1)); r.Units != 1 || !r.Degraded {
			t.Errorf("%+v", r)
		}
		if d := ok(c.Check(ctxT(t), "g", g)); !d.Allowed || d.Source != SourceLocal {
			t.Errorf("after the refund: %+v", d)
		}
		// A lease in memory: one slot locally; renewed and released there.
		held := ok(c.Acquire(ctxT(t), "job", l))
		if d := held.Decision(); !d.Degraded || d.Blind || d.Source != SourceLocal || d.Limit != 1 {
			t.Errorf("%+v", d)
		}
		var limited *RateLimitedError
		if _, err := c.Acquire(ctxT(t), "job", l); !errors.As(err, &limited) || limited.Decision.Source != SourceLocal {
			t.Errorf("a second local lease of one: %v", err)
		}
		if d, err := held.Renew(ctxT(t)); err != nil || !d.Allowed || d.Source != SourceLocal {
			t.Errorf("renew: %+v %v", d, err)
		}
		if r := ok(held.Release(ctxT(t))); r.Units != 1 || !r.Degraded {
			t.Errorf("release: %+v", r)
		}
		if again := ok(c.Acquire(ctxT(t), "job", l)); again.Decision().Source != SourceLocal {
			t.Errorf("%+v", again.Decision())
		} else {
			ok(again.Release(ctxT(t)))
		}
		snap := c.Counters().Snapshot()
		if snap["local"] < 11 || snap["degraded"] < 11 || snap["refunded"] < 1 {
			t.Errorf("%v", snap)
		}
		s.Start(t)
		var back Decision
		deadline := time.Now().Add(10 * time.Second)
		for {
			back = ok(c.Check(ctxT(t), "g", g))
			if !back.Degraded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("did not return to Redis within 10 s")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !back.Allowed || back.Source != k.source() || back.Limit != 6 {
			t.Errorf("Redis's limit, not the local share: %+v", back)
		}
		if logs.count(outageLine) != 1 || logs.count(recoveryLine) != 1 {
			t.Errorf("one line per outage and one at recovery:\n%s", logs.String())
		}
	})
}
