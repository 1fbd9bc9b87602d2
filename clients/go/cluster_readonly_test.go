package redisrl

// A Cluster client that reads from replicas (go-redis's ClusterOptions.ReadOnly, also set
// by RouteByLatency and RouteRandomly) sends read-only commands (FCALL_RO among them) to a
// replica of the key's slot. What the package asks with FCALL_RO must still be asked of the
// master: the library plan's FCALL_RO rl_version of each master, and the OOM twin
// FCALL_RO rl_<op>_ro of the master that refused the FCALL (docs/clients.md#out-of-memory,
// #the-fallback-where-users-are).

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// addReplica starts one more cluster node, joins it (CLUSTER MEET) as a replica of master
// (CLUSTER REPLICATE), and waits until it is in sync and every node lists it among the
// replicas of master's slots (CLUSTER SLOTS, which a client reads).
func addReplica(t *testing.T, nodes []*server, master *server) *server {
	t.Helper()
	n := testserver.ClusterNode(t, master.Module)
	nodes[0].Do(t, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.Port), n.BusPort())
	id := nodeID(t, master)
	waitFor(t, n.Addr()+" knows "+master.Addr(), func() bool {
		listing, _ := n.Do(t, "CLUSTER", "NODES").(string)
		return strings.Contains(listing, id)
	})
	n.Do(t, "CLUSTER", "REPLICATE", id)
	waitFor(t, n.Addr()+" in sync with "+master.Addr(), func() bool {
		return infoField(t, n, "replication", "master_link_status") == "up"
	})
	for _, m := range append(nodes, n) {
		waitFor(t, m.Addr()+" lists "+n.Addr()+" as a replica", func() bool {
			entries, _ := m.Do(t, "CLUSTER", "SLOTS").([]any)
			for _, e := range entries {
				r, _ := e.([]any)
				for _, node := range r[min(3, len(r)):] {
					if fields, _ := node.([]any); len(fields) > 1 && fields[1] == int64(n.Port) {
						return true
					}
				}
			}
			return false
		})
	}
	return n
}

func TestAReadOnlyClusterAsksTheMastersForTheLibraryAndTheTwin(t *testing.T) {
	nodes := testserver.StartCluster(t, false)
	key := ok(Tag("user1", "api"))
	full := "ro:" + key
	owner := slotOwner(t, nodes[0], int(keySlot(full)))
	var master *server
	for _, n := range nodes {
		if nodeID(t, n) == owner {
			master = n
		}
	}
	if master == nil {
		t.Fatalf("no master owns %q", full)
	}
	replica := addReplica(t, nodes, master)
	// The replica has the library and its master none: a plan made from the replica's
	// answer would load nothing where the calls go.
	replica.Do(t, "CONFIG", "SET", "replica-read-only", "no")
	replica.Do(t, "FUNCTION", "LOAD", LuaLibrary)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr())
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadOnly: true, MaxRetries: 3})
	t.Cleanup(func() { _ = rdb.Close() })
	c := ok(New(rdb, WithPrefix("ro:"), WithFailurePolicy(FailError), WithDenyCache(false), WithTimeout(5*time.Second)))
	g := MustGCRA(1, 1, time.Hour)
	if d := ok(c.Check(ctxT(t), key, g)); !d.Allowed || d.Degraded || d.Source != SourceFallback {
		t.Fatalf("%+v", d)
	}
	if v := master.Do(t, "FCALL_RO", "rl_version", "0"); v != libraryVersion(LuaLibrary) {
		t.Fatalf("the master runs %v: the plan was made from the replica's answer", v)
	}
	// The replica has the key, then loses it (FLUSHALL there only): a twin asked of it
	// would admit, so would write, so would answer OOM; the master's denies.
	waitFor(t, "the key on the replica", func() bool { return replica.Do(t, "DBSIZE") == int64(1) })
	replica.Do(t, "FLUSHALL")
	masterRO, replicaRO := commandStats(t, master)["fcall_ro"], commandStats(t, replica)["fcall_ro"]
	master.Do(t, "CONFIG", "SET", "maxmemory", "1")
	d, err := c.Check(ctxT(t), key, g)
	master.Do(t, "CONFIG", "SET", "maxmemory", "0")
	if err != nil || d.Allowed || d.Degraded || d.Source != SourceFallback {
		t.Errorf("the master's denial, out of memory: %+v %v", d, err)
	}
	if n := commandStats(t, master)["fcall_ro"]; n != masterRO+1 {
		t.Errorf("the master answered %d twins, want 1", n-masterRO)
	}
	if n := commandStats(t, replica)["fcall_ro"]; n != replicaRO || n != 0 {
		t.Errorf("the replica was asked FCALL_RO %d times (%d before the twin)", n, replicaRO)
	}
}
