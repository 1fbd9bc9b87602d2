// Package redisrl is fleet-wide rate limiting in Redis for Go services: a client for the
// redis-rl module's commands (RL.GCRA, RL.WINDOW, RL.ALL, RL.REFUND, RL.LEASE, RL.RELEASE),
// with the project's Lua library as the fallback where the module cannot be loaded, on
// go-redis (redis.UniversalClient: one server, a failover client, or a Cluster).
//
// An in-process limiter (golang.org/x/time/rate) behind a load balancer with N replicas
// gives every client N times its quota. Here the state lives in Redis, where every replica
// decides against the same counter, in one atomic command per decision.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	limiter, err := redisrl.New(rdb, redisrl.WithFailurePolicy(redisrl.FailClosed))
//	perUser := redisrl.MustGCRA(10, 5, time.Second) // 10 at once, then 5 per second
//	d, err := limiter.Check(ctx, "user:42", perUser)
//	if !d.Allowed {
//		status := http.StatusTooManyRequests
//		if d.Never {
//			status = http.StatusRequestEntityTooLarge
//		}
//		// d.Headers("api"): Retry-After, RateLimit-Policy, RateLimit
//	}
//
// The package implements the project's client contract, docs/clients.md in the
// repository, in Go's idioms: the same limits (validated when built, with the module's
// messages), decisions, key layout, failure policy and deny cache as the Python
// (clients/python) and Rust (clients/rust) packages, so services in the three languages
// share keys. Every call takes a context.Context and honours its deadline and cancellation.
//
// The Lua fallback is embedded (LuaLibrary) from the repository's one copy,
// scripts/lua/redis_rl.lua, through a copy that `go generate` writes into this directory.
package redisrl
