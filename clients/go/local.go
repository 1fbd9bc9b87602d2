package redisrl

import (
	"sync"
	"time"
)

// denyCache answers denied keys locally until their RetryAfter runs out
// (docs/clients.md#local-deny-cache).
//
// After Redis denies cost units of (key, limit) with RetryAfter r, a request of the same
// limit for at least cost units is denied locally until sent + r, where sent is when the
// denied request was sent (Redis decided at or after that instant, so the local deadline is
// never later than Redis's). It only ever denies. Its answers carry the time left, not the
// figures Redis gave (docs/clients.md#answers-from-the-local-deny-cache).
type denyCache struct {
	mu         sync.Mutex
	entries    map[string]denial
	maxEntries int
}

type denial struct {
	until, resetUntil time.Time
	cost              uint64
	keys              []string
	decision          Decision
}

func newDenyCache(maxEntries int) *denyCache {
	return &denyCache{entries: map[string]denial{}, maxEntries: maxEntries}
}

func ceilMs(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}

// lookup is a local denial for cost units of ck at now, if one holds.
func (c *denyCache) lookup(ck string, cost uint64, now time.Time) (Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[ck]
	if !ok {
		return Decision{}, false
	}
	if !now.Before(e.until) {
		delete(c.entries, ck)
		return Decision{}, false
	}
	if cost < e.cost {
		return Decision{}, false // a smaller request may pass sooner: ask Redis
	}
	d := e.decision
	retry := max(ceilMs(e.until.Sub(now)), time.Millisecond)
	reset := max(e.resetUntil.Sub(now), retry)
	d.Allowed, d.Never, d.Remaining, d.RetryAfter, d.ResetAfter = false, false, 0, retry, reset
	d.Degraded, d.Blind, d.Source = false, false, SourceLocal
	return d, true
}

// store remembers a retryable denial decided no earlier than sent.
func (c *denyCache) store(ck string, keys []string, cost uint64, d Decision, sent time.Time) {
	if d.Allowed || d.Never || d.Degraded {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[ck]; !ok && len(c.entries) >= c.maxEntries {
		for k, e := range c.entries {
			if !e.until.After(now) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.maxEntries {
			clear(c.entries) // forgetting a denial only costs a round trip
		}
	}
	c.entries[ck] = denial{until: sent.Add(d.RetryAfter), resetUntil: sent.Add(d.ResetAfter), cost: cost, keys: keys, decision: d}
}

// forget drops every entry that involves key (after a refund).
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ck, e := range c.entries {
		for _, k := range e.keys {
			if k == key {
				delete(c.entries, ck)
				break
			}
		}
	}
}
