package redisrl

// Batching (docs/clients.md#batching-optional), as clients/rust/src/local.rs and
// limiter.rs's check_batched do it.
//
// A credit is units already paid for in Redis (one QUANTITY k call) and handed out locally.
// Window credits are used and refunded only inside the window they were paid in (a unit paid
// in one window must not be used or given back in the next, or that window would admit more
// than its limit); GCRA leftovers are refunded only while the bucket cannot have drained past
// them (before sent + k·T), so a refund never gives back more than was really unused.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// credit is units paid for in Redis and not yet handed out.
type credit struct {
	key           string // the key as sent (prefix included)
	units         uint64
	useUntil      time.Time
	refundUntil   time.Time
	remainingSeen uint64
}

type hint struct {
	remaining uint64
	at        time.Time
}

// batcher holds one client's batch credits, keyed like the deny cache.
type batcher struct {
	k    uint64
	hold time.Duration

	mu      sync.Mutex
	credits map[string]*credit
	pending []credit // replaced credits still to refund
	hints   map[string]hint

	sweepMu  sync.Mutex
	sweeping bool

	rttNs atomic.Int64
}

func newBatcher(k uint64, hold time.Duration) *batcher {
	b := &batcher{k: k, hold: hold, credits: map[string]*credit{}, hints: map[string]hint{}}
	b.rttNs.Store(int64(time.Millisecond))
	return b
}

// observeRTT keeps a moving average of the batched calls' round trips.
func (b *batcher) observeRTT(sent time.Time) {
	rtt := int64(time.Since(sent))
	old := b.rttNs.Load()
	b.rttNs.Store(old/5*4 + rtt/5)
}

// margin is the safety gap kept before a window boundary or a GCRA refund deadline.
func (b *batcher) margin() time.Duration {
	return 5*time.Millisecond + 3*time.Duration(b.rttNs.Load())
}

// take hands out cost units from a live credit; it returns the credit after the take. A
// credit past its use time stays for expired to refund.
func (b *batcher) take(ck string, cost uint64, now time.Time) (credit, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.credits[ck]
	if c == nil || !now.Before(c.useUntil) || c.units < cost {
		return credit{}, false
	}
	c.units -= cost
	return *c, true
}

// put stores a new credit. A live one it meets (another goroutine's batch of the same key
// and limit, taken at about the same time) is merged into it with the earlier of the two
// deadlines each (before both, both units may be used and refunded), so its units stay
// usable; one past its use time that still holds units is kept for refunding.
func (b *batcher) put(ck string, c credit, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.credits[ck]; old != nil && old.units > 0 {
		if now.Before(old.useUntil) {
			c.units += old.units
			c.remainingSeen = min(c.remainingSeen, old.remainingSeen)
			if old.useUntil.Before(c.useUntil) {
				c.useUntil = old.useUntil
			}
			if old.refundUntil.Before(c.refundUntil) {
				c.refundUntil = old.refundUntil
			}
		} else {
			b.pending = append(b.pending, *old)
		}
	}
	b.credits[ck] = &c
}

// expired removes and returns the credits past their use time that still hold units (all
// of them with everything), and the replaced ones.
func (b *batcher) expired(now time.Time, everything bool) []credit {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.pending
	b.pending = nil
	for ck, c := range b.credits {
		if everything || !now.Before(c.useUntil) {
			if c.units > 0 {
				out = append(out, *c)
			}
			delete(b.credits, ck)
		}
	}
	return out
}

func (b *batcher) empty() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.credits) == 0 && len(b.pending) == 0
}

func (b *batcher) noteRemaining(ck string, remaining uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.hints) > 10_000 {
		clear(b.hints)
	}
	b.hints[ck] = hint{remaining, time.Now()}
}

// size is how many units one batched call of s takes for cost (0: do not batch). LOG is not
// batched (a refund gives back the newest entries, not ours), nor leases.
func (b *batcher) size(s spec, cost uint64) uint64 {
	if s.kind == kindLease || (s.kind == kindWindow && s.alg == Log) {
		return 0
	}
	k := min(b.k, s.capacity)
	if cost < k {
		return k
	}
	return 0
}

// firstTake is how many units to ask for: k, unless the last reply for this key (plus what
// GCRA refilled since) says fewer are there, so that a key running at its limit costs one
// call per admission, not two.
func (b *batcher) firstTake(ck string, s spec, cost, k uint64) uint64 {
	b.mu.Lock()
	h, found := b.hints[ck]
	b.mu.Unlock()
	if !found {
		return k
	}
	remaining := h.remaining
	elapsed := time.Since(h.at)
	if s.kind == kindGCRA {
		if elapsed > 0 && s.interval > 0 {
			refill := uint64(elapsed) / s.interval
			if remaining+refill < remaining {
				remaining = ^uint64(0)
			} else {
				remaining += refill
			}
		}
	} else if elapsed > b.hold {
		return k
	}
	return max(cost, min(k, remaining))
}

// deadlines are (use until, refund until) for taken units paid at sent.
//
// GCRA: use within the hold; refund only before sent + taken·T − margin. FIXED: the window
// ends ResetAfter after Redis decided (≥ sent). SLIDING: after a write the key is idle at the
// end of the next window, so the current one ends ResetAfter − window after Redis decided.
func (b *batcher) deadlines(s spec, taken uint64, sent time.Time, resetAfter time.Duration) (time.Time, time.Time) {
	margin := b.margin()
	notBefore := func(t time.Time) time.Time {
		if t.Before(sent) {
			return sent
		}
		return t
	}
	if s.kind == kindGCRA {
		drain := time.Duration(maxSpan)
		if s.interval == 0 || taken <= uint64(maxSpan)/s.interval {
			drain = time.Duration(taken * s.interval)
		}
		return sent.Add(b.hold), notBefore(sent.Add(drain).Add(-margin))
	}
	end := resetAfter
	if s.alg == Sliding {
		end = max(0, end-time.Duration(s.span))
	}
	boundary := notBefore(sent.Add(end).Add(-margin))
	use := sent.Add(b.hold)
	if boundary.Before(use) {
		use = boundary
	}
	return use, boundary
}

// denialForCost is, from Redis's denial of a batch of taken units, its answer for cost
// units without a second call where the algorithm allows: GCRA (the wait shrinks by
// (taken − cost)·T) and FIXED (the wait is the window's end for any quantity). false: ask
// Redis (SLIDING, or cost might pass now).
func denialForCost(s spec, d Decision, taken, cost uint64) (Decision, bool) {
	if d.Allowed || d.Never || d.Remaining >= cost {
		return Decision{}, false
	}
	retry := d.RetryAfter
	switch {
	case s.kind == kindGCRA:
		back := time.Duration(maxSpan)
		if n := taken - cost; s.interval == 0 || n <= uint64(maxSpan)/s.interval {
			back = time.Duration(n * s.interval)
		}
		retry -= back
		if retry <= time.Millisecond {
			return Decision{}, false
		}
		retry = ceilMs(retry)
	case s.kind == kindWindow && s.alg == Fixed:
	default:
		return Decision{}, false
	}
	d.RetryAfter = retry
	return d, true
}

// fromCredit admits cost units of ck from a live credit, if one holds them. It is asked
// before the deny cache: units paid for in Redis are this process's to hand out even while
// Redis denies the key (a denial cached by one goroutine must not strand another's batch).
func (c *Client) fromCredit(ck, full string, limit Spec, s spec, cost uint64) (Decision, bool) {
	cr, found := c.batch.take(ck, cost, time.Now())
	if !found {
		return Decision{}, false
	}
	d := Decision{Allowed: true, Limit: s.capacity, Remaining: cr.remainingSeen + cr.units, Source: SourceLocal, Spec: limit, Key: full}
	c.counters.add(cAllowedLocally, 1)
	c.counters.countDecision(d)
	return d, true
}

// checkBatched is a plain Check (no Peek, Force or MaxWait; 1 ≤ cost < k) under batching
// that no credit answered (fromCredit): one call takes up to k units, keeps what is beyond cost
// as a credit, and answers (at most three calls when the key has fewer than asked left).
func (c *Client) checkBatched(ctx context.Context, ck, full string, limit Spec, s spec, o checkOptions, k uint64) (Decision, error) {
	b := c.batch
	cost := o.cost
	if c.health.skip() {
		return c.degradedCheck(limit, full, nil, o)
	}
	opc := opWindow
	if s.kind == kindGCRA {
		opc = opGCRA
	}
	want := b.firstTake(ck, s, cost, k)
	var last Decision
	for range 3 {
		args := s.args()
		if want != 1 {
			args = append(args, "QUANTITY", u(want))
		}
		sent := time.Now()
		v, mode, err := c.guarded(ctx, opc, []string{full}, args)
		if err != nil {
			if errors.Is(err, errDown) {
				return c.degradedCheck(limit, full, errors.Unwrap(err), o)
			}
			return Decision{}, err
		}
		b.observeRTT(sent)
		r, err := five(v)
		if err != nil {
			return Decision{}, err
		}
		d := fromReply(r, limit, full, mode.source(), false)
		b.noteRemaining(ck, d.Remaining)
		if d.Allowed {
			if units := want - cost; units > 0 {
				use, refund := b.deadlines(s, want, sent, d.ResetAfter)
				if now := time.Now(); use.After(now) { // else too close to a window's end: they lapse with it
					b.put(ck, credit{key: full, units: units, useUntil: use, refundUntil: refund, remainingSeen: d.Remaining}, now)
					d.Remaining += units
					c.ensureSweeper()
				}
			}
			return c.decided(d), nil
		}
		if c.denyCache != nil {
			c.denyCache.store(ck, []string{full}, want, d, sent)
		}
		last = d
		if d.Never || want == cost {
			break
		}
		if derived, found := denialForCost(s, d, want, cost); found {
			if c.denyCache != nil {
				c.denyCache.store(ck, []string{full}, cost, derived, sent.Add(-time.Millisecond))
			}
			last = derived
			break
		}
		want = max(cost, min(want-1, d.Remaining))
	}
	return c.decided(last), nil
}

// ensureSweeper starts the goroutine that refunds leftovers every hold/2; it ends by itself
// once no credit is held (so an idle Client holds no goroutine).
func (c *Client) ensureSweeper() {
	b := c.batch
	b.sweepMu.Lock()
	defer b.sweepMu.Unlock()
	if b.sweeping {
		return
	}
	b.sweeping = true
	go func() {
		t := time.NewTicker(b.hold / 2)
		defer t.Stop()
		for range t.C {
			c.refundLeftovers(context.Background(), false)
			b.sweepMu.Lock()
			if b.empty() {
				b.sweeping = false
				b.sweepMu.Unlock()
				return
			}
			b.sweepMu.Unlock()
		}
	}()
}

// refundLeftovers gives back (RL.REFUND) the held units whose hold has passed (every held
// unit with everything) where that is still safe, and returns the units refunded. A refund
// Redis does not answer is dropped: a lost refund only under-admits.
func (c *Client) refundLeftovers(ctx context.Context, everything bool) (uint64, error) {
	if c.batch == nil {
		return 0, nil
	}
	var total uint64
	var first error
	for _, cr := range c.batch.expired(time.Now(), everything) {
		if !time.Now().Before(cr.refundUntil) {
			continue // the window rolled over / the bucket may have drained: let it lapse
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
		v, _, err := c.guarded(ctx, opRefund, []string{cr.key}, []any{u(cr.units)})
		if err != nil {
			if !errors.Is(err, errDown) && first == nil {
				first = err
				c.health.logger.LogAttrs(context.Background(), slog.LevelWarn,
					"redis-rl: refund of batch leftovers failed", slog.String("key", cr.key), slog.Any("error", err))
			}
			continue
		}
		c.health.success()
		if r, err := ints(v, 3); err == nil && r[0] > 0 {
			total += uint64(r[0])
			c.counters.add(cRefunded, uint64(r[0]))
		}
	}
	return total, first
}

// Close gives back (RL.REFUND) every batch unit this client still holds, where that is
// still exact (a window's unit only inside its window, a GCRA unit only while the bucket
// cannot have drained past it), and returns how many units Redis took back. Without
// WithBatch it does nothing. The Client still works afterwards; Close does not close the
// go-redis client. Errors: ctx's when it ends first, or the first refund Redis refused
// with an error reply that is not an outage (an outage drops the refund: it only
// under-admits).
func (c *Client) Close(ctx context.Context) (uint64, error) {
	return c.refundLeftovers(ctx, true)
}
