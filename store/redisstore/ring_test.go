package redisstore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// The Ring tests need a *redis.Ring of several shards, that is several
// servers. They start their own: one redis-server per shard, on a Unix
// socket in a temporary directory (no TCP port, so none can collide), with
// no persistence. Like the rest of the Redis suite they run only with
// IDEM_TEST_REDIS set; they also need redis-server on PATH, and skip
// saying so without it.

// ringShards starts n redis-servers for t and returns a Ring over them
// (shard names s0, s1, ...) and a client of each shard. The servers are
// killed, and their directory removed, when t ends; on Linux they are
// also killed if the test process dies first.
func ringShards(t *testing.T, n int) (*redis.Ring, []*redis.Client) {
	t.Helper()
	testURL(t) // the Redis suite's switch
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("the Ring tests start their own Redis servers: put redis-server on PATH to run them")
	}
	// Not t.TempDir(): a Unix socket's path must be short (about 100 bytes).
	dir, err := os.MkdirTemp("", "idemring")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	addrs := map[string]string{}
	clients := make([]*redis.Client, n)
	for i := range n {
		name := fmt.Sprint("s", i)
		sock := filepath.Join(dir, name+".sock")
		logf := filepath.Join(dir, name+".log")
		cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logf, "--daemonize", "no")
		killWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", bin, err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
		t.Cleanup(func() { c.Close() })
		ready := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = c.Ping(ctx).Err()
			cancel()
			if err == nil {
				ready = true
				break
			}
		}
		if !ready {
			log, _ := os.ReadFile(logf)
			t.Fatalf("redis-server on %s did not answer within 10s: %v\n%s", sock, err, log)
		}
		addrs[name] = sock
		clients[i] = c
	}
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:                 addrs,
		NewClient:             func(o *redis.Options) *redis.Client { o.Network = "unix"; return redis.NewClient(o) },
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		ReadTimeout:           5 * time.Second,
	})
	t.Cleanup(func() { ring.Close() })
	return ring, clients
}

// TestRingScripts: on a Ring of two shards, the scripts reach every shard.
// A Ring sends SCRIPT LOAD (which has no key) to a shard of its choosing,
// so ClaimBatch and FinishBatch (then CompleteBatch), which pipeline EVALSHA and load the
// script when the server lacks it, failed with "the server keeps
// forgetting the store's scripts" for the keys of the other shard; and
// Ping loaded the scripts on one shard only.
func TestRingScripts(t *testing.T) {
	ring, shards := ringShards(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := New(ring)
	flush := func() {
		t.Helper()
		for _, c := range shards {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	var reqs []store.ClaimRequest
	for i := range 20 {
		reqs = append(reqs, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: fmt.Sprint("k", i), Owner: "o", Lease: time.Minute, Retention: time.Hour})
	}
	// A new server has no scripts: the batch loads its script on both shards.
	flush()
	res, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatalf("ClaimBatch on a Ring whose shards lack the script: %v", err)
	}
	for i, r := range res {
		if !r.Acquired || r.Err != nil {
			t.Fatalf("ClaimBatch result %d: %+v", i, r)
		}
	}
	// The test means something only if both shards hold keys of the batch.
	for i, c := range shards {
		n := 0
		for _, r := range reqs {
			n += int(c.Exists(ctx, s.rkey(r.Key)).Val())
		}
		if n == 0 || n == len(reqs) {
			t.Fatalf("shard %d holds %d of the batch's %d keys; want some", i, n, len(reqs))
		}
	}

	flush()
	cs := make([]store.FinishRequest, len(res))
	for i, r := range res {
		cs[i] = store.FinishRequest{Key: r.Record.Key, Fence: r.Record.Fence, AttemptID: r.Record.AttemptID,
			Outcome: store.OutcomeCompleted, Result: []byte("done"), Retention: time.Hour}
	}
	errs, err := s.FinishBatch(ctx, cs)
	if err != nil {
		t.Fatalf("FinishBatch on a Ring whose shards lack the script: %v", err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("FinishBatch of %s: %v", cs[i].Key, e)
		}
	}
	for _, r := range reqs {
		if rec, err := s.Get(ctx, r.Key); err != nil || rec.Status != store.StatusCompleted {
			t.Fatalf("%s after FinishBatch: %+v, %v", r.Key, brief(rec), err)
		}
	}

	// Ping loads every script on every shard.
	flush()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	hashes := make([]string, len(allScripts))
	for i, sc := range allScripts {
		hashes[i] = sc.Hash()
	}
	for i, c := range shards {
		ok, err := c.ScriptExists(ctx, hashes...).Result()
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		for j, o := range ok {
			if !o {
				missing = append(missing, hashes[j][:8])
			}
		}
		if len(missing) > 0 {
			t.Errorf("after Ping, shard %d lacks the scripts %s", i, strings.Join(missing, ", "))
		}
	}
}
