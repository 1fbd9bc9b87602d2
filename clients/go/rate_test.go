package redisrl

// The redis_rate-shaped API (Allow, AllowN, AllowAtMost) and x/time/rate's Wait.

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestAllowAndAllowNTakeRedisRatesLimit(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := PerMinute(3)
		if d := ok(c.Allow(ctxT(t), "a", l)); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.AllowN(ctxT(t), "a", l, 2)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.Allow(ctxT(t), "a", l)); d.Allowed {
			t.Fatalf("%+v", d)
		}
		if _, err := c.AllowN(ctxT(t), "a", l, -1); !errors.Is(err, ErrUsage) {
			t.Errorf("%v", err)
		}
		if _, err := c.Allow(ctxT(t), "a", Limit{Rate: 1, Period: time.Second}); err == nil {
			t.Error("a Limit without a burst")
		}
	})
}

func TestAllowAtMostGrantsAsManyAsFit(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := PerMinute(5)
		if n, d := must2(c.AllowAtMost(ctxT(t), "m", l, 3)); n != 3 || !d.Allowed {
			t.Fatalf("%d %+v", n, d)
		}
		if n, d := must2(c.AllowAtMost(ctxT(t), "m", l, 3)); n != 2 || !d.Allowed {
			t.Fatalf("%d %+v", n, d)
		}
		n, d := must2(c.AllowAtMost(ctxT(t), "m", l, 3))
		if n != 0 || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 12*time.Second {
			t.Fatalf("%d %+v", n, d)
		}
		// More than the burst: at most the burst.
		if n, _ := must2(c.AllowAtMost(ctxT(t), "m2", l, 50)); n != 5 {
			t.Errorf("%d", n)
		}
		if n, _ := must2(c.AllowAtMost(ctxT(t), "w", MustWindow(4, time.Minute, Log), 10)); n != 4 {
			t.Errorf("LOG: %d", n)
		}
	})
}

func must2[A, B any](a A, b B, err error) (A, B) {
	if err != nil {
		panic(err)
	}
	return a, b
}

func TestWaitReservesAndSleepsUntilTheSlot(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(1, 10, time.Second) // one at once, then one per 100 ms
		start := time.Now()
		for range 4 {
			if err := c.Wait(ctxT(t), "wt", g); err != nil {
				t.Fatal(err)
			}
		}
		between(t, "four waits", time.Since(start), 290*time.Millisecond, 3*time.Second)
		// Windows: checks and sleeps.
		w := MustWindow(2, 200*time.Millisecond, Fixed)
		start = time.Now()
		for range 3 {
			if err := c.Wait(ctxT(t), "ww", w); err != nil {
				t.Fatal(err)
			}
		}
		between(t, "the third in the next window", time.Since(start), 0, 3*time.Second)
	})
}

func TestWaitGivesTheReservationBackWhenTheContextEnds(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(1, 1, 600*time.Millisecond) // one at once, then one per 600 ms
		ok(c.Check(ctxT(t), "wb", g))
		// Cancelled while sleeping toward a reserved slot: the slot comes back.
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(50 * time.Millisecond); cancel() }()
		if err := c.Wait(ctx, "wb", g); !errors.Is(err, context.Canceled) {
			t.Fatalf("%v", err)
		}
		d := ok(c.Check(ctxT(t), "wb", g, Peek()))
		if d.Allowed || d.RetryAfter > 600*time.Millisecond {
			t.Errorf("the reservation was not given back: %+v", d)
		}
		// A deadline shorter than the wait: refused at once, nothing reserved.
		ctx, cancel2 := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel2()
		start := time.Now()
		if err := c.Wait(ctx, "wb", g); !errors.Is(err, ErrRateLimited) {
			t.Errorf("%v", err)
		}
		if took := time.Since(start); took > 140*time.Millisecond {
			t.Errorf("took %v: it waited for the deadline", took)
		}
		if err := c.Wait(ctxT(t), "wb", g); err != nil {
			t.Errorf("%v", err)
		}
		if err := c.Wait(ctxT(t), "wn", MustGCRA(1, 1, time.Second)); err != nil {
			t.Errorf("%v", err)
		}
	})
}
