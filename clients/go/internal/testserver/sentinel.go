package testserver

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// StartSentinel starts redis-server --sentinel monitoring the master named name at masterPort,
// on a free loopback port, in a temporary directory (Sentinel rewrites its config file there);
// stopped by PID when the test ends.
func StartSentinel(t testing.TB, name string, masterPort int) *Server {
	t.Helper()
	s := &Server{Port: FreePort(t), Dir: t.TempDir()}
	s.conf = filepath.Join(s.Dir, "sentinel.conf")
	s.Args = []string{"--sentinel", "--bind", "127.0.0.1", "--dir", s.Dir}
	text := fmt.Sprintf(`sentinel monitor %s 127.0.0.1 %d 1
sentinel down-after-milliseconds %s 5000
sentinel failover-timeout %s 60000
sentinel parallel-syncs %s 1
`, name, masterPort, name, name, name)
	if err := os.WriteFile(s.conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Start(t)
	t.Cleanup(s.Stop)
	return s
}
