package redisrl

// CheckAll, Check and leases on a three-master Redis Cluster through go-redis's
// ClusterClient, in both modes: hash-tagged keys land on every master, each call goes to
// its slot's master (RL.ALL's numkeys and FCALL's keys routed by the first key), untagged
// multi-key calls are refused with CROSSSLOT (a misuse, not an outage), and in fallback
// mode the client loads the Lua library on every master.

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startCluster starts three masters and joins them (redis-cli --cluster create), with a
// deadline on every wait.
func startCluster(t *testing.T, module bool) []*server {
	t.Helper()
	var nodes []*server
	var addrs []string
	for range 3 {
		// The bus port is chosen too: by default it is port+10000, which may be taken.
		s := startServer(t, module, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(freePort(t)))
		nodes = append(nodes, s)
		addrs = append(addrs, s.addr())
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
			info, _ := s.do(t, "CLUSTER", "INFO").(string)
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

func TestCheckAllOnThreeMasters(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			nodes := startCluster(t, k.module)
			var addrs []string
			for _, n := range nodes {
				addrs = append(addrs, n.addr())
			}
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: 3})
			t.Cleanup(func() { _ = rdb.Close() })
			c := ok(New(rdb, WithPrefix("c:")))
			if m := ok(c.ResolvedMode(ctxT(t))); m != k.want() {
				t.Fatalf("%v", m)
			}
			api := MustGCRA(3, 1, time.Minute)
			ip := MustWindow(2, time.Minute, Sliding)
			masters := map[string]bool{}
			for i := range 12 {
				user := fmt.Sprintf("user%d", i)
				ka, ki := ok(Tag(user, "api")), ok(Tag(user, "ip"))
				var got []bool
				for range 3 {
					d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry(ka, api), NewEntry(ki, ip)}))
					if d.Source != k.source() {
						t.Errorf("%+v", d)
					}
					got = append(got, d.Allowed)
				}
				if !got[0] || !got[1] || got[2] {
					t.Errorf("%s: %v", user, got)
				}
				if left := ok(c.Check(ctxT(t), ka, api, Cost(0))); left.Remaining != 1 {
					t.Errorf("%s: %+v", user, left)
				}
				owner := ok(rdb.MasterForKey(ctxT(t), "c:"+ka))
				masters[owner.Options().Addr] = true
				if n := ok(owner.Exists(ctxT(t), "c:"+ka).Result()); n != 1 {
					t.Errorf("%s: the state is not on its slot's master", user)
				}
				// A lease with its key's tag, on its slot's master.
				g := ok(c.Acquire(ctxT(t), ok(Tag(user, "jobs")), MustLease(1, 10*time.Second)))
				if _, err := c.Acquire(ctxT(t), ok(Tag(user, "jobs")), MustLease(1, 10*time.Second)); err == nil {
					t.Errorf("%s: a second lease of one", user)
				}
				if r := ok(g.Release(ctxT(t))); r.Units != 1 {
					t.Errorf("%s: %+v", user, r)
				}
			}
			if len(masters) != 3 {
				t.Errorf("the keys landed on %d masters, want 3", len(masters))
			}
			_, err := c.CheckAll(ctxT(t), []Entry{NewEntry("a-user", MustGCRA(1, 1, time.Second)), NewEntry("b-user", MustGCRA(1, 1, time.Second))})
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "slot") {
				t.Errorf("expected CROSSSLOT, got %v", err)
			}
			if n, _ := c.Counters().Get("errors"); n != 0 {
				t.Errorf("a misuse is not an outage: errors %d", n)
			}
			// AcrossSlots: slot group by slot group; a later denial gives back what the
			// earlier groups took (docs/clients.md#identities-stay-apart).
			perKey := MustGCRA(5, 1, time.Minute)
			perIP := MustWindow(1, time.Minute, Fixed)
			kk, ki := ok(Tag("key:k1", "api")), ok(Tag("ip:192.0.2.7", "ip"))
			if keySlot("c:"+kk) == keySlot("c:"+ki) {
				t.Fatal("the two tags share a slot: pick others")
			}
			across := []Entry{NewEntry(kk, perKey), NewEntry(ki, perIP)}
			first := ok(c.CheckAll(ctxT(t), across, AcrossSlots()))
			if !first.Allowed || len(first.PerKey) != 2 || first.Remaining != 0 || first.Spec != Spec(perIP) {
				t.Fatalf("%+v", first)
			}
			refunded, _ := c.Counters().Get("refunded")
			second := ok(c.CheckAll(ctxT(t), across, AcrossSlots()))
			if second.Allowed || second.PerKey[1].Allowed || !second.PerKey[0].Allowed {
				t.Fatalf("%+v", second)
			}
			if after, _ := c.Counters().Get("refunded"); after != refunded+1 {
				t.Errorf("refunded %d -> %d", refunded, after)
			}
			if left := ok(c.Check(ctxT(t), kk, perKey, Cost(0))); left.Remaining != 4 {
				t.Errorf("the denied request left a charge on the first group: %+v", left)
			}
			if n, _ := c.Counters().Get("allowed"); n == 0 {
				t.Error("no decision counted")
			}
			if !k.module {
				for _, n := range nodes {
					_, _, loaded := listedLibrary(n.do(t, "FUNCTION", "LIST", "LIBRARYNAME", LibraryName, "WITHCODE"))
					if !loaded {
						t.Errorf("%s has no library", n.addr())
					}
				}
			}
		})
	}
}
