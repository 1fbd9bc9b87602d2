package redisrl

// Acquire whose context ends while RL.LEASE is in flight (docs/clients.md#leases-that-know-they-are-lost):
// the slot that call still took must not stay held under a token nobody has.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// holdAfterLease lets the first successful lease call (RL.LEASE, FCALL rl_lease, or the
// scripts' rl_lease) reach Redis and be answered, then holds its reply back until resume is
// closed: the caller's context can end while the slot is already taken.
type holdAfterLease struct {
	armed   atomic.Bool
	granted chan struct{}
	resume  chan struct{}
}

func (h *holdAfterLease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdAfterLease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && isLeaseCall(cmd.Args()) && h.armed.CompareAndSwap(true, false) {
			close(h.granted)
			select {
			case <-h.resume:
			case <-time.After(20 * time.Second):
			}
		}
		return err
	}
}

func (h *holdAfterLease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func isLeaseCall(args []any) bool {
	for _, a := range args {
		if a == "RL.LEASE" || a == "rl_lease" {
			return true
		}
	}
	return false
}

// cancelledAcquire starts Acquire with opts, cancels its context once Redis has granted the
// slot but before the reply reaches Acquire, checks that Acquire returns context.Canceled,
// then lets the reply through.
func cancelledAcquire(t *testing.T, c *Client, h *holdAfterLease, key string, l Lease, opts ...AcquireOption) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.armed.Store(true)
	done := make(chan error, 1)
	go func() {
		g, err := c.Acquire(ctx, key, l, opts...)
		if g != nil {
			err = errors.New("a guard was returned")
		}
		done <- err
	}()
	select {
	case <-h.granted:
	case <-time.After(10 * time.Second):
		t.Fatal("the lease call did not reach Redis within 10 s")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return within 5 s of its context's end")
	}
	close(h.resume)
}

func TestAcquireCancelledInFlightReleasesTheSlotItTook(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		rdb := testserver.Shared(t, k.module).RDB(t)
		h := &holdAfterLease{granted: make(chan struct{}), resume: make(chan struct{})}
		rdb.AddHook(h)
		c := ok(New(rdb, WithPrefix(testserver.UniquePrefix(t))))
		l := MustLease(1, time.Hour) // held for the whole test unless released
		cancelledAcquire(t, c, h, "jobs", l)
		// The slot comes free as soon as the held-back reply arrives (in the background).
		deadline := time.Now().Add(10 * time.Second)
		for {
			g, err := c.Acquire(ctxT(t), "jobs", l)
			if err == nil {
				ok(g.Release(ctxT(t)))
				break
			}
			if !errors.Is(err, ErrRateLimited) {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cancelled Acquire's slot is still held after 10 s: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func TestAcquireCancelledInFlightLeavesACallersTokenToTheCaller(t *testing.T) {
	eachMode(t, func(t *testing.T, k testMode) {
		rdb := testserver.Shared(t, k.module).RDB(t)
		h := &holdAfterLease{granted: make(chan struct{}), resume: make(chan struct{})}
		rdb.AddHook(h)
		c := ok(New(rdb, WithPrefix(testserver.UniquePrefix(t))))
		l := MustLease(1, time.Hour)
		// The caller already holds a lease under job-7; a cancelled re-acquire (a renewal)
		// must not free it.
		held := ok(c.Acquire(ctxT(t), "jobs", l, WithToken("job-7")))
		cancelledAcquire(t, c, h, "jobs", l, WithToken("job-7"))
		// Give a background release (there must be none) time to have happened: a renewal
		// of the held lease answers after anything sent before it on the pool.
		time.Sleep(50 * time.Millisecond)
		if _, err := held.Renew(ctxT(t)); err != nil {
			t.Fatalf("the held lease was freed by the cancelled re-acquire: %v", err)
		}
		if r := ok(c.Release(ctxT(t), "jobs", "job-7")); r.Units != 1 {
			t.Errorf("release by token: %+v", r)
		}
		_, _ = held.Release(ctxT(t))
	})
}
