package redisrl

// The fast path's figures (make bench will print them as the Python and Rust packages'
// tables): decisions per second of one process and Redis calls per decision, on the module,
// for an admitted key and for a key held denied, with and without the deny cache.
//
//	go test -run '^$' -bench . -benchtime 2s

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

func benchCheck(b *testing.B, module bool, denied bool, opts ...Option) {
	s := testserver.Shared(b, module)
	c, err := New(s.RDB(b), append([]Option{WithPrefix(testserver.UniquePrefix(b))}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	limit := MustGCRA(1<<40, 1<<30, time.Second) // never denies
	if denied {
		limit = MustGCRA(1, 1, time.Hour) // denies after the first
		if _, err := c.Check(ctx, "k", limit); err != nil {
			b.Fatal(err)
		}
	}
	before, _ := c.Counters().Get("redis_calls")
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Check(ctx, "k", limit); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	after, _ := c.Counters().Get("redis_calls")
	b.ReportMetric(float64(after-before)/float64(b.N), "calls/op")
}

func BenchmarkCheck(b *testing.B) {
	for _, module := range []bool{true, false} {
		mode := "fallback"
		if module {
			mode = "module"
		}
		b.Run(mode+"/admitted", func(b *testing.B) { benchCheck(b, module, false) })
		b.Run(mode+"/denied/deny-cache", func(b *testing.B) { benchCheck(b, module, true) })
		b.Run(mode+"/denied/no-deny-cache", func(b *testing.B) { benchCheck(b, module, true, WithDenyCache(false)) })
	}
}

func BenchmarkCheckAllTwoLimits(b *testing.B) {
	s := testserver.Shared(b, true)
	c, err := New(s.RDB(b), WithPrefix(testserver.UniquePrefix(b)))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	g := MustGCRA(1<<40, 1<<30, time.Second)
	w := MustWindow(1<<40, time.Minute, Sliding)
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			tag := strconv.Itoa(i % 64)
			if _, err := c.CheckAll(ctx, []Entry{NewEntry("{"+tag+"}:a", g), NewEntry("{"+tag+"}:b", w)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
