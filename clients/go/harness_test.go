package redisrl

// The real-server harness is internal/testserver's, the one the rlhttp and rlgin tests use
// too (redis-server on a free loopback port, in a temporary directory, with the module or
// without it, stopped by PID; every wait has a deadline); here is what only this package's
// tests add: the two modes every behaviour test runs in, and small helpers. The server may be
// Redis 6.2 (scripts/test-compat.sh runs the scripts-mode tests there): the harness leaves out
// what 6.x lacks, and tests that need Functions skip there with the reason
// (testserver.Major, testserver.NeedFunctions).

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// server is a real server of a test.
type server = testserver.Server

// exampleAddr is the address of the shared server with the module, for the Example
// functions (which get no testing.T).
func exampleAddr() string { return testserver.Shared(testserver.Panicker{}, true).Addr() }

// TestMain stops the servers the tests shared (testserver.Shared).
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopShared()
	os.Exit(code)
}

// testMode is one of the two modes every behaviour test runs in.
type testMode struct {
	name   string
	module bool
}

var kinds = []testMode{{"module", true}, {"fallback", false}}

func (k testMode) want() Mode {
	if k.module {
		return ModeModule
	}
	return ModeFallback
}

func (k testMode) source() Source {
	if k.module {
		return SourceModule
	}
	return SourceFallback
}

// bothModes runs f against the module's server and against a server without it (where
// ModeAuto must pick the fallback), with a fresh client of a unique prefix.
func bothModes(t *testing.T, f func(t *testing.T, k testMode, s *server, c *Client), opts ...Option) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			s := testserver.Shared(t, k.module)
			c, err := New(s.RDB(t), append([]Option{WithPrefix(testserver.UniquePrefix(t))}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			f(t, k, s, c)
		})
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ok returns v, and panics (failing the test) on an error.
func ok[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var errContextCanceled = context.Canceled

func contextWithCancel(t testing.TB) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx, cancel
}
