package redisrl_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

// exampleClient is a go-redis client of the test run's server with the module (the
// examples run against a real one: see harness_test.go).
func exampleClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: redisrl.ExampleAddr()})
}

func Example() {
	ctx := context.Background()
	limiter, err := redisrl.New(exampleClient(), redisrl.WithPrefix("example:"))
	if err != nil {
		panic(err)
	}
	perUser := redisrl.MustGCRA(3, 1, 10*time.Second) // 3 at once, then one per 10 s
	for range 4 {
		d, err := limiter.Check(ctx, "user:42", perUser)
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.Remaining, d.Source)
	}
	// Output:
	// true 2 module
	// true 1 module
	// true 0 module
	// false 0 module
}

func ExampleClient_CheckAll() {
	ctx := context.Background()
	limiter, _ := redisrl.New(exampleClient(), redisrl.WithPrefix("example-all:"))
	rpm := redisrl.MustWindow(600, time.Minute, redisrl.Sliding)
	tpm := redisrl.MustWindow(90_000, time.Minute, redisrl.Sliding)
	key := func(part string) string { k, _ := redisrl.Tag("tenant42", part); return k }
	d, err := limiter.CheckAll(ctx, []redisrl.Entry{
		redisrl.NewEntry(key("rpm"), rpm),
		redisrl.NewEntry(key("tpm"), tpm).Cost(1200), // this request's tokens
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Allowed, d.PerKey[0].Remaining, d.PerKey[1].Remaining)
	// Output: true 599 88800
}

func ExampleClient_Allow() {
	ctx := context.Background()
	limiter, _ := redisrl.New(exampleClient(), redisrl.WithPrefix("example-allow:"))
	res, err := limiter.Allow(ctx, "project:123", redisrl.PerSecond(10))
	if err != nil {
		panic(err)
	}
	fmt.Println("allowed", res.Allowed, "remaining", res.Remaining)
	granted, _, _ := limiter.AllowAtMost(ctx, "project:123", redisrl.PerSecond(10), 20)
	fmt.Println("granted", granted)
	// Output:
	// allowed true remaining 9
	// granted 9
}

func ExampleClient_Wait() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	limiter, _ := redisrl.New(exampleClient(), redisrl.WithPrefix("example-wait:"))
	outbound := redisrl.MustGCRA(1, 20, time.Second) // one at once, then one per 50 ms
	start := time.Now()
	for range 3 {
		if err := limiter.Wait(ctx, "partner-api", outbound); err != nil {
			panic(err)
		}
	}
	fmt.Println(time.Since(start) >= 100*time.Millisecond)
	// Output: true
}

func ExampleClient_Acquire() {
	ctx := context.Background()
	limiter, _ := redisrl.New(exampleClient(), redisrl.WithPrefix("example-lease:"))
	exports := redisrl.MustLease(1, 30*time.Second) // one export per customer at once
	guard, err := limiter.Acquire(ctx, "exports:acme", exports)
	if err != nil {
		panic(err)
	}
	_, err = limiter.Acquire(ctx, "exports:acme", exports)
	fmt.Println(errors.Is(err, redisrl.ErrRateLimited))
	if _, err := guard.Release(ctx); err != nil {
		panic(err) // errors.Is(err, redisrl.ErrLeaseLost): the work ran without its slot
	}
	again, err := limiter.Acquire(ctx, "exports:acme", exports)
	fmt.Println(err == nil)
	_, _ = again.Release(ctx)
	// Output:
	// true
	// true
}

func ExampleNewGCRA() {
	_, err := redisrl.NewGCRA(0, 1, time.Second)
	fmt.Println(err)
	g, _ := redisrl.NewGCRA(20, 10, time.Second)
	fmt.Println(g.EmissionInterval())
	// Output:
	// burst must be a positive integer
	// 100ms
}

func ExampleParseLimits() {
	limits, err := redisrl.ParseLimits("20/minute; 200 per hour")
	fmt.Println(limits, err)
	_, err = redisrl.ParseLimits("10/fortnight")
	fmt.Println(err)
	// Output:
	// [Window(limit=20, window=1m0s, SLIDING) Window(limit=200, window=1h0m0s, SLIDING)] <nil>
	// limit '10/fortnight': unknown unit 'fortnight' (s, sec, second(s), m, min, minute(s), h, hr, hour(s), d, day(s))
}

func ExampleDecision_Headers() {
	d := redisrl.Decision{
		Limit:      10,
		RetryAfter: 1500 * time.Millisecond,
		ResetAfter: 10 * time.Second,
		Spec:       redisrl.MustGCRA(10, 1, time.Second),
	}
	h := d.Headers("api")
	fmt.Println(h.Get("Retry-After"))
	fmt.Println(h.Get("RateLimit-Policy"))
	fmt.Println(h.Get("RateLimit"))
	// Output:
	// 2
	// "api";q=10;w=10
	// "api";r=0;t=10
}
