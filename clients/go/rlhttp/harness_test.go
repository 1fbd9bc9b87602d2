package rlhttp

// The real server comes from internal/testserver (with the module, stopped by PID).

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

type server struct{ *testserver.Server }

func startServer(t *testing.T) *server { return &server{testserver.Start(t)} }

func (s *server) stop() { s.Stop() }

// limiter is a fresh client of s (its own go-redis pool, as a separate process would have).
func (s *server) limiter(t *testing.T, opts ...redisrl.Option) *redisrl.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := redisrl.New(rdb, append([]redisrl.Option{redisrl.WithPrefix(strings.ReplaceAll(t.Name(), "/", ".") + ":"), redisrl.WithTimeout(300 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
