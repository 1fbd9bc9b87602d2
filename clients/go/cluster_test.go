package redisrl

// CheckAll, Check and leases on a three-master Redis Cluster through go-redis's
// ClusterClient, in both modes: hash-tagged keys land on every master, each call goes to
// its slot's master (RL.ALL's numkeys and FCALL's keys routed by the first key), untagged
// multi-key calls are refused with CROSSSLOT (a misuse, not an outage), and in fallback
// mode the client loads the Lua library on every master.

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

func TestCheckAllOnThreeMasters(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			nodes := testserver.StartCluster(t, k.module)
			var addrs []string
			for _, n := range nodes {
				addrs = append(addrs, n.Addr())
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
					_, _, loaded := listedLibrary(n.Do(t, "FUNCTION", "LIST", "LIBRARYNAME", LibraryName, "WITHCODE"))
					if !loaded {
						t.Errorf("%s has no library", n.Addr())
					}
				}
			}
		})
	}
}

func nodeID(t *testing.T, s *server) string {
	t.Helper()
	id, _ := s.Do(t, "CLUSTER", "MYID").(string)
	return id
}

// waitFor polls cond every 50 ms until it holds, failing the test after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// addMaster starts one more master like the others, joins it with CLUSTER MEET (it serves no
// slot yet) and waits until every node knows it as a connected master.
func addMaster(t *testing.T, nodes []*server, module bool, extra ...string) []*server {
	t.Helper()
	n := testserver.ClusterNode(t, module, extra...)
	// The bus port too: it is not port+10000 where --cluster-port chose it (7.0 and later).
	nodes[0].Do(t, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.Port), n.BusPort())
	id := nodeID(t, n)
	nodes = append(nodes, n)
	for _, m := range nodes {
		waitFor(t, m.Addr()+" knows "+n.Addr(), func() bool {
			info, _ := m.Do(t, "CLUSTER", "INFO").(string)
			listing, _ := m.Do(t, "CLUSTER", "NODES").(string)
			for _, line := range strings.Split(listing, "\n") {
				f := strings.Fields(line)
				if len(f) >= 8 && f[0] == id {
					return strings.Contains(f[2], "master") && !strings.Contains(f[2], "handshake") &&
						f[7] == "connected" && strings.Contains(info, "cluster_state:ok")
				}
			}
			return false
		})
	}
	return nodes
}

// slotOwner is the node whose CLUSTER SLOTS says it serves slot (by its ID), as seen by m.
func slotOwner(t *testing.T, m *server, slot int) string {
	t.Helper()
	entries, _ := m.Do(t, "CLUSTER", "SLOTS").([]any)
	for _, e := range entries {
		r, _ := e.([]any)
		if len(r) < 3 {
			continue
		}
		lo, _ := r[0].(int64)
		hi, _ := r[1].(int64)
		if int64(slot) >= lo && int64(slot) <= hi {
			if primary, _ := r[2].([]any); len(primary) > 2 {
				id, _ := primary[2].(string)
				return id
			}
		}
	}
	return ""
}

// moveSlot moves slot, with its keys (MIGRATE), to node to, as redis-cli --cluster reshard
// does: SETSLOT IMPORTING / MIGRATING, MIGRATE, then SETSLOT NODE on every master; waits
// until every node sends the slot's keys to it.
func moveSlot(t *testing.T, nodes []*server, slot int, to *server) {
	t.Helper()
	dst := nodeID(t, to)
	var src *server
	owner := slotOwner(t, nodes[0], slot)
	for _, n := range nodes {
		if nodeID(t, n) == owner {
			src = n
		}
	}
	if src == nil || src == to {
		t.Fatalf("slot %d: owner %q", slot, owner)
	}
	sl := strconv.Itoa(slot)
	to.Do(t, "CLUSTER", "SETSLOT", sl, "IMPORTING", owner)
	src.Do(t, "CLUSTER", "SETSLOT", sl, "MIGRATING", dst)
	for {
		keys, _ := src.Do(t, "CLUSTER", "GETKEYSINSLOT", sl, "100").([]any)
		if len(keys) == 0 {
			break
		}
		src.Do(t, append([]any{"MIGRATE", "127.0.0.1", strconv.Itoa(to.Port), "", "0", "5000", "KEYS"}, keys...)...)
	}
	for _, n := range append([]*server{to, src}, nodes...) {
		n.Do(t, "CLUSTER", "SETSLOT", sl, "NODE", dst)
	}
	for _, n := range nodes {
		waitFor(t, n.Addr()+" sees slot "+sl+" on "+to.Addr(), func() bool { return slotOwner(t, n, slot) == dst })
	}
}

// A Cluster that grows under a running client (docs/clients.md#the-fallback-where-users-are):
// a master added with CLUSTER MEET after the client started, and the slot of a limited key
// migrated to it (as redis-cli --cluster reshard does). The new node has neither the library
// nor the script cached; the first call whose key lands there is decided there, from the
// migrated state, with one load on that node (FUNCTION LOAD as a library, one EVAL as
// scripts) and none anywhere else. scripts: FUNCTION renamed away on every node. As the Rust
// crate's cluster.rs and the Python package's test_cluster_growth.py.
func TestAMasterAddedAfterStartGetsTheFallbackOnce(t *testing.T) {
	for _, scripts := range []bool{false, true} {
		name, load, extra := "functions", "function|load", []string(nil)
		if scripts {
			name, load, extra = "scripts", "eval", testserver.RenamedAway(t, "FUNCTION")
		}
		t.Run(name, func(t *testing.T) {
			if !scripts {
				testserver.NeedFunctions(t)
			}
			nodes := testserver.StartCluster(t, false, extra...)
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}, MaxRetries: 3})
			t.Cleanup(func() { _ = rdb.Close() })
			c := ok(New(rdb, WithPrefix("grow:"), WithFailurePolicy(FailError), WithTimeout(5*time.Second)))
			w := MustWindow(10, time.Hour, Log) // exact counts however long the test takes
			var keys []string
			for i := range 12 {
				keys = append(keys, ok(Tag(fmt.Sprintf("user%d", i), "api")))
			}
			for _, k := range keys {
				if d := ok(c.Check(ctxT(t), k, w)); !d.Allowed || d.Remaining != 9 || d.Source != SourceFallback {
					t.Fatalf("%s: %+v", k, d)
				}
			}
			before := map[string]uint64{}
			for _, n := range nodes {
				before[n.Addr()] = commandStats(t, n)[load]
			}
			nodes = addMaster(t, nodes, false, extra...)
			added := nodes[len(nodes)-1]
			moveSlot(t, nodes, int(keySlot("grow:"+keys[0])), added)
			if n := commandStats(t, added)[load]; n != 0 {
				t.Fatalf("%s ran %d times on the new node before any call", load, n)
			}

			// Routed by the client's old slot table: MOVED, then the new node.
			d := ok(c.Check(ctxT(t), keys[0], w))
			if !d.Allowed || d.Degraded || d.Remaining != 8 {
				t.Fatalf("not decided on the new node from the migrated key: %+v", d)
			}
			if n := commandStats(t, added)[load]; n != 1 {
				t.Fatalf("%s ran %d times on the new node, want 1", load, n)
			}
			if !scripts {
				if v := added.Do(t, "FCALL_RO", "rl_version", "0"); v != libraryVersion(LuaLibrary) {
					t.Errorf("the new node runs %v", v)
				}
			}
			if d := ok(c.Check(ctxT(t), keys[0], w)); d.Remaining != 7 {
				t.Fatalf("%+v", d)
			}
			onNew := commandStats(t, added)
			if onNew[load] != 1 {
				t.Errorf("loaded once, not per call: %v", onNew)
			}
			if scripts && onNew["evalsha"] < 1 {
				t.Errorf("by SHA1 once the node has the text: %v", onNew)
			}
			for _, n := range nodes[:len(nodes)-1] {
				if got := commandStats(t, n)[load]; got != before[n.Addr()] {
					t.Errorf("%s: %s %d -> %d", n.Addr(), load, before[n.Addr()], got)
				}
			}
			for _, k := range keys[1:] {
				if d := ok(c.Check(ctxT(t), k, w)); d.Remaining != 8 {
					t.Errorf("%s: %+v", k, d)
				}
			}
			if snap := c.Counters().Snapshot(); snap["errors"] != 0 || snap["degraded"] != 0 {
				t.Errorf("%v", snap)
			}
		})
	}
}

// A rolling deploy reached one master first: the older client keeps the newer library there
// and still loads its own where none is (each master has its own plan).
func TestANewerLibraryOnOneMasterLeavesTheOthersLoaded(t *testing.T) {
	testserver.NeedFunctions(t)
	nodes := testserver.StartCluster(t, false)
	nodes[0].Do(t, "FUNCTION", "LOAD", withVersion("99.0.0"))
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr())
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: 3})
	t.Cleanup(func() { _ = rdb.Close() })
	c := ok(New(rdb, WithPrefix("nw:"), WithFailurePolicy(FailError), WithTimeout(5*time.Second)))
	w := MustWindow(5, time.Hour, Log)
	for i := range 12 {
		k := ok(Tag(fmt.Sprintf("user%d", i), "api"))
		if d := ok(c.Check(ctxT(t), k, w)); !d.Allowed {
			t.Errorf("%s: %+v", k, d)
		}
	}
	ours := libraryVersion(LuaLibrary)
	var versions []any
	for _, n := range nodes {
		versions = append(versions, n.Do(t, "FCALL_RO", "rl_version", "0"))
	}
	if fmt.Sprint(versions) != fmt.Sprint([]any{"99.0.0", ours, ours}) {
		t.Errorf("versions %v, want [99.0.0 %s %s]", versions, ours, ours)
	}
}

// FailLocal on a Cluster with every master stopped: AcrossSlots is decided slot group by
// slot group in memory, and a later group's denial gives back the earlier group's charge in
// memory too (docs/clients.md#identities-stay-apart, #failure-policy-local).
func TestLocalAcrossSlotsGivesBackInMemory(t *testing.T) {
	nodes := testserver.StartCluster(t, true)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}, MaxRetries: -1, DialTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	c := ok(New(rdb, WithPrefix("loc:"), WithFailurePolicy(FailLocal), WithTimeout(300*time.Millisecond), WithProbeInterval(time.Minute)))
	perKey := MustGCRA(5, 1, time.Minute)
	perIP := MustWindow(1, time.Minute, Fixed)
	kk, ki := ok(Tag("key:k1", "api")), ok(Tag("ip:192.0.2.7", "ip"))
	if keySlot("loc:"+kk) == keySlot("loc:"+ki) {
		t.Fatal("the two tags share a slot: pick others")
	}
	if d := ok(c.Check(ctxT(t), kk, perKey)); d.Degraded || d.Source != SourceModule {
		t.Fatalf("%+v", d)
	}
	for _, n := range nodes {
		n.Stop()
	}
	across := []Entry{NewEntry(kk, perKey), NewEntry(ki, perIP)}
	first := ok(c.CheckAll(ctxT(t), across, AcrossSlots()))
	if !first.Allowed || !first.Degraded || first.Blind || first.Source != SourceLocal || first.Remaining != 0 {
		t.Fatalf("%+v", first)
	}
	second := ok(c.CheckAll(ctxT(t), across, AcrossSlots()))
	if second.Allowed || !second.PerKey[0].Allowed || second.PerKey[1].Allowed || second.Source != SourceLocal {
		t.Fatalf("%+v", second)
	}
	if left := ok(c.Check(ctxT(t), kk, perKey, Cost(0))); left.Source != SourceLocal || left.Remaining != 4 {
		t.Errorf("the denied request left a charge in memory: %+v", left)
	}
	if snap := c.Counters().Snapshot(); snap["local"] != 3 || snap["refunded"] != 1 {
		t.Errorf("%v", snap)
	}
}
