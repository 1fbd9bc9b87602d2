package redisrl

// The client per docs/clients.md against a real redis-server, in both modes (the module,
// and a server without it where ModeAuto must pick the Lua fallback). The test names follow
// the Python and Rust packages' (clients/rust/tests/behaviour.rs).

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

func between(t *testing.T, what string, got, lo, hi time.Duration) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %v, want within [%v, %v]", what, got, lo, hi)
	}
}

func TestAutoModePicksModuleOrFallback(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		if m := ok(c.ResolvedMode(ctxT(t))); m != k.want() {
			t.Fatalf("mode %v, want %v", m, k.want())
		}
		d := ok(c.Check(ctxT(t), "k", MustGCRA(1, 1, time.Second)))
		if d.Source != k.source() {
			t.Errorf("source %v, want %v", d.Source, k.source())
		}
	})
}

func TestIdleKeyAdmitsExactlyBurstThenDenies(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(3, 1, 10*time.Second)
		for i, want := range []uint64{2, 1, 0} {
			d := ok(c.Check(ctxT(t), "user", g))
			if !d.Allowed || d.Remaining != want || d.Limit != 3 || d.RetryAfter != 0 || d.Never {
				t.Fatalf("request %d: %+v", i, d)
			}
			if i == 2 {
				between(t, "reset after", d.ResetAfter, 29*time.Second, 30*time.Second)
			}
		}
		d := ok(c.Check(ctxT(t), "user", g))
		if d.Allowed || d.Never || d.Degraded {
			t.Fatalf("4th: %+v", d)
		}
		between(t, "retry after", d.RetryAfter, 9*time.Second, 10*time.Second)
		if got := d.Headers("").Get("Retry-After"); got != "10" && got != "9" {
			t.Errorf("Retry-After %q", got)
		}
	})
}

func TestWindowAllowsLimitThenDenies(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		for _, alg := range []Algorithm{Fixed, Sliding, Log} {
			w := MustWindow(2, time.Minute, alg)
			var got []bool
			for range 3 {
				got = append(got, ok(c.Check(ctxT(t), "w-"+alg.String(), w)).Allowed)
			}
			if got[0] != true || got[1] != true || got[2] != false {
				t.Errorf("%v: %v", alg, got)
			}
		}
	})
}

func TestCostAboveTheLimitIsNever(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(3, 1, 10*time.Second)
		d := ok(c.Check(ctxT(t), "big", g, Cost(4)))
		if d.Allowed || !d.Never || d.RetryAfter != 0 {
			t.Fatalf("%+v", d)
		}
		if h := d.Headers(""); h.Get("Retry-After") != "" {
			t.Errorf("a Never decision has no Retry-After: %v", h)
		}
		again := ok(c.Check(ctxT(t), "big", g, Cost(4)))
		if !again.Never || again.Source == SourceLocal {
			t.Errorf("asked again: %+v", again)
		}
	})
}

func TestCostZeroReportsWithoutTaking(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(5, 1, time.Minute)
		ok(c.Check(ctxT(t), "c", g, Cost(2)))
		d := ok(c.Check(ctxT(t), "c", g, Cost(0)))
		if !d.Allowed || d.Remaining != 3 {
			t.Errorf("%+v", d)
		}
	})
}

func TestPeekWritesNothing(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(2, 1, 10*time.Second)
		d := ok(c.Check(ctxT(t), "p", g, Peek()))
		if !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%+v", d)
		}
		if n := s.Do(t, "EXISTS", c.Prefix()+"p"); n != int64(0) {
			t.Errorf("EXISTS after PEEK: %v", n)
		}
		if d := ok(c.Check(ctxT(t), "p", g)); d.Remaining != 1 {
			t.Errorf("%+v", d)
		}
	})
}

func TestMaxWaitIsAReservation(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(1, 1, time.Second)
		if !ok(c.Check(ctxT(t), "m", g)).Allowed {
			t.Fatal("first request denied")
		}
		d := ok(c.Check(ctxT(t), "m", g, MaxWait(2*time.Second)))
		if !d.Allowed {
			t.Fatalf("%+v", d)
		}
		between(t, "wait before acting", d.RetryAfter, 500*time.Millisecond, time.Second)
		if tooLong := ok(c.Check(ctxT(t), "m", g, MaxWait(500*time.Millisecond))); tooLong.Allowed {
			t.Errorf("%+v", tooLong)
		}
		if any := ok(c.Check(ctxT(t), "m", g, MaxWait(time.Duration(1<<63-1)))); !any.Allowed {
			t.Errorf("any wait: %+v", any)
		}
	})
}

func TestCheckAllIsAtomicAndReportsEachKey(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		api := ok(MustGCRA(2, 1, time.Minute).Named("api"))
		ip := ok(MustWindow(1, time.Minute, Fixed).Named("ip"))
		entries := []Entry{NewEntry("{c1}:api", api), NewEntry("{c1}:ip", ip)}
		first := ok(c.CheckAll(ctxT(t), entries))
		if !first.Allowed || len(first.PerKey) != 2 || first.Remaining != 0 {
			t.Fatalf("%+v", first)
		}
		if first.Spec != Spec(ip) {
			t.Errorf("binding limit %v, want ip", first.Spec)
		}
		second := ok(c.CheckAll(ctxT(t), entries))
		if second.Allowed {
			t.Fatalf("%+v", second)
		}
		p := c.Prefix()
		if a, found := second.Get(p + "{c1}:api"); !found || !a.Allowed {
			t.Errorf("api alone would admit: %+v", a)
		}
		if i, found := second.Get(p + "{c1}:ip"); !found || i.Allowed {
			t.Errorf("ip denies: %+v", i)
		}
		// Nothing was charged by the denied call: api still has one left.
		if d := ok(c.Check(ctxT(t), "{c1}:api", api)); !d.Allowed || d.Remaining != 0 {
			t.Errorf("api after the denied CheckAll: %+v", d)
		}
		h := first.Headers("")
		if got := h.Get("RateLimit-Policy"); got != `"api";q=2;w=120, "ip";q=1;w=60` {
			t.Errorf("RateLimit-Policy %q", got)
		}
	})
}

func TestCheckAllPerEntryCosts(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		rpm := MustWindow(10, time.Minute, Sliding)
		tpm := MustWindow(1000, time.Minute, Sliding)
		d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{t}:rpm", rpm), NewEntry("{t}:tpm", tpm).Cost(600)}))
		if !d.Allowed || d.PerKey[0].Remaining != 9 || d.PerKey[1].Remaining != 400 {
			t.Fatalf("%+v", d)
		}
		d = ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{t}:rpm", rpm), NewEntry("{t}:tpm", tpm).Cost(600)}))
		if d.Allowed {
			t.Fatalf("%+v", d)
		}
		d = ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{t}:rpm", rpm), NewEntry("{t}:tpm", tpm)}, Cost(3)))
		if !d.Allowed || d.PerKey[0].Remaining != 6 || d.PerKey[1].Remaining != 397 {
			t.Fatalf("same quantity on every limit: %+v", d)
		}
	})
}

func TestRefundGivesUnitsBack(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(5, 1, time.Minute)
		ok(c.Check(ctxT(t), "r", g, Cost(4)))
		r := ok(c.Refund(ctxT(t), "r", 3))
		if r.Units != 3 || r.Remaining != 4 || r.Degraded {
			t.Fatalf("%+v", r)
		}
		if d := ok(c.Check(ctxT(t), "r", g, Cost(0))); d.Remaining != 4 {
			t.Errorf("%+v", d)
		}
		if n, _ := c.Counters().Get("refunded"); n != 3 {
			t.Errorf("refunded counter %d", n)
		}
		if _, err := c.Refund(ctxT(t), "r", 0); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("refund of 0: %v", err)
		}
	})
}

func TestWrongtypeIsAnErrorNotDegraded(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		s.Do(t, "SET", c.Prefix()+"str", "x")
		_, err := c.Check(ctxT(t), "str", MustGCRA(1, 1, time.Second))
		if err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
			t.Fatalf("%v", err)
		}
		if errors.Is(err, ErrUnavailable) {
			t.Errorf("a misuse is not an outage")
		}
		if n, _ := c.Counters().Get("degraded"); n != 0 {
			t.Errorf("degraded %d", n)
		}
	})
}

func TestServerSideErrorsAreErrors(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		// LOG limits are capped by rl.log-max-limit (100000 by default) on the server.
		_, err := c.Check(ctxT(t), "log", MustWindow(200_000, time.Minute, Log))
		if err == nil || !strings.Contains(err.Error(), "log-max-limit") {
			t.Fatalf("%v", err)
		}
		// FORCE cannot be used with LOG.
		_, err = c.Check(ctxT(t), "log", MustWindow(5, time.Minute, Log), Force())
		if err == nil || !strings.Contains(err.Error(), "FORCE cannot be used with LOG") {
			t.Fatalf("%v", err)
		}
	})
}

func TestPrefixIsPartOfTheKey(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		d := ok(c.Check(ctxT(t), "pk", MustGCRA(1, 1, time.Minute)))
		if d.Key != c.Prefix()+"pk" {
			t.Errorf("key %q", d.Key)
		}
		if n := s.Do(t, "EXISTS", c.Prefix()+"pk"); n != int64(1) {
			t.Errorf("EXISTS %v", n)
		}
	})
}

func TestUsageErrors(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		ctx := ctxT(t)
		g := MustGCRA(1, 1, time.Second)
		for _, err := range []error{
			second(c.Check(ctx, "", g)),
			second(c.Check(ctx, "k", MustLease(1, time.Second))),
			second(c.Check(ctx, "k", MustWindow(1, time.Second, Fixed), MaxWait(time.Second))),
			second(c.Check(ctx, "k", nil)),
			second(c.CheckAll(ctx, nil)),
			second(c.CheckAll(ctx, []Entry{NewEntry("a", g), NewEntry("a", g)})),
			second(c.CheckAll(ctx, []Entry{NewEntry("a", MustLease(1, time.Second))})),
			second(c.CheckAll(ctx, []Entry{NewEntry("a", g).Token("t")})),
		} {
			if !errors.Is(err, ErrUsage) {
				t.Errorf("%v: not a usage error", err)
			}
		}
		if _, err := c.Check(ctx, "k", GCRA{}); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("zero GCRA: %v", err)
		}
		if _, err := c.Check(ctx, "k", Limit{Rate: 1, Burst: 0, Period: time.Second}); err == nil || err.Error() != "burst must be a positive integer" {
			t.Errorf("bad Limit: %v", err)
		}
		for _, opt := range []Option{WithPrefix("a{b"), WithTimeout(0), WithFleetSize(0), WithFailurePolicy(FailurePolicy(9)), WithMode(Mode(7))} {
			if _, err := New(s.RDB(t), opt); !errors.Is(err, ErrUsage) {
				t.Errorf("New: %v", err)
			}
		}
		if _, err := New(nil); !errors.Is(err, ErrUsage) {
			t.Errorf("New(nil): %v", err)
		}
	})
}

func TestDenyCacheAnswersLocallyUntilRetryAfter(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(1, 1, 300*time.Millisecond)
		ok(c.Check(ctxT(t), "dc", g))
		first := ok(c.Check(ctxT(t), "dc", g))
		if first.Allowed || first.Source != k.source() {
			t.Fatalf("%+v", first)
		}
		calls, _ := c.Counters().Get("redis_calls")
		local := ok(c.Check(ctxT(t), "dc", g))
		if local.Allowed || local.Source != SourceLocal || local.RetryAfter > first.RetryAfter || local.RetryAfter < time.Millisecond {
			t.Fatalf("%+v (first %+v)", local, first)
		}
		if after, _ := c.Counters().Get("redis_calls"); after != calls {
			t.Errorf("the local denial made a Redis call")
		}
		if n, _ := c.Counters().Get("denied_locally"); n != 1 {
			t.Errorf("denied_locally %d", n)
		}
		time.Sleep(local.RetryAfter)
		if d := ok(c.Check(ctxT(t), "dc", g)); !d.Allowed || d.Source != k.source() {
			t.Errorf("after the wait: %+v", d)
		}
	})
}

func TestDenyCacheLetsSmallerRequestsAskRedis(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(5, 1, time.Minute)
		ok(c.Check(ctxT(t), "s", g, Cost(4)))
		if d := ok(c.Check(ctxT(t), "s", g, Cost(3))); d.Allowed {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.Check(ctxT(t), "s", g, Cost(1))); !d.Allowed || d.Source != k.source() {
			t.Errorf("a smaller request: %+v", d)
		}
	})
}

func TestRefundClearsLocalDenials(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(1, 1, time.Minute)
		ok(c.Check(ctxT(t), "rc", g))
		ok(c.Check(ctxT(t), "rc", g))
		ok(c.Refund(ctxT(t), "rc", 1))
		if d := ok(c.Check(ctxT(t), "rc", g)); !d.Allowed {
			t.Errorf("%+v", d)
		}
	})
}

func TestDenyCacheCanBeTurnedOff(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(1, 1, time.Minute)
		for range 3 {
			if d := ok(c.Check(ctxT(t), "off", g)); d.Source != k.source() {
				t.Errorf("%+v", d)
			}
		}
		if n, _ := c.Counters().Get("redis_calls"); n < 3 {
			t.Errorf("redis_calls %d", n)
		}
	}, WithDenyCache(false))
}

func TestCountersAndHook(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]uint64{}
	hook := func(name string, n uint64) { mu.Lock(); seen[name] += n; mu.Unlock() }
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		mu.Lock()
		clear(seen)
		mu.Unlock()
		g := MustGCRA(2, 1, time.Minute)
		for range 4 {
			ok(c.Check(ctxT(t), "cnt", g))
		}
		snap := c.Counters().Snapshot()
		if snap["allowed"] != 2 || snap["denied"] != 2 || snap["denied_locally"] != 1 || snap["degraded"] != 0 {
			t.Errorf("%v", snap)
		}
		if len(snap) != len(CounterNames) {
			t.Errorf("%d counters", len(snap))
		}
		mu.Lock()
		defer mu.Unlock()
		for name, n := range snap {
			if seen[name] != n {
				t.Errorf("hook saw %s=%d, counter %d", name, seen[name], n)
			}
		}
	}, WithHook(hook))
}

// A context that has ended is honoured before any Redis call, and one that ends during the
// call returns its error, not a policy answer.
func TestContextIsHonoured(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		ctx, cancel := contextWithCancel(t)
		cancel()
		if _, err := c.Check(ctx, "ctx", MustGCRA(1, 1, time.Second)); !errors.Is(err, errContextCanceled) {
			t.Errorf("%v", err)
		}
		if n, _ := c.Counters().Get("redis_calls"); n != 0 {
			t.Errorf("redis_calls %d", n)
		}
	})
}

// While the cache denies a key, Redis denies it too: the cache's deadline counts from when
// the denied request was sent, never later than Redis's. Checked with a PEEK on the server
// right after each local denial that still had 20 ms or more to run.
func TestDenyCacheNeverDeniesWhatRedisWouldAdmit(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		g := MustGCRA(2, 10, time.Second) // 100 ms per request
		peekArgs := []any{"RL.GCRA", c.Prefix() + "x", "2", "10", "1", "PEEK"}
		if !k.module {
			peekArgs = []any{"FCALL", "rl_gcra", "1", c.Prefix() + "x", "2", "10", "1", "PEEK"}
			if testserver.Major(t) < 7 { // no Functions: the fallback's script, ARGV[1] its function
				peekArgs = []any{"EVAL", scriptText(), "1", c.Prefix() + "x", "rl_gcra", "2", "10", "1", "PEEK"}
			}
		}
		checked := 0
		deadline := time.Now().Add(5 * time.Second) // a loaded host gets fewer rounds a second
		for time.Now().Before(deadline) && checked < 30 {
			before := serverTime(t, s)
			d := ok(c.Check(ctxT(t), "x", g))
			if d.Source == SourceLocal && d.RetryAfter >= 20*time.Millisecond {
				peek := s.Do(t, peekArgs...).([]any)
				// Redis may admit by the time the peek arrives (a busy host), but only once
				// the cached retry has passed on the server's clock since before the check.
				if elapsed := serverTime(t, s).Sub(before); peek[0] != int64(0) && elapsed < d.RetryAfter {
					t.Fatalf("the cache denied what Redis admits: %+v %v (%v later on the server's clock)", d, peek, elapsed)
				}
				checked++
			}
			time.Sleep(5 * time.Millisecond)
		}
		if checked < 20 {
			t.Errorf("only %d local denials checked", checked)
		}
	})
}

// serverTime is the server's clock (TIME), the one its limits decide by.
func serverTime(t testing.TB, s *server) time.Time {
	t.Helper()
	tm, _ := s.Do(t, "TIME").([]any)
	if len(tm) != 2 {
		t.Fatalf("TIME answered %v", tm)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(tm[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(tm[1]), 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME answered %v", tm)
	}
	return time.Unix(sec, usec*1000)
}

func TestForceRecordsUsagePastTheLimit(t *testing.T) {
	bothModes(t, func(t *testing.T, k testMode, s *server, c *Client) {
		w := MustWindow(5, time.Minute, Fixed)
		d := ok(c.Force(ctxT(t), "f", w, 8))
		if !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%+v", d)
		}
		if d := ok(c.Check(ctxT(t), "f", w)); d.Allowed {
			t.Errorf("after 8 of 5 were recorded: %+v", d)
		}
		if _, err := c.Force(ctxT(t), "l", MustWindow(5, time.Minute, Log), 1); err == nil || !strings.Contains(err.Error(), "FORCE cannot be used with LOG") {
			t.Errorf("%v", err)
		}
	})
}

// A full Redis keeps denying (docs/clients.md#out-of-memory): right after CONFIG SET
// maxmemory 1, denials, peeks, cost 0, CheckAll denials and lease denials are Redis's own
// answers, and the very next check that would write is refused (the server's OOM error, an
// outage for the failure policy: here FailError) and writes nothing, in both modes. As the
// fallback, the server refuses FCALL rl_* whole and the client asks its no-writes twin
// (FCALL_RO rl_*_ro) once. (An OOM error is an outage for the policy: inside its probe
// interval a client does not ask Redis, so each refused write here has a client of its own.)
// As clients/rust/tests/behaviour.rs' out_of_memory_refuses_writes_and_still_denies.
func TestOutOfMemoryRefusesWritesAndStillDenies(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			s := testserver.StartServer(t, k.module) // its own: maxmemory 1 would stop other tests
			prefix := testserver.UniquePrefix(t)
			client := func() *Client {
				return ok(New(s.RDB(t), WithPrefix(prefix), WithFailurePolicy(FailError), WithDenyCache(false)))
			}
			c := client()
			g := MustGCRA(1, 1, time.Hour)
			w := MustWindow(5, time.Hour, Fixed)
			l := MustLease(1, time.Minute)
			if !ok(c.Check(ctxT(t), "full", g)).Allowed || !ok(c.Check(ctxT(t), "win", w)).Allowed {
				t.Fatal("the first checks were denied")
			}
			held := ok(c.Acquire(ctxT(t), "lease", l))
			before := s.Do(t, "DBSIZE")
			roBefore := commandStats(t, s)["fcall_ro"]
			callsBefore, _ := c.Counters().Get("redis_calls")
			s.Do(t, "CONFIG", "SET", "maxmemory", "1")

			if d := ok(c.Check(ctxT(t), "full", g)); d.Allowed || d.Degraded || d.Source != k.source() {
				t.Errorf("denial: %+v", d)
			}
			if d := ok(c.Check(ctxT(t), "win", w, Peek())); !d.Allowed || d.Remaining != 3 || d.Degraded {
				t.Errorf("peek: %+v", d)
			}
			if d := ok(c.Check(ctxT(t), "new", g, Cost(0))); !d.Allowed || d.Remaining != 1 || d.Degraded {
				t.Errorf("cost 0: %+v", d)
			}
			all := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("full", g), NewEntry("x", w)}))
			if all.Allowed || all.Degraded || all.Source != k.source() {
				t.Errorf("CheckAll: %+v", all)
			}
			var limited *RateLimitedError
			if _, err := c.Acquire(ctxT(t), "lease", l); !errors.As(err, &limited) || limited.Decision.Allowed || limited.Decision.Degraded {
				t.Errorf("expected a lease denial, got %v", err)
			}
			// Redis 6.x has no Functions: the fallback runs as scripts, whose denials only
			// read and answer at once (no twin, one call each).
			functions := testserver.Major(t) >= 7
			if !k.module && functions {
				// Each of the five asked FCALL rl_* (refused whole) and then its twin.
				calls, _ := c.Counters().Get("redis_calls")
				if calls != callsBefore+10 {
					t.Errorf("redis_calls %d -> %d, want +10 (each call and its twin)", callsBefore, calls)
				}
			}
			if !k.module && !functions {
				calls, _ := c.Counters().Get("redis_calls")
				if calls != callsBefore+5 {
					t.Errorf("redis_calls %d -> %d, want +5 (as scripts, one call each)", callsBefore, calls)
				}
			}
			// Each refused write on a client of its own (the same keys).
			oom := func(what string, err error) {
				t.Helper()
				var down *UnavailableError
				if !errors.As(err, &down) || errorCode(down.Cause) != "OOM" {
					t.Errorf("%s: expected the server's OOM as an outage, got %v", what, err)
				}
			}
			_, err := client().Check(ctxT(t), "win", w)
			oom("window", err)
			_, err = client().Check(ctxT(t), "new", g)
			oom("gcra", err)
			_, err = client().CheckAll(ctxT(t), []Entry{NewEntry("{a}x", g), NewEntry("{a}y", w)})
			oom("CheckAll", err)
			_, err = client().Acquire(ctxT(t), "other-lease", l)
			oom("lease", err)
			if after := s.Do(t, "DBSIZE"); after != before {
				t.Errorf("keys %v -> %v: something was written out of memory", before, after)
			}
			if !k.module && functions {
				if ro := commandStats(t, s)["fcall_ro"]; ro < roBefore+9 {
					t.Errorf("every refused FCALL asked its twin: fcall_ro %d -> %d", roBefore, ro)
				}
			}
			s.Do(t, "CONFIG", "SET", "maxmemory", "0")
			if d := ok(c.Check(ctxT(t), "win", w)); !d.Allowed || d.Remaining != 3 || d.Source != k.source() {
				t.Errorf("after: %+v", d)
			}
			if d := ok(c.Check(ctxT(t), "new", g)); !d.Allowed {
				t.Errorf("after: %+v", d)
			}
			ok(held.Release(ctxT(t)))
		})
	}
}
