package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	prefix := newPrefix(t)
	u, _ := url.Parse(withPrefixURL(t, prefix))
	q := u.Query()
	q.Set(ParamKeepExpired, "90m")
	q.Set(ParamWaitReplicas, "0")
	q.Set("pool_size", "3")
	u.RawQuery = q.Encode()
	s, err := Open(ctx, u.String())
	if err != nil {
		t.Fatalf("Open(%s): %v", u, err)
	}
	defer s.Close()
	if s.Prefix() != prefix || s.cfg.keepExpired != 90*time.Minute {
		t.Fatalf("Open: prefix %q keep %v, want %q 90m", s.Prefix(), s.cfg.keepExpired, prefix)
	}
	if o := s.client.(*redis.Client).Options(); o.PoolSize != 3 || !o.ContextTimeoutEnabled {
		t.Fatalf("Open: pool size %d, context timeouts %v; want the URL's 3, and true", o.PoolSize, o.ContextTimeoutEnabled)
	}
	// Options passed to Open win over the URL's.
	s2, err := Open(ctx, u.String(), WithPrefix(prefix+"x:"))
	if err != nil {
		t.Fatal(err)
	}
	if s2.Prefix() != prefix+"x:" {
		t.Fatalf("Open with WithPrefix: prefix %q", s2.Prefix())
	}
	noErr(t, s2.Close())
	noErr(t, s2.Close()) // idempotent
	if _, err := s2.Get(ctx, "k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}

	for _, bad := range []string{
		"redis://127.0.0.1:6379/0?" + ParamKeepExpired + "=soon",
		"redis://127.0.0.1:6379/0?" + ParamWaitReplicas + "=x",
		"redis://127.0.0.1:6379/0?" + ParamWaitReplicas + "=1&" + ParamWaitTimeout + "=-1s",
		"redis://127.0.0.1:6379/0?nonsense=1",
		"http://127.0.0.1:6379/",
	} {
		if s, err := Open(ctx, bad); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded, want an error", bad)
		}
	}
	if s, err := Open(ctx, "redis://127.0.0.1:1/0?dial_timeout=200ms"); err == nil {
		s.Close()
		t.Error("Open of an unreachable server succeeded")
	} else if errors.Is(err, store.ErrNotFound) {
		t.Errorf("Open of an unreachable server: %v", err)
	}
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCorrupt damages each part of a hash the store reads: every call on
// the key reports an *store.CorruptError and writes nothing, but Delete,
// which is how an operator removes it.
func TestCorrupt(t *testing.T) {
	testURL(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		kv   []string // fields to set
		del  string   // a field to delete
	}{
		{name: "status", kv: []string{"st", "bogus"}},
		{name: "policy", kv: []string{"po", "sometimes"}},
		{name: "fence", kv: []string{"f", "x1"}},
		{name: "expiry", kv: []string{"ex", "soon"}},
		{name: "lease", kv: []string{"lu", "1e5"}}, // a number to Lua's tonumber, not to the store
		{name: "journal", kv: []string{"j", "{not json"}},
		{name: "journal_not_array", kv: []string{"j", `{"a":1}`}},
		{name: "journal_bad_time", kv: []string{"j", `[{"a":1,"f":1,"s":"yesterday","l":"2030-01-01T00:00:00Z"}]`}},
		{name: "missing_status", del: "st"},
		{name: "missing_fence", del: "f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, nil)
			cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour})
			noErr(t, err)
			if tc.name == "journal_bad_time" || strings.HasPrefix(tc.name, "journal") {
				// Give the record an explicit journal first, then damage it.
				_, err = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute})
				noErr(t, err)
			}
			c := testClient(t)
			if tc.kv != nil {
				noErr(t, c.HSet(ctx, s.rkey("k"), tc.kv).Err())
			}
			if tc.del != "" {
				noErr(t, c.HDel(ctx, s.rkey("k"), tc.del).Err())
			}
			before, _ := c.HGetAll(ctx, s.rkey("k")).Result()
			wantCorrupt := func(what string, err error) {
				t.Helper()
				var ce *store.CorruptError
				if !errors.As(err, &ce) || ce.Key != "k" {
					t.Fatalf("%s of a record with a damaged %s: %v, want *store.CorruptError for k", what, tc.name, err)
				}
			}
			_, err = s.Get(ctx, "k")
			wantCorrupt("Get", err)
			_, err = s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour, TakeLapsed: true})
			wantCorrupt("Claim", err)
			_, err = s.List(ctx, store.ListQuery{})
			wantCorrupt("List", err)
			_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k", Done: true})
			wantCorrupt("Resolve", err)
			switch tc.name {
			case "policy", "lease", "journal_bad_time":
				// The scripts do not need these to end the attempt; the
				// store refuses to read them.
			default:
				wantCorrupt("Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}))
				_, err = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute})
				wantCorrupt("Extend", err)
				after, _ := c.HGetAll(ctx, s.rkey("k")).Result()
				if fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("a call on a damaged record wrote it:\n before %v\n after  %v", before, after)
				}
			}
			noErr(t, s.Delete(ctx, "k"))
			if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Get after deleting the damaged record: %v", err)
			}
		})
	}
	t.Run("wrong_type", func(t *testing.T) {
		s := newTestStore(t, nil)
		noErr(t, testClient(t).Set(ctx, s.rkey("k"), "a string", time.Hour).Err())
		_, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Lease: time.Minute, Retention: time.Hour})
		if err == nil || errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Claim of a key that is not a hash: %v, want an error", err)
		}
	})
}

// TestCallID runs a write twice with the same call id, as a client's
// retry does: the second run answers what the first did.
func TestCallID(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	keys := []string{s.rkey("k")}
	req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour}
	args := s.claimArgs(req)
	var first store.ClaimResult
	for i := range 2 {
		v, err := scriptClaim.Run(ctx, s.client, keys, args...).Result()
		noErr(t, err)
		cr, err := claimResult(req, v)
		if i == 0 {
			first = cr
		}
		if err != nil || !cr.Acquired || cr.Record.Fence != first.Record.Fence || cr.Record.Attempt != 1 || cr.Record.AttemptID != req.AttemptID {
			t.Fatalf("claim run %d: %+v, %v; want acquired by the first run (fence %d, attempt 1)", i, cr, err, first.Record.Fence)
		}
	}
	if f := first.Record.Fence; f < first.Now.UnixMicro() {
		t.Fatalf("a new record's fence %d is below the clock's %d µs", f, first.Now.UnixMicro())
	}
	fin := store.FinishRequest{Key: "k", Fence: first.Record.Fence, AttemptID: req.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}
	fargs := s.finishArgs(fin)
	for i := range 2 {
		v, err := scriptFinish.Run(ctx, s.client, keys, fargs...).Result()
		noErr(t, err)
		if a, code, _ := reply(v); code != 1 && code != 2 {
			t.Fatalf("complete run %d: %v", i, a)
		}
	}
	// Another call for the same attempt is refused.
	fin.Result = []byte("again")
	if err := s.Finish(ctx, fin); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a second completion: %v, want ErrLeaseLost", err)
	}
}

// TestKeepExpired holds what Redis keeps after a record expires, on the
// real clock.
func TestKeepExpired(t *testing.T) {
	ctx := context.Background()
	c := testClient(t)
	for _, keep := range []time.Duration{0, time.Hour} {
		t.Run(keep.String(), func(t *testing.T) {
			s := newTestStore(t, nil, WithKeepExpired(keep))
			cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour})
			noErr(t, err)
			const ret = 50 * time.Millisecond
			before := time.Now()
			noErr(t, s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: ret}))
			ttl, err := c.PTTL(ctx, s.rkey("k")).Result()
			noErr(t, err)
			// The hash lives keep past the record's expiry, ret after the
			// completion (rounded up to the millisecond): PTTL is at most
			// that, and at least what is left of it when PTTL answered.
			// (On a loaded machine PTTL can come after the record expired,
			// and with keep 0 after the hash is gone: then there is no
			// lower bound to check.)
			hi := keep + ret + 2*time.Millisecond
			if lo := keep + ret - time.Since(before) - time.Millisecond; ttl > hi || lo > 0 && ttl < lo {
				t.Fatalf("PTTL after a completion with %v retention: %v, want between %v and %v", ret, ttl, lo, hi)
			}
			time.Sleep(100 * time.Millisecond)
			if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Get after the retention: %v, want ErrNotFound", err)
			}
			exists, err := c.Exists(ctx, s.rkey("k")).Result()
			noErr(t, err)
			old := cr.Record.Fence
			cr, err = s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour})
			noErr(t, err)
			if keep == 0 {
				// A new record: its fence is the clock's, above the old one's.
				if exists != 0 || cr.Record.Fence <= old || cr.Record.Fence < cr.Now.UnixMicro() || cr.Record.Attempt != 1 {
					t.Fatalf("keep 0: the hash exists %v, the next claim has fence %d attempt %d; want gone, above %d and the clock's %d, attempt 1",
						exists == 1, cr.Record.Fence, cr.Record.Attempt, old, cr.Now.UnixMicro())
				}
				return
			}
			if exists != 1 || cr.Record.Fence != old+1 || !cr.Record.Journal[len(cr.Record.Journal)-1].AfterExpiry {
				t.Fatalf("keep 1h: the hash exists %v, the next claim has fence %d; want kept, %d (after expiry)", exists == 1, cr.Record.Fence, old+1)
			}
		})
	}
}

// TestWait uses WAIT on a server the test expects to have no replicas:
// every write reports that it was not replicated, and a claim that was
// acquired is released again.
func TestWait(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, nil, WithWait(1, 20*time.Millisecond))
	d, err := s.Durability(ctx)
	if err != nil {
		t.Skipf("CONFIG is not available: %v", err)
	}
	if d.Replicas > 0 {
		t.Skipf("the test server has %d replicas", d.Replicas)
	}
	req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour}
	_, err = s.Claim(ctx, req)
	var nr *NotReplicatedError
	if !errors.As(err, &nr) || nr.Want != 1 || nr.Got != 0 {
		t.Fatalf("Claim with WAIT 1 and no replica: %v, want a *NotReplicatedError", err)
	}
	wantStoreErr(t, "Claim not replicated", err)
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusReleased {
		t.Fatalf("after an unconfirmed claim: %+v, %v; want it released", brief(rec), err)
	}
	req.AttemptID = store.NewAttemptID()
	_, err = s.ClaimBatch(ctx, []store.ClaimRequest{req, {AttemptID: store.NewAttemptID(), Key: "k2", Lease: time.Minute, Retention: time.Hour}})
	if !errors.As(err, &nr) {
		t.Fatalf("ClaimBatch with WAIT 1 and no replica: %v", err)
	}
	if rec, err := s.Get(ctx, "k2"); err != nil || rec.Status != store.StatusReleased {
		t.Fatalf("after an unconfirmed batch claim: %+v, %v; want it released", brief(rec), err)
	}

	// With WAIT 0 replicas nothing changes.
	s0 := New(s.client, WithPrefix(s.Prefix()), WithWait(0, time.Second))
	req.AttemptID = store.NewAttemptID()
	cr, err := s0.Claim(ctx, req)
	if err != nil || !cr.Acquired {
		t.Fatal(cr, err)
	}
	err = s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour})
	if !errors.As(err, &nr) {
		t.Fatalf("Complete with WAIT 1 and no replica: %v", err)
	}
	if rec, _ := s.Get(ctx, "k"); rec.Status != store.StatusCompleted {
		t.Fatalf("the unconfirmed completion is on the primary: %s", rec.Status)
	}
}

// TestWaitAbandonsTakeover: a takeover that WAIT could not confirm is not
// released (TestWait's release is for claims of free keys only): the
// lapsed attempt it took over may have done the effect. Released, the key
// would be claimed afresh: an AtMostOnce key would run a second time
// instead of being found indeterminate, and an AtLeastOnce key's next
// claim would not be a takeover. It is abandoned instead, lapsed at once
// (not busy for a lease), with a reason that marks it as not run, so that
// the next caller's Reconcile hook is asked about the attempt before it.
func TestWaitAbandonsTakeover(t *testing.T) {
	ctx := context.Background()
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	sw := New(s.client, WithPrefix(s.Prefix()), WithWait(1, 20*time.Millisecond))
	sw.clock = s.clock
	d, err := s.Durability(ctx)
	if err != nil {
		t.Skipf("CONFIG is not available: %v", err)
	}
	if d.Replicas > 0 {
		t.Skipf("the test server has %d replicas", d.Replicas)
	}
	most := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "most", Owner: "first", Correlation: "c1", Policy: store.AtMostOnce, Lease: time.Minute, Retention: time.Hour}
	least := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "least", Owner: "first", Correlation: "c1", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}
	first := map[string]int64{} // the first attempts' fences
	for _, r := range []store.ClaimRequest{most, least} {
		cr, err := s.Claim(ctx, r)
		if err != nil || !cr.Acquired {
			t.Fatalf("first claim of %s: %+v, %v", r.Key, cr, err)
		}
		first[r.Key] = cr.Record.Fence
	}
	clocks.advance(t, 2*time.Minute) // the first attempts crashed: their leases lapse

	// A reconciling caller takes the AtMostOnce key over (Claim), and a
	// plain claim takes the AtLeastOnce one over (ClaimBatch, with a free
	// key beside it, which is released); WAIT confirms neither.
	take := most
	take.AttemptID, take.Owner, take.Correlation, take.TakeLapsed = store.NewAttemptID(), "reconciler", "c2", true
	_, err = sw.Claim(ctx, take)
	var nr *NotReplicatedError
	if !errors.As(err, &nr) {
		t.Fatalf("takeover with WAIT 1 and no replica: %v, want a *NotReplicatedError", err)
	}
	again := least
	again.AttemptID, again.Owner, again.Correlation = store.NewAttemptID(), "second", "c2"
	free := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "free", Owner: "second", Lease: time.Minute, Retention: time.Hour}
	if _, err := sw.ClaimBatch(ctx, []store.ClaimRequest{again, free}); !errors.As(err, &nr) {
		t.Fatalf("batch takeover with WAIT 1 and no replica: %v, want a *NotReplicatedError", err)
	}
	for _, k := range []string{"most", "least"} {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Status != store.StatusInProgress || rec.Fence != first[k]+1 || rec.AttemptID != "" {
			t.Fatalf("%s after an unconfirmed takeover: %+v, %v; want in_progress at fence %d, its attempt abandoned", k, brief(rec), err, first[k]+1)
		}
		last := rec.Journal[len(rec.Journal)-1]
		if last.Outcome != store.OutcomeAbandoned || !last.NotRun() {
			t.Fatalf("%s's unconfirmed takeover: journal entry %+v; want abandoned, not run", k, last)
		}
	}
	if rec, err := s.Get(ctx, "free"); err != nil || rec.Status != store.StatusReleased || !rec.Journal[len(rec.Journal)-1].NotRun() {
		t.Fatalf("free key after an unconfirmed batch claim: %+v, %v; want it released, not run", brief(rec), err)
	}

	// At once, without the clock moving, the keys are as the crashes left
	// them: the AtMostOnce one indeterminate, the AtLeastOnce one taken
	// over, and a Reconcile hook is asked about the first attempt, the one
	// that may have run.
	most.AttemptID = store.NewAttemptID()
	cr, err := s.Claim(ctx, most)
	if err != nil || cr.Acquired || !cr.Record.Lapsed(cr.Now) {
		t.Fatalf("plain AtMostOnce claim after the unconfirmed takeover: %+v, %v; want not acquired, lapsed (indeterminate)", brief(cr.Record), err)
	}
	l := idem.New(s, idem.WithOwner("third"), idem.WithLogger(slog.New(slog.DiscardHandler)))
	for _, k := range []string{"most", "least"} {
		var asked []idem.Lapsed
		res, err := l.Do(ctx, idem.RawKey(k), func(context.Context) ([]byte, error) { return []byte("ran"), nil },
			idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
				asked = append(asked, lp)
				return nil, false, nil
			}))
		if err != nil || !res.Takeover || res.Fence != first[k]+2 {
			t.Fatalf("%s: the next call after the unconfirmed takeover: %+v, %v; want a takeover at fence %d", k, res, err, first[k]+2)
		}
		if len(asked) != 1 || asked[0].Attempt != 1 || asked[0].Owner != "first" || asked[0].Correlation != "c1" {
			t.Fatalf("%s: the Reconcile hook was asked about %+v; want once, about attempt 1 (first, c1)", k, asked)
		}
	}
}

// TestWaitReleaseNotRun: a claim of a free key that WAIT could not confirm
// is released with a reason that marks it as not run: the next call's
// Reconcile hook is not asked about it (a release with an error would ask
// it).
func TestWaitReleaseNotRun(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, nil)
	sw := New(s.client, WithPrefix(s.Prefix()), WithWait(1, 20*time.Millisecond))
	d, err := s.Durability(ctx)
	if err != nil {
		t.Skipf("CONFIG is not available: %v", err)
	}
	if d.Replicas > 0 {
		t.Skipf("the test server has %d replicas", d.Replicas)
	}
	req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "one", Owner: "first", Lease: time.Minute, Retention: time.Hour}
	var nr *NotReplicatedError
	if _, err := sw.Claim(ctx, req); !errors.As(err, &nr) {
		t.Fatalf("Claim with WAIT 1 and no replica: %v, want a *NotReplicatedError", err)
	}
	req.Key, req.AttemptID = "batch", store.NewAttemptID()
	if _, err := sw.ClaimBatch(ctx, []store.ClaimRequest{req}); !errors.As(err, &nr) {
		t.Fatalf("ClaimBatch with WAIT 1 and no replica: %v, want a *NotReplicatedError", err)
	}
	l := idem.New(s, idem.WithOwner("second"), idem.WithLogger(slog.New(slog.DiscardHandler)))
	for _, k := range []string{"one", "batch"} {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Status != store.StatusReleased || !rec.Journal[len(rec.Journal)-1].NotRun() {
			t.Fatalf("%s after an unconfirmed claim: %+v, %v; want released, not run", k, brief(rec), err)
		}
		var asked []idem.Lapsed
		res, err := l.Do(ctx, idem.RawKey(k), func(context.Context) ([]byte, error) { return []byte("ran"), nil },
			idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
				asked = append(asked, lp)
				return nil, false, nil
			}))
		if err != nil || string(res.Value) != "ran" || res.Fence != rec.Fence+1 {
			t.Fatalf("%s: the next call: %+v, %v; want fn run at fence %d", k, res, err, rec.Fence+1)
		}
		if len(asked) != 0 {
			t.Fatalf("%s: the Reconcile hook was asked about %+v, an attempt that never ran", k, asked)
		}
	}
}

// TestWaitRefusedOnRing: New refuses WithWait on a *redis.Ring, whose
// keyless WAIT would count another shard's replicas than the write's; a
// Ring without WAIT (or with WithWait(0, ...)) is accepted. New contacts
// no server, so the ring's addresses need not answer.
func TestWaitRefusedOnRing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}})
	defer ring.Close()
	newStore := func(opts ...Option) (err any) {
		defer func() { err = recover() }()
		New(ring, opts...)
		return nil
	}
	if got := newStore(WithWait(1, time.Second)); got != ErrWaitOnRing {
		t.Fatalf("New(ring, WithWait(1, 1s)) panicked with %v, want ErrWaitOnRing", got)
	}
	if got := newStore(); got != nil {
		t.Fatalf("New(ring) panicked: %v", got)
	}
	if got := newStore(WithWait(0, time.Second)); got != nil {
		t.Fatalf("New(ring, WithWait(0, 1s)) panicked: %v", got)
	}
}

func TestDurability(t *testing.T) {
	s := newTestStore(t, nil)
	d, err := s.Durability(context.Background())
	if err != nil {
		t.Skipf("CONFIG is not available: %v", err)
	}
	if d.Role == "" || (d.AppendFsync != "always" && d.AppendFsync != "everysec" && d.AppendFsync != "no") {
		t.Fatalf("Durability = %+v", d)
	}
	t.Logf("test server: %v", d)
	if (Durability{AppendOnly: true, AppendFsync: "everysec"}).Durable() || !(Durability{AppendOnly: true, AppendFsync: "always"}).Durable() {
		t.Fatal("Durable is wrong")
	}
}

// countHook counts the round trips a client makes.
type countHook struct{ single, pipelines atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.single.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.pipelines.Add(1); return next(ctx, cmds) }
}

// TestRoundTrips counts the round trips of the store's calls.
func TestRoundTrips(t *testing.T) {
	o, err := redis.ParseURL(testURL(t))
	noErr(t, err)
	client := redis.NewClient(o)
	defer client.Close()
	s := New(client, WithPrefix(newPrefix(t)))
	ctx := context.Background()
	noErr(t, s.Ping(ctx))
	reqs := make([]store.ClaimRequest, 10)
	for i := range reqs {
		reqs[i] = store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: fmt.Sprint("warm", i), Lease: time.Minute, Retention: time.Hour}
	}
	_, err = s.ClaimBatch(ctx, reqs) // connects the pipeline pool's connection
	noErr(t, err)
	h := new(countHook)
	client.AddHook(h)
	for i := range reqs {
		reqs[i].Key = fmt.Sprint("k", i)
	}
	res, err := s.ClaimBatch(ctx, reqs)
	noErr(t, err)
	if h.pipelines.Load() != 1 || h.single.Load() != 0 {
		t.Fatalf("ClaimBatch of 10 keys: %d pipelines and %d commands, want one pipeline", h.pipelines.Load(), h.single.Load())
	}
	h.pipelines.Store(0)
	for _, call := range []func() error{
		func() error {
			_, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "x", Lease: time.Minute, Retention: time.Hour})
			return err
		},
		func() error {
			_, err := s.Extend(ctx, store.ExtendRequest{Key: "k0", Fence: res[0].Record.Fence, AttemptID: res[0].Record.AttemptID, Lease: time.Minute})
			return err
		},
		func() error {
			return s.Finish(ctx, store.FinishRequest{Key: "k0", Fence: res[0].Record.Fence, AttemptID: res[0].Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour})
		},
		func() error {
			return s.Finish(ctx, store.FinishRequest{Key: "k1", Fence: res[1].Record.Fence, AttemptID: res[1].Record.AttemptID, Outcome: store.OutcomeReleased})
		},
		func() error {
			_, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k0", Lease: time.Minute, Retention: time.Hour})
			return err
		},
		func() error { _, err := s.Get(ctx, "k0"); return err },
		func() error { _, err := s.Resolve(ctx, store.ResolveRequest{Key: "k2"}); return err },
		func() error { return s.Delete(ctx, "k3") },
	} {
		h.single.Store(0)
		noErr(t, call())
		if h.single.Load() != 1 || h.pipelines.Load() != 0 {
			t.Fatalf("a call made %d commands and %d pipelines, want one command", h.single.Load(), h.pipelines.Load())
		}
	}
}

// TestPrefixes checks that stores under different prefixes on one server
// do not see each other's records, whatever the keys and prefixes hold.
func TestPrefixes(t *testing.T) {
	ctx := context.Background()
	a := newTestStore(t, nil)
	b := New(testClient(t), WithPrefix(newPrefix(t)+"*?[x]\\"))
	for _, s := range []*Store{a, b} {
		for _, k := range []string{"k", "*", "a:b"} {
			cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: s.Prefix(), Lease: time.Minute, Retention: time.Hour})
			noErr(t, err)
			if s == b {
				noErr(t, s.Finish(ctx, store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Retention: time.Millisecond}))
			}
		}
	}
	recs, err := a.List(ctx, store.ListQuery{})
	noErr(t, err)
	if len(recs) != 3 {
		t.Fatalf("List under %q: %d records, want 3", a.Prefix(), len(recs))
	}
	for _, r := range recs {
		if r.Owner != a.Prefix() {
			t.Fatalf("List under %q returned %q of %q", a.Prefix(), r.Key, r.Owner)
		}
	}
	time.Sleep(5 * time.Millisecond) // b's records expire
	if n, err := a.Sweep(ctx, 100); err != nil || n != 0 {
		t.Fatalf("Sweep under %q: %d, %v; want 0 (its records are live; the expired ones are another prefix's)", a.Prefix(), n, err)
	}
	if n, err := b.Sweep(ctx, 100); err != nil || n != 3 {
		t.Fatalf("Sweep under %q: %d, %v; want 3", b.Prefix(), n, err)
	}
}

// TestContext checks that a call with an ended context does not reach the
// server and says why.
func TestContext(t *testing.T) {
	s := newTestStore(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Lease: time.Minute, Retention: time.Hour})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a cancelled context: %v", err)
	}
	if _, err := s.Get(context.Background(), "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the cancelled claim reached the server: %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer dcancel()
	time.Sleep(time.Millisecond)
	if err := s.Finish(dctx, store.FinishRequest{Key: "k", Fence: 1, AttemptID: "a", Outcome: store.OutcomeCompleted, Retention: time.Hour}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Complete past its deadline: %v", err)
	}
}

// One bad key in a batch fails only that key, at its own index: a corrupt
// record (ErrCorrupt naming it) and a key that holds no hash (the script's
// WRONGTYPE), in ClaimBatch and FinishBatch alike; the batch's other keys
// are claimed and completed. A request FinishBatch refuses (no attempt
// id) fails alone too, unsent.
func TestBatchFailsOnlyTheBadKey(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, nil)
	c := testClient(t)
	held := map[string]store.Record{} // the records of the claims that hold the keys
	for _, k := range []string{"a", "bad", "b"} {
		cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "o", Lease: time.Minute, Retention: time.Hour})
		noErr(t, err)
		held[k] = cr.Record
	}
	noErr(t, c.HSet(ctx, s.rkey("bad"), "st", "bogus").Err())
	noErr(t, c.Set(ctx, s.rkey("str"), "not a hash", 0).Err())
	keys := []string{"a", "bad", "str", "b", "new"}
	wantBad := func(what string, i int, err error) {
		t.Helper()
		var ce *store.CorruptError
		switch keys[i] {
		case "bad":
			if !errors.As(err, &ce) || ce.Key != "bad" {
				t.Fatalf("%s of the corrupt key: %v, want *store.CorruptError for it", what, err)
			}
		case "str":
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("%s of a key holding a string: %v, want its WRONGTYPE", what, err)
			}
		}
	}
	reqs := make([]store.ClaimRequest, len(keys))
	for i, k := range keys {
		reqs[i] = store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "o2", Lease: time.Minute, Retention: time.Hour}
	}
	res, err := s.ClaimBatch(ctx, reqs)
	noErr(t, err)
	for i, r := range res {
		switch keys[i] {
		case "bad", "str":
			wantBad("ClaimBatch", i, r.Err)
			if r.Acquired {
				t.Fatalf("ClaimBatch acquired the bad key %q", keys[i])
			}
		case "new":
			if r.Err != nil || !r.Acquired || r.Record.Key != "new" {
				t.Fatalf("ClaimBatch of a new key beside bad ones: %+v, %v", brief(r.Record), r.Err)
			}
			held["new"] = r.Record
		default:
			if r.Err != nil || r.Acquired || r.Record.Key != keys[i] || r.Record.Owner != "o" {
				t.Fatalf("ClaimBatch of held key %q beside bad ones: acquired %v, %+v, %v; want busy, held by o", keys[i], r.Acquired, brief(r.Record), r.Err)
			}
		}
	}
	cs := make([]store.FinishRequest, len(keys), len(keys)+1)
	for i, k := range keys {
		id := held[k].AttemptID
		if id == "" {
			id = "none" // str: no claim holds it
		}
		cs[i] = store.FinishRequest{Key: k, Fence: max(held[k].Fence, 1), AttemptID: id, Outcome: store.OutcomeCompleted, Result: []byte("r" + k), Retention: time.Hour}
	}
	cs = append(cs, store.FinishRequest{Key: "a", Fence: held["a"].Fence, Outcome: store.OutcomeCompleted})
	errs, err := s.FinishBatch(ctx, cs)
	noErr(t, err)
	if len(errs) != len(cs) || !errors.Is(errs[len(keys)], store.ErrInvalid) {
		t.Fatalf("FinishBatch: %d answers for %d, the one without an attempt id %v; want ErrInvalid", len(errs), len(cs), errs[len(errs)-1])
	}
	for i, e := range errs[:len(keys)] {
		if keys[i] == "bad" || keys[i] == "str" {
			wantBad("FinishBatch", i, e)
			continue
		}
		noErr(t, e)
		if rec, err := s.Get(ctx, keys[i]); err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "r"+keys[i] {
			t.Fatalf("%q after FinishBatch beside bad keys: %+v, %v", keys[i], brief(rec), err)
		}
	}
}
