package redisrl

// Pure tests: no server.

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

func TestReplyToDecision(t *testing.T) {
	allowed := fromReply([5]int64{1, 10, 9, -1, 100}, nil, "", SourceModule, false)
	if !allowed.Allowed || allowed.Never || allowed.RetryAfter != 0 || allowed.ResetAfter != 100*time.Millisecond {
		t.Errorf("%+v", allowed)
	}
	denied := fromReply([5]int64{0, 10, 0, 1234, 5000}, nil, "", SourceModule, false)
	if denied.Allowed || denied.Never || denied.RetryAfter != 1234*time.Millisecond {
		t.Errorf("%+v", denied)
	}
	never := fromReply([5]int64{0, 10, 3, -1, 0}, nil, "", SourceModule, false)
	if never.Allowed || !never.Never || never.RetryAfter != 0 || never.Remaining != 3 {
		t.Errorf("%+v", never)
	}
	reserved := fromReply([5]int64{1, 1, 0, 950, 2000}, nil, "", SourceModule, true)
	if !reserved.Allowed || reserved.RetryAfter != 950*time.Millisecond {
		t.Errorf("%+v", reserved)
	}
	// Saturated replies (docs/reference.md#r-reply-3) saturate the Duration, never wrap.
	huge := fromReply([5]int64{0, 1<<63 - 1, 0, 1<<63 - 1, 1<<63 - 1}, nil, "", SourceModule, false)
	if huge.RetryAfter != time.Duration(1<<63-1) || huge.ResetAfter != time.Duration(1<<63-1) || huge.Limit != 1<<63-1 {
		t.Errorf("%+v", huge)
	}
}

func TestHeaders(t *testing.T) {
	g := MustGCRA(10, 3, time.Second)
	if w, _ := g.s.policyWindow(); w != 3_333_333_330 {
		t.Errorf("GCRA's w is burst*T: %v", w)
	}
	d := Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 7200 * time.Millisecond, Spec: g}
	h := d.Headers("api")
	if h.Get("RateLimit-Policy") != `"api";q=10;w=4` || h.Get("RateLimit") != `"api";r=3;t=8` || h.Get("Retry-After") != "" {
		t.Errorf("%v", h)
	}
	denied := Decision{Limit: 10, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second, Spec: ok(g.Named("named"))}
	h = denied.HeadersWith(HeaderOptions{XHeaders: true})
	if h.Get("Retry-After") != "2" || h.Get("RateLimit") != `"named";r=0;t=10` {
		t.Errorf("%v", h)
	}
	if h.Get("X-RateLimit-Limit") != "10" || h.Get("X-RateLimit-Remaining") != "0" || h.Get("X-RateLimit-Reset") != "10" {
		t.Errorf("%v", h)
	}
	// A denial's Retry-After is at least 1; Never has none; Blind has only Retry-After.
	if h := (Decision{RetryAfter: time.Millisecond}).Headers(""); h.Get("Retry-After") != "1" || h.Get("RateLimit") != `"default";r=0;t=0` {
		t.Errorf("%v", h)
	}
	if h := (Decision{Never: true, Limit: 3}).Headers(""); h.Get("Retry-After") != "" {
		t.Errorf("%v", h)
	}
	blind := Decision{RetryAfter: time.Second, Blind: true, Degraded: true, Limit: 5, Spec: g}
	if h := blind.Headers("x"); len(h) != 1 || h.Get("Retry-After") != "1" {
		t.Errorf("%v", h)
	}
	lease := Decision{Allowed: true, Limit: 2, Remaining: 1, Spec: MustLease(2, time.Minute)}
	if h := lease.Headers("jobs"); h.Get("RateLimit-Policy") != `"jobs";q=2;qu="concurrent-requests"` {
		t.Errorf("%v", h)
	}
	combined := Decision{PerKey: []Decision{
		{Key: "p:a", Limit: 2, Remaining: 1, ResetAfter: time.Second, Spec: MustWindow(2, time.Minute, Fixed)},
		{Key: "p:b", Limit: 5, Remaining: 4, ResetAfter: time.Second, Spec: ok(MustWindow(5, time.Hour, Log).Named("hourly"))},
	}}
	h = combined.HeadersWith(HeaderOptions{Names: map[string]string{"p:a": "minute"}})
	if h.Get("RateLimit-Policy") != `"minute";q=2;w=60, "hourly";q=5;w=3600` || h.Get("RateLimit") != `"minute";r=1;t=1, "hourly";r=4;t=1` {
		t.Errorf("%v", h)
	}
	// The longest durations do not overflow.
	max := Decision{Limit: 1, RetryAfter: time.Duration(1<<63 - 1), ResetAfter: time.Duration(1<<63 - 1)}
	if h := max.Headers(""); h.Get("Retry-After") != "9223372037" {
		t.Errorf("%v", h)
	}
}

// The no-writes twins (docs/clients.md#out-of-memory): the writing functions that may grow
// memory have one, with the same keys and arguments; refunds and releases have none.
func TestTwinFrames(t *testing.T) {
	for o, want := range map[op]string{opGCRA: "rl_gcra_ro", opWindow: "rl_window_ro", opAll: "rl_all_ro", opLease: "rl_lease_ro"} {
		name, ok := o.twin()
		if !ok || name != want {
			t.Errorf("%s: %q %v", o.function(), name, ok)
		}
		if !strings.Contains(LuaLibrary, "'"+want+"'") {
			t.Errorf("the library registers no %s", want)
		}
	}
	for _, o := range []op{opRefund, opRelease} {
		if _, ok := o.twin(); ok {
			t.Errorf("%s has a twin", o.function())
		}
	}
	wire, pos := twinFrame("rl_all_ro", []string{"{u}a", "{u}b"}, []any{"GCRA", "3", "1", "10"})
	if got := join(wire); got != "FCALL_RO rl_all_ro 2 {u}a {u}b GCRA 3 1 10" || pos != 3 {
		t.Errorf("%q %d", got, pos)
	}
}

func TestFrames(t *testing.T) {
	args := []any{"3", "1", "10"}
	wire, pos := frame(ModeModule, viaFunctions, "", opGCRA, []string{"k"}, args)
	if got := join(wire); got != "RL.GCRA k 3 1 10" || pos != 1 {
		t.Errorf("%q %d", got, pos)
	}
	wire, pos = frame(ModeModule, viaFunctions, "", opAll, []string{"a", "b"}, args)
	if got := join(wire); got != "RL.ALL 2 a b 3 1 10" || pos != 2 {
		t.Errorf("%q %d", got, pos)
	}
	wire, pos = frame(ModeFallback, viaFunctions, "", opAll, []string{"a", "b"}, args)
	if got := join(wire); got != "FCALL rl_all 2 a b 3 1 10" || pos != 3 {
		t.Errorf("%q %d", got, pos)
	}
	wire, pos = frame(ModeFallback, viaSHA, "abc", opRefund, []string{"k"}, []any{"2"})
	if got := join(wire); got != "EVALSHA abc 1 k rl_refund 2" || pos != 3 {
		t.Errorf("%q %d", got, pos)
	}
	wire, _ = frame(ModeFallback, viaText, "", opLease, []string{"k"}, nil)
	if wire[0] != "EVAL" || wire[1] != scriptText() || wire[4] != "rl_lease" {
		t.Errorf("%v", wire[:2])
	}
}

func join(wire []any) string {
	var parts []string
	for _, w := range wire {
		parts = append(parts, w.(string))
	}
	return strings.Join(parts, " ")
}

func TestANewerLibraryIsNeverReplaced(t *testing.T) {
	ours := libraryVersion(LuaLibrary)
	for _, c := range []struct {
		theirs string
		loaded bool
		ours   string
		want   libraryPlan
	}{
		{"", false, ours, planLoad},
		{ours, true, ours, planKeep},
		{"1.0.0", true, "1.1.0", planReplace},
		{"1.10.0", true, "1.9.0", planNewer},
		{"1.1.0.1", true, "1.1.0", planNewer},
		{"", true, "1.1.0", planReplace},
		{"x", true, "1.1.0", planReplace},
	} {
		if got := planFor(c.theirs, c.loaded, c.ours); got != c.want {
			t.Errorf("%+v: %v", c, got)
		}
	}
}

func TestReplacingALibraryKeepsItsSettingLines(t *testing.T) {
	theirs := strings.Replace(LuaLibrary, "local LOG_MAX_LIMIT = 100000\n", "local LOG_MAX_LIMIT = 500\n", 1)
	theirs = strings.Replace(theirs, "local ALL_MAX_KEYS = 64\n", "local ALL_MAX_KEYS = 8\n", 1)
	code := configuredCode(LuaLibrary, theirs)
	for v, want := range map[string]uint64{"LOG_MAX_LIMIT": 500, "LEASE_MAX_LIMIT": 10000, "ALL_MAX_KEYS": 8} {
		if got, _ := setting(code, v); got != want {
			t.Errorf("%s = %d, want %d", v, got, want)
		}
	}
	if configuredCode(LuaLibrary, "return 1") != LuaLibrary {
		t.Error("a library without the lines changed ours")
	}
}

func TestListedLibraryReadsBothProtocols(t *testing.T) {
	code := "#!lua name=redis_rl\nlocal VERSION = '1.2.3'\n"
	resp2 := []any{[]any{"library_name", "redis_rl", "engine", "LUA", "functions", []any{}, "library_code", code}}
	resp3 := []any{map[any]any{"library_name": "redis_rl", "library_code": code}}
	for _, listing := range []any{resp2, resp3} {
		v, c, loaded := listedLibrary(listing)
		if !loaded || v != "1.2.3" || c != code {
			t.Errorf("%v: %q %v", listing, v, loaded)
		}
	}
	if _, _, loaded := listedLibrary([]any{}); loaded {
		t.Error("an empty listing is no library")
	}
	if _, _, loaded := listedLibrary([]any{map[any]any{"library_name": "other"}}); loaded {
		t.Error("another library is not ours")
	}
}

// docs/clients.md#escaped-values: the vectors every package pins.
func TestEscapedValuesMatchTheOtherPackages(t *testing.T) {
	if got := SafeKeyPart(strings.Repeat("a", 200)); got != "~sha256:c2a908d98f5df987ade41b5fce213067efbcc21ef2240212a41e54b5e7c28ae5" {
		t.Errorf("%q", got)
	}
	if got := SafeKeyPart(strings.Repeat("é", 64)); got != strings.Repeat("%C3%A9", 64) {
		t.Errorf("%q", got)
	}
	if got := SafeKeyPart("~x"); got != "%7Ex" {
		t.Errorf("%q", got)
	}
	if got := SafeKeyPart("a{b}c d\x00%"); got != "a%7Bb%7Dc%20d%00%25" {
		t.Errorf("%q", got)
	}
	if got := SafeKeyPart("A-Za-z0-9._:@/+="); got != "A-Za-z0-9._:@/+=" {
		t.Errorf("%q", got)
	}
	exactly := strings.Repeat("x", 128)
	if SafeKeyPart(exactly) != exactly {
		t.Error("128 bytes stay literal")
	}
	sum := sha256.Sum256([]byte(strings.Repeat("x", 129)))
	if SafeKeyPart(strings.Repeat("x", 129)) != "~sha256:"+hex.EncodeToString(sum[:]) {
		t.Error("129 bytes are hashed")
	}
	if got := IdentityKey("api", "ip", "192.0.2.7", ""); got != "api:{ip:192.0.2.7}" {
		t.Errorf("%q", got)
	}
	if got := IdentityKey("api", "hdr.x-api-key", "k{1}", "acct"); got != "{acct}:api:hdr.x-api-key:k%7B1%7D" {
		t.Errorf("%q", got)
	}
	if got := IdentityKey("api", "ip", "unknown", ""); got != "api:{ip:unknown}" {
		t.Errorf("%q", got)
	}
	if k, err := Tag("user42", "rpm"); err != nil || k != "{user42}:rpm" {
		t.Errorf("%q %v", k, err)
	}
	if _, err := Tag("a{b"); err == nil {
		t.Error("a tag with a brace")
	}
}

func FuzzSafeKeyPart(f *testing.F) {
	for _, s := range []string{"", "a", "{x}", "é", strings.Repeat("z", 129), "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := SafeKeyPart(s)
		if strings.ContainsAny(out, "{} \r\n\x00") || len(out) > 3*maxLiteral {
			t.Fatalf("%q -> %q", s, out)
		}
		if strings.HasPrefix(out, "~") != (len(s) > maxLiteral) {
			t.Fatalf("%q -> %q", s, out)
		}
	})
}

func FuzzParseLimits(f *testing.F) {
	for _, s := range []string{"10/minute", "5 per 10 s; 1/d", "", ";", "99999999999999999999/s", "1/0s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		limits, err := ParseLimits(s)
		if err != nil {
			return
		}
		for _, l := range limits {
			if _, err := l.spec(); err != nil {
				t.Fatalf("%q gave an invalid limit: %v", s, err)
			}
		}
	})
}

func FuzzParseSeconds(f *testing.F) {
	for _, s := range []string{"1", "0.25", "315360000", "315360000.000000001", "1e3", ".5", "007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseSeconds(s, "p")
		if err != nil {
			return
		}
		if d <= 0 || d > maxSpan {
			t.Fatalf("%q -> %v", s, d)
		}
		if back, err := ParseSeconds(FormatSeconds(d), "p"); err != nil || back != d {
			t.Fatalf("%q -> %v -> %q", s, d, FormatSeconds(d))
		}
	})
}

func TestKeySlotIsRedisClusters(t *testing.T) {
	// CLUSTER KEYSLOT answers these.
	for key, want := range map[string]uint16{"foo": 12182, "123456789": 12739, "{user1000}.following": 3443, "{}x": 10595, "{a": 10276} {
		if got := keySlot(key); got != want {
			t.Errorf("%q: %d, want %d", key, got, want)
		}
	}
	if keySlot("{user1000}.following") != keySlot("{user1000}.followers") {
		t.Error("one tag, one slot")
	}
	g := slotGroups([]string{"{a}1", "{b}1", "{a}2"})
	if len(g) != 2 || len(g[0]) != 2 || g[0][1] != 2 || g[1][0] != 1 {
		t.Errorf("%v", g)
	}
}

func TestCombineIsRLALLs(t *testing.T) {
	a := Decision{Allowed: true, Limit: 10, Remaining: 6, ResetAfter: time.Second}
	b := Decision{Allowed: true, Limit: 100, Remaining: 40, ResetAfter: 3 * time.Second}
	// Fewest further calls of this shape: 6/1 = 6 against 40/10 = 4: b binds.
	d := combine([]Decision{a, b}, []uint64{1, 10})
	if !d.Allowed || d.Limit != 100 || d.Remaining != 40 || d.ResetAfter != 3*time.Second {
		t.Errorf("%+v", d)
	}
	denied := Decision{Limit: 5, RetryAfter: 2 * time.Second}
	d = combine([]Decision{a, denied, {Limit: 5, RetryAfter: time.Second}}, []uint64{1, 1, 1})
	if d.Allowed || d.Never || d.RetryAfter != 2*time.Second {
		t.Errorf("%+v", d)
	}
	d = combine([]Decision{denied, {Never: true, Limit: 1}}, []uint64{1, 1})
	if !d.Never || d.RetryAfter != 0 {
		t.Errorf("%+v", d)
	}
	// An uncharged limit (COST 0) takes no part unless none is charged.
	d = combine([]Decision{{Limit: 1}, a}, []uint64{0, 1})
	if !d.Allowed || d.Limit != 10 {
		t.Errorf("%+v", d)
	}
}
