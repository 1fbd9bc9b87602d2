// Package testserver starts a real redis-server with the redis-rl module for the tests of
// rlhttp and rlgin: a free loopback port, a temporary directory, stopped by PID when the test
// ends, every wait with a deadline. RL_MODULE names the module (default: the repository's
// target/release/libredis_rl.so), REDIS_SERVER the server binary. (The core package's own
// harness, harness_test.go, also runs servers without the module, paused and restarted.)
package testserver

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	Addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

func modulePath(t testing.TB) string {
	if m := os.Getenv("RL_MODULE"); m != "" {
		return m
	}
	_, file, _, _ := runtime.Caller(0) // clients/go/internal/testserver/testserver.go
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "target", "release", "libredis_rl.so")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the module is not built (%v): cargo build --release at the repository's root, or set RL_MODULE", err)
	}
	return p
}

// Start starts a server with the module and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
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
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--loadmodule", modulePath(t))
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(s.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond); err == nil {
			// The server that answers must be ours (another process may hold the port).
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("INFO server\r\n"))
			buf := make([]byte, 8192)
			n := 0
			for n < len(buf) && !strings.Contains(string(buf[:n]), "process_id:") {
				m, err := c.Read(buf[n:])
				if err != nil {
					break
				}
				n += m
			}
			c.Close()
			if strings.Contains(string(buf[:n]), "process_id:"+strconv.Itoa(s.cmd.Process.Pid)+"\r\n") {
				return s
			}
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server exited at start-up: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server did not answer within 10 s: %s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server by its PID and waits, with a deadline, until it has exited.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
}
