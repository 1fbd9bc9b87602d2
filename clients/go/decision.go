package redisrl

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Source says who answered a check.
type Source uint8

const (
	// SourceModule is the redis-rl module's commands.
	SourceModule Source = iota + 1
	// SourceFallback is the project's Lua library (FCALL, or EVALSHA where FUNCTION is not
	// allowed).
	SourceFallback
	// SourceLocal is this process: the deny cache, or the failure policy.
	SourceLocal
)

// String returns "module", "fallback" or "local".
func (s Source) String() string {
	switch s {
	case SourceModule:
		return "module"
	case SourceFallback:
		return "fallback"
	case SourceLocal:
		return "local"
	}
	return "unknown"
}

// Decision is the answer to one request (docs/clients.md#decision).
//
// A denial is one of two things: denied until RetryAfter has passed, or Never (the request's
// cost exceeds the limit, so no wait can admit it: HTTP 413, not 429). Never is its own
// field, never a negative duration.
type Decision struct {
	// Allowed: the request may go ahead.
	Allowed bool
	// Never: denied, and no wait can admit this request (its cost exceeds the limit).
	// RetryAfter is then zero and means nothing.
	Never bool
	// Limit is the most requests an idle key admits at once (burst / limit / slots).
	Limit uint64
	// Remaining is the number of requests of cost 1 still allowed right now, after this one.
	Remaining uint64
	// RetryAfter: when denied (and not Never), how long until this same request would be
	// allowed, at least 1 ms. When allowed, zero, or a reservation's wait before acting
	// (MaxWait).
	RetryAfter time.Duration
	// ResetAfter is how long until the key is idle again (zero for an idle key).
	ResetAfter time.Duration
	// Degraded: Redis did not answer, the failure policy decided.
	Degraded bool
	// Blind: the open or closed failure policy answered without counting anything, so the
	// HTTP answer carries no RateLimit field (docs/clients.md#closed-policy).
	Blind bool
	// Source says who decided.
	Source Source
	// Spec is the limit this decision is about (for a combined decision, the binding one).
	Spec Spec
	// Key is the key as sent, with the client's prefix ("" for a combined decision).
	Key string
	// PerKey holds each key's decision of a CheckAll, in entry order (nil otherwise).
	PerKey []Decision
}

// Get returns the decision for key (as sent, with the prefix) of a combined decision.
func (d Decision) Get(key string) (Decision, bool) {
	for _, p := range d.PerKey {
		if p.Key == key {
			return p, true
		}
	}
	return Decision{}, false
}

// String is a short description for logs.
func (d Decision) String() string {
	switch {
	case d.Allowed:
		return fmt.Sprintf("allowed (remaining %d of %d, %s)", d.Remaining, d.Limit, d.Source)
	case d.Never:
		return fmt.Sprintf("denied, never allowed (limit %d, %s)", d.Limit, d.Source)
	}
	return fmt.Sprintf("denied, retry after %v (limit %d, %s)", d.RetryAfter, d.Limit, d.Source)
}

// HeaderOptions are the options of Decision.HeadersWith.
type HeaderOptions struct {
	// PolicyName names a single limit in the fields (default: the limit's name, else
	// "default").
	PolicyName string
	// Names names the limits of a combined decision by key as sent (default: each limit's
	// name, else "limit1", "limit2", ...).
	Names map[string]string
	// XHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (seconds
	// from now) of the binding limit.
	XHeaders bool
}

// ceilSeconds rounds a duration up to whole seconds, as Retry-After wants.
func ceilSeconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	s := uint64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

func sfString(name string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		if c < 0x20 || c >= 0x7f {
			c = '?' // names are printable ASCII when set; a hand-made Spec cannot break the field
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}

// Headers returns the HTTP response fields for this decision: Retry-After (whole seconds,
// rounded up, at least 1) when denied and retryable; RateLimit-Policy and RateLimit (IETF
// draft-ietf-httpapi-ratelimit-headers) for every limit, in key order for a combined
// decision. policyName names a single limit ("" for the limit's name, else "default"). A
// Blind decision (the open or closed policy) carries only Retry-After.
func (d Decision) Headers(policyName string) http.Header {
	return d.HeadersWith(HeaderOptions{PolicyName: policyName})
}

// HeadersWith is Headers with names per key and the optional X-RateLimit-* fields.
func (d Decision) HeadersWith(o HeaderOptions) http.Header {
	h := http.Header{}
	if !d.Allowed && !d.Never {
		s := ceilSeconds(d.RetryAfter)
		if s < 1 {
			s = 1
		}
		h.Set("Retry-After", strconv.FormatUint(s, 10))
	}
	if d.Blind {
		return h
	}
	type item struct {
		name string
		d    Decision
	}
	var items []item
	if len(d.PerKey) == 0 {
		name := o.PolicyName
		if name == "" && d.Spec != nil {
			name = d.Spec.Name()
		}
		if name == "" {
			name = "default"
		}
		items = append(items, item{name, d})
	} else {
		for i, p := range d.PerKey {
			name := o.Names[p.Key]
			if name == "" && p.Spec != nil {
				name = p.Spec.Name()
			}
			if name == "" {
				name = fmt.Sprintf("limit%d", i+1)
			}
			items = append(items, item{name, p})
		}
	}
	var policies, fields []string
	for _, it := range items {
		if p, ok := it.d.policyItem(it.name); ok {
			policies = append(policies, p)
		}
		fields = append(fields, fmt.Sprintf("%s;r=%d;t=%d", sfString(it.name), it.d.Remaining, ceilSeconds(it.d.ResetAfter)))
	}
	if len(policies) > 0 {
		h.Set("RateLimit-Policy", strings.Join(policies, ", "))
	}
	h.Set("RateLimit", strings.Join(fields, ", "))
	if o.XHeaders {
		h.Set("X-RateLimit-Limit", strconv.FormatUint(d.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatUint(d.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatUint(ceilSeconds(d.ResetAfter), 10))
	}
	return h
}

func (d Decision) policyItem(name string) (string, bool) {
	var s spec
	var err error
	if d.Spec != nil {
		s, err = d.Spec.spec()
	}
	if d.Spec == nil || err != nil {
		if d.Limit == 0 {
			return "", false
		}
		return fmt.Sprintf("%s;q=%d", sfString(name), d.Limit), true
	}
	item := fmt.Sprintf("%s;q=%d", sfString(name), s.capacity)
	if w, ok := s.policyWindow(); ok {
		secs := ceilSeconds(w)
		if secs < 1 {
			secs = 1
		}
		item += fmt.Sprintf(";w=%d", secs)
	} else {
		item += `;qu="concurrent-requests"`
	}
	return item, true
}

// fromReply reads the module's five integers (docs/reference.md#r-reply-1): -1 for
// retry_after_ms is a zero wait when allowed and Never when denied; with reservation
// (MAXWAIT) an allowed reply's retry field is the wait before acting.
func fromReply(r [5]int64, s Spec, key string, source Source, reservation bool) Decision {
	nonNeg := func(v int64) uint64 {
		if v < 0 {
			return 0
		}
		return uint64(v)
	}
	ms := func(v int64) time.Duration {
		// Replies saturate at 2^63-1 ms (docs/reference.md#r-reply-3); so does the Duration.
		if v <= 0 {
			return 0
		}
		if v > int64(1<<63-1)/int64(time.Millisecond) {
			return time.Duration(1<<63 - 1)
		}
		return time.Duration(v) * time.Millisecond
	}
	d := Decision{
		Allowed:    r[0] == 1,
		Limit:      nonNeg(r[1]),
		Remaining:  nonNeg(r[2]),
		ResetAfter: ms(r[4]),
		Source:     source,
		Spec:       s,
		Key:        key,
	}
	switch {
	case d.Allowed && reservation:
		d.RetryAfter = ms(r[3])
	case d.Allowed:
	case r[3] < 0:
		d.Never = true
	default:
		d.RetryAfter = ms(r[3])
	}
	return d
}
