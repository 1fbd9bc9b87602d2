package redisrl

// FailLocal's refunds after Redis answers again (docs/clients.md#failure-policy-local): a
// charge the in-memory limiter took during an outage is given back there, not to Redis,
// which never had it (a refund Redis took for it would give back another request's unit:
// the fleet would admit past the limit).

import (
	"context"
	"errors"
	"testing"
	"time"
)

// outageThenBack runs during with Redis stopped, then starts it again and waits (with a
// deadline) until Redis decides a check of probe again.
func outageThenBack(t *testing.T, s *server, c *Client, probe string, g Spec, during func()) {
	t.Helper()
	decidedByRedis(t, c, probe, g)
	s.Stop()
	during()
	s.Start(t)
	decidedByRedis(t, c, probe, g)
}

// inMemory is what FailLocal's memory reports for key under limit (QUANTITY 0, a peek).
func inMemory(t *testing.T, c *Client, key string, limit Spec) Decision {
	t.Helper()
	ls, s, err := c.localSpec(limit)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.memory.check(c.prefix+key, s, 0, true, false, -1)
	if err != nil {
		t.Fatal(err)
	}
	return local(r, ls, c.prefix+key, false)
}

// inRedis is what Redis reports for key under limit (cost 0).
func inRedis(t *testing.T, c *Client, key string, limit Spec) Decision {
	t.Helper()
	d, err := c.Check(ctxT(t), key, limit, Cost(0))
	if err != nil || d.Degraded {
		t.Fatalf("Redis did not report %q: %+v %v", key, d, err)
	}
	return d
}

func TestLocalRefundAfterRecoveryGoesBackToMemory(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailLocal, nil)
		g := MustGCRA(4, 1, time.Hour) // nothing drains during the test
		outageThenBack(t, s, c, "probe", g, func() {
			for _, key := range []string{"k", "split"} {
				n := uint64(2)
				if key == "split" {
					n = 1
				}
				if d := ok(c.Check(ctxT(t), key, g, Cost(n))); !d.Allowed || !d.Degraded || d.Source != SourceLocal {
					t.Fatalf("the outage's charge of %q: %+v", key, d)
				}
			}
		})
		// Redis charges k once too: it holds 1 unit, memory 2.
		if d := ok(c.Check(ctxT(t), "k", g)); !d.Allowed || d.Degraded || d.Remaining != 3 {
			t.Fatalf("%+v", d)
		}
		// Refunding the outage's 2 units gives them back in memory; Redis keeps its own.
		if r := ok(c.Refund(ctxT(t), "k", 2)); r.Units != 2 || !r.Degraded {
			t.Errorf("the outage's charge: %+v", r)
		}
		if d := inRedis(t, c, "k", g); d.Remaining != 3 {
			t.Errorf("Redis gave back a unit it did not take for this charge: %+v", d)
		}
		if d := inMemory(t, c, "k", g); d.Remaining != 4 {
			t.Errorf("memory kept the charge it took: %+v", d)
		}
		// Nothing is owed in memory any more: the next refund is Redis's.
		if r := ok(c.Refund(ctxT(t), "k", 2)); r.Units != 1 || r.Degraded || r.Remaining != 4 {
			t.Errorf("Redis's charge: %+v", r)
		}
		// More than memory owes: memory's part there, the rest to Redis.
		if d := ok(c.Check(ctxT(t), "split", g, Cost(2))); !d.Allowed || d.Degraded {
			t.Fatalf("%+v", d)
		}
		if r := ok(c.Refund(ctxT(t), "split", 3)); r.Units != 3 || r.Degraded {
			t.Errorf("split: %+v", r)
		}
		if d := inRedis(t, c, "split", g); d.Remaining != 4 {
			t.Errorf("split, Redis: %+v", d)
		}
		if d := inMemory(t, c, "split", g); d.Remaining != 4 {
			t.Errorf("split, memory: %+v", d)
		}
		if got, _ := c.Counters().Get("refunded"); got != 6 {
			t.Errorf("refunded %d, not 2 + 1 + 3", got)
		}
	})
}

// A decision says where its charge was taken: RefundDecision and Wait's give-back of a
// cancelled reservation go there, whatever else memory owes the key.
func TestLocalRefundOfADecisionGoesWhereItWasTaken(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailLocal, nil)
		g := MustGCRA(4, 1, time.Hour)
		slow := MustGCRA(2, 1, 10*time.Second) // one unit per 10 s
		var outage Decision
		outageThenBack(t, s, c, "probe", g, func() {
			outage = ok(c.Check(ctxT(t), "d", g, Cost(2)))
			if w := ok(c.Check(ctxT(t), "w", slow)); !w.Degraded || !w.Allowed {
				t.Fatalf("%+v", w)
			}
		})
		if !outage.Degraded || outage.Source != SourceLocal || !outage.Allowed {
			t.Fatalf("%+v", outage)
		}
		inRedisNow := ok(c.Check(ctxT(t), "d", g))
		if inRedisNow.Degraded {
			t.Fatalf("%+v", inRedisNow)
		}
		// Redis's decision: Redis gives back, memory keeps what it owes.
		if r := ok(c.RefundDecision(ctxT(t), inRedisNow, 1)); r.Units != 1 || r.Degraded {
			t.Errorf("Redis's decision: %+v", r)
		}
		if d := inMemory(t, c, "d", g); d.Remaining != 2 {
			t.Errorf("memory gave back a charge Redis took: %+v", d)
		}
		// The outage's decision: memory gives back, after recovery; Redis is not asked.
		calls, _ := c.Counters().Get("redis_calls")
		if r := ok(c.RefundDecision(ctxT(t), outage, 2)); r.Units != 2 || !r.Degraded {
			t.Errorf("the outage's decision: %+v", r)
		}
		if after, _ := c.Counters().Get("redis_calls"); after != calls {
			t.Errorf("a refund of memory's charge called Redis")
		}
		if d := inMemory(t, c, "d", g); d.Remaining != 4 {
			t.Errorf("%+v", d)
		}
		if _, err := c.RefundDecision(ctxT(t), Decision{}, 1); !errors.Is(err, ErrUsage) {
			t.Errorf("a decision of no key: %v", err)
		}
		// Wait reserves in Redis on a key memory owes a unit; cancelled, it gives the
		// reservation back to Redis.
		if d := ok(c.Check(ctxT(t), "w", slow, Cost(2))); !d.Allowed || d.Degraded {
			t.Fatalf("%+v", d)
		}
		ctx, cancel := contextWithCancel(t)
		done := make(chan error, 1)
		go func() { done <- c.Wait(ctx, "w", slow) }()
		reserved := time.Now().Add(10 * time.Second)
		for inRedis(t, c, "w", slow).ResetAfter <= 25*time.Second {
			if time.Now().After(reserved) {
				t.Fatal("Wait did not reserve within 10 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Wait did not return within 10 s of its cancel")
		}
		if d := inRedis(t, c, "w", slow); d.ResetAfter > 20*time.Second {
			t.Errorf("the reservation stayed in Redis: %+v", d)
		}
		if d := inMemory(t, c, "w", slow); d.Remaining != 1 {
			t.Errorf("memory gave back a reservation Redis took: %+v", d)
		}
	})
}

// A lease FailLocal granted during an outage, released by its token (Client.Release) after
// Redis answers again, is freed in memory too, where it is held.
func TestLocalReleaseAfterRecoveryFreesTheLeaseInMemory(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		s, c, _ := ownServer(t, k, FailLocal, nil)
		l := MustLease(1, time.Minute)
		var held *LeaseGuard
		outageThenBack(t, s, c, "probe", MustGCRA(4, 1, time.Hour), func() {
			held = ok(c.Acquire(ctxT(t), "job", l))
		})
		if d := held.Decision(); !d.Degraded || d.Source != SourceLocal {
			t.Fatalf("%+v", d)
		}
		if r := ok(c.Release(ctxT(t), "job", held.Token())); r.Units != 1 || r.Degraded {
			t.Errorf("the release after recovery: %+v", r)
		}
		_, sp, err := c.localSpec(l)
		if err != nil {
			t.Fatal(err)
		}
		if r := ok(c.memory.lease(c.prefix+"job", sp, "another", 1, true, false)); r[0] != 1 {
			t.Errorf("memory still holds the released lease: %v", r)
		}
	})
}
