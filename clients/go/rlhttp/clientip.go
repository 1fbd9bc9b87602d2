// Package rlhttp is the net/http side of redisrl (docs/clients.md#web-middleware): a
// middleware, func(http.Handler) http.Handler (Middleware.Handler), that limits requests by
// rules of named limits keyed by the request's identities, and the contract's
// framework-neutral pieces it builds on: the client IP behind trusted proxies
// (docs/clients.md#client-ip), header lists and normalised paths.
package rlhttp

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// UnknownIP is the ip identity's value when no usable client address can be found (no peer
// address, e.g. a Unix socket, and no trusted forwarding header): every such request counts
// in one shared bucket, limited, never unlimited (docs/clients.md#no-usable-client-address).
const UnknownIP = "unknown"

// Forwarding is the one forwarding header trusted proxies write.
type Forwarding uint8

const (
	// XForwardedFor is "X-Forwarded-For: client, proxy1, proxy2" (the default).
	XForwardedFor Forwarding = iota
	// Forwarded is RFC 7239's "Forwarded: for=client, for=proxy1".
	Forwarded
)

func (f Forwarding) header() string {
	if f == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// ClientIP is the client address rule: which peers are trusted proxies, which forwarding
// header they write, and how IPv6 clients are keyed. The zero value trusts no proxy (the
// socket peer is the client) and keys IPv6 by /64.
//
//   - The socket peer is the client unless it is a trusted proxy (an address or a CIDR
//     network). Then exactly one forwarding header is read (X-Forwarded-For by default, or
//     Forwarded; never both), every line of it counting (repeated fields are one list), and
//     the rightmost address not in the trusted set is the client; what a client writes at
//     the left is ignored.
//   - An unusable value (garbage, a port-only entry, an "unknown" or obfuscated hop, an
//     unclosed or stray quote such as for="1.1.1.1, an empty list) falls back to the peer
//     address, and is reported (the middleware counts forwarded_unusable).
//   - An IPv4-mapped IPv6 address is IPv4. IPv6 clients are keyed by their network of
//     IPv6Prefix bits (default 64: rotating addresses inside one allocation gains nothing),
//     written "2001:db8:1:2::/64".
type ClientIP struct {
	trusted    []netip.Prefix
	trustUnix  bool
	forwarding Forwarding
	ipv6Prefix int // 0: 64
}

// Trusted returns the rule with these proxies trusted: addresses, CIDR networks, and the
// word "unix", which makes a peer without an IP address (a Unix socket) a trusted proxy, so
// its forwarding header names the client. An entry that is none of these is an error.
func (c ClientIP) Trusted(proxies ...string) (ClientIP, error) {
	var nets []netip.Prefix
	unix := false
	for _, p := range proxies {
		t := strings.TrimSpace(p)
		if strings.EqualFold(t, "unix") {
			unix = true
			continue
		}
		if n, err := netip.ParsePrefix(t); err == nil && n.Addr().Zone() == "" {
			nets = append(nets, netip.PrefixFrom(n.Addr().Unmap(), unmappedBits(n)).Masked())
			continue
		}
		if a, err := netip.ParseAddr(t); err == nil && a.Zone() == "" {
			a = a.Unmap()
			nets = append(nets, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		return ClientIP{}, fmt.Errorf("trusted proxy '%s' is not an address or network", t)
	}
	c.trusted, c.trustUnix = nets, unix
	return c, nil
}

// unmappedBits is a prefix's length once an IPv4-mapped network is written as IPv4.
func unmappedBits(n netip.Prefix) int {
	if n.Addr().Is4In6() {
		return max(n.Bits()-96, 0)
	}
	return n.Bits()
}

// WithForwarding returns the rule reading header f (default XForwardedFor).
func (c ClientIP) WithForwarding(f Forwarding) ClientIP {
	c.forwarding = f
	return c
}

// WithIPv6Prefix returns the rule keying IPv6 clients by their first bits bits: 48 to 128
// (128 keys each address).
func (c ClientIP) WithIPv6Prefix(bits int) (ClientIP, error) {
	if bits < 48 || bits > 128 {
		return ClientIP{}, fmt.Errorf("ipv6_prefix must be 48 to 128")
	}
	c.ipv6Prefix = bits
	return c, nil
}

func (c ClientIP) prefixBits() int {
	if c.ipv6Prefix == 0 {
		return 64
	}
	return c.ipv6Prefix
}

// KeyOf is how an address is keyed: IPv4 (also IPv4-mapped IPv6) as is, IPv6 as its network
// of the rule's prefix bits ("2001:db8::/64"; the plain address at 128).
func (c ClientIP) KeyOf(addr netip.Addr) string {
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	bits := c.prefixBits()
	if bits >= 128 {
		return addr.String()
	}
	p, _ := addr.Prefix(bits)
	return p.String()
}

func (c ClientIP) isTrusted(a netip.Addr) bool {
	for _, n := range c.trusted {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// Resolve finds the client of a request from peer (an invalid netip.Addr: no peer address,
// e.g. a Unix socket) with these headers. It returns the client's key (KeyOf), found false
// when there is no usable client address (the middleware then keys the ip identity as
// UnknownIP), and unusable true when a forwarding header was unusable (the peer was taken).
func (c ClientIP) Resolve(peer netip.Addr, h http.Header) (key string, found, unusable bool) {
	if peer.IsValid() {
		peer = peer.Unmap().WithZone("")
	}
	addr, unusable := c.clientAddr(peer, h)
	if !addr.IsValid() {
		return "", false, unusable
	}
	return c.KeyOf(addr), true, unusable
}

// FromRequest is Resolve with the request's RemoteAddr as the peer.
func (c ClientIP) FromRequest(r *http.Request) (key string, found, unusable bool) {
	return c.Resolve(PeerAddr(r), r.Header)
}

// PeerAddr is the request's socket peer (RemoteAddr "ip:port" or a bare ip), or an invalid
// Addr when it has none (a Unix socket, a server that records none).
func PeerAddr(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr()
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return a
	}
	return netip.Addr{}
}

func (c ClientIP) clientAddr(peer netip.Addr, h http.Header) (netip.Addr, bool) {
	fromProxy := c.trustUnix
	if peer.IsValid() {
		fromProxy = c.isTrusted(peer)
	}
	if !fromProxy {
		return peer, false
	}
	lines := h.Values(c.forwarding.header())
	if len(lines) == 0 {
		return peer, false // no header: the proxy is the client (a health check)
	}
	raw := strings.Join(lines, ", ")
	var hops []string
	if c.forwarding == Forwarded {
		hops = forwardedFor(raw)
	} else {
		hops = strings.Split(raw, ",")
	}
	var leftmost netip.Addr
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseAddr(hops[i])
		switch {
		case !ok:
			return peer, true
		case !c.isTrusted(a):
			return a, false
		default:
			leftmost = a
		}
	}
	// Every hop is a trusted proxy: the request started inside; the leftmost is it.
	if leftmost.IsValid() {
		return leftmost, false
	}
	return peer, true
}

// unquoted is an entry without the quotes of a quoted string (RFC 7239 for="..."): quoted as
// a whole, or not at all; an unclosed or stray quote makes the entry unusable.
func unquoted(text string) (string, bool) {
	t := strings.TrimSpace(text)
	if !strings.Contains(t, `"`) {
		return t, true
	}
	if len(t) < 2 || t[0] != '"' || t[len(t)-1] != '"' {
		return "", false
	}
	inner := t[1 : len(t)-1]
	return inner, !strings.Contains(inner, `"`)
}

// parseAddr reads an address from a forwarding entry (quotes, port and brackets off).
func parseAddr(text string) (netip.Addr, bool) {
	t, ok := unquoted(text)
	if !ok {
		return netip.Addr{}, false
	}
	if rest, ok := strings.CutPrefix(t, "["); ok {
		var after string
		if t, after, ok = strings.Cut(rest, "]"); !ok || !portOrNothing(after) {
			return netip.Addr{}, false
		}
	} else if strings.Count(t, ":") == 1 {
		var after string
		if t, after, _ = strings.Cut(t, ":"); !portOrNothing(":" + after) {
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(t)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// portOrNothing reports whether s, what follows an address in a forwarding entry, is empty
// or a port: ':' and a number, or RFC 7239's obfuscated port ("_" and letters, digits, '.',
// '_', '-'). Anything else ("[2001:db8::1]junk") makes the entry unusable.
func portOrNothing(s string) bool {
	if s == "" {
		return true
	}
	port, ok := strings.CutPrefix(s, ":")
	if !ok || port == "" {
		return false
	}
	for _, c := range []byte(port) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return port[0] == '_' || strings.Trim(port, "0123456789") == ""
}

// forwardedFor is the for= values of an RFC 7239 Forwarded field, in order; an element
// without for= is an unusable entry ("").
func forwardedFor(value string) []string {
	var out []string
	for _, element := range strings.Split(value, ",") {
		found := false
		for _, pair := range strings.Split(element, ";") {
			name, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if ok && strings.EqualFold(strings.TrimSpace(name), "for") {
				out = append(out, strings.TrimSpace(v))
				found = true
			}
		}
		if !found {
			out = append(out, "")
		}
	}
	return out
}

// NormalizeList is one header field's lines as one list value: each line split on ',',
// each element trimmed of spaces and tabs, joined with ", " (empty elements kept: "a,,b" is
// "a, , b"). A header read as a key is this value (docs/clients.md#escaped-values).
func NormalizeList(lines []string) string {
	var b strings.Builder
	first := true
	for _, line := range lines {
		for _, element := range strings.Split(line, ",") {
			if !first {
				b.WriteString(", ")
			}
			first = false
			b.WriteString(strings.Trim(element, " \t"))
		}
	}
	return b.String()
}

func hexValue(b byte) (byte, bool) {
	switch {
	case b >= '0' && b <= '9':
		return b - '0', true
	case b >= 'a' && b <= 'f':
		return b - 'a' + 10, true
	case b >= 'A' && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}

// NormalizePath percent-decodes path, collapses runs of '/', resolves "." and ".."
// segments (RFC 3986's remove_dot_segments, after decoding, so "%2e%2e" is ".." too), and
// drops a trailing '/' (except for the root): "/api//Things/", "/api/%54hings" and
// "/static/../api/Things" all give "/api/Things".
// It takes the path as sent (http.Request.URL.EscapedPath(), not the decoded URL.Path, so a
// path is decoded once, as the Rust crate does). Bytes that are not UTF-8 after decoding
// become U+FFFD, one per maximal invalid subsequence (Rust's String::from_utf8_lossy).
func NormalizePath(path string) string {
	decoded := make([]byte, 0, len(path))
	for i := 0; i < len(path); i++ {
		if path[i] == '%' && i+2 < len(path) {
			h, ok1 := hexValue(path[i+1])
			l, ok2 := hexValue(path[i+2])
			if ok1 && ok2 {
				decoded = append(decoded, h<<4|l)
				i += 2
				continue
			}
		}
		decoded = append(decoded, path[i])
	}
	text := lossyUTF8(decoded)
	var b strings.Builder
	if !strings.HasPrefix(text, "/") {
		b.WriteByte('/')
	}
	last := byte(0)
	if b.Len() > 0 {
		last = '/'
	}
	for i := 0; i < len(text); i++ {
		if text[i] == '/' && last == '/' {
			continue
		}
		b.WriteByte(text[i])
		last = text[i]
	}
	out := removeDotSegments(b.String())
	if len(out) > 1 && strings.HasSuffix(out, "/") {
		out = out[:len(out)-1]
	}
	return out
}

// removeDotSegments resolves the "." and ".." segments of an absolute path with single '/'
// separators, as RFC 3986 section 5.2.4 does (".." above the root stays at the root):
// "/static/../api" is "/api", the path a router that resolves them serves.
func removeDotSegments(path string) string {
	if !strings.Contains(path, ".") {
		return path
	}
	segments := strings.Split(path[1:], "/")
	kept := make([]string, 0, len(segments))
	for i, seg := range segments {
		last := i == len(segments)-1
		switch seg {
		case ".":
			if last {
				kept = append(kept, "")
			}
		case "..":
			if len(kept) > 0 {
				kept = kept[:len(kept)-1]
			}
			if last {
				kept = append(kept, "")
			}
		default:
			kept = append(kept, seg)
		}
	}
	return "/" + strings.Join(kept, "/")
}

// lossyUTF8 is b as UTF-8 with each maximal invalid subsequence replaced by one U+FFFD (the
// Unicode "substitution of maximal subparts" that Rust's from_utf8_lossy and Python's
// errors="replace" use; Go's strings.ToValidUTF8 would replace a whole run with one).
func lossyUTF8(b []byte) string {
	var out strings.Builder
	out.Grow(len(b))
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			out.WriteByte(c)
			i++
			continue
		}
		// The sequence's length and the allowed range of its second byte (RFC 3629).
		n, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			n = 2
		case c == 0xE0:
			n, lo = 3, 0xA0
		case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
			n = 3
		case c == 0xED:
			n, hi = 3, 0x9F
		case c == 0xF0:
			n, lo = 4, 0x90
		case c >= 0xF1 && c <= 0xF3:
			n = 4
		case c == 0xF4:
			n, hi = 4, 0x8F
		}
		if n == 0 { // not a lead byte
			out.WriteString("\uFFFD")
			i++
			continue
		}
		j := i + 1
		for k := 1; k < n && j < len(b); k++ {
			l, h := byte(0x80), byte(0xBF)
			if k == 1 {
				l, h = lo, hi
			}
			if b[j] < l || b[j] > h {
				break
			}
			j++
		}
		if j-i == n {
			out.Write(b[i:j])
		} else {
			out.WriteString("\uFFFD")
		}
		i = j
	}
	return out.String()
}
