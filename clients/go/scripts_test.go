package redisrl

// The fallback where users are (docs/clients.md#the-fallback-where-users-are), as the Rust
// crate's tests/scripts.rs and the Python package's test_scripts.py test it: where FUNCTION
// is not allowed the Lua fallback runs as scripts, EVAL first and EVALSHA once the server
// has the text; a refused EVALSHA moves to EVAL, a refused EVAL to SCRIPT LOAD + EVALSHA;
// with nothing left, one clear error. A library an operator loaded serves a client that may
// not run FUNCTION; an older client works beside a newer library and leaves its text. Every
// server here runs without the module.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// serverWith is a server without the module whose renamed commands are renamed away (those a
// Redis 6.x server does not have left out: testserver.RenamedAway).
func serverWith(t *testing.T, renamed ...string) *server {
	t.Helper()
	return testserver.StartServer(t, false, testserver.RenamedAway(t, renamed...)...)
}

// commandStats is a server's INFO commandstats calls by command name (eval, evalsha,
// script|load, function|load, fcall_ro, ...).
func commandStats(t testing.TB, s *server) map[string]uint64 {
	t.Helper()
	info, _ := s.Do(t, "INFO", "commandstats").(string)
	out := map[string]uint64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, found := strings.Cut(strings.TrimSpace(line), ":")
		if !found || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, _ := strconv.ParseUint(v, 10, 64)
				out[strings.ToLower(strings.TrimPrefix(name, "cmdstat_"))] = n
			}
		}
	}
	if n, found := out["script"]; found && testserver.Major(t) < 7 {
		// 6.x counts no subcommands: SCRIPT is LOAD here (each test's own SCRIPT FLUSH is
		// followed by CONFIG RESETSTAT), as the Python package's stats.
		out["script|load"] = n
		delete(out, "script")
	}
	return out
}

// runBurst: three decisions, a CheckAll, a refund and a lease, all answered by the fallback.
func runBurst(t *testing.T, c *Client) {
	t.Helper()
	g := MustGCRA(2, 1, time.Minute)
	var got []bool
	for range 3 {
		d, err := c.Check(ctxT(t), "b", g)
		if err != nil {
			t.Fatal(err)
		}
		if d.Source != SourceFallback || d.Degraded {
			t.Fatalf("%+v", d)
		}
		got = append(got, d.Allowed)
	}
	if fmt.Sprint(got) != "[true true false]" {
		t.Fatalf("%v", got)
	}
	both, err := c.CheckAll(ctxT(t), []Entry{NewEntry("{u}:a", MustWindow(2, time.Minute, Fixed)), NewEntry("{u}:b", MustGCRA(5, 1, time.Minute))})
	if err != nil || !both.Allowed || both.Remaining != 1 {
		t.Fatalf("%+v %v", both, err)
	}
	if r, err := c.Refund(ctxT(t), "b", 1); err != nil || r.Units != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	held, err := c.Acquire(ctxT(t), "job", MustLease(1, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := held.Renew(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := held.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if m, err := c.ResolvedMode(ctxT(t)); err != nil || m != ModeFallback {
		t.Fatalf("%v %v", m, err)
	}
}

func TestWithoutFunctionsEvalFirstThenEvalsha(t *testing.T) {
	s := serverWith(t, "FUNCTION")
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	g := MustGCRA(3, 1, time.Minute)
	var got []bool
	for range 4 {
		got = append(got, ok(c.Check(ctxT(t), "g", g)).Allowed)
	}
	if fmt.Sprint(got) != "[true true true false]" {
		t.Fatalf("%v", got)
	}
	// The text once, then its SHA1 (as the Python and Rust packages: no SCRIPT LOAD).
	st := commandStats(t, s)
	if st["eval"] != 1 || st["evalsha"] != 3 || st["script|load"] != 0 {
		t.Fatalf("%v", st)
	}
	if sha := s.Do(t, "SCRIPT", "LOAD", scriptText()); sha != scriptSHA() {
		t.Fatalf("the server knows the script as %v, the client as %s", sha, scriptSHA())
	}
	// NOSCRIPT (the cache flushed, as by a restart): one EVALSHA refused, one EVAL.
	s.Do(t, "SCRIPT", "FLUSH")
	s.Do(t, "CONFIG", "RESETSTAT")
	if d := ok(c.Check(ctxT(t), "h", g)); !d.Allowed { // "g" is denied locally now
		t.Fatalf("%+v", d)
	}
	if st := commandStats(t, s); st["evalsha"] != 1 || st["eval"] != 1 {
		t.Fatalf("%v", st)
	}
	runBurst(t, c)
}

func TestEvalshaRenamedAwayEveryCallSendsTheText(t *testing.T) {
	s := serverWith(t, "FUNCTION", "EVALSHA")
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	runBurst(t, c)
	st := commandStats(t, s)
	if _, has := st["evalsha"]; st["eval"] < 6 || has {
		t.Fatalf("%v", st)
	}
	before := st["eval"]
	if d := ok(c.Check(ctxT(t), "b", MustGCRA(2, 1, time.Minute))); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if after := commandStats(t, s)["eval"]; after != before+1 {
		t.Errorf("one EVAL per call: %d -> %d", before, after)
	}
	if n, _ := c.Counters().Get("errors"); n != 0 {
		t.Errorf("errors %d", n)
	}
}

func TestEvalRenamedAwayRunsByScriptLoadAndEvalsha(t *testing.T) {
	s := serverWith(t, "FUNCTION", "EVAL")
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	runBurst(t, c)
	st := commandStats(t, s)
	if st["script|load"] != 1 || st["evalsha"] < 6 {
		t.Fatalf("%v", st)
	}
	s.Do(t, "SCRIPT", "FLUSH")
	s.Do(t, "CONFIG", "RESETSTAT")
	g := MustGCRA(2, 1, time.Minute)
	if d := ok(c.Check(ctxT(t), "b", g)); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	// One EVALSHA met NOSCRIPT, SCRIPT LOAD sent the text, the EVALSHA again: decided.
	if st := commandStats(t, s); st["evalsha"] != 2 || st["script|load"] != 1 {
		t.Fatalf("%v", st)
	}
	if d := ok(c.Check(ctxT(t), "b", g)); d.Allowed {
		t.Fatalf("%+v", d)
	}
	if st := commandStats(t, s); st["evalsha"] != 3 || st["script|load"] != 1 {
		t.Fatalf("%v", st)
	}
}

func TestAnACLThatDeniesOneScriptCommandUsesTheOther(t *testing.T) {
	s := serverWith(t)
	for _, denied := range []string{"-evalsha", "-eval"} {
		t.Run(denied[1:], func(t *testing.T) {
			c := ok(New(aclClient(t, s, "u"+denied[1:], "-function", "-fcall", "-fcall_ro", denied), WithPrefix(testserver.UniquePrefix(t))))
			runBurst(t, c)
			if n, _ := c.Counters().Get("errors"); n != 0 {
				t.Errorf("errors %d", n)
			}
		})
	}
}

func TestEverythingRenamedAwayIsOneClearError(t *testing.T) {
	for _, renamed := range [][]string{{"FUNCTION", "EVAL", "EVALSHA"}, {"FCALL", "FCALL_RO", "EVAL", "EVALSHA"}} {
		t.Run(strings.Join(renamed, ","), func(t *testing.T) {
			s := serverWith(t, renamed...)
			c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t)), WithFailurePolicy(FailOpen)))
			for range 2 {
				// Every call: the same error, not an outage, not a second kind.
				_, err := c.Check(ctxT(t), "none", MustGCRA(2, 1, time.Minute))
				if !errors.Is(err, ErrLibrary) {
					t.Fatalf("expected ErrLibrary, got %v", err)
				}
				for _, want := range []string{"no redis-rl module", "Functions library", "scripts"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%q lacks %q", err, want)
					}
				}
			}
			snap := c.Counters().Snapshot()
			if snap["degraded"] != 0 || snap["errors"] != 0 {
				t.Errorf("%v", snap)
			}
		})
	}
}

// As scripts, a NOPERM on the key (the user's key patterns) is the server's own error, not
// "no scripting here".
func TestAKeyTheACLForbidsIsNotTakenForNoScripting(t *testing.T) {
	s := serverWith(t, "FUNCTION")
	prefix := testserver.UniquePrefix(t)
	s.Do(t, "ACL", "SETUSER", "keys", "on", ">pw", "~"+prefix+"ok*", "+@all")
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "keys", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := ok(New(rdb, WithPrefix(prefix)))
	g := MustGCRA(2, 1, time.Minute)
	if d := ok(c.Check(ctxT(t), "ok1", g)); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	_, err := c.Check(ctxT(t), "other", g)
	if errorCode(err) != "NOPERM" || errors.Is(err, ErrLibrary) {
		t.Fatalf("expected the server's NOPERM, got %v", err)
	}
	// And it stays a misuse: the next permitted call still runs as a script.
	if d := ok(c.Check(ctxT(t), "ok1", g)); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("%+v", d)
	}
}

// The library an operator loaded serves a client whose ACL denies FUNCTION (and even every
// script command): it is called with FCALL, never replaced, never run as scripts.
func TestALibraryAnOperatorLoadedServesAClientDeniedFunction(t *testing.T) {
	testserver.NeedFunctions(t)
	s := serverWith(t)
	s.Do(t, "FUNCTION", "LOAD", LuaLibrary)
	rdb := aclClient(t, s, "fcallonly", "-function", "-eval", "-evalsha", "-script")
	s.Do(t, "CONFIG", "RESETSTAT")
	runBurst(t, ok(New(rdb, WithPrefix(testserver.UniquePrefix(t)))))
	st := commandStats(t, s)
	if st["fcall"] < 6 || st["eval"]+st["evalsha"]+st["script|load"] != 0 {
		t.Fatalf("%v", st)
	}
}

// withVersion is this package's library text under another VERSION, with an operator's
// setting (LOG_MAX_LIMIT 500).
func withVersion(version string) string {
	code := strings.Replace(LuaLibrary, "local VERSION = '"+libraryVersion(LuaLibrary)+"'", "local VERSION = '"+version+"'", 1)
	return strings.Replace(code, "local LOG_MAX_LIMIT = 100000\n", "local LOG_MAX_LIMIT = 500\n", 1)
}

// Two library versions, as two client releases carry them: this package's text as the
// "older", a copy with a higher VERSION (and an operator's setting) as the "newer". The older
// client works beside the newer library, twice, and leaves its text byte for byte.
func TestAnOlderClientWorksBesideANewerLibraryAndLeavesItsText(t *testing.T) {
	testserver.NeedFunctions(t)
	s := serverWith(t)
	newer := withVersion("99.0.0")
	s.Do(t, "FUNCTION", "LOAD", newer)
	for range 2 {
		c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
		d := ok(c.Check(ctxT(t), "k", MustGCRA(5, 1, time.Second)))
		if !d.Allowed || d.Source != SourceFallback || d.Degraded {
			t.Fatalf("%+v", d)
		}
	}
	_, code, loaded := listedLibrary(s.Do(t, "FUNCTION", "LIST", "LIBRARYNAME", LibraryName, "WITHCODE"))
	if !loaded || code != newer {
		t.Fatalf("the newer library's text changed (loaded %v, version %q)", loaded, libraryVersion(code))
	}
	if n := commandStats(t, s)["function|load"]; n != 1 {
		t.Errorf("FUNCTION LOAD ran %d times: only ours, above", n)
	}
}

// raceHook runs before, once, just before the client sends its first FUNCTION LOAD.
type raceHook struct {
	before func()
	done   bool
}

func (h *raceHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *raceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *raceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); !h.done && len(a) > 1 && fmt.Sprint(a[0]) == "FUNCTION" && fmt.Sprint(a[1]) == "LOAD" {
			h.done = true
			h.before()
		}
		return next(ctx, cmd)
	}
}

// A rolling deploy: another client loads its library between this client's FCALL_RO
// rl_version (none there yet) and its FUNCTION LOAD. The load (no REPLACE) is refused, the
// client looks again and keeps what it finds if it is newer, replaces it if it is older.
func TestALibraryLoadedWhileWeLookedIsNotOverwritten(t *testing.T) {
	testserver.NeedFunctions(t)
	for _, tc := range []struct {
		name, theirs, want string
	}{{"newer", "99.0.0", "99.0.0"}, {"older", "0.0.1", libraryVersion(LuaLibrary)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := serverWith(t)
			rdb := s.RDB(t)
			rdb.AddHook(&raceHook{before: func() { s.Do(t, "FUNCTION", "LOAD", withVersion(tc.theirs)) }})
			c := ok(New(rdb, WithPrefix(testserver.UniquePrefix(t))))
			if d := ok(c.Check(ctxT(t), "race", MustGCRA(5, 1, time.Second))); !d.Allowed || d.Source != SourceFallback {
				t.Fatalf("%+v", d)
			}
			st := commandStats(t, s)
			if v := s.Do(t, "FCALL_RO", "rl_version", "0"); v != tc.want {
				t.Fatalf("the server runs %v, want %s", v, tc.want)
			}
			// Ours refused (no REPLACE), the other client's, and for an older one REPLACE.
			loads := uint64(2)
			if tc.name == "older" {
				loads = 3
			}
			if st["function|load"] != loads {
				t.Errorf("FUNCTION LOAD ran %d times, want %d: %v", st["function|load"], loads, st)
			}
		})
	}
}

// Valkey 9.1 runs Lua as an engine module an operator can unload: then neither the library
// nor scripts can run, and the client says so with the one clear error. Elsewhere Lua is
// built in and cannot be switched off: nothing to test.
func TestLuaSwitchedOffIsOneClearError(t *testing.T) {
	s := serverWith(t)
	if !strings.Contains(fmt.Sprint(s.Do(t, "MODULE", "LIST")), "lua") {
		t.Skip("Lua is built into this server (only Valkey 9+ can switch it off)")
	}
	s.Do(t, "MODULE", "UNLOAD", "lua")
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	for range 2 {
		_, err := c.Check(ctxT(t), "none", MustGCRA(2, 1, time.Minute))
		if !errors.Is(err, ErrLibrary) || !strings.Contains(err.Error(), "no redis-rl module") {
			t.Fatalf("expected ErrLibrary, got %v", err)
		}
	}
	if snap := c.Counters().Snapshot(); snap["degraded"] != 0 || snap["errors"] != 0 {
		t.Errorf("%v", snap)
	}
}
