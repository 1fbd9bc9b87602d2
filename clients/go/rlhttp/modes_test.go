package rlhttp

// Helpers of the tests that run against the module and against the Lua fallback.

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// bothModes runs f with the module (a server that has it) and with the Lua fallback (a
// server without it, found by the client's own detection), each on a server of its own;
// mode is the limiter option that pins the mode expected.
func bothModes(t *testing.T, f func(t *testing.T, rs *server, mode redisrl.Option)) {
	t.Run("module", func(t *testing.T) { f(t, startServer(t), redisrl.WithMode(redisrl.ModeModule)) })
	t.Run("fallback", func(t *testing.T) {
		rs := &server{testserver.StartServer(t, false)}
		if m, err := rs.limiter(t).ResolvedMode(t.Context()); err != nil || m != redisrl.ModeFallback {
			t.Fatalf("a server without the module: %v %v", m, err)
		}
		f(t, rs, redisrl.WithMode(redisrl.ModeFallback))
	})
}

func counter(l *redisrl.Client, name string) uint64 {
	n, _ := l.Counters().Get(name)
	return n
}

// remaining peeks at a key (cost 0 writes nothing) with a limiter of its own.
func remaining(t *testing.T, l *redisrl.Client, key string, spec redisrl.Spec) redisrl.Decision {
	t.Helper()
	d, err := l.Check(t.Context(), key, spec, redisrl.Cost(0))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// logBuffer is a slog logger writing text lines to a buffer (safe across goroutines).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// waitFor polls f until it is true, failing after a deadline.
func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
