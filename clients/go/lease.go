package redisrl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// ErrLeaseLost matches a *LeaseLostError.
var ErrLeaseLost = errors.New("redis-rl: lease lost")

// LostReason says why a lease was lost.
type LostReason uint8

const (
	// LostNotHeld: a renewal found that the token no longer held a lease (LEASELOST): it
	// lapsed while no renewal reached Redis, and another holder may have had the slots.
	LostNotHeld LostReason = iota + 1
	// LostDenied: a renewal was denied (the limit was lowered below what is held).
	LostDenied
	// LostUnreachable: no renewal reached Redis for a whole lease time.
	LostUnreachable
)

func (r LostReason) String() string {
	switch r {
	case LostNotHeld:
		return "the token no longer holds a lease (it lapsed before a renewal reached Redis)"
	case LostDenied:
		return "a renewal was denied (the limit is below what is held)"
	case LostUnreachable:
		return "no renewal reached Redis for a whole lease time"
	}
	return "unknown"
}

// LeaseLostError is a lease lost while held (docs/clients.md#leases-that-know-they-are-lost).
type LeaseLostError struct {
	Key    string
	Token  string
	Reason LostReason
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("redis-rl: lease on %q lost: %s", e.Key, e.Reason)
}

// Is reports whether target is ErrLeaseLost.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// RateLimitedError is a denial returned as an error (Acquire, Wait): Decision says when the
// request may pass, or that it never can.
type RateLimitedError struct{ Decision Decision }

func (e *RateLimitedError) Error() string { return "redis-rl: rate limited: " + e.Decision.String() }

// Is reports whether target is ErrRateLimited.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

type acquireOptions struct {
	token  string
	slots  uint64
	onLost func(*LeaseLostError)
}

// AcquireOption is an option of Acquire.
type AcquireOption func(*acquireOptions)

// WithToken names the holder (1 to 64 bytes; default: 32 random hex digits). Acquiring again
// with the same token renews that holder's lease instead of taking another slot.
func WithToken(token string) AcquireOption { return func(o *acquireOptions) { o.token = token } }

// WithSlots takes n slots at once (default 1).
func WithSlots(n uint64) AcquireOption { return func(o *acquireOptions) { o.slots = n } }

// OnLost is called once, from the goroutine that found the lease lost (usually the renewing
// one), before Lost() is closed. It may call Release.
func OnLost(f func(*LeaseLostError)) AcquireOption {
	return func(o *acquireOptions) { o.onLost = f }
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Acquire takes a slot of lease on key (RL.LEASE) and returns a guard that renews it in the
// background every third of the lease time (RL.LEASE ... RENEW) until Release. A crashed
// process frees its slot when the lease ends.
//
// No free slot: an error matching ErrRateLimited (a *RateLimitedError with the decision).
// Redis down: the failure policy answers (FailOpen: a degraded guard that holds nothing;
// FailClosed: ErrRateLimited; FailError: ErrUnavailable).
//
// When ctx ends while RL.LEASE is in flight, Acquire returns ctx's error at once; a slot
// that call still granted under the generated token is released in the background as soon
// as its reply arrives. With WithToken the token is the caller's to release (Client.Release).
//
//	guard, err := limiter.Acquire(ctx, "exports:acme", exports)
//	if err != nil { ... }
//	defer guard.Release(context.Background())
//	select {
//	case <-done:
//	case <-guard.Lost(): // stop: the work no longer holds its slot
//	}
func (c *Client) Acquire(ctx context.Context, key string, lease Lease, opts ...AcquireOption) (*LeaseGuard, error) {
	s, err := lease.spec()
	if err != nil {
		return nil, err
	}
	o := acquireOptions{slots: 1}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	generated := o.token == ""
	if generated {
		o.token = newToken()
	}
	if err := checkToken(o.token); err != nil {
		return nil, err
	}
	if o.slots == 0 {
		return nil, invalid("quantity must be a positive integer")
	}
	full, err := c.fullKey(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	args := append(s.args(), o.token)
	if o.slots != 1 {
		args = append(args, "QUANTITY", u(o.slots))
	}
	var d Decision
	if c.health.skip() {
		d, err = c.degradedLease(lease, full, nil, o.token, o.slots)
	} else {
		var v any
		var mode Mode
		v, mode, err = c.leaseCall(ctx, full, args, o.token, generated)
		switch {
		case errors.Is(err, errDown):
			d, err = c.degradedLease(lease, full, errors.Unwrap(err), o.token, o.slots)
		case err == nil:
			var r [5]int64
			if r, err = five(v); err == nil {
				d = c.decided(fromReply(r, lease, full, mode.source(), false))
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if !d.Allowed {
		return nil, &RateLimitedError{Decision: d}
	}
	g := &LeaseGuard{
		c: c, key: full, lease: lease, spec: s, token: o.token, slots: o.slots,
		decision: d, onLost: o.onLost, lost: make(chan struct{}), stop: make(chan struct{}),
		lastRenewed: time.Now(),
	}
	if !d.Blind { // Redis's lease, or FailLocal's (renewed in memory)
		go g.renewLoop()
	}
	return g, nil
}

// leaseReply is RL.LEASE's reply as guarded returns it.
type leaseReply struct {
	v    any
	mode Mode
	err  error
}

// leaseCall sends Acquire's RL.LEASE. The call itself is not cut short by ctx (the client's
// timeout bounds it): when ctx ends first, Acquire returns ctx's error at once and the reply
// is awaited in the background, and a slot it granted under a token this client generated is
// released there (nobody else has that token, so the slot would otherwise stay held until
// the lease time ran out). A token the caller chose (WithToken) is the caller's: it may
// already hold a lease that this call only renewed, so it is left alone, and the caller
// releases it (Client.Release) if it gives up.
func (c *Client) leaseCall(ctx context.Context, full string, args []any, token string, generated bool) (any, Mode, error) {
	replied := make(chan leaseReply, 1)
	go func() {
		v, mode, err := c.guarded(context.WithoutCancel(ctx), opLease, []string{full}, args)
		replied <- leaseReply{v, mode, err}
	}()
	select {
	case r := <-replied:
		return r.v, r.mode, r.err
	case <-ctx.Done():
		if generated {
			go func() {
				r := <-replied
				if r.err != nil {
					return
				}
				if got, err := five(r.v); err == nil && got[0] == 1 {
					// A failed release only under-admits: the slot lapses with its lease.
					_, _ = c.report(context.Background(), opRelease, full, token, false)
				}
			}()
		}
		return nil, 0, ctx.Err()
	}
}

// LeaseGuard is a lease held by Acquire: renewed in the background while held, released by
// Release (call it with defer).
//
// A lease is lost when a renewal finds that the token no longer holds it (LEASELOST), when
// a renewal is denied, or when no renewal reached Redis for a whole lease time. Then Lost()
// is closed, Err() returns the *LeaseLostError, the OnLost hook runs, leases_lost is
// counted, renewals stop, and Release returns the error: work that ran without its slot is
// never reported as guarded.
type LeaseGuard struct {
	c        *Client
	key      string
	lease    Lease
	spec     spec
	token    string
	slots    uint64
	decision Decision
	onLost   func(*LeaseLostError)

	mu          sync.Mutex
	lostErr     *LeaseLostError
	lastRenewed time.Time
	released    bool
	lost        chan struct{}
	stop        chan struct{}
}

// Decision is the decision that granted the lease.
func (g *LeaseGuard) Decision() Decision { return g.decision }

// Key is the key as sent (with the client's prefix).
func (g *LeaseGuard) Key() string { return g.key }

// Token is the holder's token.
func (g *LeaseGuard) Token() string { return g.token }

// Lost is closed when the lease is found lost.
func (g *LeaseGuard) Lost() <-chan struct{} { return g.lost }

// Err is the *LeaseLostError once the lease is lost, else nil.
func (g *LeaseGuard) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lostErr == nil {
		return nil
	}
	return g.lostErr
}

func (g *LeaseGuard) markLost(reason LostReason) *LeaseLostError {
	g.mu.Lock()
	if g.lostErr != nil || g.released {
		// Already lost; or released, when a renewal in flight meets the freed token.
		e := g.lostErr
		if e == nil {
			e = &LeaseLostError{Key: g.key, Token: g.token, Reason: reason}
		}
		g.mu.Unlock()
		return e
	}
	g.lostErr = &LeaseLostError{Key: g.key, Token: g.token, Reason: reason}
	e := g.lostErr
	g.mu.Unlock()
	g.c.counters.add(cLeasesLost, 1)
	g.c.health.logger.Warn(e.Error(), slog.String("key", g.key), slog.String("reason", reason.String()))
	if g.onLost != nil {
		g.onLost(e)
	}
	close(g.lost)
	return e
}

func (g *LeaseGuard) renewLoop() {
	every := max(time.Duration(g.spec.span)/3, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-g.lost:
			return
		case <-t.C:
			// No deadline of its own: the client's timeout bounds the call, and an outage
			// (not this context) must be what a failed renewal meets, so that a lease time
			// without one is seen as lost.
			_, _ = g.Renew(context.Background())
		}
	}
}

// Renew renews the lease now (RL.LEASE ... RENEW), outside the failure policy: an outage
// is an error matching ErrUnavailable, and once a whole lease time has passed without a
// renewal the lease is lost. The background goroutine calls it every third of the lease.
func (g *LeaseGuard) Renew(ctx context.Context) (Decision, error) {
	if err := g.Err(); err != nil {
		return Decision{}, err
	}
	g.mu.Lock()
	released := g.released
	g.mu.Unlock()
	if released {
		return Decision{}, usage("the lease on %q was released", g.key)
	}
	if g.decision.Blind {
		return g.decision, nil // open or closed: holds nothing anywhere
	}
	if g.decision.Degraded {
		return g.renewLocally()
	}
	args := append(g.spec.args(), g.token)
	if g.slots != 1 {
		args = append(args, "QUANTITY", u(g.slots))
	}
	args = append(args, "RENEW")
	v, mode, err := g.c.call(ctx, opLease, []string{g.key}, args)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, ctx.Err()
		}
		if errorCode(err) == "LEASELOST" {
			g.c.health.success()
			return Decision{}, g.markLost(LostNotHeld)
		}
		if isUnavailable(err) {
			g.c.counters.add(cErrors, 1)
			g.mu.Lock()
			last := g.lastRenewed
			g.mu.Unlock()
			if time.Since(last) > time.Duration(g.spec.span) {
				return Decision{}, g.markLost(LostUnreachable)
			}
			return Decision{}, &UnavailableError{Cause: err}
		}
		return Decision{}, err
	}
	g.c.health.success()
	r, err := five(v)
	if err != nil {
		return Decision{}, err
	}
	d := fromReply(r, g.lease, g.key, mode.source(), false)
	if !d.Allowed {
		return d, g.markLost(LostDenied)
	}
	g.mu.Lock()
	g.lastRenewed = time.Now()
	g.mu.Unlock()
	return d, nil
}

// Release stops the renewals and frees the slots (RL.RELEASE); harmless twice, and safe from
// the OnLost hook. When the
// lease was lost while held it returns the *LeaseLostError (after releasing what may still
// be held).
func (g *LeaseGuard) Release(ctx context.Context) (Refunded, error) {
	g.mu.Lock()
	first := !g.released
	g.released = true
	g.mu.Unlock()
	if first {
		close(g.stop) // a renewal in flight that meets the freed token is ignored
	}
	var r Refunded
	var err error
	switch {
	case first && g.decision.Degraded && !g.decision.Blind && g.c.memory != nil:
		m := g.c.memory.release(g.key, g.token) // FailLocal's lease: held in memory
		r = Refunded{Units: nonNeg(m[0]), Remaining: nonNeg(m[1]), ResetAfter: msDuration(m[2]), Degraded: true}
	case first && !g.decision.Degraded:
		r, err = g.c.report(ctx, opRelease, g.key, g.token, false)
	}
	if lost := g.Err(); lost != nil {
		return r, lost
	}
	return r, err
}

// String describes the guard.
func (g *LeaseGuard) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "LeaseGuard(%q, %d slot(s)", g.key, g.slots)
	if g.Err() != nil {
		b.WriteString(", lost")
	}
	b.WriteString(")")
	return b.String()
}

// renewLocally renews a lease FailLocal granted, in memory (RENEW's rule: lost when the
// token no longer holds it).
func (g *LeaseGuard) renewLocally() (Decision, error) {
	ls, s, err := g.c.localSpec(g.lease)
	if err != nil {
		return Decision{}, err
	}
	r, err := g.c.memory.lease(g.key, s, g.token, g.slots, false, true)
	if err != nil {
		if strings.HasPrefix(err.Error(), "LEASELOST") {
			return Decision{}, g.markLost(LostNotHeld)
		}
		return Decision{}, err
	}
	d := local(r, ls, g.key, false)
	if !d.Allowed {
		return d, g.markLost(LostDenied)
	}
	g.mu.Lock()
	g.lastRenewed = time.Now()
	g.mu.Unlock()
	return d, nil
}
