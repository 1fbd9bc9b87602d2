package redisrl

// The real-server harness: redis-server on a free loopback port, in a temporary directory,
// with the module loaded or without it, stopped by PID; every wait has a deadline.
//
// REDIS_SERVER names the server binary (default: redis-server on PATH, else
// /usr/bin/redis-server); RL_MODULE the module (default: target/release/libredis_rl.so of
// the repository, built by `cargo build --release`).

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fataler is what the harness needs of a testing.TB (examples pass a panicking one).
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

type panicker struct{}

func (panicker) Helper()                   {}
func (panicker) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (panicker) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

// exampleAddr is the address of the shared server with the module, for the Example
// functions (which get no testing.T).
func exampleAddr() string { return shared(panicker{}, true).addr() }

type server struct {
	started bool
	port    int
	dir     string
	module  bool
	cmd     *exec.Cmd
	args    []string
	env     []string // more environment (KEY=value) for the server's process
	exited  chan struct{}
}

func serverBinary() string {
	if b := os.Getenv("REDIS_SERVER"); b != "" {
		return b
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

func modulePath(t fataler) string {
	if m := os.Getenv("RL_MODULE"); m != "" {
		return m
	}
	p, err := filepath.Abs("../../target/release/libredis_rl.so")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the module is not built (%v): run `cargo build --release` at the repository's root, or set RL_MODULE", err)
	}
	return p
}

func freePort(t fataler) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServer starts redis-server, with the module when module is true, and stops it when
// the test ends.
func startServer(t testing.TB, module bool, extra ...string) *server {
	t.Helper()
	return startServerEnv(t, nil, module, extra...)
}

// startServerEnv is startServer with more environment for the server's process.
func startServerEnv(t testing.TB, env []string, module bool, extra ...string) *server {
	t.Helper()
	s := &server{port: freePort(t), dir: t.TempDir(), module: module, env: env}
	s.args = []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--enable-debug-command", "yes", "--enable-module-command", "yes"}
	if module {
		s.args = append(s.args, "--loadmodule", modulePath(t))
	}
	s.args = append(s.args, extra...)
	s.start(t)
	t.Cleanup(s.stop)
	return s
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start starts the server and waits until it answers. A first start whose port another
// process took in the meantime ("Address already in use") is retried on a fresh port; a
// restart keeps its port (its clients know it).
func (s *server) start(t fataler) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		if s.tryStart(t) {
			s.started = true
			return
		}
		if !s.started && attempt < 2 && strings.Contains(s.log(), "Address already in use") {
			s.port = freePort(t)
			_ = os.Remove(filepath.Join(s.dir, "redis.log"))
			continue
		}
		t.Fatalf("redis-server exited at start-up: %s", s.log())
	}
}

// tryStart starts the server; false when it exited before answering.
func (s *server) tryStart(t fataler) bool {
	t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)
	s.cmd = exec.Command(serverBinary(), args...)
	if len(s.env) > 0 {
		s.cmd.Env = append(os.Environ(), s.env...)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", serverBinary(), err)
	}
	s.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(s.cmd, s.exited)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.addr(), 200*time.Millisecond)
		if err == nil {
			// The server that answers must be ours (another process may hold the port).
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			_, _ = conn.Write([]byte("INFO server\r\n"))
			buf := make([]byte, 8192)
			n, _ := io.ReadAtLeast(conn, buf, 1)
			for n < len(buf) && !strings.Contains(string(buf[:n]), "process_id:") {
				m, err := conn.Read(buf[n:])
				if err != nil {
					break
				}
				n += m
			}
			conn.Close()
			if strings.Contains(string(buf[:n]), "process_id:"+strconv.Itoa(s.cmd.Process.Pid)+"\r\n") {
				return true
			}
		}
		select {
		case <-s.exited:
			s.cmd = nil
			return false
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			t.Fatalf("redis-server did not answer within 10 s: %s", s.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// stop kills the server by its PID and waits (with a deadline) until it has exited.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server must be able to die
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
	s.cmd = nil
}

// restart starts the server again on the same port (empty: it saves nothing).
func (s *server) restart(t testing.TB) {
	t.Helper()
	s.stop()
	s.start(t)
}

// pause stops the server's process (SIGSTOP): connections stay open, nothing answers.
func (s *server) pause(t testing.TB) {
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

func (s *server) resume(t testing.TB) {
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// rdb is a go-redis client of the server, closed when the test ends.
func (s *server) rdb(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// do runs a command on the server (outside any limiter) and fails the test on an error.
func (s *server) do(t testing.TB, args ...any) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.rdb(t).Do(ctx, args...).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

// The shared servers of the behaviour suite (one with the module, one without), started
// once and stopped by TestMain.
var (
	sharedMu      sync.Mutex
	sharedServers = map[bool]*server{}
	sharedStop    []func()
	prefixCounter atomic.Uint64
)

func shared(t fataler, module bool) *server {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s, ok := sharedServers[module]; ok {
		return s
	}
	// Started outside any one test's cleanup: TestMain stops it.
	s := &server{port: freePort(t), module: module}
	dir, err := os.MkdirTemp("", "redisrl-go-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	s.args = []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--enable-debug-command", "yes", "--enable-module-command", "yes"}
	if module {
		s.args = append(s.args, "--loadmodule", modulePath(t))
	}
	s.start(t)
	sharedServers[module] = s
	sharedStop = append(sharedStop, func() { s.stop(); _ = os.RemoveAll(dir) })
	return s
}

func TestMain(m *testing.M) {
	code := m.Run()
	sharedMu.Lock()
	for _, stop := range sharedStop {
		stop()
	}
	sharedMu.Unlock()
	os.Exit(code)
}

// uniquePrefix is a key prefix no other test uses.
func uniquePrefix(t testing.TB) string {
	name := strings.NewReplacer("/", ".", " ", "_", "{", "(", "}", ")").Replace(t.Name())
	return fmt.Sprintf("t%d.%s:", prefixCounter.Add(1), name)
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
			s := shared(t, k.module)
			c, err := New(s.rdb(t), append([]Option{WithPrefix(uniquePrefix(t))}, opts...)...)
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
