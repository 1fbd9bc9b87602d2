package redisrl

// A failover (Sentinel) client: one master, one replica and one redis-sentinel on loopback,
// the limiter on go-redis's failover client (NewFailoverClient, or NewUniversalClient with
// MasterName), in three modes: the module loaded on both servers; no module, the fallback
// library (FUNCTION LOAD on the master, replicated to the replica with the data); no
// module and FUNCTION renamed away, the fallback as scripts (EVAL, then EVALSHA). Decisions
// on the master, then SENTINEL FAILOVER: once Sentinel reports the replica as the master
// and the old master follows it, the limiter answers from the replicated state (the
// remaining count continues where it was), and as scripts the new master's empty script
// cache costs one NOSCRIPT and one EVAL, no more.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

const sentinelMaster = "mymaster"

// sentinelDo runs a command on a Sentinel; the error is returned (SENTINEL FAILOVER may be
// refused while Sentinel does not yet know a good replica).
func sentinelDo(s *server, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}

// infoField is one field of a server's INFO section, "" when the server does not answer:
// Sentinel ends every normal client's connection (CLIENT KILL TYPE normal) when it turns a
// server into a master or a replica, so a poll may meet EOF.
func infoField(t *testing.T, s *server, section, field string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// sentinelPair starts a master, a replica of it (both with extra arguments; the module on both
// when module) and a Sentinel that knows both, with a deadline on every wait.
func sentinelPair(t *testing.T, module bool, extra ...string) (master, replica, sentinel *server) {
	t.Helper()
	master = testserver.StartServer(t, module, extra...)
	replica = testserver.StartServer(t, module, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, extra...)...)
	waitFor(t, "the replica is in sync", func() bool {
		return infoField(t, replica, "replication", "master_link_status") == "up"
	})
	sentinel = testserver.StartSentinel(t, sentinelMaster, master.Port)
	waitFor(t, "Sentinel knows the replica", func() bool { return knowsReplica(sentinel, replica) })
	return master, replica, sentinel
}

// knowsReplica reports whether sentinel lists replica as a replica of the master, linked.
func knowsReplica(sentinel, replica *server) bool {
	v, err := sentinelDo(sentinel, "SENTINEL", "REPLICAS", sentinelMaster)
	if err != nil {
		return false
	}
	list, _ := v.([]any)
	for _, r := range list {
		fields := map[string]string{}
		switch r := r.(type) {
		case []any: // RESP2: name, value, name, value, ...
			for i := 0; i+1 < len(r); i += 2 {
				fields[fmt.Sprint(r[i])] = fmt.Sprint(r[i+1])
			}
		case map[any]any: // RESP3
			for k, v := range r {
				fields[fmt.Sprint(k)] = fmt.Sprint(v)
			}
		}
		if fields["port"] == strconv.Itoa(replica.Port) && fields["master-link-status"] == "ok" &&
			fields["flags"] == "slave" {
			return true
		}
	}
	return false
}

// failOver asks Sentinel to fail the master over to the replica and waits until Sentinel
// reports the replica as the master, the replica says it is one, and the old master follows it
// (so nothing written from then on can land on the old master and be lost).
func failOver(t *testing.T, master, replica, sentinel *server) {
	t.Helper()
	// Everything the client wrote is on the replica before the switch.
	if n, _ := master.Do(t, "WAIT", "1", "5000").(int64); n != 1 {
		t.Fatalf("WAIT: %d replicas acknowledged", n)
	}
	waitFor(t, "SENTINEL FAILOVER accepted", func() bool {
		_, err := sentinelDo(sentinel, "SENTINEL", "FAILOVER", sentinelMaster)
		return err == nil
	})
	waitFor(t, "Sentinel reports the replica as the master", func() bool {
		v, err := sentinelDo(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinelMaster)
		addr, _ := v.([]any)
		return err == nil && len(addr) == 2 && fmt.Sprint(addr[1]) == strconv.Itoa(replica.Port)
	})
	waitFor(t, "the replica is the master", func() bool {
		return infoField(t, replica, "replication", "role") == "master"
	})
	// Sentinel turns the old master into a replica when its next INFO (every 10 s) shows it
	// still a master: about 14 s here on an idle machine.
	waitWithin(t, "the old master follows the new one", 90*time.Second, func() bool {
		return infoField(t, master, "replication", "role") == "slave" &&
			infoField(t, master, "replication", "master_port") == strconv.Itoa(replica.Port) &&
			infoField(t, master, "replication", "master_link_status") == "up"
	})
}

// waitWithin polls cond every 50 ms until it holds, failing the test after d.
func waitWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// decideAfterSwitch checks until Redis answers (an outage while go-redis follows the switch is
// an error under FailError and writes nothing), with a deadline.
func decideAfterSwitch(t *testing.T, c *Client, key string, g Spec) Decision {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, err := c.Check(ctxT(t), key, g)
		if err == nil {
			return d
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("after the switch: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer within 30 s after the switch: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAFailoverClientAnswersFromTheReplicatedStateAfterTheSwitch(t *testing.T) {
	cases := []struct {
		name   string
		module bool
		extra  []string
		want   Mode
		source Source
	}{
		{"module", true, nil, ModeModule, SourceModule},
		{"fallback", false, nil, ModeFallback, SourceFallback},
		{"scripts", false, []string{"--rename-command", "FUNCTION", ""}, ModeFallback, SourceFallback},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t0 := time.Now()
			master, replica, sentinel := sentinelPair(t, tc.module, tc.extra...)
			t.Logf("set up in %v", time.Since(t0))
			// Both ways of building a failover client: NewFailoverClient, and
			// NewUniversalClient with MasterName.
			var rdb redis.UniversalClient
			if i%2 == 0 {
				rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster,
					SentinelAddrs: []string{sentinel.Addr()}, DialTimeout: time.Second})
			} else {
				rdb = redis.NewUniversalClient(&redis.UniversalOptions{MasterName: sentinelMaster,
					Addrs: []string{sentinel.Addr()}, DialTimeout: time.Second})
			}
			t.Cleanup(func() { _ = rdb.Close() })
			c := ok(New(rdb, WithPrefix(testserver.UniquePrefix(t)), WithFailurePolicy(FailError),
				WithProbeInterval(50*time.Millisecond), WithDenyCache(false)))
			if m := ok(c.ResolvedMode(ctxT(t))); m != tc.want {
				t.Fatalf("mode %v", m)
			}
			// GCRA: 10 at once, one more every 6 minutes, so no unit comes back during the test.
			g := MustGCRA(10, 10, time.Hour)
			w := MustWindow(3, time.Hour, Sliding)
			l := MustLease(1, time.Hour)
			for n := range 4 {
				d := ok(c.Check(ctxT(t), "api", g))
				if !d.Allowed || d.Remaining != uint64(9-n) || d.Source != tc.source {
					t.Fatalf("before the switch, check %d: %+v", n, d)
				}
			}
			if d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{u}:w", w), NewEntry("{u}:w2", w)}, Cost(2))); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("%+v", d)
			}
			held := ok(c.Acquire(ctxT(t), "slot", l))
			if tc.name == "fallback" {
				if _, _, loaded := listedLibrary(replica.Do(t, "FUNCTION", "LIST", "LIBRARYNAME", LibraryName, "WITHCODE")); !loaded {
					t.Fatal("the library was not replicated to the replica")
				}
			}
			t0 = time.Now()
			failOver(t, master, replica, sentinel)
			t.Logf("failover took %v", time.Since(t0))
			// Counted from here: what the new master is asked after the switch.
			replica.Do(t, "CONFIG", "RESETSTAT")

			d := decideAfterSwitch(t, c, "api", g)
			if !d.Allowed || d.Remaining != 5 || d.Source != tc.source {
				t.Fatalf("the first answer after the switch: %+v (want remaining 5: the count continues)", d)
			}
			for n := range 5 {
				d := ok(c.Check(ctxT(t), "api", g))
				if !d.Allowed || d.Remaining != uint64(4-n) {
					t.Fatalf("after the switch, check %d: %+v", n, d)
				}
			}
			if d := ok(c.Check(ctxT(t), "api", g)); d.Allowed {
				t.Fatalf("the eleventh of 10: %+v", d)
			}
			if d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{u}:w", w), NewEntry("{u}:w2", w)})); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("the window continues: %+v", d)
			}
			if d := ok(c.CheckAll(ctxT(t), []Entry{NewEntry("{u}:w", w), NewEntry("{u}:w2", w)})); d.Allowed {
				t.Fatalf("the fourth of 3: %+v", d)
			}
			// The lease taken on the old master is held on the new one.
			if _, err := c.Acquire(ctxT(t), "slot", l); !errors.Is(err, ErrRateLimited) {
				t.Fatalf("the replicated lease was free: %v", err)
			}
			if r := ok(held.Release(ctxT(t))); r.Units != 1 {
				t.Fatalf("release after the switch: %+v", r)
			}
			if held.Err() != nil {
				t.Fatalf("the guard: %v", held.Err())
			}
			// Everything after the switch ran on the new master.
			stats := commandStats(t, replica)
			switch tc.name {
			case "module":
				if stats["rl.gcra"] == 0 {
					t.Errorf("the new master was not asked: %v", stats)
				}
			case "fallback":
				if stats["fcall"] == 0 || stats["function|load"] != 0 {
					t.Errorf("the replicated library serves (no second load): %v", stats)
				}
			case "scripts":
				// The new master's script cache is empty: one NOSCRIPT, the text once, then
				// EVALSHA again.
				if stats["eval"] != 1 || stats["evalsha"] < 10 {
					t.Errorf("NOSCRIPT recovered once: %v", stats)
				}
			}
		})
	}
}
