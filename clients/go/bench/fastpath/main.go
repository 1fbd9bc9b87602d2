// Command fastpath is the Go package's part of make bench: the fast-path table of the Python
// and Rust packages (clients/python/bench/fastpath.py, clients/rust/benches/fastpath.rs), and
// a side-by-side with go-redis/redis_rate and with the GCRA script shape of
// bench/lua/gcra.lua (EVALSHA through go-redis).
//
//	cd clients/go/bench && go run ./fastpath [-procs 4] [-seconds 3] [-batch 10] [-samples 20000]
//
// It starts its own redis-server with the module ($RL_MODULE, default the repository's
// target/release/libredis_rl.so; $REDIS_SERVER names the binary) on a free loopback port.
//
// Part 1: N processes (this program again, with -worker) each run one redisrl.Client in a
// tight loop (one decision at a time) on one GCRA key far above its limit, three ways: no
// fast path, the deny cache, the deny cache with batching. Per configuration: requests
// admitted against what the limit allows over the run (burst + rate × elapsed), Redis calls
// per admitted request, decisions per second per process.
//
// Part 2, the same for redis_rate, the gcra.lua script and redisrl: Redis calls per decision,
// the p50/p99 time of one admitted decision (one goroutine, loopback) and what it adds to a
// PING's, and two processes × 8 goroutines on one key that does not refill during the run
// (admitted against the limit of 50), and on one that does (against burst + rate × elapsed).
//
// The figures are printed, never asserted, except that the program exits 1 when a
// configuration of redisrl admitted more than the limit allows.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	redisrl "github.com/redis-rl/redis-rl/clients/go"
	"github.com/redis/go-redis/v9"
)

// (burst, rate per second): a low limit, a higher one, and one the processes cannot reach.
var scenarios = [][2]uint64{{20, 100}, {200, 2000}, {1000, 100_000}}

// callCounter counts the commands a go-redis client sends (pipelines as one round trip).
type callCounter struct{ n atomic.Uint64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0) // clients/go/bench/fastpath/main.go
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
}

// decider is one way of deciding one request on key: admitted, or an error.
type decider func(ctx context.Context, key string) (bool, error)

// newDecider builds kind on addr for a GCRA of burst, rate per period; calls counts its
// round trips. Kinds: rl-none, rl-deny, rl-batch (redisrl: no fast path, the deny cache, the
// deny cache and batching), rl-ctx (no fast path, go-redis's ContextTimeoutEnabled), rl-fallback (redisrl on the Lua library, no fast path),
// redis_rate, lua (bench/lua/gcra.lua by EVALSHA), ping.
func newDecider(kind, addr string, burst, rate uint64, period time.Duration, batch uint64) (decider, *callCounter, *redisrl.Client, error) {
	// rl-ctx: go-redis honours context deadlines itself, so the client waits on the call
	// directly instead of beside it in a goroutine (see WithTimeout).
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 16, ContextTimeoutEnabled: kind == "rl-ctx"})
	calls := &callCounter{}
	rdb.AddHook(calls)
	ctx := context.Background()
	switch kind {
	case "redis_rate":
		lim := redis_rate.NewLimiter(rdb)
		l := redis_rate.Limit{Rate: int(rate), Burst: int(burst), Period: period}
		return func(ctx context.Context, key string) (bool, error) {
			r, err := lim.Allow(ctx, key, l)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}, calls, nil, nil
	case "lua":
		text, err := os.ReadFile(filepath.Join(repoRoot(), "bench", "lua", "gcra.lua"))
		if err != nil {
			return nil, nil, nil, err
		}
		script := redis.NewScript(string(text))
		if err := script.Load(ctx, rdb).Err(); err != nil {
			return nil, nil, nil, err
		}
		secs := strconv.FormatFloat(period.Seconds(), 'f', -1, 64)
		return func(ctx context.Context, key string) (bool, error) {
			v, err := script.EvalSha(ctx, rdb, []string{key}, burst, rate, secs).Int64Slice()
			if err != nil {
				return false, err
			}
			return v[0] == 1, nil
		}, calls, nil, nil
	case "ping":
		return func(ctx context.Context, key string) (bool, error) {
			return true, rdb.Ping(ctx).Err()
		}, calls, nil, nil
	}
	opts := []redisrl.Option{redisrl.WithTimeout(2 * time.Second), redisrl.WithFailurePolicy(redisrl.FailError)}
	switch kind {
	case "rl-none", "rl-ctx":
		opts = append(opts, redisrl.WithDenyCache(false))
	case "rl-fallback":
		opts = append(opts, redisrl.WithDenyCache(false), redisrl.WithMode(redisrl.ModeFallback))
	case "rl-deny":
	case "rl-batch":
		opts = append(opts, redisrl.WithBatch(batch), redisrl.WithBatchHold(100*time.Millisecond))
	default:
		return nil, nil, nil, fmt.Errorf("unknown kind %q", kind)
	}
	c, err := redisrl.New(rdb, opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	g, err := redisrl.NewGCRA(burst, rate, period)
	if err != nil {
		return nil, nil, nil, err
	}
	return func(ctx context.Context, key string) (bool, error) {
		d, err := c.Check(ctx, key, g)
		return d.Allowed, err
	}, calls, c, nil
}

// figures are one worker's, one line on its stdout.
type figures struct {
	t0, t1                                                              float64
	decisions, admitted, calls, deniedLocally, allowedLocally, refunded uint64
}

func epoch() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// worker: kind addr key burst rate periodMs batch startAtMs seconds goroutines attempts.
// attempts > 0: each goroutine makes that many decisions; else it runs for seconds.
func worker(a []string) error {
	if len(a) != 11 {
		return fmt.Errorf("worker arguments: %q", a)
	}
	n := func(i int) uint64 { v, _ := strconv.ParseUint(a[i], 10, 64); return v }
	kind, addr, key := a[0], a[1], a[2]
	seconds, _ := strconv.ParseFloat(a[8], 64)
	decide, calls, c, err := newDecider(kind, addr, n(3), n(4), time.Duration(n(5))*time.Millisecond, n(6))
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := decide(ctx, "warm-up:"+key); err != nil { // connect and detect before the start
		return err
	}
	calls.n.Store(0)
	var before map[string]uint64
	if c != nil {
		before = c.Counters().Snapshot()
	}
	time.Sleep(time.Until(time.UnixMilli(int64(n(7)))))
	t0 := epoch()
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var decisions, admitted atomic.Uint64
	var wg sync.WaitGroup
	var failed atomic.Value
	attempts := n(10)
	for range n(9) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); ; i++ {
				if attempts > 0 && i >= attempts || attempts == 0 && !time.Now().Before(end) {
					return
				}
				ok, err := decide(ctx, key)
				if err != nil {
					failed.Store(err)
					return
				}
				decisions.Add(1)
				if ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t1 := epoch()
	if err, _ := failed.Load().(error); err != nil {
		return err
	}
	f := figures{t0: t0, t1: t1, decisions: decisions.Load(), admitted: admitted.Load()}
	if c != nil {
		if _, err := c.Close(ctx); err != nil { // refunds held batch units
			return err
		}
		after := c.Counters().Snapshot()
		f.deniedLocally = after["denied_locally"] - before["denied_locally"]
		f.allowedLocally = after["allowed_locally"] - before["allowed_locally"]
		f.refunded = after["refunded"] - before["refunded"]
	}
	f.calls = calls.n.Load()
	fmt.Println(f.t0, f.t1, f.decisions, f.admitted, f.calls, f.deniedLocally, f.allowedLocally, f.refunded)
	return nil
}

// run starts procs workers of kind on a fresh key and sums their figures.
func run(addr, kind string, procs int, burst, rate uint64, period time.Duration, batch uint64, seconds float64, goroutines, attempts int) ([]figures, error) {
	key := fmt.Sprintf("bench:%d:%d", os.Getpid(), keyN.Add(1))
	startAt := time.Now().Add(time.Second).UnixMilli()
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds*float64(time.Second))+60*time.Second)
	defer cancel()
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for range procs {
		cmd := exec.CommandContext(ctx, exe, "-worker", kind, addr, key, u(burst), u(rate), u(uint64(period.Milliseconds())), u(batch),
			strconv.FormatInt(startAt, 10), strconv.FormatFloat(seconds, 'f', -1, 64), strconv.Itoa(goroutines), strconv.Itoa(attempts))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	var fs []figures
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return nil, fmt.Errorf("%s worker %d: %v", kind, i, err)
		}
		var f figures
		if _, err := fmt.Sscan(outs[i].String(), &f.t0, &f.t1, &f.decisions, &f.admitted, &f.calls, &f.deniedLocally, &f.allowedLocally, &f.refunded); err != nil {
			return nil, fmt.Errorf("%s worker %d: %q: %v", kind, i, outs[i].String(), err)
		}
		fs = append(fs, f)
	}
	return fs, nil
}

var keyN atomic.Uint64

func u(n uint64) string { return strconv.FormatUint(n, 10) }

func thousands(x float64) string {
	s := strconv.FormatFloat(x, 'f', 0, 64)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

type totals struct {
	t0, t1                                                   float64
	admitted, calls, deniedLocally, allowedLocally, refunded uint64
	perProc                                                  float64
}

func sum(fs []figures) totals {
	t := totals{t0: fs[0].t0, t1: fs[0].t1}
	for _, f := range fs {
		t.t0, t.t1 = min(t.t0, f.t0), max(t.t1, f.t1)
		t.admitted += f.admitted
		t.calls += f.calls
		t.deniedLocally += f.deniedLocally
		t.allowedLocally += f.allowedLocally
		t.refunded += f.refunded
		t.perProc += float64(f.decisions) / (f.t1 - f.t0) / float64(len(fs))
	}
	return t
}

func startServer() (addr string, stop func(), err error) {
	module := os.Getenv("RL_MODULE")
	if module == "" {
		module = filepath.Join(repoRoot(), "target", "release", "libredis_rl.so")
	}
	if _, err := os.Stat(module); err != nil {
		return "", nil, fmt.Errorf("no module (%v): cargo build --release, or set RL_MODULE", err)
	}
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "rl-bench-go-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", "redis.log", "--loadmodule", module)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	addr = "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := rdb.Info(ctx, "server").Result()
		cancel()
		if err == nil && strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server did not start on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-worker" {
		if err := worker(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(2)
		}
		return
	}
	procs := flag.Int("procs", 4, "processes on one key (part 1)")
	seconds := flag.Float64("seconds", 3, "seconds per configuration")
	batch := flag.Uint64("batch", 10, "batch size of the batching configuration")
	samples := flag.Int("samples", 20000, "decisions timed per row of the latency table")
	flag.Parse()
	if err := mainErr(*procs, *seconds, *batch, *samples); err != nil {
		fmt.Fprintln(os.Stderr, "fastpath:", err)
		os.Exit(1)
	}
}

func mainErr(procs int, seconds float64, batch uint64, samples int) error {
	addr, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	over := false
	fmt.Printf("Go package (clients/go): %d processes on one GCRA key for %g s each configuration, each process one "+
		"redisrl.Client, one goroutine in a tight loop (far above the limit); redis-server with the module on loopback; "+
		"%d CPUs shared by everything.\n\n", procs, seconds, runtime.NumCPU())
	fmt.Println("| limit | configuration | admitted / limit allows | Redis calls per admitted | decisions/s per process | local denials | local admissions | refunded |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	names := map[string]string{"rl-none": "no fast path", "rl-deny": "deny cache", "rl-batch": fmt.Sprintf("deny cache + batch %d", batch)}
	for _, sc := range scenarios {
		for _, kind := range []string{"rl-none", "rl-deny", "rl-batch"} {
			fs, err := run(addr, kind, procs, sc[0], sc[1], time.Second, batch, seconds, 1, 0)
			if err != nil {
				return err
			}
			t := sum(fs)
			bound := sc[0] + uint64((t.t1-t.t0)*float64(sc[1])) + 1
			over = over || t.admitted > bound
			perAdmitted := "∞"
			if t.admitted > 0 {
				perAdmitted = strconv.FormatFloat(float64(t.calls)/float64(t.admitted), 'f', 2, 64)
			}
			fmt.Printf("| burst %d, %d/s | %s | %d / %d | %s | %s | %s | %s | %d |\n", sc[0], sc[1], names[kind], t.admitted, bound,
				perAdmitted, thousands(t.perProc), thousands(float64(t.deniedLocally)), thousands(float64(t.allowedLocally)), t.refunded)
		}
	}

	fmt.Printf("\nSide by side (one process, one goroutine, %d admitted decisions timed per row; a GCRA that "+
		"admits everything (10^9 at once, 10^6/s); \"added\" is the p50 beyond a PING's):\n\n", samples)
	fmt.Println("| limiter | Redis calls per decision | p50 | p99 | added to a PING (p50) |")
	fmt.Println("|---|---|---|---|---|")
	side := []struct{ kind, name string }{
		{"ping", "PING (the round trip alone)"},
		{"redis_rate", "go-redis/redis_rate v10 Allow (GCRA in Lua, EVALSHA)"},
		{"lua", "bench/lua/gcra.lua by EVALSHA (the usual script)"},
		{"rl-none", "redisrl Check, module"},
		{"rl-ctx", "redisrl Check, module, go-redis ContextTimeoutEnabled"},
		{"rl-fallback", "redisrl Check, Lua library (FCALL)"},
		{"rl-batch", fmt.Sprintf("redisrl Check, module, batch %d", batch)},
	}
	// The rows are timed in turns, a tenth of the samples each, so that what else the machine
	// does at one moment falls on every row alike; the first turn warms up and is not kept.
	type row struct {
		decide decider
		calls  *callCounter
		c      *redisrl.Client
		ds     []time.Duration
	}
	rows := make([]row, len(side))
	for i, s := range side {
		decide, calls, c, err := newDecider(s.kind, addr, 1_000_000_000, 1_000_000, time.Second, batch)
		if err != nil {
			return err
		}
		rows[i] = row{decide: decide, calls: calls, c: c}
	}
	ctx := context.Background()
	for turn := range 11 {
		for i := range rows {
			if turn == 1 {
				rows[i].calls.n.Store(0)
			}
			for range max(1, samples/10) {
				t := time.Now()
				ok, err := rows[i].decide(ctx, "lat:"+side[i].kind)
				if err != nil {
					return fmt.Errorf("%s: %v", side[i].kind, err)
				}
				if !ok {
					return fmt.Errorf("%s: denied", side[i].kind)
				}
				if turn > 0 {
					rows[i].ds = append(rows[i].ds, time.Since(t))
				}
			}
		}
	}
	var ping time.Duration
	for i, s := range side {
		r := rows[i]
		slices.Sort(r.ds)
		p50, p99 := r.ds[len(r.ds)/2], r.ds[len(r.ds)*99/100]
		per := float64(r.calls.n.Load()) / float64(len(r.ds))
		if r.c != nil {
			_, _ = r.c.Close(ctx)
		}
		added := "—"
		if s.kind == "ping" {
			ping = p50
		} else {
			added = (p50 - ping).Round(100 * time.Nanosecond).String()
		}
		fmt.Printf("| %s | %.2f | %v | %v | %s |\n", s.name, per, p50.Round(100*time.Nanosecond), p99.Round(100*time.Nanosecond), added)
	}

	fmt.Println("\nExactness: two processes × 8 goroutines on one key (the second and third columns: " +
		"admitted against what the limit allows):")
	fmt.Println()
	fmt.Println("| limiter | 50 per hour, 320 attempts each process (no refill) | burst 20, 100/s, for the run's time |")
	fmt.Println("|---|---|---|")
	for _, s := range side[1:] {
		fs, err := run(addr, s.kind, 2, 50, 50, time.Hour, batch, 0, 8, 40)
		if err != nil {
			return err
		}
		a := sum(fs)
		fs, err = run(addr, s.kind, 2, 20, 100, time.Second, batch, seconds, 8, 0)
		if err != nil {
			return err
		}
		b := sum(fs)
		bound := 20 + uint64((b.t1-b.t0)*100) + 1
		if strings.HasPrefix(s.kind, "rl-") {
			over = over || a.admitted > 50 || b.admitted > bound
		}
		fmt.Printf("| %s | %d / 50 | %d / %d |\n", s.name, a.admitted, b.admitted, bound)
	}
	if over {
		return fmt.Errorf("FAILED: a redisrl configuration admitted more than the limit allows")
	}
	return nil
}
