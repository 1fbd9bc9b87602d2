package redisrl

// Two OS processes, each with its own client and eight goroutines, hammer one key: together
// they admit exactly the limit, for every algorithm, on the module and on the fallback (the
// fleet-wide guarantee the package exists for).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// exactLimits are long enough that nothing refills during the test (FIXED: a ten-year
// window aligned to the epoch).
var exactLimits = map[string]Spec{
	"gcra":    MustGCRA(50, 1, time.Hour),
	"fixed":   MustWindow(50, MaxSeconds*time.Second, Fixed),
	"sliding": MustWindow(50, time.Hour, Sliding),
	"log":     MustWindow(50, time.Hour, Log),
}

// TestHelperHammer is the child process: RL_HAMMER_ADDR, RL_HAMMER_KEY, RL_HAMMER_LIMIT (and
// RL_HAMMER_BATCH: WithBatch of that many); it prints "admitted N".
func TestHelperHammer(t *testing.T) {
	addr := os.Getenv("RL_HAMMER_ADDR")
	if addr == "" {
		t.Skip("the child process of TestTwoProcessesOnOneKeyAdmitExactlyTheLimit")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	opts := []Option{WithDenyCache(false)}
	if k, err := strconv.ParseUint(os.Getenv("RL_HAMMER_BATCH"), 10, 64); err == nil {
		opts = append(opts, WithBatch(k), WithBatchHold(time.Second))
	}
	c := ok(New(rdb, opts...))
	limit := exactLimits[os.Getenv("RL_HAMMER_LIMIT")]
	if _, err := c.ResolvedMode(context.Background()); err != nil {
		t.Fatal(err)
	}
	if at, err := strconv.ParseInt(os.Getenv("RL_HAMMER_AT"), 10, 64); err == nil {
		time.Sleep(time.Until(time.Unix(0, at))) // both children start together
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				d, err := c.Check(context.Background(), os.Getenv("RL_HAMMER_KEY"), limit)
				if err != nil || d.Degraded {
					fmt.Println("error", err, d.Degraded)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// Batching: what this process still holds goes back before it reports.
	if _, err := c.Close(context.Background()); err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Printf("admitted %d\n", admitted.Load())
}

func TestTwoProcessesOnOneKeyAdmitExactlyTheLimit(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			s := testserver.Shared(t, k.module)
			// The library is loaded once here, so the children find it.
			ok(ok(New(s.RDB(t))).ResolvedMode(ctxT(t)))
			for name := range exactLimits {
				key := testserver.UniquePrefix(t) + name
				var outs []*strings.Builder
				var cmds []*exec.Cmd
				at := strconv.FormatInt(time.Now().Add(500*time.Millisecond).UnixNano(), 10)
				for range 2 {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperHammer$", "-test.count=1")
					cmd.Env = append(os.Environ(), "RL_HAMMER_ADDR="+s.Addr(), "RL_HAMMER_KEY="+key, "RL_HAMMER_LIMIT="+name, "RL_HAMMER_AT="+at)
					out := &strings.Builder{}
					cmd.Stdout, cmd.Stderr = out, out
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					cmds, outs = append(cmds, cmd), append(outs, out)
				}
				total := 0
				for i, cmd := range cmds {
					if err := cmd.Wait(); err != nil {
						t.Fatalf("%s: child %d: %v\n%s", name, i, err, outs[i])
					}
					var n int
					for _, line := range strings.Split(outs[i].String(), "\n") {
						if v, found := strings.CutPrefix(line, "admitted "); found {
							n, _ = strconv.Atoi(v)
						}
					}
					if n == 0 {
						t.Logf("%s: child %d admitted nothing (the other was faster):\n%s", name, i, outs[i])
					}
					total += n
				}
				if total != 50 {
					t.Errorf("%s: two processes admitted %d, want exactly 50", name, total)
				}
			}
		})
	}
}
