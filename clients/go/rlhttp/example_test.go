package rlhttp_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
	"github.com/redis-rl/redis-rl/clients/go/rlhttp"
)

// A rule with limits by plan, a cost the client declares, and a concurrency limit per API
// key held while the request runs; health checks and static files are never limited.
func ExampleNew() {
	limiter, err := redisrl.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	free, _ := redisrl.ParseLimits("100/hour")
	pro, _ := redisrl.ParseLimits("1000/hour; 10000/day")
	byPlan := func(r *http.Request) ([]redisrl.Spec, error) {
		if r.Header.Get("X-Plan") == "pro" { // in real life: the plan of the authenticated caller
			return pro, nil
		}
		return free, nil
	}
	mw, err := rlhttp.New(limiter, []rlhttp.Rule{{
		Path:       "/api",
		CostHeader: "X-Units", // 2^64 or more: 413 without a Redis call
		Limits: []rlhttp.Limit{
			{Name: "plan", PerRequest: byPlan, Key: rlhttp.Header("X-API-Key")},
			{Name: "jobs", Spec: redisrl.MustLease(4, 30*time.Second), Key: rlhttp.Header("X-API-Key")},
		},
		Missing: rlhttp.MissingDeny, // 401 without an API key
	}}, rlhttp.WithExemptPaths("/health", "/static/*"))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/complete", func(w http.ResponseWriter, r *http.Request) {
		rlhttp.ReportCost(r.Context(), 1200) // what the request really cost, before the status
		fmt.Fprintln(w, "done")
	})
	_ = http.ListenAndServe("127.0.0.1:8080", mw.Handler(mux))
}

func ExampleMatchPath() {
	for _, c := range [][2]string{
		{"/health", "/health"},                 // exact
		{"/internal/", "/internal"},            // a prefix, and the bare path
		{"/internal/", "/internal/x"},          //
		{"/users/*/avatar", "/users/7/avatar"}, // a glob: '*' crosses '/'
		{"/v[0-9]/*", "/vx/ping"},              // [set]
	} {
		fmt.Println(c[0], c[1], rlhttp.MatchPath(c[0], c[1]))
	}
	// Output:
	// /health /health true
	// /internal/ /internal true
	// /internal/ /internal/x true
	// /users/*/avatar /users/7/avatar true
	// /v[0-9]/* /vx/ping false
}

func ExampleHeaderCost() {
	for _, v := range []string{"", "0", "7", "lots", "18446744073709551616"} {
		cost, never := rlhttp.HeaderCost([]string{v})
		fmt.Printf("%q: %d %v\n", v, cost, never)
	}
	// Output:
	// "": 1 false
	// "0": 1 false
	// "7": 7 false
	// "lots": 1 false
	// "18446744073709551616": 0 true
}
