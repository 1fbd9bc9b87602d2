package redisrl

// Three Sentinels with quorum 2, the failover client given all three addresses: one Sentinel
// is stopped (the first address the client has), then the master dies. The two left agree
// that it is down (quorum 2), one of them is elected by the majority of the three and
// promotes the replica, and the limiter goes on from the replicated state on the new master,
// which the client learns from a Sentinel that answers. Module mode only (the failover is
// the same in every mode; TestAFailoverClientAnswersFromTheReplicatedStateAfterTheSwitch
// covers the modes). Sentinel's timeouts are set low (SENTINEL SET: down after 2 s, failover
// timeout 5 s), so the switch takes seconds; every wait has a deadline.

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

func TestThreeSentinelsFailOverWithOneStopped(t *testing.T) {
	t0 := time.Now()
	master := testserver.StartServer(t, true)
	replica := testserver.StartServer(t, true, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	waitWithin(t, "the replica is in sync", 30*time.Second, func() bool {
		return infoField(t, replica, "replication", "master_link_status") == "up"
	})
	var sentinels []*server
	for range 3 {
		s := testserver.StartSentinel(t, sentinelMaster, master.Port)
		// Quorum 2, and low timeouts: down after 2 s, a failed election retried after 10 s.
		if _, err := sentinelDo(s, "SENTINEL", "SET", sentinelMaster, "quorum", "2",
			"down-after-milliseconds", "2000", "failover-timeout", "5000"); err != nil {
			t.Fatalf("SENTINEL SET: %v", err)
		}
		sentinels = append(sentinels, s)
	}
	// Each Sentinel knows the replica and the two others (hello messages through the
	// master), so a failover can be authorized: SENTINEL CKQUORUM.
	for _, s := range sentinels {
		waitWithin(t, s.Addr()+" knows the replica and the other Sentinels", 60*time.Second, func() bool {
			v, err := sentinelDo(s, "SENTINEL", "CKQUORUM", sentinelMaster)
			msg, _ := v.(string)
			return err == nil && strings.Contains(msg, "3 usable Sentinels") && knowsReplica(s, replica)
		})
	}
	t.Logf("set up in %v", time.Since(t0))
	var addrs []string
	for _, s := range sentinels {
		addrs = append(addrs, s.Addr())
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster,
		SentinelAddrs: addrs, DialTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := ok(New(rdb, WithPrefix(testserver.UniquePrefix(t)), WithFailurePolicy(FailError),
		WithProbeInterval(50*time.Millisecond), WithDenyCache(false)))
	g := MustGCRA(10, 10, time.Hour) // no unit comes back during the test
	for n := range 4 {
		if d := ok(c.Check(ctxT(t), "api", g)); !d.Allowed || d.Remaining != uint64(9-n) || d.Source != SourceModule {
			t.Fatalf("before the failover, check %d: %+v", n, d)
		}
	}
	// Everything the client wrote is on the replica before the master dies.
	if n, _ := master.Do(t, "WAIT", "1", "5000").(int64); n != 1 {
		t.Fatalf("WAIT: %d replicas acknowledged", n)
	}
	sentinels[0].Stop()
	t1 := time.Now()
	master.Stop()
	waitWithin(t, "the two Sentinels left promote the replica", 60*time.Second, func() bool {
		for _, s := range sentinels[1:] {
			v, err := sentinelDo(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinelMaster)
			addr, _ := v.([]any)
			if err != nil || len(addr) != 2 || addr[1] != strconv.Itoa(replica.Port) {
				return false
			}
		}
		return infoField(t, replica, "replication", "role") == "master"
	})
	t.Logf("failover took %v", time.Since(t1))
	replica.Do(t, "CONFIG", "RESETSTAT")
	d := decideAfterSwitch(t, c, "api", g)
	if !d.Allowed || d.Remaining != 5 || d.Source != SourceModule {
		t.Fatalf("the first answer after the failover: %+v (want remaining 5: the count continues)", d)
	}
	for n := range 5 {
		if d := ok(c.Check(ctxT(t), "api", g)); !d.Allowed || d.Remaining != uint64(4-n) {
			t.Fatalf("after the failover, check %d: %+v", n, d)
		}
	}
	if d := ok(c.Check(ctxT(t), "api", g)); d.Allowed {
		t.Fatalf("the eleventh of 10: %+v", d)
	}
	if stats := commandStats(t, replica); stats["rl.gcra"] < 7 {
		t.Errorf("the new master decided %d checks, want the 7 after the failover: %v", stats["rl.gcra"], stats)
	}
	t.Logf("the test took %v", time.Since(t0))
}
