package testserver

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ClusterNode starts one cluster-enabled server (extra: more server arguments).
func ClusterNode(t testing.TB, module bool, extra ...string) *Server {
	t.Helper()
	// The bus port is chosen too: by default it is port+10000, which may be taken (Redis 6.x
	// has no --cluster-port: the node then gets a port whose +10000 is free).
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}
	if Major(t) >= 7 {
		args = append(args, "--cluster-port", strconv.Itoa(FreePort(t)))
	}
	return StartServer(t, module, append(args, extra...)...)
}

// BusPort is a cluster node's bus port: its --cluster-port, else port+10000 for a
// cluster-enabled server (Redis 6.x), else "".
func (s *Server) BusPort() string {
	bus := ""
	for i, a := range s.Args {
		if a == "--cluster-port" && i+1 < len(s.Args) {
			bus = s.Args[i+1]
		}
	}
	if bus == "" && s.clusterBus {
		bus = strconv.Itoa(s.Port + 10000)
	}
	return bus
}

// StartCluster starts three masters and joins them (redis-cli --cluster create), with a
// deadline on every wait; extra are more server arguments for every node.
func StartCluster(t testing.TB, module bool, extra ...string) []*Server {
	t.Helper()
	var nodes []*Server
	var addrs []string
	for range 3 {
		s := ClusterNode(t, module, extra...)
		nodes = append(nodes, s)
		addrs = append(addrs, s.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		for {
			info, _ := s.Do(t, "CLUSTER", "INFO").(string)
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster did not form within 20 s: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}
