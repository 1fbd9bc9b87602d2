package rlgin

// The gin adapter through a real server (gin's engine behind httptest.NewServer) against a
// real redis-server with the module.

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
	"github.com/redis-rl/redis-rl/clients/go/rlhttp"
)

func TestGinGetsTheMiddlewaresAnswers(t *testing.T) {
	gin.SetMode(gin.TestMode)
	rs := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	limiter, err := redisrl.New(rdb, redisrl.WithPrefix("gin:"))
	if err != nil {
		t.Fatal(err)
	}
	window := redisrl.MustWindow(3, time.Minute, redisrl.Fixed)
	mw, err := rlhttp.New(limiter, []rlhttp.Rule{{
		Limits:     []rlhttp.Limit{{Name: "ip", Spec: window, Key: rlhttp.IP()}},
		DeductWhen: func(status int) bool { return status < 500 },
	}})
	if err != nil {
		t.Fatal(err)
	}
	router := gin.New()
	router.Use(Middleware(mw))
	router.GET("/things", func(c *gin.Context) {
		d, ok := rlhttp.DecisionFrom(c.Request.Context())
		c.JSON(200, gin.H{"decided": ok, "remaining": d.Remaining})
	})
	router.GET("/fail", func(c *gin.Context) { c.Status(500) }) // set, written by gin after the chain
	s := httptest.NewServer(router)
	t.Cleanup(s.Close)
	get := func(path string) (int, http.Header, map[string]any) {
		resp, err := http.Get(s.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		return resp.StatusCode, resp.Header, body
	}
	for range 3 {
		if status, _, _ := get("/fail"); status != 500 {
			t.Fatalf("%d", status)
		}
	}
	for i := range 3 {
		status, h, body := get("/things")
		if status != 200 || body["decided"] != true || h.Get("RateLimit") == "" {
			t.Errorf("request %d: %d %v %v (server errors must not have been charged)", i, status, h, body)
		}
	}
	status, h, body := get("/things")
	if status != 429 || body["error"] != "rate_limited" || h.Get("Retry-After") == "" {
		t.Errorf("%d %v %v", status, h, body)
	}
}

// A lease held by a request through gin: no free slot is a 429, and the slot comes back when
// the response finishes and when a handler panics (gin.Recovery, placed before the limiter,
// gets the panic after the release).
func TestGinHoldsALeaseUntilTheRequestEnds(t *testing.T) {
	gin.SetMode(gin.TestMode)
	rs := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	limiter, err := redisrl.New(rdb, redisrl.WithPrefix("ginlease:"))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := rlhttp.New(limiter, []rlhttp.Rule{{
		Limits: []rlhttp.Limit{{Name: "jobs", Spec: redisrl.MustLease(1, time.Minute), Key: rlhttp.IP()}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	router := gin.New()
	router.Use(gin.CustomRecovery(func(c *gin.Context, _ any) { c.AbortWithStatus(500) }), Middleware(mw))
	entered, finish := make(chan struct{}), make(chan struct{})
	router.GET("/hold", func(c *gin.Context) {
		close(entered)
		<-finish
		c.String(200, "held")
	})
	router.GET("/quick", func(c *gin.Context) { c.String(200, "quick") })
	router.GET("/panic", func(c *gin.Context) { panic("boom") })
	s := httptest.NewServer(router)
	t.Cleanup(s.Close)
	client := &http.Client{Timeout: 10 * time.Second}
	status := func(path string) int {
		resp, err := client.Get(s.URL + path)
		if err != nil {
			t.Error(err)
			return 0
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	held := make(chan int, 1)
	go func() { held <- status("/hold") }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not entered")
	}
	if got := status("/quick"); got != 429 {
		t.Errorf("no free slot: %d", got)
	}
	close(finish)
	select {
	case got := <-held:
		if got != 200 {
			t.Errorf("the holder: %d", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not finish")
	}
	if got := status("/panic"); got != 500 {
		t.Errorf("the panic: %d", got)
	}
	if got := status("/quick"); got != 200 {
		t.Errorf("released after the response and after the panic: %d", got)
	}
}
