package rlhttp

import (
	"fmt"
	"time"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

// Named makes the limits of one rule entry, keyed by key: one limit is called name; several
// are each "<name>-<window seconds>s", with -2, -3 appended when two windows are equal
// (docs/clients.md#names). A limit built with Named keeps its own name.
func Named(name string, key Key, specs ...redisrl.Spec) []Limit {
	if len(specs) == 1 {
		n := specs[0].Name()
		if n == "" {
			n = name
		}
		return []Limit{{Name: n, Spec: specs[0], Key: key}}
	}
	out := make([]Limit, 0, len(specs))
	seen := map[string]int{}
	for _, s := range specs {
		n := s.Name()
		if n == "" {
			secs := int64(0)
			if w, ok := redisrl.PolicyWindow(s); ok {
				secs = max(1, int64((w+time.Second-1)/time.Second))
			}
			n = fmt.Sprintf("%s-%ds", name, secs)
		}
		seen[n]++
		if seen[n] > 1 {
			n = fmt.Sprintf("%s-%d", n, seen[n])
		}
		out = append(out, Limit{Name: n, Spec: s, Key: key})
	}
	return out
}

// ParseLimits reads limits as users write them ("20/minute; 200 per hour", SLIDING windows:
// redisrl.ParseLimits) into one rule entry's limits, named as Named names them.
func ParseLimits(name, text string, key Key) ([]Limit, error) {
	specs, err := redisrl.ParseLimits(text)
	if err != nil {
		return nil, err
	}
	return Named(name, key, specs...), nil
}
