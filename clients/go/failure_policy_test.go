package redisrl

// The failure policy (docs/clients.md#failure-policy) with Redis stopped, paused and
// restarted mid-run, in both modes, each test on a server of its own.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	s := startServer(t, k.module)
	logs := &logCapture{}
	o := redis.Options{MaxRetries: -1, DialTimeout: 300 * time.Millisecond}
	if rdbOpts != nil {
		o = *rdbOpts
	}
	o.Addr = s.addr()
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { _ = rdb.Close() })
	all := append([]Option{
		WithPrefix(uniquePrefix(t)),
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
		s.stop()
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
		s.start(t)
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
		s.stop()
		d := ok(c.Check(ctxT(t), "c", g))
		if d.Allowed || !d.Degraded || !d.Blind || d.Never || d.RetryAfter != 2*time.Second {
			t.Fatalf("%+v", d)
		}
		h := d.Headers("")
		if h.Get("Retry-After") != "2" || h.Get("RateLimit") != "" || h.Get("RateLimit-Policy") != "" {
			t.Errorf("%v", h)
		}
		// A denial of the policy is never cached as Redis's.
		s.start(t)
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
		s.stop()
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
		s.start(t)
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
				s.pause(t)
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
				s.resume(t)
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
		s.pause(t)
		defer s.resume(t)
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
		s.restart(t) // the fallback's library is gone with the data
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
		s.restart(t)
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
		s.stop()
		g := MustGCRA(1, 1, time.Minute)
		if d := ok(c.Check(ctxT(t), "b", g)); !d.Degraded || !d.Allowed {
			t.Fatalf("%+v", d)
		}
		s.start(t)
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
		s.pause(t)
		defer s.resume(t)
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
