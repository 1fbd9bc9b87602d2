package redisrl

import (
	"context"
	"errors"
	"strings"
	"time"
)

// keySlot is a key's Redis Cluster slot: CRC16 (XMODEM) of its hash tag (the text between
// the first '{' and the next '}', when not empty) or of the whole key, mod 16384.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// slotGroups groups entry indexes by slot, in the order each slot first appears.
func slotGroups(keys []string) [][]int {
	var groups [][]int
	at := map[uint16]int{}
	for i, k := range keys {
		s := keySlot(k)
		g, ok := at[s]
		if !ok {
			g = len(groups)
			at[s] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// checkAcrossSlots is AcrossSlots' CheckAll: one RL.ALL per slot group, refunds when a later
// group denies, the rest peeked, the decisions combined.
func (c *Client) checkAcrossSlots(ctx context.Context, entries []Entry, keys []string, specs []spec, groups [][]int, o checkOptions) (Decision, error) {
	per := make([]Decision, len(entries))
	sub := func(g []int) ([]Entry, []string, []spec) {
		e, k, s := make([]Entry, len(g)), make([]string, len(g)), make([]spec, len(g))
		for j, i := range g {
			e[j], k[j], s[j] = entries[i], keys[i], specs[i]
		}
		return e, k, s
	}
	charge := func(i int) uint64 {
		if entries[i].hasCost {
			return entries[i].cost
		}
		return o.cost
	}
	deniedAt := -1
	for gi, g := range groups {
		e, k, s := sub(g)
		d, err := c.checkAll(ctx, e, k, s, o, false)
		if err != nil {
			if gi > 0 && !o.peek {
				c.giveBack(ctx, entries, keys, per, groups[:gi], charge)
			}
			return Decision{}, err
		}
		for j, i := range g {
			per[i] = d.PerKey[j]
		}
		if !d.Allowed {
			deniedAt = gi
			break
		}
	}
	if deniedAt >= 0 {
		if deniedAt > 0 && !o.peek {
			c.giveBack(ctx, entries, keys, per, groups[:deniedAt], charge)
		}
		peek := o
		peek.peek = true
		for _, g := range groups[deniedAt+1:] {
			e, k, s := sub(g)
			d, err := c.checkAll(ctx, e, k, s, peek, false)
			if err != nil {
				return Decision{}, err
			}
			for j, i := range g {
				per[i] = d.PerKey[j]
			}
		}
	}
	charges := make([]uint64, len(entries))
	for i := range entries {
		charges[i] = charge(i)
	}
	d := combine(per, charges)
	if d.Degraded && !d.Blind {
		c.counters.add(cLocal, 1) // FailLocal decided it in memory
	}
	c.counters.countDecision(d)
	return d, nil
}

// giveBack refunds (or, for a lease, releases) what the groups' calls took, where each
// took it (per[i]: Redis, or FailLocal's memory).
func (c *Client) giveBack(ctx context.Context, entries []Entry, keys []string, per []Decision, groups [][]int, charge func(int) uint64) {
	rctx := context.WithoutCancel(ctx) // the client's timeout bounds each call
	for _, g := range groups {
		for _, i := range g {
			n := charge(i)
			if n == 0 {
				continue
			}
			s, _ := entries[i].limit.spec()
			var err error
			switch {
			case s.kind == kindLease && c.takenLocally(per[i]):
				c.memory.release(keys[i], entries[i].token)
			case s.kind == kindLease:
				_, err = c.report(rctx, opRelease, keys[i], entries[i].token, false)
			default:
				var r Refunded
				r, err = c.refundTo(rctx, per[i], keys[i], n)
				if err == nil {
					c.counters.add(cRefunded, r.Units)
				}
			}
			if err != nil && !errors.Is(err, ErrUnavailable) {
				c.health.logger.Warn("redis-rl: giving back an earlier slot group's charge failed", "key", keys[i], "error", err.Error())
			}
		}
	}
}

// combine is RL.ALL's rule for per-key decisions, each with the charge it was asked
// (docs/reference.md#r-cost-3, src/decision.rs combine): the binding limit admits the
// fewest further calls of this shape (remaining / charge; ties: the smaller remaining, then
// the first); allowed only if every charged limit allows; Never if any can never pass; else
// the longest wait.
func combine(per []Decision, charges []uint64) Decision {
	anyCharged := false
	for _, ch := range charges {
		anyCharged = anyCharged || ch > 0
	}
	part := func(i int) bool { return charges[i] > 0 || !anyCharged }
	bind := -1
	var bindCalls, bindRemaining uint64
	allowed, never := true, false
	var retry, reset time.Duration
	for i, d := range per {
		if !part(i) {
			continue
		}
		calls := d.Remaining
		if charges[i] > 0 {
			calls = d.Remaining / charges[i]
		}
		if bind < 0 || calls < bindCalls || (calls == bindCalls && d.Remaining < bindRemaining) {
			bind, bindCalls, bindRemaining = i, calls, d.Remaining
		}
		if !d.Allowed {
			allowed = false
			if d.Never {
				never = true
			} else {
				retry = max(retry, d.RetryAfter)
			}
		}
		reset = max(reset, d.ResetAfter)
	}
	out := Decision{Allowed: allowed, ResetAfter: reset, PerKey: per}
	if !allowed {
		if never {
			out.Never = true
		} else {
			out.RetryAfter = max(retry, time.Nanosecond)
		}
	}
	if bind >= 0 {
		out.Limit, out.Remaining, out.Spec = per[bind].Limit, per[bind].Remaining, per[bind].Spec
	}
	for _, d := range per {
		out.Degraded = out.Degraded || d.Degraded
		out.Blind = out.Blind || d.Blind
	}
	if len(per) > 0 {
		out.Source = per[0].Source
	}
	return out
}
