package redisrl

// The in-memory algorithms (memory.go) against the module, as the Python package's
// test_local_policy.py tests its _memory.py: random sequences on both sides at the same
// instants (the server's clock frozen by the repository's clock shim,
// tests/support/clock_shim.c), every reply equal field for field; RL.ALL and leases; and the
// pure properties (a reported wait admits, 1 ns less does not; no window admits more than its
// limit).

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// frozenClock is the clock shim, built here with cc: a server started with env reads its
// real-time clock as freezeAt sets it, exactly.
type frozenClock struct {
	env  []string
	file *os.File
}

func newFrozenClock(t *testing.T) *frozenClock {
	t.Helper()
	const source = "../../tests/support/clock_shim.c"
	if _, err := os.Stat(source); err != nil {
		t.Skipf("not in a checkout of the repository: %v", err)
	}
	dir := t.TempDir()
	shim := filepath.Join(dir, "libclockshim.so")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-o", shim, source).CombinedOutput(); err != nil {
		t.Fatalf("building the clock shim: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "offset")
	if err := os.WriteFile(path, make([]byte, 16), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &frozenClock{env: []string{"LD_PRELOAD=" + shim, "RL_CLOCK_OFFSET_FILE=" + path}, file: f}
}

// freezeAt makes the server's clock read exactly ns since the epoch.
func (c *frozenClock) freezeAt(t *testing.T, ns uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], max(ns, 1))
	if _, err := c.file.WriteAt(b[:], 8); err != nil {
		t.Fatal(err)
	}
}

func reply5(t *testing.T, v any) [5]int64 {
	t.Helper()
	r, err := five(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func specOf(t *testing.T, l Spec) spec {
	t.Helper()
	s, err := l.spec()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMemoryAnswersAsTheModuleDoes(t *testing.T) {
	clock := newFrozenClock(t)
	s := testserver.StartServerEnv(t, clock.env, true)
	probe := uint64(1_700_000_000_123_456_000)
	clock.freezeAt(t, probe)
	if tm, _ := s.Do(t, "TIME").([]any); len(tm) != 2 || fmt.Sprint(tm[0])+fmt.Sprintf("%06s", fmt.Sprint(tm[1])) != strconv.FormatUint(probe/1000, 10) {
		t.Fatalf("the clock shim does not govern this redis-server: TIME %v", tm)
	}
	now := uint64(time.Now().UnixNano()) / 1000 * 1000
	store := newMemoryStore(100_000, func() uint64 { return now })
	rng := rand.New(rand.NewPCG(23, 0))
	groups := [][]Spec{
		{MustGCRA(5, 1, time.Hour), MustGCRA(8, 2, time.Hour), MustGCRA(3, 1, 2*time.Hour)},
		{MustWindow(6, time.Hour, Fixed), MustWindow(4, time.Hour, Fixed)},
		{MustWindow(6, time.Hour, Sliding), MustWindow(9, time.Hour, Sliding)},
		{MustWindow(5, time.Hour, Log), MustWindow(3, time.Hour, Log)},
	}
	stepsUs := []uint64{0, 1, 999, 1_000, 250_000, 60_000_000, 450_000_000, 1_800_000_000, 3_600_000_000}
	quantities := []uint64{0, 1, 1, 1, 2, 3, 7}
	prefix := testserver.UniquePrefix(t)
	compared := 0
	for round := range 60 {
		kind := rng.IntN(4)
		key := fmt.Sprintf("%sdiff%d:%d", prefix, round%6, kind)
		for range 12 {
			if rng.Float64() < 0.4 {
				now += stepsUs[rng.IntN(len(stepsUs))] * 1000
			}
			clock.freezeAt(t, now)
			lim := groups[kind][rng.IntN(len(groups[kind]))]
			sp := specOf(t, lim)
			n := quantities[rng.IntN(len(quantities))]
			peek := rng.Float64() < 0.2
			args := append([]any{"RL.WINDOW", key}, sp.args()...)
			if sp.kind == kindGCRA {
				args[0] = "RL.GCRA"
			}
			args = append(args, "QUANTITY", strconv.FormatUint(n, 10))
			if peek {
				args = append(args, "PEEK")
			}
			theirs := reply5(t, s.Do(t, args...))
			ours, err := store.check(key, sp, n, peek, false, -1)
			if err != nil || ours != theirs {
				t.Fatalf("%v n=%d peek=%v: ours %v (%v), the module's %v", args, n, peek, ours, err, theirs)
			}
			compared++
			if rng.Float64() < 0.15 {
				q := uint64(1 + rng.IntN(3))
				r, err := ints(s.Do(t, "RL.REFUND", key, strconv.FormatUint(q, 10)), 3)
				if err != nil {
					t.Fatal(err)
				}
				if got := store.refund(key, q); got != [3]int64(r) {
					t.Fatalf("RL.REFUND %s %d: ours %v, the module's %v", key, q, got, r)
				}
				compared++
			}
		}
	}
	if compared < 700 {
		t.Errorf("only %d replies compared", compared)
	}
}

func TestMemoryCheckAllAndLeasesAnswerAsTheModuleDoes(t *testing.T) {
	s := testserver.Shared(t, true)
	p := testserver.UniquePrefix(t)
	store := newMemoryStore(100_000, nil)
	a, b, l := p+"{m}:a", p+"{m}:b", p+"{m}:l"
	items := []memoryItem{
		{key: a, s: specOf(t, MustGCRA(3, 1, time.Hour))},
		{key: b, s: specOf(t, MustWindow(2, time.Hour, Fixed)), cost: 1, hasCost: true},
		{key: l, s: specOf(t, MustLease(2, time.Hour)), cost: 1, hasCost: true, token: "tok"},
	}
	for range 4 {
		theirs := s.Do(t, "RL.ALL", "3", a, b, l, "GCRA", "3", "1", "3600", "WINDOW", "2", "3600", "FIXED",
			"COST", "1", "LEASE", "2", "3600", "tok", "COST", "1", "QUANTITY", "1")
		combined, each, err := allReply(theirs)
		if err != nil {
			t.Fatal(err)
		}
		oc, oe, err := store.checkAll(items, 1, false, false)
		if err != nil {
			t.Fatal(err)
		}
		if [3]int64(oc[:3]) != [3]int64(combined[:3]) || len(oe) != len(each) {
			t.Fatalf("combined: ours %v, the module's %v", oc, combined)
		}
		for i := range each {
			if [3]int64(oe[i][:3]) != [3]int64(each[i][:3]) {
				t.Fatalf("%d: ours %v, the module's %v", i, oe[i], each[i])
			}
		}
	}
	lease := specOf(t, MustLease(2, time.Hour))
	lk := p + "lk"
	for _, token := range []string{"t1", "t2", "t1", "t3"} {
		theirs := reply5(t, s.Do(t, "RL.LEASE", lk, "2", "3600", token))
		ours, err := store.lease(lk, lease, token, 1, false, false)
		if err != nil || [3]int64(ours[:3]) != [3]int64(theirs[:3]) {
			t.Fatalf("%s: ours %v (%v), the module's %v", token, ours, err, theirs)
		}
	}
	r, err := ints(s.Do(t, "RL.RELEASE", lk, "t1"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := store.release(lk, "t1"); got[0] != r[0] || got[1] != r[1] {
		t.Fatalf("release: ours %v, the module's %v", got, r)
	}
	if _, err := store.lease(lk, lease, "gone", 1, false, true); err == nil || err.Error() != "LEASELOST lease 'gone' on key '"+lk+"' is not held" {
		t.Fatalf("%v", err)
	}
}

const sec = uint64(time.Second)

// docs/reference.md#r-reply-2: waiting exactly the reported time admits the same request,
// 1 ns less does not (on the exact nanoseconds the store keeps).
func TestMemoryRetryAfterIsHonestForEveryAlgorithm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 0))
	for range 300 {
		algo := []string{"gcra", "fixed", "sliding", "log"}[rng.IntN(4)]
		limit, window := uint64(1+rng.IntN(5)), uint64(1+rng.IntN(4))*sec
		burst, interval := limit, uint64(1+rng.IntN(2))*sec/3
		now := uint64(1e18) + rng.Uint64N(1e18)
		var state any
		decide := func(at, n uint64) (mDecision, any) {
			var d mDecision
			var w any
			switch algo {
			case "gcra":
				g, _ := state.(*gcraState)
				dd, ws, _ := gcraDecide(burst, interval, g, at, n, nil)
				d = dd
				if ws != nil {
					w = ws
				}
			case "fixed":
				f, _ := state.(*fixedState)
				dd, ws, _ := fixedDecide(limit, window, f, at, n, false)
				d = dd
				if ws != nil {
					w = ws
				}
			case "sliding":
				sl, _ := state.(*slidingState)
				dd, ws, _ := slidingDecide(limit, window, sl, at, n, false)
				d = dd
				if ws != nil {
					w = ws
				}
			default:
				l, _ := state.(*logState)
				dd, ws, _ := logDecide(limit, window, l, at, n)
				d = dd
				if ws != nil {
					w = ws
				}
			}
			return d, w
		}
		for range 1 + rng.IntN(11) {
			n := uint64(1 + rng.IntN(int(limit)))
			d, w := decide(now, n)
			if d.kind == vDenied {
				if again, _ := decide(now+d.wait, n); !again.allowed() {
					t.Fatalf("%s: waiting %d ns does not admit: %+v", algo, d.wait, d)
				}
				if again, _ := decide(now+d.wait-1, n); again.allowed() {
					t.Fatalf("%s: 1 ns less than %d admits: %+v", algo, d.wait, d)
				}
			} else if w != nil {
				state = w
			}
			now += []uint64{0, 1, sec / 10, sec / 2, sec, 3 * sec}[rng.IntN(6)]
		}
	}
}

// FIXED: at most limit per aligned window; LOG: in any trailing window; GCRA: at most
// burst + elapsed / T over any span (docs/reference.md#r-fixed-1, #r-log-1, #r-gcra-5).
func TestMemoryNoWindowAdmitsMoreThanItsLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 0))
	limit, window := uint64(4), 2*sec
	now := 1_700_000_000 * sec
	var fixed *fixedState
	var log *logState
	var gcra *gcraState
	var fixedAt, logAt, gcraAt []uint64
	for range 2000 {
		now += rng.Uint64N(sec / 5)
		if d, w, _ := fixedDecide(limit, window, fixed, now, 1, false); d.allowed() {
			fixed, fixedAt = w, append(fixedAt, now)
		}
		if d, w, _ := logDecide(limit, window, log, now, 1); d.allowed() {
			log, logAt = w, append(logAt, now)
		}
		if d, w, _ := gcraDecide(limit, window/limit, gcra, now, 1, nil); d.allowed() {
			gcra, gcraAt = w, append(gcraAt, now)
		}
	}
	perWindow := map[uint64]uint64{}
	for _, at := range fixedAt {
		perWindow[at/window]++
	}
	for w, n := range perWindow {
		if n > limit {
			t.Errorf("FIXED window %d admitted %d", w, n)
		}
	}
	for i, at := range logAt {
		var n uint64
		for _, u := range logAt[i:] {
			if u < at+window {
				n++
			}
		}
		if n > limit {
			t.Errorf("LOG admitted %d within a window from %d", n, at)
		}
	}
	for i := range gcraAt {
		for j := i; j < len(gcraAt) && j < i+40; j++ {
			if uint64(j-i+1) > limit+(gcraAt[j]-gcraAt[i])/(window/limit) {
				t.Errorf("GCRA admitted %d between %d and %d", j-i+1, gcraAt[i], gcraAt[j])
			}
		}
	}
	if len(fixedAt) == 0 || len(logAt) == 0 || len(gcraAt) == 0 {
		t.Error("nothing admitted")
	}
}

// 128-bit helpers at their edges.
func TestU128(t *testing.T) {
	big := mul128(u64max, u64max) // 2^128 - 2^65 + 1
	if big.fits() || big.sat() != u64max || big.div(u64max) != w128(u64max) {
		t.Errorf("%+v", big)
	}
	if w128(7).ceilDiv(2) != w128(4) || w128(8).ceilDiv(2) != w128(4) || w128(0).ceilDiv(3) != w128(0) {
		t.Error("ceilDiv")
	}
	if w128(3).since(w128(5)) != (u128{}) || w128(5).since(w128(3)) != w128(2) {
		t.Error("since")
	}
	if mul128(1<<63, 4).sub(w128(1)) != (u128{1, u64max}) {
		t.Error("sub across words")
	}
	if satAdd(u64max, 1) != u64max || ceilNsToMs(1) != 1 || ceilNsToMs(1_000_000) != 1 || ceilNsToMs(u64max) != u64max/1_000_000+1 {
		t.Error("satAdd or ceilNsToMs")
	}
}

// R-PARAM-2: a key whose GCRA parameters changed converts its time in use to the new
// emission interval, rounded up (never a nanosecond of credit gained by the change).
func TestMemoryGCRAConversionRoundsUp(t *testing.T) {
	s := &gcraState{tat: 1_000 + 3, interval: 2, burst: 5, updated: 1_000}
	if got := gcraEffectiveTat(3, s, 1_000); got != 1_000+5 { // ceil(3 * 3 / 2) = 5
		t.Errorf("tat %d, want %d", got, 1_005)
	}
	if got := gcraEffectiveTat(3, s, 2_000); got != 2_000 { // idle: now
		t.Errorf("tat %d", got)
	}
	huge := &gcraState{tat: u64max, interval: 1, burst: 1, updated: 0}
	if got := gcraEffectiveTat(u64max, huge, 5); got != u64max { // saturates, no wrap
		t.Errorf("tat %d", got)
	}
}
