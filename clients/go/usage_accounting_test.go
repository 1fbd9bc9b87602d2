package redisrl

// Usage accounting (docs/reference.md "Usage accounting"): leases, FORCE and per-limit COST,
// ported from clients/rust/tests/usage_accounting.rs where the other test files lack them,
// in both modes; and the lapse of a lease whose holder stalled
// (docs/clients.md#leases-that-know-they-are-lost), with the holder in a process of its own
// stopped by SIGSTOP, as the Rust test blocks the holder's runtime.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A holder that took a lease and died (no renewal, no release: a CheckAll lease entry has no
// guard) holds its slot until the lease ends, then the slot is free.
func TestACrashedHolderFreesItsSlotWhenTheLeaseEnds(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := MustLease(1, 200*time.Millisecond)
		if d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("crash", l).Token("dead-process")})); !d.Allowed {
			t.Fatalf("%+v", d)
		}
		_, err := c.Acquire(ctxT(t), "crash", l)
		var rl *RateLimitedError
		if !errors.As(err, &rl) || rl.Decision.RetryAfter <= 0 || rl.Decision.RetryAfter > 200*time.Millisecond {
			t.Fatalf("while the dead holder's lease runs: %v", err)
		}
		var held *LeaseGuard
		waitFor(t, "the dead holder's slot is free", func() bool {
			g, err := c.Acquire(ctxT(t), "crash", l)
			if errors.Is(err, ErrRateLimited) {
				return false
			}
			held = ok(g, err)
			return true
		})
		if !held.Decision().Allowed || held.Decision().Source != k.source() {
			t.Fatalf("%+v", held.Decision())
		}
		if r := ok(held.Release(ctxT(t))); r.Units != 1 {
			t.Errorf("%+v", r)
		}
	})
}

func TestAcquireWithTheSameTokenRenewsInsteadOfTakingTwice(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		l := MustLease(2, 10*time.Second)
		a := ok(c.Acquire(ctxT(t), "tok", l, WithToken("job-7")))
		again := ok(c.Acquire(ctxT(t), "tok", l, WithToken("job-7")))
		if again.Decision().Remaining != 1 {
			t.Errorf("still one lease of one slot: %+v", again.Decision())
		}
		if a.Token() != "job-7" {
			t.Errorf("%q", a.Token())
		}
		if r := ok(again.Release(ctxT(t))); r.Units != 1 {
			t.Errorf("%+v", r)
		}
		if r, err := a.Release(ctxT(t)); err != nil || r.Units != 0 {
			t.Errorf("harmless twice: %+v %v", r, err)
		}
		if r := ok(c.Release(ctxT(t), "tok", "job-7")); r.Units != 0 {
			t.Errorf("%+v", r)
		}
		both := ok(c.Acquire(ctxT(t), "tok", l, WithSlots(2)))
		if both.Decision().Remaining != 0 {
			t.Errorf("%+v", both.Decision())
		}
		if r := ok(both.Release(ctxT(t))); r.Units != 2 {
			t.Errorf("%+v", r)
		}
	})
}

// FORCE on GCRA and with a per-call cost on FIXED (TestForceRecordsUsagePastTheLimit has
// Force on FIXED and the LOG refusal): allowed, nothing left, no wait reported, and the next
// check is denied until the excess has drained.
func TestForceRecordsUsagePastTheLimitOnGCRA(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(5, 1, time.Second)
		d := ok(c.Force(ctxT(t), "f", g, 8))
		if !d.Allowed || d.Remaining != 0 || d.RetryAfter != 0 || d.Never {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.Check(ctxT(t), "f", g)); d.Allowed {
			t.Errorf("until the excess has drained: %+v", d)
		}
		w := MustWindow(10, time.Minute, Fixed)
		if d := ok(c.Check(ctxT(t), "fw", w, Cost(25), Force())); !d.Allowed || d.Remaining != 0 {
			t.Errorf("%+v", d)
		}
	})
}

// One request and 1,200 tokens: requests per minute and tokens per minute together; the
// binding limit is the one that admits the fewest further calls of this shape.
func TestCheckAllWithPerLimitCostsBindsOnTheTokens(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		rpm := ok(MustWindow(600, time.Minute, Fixed).Named("rpm"))
		tpm := ok(MustWindow(2000, time.Minute, Fixed).Named("tpm"))
		call := func(tokens uint64) Decision {
			return ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{t}:rpm", rpm), NewEntry("{t}:tpm", tpm).Cost(tokens)}))
		}
		d := call(1200)
		if !d.Allowed || len(d.PerKey) != 2 || d.PerKey[0].Remaining != 599 || d.PerKey[1].Remaining != 800 {
			t.Fatalf("%+v", d)
		}
		// 800 tokens left admit no further call of 1,200; 599 requests admit 599.
		if d.Spec != Spec(tpm) || d.Remaining != 800 {
			t.Errorf("the binding limit: %+v", d)
		}
		if d := call(1200); d.Allowed {
			t.Errorf("%+v", d)
		}
		if d := call(0); !d.Allowed {
			t.Errorf("a cost of 0 only reports: %+v", d)
		}
	})
}

// A CheckAll denied by its lease entry takes nothing from the rate limit beside it.
func TestCheckAllDeniedByItsLeaseTakesNothingElse(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		rate := MustGCRA(10, 1, time.Second)
		slots := MustLease(1, 10*time.Second)
		if d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{j}:rate", rate), NewEntry("{j}:slots", slots).Token("w1")})); !d.Allowed {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{j}:rate", rate), NewEntry("{j}:slots", slots).Token("w2")})); d.Allowed {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.Check(ctxT(t), "{j}:rate", rate, Cost(0))); d.Remaining != 9 {
			t.Errorf("the denied call took from the rate limit: %+v", d)
		}
		if r := ok(c.Release(ctxT(t), "{j}:slots", "w1")); r.Units != 1 {
			t.Errorf("%+v", r)
		}
	})
}

// A lease's RetryAfter assumes nobody releases early, so it is no bound on when Redis admits
// again: a denial by a full lease must not be repeated by the deny cache after the holder
// (here another client) released its slot.
func TestAReleasedSlotIsNotDeniedLocally(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, a *Client) {
		b := ok(New(s.RDB(t), WithPrefix(a.Prefix())))
		rate := MustGCRA(100, 100, time.Second)
		slots := MustLease(1, 30*time.Second)
		job := func(token string) []Entry {
			return []Entry{NewEntry("{j}:rate", rate), NewEntry("{j}:slots", slots).Token(token)}
		}
		if d := ok(a.CheckAll(ctxT(t), job("a"))); !d.Allowed {
			t.Fatalf("%+v", d)
		}
		denied := ok(b.CheckAll(ctxT(t), job("b")))
		if denied.Allowed || denied.RetryAfter < 20*time.Second {
			t.Fatalf("%+v", denied)
		}
		if r := ok(a.Release(ctxT(t), "{j}:slots", "a")); r.Units != 1 {
			t.Fatalf("%+v", r)
		}
		d := ok(b.CheckAll(ctxT(t), job("b")))
		if !d.Allowed || d.Source == SourceLocal {
			t.Fatalf("the slot is free in Redis: %+v", d)
		}
		if r := ok(b.Release(ctxT(t), "{j}:slots", "b")); r.Units != 1 {
			t.Errorf("%+v", r)
		}
	})
}

func TestCheckAllForce(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		a := MustGCRA(2, 1, time.Minute)
		b := MustWindow(2, time.Minute, Fixed)
		entries := []Entry{NewEntry("{u}:a", a), NewEntry("{u}:b", b)}
		d := ok(c.CheckAll(ctxT(t), entries, Cost(5), Force()))
		if !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.CheckAll(ctxT(t), entries)); d.Allowed {
			t.Errorf("after 5 of 2 were recorded on both: %+v", d)
		}
	})
}

// TestHelperLapsedHolder is the child process of TestALeaseLapsedWhileItsHolderStalledIsReportedLost:
// it takes Lease(1, 0.3 s) on RL_LAPSE_KEY at RL_LAPSE_ADDR, prints "held", then (stopped and
// continued by the parent) waits until the guard reports the loss and prints what it saw.
func TestHelperLapsedHolder(t *testing.T) {
	addr := os.Getenv("RL_LAPSE_ADDR")
	if addr == "" {
		t.Skip("the child process of TestALeaseLapsedWhileItsHolderStalledIsReportedLost")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := ok(New(rdb, WithPrefix(os.Getenv("RL_LAPSE_PREFIX"))))
	var hooked atomic.Int32
	var hookedErr atomic.Pointer[LeaseLostError]
	g := ok(c.Acquire(context.Background(), "job", MustLease(1, 300*time.Millisecond),
		OnLost(func(e *LeaseLostError) { hooked.Add(1); hookedErr.Store(e) })))
	if g.Err() != nil {
		fmt.Println("lost at once", g.Err())
		return
	}
	fmt.Println("held")
	select {
	case <-g.Lost():
	case <-time.After(60 * time.Second):
		fmt.Println("not reported lost within 60 s")
		return
	}
	var lost *LeaseLostError
	reason := "none"
	if errors.As(g.Err(), &lost) {
		reason = lost.Reason.String()
	}
	n, _ := c.Counters().Get("leases_lost")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := g.Release(ctx)
	fmt.Printf("reason=%q hooked=%d same=%v leases_lost=%d release_lost=%v is=%v\n",
		reason, hooked.Load(), hookedErr.Load() == lost, n, errors.Is(err, ErrLeaseLost), errors.Is(g.Err(), ErrLeaseLost))
}

// docs/clients.md#leases-that-know-they-are-lost, as clients/rust/tests/usage_accounting.rs'
// a_lapsed_lease_is_reported_lost: holder A takes Lease(1, 0.3 s) and its process is stopped
// (SIGSTOP: its renewals cannot run); B acquires once A's lease has lapsed, and releases; when
// A runs again its overdue renewal (RENEW) finds the lease gone, and A reports the loss through
// Lost(), Err(), the OnLost hook (once), leases_lost and Release — although the slot is free
// again, the late renewal is not granted as a fresh acquire.
func TestALeaseLapsedWhileItsHolderStalledIsReportedLost(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, b *Client) {
		ok(b.ResolvedMode(ctxT(t))) // the library is loaded here, so the child finds it
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperLapsedHolder$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "RL_LAPSE_ADDR="+s.Addr(), "RL_LAPSE_PREFIX="+b.Prefix())
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Signal(syscall.SIGCONT); _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		lines := make(chan string, 16)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		var out []string
		next := func(what string) string {
			t.Helper()
			select {
			case line, open := <-lines:
				if !open {
					t.Fatalf("%s: the child ended: %s", what, strings.Join(out, "\n"))
				}
				out = append(out, line)
				return line
			case <-time.After(60 * time.Second):
				t.Fatalf("%s: nothing within 60 s: %s", what, strings.Join(out, "\n"))
			}
			return ""
		}
		for next("held") != "held" {
		}
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		l := MustLease(1, 300*time.Millisecond)
		var guard *LeaseGuard
		waitFor(t, "B gets the slot once A's lease lapses", func() bool {
			g, err := b.Acquire(ctxT(t), "job", l)
			if errors.Is(err, ErrRateLimited) {
				return false
			}
			guard = ok(g, err)
			return true
		})
		if r := ok(guard.Release(ctxT(t))); r.Units != 1 {
			t.Fatalf("%+v", r)
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		var report string
		for {
			line := next("the loss")
			if strings.HasPrefix(line, "reason=") {
				report = line
				break
			}
		}
		want := fmt.Sprintf("reason=%q hooked=1 same=true leases_lost=1 release_lost=true is=true", LostNotHeld.String())
		if report != want {
			t.Fatalf("holder A saw\n  %s\nwant\n  %s", report, want)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the child: %v: %s", err, strings.Join(out, "\n"))
		}
	})
}
