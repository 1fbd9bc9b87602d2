package redisrl

// The API a go-redis/redis_rate user recognises (Allow, AllowN, AllowAtMost) and
// golang.org/x/time/rate's Wait: "outbound throttling wants Wait, inbound protection wants
// Allow".

import (
	"context"
	"time"
)

// Allow is Check of one request: redis_rate's Allow. limit is a Limit (PerSecond(10)), a
// GCRA or a Window.
func (c *Client) Allow(ctx context.Context, key string, limit Spec) (Decision, error) {
	return c.Check(ctx, key, limit)
}

// AllowN is Check of n requests at once, all or none: redis_rate's AllowN. n may be 0 (a
// report); a negative n is a usage error.
func (c *Client) AllowN(ctx context.Context, key string, limit Spec, n int) (Decision, error) {
	if n < 0 {
		return Decision{}, usage("AllowN needs n >= 0, not %d", n)
	}
	return c.Check(ctx, key, limit, Cost(uint64(n)))
}

// AllowAtMost grants as many of n requests as fit right now, up to n (redis_rate's
// meaning), and returns how many it granted with the decision of the last call. Zero
// granted: the decision is the denial of one request (its RetryAfter is when one fits).
//
// It is not one atomic step: it asks for what the key reports as remaining (at most n) and,
// when a concurrent caller took some first, asks again for what is left (at most three
// times). Every unit granted was admitted by Redis, so the limit always holds.
func (c *Client) AllowAtMost(ctx context.Context, key string, limit Spec, n int) (uint64, Decision, error) {
	if n < 1 {
		return 0, Decision{}, usage("AllowAtMost needs n >= 1, not %d", n)
	}
	if limit == nil {
		return 0, Decision{}, usage("AllowAtMost needs a limit")
	}
	want := min(uint64(n), limit.Capacity())
	if want == 0 {
		want = 1
	}
	d, err := c.Check(ctx, key, limit, Cost(want))
	switch {
	case err != nil:
		return 0, d, err
	case d.Allowed:
		return want, d, nil
	case d.Degraded:
		return 0, d, nil
	}
	for range 3 {
		report, err := c.Check(ctx, key, limit, Cost(0))
		if err != nil {
			return 0, report, err
		}
		if report.Degraded {
			return 0, report, nil
		}
		k := min(uint64(n), report.Remaining)
		if k == 0 {
			d, err := c.Check(ctx, key, limit) // the denial of one request, with its wait
			if err == nil && d.Allowed {
				return 1, d, nil
			}
			return 0, d, err
		}
		d, err = c.Check(ctx, key, limit, Cost(k))
		if err != nil {
			return 0, d, err
		}
		if d.Allowed {
			return k, d, nil
		}
	}
	return 0, d, nil
}

// Wait blocks until one request of limit on key may go ahead, or ctx ends (x/time/rate's
// Wait). On a GCRA limit it reserves the slot (RL.GCRA ... MAXWAIT, up to the time left
// before ctx's deadline, any wait without one), sleeps until the slot's time, and, when ctx
// ends first, gives the reservation back where it was taken (RefundDecision: RL.REFUND, or
// FailLocal's memory) and returns ctx's error. A reservation
// that cannot fit before the deadline is an error matching ErrRateLimited at once, as
// x/time/rate's "would exceed context deadline" is. On a Window limit it checks and sleeps
// each denial's RetryAfter until admitted (no reservation: windows have no MAXWAIT).
//
// A request that can never pass (Never) is ErrRateLimited at once. Under FailOpen an outage
// admits at once; under FailClosed its denials are waited out like any other.
func (c *Client) Wait(ctx context.Context, key string, limit Spec) error {
	if limit == nil {
		return usage("Wait needs a limit")
	}
	s, err := limit.spec()
	if err != nil {
		return err
	}
	for {
		var d Decision
		if s.kind == kindGCRA {
			wait := time.Duration(1<<63 - 1)
			if deadline, ok := ctx.Deadline(); ok {
				wait = time.Until(deadline)
				if wait < 0 {
					wait = 0
				}
			}
			d, err = c.Check(ctx, key, limit, MaxWait(wait))
		} else {
			d, err = c.Check(ctx, key, limit)
		}
		if err != nil {
			return err
		}
		switch {
		case d.Never:
			return &RateLimitedError{Decision: d}
		case d.Allowed && d.RetryAfter <= 0:
			return nil
		case d.Allowed: // a reservation: act at its time
			if err := sleep(ctx, d.RetryAfter); err != nil {
				// Give the slot back where it was taken (Redis, or FailLocal's memory); a
				// failed refund only under-admits.
				rctx := context.WithoutCancel(ctx) // the client's timeout bounds each call
				_, _ = c.RefundDecision(rctx, d, 1)
				return err
			}
			return nil
		case !d.Degraded && s.kind == kindGCRA:
			// Denied although MAXWAIT covered the time left: it cannot fit before the deadline.
			return &RateLimitedError{Decision: d}
		default:
			if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d.RetryAfter {
				return &RateLimitedError{Decision: d}
			}
			if err := sleep(ctx, d.RetryAfter); err != nil {
				return err
			}
		}
	}
}

// sleep waits d or until ctx ends (returning its error).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
