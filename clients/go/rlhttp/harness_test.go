package rlhttp

// A small real-server harness (the package redisrl's harness_test.go has the full one):
// redis-server on a free loopback port in a temporary directory, with the module, stopped by
// PID; every wait has a deadline.

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisrl "github.com/redis-rl/redis-rl/clients/go"
)

type server struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

func startServer(t *testing.T) *server {
	t.Helper()
	module := os.Getenv("RL_MODULE")
	if module == "" {
		module, _ = filepath.Abs("../../../target/release/libredis_rl.so")
	}
	if _, err := os.Stat(module); err != nil {
		t.Fatalf("the module is not built (%v): cargo build --release, or set RL_MODULE", err)
	}
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	s := &server{addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--loadmodule", module)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(s.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", s.addr, 200*time.Millisecond); err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("PING\r\n"))
			buf := make([]byte, 8)
			n, _ := c.Read(buf)
			c.Close()
			if strings.HasPrefix(string(buf[:n]), "+PONG") {
				return s
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server did not answer within 10 s: %s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) stop() {
	if s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
}

// limiter is a fresh client of s (its own go-redis pool, as a separate process would have).
func (s *server) limiter(t *testing.T, opts ...redisrl.Option) *redisrl.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := redisrl.New(rdb, append([]redisrl.Option{redisrl.WithPrefix(strings.ReplaceAll(t.Name(), "/", ".") + ":"), redisrl.WithTimeout(300 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
