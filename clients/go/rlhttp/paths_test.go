package rlhttp

// Exempt paths through a real net/http server against a real redis-server (module and
// fallback), and the pattern syntax.

import (
	"testing"
	"time"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

// Exempt paths: MatchPath's patterns (the Rust layer's PathPattern, Python's exempt paths)
// on the normalised path, with no Redis call and no RateLimit fields.
func TestExemptPaths(t *testing.T) {
	bothModes(t, func(t *testing.T, rs *server, mode redisrl.Option) {
		l := rs.limiter(t, mode)
		rule := []Rule{{Limits: []Limit{{Name: "one", Spec: redisrl.MustWindow(1, time.Minute, redisrl.Fixed), Key: IP()}}}}
		s := serve(t, mustNew(t, l, rule, WithExemptPaths("/health", "/static/*"), WithExemptPaths("/internal/", "/v[0-9]/ping*")))
		calls := counter(l, "redis_calls")
		for _, p := range []string{"/health", "/health/", "//health", "/static/a/b.css", "/internal", "/internal/x/y", "/v2/ping", "/%76%32/ping"} {
			for range 2 {
				// (the mux answers "//health" with a redirect to "/health")
				if r := get(t, s.URL+p); r.status >= 400 || r.header.Get("RateLimit") != "" {
					t.Errorf("%s is exempt: %d %v", p, r.status, r.header)
				}
			}
		}
		if n := counter(l, "redis_calls"); n != calls {
			t.Errorf("exempt paths made %d Redis calls", n-calls)
		}
		if r := get(t, s.URL+"/"); r.status != 200 || r.header.Get("RateLimit") == "" {
			t.Errorf("/: %d %v", r.status, r.header)
		}
		for _, p := range []string{"/", "/healthz", "/static", "/internals", "/v/ping", "/vx/ping", "/v/pings"} {
			if r := get(t, s.URL+p); r.status != 429 {
				t.Errorf("%s is limited: %d", p, r.status)
			}
		}
	})
}

func TestMatchPath(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"/users/*/avatar", "/users/3/avatar", true},
		{"*", "/anything/at/all", true},
		{"/users/*/avatar", "/users/3/avatars", false},
		{"/users/*", "/users/a/b", true}, // '*' crosses '/', as fnmatch
		{"/v?/x*", "/v2/x", true},
		{"/v?/x*", "/v22/x", false},
		{"/v?/x", "/v2/x", false}, // without a '*' a pattern is a path, not a glob
		{"/v?/x", "/v?/x", true},
		{"/v[0-9]/*", "/v7/y", true},
		{"/v[!0-9]/*", "/v7/y", false},
		{"/v[!0-9]/*", "/vx/y", true},
		{"/a[/b*", "/a[/bc", true}, // an unclosed '[' is itself
		{"/[]]*", "/]x", true},     // ']' first in a class is a member
		{"/é?*", "/éa", true},      // characters, not bytes
		{"/x/*.css", "/x/a/b.css", true},
		{"/x/*.css", "/x/a/b.cs", false},
		{"*/end", "/a/b/end", true},
		{"/api/", "/api", true},
		{"/api/", "/api/x", true},
		{"/api/", "/apix", false},
		{"/", "/anything", true},
		{"/health", "/health", true},
		{"/health/", "/health", true},
		{"/health", "/health/x", false},
		{"//health/", "/health", false}, // a prefix is taken as written
		{"/Health", "/health", false},
	} {
		if got := MatchPath(c.pattern, c.path); got != c.want {
			t.Errorf("MatchPath(%q, %q) = %v", c.pattern, c.path, got)
		}
	}
}
