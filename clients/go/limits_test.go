package redisrl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

func TestDurationsAreExact(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		wire string
	}{
		{60 * time.Second, "60"},
		{250 * time.Millisecond, "0.25"},
		{1500 * time.Millisecond, "1.5"},
		{time.Nanosecond, "0.000000001"},
		{MaxSeconds * time.Second, "315360000"},
		{100 * time.Millisecond, "0.1"},
	} {
		g := ok(NewGCRA(1, 1, c.d))
		if got := FormatSeconds(g.Period()); got != c.wire {
			t.Errorf("%v: %q, want %q", c.d, got, c.wire)
		}
		back, err := ParseSeconds(c.wire, "period")
		if err != nil || back != c.d {
			t.Errorf("ParseSeconds(%q) = %v, %v", c.wire, back, err)
		}
	}
	if d, err := ParseSeconds("007", "p"); err != nil || d != 7*time.Second {
		t.Errorf("leading zeros: %v %v", d, err)
	}
}

func TestBadLimitsFailWhenBuilt(t *testing.T) {
	seconds := func(name string) string {
		return name + " must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 more digits), > 0 and <= 315360000"
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{second(NewGCRA(0, 1, time.Second)), "burst must be a positive integer"},
		{second(NewGCRA(1, 0, time.Second)), "rate must be a positive integer"},
		{second(NewGCRA(1, 1, 0)), seconds("period")},
		{second(NewGCRA(1, 1, -time.Second)), seconds("period")},
		{second(NewGCRA(1, 1, MaxSeconds*time.Second+1)), seconds("period")},
		{second(NewGCRA(1, 3_000_000_000, time.Second)), "rate is too high for period: the emission interval period/rate is below 1 ns"},
		{second(NewGCRA(1<<63, 1, 10*time.Second)), "burst is too large: burst * period / rate overflows 64-bit nanoseconds"},
		{second(NewWindow(0, time.Second, Fixed)), "limit must be a positive integer"},
		{second(NewWindow(1, 0, Log)), seconds("window")},
		{second(NewWindow(1, time.Second, Algorithm(9))), "algorithm must be FIXED, SLIDING or LOG, not 'Algorithm(9)'"},
		{second(NewLease(0, time.Second)), "limit must be a positive integer"},
		{second(NewLease(1, 0)), seconds("lease")},
		{second(ok(NewGCRA(1, 1, time.Second)).Named("")), "name must be non-empty printable ASCII (it is sent in HTTP headers)"},
		{second(ok(NewGCRA(1, 1, time.Second)).Named("a\nb")), "name must be non-empty printable ASCII (it is sent in HTTP headers)"},
		{second(Limit{Rate: 1, Burst: -1, Period: time.Second}.GCRA()), "burst must be a positive integer"},
		{second(Limit{Rate: 0, Burst: 1, Period: time.Second}.GCRA()), "rate must be a positive integer"},
		{second(ParseSeconds("1e3", "window")), seconds("window")},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("got %v, want %q", c.err, c.want)
			continue
		}
		if !errors.Is(c.err, ErrInvalidLimit) {
			t.Errorf("%v does not match ErrInvalidLimit", c.err)
		}
	}
	// Rates up to one per nanosecond keep a non-zero emission interval (R-TIME-3).
	g := ok(NewGCRA(1, 1_000_000_000, time.Second))
	if g.EmissionInterval() != time.Nanosecond {
		t.Errorf("T = %v", g.EmissionInterval())
	}
	// T is rounded to the nearest nanosecond, halves up (R-ARG-4): 1 s / 3 = 333333333.33.
	if got := ok(NewGCRA(1, 3, time.Second)).EmissionInterval(); got != 333333333 {
		t.Errorf("T = %d", got)
	}
	if got := ok(NewGCRA(1, 2, 3*time.Nanosecond)).EmissionInterval(); got != 2 {
		t.Errorf("T of 3 ns / 2 = %d, want 2 (halves up)", got)
	}
}

func second[T any](_ T, err error) error { return err }

func TestZeroLimitsAreRefused(t *testing.T) {
	for _, s := range []Spec{GCRA{}, Window{}, Lease{}, Limit{}} {
		if _, err := s.spec(); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%T{}: %v", s, err)
		}
	}
}

func TestRedisRateLimitsAreGCRA(t *testing.T) {
	for _, c := range []struct {
		l      Limit
		period time.Duration
		text   string
	}{
		{PerSecond(10), time.Second, "10 req/s (burst 10)"},
		{PerMinute(5), time.Minute, "5 req/m (burst 5)"},
		{PerHour(100), time.Hour, "100 req/h (burst 100)"},
	} {
		g := ok(c.l.GCRA())
		if g.Burst() != uint64(c.l.Rate) || g.Rate() != uint64(c.l.Rate) || g.Period() != c.period {
			t.Errorf("%v: %v", c.l, g)
		}
		if c.l.String() != c.text {
			t.Errorf("%q, want %q", c.l.String(), c.text)
		}
	}
	l := Limit{Rate: 5, Burst: 20, Period: time.Second}
	if g := ok(l.GCRA()); g.Burst() != 20 || g.EmissionInterval() != 200*time.Millisecond {
		t.Errorf("%v", g)
	}
}

func TestLimitStrings(t *testing.T) {
	w := func(n uint64, secs time.Duration) Spec { return MustWindow(n, secs*time.Second, Sliding) }
	for _, c := range []struct {
		text string
		want []Spec
	}{
		{"10/minute", []Spec{w(10, 60)}},
		{"10 / Minute", []Spec{w(10, 60)}},
		{"100 per hour", []Spec{w(100, 3600)}},
		{"100PER HOUR", []Spec{w(100, 3600)}},
		{"5/10s", []Spec{w(5, 10)}},
		{"5 per 10 seconds", []Spec{w(5, 10)}},
		{"1/d", []Spec{w(1, 86400)}},
		{"3/2hr", []Spec{w(3, 7200)}},
		{"20/minute; 200 per hour", []Spec{w(20, 60), w(200, 3600)}},
		{"20/m,200/h", []Spec{w(20, 60), w(200, 3600)}},
		{"7/sec", []Spec{w(7, 1)}},
	} {
		got, err := ParseLimits(c.text)
		if err != nil {
			t.Errorf("%q: %v", c.text, err)
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("%q: %v", c.text, got)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%q[%d]: %v, want %v", c.text, i, got[i], c.want[i])
			}
		}
	}
	for _, c := range []struct{ text, starts string }{
		{"", "no limit in ''"},
		{"10/minute;", "empty limit in '10/minute;'"},
		{"0/minute", "limit '0/minute': limit must be a positive integer"},
		{"ten/minute", "limit 'ten/minute': expected '<count>/<unit>'"},
		{"10 minute", "limit '10 minute': expected '/' or 'per'"},
		{"10/0s", "limit '10/0s': the number of units must be"},
		{"10/fortnight", "limit '10/fortnight': unknown unit 'fortnight'"},
		{"7/mins", "limit '7/mins': unknown unit 'mins'"},
		{"1/3651d", "limit '1/3651d': the window must be at most 315360000 s"},
		{"-1/s", "limit '-1/s': expected"},
		{"99999999999999999999/s", "limit '99999999999999999999/s': the count does not"},
	} {
		_, err := ParseLimits(c.text)
		if err == nil || !strings.HasPrefix(err.Error(), c.starts) {
			t.Errorf("%q: %v, want %q...", c.text, err, c.starts)
		}
	}
	got := ok(ParseLimitsWith("10/minute", StringGCRA))
	if got[0] != Spec(MustGCRA(10, 10, time.Minute)) {
		t.Errorf("%v", got)
	}
	got = ok(ParseLimitsWith("4/s", StringFixed))
	if got[0] != Spec(MustWindow(4, time.Second, Fixed)) {
		t.Errorf("%v", got)
	}
}

// The messages are the server's own: the same bad limit sent to the module and to the
// fallback answers "ERR " + the message NewGCRA/NewWindow/NewLease gives.
func TestLimitMessagesMatchTheServer(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			s := testserver.Shared(t, k.module)
			rdb := s.RDB(t)
			c := ok(New(rdb, WithPrefix(testserver.UniquePrefix(t))))
			if _, err := c.ResolvedMode(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				command string
				args    []any
				err     error
			}{
				{"RL.GCRA", []any{"0", "1", "1"}, second(NewGCRA(0, 1, time.Second))},
				{"RL.GCRA", []any{"1", "0", "1"}, second(NewGCRA(1, 0, time.Second))},
				{"RL.GCRA", []any{"1", "1", "0"}, second(NewGCRA(1, 1, 0))},
				{"RL.GCRA", []any{"1", "1", "315360000.000000001"}, second(NewGCRA(1, 1, MaxSeconds*time.Second+1))},
				{"RL.GCRA", []any{"1", "3000000000", "1"}, second(NewGCRA(1, 3_000_000_000, time.Second))},
				{"RL.GCRA", []any{"9223372036854775808", "1", "10"}, second(NewGCRA(1<<63, 1, 10*time.Second))},
				{"RL.GCRA", []any{"1", "1", "1e3"}, second(ParseSeconds("1e3", "period"))},
				{"RL.GCRA", []any{"1", "1", ".5"}, second(ParseSeconds(".5", "period"))},
				{"RL.WINDOW", []any{"0", "1"}, second(NewWindow(0, time.Second, Sliding))},
				{"RL.WINDOW", []any{"1", "5."}, second(ParseSeconds("5.", "window"))},
				{"RL.LEASE", []any{"0", "1", "tok"}, second(NewLease(0, time.Second))},
				{"RL.LEASE", []any{"1", "0", "tok"}, second(NewLease(1, 0))},
			} {
				if tc.err == nil {
					t.Fatalf("%v: the client accepted it", tc.args)
				}
				wire := []any{tc.command, c.prefix + "msg"}
				if !k.module {
					fn := map[string]string{"RL.GCRA": "rl_gcra", "RL.WINDOW": "rl_window", "RL.LEASE": "rl_lease"}[tc.command]
					wire = []any{"FCALL", fn, "1", c.prefix + "msg"}
				}
				_, err := rdb.Do(context.Background(), append(wire, tc.args...)...).Result()
				if err == nil || err.Error() != "ERR "+tc.err.Error() {
					t.Errorf("%s %v: server %q, client %q", tc.command, tc.args, err, tc.err)
				}
			}
		})
	}
}
