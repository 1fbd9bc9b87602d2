package rlhttp

// The client-IP rule (docs/clients.md#client-ip); the cases are clients/rust/tests/http_rules.rs's.

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

func rule(t *testing.T, proxies ...string) ClientIP {
	t.Helper()
	c, err := ClientIP{}.Trusted(proxies...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func headers(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func keyOf(c ClientIP, peer string, h http.Header) string {
	var p netip.Addr
	if peer != "" {
		p = netip.MustParseAddr(peer)
	}
	k, found, _ := c.Resolve(p, h)
	if !found {
		return UnknownIP
	}
	return k
}

func TestClientIPIgnoresForwardingHeadersFromUntrustedPeers(t *testing.T) {
	if got := keyOf(rule(t, "10.0.0.0/8"), "203.0.113.9", headers("X-Forwarded-For", "1.2.3.4")); got != "203.0.113.9" {
		t.Error(got)
	}
	if got := keyOf(ClientIP{}, "10.0.0.1", headers("X-Forwarded-For", "1.2.3.4")); got != "10.0.0.1" {
		t.Error(got)
	}
}

func TestClientIPWalksXForwardedForFromTheRightSkippingTrustedProxies(t *testing.T) {
	c := rule(t, "10.0.0.0/8", "192.0.2.1")
	for _, tc := range []struct {
		h    http.Header
		want string
	}{
		{headers("X-Forwarded-For", "6.6.6.6, 198.51.100.7, 192.0.2.1, 10.1.1.1"), "198.51.100.7"},
		{headers(), "10.0.0.5"},
		{headers("X-Forwarded-For", "10.2.2.2, 10.3.3.3"), "10.2.2.2"},
		{headers("X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.8"), "198.51.100.8"},
	} {
		if got := keyOf(c, "10.0.0.5", tc.h); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.h, got, tc.want)
		}
	}
}

func TestClientIPReadsForwardedOnlyWhenConfigured(t *testing.T) {
	fwd := `for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=10.0.0.2`
	if got := keyOf(rule(t, "10.0.0.0/8"), "10.0.0.1", headers("Forwarded", fwd)); got != "10.0.0.1" {
		t.Error(got)
	}
	c := rule(t, "10.0.0.0/8").WithForwarding(Forwarded)
	if got := keyOf(c, "10.0.0.1", headers("Forwarded", fwd)); got != "2001:db8::/64" {
		t.Error(got)
	}
	if got := keyOf(c, "10.0.0.1", headers("Forwarded", fwd, "X-Forwarded-For", "9.9.9.9")); got != "2001:db8::/64" {
		t.Error(got)
	}
	for _, tc := range []struct {
		value, want string
		unusable    bool
	}{
		{`for="1.1.1.1"`, "1.1.1.1", false},
		{`for=1.1.1.1`, "1.1.1.1", false},
		{`for="1.1.1.1`, "10.0.0.1", true},
		{`for=1.1.1.1"`, "10.0.0.1", true},
		{`for="1.1.1".1"`, "10.0.0.1", true},
		{`for=""`, "10.0.0.1", true},
		{`for="[2001:db8::1]:4711`, "10.0.0.1", true},
		{`proto=https`, "10.0.0.1", true},
		{`for=unknown`, "10.0.0.1", true},
		{`for=_hidden`, "10.0.0.1", true},
		// A port after the address (a number, or RFC 7239's obfuscated "_…"), nothing else.
		{`for="1.1.1.1:80"`, "1.1.1.1", false},
		{`for="1.1.1.1:_obf-1"`, "1.1.1.1", false},
		{`for="1.1.1.1:junk"`, "10.0.0.1", true},
		{`for="1.1.1.1:"`, "10.0.0.1", true},
		{`for="1.1.1.1:80x"`, "10.0.0.1", true},
		{`for="[2001:db8::1]junk"`, "10.0.0.1", true},
		{`for="[2001:db8::1]:"`, "10.0.0.1", true},
		{`for="[2001:db8::1"`, "10.0.0.1", true},
	} {
		got, found, unusable := c.Resolve(netip.MustParseAddr("10.0.0.1"), headers("Forwarded", tc.value))
		if !found || got != tc.want || unusable != tc.unusable {
			t.Errorf("%s: %q %v %v", tc.value, got, found, unusable)
		}
	}
}

func TestClientIPNormalisesPortsAndIPv6(t *testing.T) {
	c := rule(t, "::1")
	if got := keyOf(c, "::1", headers("X-Forwarded-For", "198.51.100.7:5555")); got != "198.51.100.7" {
		t.Error(got)
	}
	if got := keyOf(c, "::1", headers("X-Forwarded-For", "[2001:DB8:0::1]:80")); got != "2001:db8::/64" {
		t.Error(got)
	}
	if got := keyOf(ClientIP{}, "2001:db8:0:0:9:8:7:6", nil); got != "2001:db8::/64" {
		t.Error(got)
	}
	if got := (ClientIP{}).KeyOf(netip.MustParseAddr("2001:db8:1:2:3:4:5:6")); got != "2001:db8:1:2::/64" {
		t.Error(got)
	}
	exact, err := ClientIP{}.WithIPv6Prefix(128)
	if err != nil {
		t.Fatal(err)
	}
	if got := keyOf(exact, "2001:db8::1", nil); got != "2001:db8::1" {
		t.Error(got)
	}
	c56, _ := ClientIP{}.WithIPv6Prefix(56)
	if got := keyOf(c56, "2001:db8:1:2ff::1", nil); got != "2001:db8:1:200::/56" {
		t.Error(got)
	}
	for _, bits := range []int{47, 129} {
		if _, err := (ClientIP{}).WithIPv6Prefix(bits); err == nil {
			t.Errorf("%d accepted", bits)
		}
	}
	if got := keyOf(ClientIP{}, "::ffff:192.0.2.7", nil); got != "192.0.2.7" {
		t.Error(got)
	}
	if got := keyOf(ClientIP{}, "", nil); got != UnknownIP {
		t.Error(got)
	}
	if _, err := (ClientIP{}).Trusted("not-a-network"); err == nil || err.Error() != "trusted proxy 'not-a-network' is not an address or network" {
		t.Error(err)
	}
	// An IPv4-mapped trusted network is the IPv4 one.
	m := rule(t, "::ffff:10.0.0.0/104")
	if got := keyOf(m, "10.1.2.3", headers("X-Forwarded-For", "198.51.100.1")); got != "198.51.100.1" {
		t.Error(got)
	}
}

func TestUnixTrustsAPeerWithoutAnAddress(t *testing.T) {
	c := rule(t, "unix")
	k, found, _ := c.Resolve(netip.Addr{}, headers("X-Forwarded-For", "198.51.100.7"))
	if !found || k != "198.51.100.7" {
		t.Errorf("%q %v", k, found)
	}
	if _, found, _ := (ClientIP{}).Resolve(netip.Addr{}, headers("X-Forwarded-For", "198.51.100.7")); found {
		t.Error("without unix a socket peer is no proxy")
	}
	r, _ := http.NewRequest("GET", "/", nil)
	r.RemoteAddr = "@"
	if PeerAddr(r).IsValid() {
		t.Error("@ is no address")
	}
	r.RemoteAddr = "192.0.2.1:1234"
	if PeerAddr(r) != netip.MustParseAddr("192.0.2.1") {
		t.Error(PeerAddr(r))
	}
	r.RemoteAddr = "[2001:db8::1]:80"
	if k, _, _ := (ClientIP{}).FromRequest(r); k != "2001:db8::/64" {
		t.Error(k)
	}
}

func TestNormalizeListAndPath(t *testing.T) {
	if got := NormalizeList([]string{" a ,b", "\tc", "a,,b"}); got != "a, b, c, a, , b" {
		t.Errorf("%q", got)
	}
	for in, want := range map[string]string{
		"/api//Things/": "/api/Things",
		"/api/%54hings": "/api/Things",
		"":              "/",
		"/":             "/",
		"//":            "/",
		"api":           "/api",
		"/a%2Fb":        "/a/b",
		"/a%zz":         "/a%zz",
		"/a%4":          "/a%4",
		"/%C3%A9":       "/é",
		"/%E2%82":       "/\uFFFD",       // one maximal subpart: one replacement
		"/%FF%FE":       "/\uFFFD\uFFFD", // two invalid bytes: two
		"/%E2%82x":      "/\uFFFDx",
		"/%ED%A0%80":    "/\uFFFD\uFFFD\uFFFD", // a surrogate: ED then two stray continuations
		"/%F0%9F%98%80": "/😀",
		"/%F4%90%80%80": "/\uFFFD\uFFFD\uFFFD\uFFFD", // past U+10FFFF
		"/%E0%80%AF":    "/\uFFFD\uFFFD\uFFFD",       // overlong
		"/%C0%AF":       "/\uFFFD\uFFFD",
		// Dot segments resolved (RFC 3986 5.2.4), after decoding, never above the root.
		"/static/../api":       "/api",
		"/static/./../api/x/":  "/api/x",
		"/a/./b/.":             "/a/b",
		"/a/b/..":              "/a",
		"/..":                  "/",
		"/../../etc":           "/etc",
		"/static/%2e%2e/api":   "/api",
		"/static/%2E%2E%2Fapi": "/api",
		"/static//..//api":     "/api",
		"/a/.../b/..c/.d":      "/a/.../b/..c/.d",
		"..":                   "/",
	} {
		if got := NormalizePath(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func FuzzClientIP(f *testing.F) {
	for _, s := range []string{"1.2.3.4", `for="[::1]:80";by=x`, "::ffff:1.2.3.4, 10.0.0.1", `"`, "[", "1.2.3.4:", ", ,"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	c, _ := ClientIP{}.Trusted("10.0.0.0/8", "::1", "unix")
	f.Fuzz(func(t *testing.T, value string, forwarded bool) {
		r := c
		name := "X-Forwarded-For"
		if forwarded {
			r, name = c.WithForwarding(Forwarded), "Forwarded"
		}
		h := http.Header{name: strings.Split(value, "\n")}
		for _, peer := range []netip.Addr{{}, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("203.0.113.1")} {
			k, found, _ := r.Resolve(peer, h)
			if found && (k == "" || strings.ContainsAny(k, " ,\"[]")) {
				t.Fatalf("%q -> %q", value, k)
			}
		}
	})
}

func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/a//b/", "%2F%2f", "%", "\xff/%ff", "/a/../b/./", "%2e%2E/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		out := NormalizePath(p)
		if !utf8.ValidString(out) || (utf8.ValidString(p) && !strings.Contains(p, "%") && lossyUTF8([]byte(p)) != p) {
			t.Fatalf("%q -> %q", p, out)
		}
		if !strings.HasPrefix(out, "/") || strings.Contains(out, "//") || (len(out) > 1 && strings.HasSuffix(out, "/")) {
			t.Fatalf("%q -> %q", p, out)
		}
		for _, seg := range strings.Split(out, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q -> %q: a dot segment left", p, out)
			}
		}
		if again := NormalizePath(out); again != out && !strings.Contains(out, "%") {
			t.Fatalf("%q -> %q -> %q: not idempotent", p, out, again)
		}
	})
}

// Nothing a request carries can panic a key function or give a key whose hash tag a client
// picked: every identity key is "<name>:{<kind>:<escaped value>}" with no other brace.
func FuzzKeyFunctions(f *testing.F) {
	for _, s := range []string{"k1", "{tag}", "a,b\tc", strings.Repeat("x", 200), "\x00\xff", "é"} {
		f.Add(s, "/api/"+s, "10.0.0.1:80")
	}
	f.Add("", "", "")
	f.Add("x", "%zz//", "[::1]:1")
	ip, _ := ClientIP{}.Trusted("10.0.0.0/8", "unix")
	f.Fuzz(func(t *testing.T, value, path, remote string) {
		r, err := http.NewRequest("GET", "http://h/", nil)
		if err != nil {
			t.Skip()
		}
		r.URL.Path, r.URL.RawPath, r.RemoteAddr = path, "", remote
		r.Header["X-Api-Key"] = strings.Split(value, "\n")
		r.Header["X-Forwarded-For"] = []string{value}
		for _, k := range []Key{IP(), Header("X-API-Key"), Route(), Func("user", func(r *http.Request) (string, bool) { return value, true })} {
			got := k.fn(r, env{ip: ip})
			if !got.ok {
				continue
			}
			key := redisrl.IdentityKey("name", k.Kind(), got.value, "")
			inner := strings.TrimSuffix(strings.TrimPrefix(key, "name:{"), "}")
			if !strings.HasPrefix(key, "name:{") || strings.ContainsAny(inner, "{}") {
				t.Fatalf("%s: %q -> %q", k.Kind(), got.value, key)
			}
		}
	})
}
