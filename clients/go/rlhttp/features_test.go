package rlhttp

// Per-request limits, costs from the request, settlement beyond the arithmetic, leases held
// by a request, through real net/http servers on loopback against a real redis-server, with
// the module and without it (the Lua fallback).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

// docs/clients.md#limits-as-users-write-them: limits computed per request (by plan), named
// as strings of several limits are.
func TestPerRequestLimitsByPlan(t *testing.T) {
	bothModes(t, func(t *testing.T, rs *server, mode redisrl.Option) {
		pro, err := redisrl.ParseLimits("4/minute")
		if err != nil {
			t.Fatal(err)
		}
		free, err := redisrl.ParseLimits("1/minute; 2 per hour")
		if err != nil {
			t.Fatal(err)
		}
		byPlan := func(r *http.Request) ([]redisrl.Spec, error) {
			switch r.Header.Get("X-Plan") {
			case "pro":
				return pro, nil
			case "broken":
				return nil, errors.New("no such plan")
			}
			return free, nil
		}
		l := rs.limiter(t, mode)
		s := serve(t, mustNew(t, l, []Rule{{Limits: []Limit{{Name: "plan", PerRequest: byPlan, Key: Header("X-API-Key")}}}}))
		var got []int
		for range 5 {
			got = append(got, get(t, s.URL+"/", "X-API-Key", "p", "X-Plan", "pro").status)
		}
		if fmt.Sprint(got) != "[200 200 200 200 429]" {
			t.Errorf("pro: %v", got)
		}
		first := get(t, s.URL+"/", "X-API-Key", "f")
		if first.status != 200 || first.header.Get("RateLimit-Policy") != `"plan-60s";q=1;w=60, "plan-3600s";q=2;w=3600` {
			t.Errorf("free: %d %v", first.status, first.header)
		}
		if r := get(t, s.URL+"/", "X-API-Key", "f"); r.status != 429 || r.body["policy"] != "plan-60s" {
			t.Errorf("free, twice: %d %v", r.status, r.body)
		}
		calls := counter(l, "redis_calls")
		if r := get(t, s.URL+"/", "X-API-Key", "b", "X-Plan", "broken"); r.status != 500 || r.body["error"] != "limiter_error" {
			t.Errorf("a failing limit function: %d %v", r.status, r.body)
		}
		if n := counter(l, "redis_calls"); n != calls {
			t.Errorf("a failing limit function made %d Redis calls", n-calls)
		}
		if _, err := New(l, []Rule{{Limits: []Limit{{Name: "x", Spec: pro[0], PerRequest: byPlan, Key: IP()}}}}); err == nil {
			t.Error("a limit with both Spec and PerRequest")
		}
	})
}

// docs/clients.md#costs-and-settlement: a cost from a header or a function; 2^64 or more is
// 413 without a Redis call, and so is (from Redis) a cost the limit can never hold.
func TestCostsFromTheRequest(t *testing.T) {
	bothModes(t, func(t *testing.T, rs *server, mode redisrl.Option) {
		l := rs.limiter(t, mode)
		window := redisrl.MustWindow(10, time.Minute, redisrl.Fixed)
		mw := mustNew(t, l, []Rule{
			{Path: "/units", CostHeader: "X-Units", Limits: []Limit{{Name: "units", Spec: window, Key: IP()}}},
			{Path: "/size", Limits: []Limit{{Name: "size", Spec: window, Key: IP()}},
				CostFunc: func(r *http.Request) (uint64, error) {
					switch r.URL.Query().Get("n") {
					case "huge":
						return 0, fmt.Errorf("sized: %w", ErrCostTooLarge)
					case "bad":
						return 0, errors.New("cannot size")
					}
					return uint64(len(r.URL.Query().Get("n"))), nil
				}},
		})
		s := serve(t, mw)
		left := func(key string) uint64 { return remaining(t, l, key, window).Remaining }
		for _, c := range []struct {
			units  []string
			status int
			left   uint64
		}{
			{[]string{"3"}, 200, 7},
			{nil, 200, 6},                // absent: 1
			{[]string{"0"}, 200, 5},      // 0: 1, never free
			{[]string{"abc"}, 200, 4},    // not a number: 1
			{[]string{" 2 "}, 200, 2},    // spaces around it
			{[]string{"1", "1"}, 200, 1}, // two lines are "1, 1": not a number
			{[]string{"11"}, 413, 1},     // more than the limit holds: Redis says never
			{[]string{"18446744073709551615"}, 413, 1},
		} {
			var hdr []string
			for _, u := range c.units {
				hdr = append(hdr, "X-Units", u)
			}
			r := get(t, s.URL+"/units", hdr...)
			if r.status != c.status || (c.status == 413 && (r.body["error"] != "request_too_large" || r.header.Get("Retry-After") != "")) {
				t.Errorf("X-Units %q: %d %v %v", c.units, r.status, r.header, r.body)
			}
			if n := left("units:{ip:127.0.0.1}"); n != c.left {
				t.Errorf("X-Units %q: %d left, want %d", c.units, n, c.left)
			}
		}
		calls, denied := counter(l, "redis_calls"), counter(l, "denied")
		for _, huge := range []string{"18446744073709551616", "99999999999999999999999999"} {
			r := get(t, s.URL+"/units", "X-Units", huge)
			if r.status != 413 || r.body["error"] != "request_too_large" || r.body["policy"] != "units" || r.header.Get("Retry-After") != "" || r.header.Get("RateLimit") != "" {
				t.Errorf("X-Units %s: %d %v %v", huge, r.status, r.header, r.body)
			}
		}
		if r := get(t, s.URL+"/size?n=huge"); r.status != 413 {
			t.Errorf("ErrCostTooLarge: %d", r.status)
		}
		if n := counter(l, "redis_calls"); n != calls {
			t.Errorf("a cost of 2^64 or more made %d Redis calls", n-calls)
		}
		if n := counter(l, "denied"); n != denied+3 {
			t.Errorf("denied %d, want %d", n, denied+3)
		}
		if r := get(t, s.URL+"/size?n=bad"); r.status != 500 || r.body["error"] != "limiter_error" {
			t.Errorf("a failing cost function: %d %v", r.status, r.body)
		}
		if r := get(t, s.URL+"/size?n=xxxx"); r.status != 200 || left("size:{ip:127.0.0.1}") != 6 {
			t.Errorf("a cost of 4 from the function: %d", r.status)
		}
		if r := get(t, s.URL+"/size?n="); r.status != 200 || left("size:{ip:127.0.0.1}") != 6 {
			t.Errorf("a cost of 0 from the function is free: %d", r.status)
		}
		if _, err := New(l, []Rule{{Cost: 2, CostHeader: "X-Units", Limits: []Limit{{Name: "units", Spec: window, Key: IP()}}}}); err == nil {
			t.Error("Cost and CostHeader together")
		}
	})
}

// docs/clients.md#costs-and-settlement: a reported cost beyond what the limit's arithmetic
// holds is recorded as the most it holds and counted in errors (one FORCE per key, as the
// Rust layer: 1 Redis call); the key stays used up.
func TestAReportedCostBeyondTheArithmeticRecordsTheMostItHolds(t *testing.T) {
	bothModes(t, func(t *testing.T, rs *server, mode redisrl.Option) {
		l := rs.limiter(t, mode)
		peek := rs.limiter(t, mode)
		g := redisrl.MustGCRA(5, 1, time.Minute)
		f := redisrl.MustWindow(5, time.Minute, redisrl.Fixed)
		var logs logBuffer
		mw := mustNew(t, l, []Rule{
			{Path: "/g", Limits: []Limit{{Name: "g", Spec: g, Key: Header("X-API-Key")}}},
			{Path: "/f", Limits: []Limit{{Name: "f", Spec: f, Key: Header("X-API-Key")}}},
		}, WithLogger(logs.logger()))
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("cost") == "huge" {
				ReportCost(r.Context(), 1<<64-1)
			}
			fmt.Fprint(w, "ok")
		})
		s := httptest.NewServer(mw.Handler(mux))
		t.Cleanup(s.Close)
		key := func(p string) string { return p + ":{hdr.x-api-key:k}" }
		remaining(t, l, "warm-up", g) // the fallback's library is looked up on the first call
		calls := counter(l, "redis_calls")
		if r := get(t, s.URL+"/g?cost=huge", "X-API-Key", "k"); r.status != 200 {
			t.Fatal(r.status)
		}
		if n := counter(l, "redis_calls") - calls; n != 2 {
			t.Errorf("the check and one FORCE: %d Redis calls", n)
		}
		// The key's time is pushed to about 2554: beyond what a Duration holds (292 years).
		if d := remaining(t, peek, key("g"), g); d.Remaining != 0 || d.ResetAfter < 250*365*24*time.Hour {
			t.Errorf("g after 2^64-1: %+v", d)
		}
		if r := get(t, s.URL+"/g", "X-API-Key", "k"); r.status != 429 {
			t.Errorf("g is used up: %d", r.status)
		}
		for range 2 {
			if r := get(t, s.URL+"/f", "X-API-Key", "k"); r.status != 200 {
				t.Fatal(r.status)
			}
		}
		if r := get(t, s.URL+"/f?cost=huge", "X-API-Key", "k"); r.status != 200 { // 3 + (2^64 - 2) passes 2^64 - 1
			t.Fatal(r.status)
		}
		if d := remaining(t, peek, key("f"), f); d.Remaining != 0 {
			t.Errorf("f after 2^64-1: %+v", d)
		}
		if r := get(t, s.URL+"/f", "X-API-Key", "k"); r.status != 429 {
			t.Errorf("f is used up: %d", r.status)
		}
		if e, dg := counter(l, "errors"), counter(l, "degraded"); e != 2 || dg != 0 {
			t.Errorf("errors %d (one per reported cost not recorded in full), degraded %d", e, dg)
		}
		if n := logs.count("beyond what the limit's arithmetic holds"); n != 1 {
			t.Errorf("warned %d times, want once:\n%s", n, logs.buf.String())
		}
	})
}

// docs/clients.md#costs-and-settlement: FORCE refuses LOG, so on a LOG limit the extra of a
// reported cost is left out (warned once), while the rule's other limits record it; a
// smaller report is refunded on every limit (counted in refunded).
func TestALogLimitLeavesAReportedExtraOut(t *testing.T) {
	bothModes(t, func(t *testing.T, rs *server, mode redisrl.Option) {
		l := rs.limiter(t, mode)
		logWin := redisrl.MustWindow(10, time.Minute, redisrl.Log)
		fixed := redisrl.MustWindow(10, time.Minute, redisrl.Fixed)
		var logs logBuffer
		mw := mustNew(t, l, []Rule{{Cost: 2, Limits: []Limit{
			{Name: "log", Spec: logWin, Key: IP()},
			{Name: "fixed", Spec: fixed, Key: IP()},
		}}}, WithLogger(logs.logger()))
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			var n uint64
			fmt.Sscan(r.URL.Query().Get("cost"), &n)
			ReportCost(r.Context(), n)
		})
		s := httptest.NewServer(mw.Handler(mux))
		t.Cleanup(s.Close)
		for range 2 {
			if r := get(t, s.URL+"/?cost=4"); r.status != 200 {
				t.Fatal(r.status)
			}
		}
		if a, b := remaining(t, l, "log:{ip:127.0.0.1}", logWin).Remaining, remaining(t, l, "fixed:{ip:127.0.0.1}", fixed).Remaining; a != 6 || b != 2 {
			t.Errorf("log %d left (the charge only), fixed %d left (the report)", a, b)
		}
		if n := logs.count("not recorded on a LOG limit"); n != 1 {
			t.Errorf("warned %d times, want once:\n%s", n, logs.buf.String())
		}
		refunded := counter(l, "refunded")
		if r := get(t, s.URL+"/?cost=1"); r.status != 200 {
			t.Fatal(r.status)
		}
		if a, b := remaining(t, l, "log:{ip:127.0.0.1}", logWin).Remaining, remaining(t, l, "fixed:{ip:127.0.0.1}", fixed).Remaining; a != 5 || b != 1 {
			t.Errorf("after a report below the charge: log %d, fixed %d", a, b)
		}
		if n := counter(l, "refunded") - refunded; n != 2 {
			t.Errorf("refunded %d, want 1 on each limit", n)
		}
		if n := counter(l, "errors"); n != 0 {
			t.Errorf("errors %d", n)
		}
	})
}

// docs/clients.md#deduct_when: a lease held by a request is released when the request ends
// for any reason: the response finished, the client went away, the handler panicked (the
// panic goes on). No free slot is a 429 that charges nothing. The lease time (a minute) is
// far longer than the test: only a release frees the slot.
func TestALeaseIsHeldByTheRequestUntilItEnds(t *testing.T) {
	bothModes(t, func(t *testing.T, rs *server, mode redisrl.Option) {
		l := rs.limiter(t, mode)
		jobs := redisrl.MustLease(1, time.Minute)
		rate := redisrl.MustWindow(100, time.Minute, redisrl.Fixed)
		mw := mustNew(t, l, []Rule{{Limits: []Limit{
			{Name: "rate", Spec: rate, Key: Header("X-User")},
			{Name: "jobs", Spec: jobs, Key: Header("X-User")},
		}}})
		entered, left := make(chan struct{}, 1), make(chan struct{}, 1)
		finish := make(chan struct{})
		var sawGuard bool
		mux := http.NewServeMux()
		mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
			g, ok := LeaseFrom(r.Context(), "jobs")
			sawGuard = ok && g.Err() == nil
			entered <- struct{}{}
			<-finish
			fmt.Fprint(w, "held")
		})
		mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
			defer func() { left <- struct{}{} }()
			entered <- struct{}{}
			<-r.Context().Done() // until the client goes away
		})
		mux.HandleFunc("/panic", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
		mux.HandleFunc("/quick", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "quick") })
		var recovered any
		var rmu sync.Mutex
		outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					rmu.Lock()
					recovered = v
					rmu.Unlock()
					w.WriteHeader(599)
				}
			}()
			mw.Handler(mux).ServeHTTP(w, r)
		})
		s := httptest.NewServer(outer)
		t.Cleanup(s.Close)
		user := []string{"X-User", "u1"}

		// 1. Held while the response is on its way; a second request finds no slot.
		done := make(chan reply, 1)
		go func() { done <- get(t, s.URL+"/hold", user...) }()
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the handler was not entered")
		}
		r := get(t, s.URL+"/quick", user...)
		if r.status != 429 || r.body["error"] != "rate_limited" || r.body["policy"] != "jobs" || r.header.Get("Retry-After") == "" {
			t.Errorf("no free slot: %d %v %v", r.status, r.header, r.body)
		}
		if n := remaining(t, l, "rate:{hdr.x-user:u1}", rate).Remaining; n != 99 {
			t.Errorf("a request that found no slot was charged: %d left", n)
		}
		if r := get(t, s.URL+"/quick", "X-User", "u2"); r.status != 200 {
			t.Errorf("another user has a slot of their own: %d", r.status)
		}
		close(finish)
		select {
		case r := <-done:
			if r.status != 200 || r.text != "held" || !sawGuard {
				t.Errorf("the holder: %d %q (guard in the context: %v)", r.status, r.text, sawGuard)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the holder did not finish")
		}
		r = get(t, s.URL+"/quick", user...)
		if r.status != 200 || !strings.Contains(r.header.Get("RateLimit-Policy"), `"jobs";q=1;qu="concurrent-requests"`) || !strings.Contains(r.header.Get("RateLimit"), `"jobs";r=0`) {
			t.Errorf("released when the response finished: %d %v", r.status, r.header)
		}

		// 2. The client goes away: released when the handler returns.
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/wait", nil)
		req.Header.Set("X-User", "u1")
		gone := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			gone <- err
		}()
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting handler was not entered")
		}
		if r := get(t, s.URL+"/quick", user...); r.status != 429 {
			t.Errorf("held while waiting: %d", r.status)
		}
		cancel()
		<-gone
		select {
		case <-left:
		case <-time.After(10 * time.Second):
			t.Fatal("the handler did not see the client go")
		}
		waitFor(t, "the slot of a request whose client went away", func() bool { return get(t, s.URL+"/quick", user...).status == 200 })

		// 3. The handler panics: released, and the panic goes on.
		if r := get(t, s.URL+"/panic", user...); r.status != 599 {
			t.Errorf("the panic did not reach the outer handler: %d", r.status)
		}
		rmu.Lock()
		v := recovered
		rmu.Unlock()
		if v != "boom" {
			t.Errorf("recovered %v, want the handler's panic", v)
		}
		if r := get(t, s.URL+"/quick", user...); r.status != 200 {
			t.Errorf("released after a panic: %d", r.status)
		}
	})
}

// A rule of a lease alone: the RateLimit fields are the lease's; under FailClosed with Redis
// down the request is 503, not a quota's 429.
func TestALeaseAloneAndTheClosedPolicy(t *testing.T) {
	rs := startServer(t)
	rule := []Rule{{Limits: []Limit{{Name: "conc", Spec: redisrl.MustLease(2, time.Minute), Key: IP()}}}}
	s := serve(t, mustNew(t, rs.limiter(t), rule))
	r := get(t, s.URL+"/")
	if r.status != 200 || r.header.Get("RateLimit-Policy") != `"conc";q=2;qu="concurrent-requests"` || !strings.HasPrefix(r.header.Get("RateLimit"), `"conc";r=1;`) {
		t.Errorf("%d %v", r.status, r.header)
	}
	closed := serve(t, mustNew(t, rs.limiter(t, redisrl.WithFailurePolicy(redisrl.FailClosed)), rule))
	failing := serve(t, mustNew(t, rs.limiter(t, redisrl.WithFailurePolicy(redisrl.FailError)), rule))
	rs.stop()
	for _, s := range []*httptest.Server{closed, failing} {
		if r := get(t, s.URL+"/"); r.status != 503 || r.body["error"] != "limiter_unavailable" || r.header.Get("Retry-After") == "" {
			t.Errorf("%d %v %v", r.status, r.header, r.body)
		}
	}
}

// LeaseFrom on a request that holds no lease of that name (an exempt path, a rule without a
// Lease, a context the middleware never saw) is nil, false, never a panic: a handler may ask
// on every request. (It panicked on a context without the middleware's leases.)
func TestLeaseFromWithoutALeaseIsNothing(t *testing.T) {
	if g, ok := LeaseFrom(context.Background(), "jobs"); ok || g != nil {
		t.Errorf("no middleware: %v %v", g, ok)
	}
	rs := startServer(t)
	rules := []Rule{
		{Path: "/rate", Limits: []Limit{{Name: "rate", Spec: redisrl.MustWindow(10, time.Minute, redisrl.Fixed), Key: IP()}}},
		{Path: "/jobs", Limits: []Limit{{Name: "jobs", Spec: redisrl.MustLease(1, time.Minute), Key: IP()}}},
	}
	mw := mustNew(t, rs.limiter(t), rules, WithExemptPaths("/health"))
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, held := LeaseFrom(r.Context(), "jobs")
		fmt.Fprintf(w, "%v", held)
	})
	s := httptest.NewServer(mw.Handler(mux))
	t.Cleanup(s.Close)
	for path, want := range map[string]string{"/health": "false", "/rate": "false", "/other": "false", "/jobs": "true"} {
		resp, err := s.Client().Get(s.URL + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != want {
			t.Errorf("%s: %d %q, want 200 %q", path, resp.StatusCode, body, want)
		}
	}
}

func TestHeaderCost(t *testing.T) {
	for _, c := range []struct {
		lines []string
		cost  uint64
		never bool
	}{
		{nil, 1, false},
		{[]string{""}, 1, false},
		{[]string{"abc"}, 1, false},
		{[]string{"0"}, 1, false},
		{[]string{" 7 "}, 7, false},
		{[]string{"-3"}, 1, false},
		{[]string{"+3"}, 1, false},
		{[]string{"18446744073709551615"}, 1<<64 - 1, false},
		{[]string{"18446744073709551616"}, 0, true},
	} {
		if n, never := HeaderCost(c.lines); n != c.cost || never != c.never {
			t.Errorf("%q: %d %v", c.lines, n, never)
		}
	}
}

// docs/clients.md#no-usable-client-address: a real net/http server on a Unix socket has no IP
// peer: the ip identity is the one shared "unknown" bucket, counted peer_unknown once per
// request (not once per limit) and warned once; "unix" trusted reads the proxy's header.
func TestNoUsableClientAddressIsCountedOncePerRequestAndWarnedOnce(t *testing.T) {
	rs := startServer(t)
	l := rs.limiter(t)
	var logs logBuffer
	rules := []Rule{{Limits: []Limit{
		{Name: "a", Spec: redisrl.MustWindow(3, time.Minute, redisrl.Fixed), Key: IP()},
		{Name: "b", Spec: redisrl.MustWindow(3, time.Minute, redisrl.Fixed), Key: Header("X-API-Key")}, // missing: by IP
	}}}
	sock := filepath.Join(t.TempDir(), "rl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mustNew(t, l, rules, WithLogger(logs.logger())).Handler(http.NotFoundHandler()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	var got []int
	for range 4 {
		resp, err := client.Get("http://rl/x")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = append(got, resp.StatusCode)
	}
	if fmt.Sprint(got) != "[404 404 404 429]" {
		t.Errorf("one shared bucket: %v", got)
	}
	if n := counter(l, "peer_unknown"); n != 4 {
		t.Errorf("peer_unknown %d, want one per request", n)
	}
	if n := logs.count("no usable client address"); n != 1 {
		t.Errorf("warned %d times:\n%s", n, logs.buf.String())
	}
	for _, k := range []string{"a:{ip:unknown}", "b:{ip:unknown}"} {
		if d := remaining(t, l, k, redisrl.MustWindow(3, time.Minute, redisrl.Fixed)); d.Remaining != 0 {
			t.Errorf("%s: %+v", k, d)
		}
	}
}
