package redisrl

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// FailurePolicy says what a check answers when Redis does not (docs/clients.md#failure-policy).
//
// Redis not answering means: the connection refused or lost, a timeout, a failover in
// progress, out of memory, cluster down. A wrong argument or WRONGTYPE is not an outage and
// is returned as an error whatever the policy.
type FailurePolicy uint8

const (
	// FailOpen allows, with Degraded and Blind set. For limits that protect cost or
	// fairness (API quotas): while Redis is down, serving everyone beats serving no one.
	FailOpen FailurePolicy = iota
	// FailClosed denies with a short RetryAfter (WithClosedRetryAfter, 1 s by default),
	// Degraded and Blind set. For limits that protect security (logins, one-time codes).
	FailClosed
	// FailError returns an error matching ErrUnavailable and lets the caller decide.
	FailError
	// FailLocal enforces the same limits in this process's memory while Redis is
	// unreachable, with the module's algorithms and arithmetic (each limit divided by
	// WithFleetSize, 1 by default): decisions are Degraded, not Blind, Source SourceLocal,
	// with the local limiter's real figures (the middleware answers 429 with the RateLimit
	// fields); what it charged and the leases it granted are given back in memory, during
	// the outage and after it (Refund, RefundDecision, LeaseGuard.Release, Wait's give-back).
	// The first call after Redis answers again is decided by Redis
	// (docs/clients.md#failure-policy-local).
	// At most 100,000 keys are kept in memory (the least recently written are forgotten).
	FailLocal
)

// String returns "open", "closed", "error" or "local".
func (p FailurePolicy) String() string {
	switch p {
	case FailClosed:
		return "closed"
	case FailError:
		return "error"
	case FailLocal:
		return "local"
	}
	return "open"
}

// The counters (docs/clients.md#counters), in the order CounterNames lists them.
const (
	cAllowed = iota
	cDenied
	cAllowedLocally
	cDeniedLocally
	cDegraded
	cErrors
	cRedisCalls
	cRefunded
	cLocal
	cSkipped
	cMissingDenied
	cLeasesLost
	cForwardedUnusable
	cPeerUnknown
	nCounters
)

// CounterNames are the counters' names, as the Python and Rust packages spell them.
var CounterNames = [nCounters]string{
	"allowed", "denied", "allowed_locally", "denied_locally", "degraded", "errors",
	"redis_calls", "refunded", "local", "skipped", "missing_denied", "leases_lost",
	"forwarded_unusable", "peer_unknown",
}

// Hook is called as hook(counterName, n) on every counter increment (for a metrics
// library); it must be cheap, safe for concurrent use, and must not panic.
type Hook func(name string, n uint64)

// Counters counts decisions and Redis calls; lock-free, readable at any time.
//
//   - allowed / denied: every decision returned (local and degraded ones included);
//   - allowed_locally: admitted from a batch credit (WithBatch), without a Redis call;
//   - denied_locally: denied by the deny cache, without a Redis call;
//   - degraded: answered by the failure policy;
//   - errors: Redis calls that failed with an outage;
//   - redis_calls: round trips made;
//   - refunded: units given back (Refund, AcrossSlots' give-backs, batch leftovers), as
//     Redis (or FailLocal's memory) reports them;
//   - local: decisions made in memory by FailLocal (also counted as degraded);
//   - leases_lost: leases found lost while held;
//   - skipped, missing_denied, forwarded_unusable, peer_unknown: counted by the rlhttp
//     middleware (a limit skipped for a missing identity, a 401, an unusable forwarding
//     header, a request without a client address).
type Counters struct {
	values [nCounters]atomic.Uint64
	hook   Hook
}

func (c *Counters) add(i int, n uint64) {
	if n == 0 {
		return
	}
	c.values[i].Add(n)
	if c.hook != nil {
		c.hook(CounterNames[i], n)
	}
}

func (c *Counters) countDecision(d Decision) {
	if d.Allowed {
		c.add(cAllowed, 1)
	} else {
		c.add(cDenied, 1)
	}
	if d.Degraded {
		c.add(cDegraded, 1)
	}
}

// Get returns the counter called name, and whether there is one.
func (c *Counters) Get(name string) (uint64, bool) {
	for i, n := range CounterNames {
		if n == name {
			return c.values[i].Load(), true
		}
	}
	return 0, false
}

// Snapshot returns every counter by name.
func (c *Counters) Snapshot() map[string]uint64 {
	out := make(map[string]uint64, nCounters)
	for i, n := range CounterNames {
		out[n] = c.values[i].Load()
	}
	return out
}

type outage struct {
	started   time.Time
	failures  uint64
	nextProbe time.Time
}

// health tracks Redis failures: one log line per burst, a probe interval, recovery.
//
// While Redis is failing, calls within probeInterval of the last failure are answered by
// the policy without waiting on Redis; the first call after it tries Redis again. The first
// success after a failure logs one recovery line.
type health struct {
	policy           FailurePolicy
	probeInterval    time.Duration
	closedRetryAfter time.Duration
	logger           *slog.Logger

	mu     sync.Mutex
	outage *outage
	down   atomic.Bool // fast path: no lock while Redis answers
}

// skip reports whether to answer by policy without trying Redis (inside the probe interval).
func (h *health) skip() bool {
	if !h.down.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.outage == nil {
		return false
	}
	now := time.Now()
	if now.Before(h.outage.nextProbe) {
		return true
	}
	h.outage.nextProbe = now.Add(h.probeInterval) // this caller probes
	return false
}

func (h *health) success() {
	if !h.down.Load() {
		return
	}
	h.mu.Lock()
	o := h.outage
	h.outage = nil
	h.down.Store(false)
	h.mu.Unlock()
	if o != nil {
		h.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"redis-rl: Redis answers again; decisions come from Redis again",
			slog.Uint64("failures", o.failures), slog.Duration("outage", time.Since(o.started)))
	}
}

func (h *health) failure(c *Counters, cause error) {
	c.add(cErrors, 1)
	now := time.Now()
	h.mu.Lock()
	first := h.outage == nil
	if first {
		h.outage = &outage{started: now, failures: 1, nextProbe: now.Add(h.probeInterval)}
		h.down.Store(true)
	} else {
		h.outage.failures++
		h.outage.nextProbe = now.Add(h.probeInterval)
	}
	h.mu.Unlock()
	if first {
		h.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"redis-rl: Redis unavailable; the failure policy answers until it does (logged once per outage)",
			slog.String("error", cause.Error()), slog.String("policy", h.policy.String()))
	}
}

var errKnownDown = errorString("Redis failed within the probe interval; not retried yet")

type errorString string

func (e errorString) Error() string { return string(e) }

// answer is the policy's decision for s on key (or the error, for FailError).
func (h *health) answer(s Spec, key string, cause error) (Decision, error) {
	if h.policy == FailError {
		if cause == nil {
			cause = errKnownDown
		}
		return Decision{}, &UnavailableError{Cause: cause}
	}
	d := Decision{Degraded: true, Blind: true, Source: SourceLocal, Spec: s, Key: key, Allowed: true}
	if s != nil {
		d.Limit = s.Capacity()
	}
	if h.policy == FailClosed {
		d.Allowed = false
		d.RetryAfter = h.closedRetryAfter
		d.ResetAfter = h.closedRetryAfter
	}
	return d, nil
}

// Add adds n to the counter called name (the HTTP middleware in rlhttp counts skipped,
// missing_denied, forwarded_unusable and peer_unknown here); an unknown name is ignored.
func (c *Counters) Add(name string, n uint64) {
	for i, cn := range CounterNames {
		if cn == name {
			c.add(i, n)
			return
		}
	}
}
