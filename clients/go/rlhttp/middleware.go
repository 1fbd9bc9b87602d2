package rlhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

// Missing is what a rule does when a limit's key function finds no identity in a request
// (docs/clients.md#a-missing-identity-is-never-no-limit).
type Missing uint8

const (
	// MissingIP counts the request under the client's IP instead (the default).
	MissingIP Missing = iota
	// MissingDeny answers 401 with {"error": "identity_required", ...}.
	MissingDeny
	// MissingSkip does not apply the limit (an explicit opt-in, counted as skipped).
	MissingSkip
)

// found is what a key function found in a request.
type found struct {
	value    string
	ok       bool
	unusable bool // a forwarding header was unusable (the peer was taken)
	unknown  bool // no usable client address: the shared UnknownIP bucket
}

// env is what key functions see besides the request: the client-IP rule and the route the
// router would pick (WithServeMux).
type env struct {
	ip      ClientIP
	pattern string
	routed  bool // pattern comes from the router ("" then means no route: a 404)
}

// Key is a key function: the identity a limit counts by (its kind, part of every key) and
// its value for a request, or nothing when the request does not carry it.
type Key struct {
	kind string
	fn   func(r *http.Request, env env) found
}

// Kind is the identity kind written in the key ("ip", "hdr.x-api-key", "route", ...).
func (k Key) Kind() string { return k.kind }

// IP keys by the client's address under the middleware's ClientIP rule (WithClientIP): kind
// "ip". A request without a usable address counts in the one shared UnknownIP bucket.
func IP() Key {
	return Key{kind: "ip", fn: func(r *http.Request, e env) found {
		k, ok, unusable := e.ip.FromRequest(r)
		if !ok {
			return found{value: UnknownIP, ok: true, unusable: unusable, unknown: true}
		}
		return found{value: k, ok: true, unusable: unusable}
	}}
}

// Header keys by a request header (every line, as one list: NormalizeList), kind
// "hdr.<lower-case name>". An absent or empty header is a missing identity.
func Header(name string) Key {
	canonical := http.CanonicalHeaderKey(name)
	return Key{kind: "hdr." + strings.ToLower(name), fn: func(r *http.Request, _ env) found {
		lines := r.Header.Values(canonical)
		if len(lines) == 0 {
			return found{}
		}
		v := NormalizeList(lines)
		return found{value: v, ok: strings.Trim(v, ", ") != ""}
	}}
}

// Route keys by the route, kind "route": one shared limit per endpoint. The route is the
// ServeMux pattern that matches the request: the router's own (WithServeMux(mux): asked with
// mux.Handler, since the middleware runs before the mux routes), else http.Request.Pattern
// when a router set it, else the normalised path (NormalizePath). With WithServeMux, every
// request the mux matches to no route (a 404) is one "<METHOD> (no route)" bucket, as the
// Python package keys them.
func Route() Key {
	return Key{kind: "route", fn: func(r *http.Request, e env) found {
		switch {
		case e.routed && e.pattern == "":
			return found{value: r.Method + " (no route)", ok: true}
		case e.routed:
			return found{value: e.pattern, ok: true}
		case r.Pattern != "":
			return found{value: r.Pattern, ok: true}
		}
		return found{value: NormalizePath(r.URL.EscapedPath()), ok: true}
	}}
}

// Func keys by a function of the request, of the given kind ("fn" when empty; "user" for an
// authenticated user). ok false is a missing identity.
func Func(kind string, f func(r *http.Request) (value string, ok bool)) Key {
	if kind == "" {
		kind = "fn"
	}
	return Key{kind: kind, fn: func(r *http.Request, _ env) found {
		if f == nil {
			return found{}
		}
		v, ok := f(r)
		return found{value: v, ok: ok && v != ""}
	}}
}

// Limit is one limit of a rule: its name (the bucket's name, in the key and the RateLimit
// fields), the limit, and the key function it counts by.
type Limit struct {
	Name string
	Spec redisrl.Spec
	Key  Key
}

// Rule applies its limits to the requests it matches: every limit admits a request or none
// is charged.
type Rule struct {
	// Name names the rule in configuration errors (default "rule <n>").
	Name string
	// Path is a path prefix on the normalised path ("" or "/": every path).
	Path string
	// Methods, when set, restricts the rule to these methods.
	Methods []string
	// Limits are checked together for every matching request.
	Limits []Limit
	// Cost is the units each request costs (0: 1).
	Cost uint64
	// Missing is what to do when a limit's identity is missing (default MissingIP).
	Missing Missing
	// HashTag, when set, is the hash tag of every key of the rule (one RL.ALL on a Cluster).
	HashTag string
	// DeductWhen, when set, decides on the status actually sent whether the request stays
	// charged: false refunds its charge (e.g. func(s int) bool { return s < 500 } charges
	// no server error). A request whose client went away before a status was sent stays
	// charged (docs/clients.md#deduct_when).
	DeductWhen func(status int) bool
}

func (r Rule) matches(req *http.Request, path string) bool {
	if len(r.Methods) > 0 {
		ok := false
		for _, m := range r.Methods {
			if strings.EqualFold(m, req.Method) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	p := strings.TrimSuffix(NormalizePath(r.Path), "/")
	return p == "" || path == p || strings.HasPrefix(path, p+"/")
}

// Denial is a refused request, handed to the denial handler.
type Denial struct {
	// Status is 429 (rate limited), 413 (can never pass), 503 (the limiter could not
	// decide) or 401 (identity required).
	Status int
	// Decision is the limiter's decision (zero for a 401).
	Decision redisrl.Decision
	// Policy is the name of the binding limit.
	Policy string
	// Header holds the fields to send (Retry-After, RateLimit-Policy, RateLimit).
	Header http.Header
	// Body is the JSON body the default handler sends.
	Body string
}

// Middleware limits requests by rules; build it with New and use Handler.
type Middleware struct {
	limiter     *redisrl.Client
	rules       []Rule
	clientIP    ClientIP
	exempt      func(*http.Request) bool
	exemptPaths []string
	denied      func(http.ResponseWriter, *http.Request, Denial)
	xHeaders    bool
	preflight   bool // limit CORS preflights too
	mux         *http.ServeMux
}

// Option configures a Middleware.
type Option func(*Middleware)

// WithClientIP sets the client-IP rule of IP keys (default: the socket peer is the client).
func WithClientIP(c ClientIP) Option { return func(m *Middleware) { m.clientIP = c } }

// WithExempt exempts the requests f returns true for.
func WithExempt(f func(*http.Request) bool) Option { return func(m *Middleware) { m.exempt = f } }

// WithExemptPaths never limits the requests whose normalised path matches one of the
// patterns (health checks, metrics): no Redis call, no RateLimit fields. The syntax is
// MatchPath's: a glob with '*' ("/static/*"), a prefix ending with '/' ("/internal/"), else
// the exact path ("/health"). Several calls add up.
func WithExemptPaths(patterns ...string) Option {
	return func(m *Middleware) { m.exemptPaths = append(m.exemptPaths, patterns...) }
}

// WithDenied replaces the default denial response (JSON with the fields).
func WithDenied(f func(http.ResponseWriter, *http.Request, Denial)) Option {
	return func(m *Middleware) { m.denied = f }
}

// WithServeMux names the mux the middleware wraps, so Route keys by the pattern it will
// route the request to (and a 404 by "<METHOD> (no route)").
func WithServeMux(mux *http.ServeMux) Option { return func(m *Middleware) { m.mux = mux } }

// WithXHeaders adds X-RateLimit-Limit, -Remaining and -Reset.
func WithXHeaders() Option { return func(m *Middleware) { m.xHeaders = true } }

// LimitPreflights limits CORS preflights (OPTIONS with Origin and
// Access-Control-Request-Method), which are exempt by default.
func LimitPreflights() Option { return func(m *Middleware) { m.preflight = true } }

// New builds a middleware on limiter with rules, checking the rules: every limit has a name
// (printable ASCII), a limit and a key function, and one name is one bucket: two rules that
// give one name to two different limits are refused, naming both
// (docs/clients.md#limit-names-are-bucket-names).
func New(limiter *redisrl.Client, rules []Rule, opts ...Option) (*Middleware, error) {
	if limiter == nil {
		return nil, errors.New("rlhttp: New needs a limiter")
	}
	m := &Middleware{limiter: limiter, rules: append([]Rule(nil), rules...)}
	for _, o := range opts {
		o(m)
	}
	type owner struct {
		rule string
		spec redisrl.Spec
	}
	names := map[string]owner{}
	for i := range m.rules {
		r := &m.rules[i]
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule %d", i+1)
		}
		if len(r.Limits) == 0 {
			return nil, fmt.Errorf("rlhttp: %s has no limit", r.Name)
		}
		if strings.ContainsAny(r.HashTag, "{}") {
			return nil, fmt.Errorf("rlhttp: %s: hash tag must hold no braces", r.Name)
		}
		for _, l := range r.Limits {
			if l.Spec == nil || l.Key.fn == nil {
				return nil, fmt.Errorf("rlhttp: %s: limit %q needs a Spec and a Key", r.Name, l.Name)
			}
			if l.Name == "" || strings.IndexFunc(l.Name, func(c rune) bool { return c < 0x20 || c >= 0x7f }) >= 0 {
				return nil, fmt.Errorf("rlhttp: %s: limit name %q must be non-empty printable ASCII", r.Name, l.Name)
			}
			if prev, ok := names[l.Name]; ok && prev.spec != l.Spec {
				return nil, fmt.Errorf("rlhttp: limit name %q names two different limits, in %s and %s: one name is one bucket", l.Name, prev.rule, r.Name)
			}
			names[l.Name] = owner{r.Name, l.Spec}
		}
	}
	return m, nil
}

type ctxKey struct{}

// DecisionFrom returns the decision the middleware made for this request's context.
func DecisionFrom(ctx context.Context) (redisrl.Decision, bool) {
	d, ok := ctx.Value(ctxKey{}).(redisrl.Decision)
	return d, ok
}

func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

func (m *Middleware) exemptPath(path string) bool {
	for _, p := range m.exemptPaths {
		if MatchPath(p, path) {
			return true
		}
	}
	return false
}

type check struct {
	key, name string
	spec      redisrl.Spec
}

// Handler wraps next: func(http.Handler) http.Handler, so it composes with chi, gorilla and
// the standard mux.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL == nil || (!m.preflight && isPreflight(r)) || (m.exempt != nil && m.exempt(r)) {
			next.ServeHTTP(w, r)
			return
		}
		path := NormalizePath(r.URL.EscapedPath())
		if m.exemptPath(path) {
			next.ServeHTTP(w, r)
			return
		}
		var rule *Rule
		for i := range m.rules {
			if m.rules[i].matches(r, path) {
				rule = &m.rules[i]
				break
			}
		}
		if rule == nil {
			next.ServeHTTP(w, r)
			return
		}
		counters := m.limiter.Counters()
		e := env{ip: m.clientIP}
		if m.mux != nil {
			_, e.pattern = m.mux.Handler(r)
			e.routed = true
		}
		var checks []check
		for _, l := range rule.Limits {
			f := l.Key.fn(r, e)
			kind := l.Key.kind
			if !f.ok {
				switch rule.Missing {
				case MissingDeny:
					counters.Add("missing_denied", 1)
					m.deny(w, r, Denial{Status: http.StatusUnauthorized, Policy: l.Name, Header: http.Header{},
						Body: fmt.Sprintf(`{"error": "identity_required", "message": "this request must identify itself (e.g. with an API key) to be served", "policy": %s}`, jsonString(l.Name))})
					return
				case MissingSkip:
					counters.Add("skipped", 1)
					continue
				}
				f, kind = IP().fn(r, e), "ip"
			}
			if f.unusable {
				counters.Add("forwarded_unusable", 1)
			}
			if f.unknown {
				counters.Add("peer_unknown", 1)
			}
			checks = append(checks, check{redisrl.IdentityKey(l.Name, kind, f.value, rule.HashTag), l.Name, l.Spec})
		}
		if len(checks) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		cost := rule.Cost
		if cost == 0 {
			cost = 1
		}
		d, err := m.decide(r.Context(), checks, cost)
		if err != nil {
			if errors.Is(err, redisrl.ErrUnavailable) {
				d = redisrl.Decision{Degraded: true, Blind: true, RetryAfter: 1e9}
			} else if ctxErr := r.Context().Err(); ctxErr != nil {
				return // the client went away
			} else {
				http.Error(w, "rate limiter error", http.StatusInternalServerError)
				return
			}
		}
		names := map[string]string{}
		for _, c := range checks {
			names[m.limiter.Prefix()+c.key] = c.name
		}
		policy := checks[0].name
		opts := redisrl.HeaderOptions{PolicyName: policy, Names: names, XHeaders: m.xHeaders}
		h := d.HeadersWith(opts)
		if len(d.PerKey) > 0 {
			policy = bindingName(d, names)
		}
		if d.Allowed {
			for k, v := range h {
				w.Header()[k] = v
			}
			st := &settlement{m: m, rule: rule, checks: checks, cost: cost, decision: d, ctx: r.Context()}
			ctx := context.WithValue(context.WithValue(r.Context(), ctxKey{}, d), settleKey{}, st)
			sw := &settlingWriter{ResponseWriter: w, st: st}
			next.ServeHTTP(sw, r.WithContext(ctx))
			if r.Context().Err() == nil {
				st.settle(http.StatusOK) // a handler that wrote nothing sent 200
			}
			return
		}
		retry := h.Get("Retry-After")
		den := Denial{Decision: d, Policy: policy, Header: h}
		switch {
		case d.Never:
			den.Status = http.StatusRequestEntityTooLarge
			den.Body = fmt.Sprintf(`{"error": "request_too_large", "message": "this request asks for more than the limit allows and can never pass", "policy": %s}`, jsonString(policy))
		case d.Blind:
			den.Status = http.StatusServiceUnavailable
			if retry == "" {
				retry = "null"
			}
			den.Body = fmt.Sprintf(`{"error": "limiter_unavailable", "message": "the rate limiter is unavailable; retry shortly", "retry_after": %s}`, retry)
		default:
			den.Status = http.StatusTooManyRequests
			if retry == "" {
				retry = "1"
			}
			den.Body = fmt.Sprintf(`{"error": "rate_limited", "message": "too many requests", "policy": %s, "retry_after": %s}`, jsonString(policy), retry)
		}
		m.deny(w, r, den)
	})
}

// decide checks the request's limits: one Check, or one CheckAll (RL.ALL) on a single
// server or when the keys share a slot; on a Cluster across slots, slot group by slot group
// in rule order, refunding the earlier groups when a later one denies (redisrl.AcrossSlots),
// so a denied request leaves no charge.
func (m *Middleware) decide(ctx context.Context, checks []check, cost uint64) (redisrl.Decision, error) {
	if len(checks) == 1 {
		return m.limiter.Check(ctx, checks[0].key, checks[0].spec, redisrl.Cost(cost))
	}
	entries := make([]redisrl.Entry, len(checks))
	for i, c := range checks {
		entries[i] = redisrl.NewEntry(c.key, c.spec)
	}
	return m.limiter.CheckAll(ctx, entries, redisrl.Cost(cost), redisrl.AcrossSlots())
}

func bindingName(d redisrl.Decision, names map[string]string) string {
	for _, p := range d.PerKey {
		if !p.Allowed && p.Never == d.Never {
			return names[p.Key]
		}
	}
	for _, p := range d.PerKey {
		if p.Spec != nil && p.Spec == d.Spec {
			return names[p.Key]
		}
	}
	if len(d.PerKey) > 0 {
		return names[d.PerKey[0].Key]
	}
	return "default"
}

func (m *Middleware) deny(w http.ResponseWriter, r *http.Request, d Denial) {
	if m.denied != nil {
		m.denied(w, r, d)
		return
	}
	for k, v := range d.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(d.Body)))
	w.WriteHeader(d.Status)
	_, _ = w.Write([]byte(d.Body))
}

func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"':
			b.WriteString(`\"`)
		case c == '\\':
			b.WriteString(`\\`)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

type settleKey struct{}

// settlement settles a request's charge on the status being sent: a refund when the rule's
// DeductWhen says so, else the difference to a cost the handler reported (ReportCost).
type settlement struct {
	m        *Middleware
	rule     *Rule
	checks   []check
	cost     uint64
	decision redisrl.Decision
	ctx      context.Context

	mu       sync.Mutex
	reported uint64
	has      bool
	done     bool
}

// ReportCost reports what the request really cost (tokens, rows), before the handler writes
// its status: on the status being sent the middleware charges the difference to the rule's
// cost (RL.GCRA/RL.WINDOW ... FORCE; a LOG limit cannot record more and is left out) or
// refunds it. It reports false outside a limited request or once the status is sent.
func ReportCost(ctx context.Context, n uint64) bool {
	st, ok := ctx.Value(settleKey{}).(*settlement)
	if !ok {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return false
	}
	st.reported, st.has = n, true
	return true
}

func (st *settlement) settle(status int) {
	st.mu.Lock()
	if st.done {
		st.mu.Unlock()
		return
	}
	st.done = true
	reported, has := st.reported, st.has
	st.mu.Unlock()
	if st.decision.Degraded && st.decision.Blind {
		return // open or closed: nothing was charged anywhere
	}
	ctx := context.WithoutCancel(st.ctx)
	lim := st.m.limiter
	switch {
	case st.rule.DeductWhen != nil && !st.rule.DeductWhen(status):
		for _, c := range st.checks {
			_, _ = lim.Refund(ctx, c.key, st.cost)
		}
	case has && reported > st.cost:
		for _, c := range st.checks {
			if w, ok := c.spec.(redisrl.Window); ok && w.Algorithm() == redisrl.Log {
				continue // FORCE cannot record on LOG (docs/clients.md#costs-and-settlement)
			}
			_, _ = lim.Force(ctx, c.key, c.spec, reported-st.cost)
		}
	case has && reported < st.cost:
		for _, c := range st.checks {
			_, _ = lim.Refund(ctx, c.key, st.cost-reported)
		}
	}
}

// settlingWriter settles the charge when the status is sent.
type settlingWriter struct {
	http.ResponseWriter
	st *settlement
}

func (w *settlingWriter) WriteHeader(status int) {
	if status >= 200 { // 1xx informational answers are not the status
		w.st.settle(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *settlingWriter) Write(b []byte) (int, error) {
	w.st.settle(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer (Flush, Hijack, deadlines).
func (w *settlingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Settle settles the request's charge on status now, as the middleware does when the status
// is written: for adapters whose framework writes the status itself, later (rlgin). Safe to
// call more than once; a no-op outside a limited request.
func Settle(ctx context.Context, status int) {
	if st, ok := ctx.Value(settleKey{}).(*settlement); ok {
		st.settle(status)
	}
}
