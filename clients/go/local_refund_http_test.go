package redisrl_test

// The middleware's DeductWhen under FailLocal, through a real net/http server: a request
// admitted by the in-memory limiter during an outage whose handler answers 500 after Redis
// answers again has its charge given back in memory, where it was taken, not in Redis
// (which never had it). The middleware refunds with Client.Refund(key, cost); the outage
// is a go-redis hook that refuses every command (ECONNREFUSED) while it is set.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
	"github.com/redis-rl/redis-rl/clients/go/rlhttp"
)

// refusing makes every command fail as a refused connection while down is set.
type refusing struct{ down *atomic.Bool }

func (h refusing) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h refusing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.down.Load() {
			return fmt.Errorf("dial tcp: %w", syscall.ECONNREFUSED)
		}
		return next(ctx, cmd)
	}
}

func (h refusing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestLocalDeductWhenAfterRecoveryRefundsInMemory(t *testing.T) {
	srv := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	var down atomic.Bool
	rdb.AddHook(refusing{&down})
	c, err := redisrl.New(rdb, redisrl.WithPrefix(strings.ReplaceAll(t.Name(), "/", ".")+":"),
		redisrl.WithFailurePolicy(redisrl.FailLocal), redisrl.WithProbeInterval(20*time.Millisecond),
		redisrl.WithTimeout(time.Second), redisrl.WithDenyCache(false))
	if err != nil {
		t.Fatal(err)
	}
	limit := redisrl.MustGCRA(3, 1, time.Hour) // nothing drains during the test
	m, err := rlhttp.New(c, []rlhttp.Rule{{
		Limits:     rlhttp.Named("api", rlhttp.Header("X-API-Key"), limit),
		DeductWhen: func(status int) bool { return status < 500 },
	}})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan redisrl.Decision, 1)
	release := make(chan struct{})
	site := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := rlhttp.DecisionFrom(r.Context())
		if r.URL.Path == "/slow" {
			entered <- d
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Key", d.Key)
	})))
	t.Cleanup(site.Close)
	client := &http.Client{Timeout: 30 * time.Second}
	get := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, site.URL+path, nil)
		req.Header.Set("X-API-Key", "k1")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	ctx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	// Redis charges one request, which stays charged (200).
	first := get("/fast")
	if first.StatusCode != http.StatusOK {
		t.Fatalf("%d", first.StatusCode)
	}
	key := strings.TrimPrefix(first.Header.Get("X-Key"), c.Prefix())
	report := func() redisrl.Decision {
		t.Helper()
		d, err := c.Check(ctx(), key, limit, redisrl.Cost(0))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := report(); d.Degraded || d.Remaining != 2 {
		t.Fatalf("Redis after one request: %+v", d)
	}
	// The outage: the slow request is admitted in memory, and its handler waits.
	down.Store(true)
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, site.URL+"/slow", nil)
		req.Header.Set("X-API-Key", "k1")
		resp, err := client.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	var d redisrl.Decision
	select {
	case d = <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow request did not reach its handler within 20 s")
	}
	if !d.Allowed || !d.Degraded || d.Blind || d.Source != redisrl.SourceLocal {
		t.Fatalf("the outage's decision: %+v", d)
	}
	// Redis answers again, and the client has returned to it; then the handler fails.
	down.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for report().Degraded {
		if time.Now().After(deadline) {
			t.Fatal("the client did not return to Redis within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	select {
	case status := <-done:
		if status != http.StatusInternalServerError {
			t.Fatalf("the slow request: %d", status)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the slow request did not end within 20 s")
	}
	if d := report(); d.Degraded || d.Remaining != 2 {
		t.Errorf("Redis gave back a unit it never took for the 500: %+v", d)
	}
	// Memory gave it back: in the next outage the key is whole there.
	down.Store(true)
	if d := report(); !d.Degraded || d.Source != redisrl.SourceLocal || d.Remaining != 3 {
		t.Errorf("memory kept the 500's charge: %+v", d)
	}
}
