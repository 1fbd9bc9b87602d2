package rlhttp

// The middleware through real net/http servers (httptest.NewServer listens on loopback)
// against a real redis-server with the module.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

type reply struct {
	status int
	header http.Header
	body   map[string]any
	text   string
}

func get(t *testing.T, url string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, text: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &r.body); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	return r
}

func serve(t *testing.T, mw *Middleware) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d, ok := DecisionFrom(r.Context())
		fmt.Fprintf(w, "ok %v %d", ok, d.Remaining)
	})
	s := httptest.NewServer(mw.Handler(mux))
	t.Cleanup(s.Close)
	return s
}

func mustNew(t *testing.T, l *redisrl.Client, rules []Rule, opts ...Option) *Middleware {
	t.Helper()
	m, err := New(l, rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Two services behind a load balancer: two servers on two ports, each with its own limiter
// (its own connection pool), share one limit in Redis.
func TestTwoServersOnTwoPortsShareOneLimit(t *testing.T) {
	rs := startServer(t)
	rules := []Rule{{Limits: []Limit{{Name: "ip", Spec: redisrl.MustWindow(5, time.Minute, redisrl.Fixed), Key: IP()}}}}
	a := serve(t, mustNew(t, rs.limiter(t), rules))
	b := serve(t, mustNew(t, rs.limiter(t), rules))
	var statuses []int
	for i := range 6 {
		url := a.URL
		if i%2 == 1 {
			url = b.URL
		}
		r := get(t, url+"/api")
		statuses = append(statuses, r.status)
		if r.status == 200 {
			if r.header.Get("RateLimit-Policy") != `"ip";q=5;w=60` || !strings.HasPrefix(r.header.Get("RateLimit"), `"ip";r=`) {
				t.Errorf("admitted response fields: %v", r.header)
			}
			if !strings.HasPrefix(r.text, "ok true ") {
				t.Errorf("the decision is not in the context: %q", r.text)
			}
		}
		if i == 5 {
			if r.status != 429 || r.body["error"] != "rate_limited" || r.body["policy"] != "ip" || r.header.Get("Retry-After") == "" {
				t.Errorf("the 6th: %d %v %v", r.status, r.header, r.body)
			}
			if ra, _ := r.body["retry_after"].(float64); fmt.Sprint(ra) != r.header.Get("Retry-After") {
				t.Errorf("retry_after %v, Retry-After %q", r.body["retry_after"], r.header.Get("Retry-After"))
			}
		}
	}
	if fmt.Sprint(statuses) != "[200 200 200 200 200 429]" {
		t.Errorf("%v", statuses)
	}
}

func TestIdentitiesStayApartAndMissingOnesAreNeverNoLimit(t *testing.T) {
	rs := startServer(t)
	rule := Rule{Path: "/api", Limits: []Limit{
		{Name: "key", Spec: redisrl.MustWindow(2, time.Minute, redisrl.Fixed), Key: Header("X-API-Key")},
		{Name: "ip", Spec: redisrl.MustWindow(3, time.Minute, redisrl.Fixed), Key: IP()},
	}}
	l := rs.limiter(t)
	s := serve(t, mustNew(t, l, []Rule{rule}))
	// Rotating API keys: each key gets its own bucket, the IP's 3 still hold.
	var got []int
	for i := range 4 {
		got = append(got, get(t, s.URL+"/api/x", "X-API-Key", fmt.Sprintf("k%d", i)).status)
	}
	if fmt.Sprint(got) != "[200 200 200 429]" {
		t.Errorf("rotating keys: %v", got)
	}
	// The IP-only path is outside the rule.
	if r := get(t, s.URL+"/other"); r.status != 200 || r.header.Get("RateLimit") != "" {
		t.Errorf("outside the rule: %d %v", r.status, r.header)
	}
	// A missing API key counts by the IP (never "no limit"): the key limit's bucket is the IP.
	rs2 := startServer(t)
	s2 := serve(t, mustNew(t, rs2.limiter(t), []Rule{rule}))
	got = nil
	for range 3 {
		got = append(got, get(t, s2.URL+"/api").status)
	}
	if fmt.Sprint(got) != "[200 200 429]" {
		t.Errorf("keyless: %v", got)
	}
	// MissingDeny: 401.
	deny := rule
	deny.Missing = MissingDeny
	s3 := serve(t, mustNew(t, rs2.limiter(t), []Rule{deny}))
	if r := get(t, s3.URL+"/api"); r.status != 401 || r.body["error"] != "identity_required" || r.body["policy"] != "key" {
		t.Errorf("%d %v", r.status, r.body)
	}
	// The keys are the contract's layout (docs/clients.md#key-layout): the buckets above
	// hold what the requests took.
	for _, c := range []struct {
		key  string
		spec redisrl.Spec
		left uint64
	}{
		{"key:{hdr.x-api-key:k0}", redisrl.MustWindow(2, time.Minute, redisrl.Fixed), 1},
		{"ip:{ip:127.0.0.1}", redisrl.MustWindow(3, time.Minute, redisrl.Fixed), 0},
	} {
		d, err := l.Check(t.Context(), c.key, c.spec, redisrl.Cost(0))
		if err != nil || d.Remaining != c.left || d.ResetAfter == 0 {
			t.Errorf("%s: %+v %v", c.key, d, err)
		}
	}
}

func TestNeverIs413AndClosedIs503(t *testing.T) {
	rs := startServer(t)
	big := Rule{Cost: 10, Limits: []Limit{{Name: "small", Spec: redisrl.MustGCRA(5, 1, time.Second), Key: IP()}}}
	s := serve(t, mustNew(t, rs.limiter(t), []Rule{big}))
	if r := get(t, s.URL+"/"); r.status != 413 || r.body["error"] != "request_too_large" || r.header.Get("Retry-After") != "" {
		t.Errorf("%d %v %v", r.status, r.header, r.body)
	}
	closed := rs.limiter(t, redisrl.WithFailurePolicy(redisrl.FailClosed))
	errs := rs.limiter(t, redisrl.WithFailurePolicy(redisrl.FailError))
	open := rs.limiter(t, redisrl.WithFailurePolicy(redisrl.FailOpen))
	rule := []Rule{{Limits: []Limit{{Name: "ip", Spec: redisrl.MustGCRA(5, 1, time.Second), Key: IP()}}}}
	sc, se, so := serve(t, mustNew(t, closed, rule)), serve(t, mustNew(t, errs, rule)), serve(t, mustNew(t, open, rule))
	rs.stop()
	for _, s := range []*httptest.Server{sc, se} {
		r := get(t, s.URL+"/")
		if r.status != 503 || r.body["error"] != "limiter_unavailable" || r.header.Get("Retry-After") != "1" || r.header.Get("RateLimit") != "" {
			t.Errorf("%d %v %v", r.status, r.header, r.body)
		}
	}
	if r := get(t, so.URL+"/"); r.status != 200 || r.header.Get("RateLimit") != "" {
		t.Errorf("open: %d %v", r.status, r.header)
	}
}

// Under FailLocal an outage is decided by the in-memory limits: 429 with the RateLimit fields
// of the local figures and the quota's JSON body, not 503 (docs/clients.md#decided-details-every-package-every-middleware).
func TestLocalAnswers429WithTheLocalNumbersDuringAnOutage(t *testing.T) {
	rs := startServer(t)
	rule := []Rule{{Path: "/", Limits: []Limit{{Name: "api", Spec: redisrl.MustWindow(2, time.Minute, redisrl.Fixed), Key: Header("X-API-Key")}}}}
	s := serve(t, mustNew(t, rs.limiter(t, redisrl.WithFailurePolicy(redisrl.FailLocal)), rule))
	rs.stop()
	var got []reply
	for range 3 {
		got = append(got, get(t, s.URL+"/", "X-API-Key", "k"))
	}
	if got[0].status != 200 || got[1].status != 200 || got[2].status != 429 {
		t.Fatalf("%d %d %d", got[0].status, got[1].status, got[2].status)
	}
	if !strings.HasPrefix(got[0].header.Get("RateLimit"), `"api";r=1;t=`) || !strings.HasPrefix(got[2].header.Get("RateLimit"), `"api";r=0;t=`) {
		t.Errorf("%v / %v", got[0].header, got[2].header)
	}
	if got[2].body["error"] != "rate_limited" || got[2].header.Get("Retry-After") == "" {
		t.Errorf("%v %v", got[2].header, got[2].body)
	}
}

func TestExemptionsPreflightsAndTheDenialHandler(t *testing.T) {
	rs := startServer(t)
	rule := []Rule{{Methods: []string{"GET", "OPTIONS"}, Limits: []Limit{{Name: "one", Spec: redisrl.MustWindow(1, time.Minute, redisrl.Fixed), Key: IP()}}}}
	var denied []Denial
	mw := mustNew(t, rs.limiter(t), rule,
		WithExempt(func(r *http.Request) bool { return r.URL.Path == "/health" }),
		WithDenied(func(w http.ResponseWriter, r *http.Request, d Denial) {
			denied = append(denied, d)
			w.WriteHeader(418)
		}))
	s := serve(t, mw)
	if r := get(t, s.URL+"/"); r.status != 200 {
		t.Fatal(r.status)
	}
	if r := get(t, s.URL+"/health"); r.status != 200 {
		t.Errorf("exempt: %d", r.status)
	}
	req, _ := http.NewRequest("OPTIONS", s.URL+"/", nil)
	req.Header.Set("Origin", "https://a.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a CORS preflight is exempt by default: %d", resp.StatusCode)
	}
	if r := get(t, s.URL+"/"); r.status != 418 || len(denied) != 1 || denied[0].Status != 429 || denied[0].Policy != "one" {
		t.Errorf("%d %+v", r.status, denied)
	}
}

func TestTrustedProxiesNameTheClient(t *testing.T) {
	rs := startServer(t)
	ip, err := ClientIP{}.Trusted("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	rule := []Rule{{Limits: []Limit{{Name: "ip", Spec: redisrl.MustWindow(1, time.Minute, redisrl.Fixed), Key: IP()}}}}
	l := rs.limiter(t)
	s := serve(t, mustNew(t, l, rule, WithClientIP(ip)))
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		if r := get(t, s.URL+"/", "X-Forwarded-For", "6.6.6.6, "+client); r.status != 200 {
			t.Errorf("%s: %d", client, r.status)
		}
	}
	if r := get(t, s.URL+"/", "X-Forwarded-For", "198.51.100.1"); r.status != 429 {
		t.Errorf("the same client again: %d", r.status)
	}
	if r := get(t, s.URL+"/", "X-Forwarded-For", "garbage"); r.status != 200 {
		t.Errorf("an unusable header falls back to the peer: %d", r.status)
	}
	if n, _ := l.Counters().Get("forwarded_unusable"); n != 1 {
		t.Errorf("forwarded_unusable %d", n)
	}
}

func TestOneNameIsOneBucket(t *testing.T) {
	rs := startServer(t)
	l := rs.limiter(t)
	a := Rule{Name: "api", Limits: []Limit{{Name: "ip", Spec: redisrl.MustWindow(5, time.Minute, redisrl.Fixed), Key: IP()}}}
	b := Rule{Name: "login", Limits: []Limit{{Name: "ip", Spec: redisrl.MustWindow(3, time.Minute, redisrl.Fixed), Key: IP()}}}
	_, err := New(l, []Rule{a, b})
	if err == nil || !strings.Contains(err.Error(), "in api and login") {
		t.Errorf("%v", err)
	}
	same := b
	same.Limits = a.Limits
	if _, err := New(l, []Rule{a, same}); err != nil {
		t.Errorf("the same limit under one name in two rules is one bucket on purpose: %v", err)
	}
	if _, err := New(l, []Rule{{Limits: []Limit{{Name: "", Spec: redisrl.MustWindow(1, time.Second, redisrl.Fixed), Key: IP()}}}}); err == nil {
		t.Error("an empty name")
	}
}

// docs/clients.md#routes: per-route limits key on the matched route, so spellings of one
// path and the ids of one template share one bucket; requests matching no route share one.
func TestRouteKeysOnTheMatchedPattern(t *testing.T) {
	rs := startServer(t)
	l := rs.limiter(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "user") })
	rule := []Rule{{Limits: []Limit{{Name: "route", Spec: redisrl.MustWindow(2, time.Minute, redisrl.Fixed), Key: Route()}}}}
	s := httptest.NewServer(mustNew(t, l, rule, WithServeMux(mux)).Handler(mux))
	t.Cleanup(s.Close)
	var got []int
	for _, p := range []string{"/users/1", "/users/2", "/users/3"} {
		got = append(got, get(t, s.URL+p).status)
	}
	if fmt.Sprint(got) != "[200 200 429]" {
		t.Errorf("one template, one bucket: %v", got)
	}
	got = nil
	for _, p := range []string{"/nope", "/other", "/third"} {
		got = append(got, get(t, s.URL+p).status)
	}
	if fmt.Sprint(got) != "[404 404 429]" {
		t.Errorf("no route, one bucket: %v", got)
	}
	for _, key := range []string{"route:{route:GET%20/users/%7Bid%7D}", "route:{route:GET%20%28no%20route%29}"} {
		d, err := l.Check(t.Context(), key, redisrl.MustWindow(2, time.Minute, redisrl.Fixed), redisrl.Cost(0))
		if err != nil || d.Remaining != 0 {
			t.Errorf("%s: %+v %v", key, d, err)
		}
	}
	// Without the mux the middleware keys by the normalised path.
	plain := httptest.NewServer(mustNew(t, rs.limiter(t), rule).Handler(mux))
	t.Cleanup(plain.Close)
	got = nil
	for _, p := range []string{"/users/1", "/users//1/", "/users/2"} {
		got = append(got, get(t, plain.URL+p).status)
	}
	// "/users//1/" is "/users/1" (the mux answers it with a redirect, counted too).
	if got[0] != 200 || got[1]/100 != 3 || got[2] != 200 {
		t.Errorf("by path: %v", got)
	}
	if r := get(t, plain.URL+"/users/1"); r.status != 429 {
		t.Errorf("/users/1 a third time: %d", r.status)
	}
}

func TestLimitStringsAreNamedByTheirWindows(t *testing.T) {
	l, err := ParseLimits("api", "20/minute; 200 per hour; 5/60s", IP())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range l {
		names = append(names, x.Name)
	}
	if fmt.Sprint(names) != "[api-60s api-3600s api-60s-2]" {
		t.Errorf("%v", names)
	}
	one, _ := ParseLimits("login", "5/minute", IP())
	if len(one) != 1 || one[0].Name != "login" {
		t.Errorf("%+v", one)
	}
	g := redisrl.MustGCRA(10, 1, time.Second) // fills in 10 s
	if got := Named("b", IP(), g, redisrl.MustWindow(1, 500*time.Millisecond, redisrl.Fixed)); got[0].Name != "b-10s" || got[1].Name != "b-1s" {
		t.Errorf("%+v", got)
	}
	if _, err := ParseLimits("x", "10/fortnight", IP()); err == nil {
		t.Error("a bad unit")
	}
}

// docs/clients.md#deduct_when and #costs-and-settlement: the charge is settled on the status
// being sent: refunded when DeductWhen says so, or moved to the cost the handler reported.
func TestDeductWhenAndReportedCostsSettleOnTheStatus(t *testing.T) {
	rs := startServer(t)
	l := rs.limiter(t)
	window := redisrl.MustWindow(10, time.Minute, redisrl.Fixed)
	rule := []Rule{{
		Limits:     []Limit{{Name: "ip", Spec: window, Key: IP()}},
		DeductWhen: func(status int) bool { return status < 500 },
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		if !ReportCost(r.Context(), 5) {
			t.Error("ReportCost refused")
		}
		fmt.Fprint(w, "done")
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		ReportCost(r.Context(), 0)
		w.WriteHeader(204)
	})
	mux.HandleFunc("/quiet", func(w http.ResponseWriter, r *http.Request) {})
	s := httptest.NewServer(mustNew(t, l, rule).Handler(mux))
	t.Cleanup(s.Close)
	left := func() uint64 {
		d, err := l.Check(t.Context(), "ip:{ip:127.0.0.1}", window, redisrl.Cost(0))
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	for range 3 {
		if r := get(t, s.URL+"/fail"); r.status != 500 {
			t.Fatal(r.status)
		}
	}
	if n := left(); n != 10 {
		t.Errorf("server errors were charged: %d left", n)
	}
	get(t, s.URL+"/big")
	if n := left(); n != 5 {
		t.Errorf("a reported cost of 5: %d left", n)
	}
	get(t, s.URL+"/small")
	if n := left(); n != 5 {
		t.Errorf("a reported cost of 0: %d left", n)
	}
	get(t, s.URL+"/quiet")
	if n := left(); n != 4 {
		t.Errorf("a handler that wrote nothing sent 200 and is charged: %d left", n)
	}
	if ReportCost(t.Context(), 1) {
		t.Error("ReportCost outside a limited request")
	}
}

// Exemptions and rules match the path with its dot segments resolved (NormalizePath): a
// request for "/static/../api/x" is the "/api/x" a resolving router serves, so it cannot
// pass an "/api/" limit through the "/static/" exemption.
func TestDotSegmentsDoNotEscapeALimitThroughAnExemption(t *testing.T) {
	rs := startServer(t)
	rules := []Rule{{Path: "/api/", Limits: []Limit{{Name: "api", Spec: redisrl.MustWindow(1, time.Minute, redisrl.Fixed), Key: IP()}}}}
	s := serve(t, mustNew(t, rs.limiter(t), rules, WithExemptPaths("/static/")))
	if r := get(t, s.URL+"/static/app.js"); r.status != 200 || r.header.Get("RateLimit") != "" {
		t.Fatalf("the exemption itself: %d %v", r.status, r.header)
	}
	if r := get(t, s.URL+"/api/x"); r.status != 200 {
		t.Fatalf("first: %d", r.status)
	}
	for _, p := range []string{"/static/../api/x", "/static/%2e%2e/api/x", "/static/./../api/x/", "/static/%2E%2E%2Fapi/x"} {
		if r := get(t, s.URL+p); r.status != 429 || !strings.HasPrefix(r.header.Get("RateLimit"), `"api";r=0;`) {
			t.Errorf("%s: %d %v, want the api limit's 429", p, r.status, r.header)
		}
	}
}
