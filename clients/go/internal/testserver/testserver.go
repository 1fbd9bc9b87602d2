// Package testserver is the real-server harness of the clients/go tests (the redisrl package,
// rlhttp and rlgin): redis-server on a free loopback port, in a temporary directory, with the
// redis-rl module loaded or without it, stopped by PID; every wait has a deadline. Servers can
// be shared by a package's tests (Shared, stopped by StopShared in its TestMain), stopped and
// started again on their port, paused (SIGSTOP); Sentinel (StartSentinel) and Cluster nodes
// (ClusterNode, StartCluster); key prefixes no other test uses (UniquePrefix).
//
// REDIS_SERVER names the server binary (default: redis-server on PATH, else
// /usr/bin/redis-server); RL_MODULE the module (default: the repository's
// target/release/libredis_rl.so, built by `cargo build --release`). The server may be Redis 6.2
// (scripts/test-compat.sh runs the scripts-mode tests there): it has no Functions, no
// --enable-*-command switches and no --cluster-port; the harness leaves those out there
// (Major), and tests that need Functions skip with the reason (NeedFunctions).
package testserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fataler is what the harness needs of a testing.TB (examples pass a Panicker).
type Fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Panicker is a Fataler that panics: for the Example functions, which get no testing.T.
type Panicker struct{}

func (Panicker) Helper()                   {}
func (Panicker) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (Panicker) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

// Server is a redis-server (or redis-sentinel) of a test.
type Server struct {
	Port   int
	Dir    string
	Module bool
	// Args are the server's arguments after --port and --logfile (the module's --loadmodule
	// included).
	Args []string
	// Env is more environment (KEY=value) for the server's process.
	Env []string

	conf    string // a configuration file, the first argument (Sentinel's)
	started bool
	cmd     *exec.Cmd
	exited  chan struct{}
	// clusterBus: a cluster node without --cluster-port (Redis 6.x), whose bus is port+10000.
	clusterBus bool
}

// Binary is the redis-server binary.
func Binary() string {
	if b := os.Getenv("REDIS_SERVER"); b != "" {
		return b
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

var (
	majorOnce sync.Once
	major     int
	majorErr  error
)

// Major is the major version of the server binary (Redis 6, 7; Valkey 8, 9), read once from
// its --version line ("... v=6.2.14 ...").
func Major(t Fataler) int {
	t.Helper()
	majorOnce.Do(func() {
		out, err := exec.Command(Binary(), "--version").Output()
		if err != nil {
			majorErr = fmt.Errorf("%s --version: %v", Binary(), err)
			return
		}
		for _, word := range strings.Fields(string(out)) {
			if v, found := strings.CutPrefix(word, "v="); found {
				major, majorErr = strconv.Atoi(strings.SplitN(v, ".", 2)[0])
				return
			}
		}
		majorErr = fmt.Errorf("no version in %q", out)
	})
	if majorErr != nil {
		t.Fatalf("the server's version: %v", majorErr)
	}
	return major
}

// NeedFunctions skips a test that needs the Functions library (FUNCTION, FCALL), which Redis
// 6.x does not have.
func NeedFunctions(t testing.TB) {
	t.Helper()
	if Major(t) < 7 {
		t.Skipf("Redis %d.x has no Functions (FUNCTION, FCALL): the fallback runs as scripts there", Major(t))
	}
}

// notOn6 are the commands a Redis 6.x server does not have: it refuses to rename them or name
// them in ACL rules, and lacks them anyway.
var notOn6 = map[string]bool{"FUNCTION": true, "FCALL": true, "FCALL_RO": true}

// Lacks tells whether the server binary lacks command (FUNCTION, FCALL and FCALL_RO before
// 7.0): a rename or an ACL rule of it is then left out (RenamedAway, and the ACL helpers of
// the tests), as the Python package's renamed_away.
func Lacks(t Fataler, command string) bool {
	t.Helper()
	return Major(t) < 7 && notOn6[strings.ToUpper(command)]
}

// RenamedAway is the `--rename-command NAME ""` arguments for names, leaving out the commands
// the server lacks (Lacks).
func RenamedAway(t Fataler, names ...string) []string {
	t.Helper()
	var extra []string
	for _, name := range names {
		if !Lacks(t, name) {
			extra = append(extra, "--rename-command", name, "")
		}
	}
	return extra
}

// ModulePath is the module's file.
func ModulePath(t Fataler) string {
	if m := os.Getenv("RL_MODULE"); m != "" {
		return m
	}
	_, file, _, _ := runtime.Caller(0) // clients/go/internal/testserver/testserver.go
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "target", "release", "libredis_rl.so")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the module is not built (%v): run `cargo build --release` at the repository's root, or set RL_MODULE", err)
	}
	return p
}

// freePort is a free port for the server; for a cluster node without --cluster-port (Redis
// 6.x), one whose bus port (+10000) is free too.
func (s *Server) freePort(t Fataler) int {
	t.Helper()
	if !s.clusterBus {
		return FreePort(t)
	}
	for range 200 {
		p := FreePort(t)
		if p > 65535-10000 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free port pair (port, port+10000) for a cluster node")
	return 0
}

// FreePort is a loopback port free when asked (Start retries a first start that lost it).
func FreePort(t Fataler) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a server with the module and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartServer(t, true)
}

// StartServer starts redis-server, with the module when module is true (extra: more server
// arguments), and stops it when the test ends.
func StartServer(t testing.TB, module bool, extra ...string) *Server {
	t.Helper()
	return StartServerEnv(t, nil, module, extra...)
}

// StartServerEnv is StartServer with more environment for the server's process.
func StartServerEnv(t testing.TB, env []string, module bool, extra ...string) *Server {
	t.Helper()
	s := newServer(t, t.TempDir(), module, extra...)
	s.Env = env
	s.Start(t)
	t.Cleanup(s.Stop)
	return s
}

func newServer(t Fataler, dir string, module bool, extra ...string) *Server {
	t.Helper()
	s := &Server{Dir: dir, Module: module}
	ownBus := false
	for _, a := range extra {
		s.clusterBus = s.clusterBus || a == "--cluster-enabled"
		ownBus = ownBus || a == "--cluster-port"
	}
	s.clusterBus = s.clusterBus && !ownBus
	s.Port = s.freePort(t)
	s.Args = []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.Dir}
	if Major(t) >= 7 { // the --enable-*-command switches are 7.0's
		s.Args = append(s.Args, "--enable-debug-command", "yes", "--enable-module-command", "yes")
	}
	if module {
		s.Args = append(s.Args, "--loadmodule", ModulePath(t))
	}
	s.Args = append(s.Args, extra...)
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// PID is the running server's process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Start starts the server (again, after Stop) and waits until it answers. A first start whose
// port another process took in the meantime ("Address already in use") is retried on a fresh
// port; a restart keeps its port (its clients know it).
func (s *Server) Start(t Fataler) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		if s.tryStart(t) {
			s.started = true
			return
		}
		if !s.started && attempt < 2 && strings.Contains(s.Log(), "Address already in use") {
			s.Port = s.freePort(t)
			_ = os.Remove(filepath.Join(s.Dir, "redis.log"))
			continue
		}
		t.Fatalf("redis-server exited at start-up: %s", s.Log())
	}
}

// tryStart starts the server; false when it exited before answering.
func (s *Server) tryStart(t Fataler) bool {
	t.Helper()
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args, "--port", strconv.Itoa(s.Port), "--logfile", filepath.Join(s.Dir, "redis.log"))
	args = append(args, s.Args...)
	s.cmd = exec.Command(Binary(), args...)
	if len(s.Env) > 0 {
		s.cmd.Env = append(os.Environ(), s.Env...)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", Binary(), err)
	}
	s.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(s.cmd, s.exited)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
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
			s.Stop()
			t.Fatalf("redis-server did not answer within 10 s: %s", s.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Log is the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

// Stop kills the server by its PID and waits (with a deadline) until it has exited.
func (s *Server) Stop() {
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

// Restart starts the server again on the same port (empty: it saves nothing).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.Start(t)
}

// Pause stops the server's process (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Pause(t testing.TB) {
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// Resume lets a paused server go on (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// RDB is a go-redis client of the server, closed when the test ends.
func (s *Server) RDB(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Do runs a command on the server (outside any limiter) and fails the test on an error.
func (s *Server) Do(t testing.TB, args ...any) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.RDB(t).Do(ctx, args...).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

// The servers shared by a test binary's tests (one with the module, one without), started
// once and stopped by StopShared.
var (
	sharedMu      sync.Mutex
	sharedServers = map[bool]*Server{}
	sharedStop    []func()
	prefixCounter atomic.Uint64
)

// Shared is the test binary's server with the module (module true) or without it, started at
// the first call, outside any one test's cleanup: the package's TestMain calls StopShared.
func Shared(t Fataler, module bool) *Server {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s, ok := sharedServers[module]; ok {
		return s
	}
	dir, err := os.MkdirTemp("", "redisrl-go-")
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, dir, module)
	s.Start(t)
	sharedServers[module] = s
	sharedStop = append(sharedStop, func() { s.Stop(); _ = os.RemoveAll(dir) })
	return s
}

// StopShared stops the shared servers and removes their directories.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for _, stop := range sharedStop {
		stop()
	}
}

// UniquePrefix is a key prefix no other test uses.
func UniquePrefix(t testing.TB) string {
	name := strings.NewReplacer("/", ".", " ", "_", "{", "(", "}", ")").Replace(t.Name())
	return fmt.Sprintf("t%d.%s:", prefixCounter.Add(1), name)
}
