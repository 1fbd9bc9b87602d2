package rlhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
//
// Spec is a rate (redisrl.GCRA, redisrl.Window), checked and charged per request, or a
// redisrl.Lease: a concurrency limit per identity, a slot of which the request holds while
// it runs (taken when it is admitted, renewed in the background, released when it ends for
// any reason: response finished, client gone, handler panicked); no free slot is a 429.
type Limit struct {
	Name string
	Spec redisrl.Spec
	// PerRequest, instead of Spec, gives the limits for each request (by the caller's plan,
	// tier, tenant): one or several specs, named as Named names them (one: its own name,
	// else Name; several: "<Name>-<window seconds>s"). An error, no spec, or a nil spec
	// answers 500 ({"error": "limiter_error", ...}) and is logged. The limits it returns
	// cannot be checked when the middleware is built: give the limit a name of its own.
	PerRequest func(r *http.Request) ([]redisrl.Spec, error)
	Key        Key
}

// resolve gives the limit's named specs for r.
func (l Limit) resolve(r *http.Request) ([]Limit, error) {
	if l.PerRequest == nil {
		return []Limit{l}, nil
	}
	specs, err := l.PerRequest(r)
	if err != nil {
		return nil, fmt.Errorf("the limits of %q for this request: %w", l.Name, err)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("the limits of %q for this request: none given", l.Name)
	}
	for _, s := range specs {
		if s == nil {
			return nil, fmt.Errorf("the limits of %q for this request: a nil limit", l.Name)
		}
	}
	return Named(l.Name, l.Key, specs...), nil
}

// ErrCostTooLarge, returned (or wrapped) by a rule's CostFunc, says the request costs 2^64
// units or more: it can never pass and is answered 413 without a Redis call.
var ErrCostTooLarge = errors.New("rlhttp: the request's cost is 2^64 or more")

// Rule applies its limits to the requests it matches: every limit admits a request or none
// is charged.
type Rule struct {
	// Name names the rule in configuration errors (default "rule <n>").
	Name string
	// Path is a path prefix on the normalised path ("" or "/": every path).
	Path string
	// Methods, when set, restricts the rule to these methods.
	Methods []string
	// Limits are checked together for every matching request: its leases first (a slot of
	// each, held until the request ends), then its rates in one decision; a request that
	// one of them refuses is charged by none.
	Limits []Limit
	// Cost is the units each request costs (0: 1). At most one of Cost, CostHeader and
	// CostFunc is set.
	Cost uint64
	// CostHeader, when set, reads each request's cost from this request header, as a
	// client declares it: absent, empty or not a decimal number: 1; 0: 1 (a client cannot
	// make its request free); 2^64 or more: it can never pass, 413 without a Redis call. A
	// cost larger than a limit can hold is 413 too (Redis answers it can never pass).
	CostHeader string
	// CostFunc, when set, gives each request's cost (e.g. from its size): 0 is a free
	// request (admitted, not charged; never let a client choose it); an error matching
	// ErrCostTooLarge is a cost of 2^64 or more (413, no Redis call); any other error
	// answers 500. A cost larger than a limit can hold is 413.
	CostFunc func(r *http.Request) (uint64, error)
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
	// Status is 429 (rate limited, or no free slot of a Lease limit), 413 (can never pass:
	// a cost above a limit, or of 2^64 or more), 503 (the limiter could not decide) or 401
	// (identity required).
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
	logger      *slog.Logger

	warnedLog       atomic.Bool // a reported extra cost left out on a LOG limit
	warnedSaturated atomic.Bool // a reported cost beyond a limit's arithmetic
	warnedUnknown   atomic.Bool // a request with no usable client address
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

// WithLogger sets where the middleware's warnings and errors go (default slog.Default()):
// a reported cost left out on a LOG limit or beyond a limit's arithmetic, a request with no
// usable client address (each warned once), a limit or cost function's error.
func WithLogger(l *slog.Logger) Option { return func(m *Middleware) { m.logger = l } }

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
	if m.logger == nil {
		m.logger = slog.Default()
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
		costs := 0
		for _, set := range []bool{r.Cost != 0, r.CostHeader != "", r.CostFunc != nil} {
			if set {
				costs++
			}
		}
		if costs > 1 {
			return nil, fmt.Errorf("rlhttp: %s: set one of Cost, CostHeader and CostFunc", r.Name)
		}
		for _, l := range r.Limits {
			if (l.Spec == nil) == (l.PerRequest == nil) || l.Key.fn == nil {
				return nil, fmt.Errorf("rlhttp: %s: limit %q needs a Key and one of Spec and PerRequest", r.Name, l.Name)
			}
			if l.Name == "" || strings.IndexFunc(l.Name, func(c rune) bool { return c < 0x20 || c >= 0x7f }) >= 0 {
				return nil, fmt.Errorf("rlhttp: %s: limit name %q must be non-empty printable ASCII", r.Name, l.Name)
			}
			if l.PerRequest != nil {
				continue // its limits are known per request only
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

type check struct {
	key, name string
	spec      redisrl.Spec
}

func isLease(s redisrl.Spec) bool {
	_, ok := s.(redisrl.Lease)
	return ok
}

// cost is the request's cost under rule: the units, or never (2^64 or more).
func (r *Rule) cost(req *http.Request) (n uint64, never bool, err error) {
	switch {
	case r.CostFunc != nil:
		n, err = r.CostFunc(req)
		if errors.Is(err, ErrCostTooLarge) {
			return 0, true, nil
		}
		return n, false, err
	case r.CostHeader != "":
		n, never = HeaderCost(req.Header.Values(r.CostHeader))
		return n, never, nil
	case r.Cost == 0:
		return 1, false, nil
	}
	return r.Cost, false, nil
}

// HeaderCost reads a cost a client declares in a header (its lines, as http.Header.Values
// gives them; Rule.CostHeader): absent, empty or not a decimal number is 1, 0 is 1, and a
// number of 2^64 or more is never (it can never pass).
func HeaderCost(lines []string) (cost uint64, never bool) {
	v := strings.Trim(NormalizeList(lines), " \t")
	if v == "" || strings.IndexFunc(v, func(c rune) bool { return c < '0' || c > '9' }) >= 0 {
		return 1, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, true // all digits, so out of range
	}
	return max(n, 1), false
}

// limiterError is the 500 of a limiter or limit function that failed.
func limiterError(w http.ResponseWriter) {
	const body = `{"error": "limiter_error", "message": "the rate limiter failed"}`
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = w.Write([]byte(body))
}

func (m *Middleware) exemptPath(path string) bool {
	for _, p := range m.exemptPaths {
		if MatchPath(p, path) {
			return true
		}
	}
	return false
}

// Handler wraps next: func(http.Handler) http.Handler, so it composes with chi, gorilla and
// the standard mux. Exempt requests (WithExempt, WithExemptPaths, CORS preflights) and those
// no rule matches go straight to next. A request a rule matches is refused (Denial), or
// admitted with the RateLimit fields on its response, the decision in its context
// (DecisionFrom) and its leases held until next returns (LeaseFrom). A limit or cost
// function that fails, or a limiter error that is not an outage, answers 500
// {"error": "limiter_error", ...}.
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
		var rates, leases []check
		var unusable, unknown bool
		// Once per request, however many of its limits are keyed by the client's address.
		countAddress := func() {
			if unusable {
				counters.Add("forwarded_unusable", 1)
			}
			if unknown {
				counters.Add("peer_unknown", 1)
				if !m.warnedUnknown.Swap(true) {
					m.logger.Warn("redis-rl: a request with no usable client address (no IP peer, e.g. a Unix socket, and no trusted forwarding header): its IP limits count in the one bucket shared by all such requests, ip:unknown (counted peer_unknown, warned once). Behind a proxy on a Unix socket, trust it with ClientIP{}.Trusted(\"unix\") so its forwarding header names the client",
						slog.String("peer", r.RemoteAddr))
				}
			}
		}
		for _, entry := range rule.Limits {
			limits, err := entry.resolve(r)
			if err != nil {
				m.logger.Error("redis-rl: "+err.Error(), slog.String("rule", rule.Name))
				limiterError(w)
				return
			}
			f := entry.Key.fn(r, e)
			kind := entry.Key.kind
			if !f.ok {
				switch rule.Missing {
				case MissingDeny:
					countAddress()
					counters.Add("missing_denied", 1)
					m.deny(w, r, Denial{Status: http.StatusUnauthorized, Policy: entry.Name, Header: http.Header{},
						Body: fmt.Sprintf(`{"error": "identity_required", "message": "this request must identify itself (e.g. with an API key) to be served", "policy": %s}`, jsonString(entry.Name))})
					return
				case MissingSkip:
					counters.Add("skipped", uint64(len(limits)))
					continue
				}
				f, kind = IP().fn(r, e), "ip"
			}
			unusable = unusable || f.unusable
			unknown = unknown || f.unknown
			for _, l := range limits {
				c := check{redisrl.IdentityKey(l.Name, kind, f.value, rule.HashTag), l.Name, l.Spec}
				if isLease(l.Spec) {
					leases = append(leases, c)
				} else {
					rates = append(rates, c)
				}
			}
		}
		countAddress()
		if len(rates)+len(leases) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		names := map[string]string{}
		for _, c := range append(append([]check(nil), rates...), leases...) {
			names[m.limiter.Prefix()+c.key] = c.name
		}
		cost, never, err := rule.cost(r)
		if err != nil {
			m.logger.Error("redis-rl: the cost of a request: "+err.Error(), slog.String("rule", rule.Name))
			limiterError(w)
			return
		}
		if never {
			// 2^64 or more: no limit can hold it, and Redis is not asked.
			first := append(append([]check(nil), rates...), leases...)[0]
			d := redisrl.Decision{Never: true, Blind: true, Source: redisrl.SourceLocal, Spec: first.spec,
				Key: m.limiter.Prefix() + first.key, Limit: first.spec.Capacity()}
			counters.Add("denied", 1)
			m.refuse(w, r, d, first.name, d.HeadersWith(redisrl.HeaderOptions{PolicyName: first.name, XHeaders: m.xHeaders}))
			return
		}
		// Leases first: a request that finds no free slot is charged nothing anywhere.
		guards, held, denial, err := m.acquire(r.Context(), leases)
		if err != nil {
			if r.Context().Err() == nil {
				m.logger.Error("redis-rl: acquiring a request's lease: "+err.Error(), slog.String("rule", rule.Name))
				limiterError(w)
			}
			return
		}
		release := func() {
			ctx := context.WithoutCancel(r.Context())
			for _, g := range guards {
				_, _ = g.Release(ctx)
			}
		}
		if denial != nil {
			release()
			name := names[denial.Key]
			m.refuse(w, r, *denial, name, denial.HeadersWith(redisrl.HeaderOptions{PolicyName: name, XHeaders: m.xHeaders}))
			return
		}
		defer release() // the request ends, however it ends (a panic goes on after it)
		var d redisrl.Decision
		if len(rates) > 0 {
			d, err = m.decide(r.Context(), rates, cost)
			if err != nil {
				if errors.Is(err, redisrl.ErrUnavailable) {
					d = redisrl.Decision{Degraded: true, Blind: true, RetryAfter: 1e9}
				} else if ctxErr := r.Context().Err(); ctxErr != nil {
					return // the client went away
				} else {
					m.logger.Error("redis-rl: the limiter failed: "+err.Error(), slog.String("rule", rule.Name))
					limiterError(w)
					return
				}
			}
		}
		if len(held) > 0 && (len(rates) == 0 || d.Allowed) {
			d = withLeases(d, len(rates) > 0, held)
		}
		policy := append(append([]check(nil), rates...), leases...)[0].name
		opts := redisrl.HeaderOptions{PolicyName: policy, Names: names, XHeaders: m.xHeaders}
		h := d.HeadersWith(opts)
		if len(d.PerKey) > 0 {
			policy = bindingName(d, names)
		}
		if d.Allowed {
			for k, v := range h {
				w.Header()[k] = v
			}
			st := &settlement{m: m, rule: rule, checks: rates, cost: cost, decision: d, ctx: r.Context()}
			ctx := context.WithValue(context.WithValue(r.Context(), ctxKey{}, d), settleKey{}, st)
			if len(guards) > 0 {
				byName := make(map[string]*redisrl.LeaseGuard, len(guards))
				for i, g := range guards {
					byName[leases[i].name] = g
				}
				ctx = context.WithValue(ctx, leaseKey{}, byName)
			}
			sw := &settlingWriter{ResponseWriter: w, st: st}
			next.ServeHTTP(sw, r.WithContext(ctx))
			if r.Context().Err() == nil {
				st.settle(http.StatusOK) // a handler that wrote nothing sent 200
			}
			return
		}
		m.refuse(w, r, d, policy, h)
	})
}

// acquire takes a slot of each lease (in rule order) for the request. A lease without a free
// slot releases those taken and is the denial; so is the closed policy's answer.
func (m *Middleware) acquire(ctx context.Context, leases []check) (guards []*redisrl.LeaseGuard, held []redisrl.Decision, denial *redisrl.Decision, err error) {
	for _, c := range leases {
		g, err := m.limiter.Acquire(ctx, c.key, c.spec.(redisrl.Lease))
		var rl *redisrl.RateLimitedError
		switch {
		case errors.As(err, &rl):
			d := rl.Decision
			if d.Key == "" {
				d.Key = m.limiter.Prefix() + c.key
			}
			denial = &d
		case errors.Is(err, redisrl.ErrUnavailable):
			denial = &redisrl.Decision{Degraded: true, Blind: true, RetryAfter: time.Second, Key: m.limiter.Prefix() + c.key}
		case err != nil:
			for _, g := range guards {
				_, _ = g.Release(context.WithoutCancel(ctx))
			}
			return nil, nil, nil, err
		}
		if denial != nil {
			return guards, held, denial, nil
		}
		guards = append(guards, g)
		held = append(held, g.Decision())
	}
	return guards, held, nil, nil
}

// withLeases adds the leases' decisions to an admitted request's decision (one per key, so
// the RateLimit fields name them all).
func withLeases(d redisrl.Decision, hasRates bool, held []redisrl.Decision) redisrl.Decision {
	if !hasRates {
		if len(held) == 1 {
			return held[0]
		}
		d = held[0]
		d.Key = ""
		d.PerKey = append([]redisrl.Decision(nil), held...)
		return d
	}
	per := d.PerKey
	if len(per) == 0 {
		per = []redisrl.Decision{d}
	}
	d.PerKey = append(append([]redisrl.Decision(nil), per...), held...)
	d.Key = ""
	return d
}

// refuse answers a denied request: 413 (can never pass), 503 (the limiter could not
// decide) or 429.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, d redisrl.Decision, policy string, h http.Header) {
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
}

type leaseKey struct{}

// LeaseFrom returns the lease the request holds under the limit called name (a Lease limit
// of its rule), to watch Lost() in a long handler. The middleware releases it when the
// request ends; the handler need not. A request that holds none under that name (an exempt
// path, a rule without that Lease, no middleware at all) gives nil, false.
func LeaseFrom(ctx context.Context, name string) (*redisrl.LeaseGuard, bool) {
	held, _ := ctx.Value(leaseKey{}).(map[string]*redisrl.LeaseGuard)
	g, ok := held[name]
	return g, ok
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

// ReportCost reports what the request really cost, in the rule's units (tokens, rows),
// before the handler writes its status: on the status being sent the middleware refunds
// what was charged beyond n (RL.REFUND, counted in refunded) or records the extra
// (RL.GCRA/RL.WINDOW ... FORCE, once per rate limit of the rule). A LOG limit cannot record
// usage past its limit (FORCE refuses LOG): the extra is left out there, warned once. An
// extra beyond what a limit's arithmetic holds (a GCRA time past 2^64 ns since the epoch, a
// window count past 2^64 - 1) is recorded as the most it holds, so the key stays used up as
// long as it can be, and counted in errors (warned once). Leases are not settled. A
// DeductWhen that refuses the status refunds the whole charge instead. It reports false
// outside a limited request or once the status is sent.
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
			st.m.force(ctx, c, reported-st.cost)
		}
	case has && reported < st.cost:
		for _, c := range st.checks {
			_, _ = lim.Refund(ctx, c.key, st.cost-reported)
		}
	}
}

// force records extra reported units on c's key (RL.GCRA/RL.WINDOW ... FORCE): on a LOG
// limit it cannot (FORCE refuses LOG), so they are left out, warned once; beyond what the
// limit's arithmetic holds, the most it holds is recorded (the key used up for as long as it
// can be), counted in errors and warned once (docs/clients.md#costs-and-settlement).
func (m *Middleware) force(ctx context.Context, c check, extra uint64) {
	if w, ok := c.spec.(redisrl.Window); ok && w.Algorithm() == redisrl.Log {
		if !m.warnedLog.Swap(true) {
			m.logger.Warn("redis-rl: a reported cost above the charge is not recorded on a LOG limit (LOG cannot record usage past its limit)",
				slog.String("key", m.limiter.Prefix()+c.key), slog.Uint64("extra", extra))
		}
		return
	}
	n := recordable(c.spec, extra, time.Now())
	short := n < extra
	if short && !m.warnedSaturated.Swap(true) {
		m.logger.Warn("redis-rl: a reported cost beyond what the limit's arithmetic holds is recorded as the most it holds (the key is used up as long as it can be); counted in errors",
			slog.String("key", m.limiter.Prefix()+c.key), slog.Uint64("extra", extra), slog.Uint64("recorded", n))
	}
	if n > 0 {
		if _, err := m.limiter.Force(ctx, c.key, c.spec, n); err != nil {
			if !errors.Is(err, redisrl.ErrUnavailable) {
				short = true // an outage is counted by the failure policy already
			}
			m.logger.Warn("redis-rl: recording a reported cost failed: "+err.Error(), slog.String("key", m.limiter.Prefix()+c.key))
		}
	}
	if short {
		m.limiter.Counters().Add("errors", 1)
	}
}

// dayNs is the margin left for the server's clock ahead of this host's.
const dayNs = uint64(24 * time.Hour)

// recordable is how many of extra reported units a FORCE on limit can record: all, unless
// the limit's arithmetic cannot hold them (the server answers "arithmetic overflow" and
// records nothing). GCRA: the key's time may not pass 2^64 - 1 ns since the epoch; before
// the force it is at most now + burst * T, so at most (2^64 - 1 - now - a day - burst * T) / T
// units. A window's count may not pass 2^64 - 1 and holds at most its limit before: at most
// 2^64 - 1 - limit.
func recordable(limit redisrl.Spec, extra uint64, now time.Time) uint64 {
	switch l := limit.(type) {
	case redisrl.GCRA:
		t := max(uint64(l.EmissionInterval()), 1)
		hi, used := bits.Mul64(l.Burst(), t)
		used, c1 := bits.Add64(used, uint64(max(now.UnixNano(), 0)), 0)
		used, c2 := bits.Add64(used, dayNs, 0)
		if hi != 0 || c1 != 0 || c2 != 0 {
			return 0
		}
		return min(extra, (math.MaxUint64-used)/t)
	case redisrl.Window:
		return min(extra, math.MaxUint64-l.Limit())
	}
	return extra
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
