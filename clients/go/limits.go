package redisrl

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// MaxSeconds is the longest period, window or lease the module accepts: ten 365-day years.
const MaxSeconds = 315_360_000

const maxSpan = MaxSeconds * time.Second

// ErrInvalidLimit matches (with errors.Is) every *InvalidLimitError.
var ErrInvalidLimit = errors.New("redis-rl: invalid limit")

// InvalidLimitError is a limit or a request argument that breaks the module's rules.
//
// Its message is the module's error text without the "ERR " prefix, so NewGCRA(0, 1,
// time.Second) fails with "burst must be a positive integer", exactly as
// "RL.GCRA key 0 1 1" would (docs/clients.md#limits-are-values).
type InvalidLimitError struct {
	msg string
}

func invalid(format string, a ...any) *InvalidLimitError {
	return &InvalidLimitError{msg: fmt.Sprintf(format, a...)}
}

// Error returns the module's message.
func (e *InvalidLimitError) Error() string { return e.msg }

// Is reports whether target is ErrInvalidLimit.
func (e *InvalidLimitError) Is(target error) bool { return target == ErrInvalidLimit }

func secondsError(name string) *InvalidLimitError {
	return invalid("%s must be seconds as a plain decimal (digits, optionally '.' and 1 to 9 more digits), > 0 and <= %d", name, MaxSeconds)
}

func checkSpan(d time.Duration, name string) (uint64, error) {
	if d <= 0 || d > maxSpan {
		return 0, secondsError(name)
	}
	return uint64(d), nil
}

func positive(v uint64, name string) error {
	if v == 0 {
		return invalid("%s must be a positive integer", name)
	}
	return nil
}

func checkName(name string) error {
	if name == "" {
		return invalid("name must be non-empty printable ASCII (it is sent in HTTP headers)")
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] >= 0x7f {
			return invalid("name must be non-empty printable ASCII (it is sent in HTTP headers)")
		}
	}
	return nil
}

func checkToken(token string) error {
	if len(token) == 0 || len(token) > 64 {
		return invalid("token must be 1 to 64 bytes")
	}
	return nil
}

// FormatSeconds writes a duration as the module's plain decimal seconds, exactly:
// 1500*time.Millisecond is "1.5". Negative durations are written as "0".
func FormatSeconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	ns := uint64(d)
	whole, frac := ns/1e9, ns%1e9
	if frac == 0 {
		return strconv.FormatUint(whole, 10)
	}
	text := fmt.Sprintf("%d.%09d", whole, frac)
	return strings.TrimRight(text, "0")
}

// ParseSeconds reads the module's grammar for seconds exactly: ASCII digits, optionally '.'
// and 1 to 9 more digits ("60", "0.25", "0.000000001"), > 0 and <= MaxSeconds. Anything else
// ("1e3", "-1", ".5", "5.", " 1") is an error naming name.
func ParseSeconds(text, name string) (time.Duration, error) {
	intPart, frac, hasFrac := strings.Cut(text, ".")
	if intPart == "" || !allDigits(intPart) || (hasFrac && (frac == "" || len(frac) > 9 || !allDigits(frac))) {
		return 0, secondsError(name)
	}
	intPart = strings.TrimLeft(intPart, "0")
	if len(intPart) > 9 {
		return 0, secondsError(name)
	}
	whole := uint64(0)
	if intPart != "" {
		whole, _ = strconv.ParseUint(intPart, 10, 64)
	}
	ns := whole * 1e9
	if hasFrac {
		f, _ := strconv.ParseUint(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		ns += f
	}
	if _, err := checkSpan(time.Duration(ns), name); err != nil {
		return 0, err
	}
	return time.Duration(ns), nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Algorithm is a window algorithm of RL.WINDOW. The zero value is Sliding, the module's
// default.
type Algorithm uint8

const (
	// Sliding keeps the previous and current epoch-aligned windows and weights the previous
	// one by the part still inside the trailing window (docs/reference.md#r-sliding-1).
	Sliding Algorithm = iota
	// Fixed keeps one counter per window aligned to the Unix epoch
	// (docs/reference.md#r-fixed-1).
	Fixed
	// Log records every admitted request: exactly at most limit in any trailing window
	// (docs/reference.md#r-log-1).
	Log
)

// String returns the module's keyword: "SLIDING", "FIXED" or "LOG".
func (a Algorithm) String() string {
	switch a {
	case Fixed:
		return "FIXED"
	case Log:
		return "LOG"
	case Sliding:
		return "SLIDING"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm reads "fixed", "SLIDING", "Log" (any case).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToUpper(s) {
	case "FIXED":
		return Fixed, nil
	case "SLIDING":
		return Sliding, nil
	case "LOG":
		return Log, nil
	}
	return 0, invalid("algorithm must be FIXED, SLIDING or LOG, not '%s'", s)
}

type kind uint8

const (
	kindGCRA kind = iota + 1
	kindWindow
	kindLease
)

// spec is a validated limit of any kind, as the protocol sends it.
type spec struct {
	kind     kind
	capacity uint64 // burst (GCRA), limit (window, lease)
	rate     uint64 // GCRA only
	span     uint64 // ns: period, window or lease
	interval uint64 // ns: GCRA's emission interval
	alg      Algorithm
	name     string
}

// Spec is any limit a Client checks: a GCRA, a Window, a Lease, or a redis_rate-style Limit.
// It cannot be implemented outside this package.
type Spec interface {
	// Capacity is the most requests an idle key admits at once (burst / limit / slots).
	Capacity() uint64
	// Name is the name given with Named ("" if none), used in the HTTP RateLimit fields.
	Name() string
	spec() (spec, error)
}

// args are the command arguments after the key (module command form).
func (s spec) args() []any {
	switch s.kind {
	case kindGCRA:
		return []any{strconv.FormatUint(s.capacity, 10), strconv.FormatUint(s.rate, 10), FormatSeconds(time.Duration(s.span))}
	case kindWindow:
		return []any{strconv.FormatUint(s.capacity, 10), FormatSeconds(time.Duration(s.span)), s.alg.String()}
	default:
		return []any{strconv.FormatUint(s.capacity, 10), FormatSeconds(time.Duration(s.span))}
	}
}

// head is the RL.ALL spec word.
func (s spec) head() string {
	switch s.kind {
	case kindGCRA:
		return "GCRA"
	case kindWindow:
		return "WINDOW"
	default:
		return "LEASE"
	}
}

// policyWindow is the w of the IETF RateLimit-Policy field: the span the capacity is for (a
// window; for GCRA the time an empty bucket takes to fill, burst * T); none for a lease.
func (s spec) policyWindow() (time.Duration, bool) {
	switch s.kind {
	case kindGCRA:
		hi, lo := bits.Mul64(s.capacity, s.interval)
		if hi != 0 || lo > 1<<63-1 {
			return time.Duration(1<<63 - 1), true
		}
		return time.Duration(lo), true
	case kindWindow:
		return time.Duration(s.span), true
	}
	return 0, false
}

// ident identifies the limit (kind, parameters, name) in the deny cache.
func (s spec) ident() string {
	return fmt.Sprintf("%d %d %d %d %d\x00%s", s.kind, s.capacity, s.rate, s.span, s.alg, s.name)
}

// GCRA is a token bucket (RL.GCRA): Burst requests at once, refilled at Rate per Period.
//
// The emission interval T = period / rate (rounded to the nearest nanosecond, at least 1 ns)
// is the cost of one request; an idle key admits exactly burst requests at once, then one
// more every T (docs/reference.md#r-gcra-1).
type GCRA struct{ s spec }

// NewGCRA builds a GCRA limit with the module's validation and messages: burst and rate at
// least 1, period > 0 and at most MaxSeconds, T = period/rate at least 1 ns, burst*T within
// 64-bit nanoseconds.
func NewGCRA(burst, rate uint64, period time.Duration) (GCRA, error) {
	if err := positive(burst, "burst"); err != nil {
		return GCRA{}, err
	}
	if err := positive(rate, "rate"); err != nil {
		return GCRA{}, err
	}
	p, err := checkSpan(period, "period")
	if err != nil {
		return GCRA{}, err
	}
	// p <= 3.2e17 and rate/2 < 2^63: the sum fits in 64 bits.
	interval := (p + rate/2) / rate
	if interval == 0 {
		return GCRA{}, invalid("rate is too high for period: the emission interval period/rate is below 1 ns")
	}
	if hi, _ := bits.Mul64(burst, interval); hi != 0 {
		return GCRA{}, invalid("burst is too large: burst * period / rate overflows 64-bit nanoseconds")
	}
	return GCRA{spec{kind: kindGCRA, capacity: burst, rate: rate, span: p, interval: interval}}, nil
}

// MustGCRA is NewGCRA that panics on an invalid limit: for package-level values only.
func MustGCRA(burst, rate uint64, period time.Duration) GCRA {
	g, err := NewGCRA(burst, rate, period)
	if err != nil {
		panic("redis-rl: " + err.Error())
	}
	return g
}

// Named returns the limit with a name for the HTTP RateLimit fields (printable ASCII).
func (g GCRA) Named(name string) (GCRA, error) {
	if err := checkName(name); err != nil {
		return GCRA{}, err
	}
	g.s.name = name
	return g, nil
}

// Burst is the number of requests an idle key admits at once.
func (g GCRA) Burst() uint64 { return g.s.capacity }

// Rate is the number of requests per Period.
func (g GCRA) Rate() uint64 { return g.s.rate }

// Period is the span Rate requests are spread over.
func (g GCRA) Period() time.Duration { return time.Duration(g.s.span) }

// EmissionInterval is T = period / rate: the time one request costs.
func (g GCRA) EmissionInterval() time.Duration { return time.Duration(g.s.interval) }

// Capacity is Burst.
func (g GCRA) Capacity() uint64 { return g.s.capacity }

// Name is the name given with Named.
func (g GCRA) Name() string { return g.s.name }

// String describes the limit: "GCRA(burst=10, rate=5, period=1s)".
func (g GCRA) String() string {
	return fmt.Sprintf("GCRA(burst=%d, rate=%d, period=%v)", g.s.capacity, g.s.rate, time.Duration(g.s.span))
}

func (g GCRA) spec() (spec, error) {
	if g.s.kind == 0 {
		return spec{}, invalid("the zero GCRA is not a limit: build it with NewGCRA")
	}
	return g.s, nil
}

// Window allows at most Limit requests in any window (RL.WINDOW: FIXED, SLIDING or LOG).
type Window struct{ s spec }

// NewWindow builds a window limit with the module's validation and messages (the server's
// rl.log-max-limit cap on LOG is checked by the server).
func NewWindow(limit uint64, window time.Duration, algorithm Algorithm) (Window, error) {
	if err := positive(limit, "limit"); err != nil {
		return Window{}, err
	}
	w, err := checkSpan(window, "window")
	if err != nil {
		return Window{}, err
	}
	if algorithm > Log {
		return Window{}, invalid("algorithm must be FIXED, SLIDING or LOG, not '%s'", algorithm)
	}
	return Window{spec{kind: kindWindow, capacity: limit, span: w, alg: algorithm}}, nil
}

// MustWindow is NewWindow that panics on an invalid limit: for package-level values only.
func MustWindow(limit uint64, window time.Duration, algorithm Algorithm) Window {
	w, err := NewWindow(limit, window, algorithm)
	if err != nil {
		panic("redis-rl: " + err.Error())
	}
	return w
}

// Named returns the limit with a name for the HTTP RateLimit fields (printable ASCII).
func (w Window) Named(name string) (Window, error) {
	if err := checkName(name); err != nil {
		return Window{}, err
	}
	w.s.name = name
	return w, nil
}

// Limit is the number of requests allowed per window.
func (w Window) Limit() uint64 { return w.s.capacity }

// Window is the window's length.
func (w Window) Window() time.Duration { return time.Duration(w.s.span) }

// Algorithm is FIXED, SLIDING or LOG.
func (w Window) Algorithm() Algorithm { return w.s.alg }

// Capacity is Limit.
func (w Window) Capacity() uint64 { return w.s.capacity }

// Name is the name given with Named.
func (w Window) Name() string { return w.s.name }

// String describes the limit: "Window(limit=5, window=5m0s, LOG)".
func (w Window) String() string {
	return fmt.Sprintf("Window(limit=%d, window=%v, %s)", w.s.capacity, time.Duration(w.s.span), w.s.alg)
}

func (w Window) spec() (spec, error) {
	if w.s.kind == 0 {
		return spec{}, invalid("the zero Window is not a limit: build it with NewWindow")
	}
	return w.s, nil
}

// Lease is a concurrency limit (RL.LEASE): at most Limit slots held at once, each for Lease
// unless renewed; a crashed holder's slots come back when its lease ends.
type Lease struct{ s spec }

// NewLease builds a lease limit (the server's rl.lease-max-limit cap is checked by the
// server).
func NewLease(limit uint64, lease time.Duration) (Lease, error) {
	if err := positive(limit, "limit"); err != nil {
		return Lease{}, err
	}
	l, err := checkSpan(lease, "lease")
	if err != nil {
		return Lease{}, err
	}
	return Lease{spec{kind: kindLease, capacity: limit, span: l}}, nil
}

// MustLease is NewLease that panics on an invalid limit: for package-level values only.
func MustLease(limit uint64, lease time.Duration) Lease {
	l, err := NewLease(limit, lease)
	if err != nil {
		panic("redis-rl: " + err.Error())
	}
	return l
}

// Named returns the limit with a name for the HTTP RateLimit fields (printable ASCII).
func (l Lease) Named(name string) (Lease, error) {
	if err := checkName(name); err != nil {
		return Lease{}, err
	}
	l.s.name = name
	return l, nil
}

// Limit is the number of slots that may be held at once.
func (l Lease) Limit() uint64 { return l.s.capacity }

// Lease is the longest a holder keeps its slots without renewing.
func (l Lease) Lease() time.Duration { return time.Duration(l.s.span) }

// Capacity is Limit.
func (l Lease) Capacity() uint64 { return l.s.capacity }

// Name is the name given with Named.
func (l Lease) Name() string { return l.s.name }

// String describes the limit: "Lease(limit=4, lease=30s)".
func (l Lease) String() string {
	return fmt.Sprintf("Lease(limit=%d, lease=%v)", l.s.capacity, time.Duration(l.s.span))
}

func (l Lease) spec() (spec, error) {
	if l.s.kind == 0 {
		return spec{}, invalid("the zero Lease is not a limit: build it with NewLease")
	}
	return l.s, nil
}

// Limit is go-redis/redis_rate's limit, kept so its users recognise it: Burst requests at
// once, Rate per Period. It is a GCRA checked when it is used (a struct literal cannot be
// validated when built), with the same rules and messages as NewGCRA.
type Limit struct {
	Rate   int
	Burst  int
	Period time.Duration
}

// PerSecond is Limit{Rate: rate, Burst: rate, Period: time.Second}.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Burst: rate, Period: time.Second} }

// PerMinute is Limit{Rate: rate, Burst: rate, Period: time.Minute}.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Burst: rate, Period: time.Minute} }

// PerHour is Limit{Rate: rate, Burst: rate, Period: time.Hour}.
func PerHour(rate int) Limit { return Limit{Rate: rate, Burst: rate, Period: time.Hour} }

// String is redis_rate's: "10 req/s (burst 10)".
func (l Limit) String() string {
	return fmt.Sprintf("%d req/%s (burst %d)", l.Rate, fmtDur(l.Period), l.Burst)
}

func fmtDur(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "m"
	case time.Hour:
		return "h"
	}
	return d.String()
}

// IsZero reports whether l is the zero Limit.
func (l Limit) IsZero() bool { return l == Limit{} }

// GCRA validates l as NewGCRA(Burst, Rate, Period).
func (l Limit) GCRA() (GCRA, error) {
	if l.Burst <= 0 {
		return GCRA{}, invalid("burst must be a positive integer")
	}
	if l.Rate <= 0 {
		return GCRA{}, invalid("rate must be a positive integer")
	}
	return NewGCRA(uint64(l.Burst), uint64(l.Rate), l.Period)
}

// Capacity is Burst (0 if negative).
func (l Limit) Capacity() uint64 {
	if l.Burst < 0 {
		return 0
	}
	return uint64(l.Burst)
}

// Name is "" (a Limit has no name; use a GCRA's Named).
func (l Limit) Name() string { return "" }

func (l Limit) spec() (spec, error) {
	g, err := l.GCRA()
	if err != nil {
		return spec{}, err
	}
	return g.s, nil
}

// unitSeconds gives the seconds of a unit word of the limit grammar.
func unitSeconds(word string) (uint64, bool) {
	switch word {
	case "s", "sec", "second", "seconds":
		return 1, true
	case "m", "min", "minute", "minutes":
		return 60, true
	case "h", "hr", "hour", "hours":
		return 3600, true
	case "d", "day", "days":
		return 86400, true
	}
	return 0, false
}

// StringAlgorithm is the algorithm ParseLimitsWith gives each limit of a string: a window
// algorithm, or GCRA.
type StringAlgorithm uint8

const (
	// StringSliding makes each part NewWindow(count, window, Sliding) (the default).
	StringSliding StringAlgorithm = iota
	// StringFixed makes each part NewWindow(count, window, Fixed).
	StringFixed
	// StringLog makes each part NewWindow(count, window, Log).
	StringLog
	// StringGCRA makes each part NewGCRA(count, count, window).
	StringGCRA
)

func leadingDigits(s string) (string, string) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i], s[i:]
}

func parseOne(part string, algorithm StringAlgorithm) (Spec, error) {
	bad := func(why string) error { return invalid("limit '%s': %s", part, why) }
	lower := strings.ToLower(strings.TrimSpace(part))
	countText, rest := leadingDigits(lower)
	if countText == "" {
		return nil, bad("expected '<count>/<unit>' or '<count> per <unit>', starting with the count")
	}
	count, err := strconv.ParseUint(countText, 10, 64)
	if err != nil {
		return nil, bad("the count does not fit in 64 bits")
	}
	rest = strings.TrimLeft(rest, " \t")
	switch {
	case strings.HasPrefix(rest, "/"):
		rest = rest[1:]
	case strings.HasPrefix(rest, "per"):
		rest = rest[3:]
	default:
		return nil, bad("expected '/' or 'per' after the count, as in '10/minute' or '10 per minute'")
	}
	multText, unit := leadingDigits(strings.TrimLeft(rest, " \t"))
	multiplier := uint64(1)
	if multText != "" {
		m, err := strconv.ParseUint(multText, 10, 64)
		if err != nil || m == 0 {
			return nil, bad("the number of units must be a positive integer")
		}
		multiplier = m
	}
	unit = strings.TrimSpace(unit)
	secs, ok := unitSeconds(unit)
	if !ok {
		return nil, bad(fmt.Sprintf("unknown unit '%s' (s, sec, second(s), m, min, minute(s), h, hr, hour(s), d, day(s))", unit))
	}
	hi, window := bits.Mul64(multiplier, secs)
	if hi != 0 || window > MaxSeconds {
		return nil, bad(fmt.Sprintf("the window must be at most %d s", MaxSeconds))
	}
	d := time.Duration(window) * time.Second
	var s Spec
	switch algorithm {
	case StringGCRA:
		s, err = NewGCRA(count, count, d)
	case StringFixed:
		s, err = NewWindow(count, d, Fixed)
	case StringLog:
		s, err = NewWindow(count, d, Log)
	default:
		s, err = NewWindow(count, d, Sliding)
	}
	if err != nil {
		return nil, bad(err.Error())
	}
	return s, nil
}

// ParseLimits reads limits as users write them: "10/minute", "100 per hour", "5/10s",
// several joined by ';' or ',' ("20/minute; 200 per hour"). Each part is a SLIDING
// Window(count, multiplier × unit), in the order written (docs/clients.md#limit-strings).
//
// Grammar, case-insensitive: <count> ("/" | "per") [<multiplier>] <unit>, units s, sec,
// second(s), m, min, minute(s), h, hr, hour(s), d, day(s). Errors name the bad part.
func ParseLimits(text string) ([]Spec, error) {
	return ParseLimitsWith(text, StringSliding)
}

// ParseLimitsWith is ParseLimits with another algorithm for every part.
func ParseLimitsWith(text string, algorithm StringAlgorithm) ([]Spec, error) {
	if strings.TrimSpace(text) == "" {
		return nil, invalid("no limit in '%s'", text)
	}
	var out []Spec
	start := 0
	for i := 0; i <= len(text); i++ {
		if i < len(text) && text[i] != ';' && text[i] != ',' {
			continue
		}
		part := strings.TrimSpace(text[start:i])
		start = i + 1
		if part == "" {
			return nil, invalid("empty limit in '%s' (limits are separated by ';' or ',')", text)
		}
		s, err := parseOne(part, algorithm)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// PolicyWindow is the w of the IETF RateLimit-Policy field for s: the window of a Window,
// the time an empty GCRA bucket takes to fill (burst · period / rate); false for a Lease or
// an invalid limit.
func PolicyWindow(s Spec) (time.Duration, bool) {
	if s == nil {
		return 0, false
	}
	v, err := s.spec()
	if err != nil {
		return 0, false
	}
	return v.policyWindow()
}
