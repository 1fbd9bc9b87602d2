package redisrl

// Leases (RL.LEASE, RL.RELEASE) and the guard that renews them and knows when it is lost
// (docs/clients.md#leases-that-know-they-are-lost), in both modes.

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestAtMostLimitLeasesAreHeldAndReleaseFreesOne(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := MustLease(2, 30*time.Second)
		a := ok(c.Acquire(ctxT(t), "jobs", l))
		b := ok(c.Acquire(ctxT(t), "jobs", l))
		if a.Token() == b.Token() || len(a.Token()) != 32 {
			t.Errorf("tokens %q %q", a.Token(), b.Token())
		}
		if d := a.Decision(); !d.Allowed || d.Source != k.source() || d.Remaining != 1 {
			t.Errorf("%+v", d)
		}
		_, err := c.Acquire(ctxT(t), "jobs", l)
		var rl *RateLimitedError
		if !errors.Is(err, ErrRateLimited) || !errors.As(err, &rl) || rl.Decision.Allowed || rl.Decision.RetryAfter < 29*time.Second {
			t.Fatalf("third acquire: %v", err)
		}
		r := ok(a.Release(ctxT(t)))
		if r.Units != 1 {
			t.Errorf("%+v", r)
		}
		if r := ok(a.Release(ctxT(t))); r.Units != 0 {
			t.Errorf("twice: %+v", r)
		}
		c3 := ok(c.Acquire(ctxT(t), "jobs", l))
		ok(c3.Release(ctxT(t)))
		ok(b.Release(ctxT(t)))
		if _, err := c.Acquire(ctxT(t), "jobs", l, WithSlots(3)); !errors.Is(err, ErrRateLimited) {
			t.Errorf("3 slots of 2: %v", err)
		} else if errors.As(err, &rl); !rl.Decision.Never {
			t.Errorf("3 slots of 2 is Never: %+v", rl.Decision)
		}
		if _, err := c.Acquire(ctxT(t), "jobs", l, WithToken("")); err != nil {
			t.Errorf("an empty token means a fresh one: %v", err)
		}
		if _, err := c.Acquire(ctxT(t), "jobs", l, WithToken(string(make([]byte, 65)))); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%v", err)
		}
	})
}

func TestAGuardRenewsInTheBackground(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := MustLease(1, time.Second)
		g := ok(c.Acquire(ctxT(t), "renewed", l))
		time.Sleep(2100 * time.Millisecond) // more than two lease times
		if g.Err() != nil {
			t.Fatalf("lost: %v", g.Err())
		}
		if _, err := c.Acquire(ctxT(t), "renewed", l); !errors.Is(err, ErrRateLimited) {
			t.Errorf("the renewed lease was free: %v", err)
		}
		if _, err := g.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if other := ok(c.Acquire(ctxT(t), "renewed", l)); !other.Decision().Allowed {
			t.Error("not free after Release")
		}
	})
}

func TestALapsedLeaseIsReportedLost(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := MustLease(1, 200*time.Millisecond)
		var hooked atomic.Int32
		g := ok(c.Acquire(ctxT(t), "lapsed", l, OnLost(func(*LeaseLostError) { hooked.Add(1) })))
		// Another holder takes the slot once this lease lapses: delete the key, as a lapse
		// the renewals could not prevent (a stalled process) would leave it.
		s.Do(t, "DEL", g.Key())
		select {
		case <-g.Lost():
		case <-time.After(3 * time.Second):
			t.Fatal("the guard did not notice within 3 s")
		}
		var lost *LeaseLostError
		if !errors.As(g.Err(), &lost) || lost.Reason != LostNotHeld || !errors.Is(g.Err(), ErrLeaseLost) {
			t.Fatalf("%v", g.Err())
		}
		if _, err := g.Release(ctxT(t)); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Release of a lost lease: %v", err)
		}
		if hooked.Load() != 1 {
			t.Errorf("hook called %d times", hooked.Load())
		}
		if n, _ := c.Counters().Get("leases_lost"); n != 1 {
			t.Errorf("leases_lost %d", n)
		}
	})
}

func TestCheckAllTakesALeaseWithTheLimits(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := MustLease(1, 30*time.Second)
		g := MustGCRA(5, 1, time.Minute)
		d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{j}:rate", g), NewEntry("{j}:slots", l).Token("t1")}))
		if !d.Allowed {
			t.Fatalf("%+v", d)
		}
		d = ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{j}:rate", g), NewEntry("{j}:slots", l).Token("t2")}))
		if d.Allowed {
			t.Fatalf("%+v", d)
		}
		if r := ok(c.Release(ctxT(t), "{j}:slots", "t1")); r.Units != 1 {
			t.Errorf("%+v", r)
		}
	})
}

// Under the open policy an outage grants a degraded guard that holds nothing; under the
// closed policy it is a denial.
func TestAcquireWhileRedisIsDown(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, open, _ := ownServer(t, k, FailOpen, nil)
		closed := ok(New(s.RDB(t), WithFailurePolicy(FailClosed), WithTimeout(300*time.Millisecond)))
		s.Stop()
		l := MustLease(1, time.Second)
		g := ok(open.Acquire(ctxT(t), "d", l))
		if !g.Decision().Degraded || g.Err() != nil {
			t.Errorf("%+v", g.Decision())
		}
		if _, err := g.Release(ctxT(t)); err != nil {
			t.Errorf("%v", err)
		}
		var rl *RateLimitedError
		if _, err := closed.Acquire(ctxT(t), "d", l); !errors.As(err, &rl) || !rl.Decision.Degraded {
			t.Errorf("%v", err)
		}
	})
}

// docs/clients.md#leases-that-know-they-are-lost: a renewal that cannot reach Redis for a
// whole lease time marks the lease lost.
func TestALeaseThatCannotBeRenewedForALeaseTimeIsLost(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, logs := ownServer(t, k, FailOpen, nil)
		g := ok(c.Acquire(ctxT(t), "held", MustLease(1, 600*time.Millisecond)))
		s.Stop()
		stopped := time.Now()
		select {
		case <-g.Lost():
		case <-time.After(30 * time.Second):
			t.Fatal("not reported lost within 30 s")
		}
		// Regression: the renewing goroutine's own deadline equalled the client's timeout,
		// so each failed renewal met that deadline instead of the outage and the loss was
		// seen only when the timeout happened to win the race (6.5 s here).
		if took := time.Since(stopped); took > 5*time.Second {
			t.Errorf("reported lost %v after the stop, with a 600 ms lease", took)
		}
		var lost *LeaseLostError
		if !errors.As(g.Err(), &lost) || lost.Reason != LostUnreachable {
			t.Fatalf("%v", g.Err())
		}
		if _, err := g.Release(ctxT(t)); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("%v", err)
		}
		if n, _ := c.Counters().Get("leases_lost"); n != 1 {
			t.Errorf("leases_lost %d", n)
		}
		if logs.count("lost: no renewal reached Redis") != 1 {
			t.Errorf("logs:\n%s", logs.buf.String())
		}
	})
}
