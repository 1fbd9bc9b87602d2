package redisrl

// The limits in process memory, for the failure policy FailLocal
// (docs/clients.md#failure-policy-local): the module's algorithms in the module's integer
// arithmetic (nanoseconds, no floats), ported from the Python package's
// clients/python/src/redis_rl/_memory.py, which follows docs/reference.md and the core's
// src/algo/*.rs line for line. Products that may pass 64 bits are computed in 128 (u128,
// math/bits); every span is at most MaxSeconds (< 2^59 ns), so no sum of them passes 128.
//
// memoryStore answers with the module's reply shapes (five integers; RL.ALL's pair;
// RL.REFUND's and RL.RELEASE's three). A key whose state is idle (its reset passed) is
// gone, as an expired Redis key is. A key is kept per algorithm (Redis refuses a key used
// with another algorithm; the calls that reach this store were valid ones).

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"sync"
	"time"
)

const (
	u64max  = math.MaxUint64
	i63max  = math.MaxInt64
	nsPerMs = 1_000_000
)

var (
	errForceWithLog = errors.New("ERR FORCE cannot be used with LOG: a LOG records each admitted request and never holds more " +
		"than its limit; use FIXED or SLIDING to record usage after the fact")
	errForceOnLease = errors.New("ERR FORCE cannot be used on a LEASE limit: its slots are taken with RL.LEASE and given back " +
		"with RL.RELEASE")
	errOverflow = errors.New("ERR arithmetic overflow: QUANTITY, period and rate would move the key's time past 64-bit " +
		"nanoseconds")
)

// -- 128-bit arithmetic ------------------------------------------------------------------

type u128 struct{ hi, lo uint64 }

func w128(x uint64) u128 { return u128{0, x} }

func mul128(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}
}

// sub is a - b for a >= b.
func (a u128) sub(b u128) u128 {
	lo, borrow := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, borrow)
	return u128{hi, lo}
}

func (a u128) less(b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }

// since is a - b, not below zero.
func (a u128) since(b u128) u128 {
	if b.less(a) {
		return a.sub(b)
	}
	return u128{}
}

// div is a / d (d > 0).
func (a u128) div(d uint64) u128 {
	q1, r := a.hi/d, a.hi%d
	q0, _ := bits.Div64(r, a.lo, d)
	return u128{q1, q0}
}

// ceilDiv is a / d rounded up (d > 0).
func (a u128) ceilDiv(d uint64) u128 { return a.add(w128(d - 1)).div(d) }

func (a u128) fits() bool { return a.hi == 0 }

// sat is a, at most 2^64 - 1.
func (a u128) sat() uint64 {
	if a.hi != 0 {
		return u64max
	}
	return a.lo
}

func since64(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

func satAdd(a, b uint64) uint64 { return w128(a).add(w128(b)).sat() }

func floorTo(t, window uint64) uint64 { return t - t%window }

func ceilNsToMs(ns uint64) uint64 { return w128(ns).ceilDiv(nsPerMs).lo }

func i63(n uint64) int64 {
	if n > i63max {
		return i63max
	}
	return int64(n)
}

// -- verdicts and replies ------------------------------------------------------------------

type verdict uint8

const (
	vAllowed verdict = iota
	vReserved
	vDenied
	vNever
)

type mDecision struct {
	kind                          verdict
	wait, limit, remaining, reset uint64 // ns for wait and reset
}

func (d mDecision) allowed() bool { return d.kind == vAllowed || d.kind == vReserved }

// five is the module's reply (commands/mod.rs five).
func (d mDecision) five() [5]int64 {
	retry := int64(-1)
	switch d.kind {
	case vDenied:
		retry = i63(max(1, ceilNsToMs(d.wait)))
	case vReserved:
		retry = i63(ceilNsToMs(d.wait))
	}
	allowed := int64(0)
	if d.allowed() {
		allowed = 1
	}
	return [5]int64{allowed, i63(d.limit), i63(d.remaining), retry, i63(ceilNsToMs(d.reset))}
}

type charged struct {
	d    mDecision
	cost uint64
}

// combineMemory is RL.ALL's combined decision (decision.rs combine).
func combineMemory(decisions []charged) mDecision {
	anyCharged := false
	for _, x := range decisions {
		anyCharged = anyCharged || x.cost > 0
	}
	var taking []mDecision
	for _, x := range decisions {
		if x.cost > 0 || !anyCharged {
			taking = append(taking, x.d)
		}
	}
	var binding *mDecision
	var best [3]uint64
	allAllowed, anyNever := true, false
	var wait, reset uint64
	denied := false
	j := 0
	for _, x := range decisions {
		if !(x.cost > 0 || !anyCharged) {
			continue
		}
		d := x.d
		per := d.remaining
		if x.cost > 0 {
			per = d.remaining / x.cost
		}
		rank := [3]uint64{per, d.remaining, uint64(j)}
		if binding == nil || rank[0] < best[0] || (rank[0] == best[0] && (rank[1] < best[1] || (rank[1] == best[1] && rank[2] < best[2]))) {
			best, binding = rank, &taking[j]
		}
		allAllowed = allAllowed && d.allowed()
		anyNever = anyNever || d.kind == vNever
		if d.kind == vDenied {
			if !denied || d.wait > wait {
				wait = d.wait
			}
			denied = true
		}
		reset = max(reset, d.reset)
		j++
	}
	out := mDecision{kind: vAllowed, reset: reset}
	switch {
	case allAllowed:
	case anyNever:
		out.kind = vNever
	default:
		out.kind = vDenied
		if !denied {
			wait = 1
		}
		out.wait = wait
	}
	if binding != nil {
		out.limit, out.remaining = binding.limit, binding.remaining
	}
	return out
}

// -- GCRA (src/algo/gcra.rs) ------------------------------------------------------------------

type gcraState struct{ tat, interval, burst, updated uint64 }

func gcraEffectiveTat(interval uint64, s *gcraState, now uint64) uint64 {
	if s == nil || s.tat <= now {
		return now
	}
	if s.interval == interval {
		return s.tat
	}
	written := min(s.updated, s.tat)
	inUse := s.tat - written
	converted := mul128(inUse, interval).ceilDiv(max(1, s.interval))
	return max(w128(written).add(converted).sat(), now)
}

func gcraReport(burst, interval uint64, kind verdict, wait, tat, now uint64) mDecision {
	inUse := since64(tat, now)
	remaining := mul128(burst, interval).since(w128(inUse)).div(max(1, interval)).sat()
	return mDecision{kind, wait, burst, remaining, inUse}
}

func gcraDecide(burst, t uint64, s *gcraState, now, n uint64, maxWait *uint64) (mDecision, *gcraState, error) {
	tat := gcraEffectiveTat(t, s, now)
	admitted := vAllowed
	if maxWait != nil {
		admitted = vReserved
	}
	if n == 0 {
		return gcraReport(burst, t, admitted, 0, tat, now), nil, nil
	}
	if n > burst {
		return gcraReport(burst, t, vNever, 0, tat, now), nil, nil
	}
	newTat := w128(tat).add(mul128(n, t))
	ahead := newTat.sub(w128(now))
	tolerance := mul128(burst, t)
	admit := func(kind verdict, delay uint64) (mDecision, *gcraState, error) {
		if !newTat.fits() {
			return mDecision{}, nil, errOverflow
		}
		arrives := now
		if kind == vReserved {
			arrives = min(satAdd(now, delay), newTat.lo)
		}
		return gcraReport(burst, t, kind, delay, newTat.lo, now), &gcraState{newTat.lo, t, burst, arrives}, nil
	}
	if !tolerance.less(ahead) {
		return admit(admitted, 0)
	}
	wait := ahead.sub(tolerance).sat()
	if maxWait != nil && wait <= *maxWait {
		return admit(vReserved, wait)
	}
	return gcraReport(burst, t, vDenied, wait, tat, now), nil, nil
}

func gcraForce(burst, t uint64, s *gcraState, now, n uint64) (mDecision, *gcraState, error) {
	if n == 0 {
		return gcraDecide(burst, t, s, now, 0, nil)
	}
	cost := mul128(t, n)
	tat := w128(gcraEffectiveTat(t, s, now)).add(cost)
	if !cost.fits() || !tat.fits() {
		return mDecision{}, nil, errOverflow
	}
	return gcraReport(burst, t, vAllowed, 0, tat.lo, now), &gcraState{tat.lo, t, burst, now}, nil
}

func gcraRefund(s *gcraState, now, q uint64) (*gcraState, uint64) {
	t := max(1, s.interval)
	inUse := since64(s.tat, now)
	refunded := min(q, w128(inUse).ceilDiv(t).sat())
	back := mul128(q, t)
	tat := now
	if back.less(w128(inUse)) {
		tat = s.tat - back.lo
	}
	if tat <= now {
		return nil, refunded
	}
	after := *s
	after.tat, after.updated = tat, min(s.updated, tat)
	return &after, refunded
}

// -- FIXED (src/algo/fixed_window.rs) -----------------------------------------------------------

type fixedState struct{ window, limit, windowStart, count, updated uint64 }

func fixedCount(s *fixedState, windowStart uint64) uint64 {
	if s != nil && s.updated >= windowStart {
		return s.count
	}
	return 0
}

func fixedDecide(limit, window uint64, s *fixedState, now, n uint64, force bool) (mDecision, *fixedState, error) {
	at := now
	if s != nil {
		at = max(now, s.updated)
	}
	start := floorTo(at, window)
	end128 := w128(start).add(w128(window))
	if !end128.fits() {
		return mDecision{}, nil, errOverflow
	}
	toEnd := since64(end128.lo, now)
	count := fixedCount(s, start)
	report := func(kind verdict, wait, after uint64) mDecision {
		reset := uint64(0)
		if after > 0 {
			reset = toEnd
		}
		return mDecision{kind, wait, limit, since64(limit, after), reset}
	}
	if n == 0 {
		return report(vAllowed, 0, count), nil, nil
	}
	if force {
		after := w128(count).add(w128(n))
		if !after.fits() {
			return mDecision{}, nil, errOverflow
		}
		return mDecision{vAllowed, 0, limit, since64(limit, after.lo), toEnd}, &fixedState{window, limit, start, after.lo, at}, nil
	}
	if n > limit {
		return report(vNever, 0, count), nil, nil
	}
	if count > limit-n {
		return report(vDenied, toEnd, count), nil, nil
	}
	return report(vAllowed, 0, count+n), &fixedState{window, limit, start, count + n, at}, nil
}

func fixedRefund(s *fixedState, now, q uint64) (*fixedState, uint64) {
	start := floorTo(max(now, s.updated), s.window)
	count := fixedCount(s, start)
	refunded := min(q, count)
	left := count - refunded
	if left == 0 {
		return nil, refunded
	}
	after := *s
	after.count = left
	return &after, refunded
}

// -- SLIDING (src/algo/sliding_window.rs) -------------------------------------------------------

type slidingState struct{ window, limit, windowStart, prev, curr, updated uint64 }

func slidingCounts(s *slidingState, now, window uint64) (prev, curr uint64) {
	if s == nil {
		return 0, 0
	}
	start := floorTo(now, window)
	prevStart := since64(start, window)
	place := func(last, n uint64) {
		switch {
		case n == 0:
		case last >= start:
			curr = satAdd(curr, n)
		case last >= prevStart && start > 0:
			prev = satAdd(prev, n)
		}
	}
	place(max(s.updated, s.windowStart), s.curr)
	if s.windowStart >= 1 {
		place(s.windowStart-1, s.prev)
	}
	return prev, curr
}

func scaledEstimate(prev, curr, elapsed, window uint64) u128 {
	return mul128(prev, since64(window, elapsed)).add(mul128(curr, window))
}

func earliestOffset(prev, room, startFrom, window uint64) (uint64, bool) {
	if prev == 0 {
		return startFrom, true
	}
	k := mul128(room, window).div(prev)
	if !k.less(w128(window)) {
		return startFrom, true
	}
	e := window - k.lo
	if e < window {
		return max(e, startFrom), true
	}
	return 0, false
}

func slidingDecide(limit, window uint64, s *slidingState, now, n uint64, force bool) (mDecision, *slidingState, error) {
	at := now
	if s != nil {
		at = max(now, s.updated)
	}
	start := floorTo(at, window)
	elapsed := at - start
	nextEnd128 := w128(start).add(w128(window)).add(w128(window))
	if !nextEnd128.fits() {
		return mDecision{}, nil, errOverflow
	}
	end, nextEnd := start+window, nextEnd128.lo
	prev, curr := slidingCounts(s, at, window)
	limitScaled := mul128(limit, window)
	report := func(kind verdict, wait, p, c uint64) mDecision {
		est := scaledEstimate(p, c, elapsed, window)
		remaining := limitScaled.since(est).div(window).sat()
		reset := uint64(0)
		switch {
		case c > 0:
			reset = since64(nextEnd, now)
		case p > 0:
			reset = since64(end, now)
		}
		return mDecision{kind, wait, limit, remaining, reset}
	}
	if n == 0 {
		return report(vAllowed, 0, prev, curr), nil, nil
	}
	if force {
		after := w128(curr).add(w128(n))
		if !after.fits() {
			return mDecision{}, nil, errOverflow
		}
		d := report(vAllowed, 0, prev, after.lo)
		d.reset = since64(nextEnd, now)
		return d, &slidingState{window, limit, start, prev, after.lo, at}, nil
	}
	if n > limit {
		return report(vNever, 0, prev, curr), nil, nil
	}
	if !limitScaled.less(scaledEstimate(prev, curr, elapsed, window).add(mul128(n, window))) {
		after := w128(curr).add(w128(n))
		if !after.fits() {
			return mDecision{}, nil, errOverflow
		}
		return report(vAllowed, 0, prev, after.lo), &slidingState{window, limit, start, prev, after.lo, at}, nil
	}
	offset, has := uint64(0), false
	if cn := w128(curr).add(w128(n)); !w128(limit).less(cn) {
		offset, has = earliestOffset(prev, limit-cn.lo, elapsed, window)
	}
	var admitsAt uint64
	if has {
		admitsAt = satAdd(start, offset)
	} else if nxt, ok := earliestOffset(curr, limit-n, 0, window); ok {
		admitsAt = satAdd(end, nxt)
	} else {
		admitsAt = nextEnd
	}
	return report(vDenied, max(1, since64(admitsAt, now)), prev, curr), nil, nil
}

func slidingRefund(s *slidingState, now, q uint64) (*slidingState, uint64) {
	at := max(now, s.updated)
	start := floorTo(at, s.window)
	prev, curr := slidingCounts(s, at, s.window)
	refunded := min(q, curr)
	curr -= refunded
	if curr == 0 && prev == 0 {
		return nil, refunded
	}
	updated := start
	if curr > 0 {
		updated = max(s.updated, start)
	}
	return &slidingState{s.window, s.limit, start, prev, curr, updated}, refunded
}

// -- LOG (src/algo/sliding_log.rs) ----------------------------------------------------------------

type logEntry struct{ at, count uint64 }

type logState struct {
	window, limit uint64
	entries       []logEntry // oldest first
}

// cutoff is now - window, ok false when now < window (everything is in the window).
func logCutoff(now, window uint64) (uint64, bool) {
	if now >= window {
		return now - window, true
	}
	return 0, false
}

func (s *logState) countAfter(cutoff uint64, has bool) uint64 {
	var n uint64
	for _, e := range s.entries {
		if !has || e.at > cutoff {
			n = satAdd(n, e.count)
		}
	}
	return n
}

func (s *logState) nthAfter(cutoff uint64, has bool, n uint64) (uint64, bool) {
	var seen uint64
	for _, e := range s.entries {
		if has && e.at <= cutoff {
			continue
		}
		seen = satAdd(seen, e.count)
		if seen >= n {
			return e.at, true
		}
	}
	return 0, false
}

func (s *logState) copied() *logState {
	return &logState{s.window, s.limit, append([]logEntry(nil), s.entries...)}
}

func (s *logState) dropUntil(cutoff uint64) {
	kept := s.entries[:0]
	for _, e := range s.entries {
		if e.at > cutoff {
			kept = append(kept, e)
		}
	}
	s.entries = kept
}

func (s *logState) push(at, count uint64) {
	if n := len(s.entries); n > 0 && at <= s.entries[n-1].at {
		s.entries[n-1].count += count
		return
	}
	s.entries = append(s.entries, logEntry{at, count})
}

func (s *logState) popBack(count uint64) {
	for count > 0 && len(s.entries) > 0 {
		last := &s.entries[len(s.entries)-1]
		taken := min(count, last.count)
		last.count -= taken
		count -= taken
		if last.count == 0 {
			s.entries = s.entries[:len(s.entries)-1]
		}
	}
}

func logDecide(limit, window uint64, s *logState, now, n uint64) (mDecision, *logState, error) {
	cutoff, hasCut := logCutoff(now, window)
	var inWindow, newest uint64
	hasNewest := false
	if s != nil {
		inWindow = s.countAfter(cutoff, hasCut)
		if len(s.entries) > 0 {
			newest, hasNewest = s.entries[len(s.entries)-1].at, true
		}
	}
	if hasNewest && hasCut && newest <= cutoff {
		hasNewest = false
	}
	report := func(kind verdict, wait, count, last uint64, hasLast bool) (mDecision, error) {
		reset := uint64(0)
		if hasLast {
			end := w128(last).add(w128(window))
			if !end.fits() {
				return mDecision{}, errOverflow
			}
			reset = since64(end.lo, now)
		}
		return mDecision{kind, wait, limit, since64(limit, count), reset}, nil
	}
	if n == 0 {
		d, err := report(vAllowed, 0, inWindow, newest, hasNewest)
		return d, nil, err
	}
	if n > limit {
		d, err := report(vNever, 0, inWindow, newest, hasNewest)
		return d, nil, err
	}
	after := w128(inWindow).add(w128(n))
	if !after.fits() {
		return mDecision{}, nil, errOverflow
	}
	if after.lo <= limit {
		written := &logState{window: window, limit: limit}
		if s != nil {
			written = s.copied()
			written.window, written.limit = window, limit
		}
		if hasCut {
			written.dropUntil(cutoff)
		}
		written.push(now, n)
		last := now
		if hasNewest {
			last = max(newest, now)
		}
		d, err := report(vAllowed, 0, after.lo, last, true)
		if err != nil {
			return mDecision{}, nil, err
		}
		return d, written, nil
	}
	need := after.lo - limit
	var at uint64
	ok := false
	if s != nil {
		at, ok = s.nthAfter(cutoff, hasCut, need)
	}
	leavesAt := satAdd(now, window)
	if ok {
		end := w128(at).add(w128(window))
		if !end.fits() {
			return mDecision{}, nil, errOverflow
		}
		leavesAt = end.lo
	}
	d, err := report(vDenied, max(1, since64(leavesAt, now)), inWindow, newest, hasNewest)
	return d, nil, err
}

func logRefund(s *logState, now, q uint64) (*logState, uint64) {
	cutoff, hasCut := logCutoff(now, s.window)
	inWindow := s.countAfter(cutoff, hasCut)
	refunded := min(q, inWindow)
	if refunded == 0 {
		return s, 0
	}
	if refunded >= inWindow {
		return nil, refunded
	}
	after := s.copied()
	if hasCut {
		after.dropUntil(cutoff)
	}
	after.popBack(q)
	return after, refunded
}

// -- LEASE (src/algo/lease.rs) --------------------------------------------------------------------

type heldLease struct{ slots, expiry uint64 }

type leaseState struct {
	limit uint64
	held  map[string]heldLease // token -> slots, expiry
}

func (s *leaseState) live(now uint64) map[string]heldLease {
	out := map[string]heldLease{}
	if s == nil {
		return out
	}
	for t, h := range s.held {
		if h.expiry > now {
			out[t] = h
		}
	}
	return out
}

func (s *leaseState) report(now uint64) mDecision {
	var slots, last uint64
	has := false
	for _, h := range s.live(now) {
		slots = satAdd(slots, h.slots)
		if !has || h.expiry > last {
			last, has = h.expiry, true
		}
	}
	reset := uint64(0)
	if has {
		reset = since64(last, now)
	}
	return mDecision{vAllowed, 0, s.limit, since64(s.limit, slots), reset}
}

func leaseDecide(limit, leaseNs uint64, s *leaseState, now uint64, token string, n uint64) (mDecision, *leaseState, error) {
	live := s.live(now)
	own, hasOwn := live[token]
	others := map[string]heldLease{}
	var heldOthers, lastNow uint64
	hasLast := false
	for t, h := range live {
		if !hasLast || h.expiry > lastNow {
			lastNow, hasLast = h.expiry, true
		}
		if t != token {
			others[t] = h
			heldOthers = satAdd(heldOthers, h.slots)
		}
	}
	heldNow := heldOthers
	if hasOwn {
		heldNow = satAdd(heldNow, own.slots)
	}
	report := func(kind verdict, wait, held, last uint64, hasLast bool) mDecision {
		reset := uint64(0)
		if hasLast {
			reset = since64(last, now)
		}
		return mDecision{kind, wait, limit, since64(limit, held), reset}
	}
	if n == 0 {
		return report(vAllowed, 0, heldNow, lastNow, hasLast), nil, nil
	}
	if n > limit {
		return report(vNever, 0, heldNow, lastNow, hasLast), nil, nil
	}
	if heldOthers <= limit-n {
		expires := w128(now).add(w128(leaseNs))
		if !expires.fits() {
			return mDecision{}, nil, errOverflow
		}
		last := expires.lo
		for _, h := range others {
			last = max(last, h.expiry)
		}
		written := &leaseState{limit: limit, held: others}
		written.held[token] = heldLease{n, expires.lo}
		return report(vAllowed, 0, heldOthers+n, last, true), written, nil
	}
	need := heldOthers - (limit - n)
	sorted := make([]heldLease, 0, len(others))
	for _, h := range others {
		sorted = append(sorted, h)
	}
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].expiry != sorted[j].expiry {
			return sorted[i].expiry < sorted[j].expiry
		}
		return sorted[i].slots < sorted[j].slots
	})
	at := satAdd(now, leaseNs)
	for _, h := range sorted {
		if h.slots >= need {
			at = h.expiry
			break
		}
		need -= h.slots
	}
	return report(vDenied, max(1, since64(at, now)), heldNow, lastNow, hasLast), nil, nil
}

func shown(s string) string {
	r := []rune(s)
	if len(r) > 64 {
		r = r[:64]
	}
	return string(r)
}

// -- the store -------------------------------------------------------------------------------------

type storeKey struct {
	key  string
	kind byte // G, F, S, L, E
}

type storeEntry struct {
	id         storeKey
	state      any
	expireAtMs uint64
	// owed is the units this store charged the key (checks, FORCE) and has not been given
	// back yet: a Refund after Redis answers again gives them back here, where they were
	// taken (refund with owedOnly). It lives as long as the key does.
	owed uint64
}

// memoryStore holds the in-memory limits of one client (safe for concurrent use). At most
// maxKeys keys are kept (the least recently written go first when more are made): an outage
// with very many distinct clients forgets the oldest, never grows without bound. clock gives
// nanoseconds since the epoch (by default the host's, at microsecond resolution, as the
// module reads it).
type memoryStore struct {
	maxKeys int
	clock   func() uint64

	mu    sync.Mutex
	keys  map[storeKey]*list.Element
	order *list.List // of *storeEntry, least recently written first
}

func newMemoryStore(maxKeys int, clock func() uint64) *memoryStore {
	if clock == nil {
		clock = func() uint64 { return uint64(time.Now().UnixNano()) / 1000 * 1000 }
	}
	return &memoryStore{maxKeys: maxKeys, clock: clock, keys: map[storeKey]*list.Element{}, order: list.New()}
}

func specKind(s spec) byte {
	switch s.kind {
	case kindGCRA:
		return 'G'
	case kindLease:
		return 'E'
	}
	switch s.alg {
	case Fixed:
		return 'F'
	case Log:
		return 'L'
	}
	return 'S'
}

func (m *memoryStore) load(key string, kind byte, now uint64) any {
	el, ok := m.keys[storeKey{key, kind}]
	if !ok {
		return nil
	}
	e := el.Value.(*storeEntry)
	if now/nsPerMs > e.expireAtMs { // Redis: expired once its ms clock passes the expiry
		m.order.Remove(el)
		delete(m.keys, e.id)
		return nil
	}
	return e.state
}

// put writes key's state (nil: the key is idle, gone); charged units are added to what the
// key owes (storeEntry.owed).
func (m *memoryStore) put(key string, kind byte, state any, now, reset, charged uint64) {
	id := storeKey{key, kind}
	if state == nil {
		if el, ok := m.keys[id]; ok {
			m.order.Remove(el)
			delete(m.keys, id)
		}
		return
	}
	// The module's expiry: the instant the key is idle, rounded up to the millisecond
	// (docs/reference.md#r-time-4).
	expire := w128(now).add(w128(reset)).ceilDiv(nsPerMs).sat()
	if el, ok := m.keys[id]; ok {
		e := el.Value.(*storeEntry)
		e.state, e.expireAtMs, e.owed = state, expire, satAdd(e.owed, charged)
		m.order.MoveToBack(el)
	} else {
		m.keys[id] = m.order.PushBack(&storeEntry{id, state, expire, charged})
	}
	for len(m.keys) > m.maxKeys {
		first := m.order.Front()
		m.order.Remove(first)
		delete(m.keys, first.Value.(*storeEntry).id)
	}
}

// decide evaluates one limit; state is what to write when it admits (nil: nothing).
func (m *memoryStore) decide(key string, s spec, now, n uint64, force bool, maxWait *uint64, token string) (mDecision, any, error) {
	kind := specKind(s)
	st := m.load(key, kind, now)
	if force && s.kind == kindLease {
		return mDecision{}, nil, errForceOnLease
	}
	if force && s.kind == kindWindow && s.alg == Log {
		return mDecision{}, nil, errForceWithLog
	}
	var d mDecision
	var err error
	var w any
	switch kind {
	case 'G':
		g, _ := st.(*gcraState)
		var ws *gcraState
		if force {
			d, ws, err = gcraForce(s.capacity, s.interval, g, now, n)
		} else {
			d, ws, err = gcraDecide(s.capacity, s.interval, g, now, n, maxWait)
		}
		if ws != nil {
			w = ws
		}
	case 'E':
		e, _ := st.(*leaseState)
		var ws *leaseState
		d, ws, err = leaseDecide(s.capacity, s.span, e, now, token, n)
		if ws != nil {
			w = ws
		}
	case 'F':
		f, _ := st.(*fixedState)
		var ws *fixedState
		d, ws, err = fixedDecide(s.capacity, s.span, f, now, n, force)
		if ws != nil {
			w = ws
		}
	case 'S':
		sl, _ := st.(*slidingState)
		var ws *slidingState
		d, ws, err = slidingDecide(s.capacity, s.span, sl, now, n, force)
		if ws != nil {
			w = ws
		}
	default:
		l, _ := st.(*logState)
		var ws *logState
		d, ws, err = logDecide(s.capacity, s.span, l, now, n)
		if ws != nil {
			w = ws
		}
	}
	return d, w, err
}

// check is RL.GCRA / RL.WINDOW: the five integers. maxWaitMs < 0: no MAXWAIT.
func (m *memoryStore) check(key string, s spec, n uint64, peek, force bool, maxWaitMs int64) ([5]int64, error) {
	var maxWait *uint64
	if maxWaitMs >= 0 {
		mw := mul128(uint64(maxWaitMs), nsPerMs).sat()
		maxWait = &mw
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	d, write, err := m.decide(key, s, now, n, force, maxWait, "")
	if err != nil {
		return [5]int64{}, err
	}
	if write != nil && !peek && d.allowed() {
		m.put(key, specKind(s), write, now, d.reset, n)
	}
	return d.five(), nil
}

// memoryItem is one limit of checkAll: its key, limit, own cost (hasCost) and lease token.
type memoryItem struct {
	key     string
	s       spec
	cost    uint64
	hasCost bool
	token   string
}

// checkAll is RL.ALL: the combined five and each key's, all or nothing.
func (m *memoryStore) checkAll(items []memoryItem, cost uint64, peek, force bool) ([5]int64, [][5]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	type decided struct {
		item   memoryItem
		charge uint64
		d      mDecision
		write  any
	}
	var all []decided
	for _, it := range items {
		charge := cost
		if it.hasCost {
			charge = it.cost
		}
		d, w, err := m.decide(it.key, it.s, now, charge, force, nil, it.token)
		if err != nil {
			return [5]int64{}, nil, err
		}
		all = append(all, decided{it, charge, d, w})
	}
	var combined mDecision
	if len(all) == 1 {
		combined = all[0].d
	} else {
		cs := make([]charged, len(all))
		for i, x := range all {
			cs[i] = charged{x.d, x.charge}
		}
		combined = combineMemory(cs)
	}
	mayWrite := false
	for _, x := range all {
		mayWrite = mayWrite || x.charge > 0
	}
	if !peek && mayWrite && combined.allowed() {
		for _, x := range all {
			if x.write != nil {
				m.put(x.item.key, specKind(x.item.s), x.write, now, x.d.reset, x.charge)
			}
		}
	}
	each := make([][5]int64, len(all))
	for i, x := range all {
		each[i] = x.d.five()
	}
	return combined.five(), each, nil
}

// lease is RL.LEASE (renew: LEASELOST when token holds no live lease).
func (m *memoryStore) lease(key string, s spec, token string, slots uint64, peek, renew bool) ([5]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	if renew {
		st, _ := m.load(key, 'E', now).(*leaseState)
		if _, held := st.live(now)[token]; st == nil || !held {
			return [5]int64{}, fmt.Errorf("LEASELOST lease '%s' on key '%s' is not held", shown(token), shown(key))
		}
	}
	d, write, err := m.decide(key, s, now, slots, false, nil, token)
	if err != nil {
		return [5]int64{}, err
	}
	if write != nil && !peek && d.allowed() {
		m.put(key, 'E', write, now, d.reset, 0)
	}
	return d.five(), nil
}

// release is RL.RELEASE: released, remaining, reset after (ms).
func (m *memoryStore) release(key, token string) [3]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	st, _ := m.load(key, 'E', now).(*leaseState)
	if st == nil {
		return [3]int64{}
	}
	live := st.live(now)
	h, held := live[token]
	if !held {
		d := st.report(now)
		return [3]int64{0, i63(d.remaining), i63(ceilNsToMs(d.reset))}
	}
	delete(live, token)
	after := &leaseState{limit: st.limit, held: live}
	d := after.report(now)
	if len(live) > 0 {
		m.put(key, 'E', after, now, d.reset, 0)
	} else {
		m.put(key, 'E', nil, now, d.reset, 0)
	}
	return [3]int64{i63(h.slots), i63(d.remaining), i63(ceilNsToMs(d.reset))}
}

// refund is RL.REFUND on whichever rate key key holds: refunded, remaining, reset after
// (ms); zeros for a key it does not hold.
func (m *memoryStore) refund(key string, q uint64) [3]int64 {
	_, r := m.refundOwed(key, q, false)
	return r
}

// refundOwed is refund that also settles what key owes (storeEntry.owed). With owedOnly it
// takes at most the units this store charged the key and has not given back (none: taken
// 0 and zeros, nothing done), so that a refund of charges taken here comes back here and
// the rest can go to Redis; taken is the part of q it answered for (all of q without
// owedOnly, once it holds the key; 0 when it does not hold it).
func (m *memoryStore) refundOwed(key string, q uint64, owedOnly bool) (taken uint64, r [3]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	for _, kind := range []byte{'G', 'F', 'S', 'L'} {
		st := m.load(key, kind, now)
		if st == nil {
			continue
		}
		e := m.keys[storeKey{key, kind}].Value.(*storeEntry)
		take := q
		if owedOnly {
			if take = min(q, e.owed); take == 0 {
				continue
			}
		}
		e.owed -= min(take, e.owed)
		limit, after, refunded := refundState(st, now, take)
		if refunded == 0 {
			d := reportState(st, now)
			return take, [3]int64{0, i63(d.remaining), i63(ceilNsToMs(d.reset))}
		}
		if after == nil {
			m.put(key, kind, nil, now, 0, 0)
			return take, [3]int64{i63(refunded), i63(limit), 0}
		}
		d := reportState(after, now)
		m.put(key, kind, after, now, d.reset, 0)
		return take, [3]int64{i63(refunded), i63(d.remaining), i63(ceilNsToMs(d.reset))}
	}
	return 0, [3]int64{}
}

// refundState gives back up to q units of a rate state: the limit, the state after (nil:
// idle), and the units given back.
func refundState(st any, now, q uint64) (uint64, any, uint64) {
	switch s := st.(type) {
	case *gcraState:
		after, n := gcraRefund(s, now, q)
		if after == nil {
			return s.burst, nil, n
		}
		return s.burst, after, n
	case *fixedState:
		after, n := fixedRefund(s, now, q)
		if after == nil {
			return s.limit, nil, n
		}
		return s.limit, after, n
	case *slidingState:
		after, n := slidingRefund(s, now, q)
		if after == nil {
			return s.limit, nil, n
		}
		return s.limit, after, n
	case *logState:
		after, n := logRefund(s, now, q)
		if after == nil {
			return s.limit, nil, n
		}
		return s.limit, after, n
	}
	return 0, nil, 0
}

// reportState is a state's figures now (QUANTITY 0).
func reportState(st any, now uint64) mDecision {
	switch s := st.(type) {
	case *gcraState:
		d, _, _ := gcraDecide(s.burst, s.interval, s, now, 0, nil)
		return d
	case *leaseState:
		return s.report(now)
	case *fixedState:
		d, _, _ := fixedDecide(s.limit, s.window, s, now, 0, false)
		return d
	case *slidingState:
		d, _, _ := slidingDecide(s.limit, s.window, s, now, 0, false)
		return d
	case *logState:
		d, _, _ := logDecide(s.limit, s.window, s, now, 0)
		return d
	}
	return mDecision{}
}
