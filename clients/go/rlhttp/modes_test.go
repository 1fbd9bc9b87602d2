package rlhttp

// Helpers of the tests that run against the module and against the Lua fallback.

import (
	"testing"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

// bothModes runs f once with the module and once with the fallback library, each on a server
// of its own.
func bothModes(t *testing.T, f func(t *testing.T, rs *server, mode redisrl.Option)) {
	for _, m := range []struct {
		name string
		mode redisrl.Mode
	}{{"module", redisrl.ModeModule}, {"fallback", redisrl.ModeFallback}} {
		t.Run(m.name, func(t *testing.T) { f(t, startServer(t), redisrl.WithMode(m.mode)) })
	}
}

func counter(l *redisrl.Client, name string) uint64 {
	n, _ := l.Counters().Get(name)
	return n
}
