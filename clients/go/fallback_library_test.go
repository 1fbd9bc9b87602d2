package redisrl

// The fallback where users are (docs/clients.md#the-fallback-where-users-are): the library
// embedded from the repository's one copy, loaded when missing, never over a newer one, an
// older one replaced with its operator's settings kept, scripts where FUNCTION is refused,
// and one clear error where nothing can run.

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

func TestLibraryIsTheRepositoryCopy(t *testing.T) {
	repo, err := os.ReadFile("../../scripts/lua/redis_rl.lua")
	if err != nil {
		t.Skipf("not in a checkout of the repository: %v", err)
	}
	if string(repo) != LuaLibrary {
		t.Fatal("the embedded library differs from scripts/lua/redis_rl.lua: run `go generate` in clients/go")
	}
	if !strings.HasPrefix(LuaLibrary, "#!lua name="+LibraryName+"\n") || libraryVersion(LuaLibrary) == "" {
		t.Fatal("the library's first line or its VERSION line moved")
	}
	if strings.HasPrefix(scriptText(), "#!lua") {
		t.Fatal("the script form keeps the #!lua line")
	}
}

// aclClient is a client of s as a new user allowed everything but rules (ACL SETUSER rules:
// "-function"); on Redis 6.x the rules on commands it does not have are left out (its ACL
// refuses them, and the user lacks them anyway: testserver.Lacks).
func aclClient(t *testing.T, s *server, user string, rules ...string) *redis.Client {
	t.Helper()
	var kept []string
	for _, r := range rules {
		if !testserver.Lacks(t, strings.TrimLeft(r, "+-")) {
			kept = append(kept, r)
		}
	}
	s.Do(t, append([]any{"ACL", "SETUSER", user, "on", ">pw", "~*", "+@all"}, toAny(kept)...)...)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: user, Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func TestANewerLibraryIsLeftInPlaceAndAnOlderOneReplaced(t *testing.T) {
	s := testserver.StartServer(t, false)
	ours := libraryVersion(LuaLibrary)
	newer := strings.Replace(LuaLibrary, "local VERSION = '"+ours+"'", "local VERSION = '99.0.0'", 1)
	s.Do(t, "FUNCTION", "LOAD", "REPLACE", newer)
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	if d := ok(c.Check(ctxT(t), "n", MustGCRA(1, 1, time.Second))); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("%+v", d)
	}
	if v := s.Do(t, "FCALL_RO", "rl_version", "0"); v != "99.0.0" {
		t.Errorf("the newer library was replaced: %v", v)
	}
	older := strings.Replace(LuaLibrary, "local VERSION = '"+ours+"'", "local VERSION = '0.0.1'", 1)
	older = strings.Replace(older, "local ALL_MAX_KEYS = 64\n", "local ALL_MAX_KEYS = 8\n", 1)
	older = strings.Replace(older, "local LOG_MAX_LIMIT = 100000\n", "local LOG_MAX_LIMIT = 500\n", 1)
	s.Do(t, "FUNCTION", "LOAD", "REPLACE", older)
	c = ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	if d := ok(c.Check(ctxT(t), "o", MustGCRA(1, 1, time.Second))); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if v := s.Do(t, "FCALL_RO", "rl_version", "0"); v != ours {
		t.Errorf("the older library was kept: %v", v)
	}
	config := map[string]any{}
	switch reply := s.Do(t, "FCALL_RO", "rl_config", "0").(type) {
	case []any:
		for i := 0; i+1 < len(reply); i += 2 {
			config[reply[i].(string)] = reply[i+1]
		}
	case map[any]any:
		for k, v := range reply {
			config[k.(string)] = v
		}
	}
	if config["all-max-keys"] != int64(8) || config["log-max-limit"] != int64(500) || config["lease-max-limit"] != int64(10000) {
		t.Errorf("the operator's settings did not survive the upgrade: %v", config)
	}
}

func TestAMissingLibraryIsAnErrorWhenLoadingIsNotAllowed(t *testing.T) {
	s := testserver.StartServer(t, false)
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t)), WithLoadLibrary(false), WithFailurePolicy(FailOpen)))
	_, err := c.Check(ctxT(t), "k", MustGCRA(1, 1, time.Second))
	if !errors.Is(err, ErrLibrary) || !strings.Contains(err.Error(), "WithLoadLibrary(false)") {
		t.Fatalf("%v", err)
	}
	// Loaded by an operator: then it works.
	s.Do(t, "FUNCTION", "LOAD", LuaLibrary)
	if d := ok(c.Check(ctxT(t), "k", MustGCRA(1, 1, time.Second))); !d.Allowed || d.Source != SourceFallback {
		t.Errorf("%+v", d)
	}
}

// A library flushed under a running client (FUNCTION FLUSH, a failover to a node without
// it) is loaded again once, by the call that finds it missing.
func TestAFlushedLibraryIsLoadedAgain(t *testing.T) {
	s := testserver.StartServer(t, false)
	c := ok(New(s.RDB(t), WithPrefix(testserver.UniquePrefix(t))))
	g := MustGCRA(2, 1, time.Minute)
	ok(c.Check(ctxT(t), "f", g))
	s.Do(t, "FUNCTION", "FLUSH")
	if d := ok(c.Check(ctxT(t), "f", g)); !d.Allowed || d.Remaining != 0 {
		t.Errorf("%+v", d)
	}
}

func TestWithoutFunctionTheFallbackRunsAsAScript(t *testing.T) {
	s := testserver.StartServer(t, false)
	c := ok(New(aclClient(t, s, "scripts", "-function"), WithPrefix(testserver.UniquePrefix(t))))
	g := MustGCRA(2, 1, time.Minute)
	var got []bool
	for range 3 {
		d := ok(c.Check(ctxT(t), "s", g))
		if d.Source != SourceFallback {
			t.Errorf("%+v", d)
		}
		got = append(got, d.Allowed)
	}
	if !got[0] || !got[1] || got[2] {
		t.Errorf("%v", got)
	}
	if !c.scripts.Load() {
		t.Error("the client did not switch to scripts")
	}
	if listed := s.Do(t, "FUNCTION", "LIST"); len(listed.([]any)) != 0 {
		t.Errorf("a library was loaded: %v", listed)
	}
	// The script cache flushed (as after a restart): recovered once with the text.
	s.Do(t, "SCRIPT", "FLUSH")
	if d := ok(c.Check(ctxT(t), "t", g)); !d.Allowed {
		t.Errorf("%+v", d)
	}
	d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{u}:a", g), NewEntry("{u}:b", g)}))
	if !d.Allowed || len(d.PerKey) != 2 {
		t.Errorf("%+v", d)
	}
	if r := ok(c.Refund(ctxT(t), "s", 1)); r.Units != 1 {
		t.Errorf("%+v", r)
	}
	// Neither FUNCTION nor EVAL: one clear error.
	none := ok(New(aclClient(t, s, "nothing", "-function", "-eval", "-evalsha", "-script"), WithPrefix(testserver.UniquePrefix(t))))
	_, err := none.Check(ctxT(t), "n", g)
	if !errors.Is(err, ErrLibrary) || !strings.Contains(err.Error(), "no redis-rl module") {
		t.Fatalf("%v", err)
	}
}

// A user restricted to what a limiter needs may not run COMMAND: ModeAuto still finds the
// module, or the fallback without it.
func TestAutoModeWorksForAUserDeniedCommandInfo(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			s := testserver.Shared(t, k.module)
			c := ok(New(aclClient(t, s, "limiter", "-command"), WithPrefix(testserver.UniquePrefix(t))))
			g := MustGCRA(1, 1, time.Second)
			d := ok(c.Check(ctxT(t), "k", g))
			if !d.Allowed || d.Source != k.source() {
				t.Errorf("%+v", d)
			}
			if m := ok(c.ResolvedMode(ctxT(t))); m != k.want() {
				t.Errorf("%v", m)
			}
			if d := ok(c.Check(ctxT(t), "k", g)); d.Allowed {
				t.Errorf("%+v", d)
			}
		})
	}
}

// ModeModule on a server without the module is an error (unknown command), not a silent
// switch; ModeFallback on a server with it uses the library.
func TestExplicitModesAreKept(t *testing.T) {
	plain := testserver.Shared(t, false)
	c := ok(New(plain.RDB(t), WithPrefix(testserver.UniquePrefix(t)), WithMode(ModeModule)))
	if _, err := c.Check(ctxT(t), "k", MustGCRA(1, 1, time.Second)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		t.Errorf("%v", err)
	}
	withModule := testserver.Shared(t, true)
	c = ok(New(withModule.RDB(t), WithPrefix(testserver.UniquePrefix(t)), WithMode(ModeFallback)))
	if d := ok(c.Check(ctxT(t), "k", MustGCRA(1, 1, time.Second))); d.Source != SourceFallback {
		t.Errorf("%+v", d)
	}
}
