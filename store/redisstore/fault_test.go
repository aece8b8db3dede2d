package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/tcprelay"
	"github.com/idemkit/idem/store"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// The fault tests break the connection of a store call while it is in
// flight, in the two places it can break:
//
//   - before Redis runs the script: CLIENT KILL of the store's connection
//     while the server holds the call (CLIENT PAUSE WRITE, for a moment);
//   - after Redis ran it, before the answer arrives: a proxy between the
//     store and Redis that drops the answer and closes the connection.
//
// Each runs with go-redis's retries off (the caller gets an error, never
// an outcome, and the record is consistent: the next claim follows the
// policy) and on (the call is run again on a new connection, and the
// call id makes it answer the truth).

// faultStore returns a store on a client of its own with one connection,
// through addr (the test server's address, or a proxy's), sharing t's
// clock with clocks.
func faultStore(t *testing.T, clocks *testClocks, addr, prefix string, retries bool) *Store {
	t.Helper()
	o, err := redis.ParseURL(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	o.Addr = addr
	o.PoolSize, o.MinIdleConns, o.PipelinePoolSize = 1, 0, 1
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	if retries {
		o.MaxRetries = 3
	}
	client := redis.NewClient(o)
	s := New(client, WithPrefix(prefix))
	s.own = true
	s.clock = clocks.get(t)
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// faultRig is one fault test's stores: s, the store under test (see
// faultStore), reaching Redis through px when the test has a relay; check,
// a store on the shared client under the same prefix and clock, to read
// what happened.
type faultRig struct {
	clocks *testClocks
	px     *tcprelay.Relay // nil: s talks to the server directly
	s      *Store
	check  *Store
}

// newFaultRig returns t's stores under a prefix of its own, s with
// go-redis's retries on or off, and through a relay if relay.
func newFaultRig(t *testing.T, retries, relay bool) *faultRig {
	t.Helper()
	f := &faultRig{clocks: new(testClocks)}
	prefix := newPrefix(t)
	addr := serverAddr(t)
	if relay {
		f.px = tcprelay.New(t, addr)
		addr = f.px.Addr()
	}
	f.s = faultStore(t, f.clocks, addr, prefix, retries)
	f.check = New(testClient(t), WithPrefix(prefix))
	f.check.clock = f.clocks.get(t)
	return f
}

// cutBatch runs call, a batch call on f.s, with the relay cutting the
// answers after their first n bytes, once a warm-up batch has connected the
// pipeline pool's connection; it fails t unless the relay cut them.
func (f *faultRig) cutBatch(t *testing.T, n int, call func()) {
	t.Helper()
	if _, err := f.s.ClaimBatch(context.Background(), []store.ClaimRequest{{AttemptID: store.NewAttemptID(), Key: "warm", Lease: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	f.px.CutAnswersAfter(n)
	call()
	if f.px.AnswersCut() != 1 {
		t.Fatal("the relay did not cut the batch's answers")
	}
}

// retryModes are the two ways the fault tests run: with go-redis's
// retries off and on.
var retryModes = []struct {
	name    string
	retries bool
}{{"no_retries", false}, {"retries", true}}

func serverAddr(t *testing.T) string {
	o, err := redis.ParseURL(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return o.Addr
}

// wantStoreErr fails the test unless err is an error that no caller could
// read as an outcome.
func wantStoreErr(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want a store error", what)
	}
	for _, outcome := range []error{idem.ErrInProgress, idem.ErrIndeterminate, idem.ErrMismatch, idem.ErrFailed,
		store.ErrLeaseLost, store.ErrNotFound, store.ErrCorrupt} {
		if errors.Is(err, outcome) {
			t.Fatalf("%s: err = %v reads as the outcome %v", what, err, outcome)
		}
	}
}

var quiet = slog.New(slog.DiscardHandler)

// killDuringCall runs call on s (a store with one connection) and kills
// that connection while Redis holds the call, before it runs: it pauses
// the server's writes (CLIENT PAUSE WRITE) for the moment it takes, so
// other users of the server wait a few milliseconds.
func killDuringCall(t *testing.T, s *Store, call func() error) error {
	t.Helper()
	ctx := context.Background()
	admin := testClient(t)
	id, err := s.client.(*redis.Client).ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 5000, "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			_ = admin.Do(ctx, "CLIENT", "UNPAUSE").Err()
		}
	}
	defer unpause()
	done := make(chan error, 1)
	go func() { done <- call() }()
	deadline := time.Now().Add(4 * time.Second)
	for {
		info, err := admin.Do(ctx, "CLIENT", "LIST", "ID", id).Text()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "flags=b") && strings.Contains(info, "cmd=evalsha") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store's call never reached the paused server: %s", info)
		}
		time.Sleep(time.Millisecond)
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
		t.Fatal(err)
	}
	// With retries, the call comes back on a new connection, held by the
	// pause too: let it run.
	time.Sleep(20 * time.Millisecond)
	unpause()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return after its connection was killed")
		return nil
	}
}

func TestFaultClientKill(t *testing.T) {
	testURL(t)
	for _, mode := range retryModes {
		name, retries := mode.name, mode.retries
		t.Run(name+"/claim", func(t *testing.T) {
			f := newFaultRig(t, retries, false)
			s, check := f.s, f.check
			var cr store.ClaimResult
			req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "killed", Lease: time.Minute, Retention: time.Hour}
			err := killDuringCall(t, s, func() (err error) {
				cr, err = s.Claim(context.Background(), req)
				return err
			})
			if !retries {
				wantStoreErr(t, "Claim whose connection was killed", err)
				// Killed before it ran: the key is as it was.
				if _, err := check.Get(context.Background(), "k"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("after the killed claim: Get = %v, want ErrNotFound", err)
				}
				var n atomic.Int32
				res, err := idem.New(check, idem.WithLogger(quiet)).Do(context.Background(), idem.Key("k"),
					func(context.Context) ([]byte, error) { n.Add(1); return []byte("ok"), nil })
				if err != nil || res.Attempt != 1 || n.Load() != 1 {
					t.Fatalf("Do after the killed claim: %+v, %v (fn ran %d times)", res, err, n.Load())
				}
				return
			}
			if err != nil || !cr.Acquired || cr.Record.Attempt != 1 || cr.Record.AttemptID != req.AttemptID {
				t.Fatalf("Claim retried after its connection was killed: %+v, %v; want acquired, attempt 1", cr, err)
			}
			if rec, err := check.Get(context.Background(), "k"); err != nil || rec.Fence != cr.Record.Fence || rec.Attempt != 1 || rec.AttemptID != req.AttemptID || rec.Owner != "killed" {
				t.Fatalf("after the retried claim: %+v, %v", brief(rec), err)
			}
		})
		for _, p := range []store.Policy{store.AtLeastOnce, store.AtMostOnce} {
			t.Run(name+"/complete/"+p.String(), func(t *testing.T) {
				f := newFaultRig(t, retries, false)
				s, check := f.s, f.check
				ctx := context.Background()
				cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "killed", Policy: p, Lease: time.Minute, Retention: time.Hour})
				if err != nil || !cr.Acquired {
					t.Fatal(cr, err)
				}
				err = killDuringCall(t, s, func() error {
					return s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("sent"), Retention: time.Hour})
				})
				if retries {
					if err != nil {
						t.Fatalf("Complete retried after its connection was killed: %v", err)
					}
					if rec, err := check.Get(ctx, "k"); err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "sent" {
						t.Fatalf("after the retried completion: %+v, %v", brief(rec), err)
					}
					return
				}
				wantStoreErr(t, "Complete whose connection was killed", err)
				followsPolicy(t, f.clocks, check, p, cr.Record)
			})
		}
	}
}

// followsPolicy checks the record of "k" after a completion that did not
// happen: in progress under its lease, busy until it lapses, then taken
// over (AtLeastOnce) or indeterminate (AtMostOnce).
func followsPolicy(t *testing.T, clocks *testClocks, s *Store, p store.Policy, held store.Record) {
	t.Helper()
	ctx := context.Background()
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusInProgress || rec.Fence != held.Fence || len(rec.Result) != 0 {
		t.Fatalf("after the failed completion: %+v, %v; want the claim as it was", brief(rec), err)
	}
	l := idem.New(s, idem.WithLogger(quiet), idem.WithPolicy(p), idem.WithOwner("next"))
	var n atomic.Int32
	fn := func(context.Context) ([]byte, error) { n.Add(1); return []byte("again"), nil }
	if _, err := l.Do(ctx, idem.Key("k"), fn); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Do while the lease runs: %v, want ErrInProgress", err)
	}
	clocks.advance(t, time.Until(rec.LeaseUntil)+time.Minute)
	res, err := l.Do(ctx, idem.Key("k"), fn)
	switch p {
	case store.AtLeastOnce:
		if err != nil || !res.Takeover || res.Fence != held.Fence+1 || n.Load() != 1 {
			t.Fatalf("Do after the lease passed: %+v, %v; want a takeover with fence %d", res, err, held.Fence+1)
		}
	case store.AtMostOnce:
		if !errors.Is(err, idem.ErrIndeterminate) || n.Load() != 0 {
			t.Fatalf("Do after the lease passed: %v (fn ran %d times), want ErrIndeterminate", err, n.Load())
		}
	}
}

func TestFaultAnswerLost(t *testing.T) {
	testURL(t)
	for _, mode := range retryModes {
		name, retries := mode.name, mode.retries
		for _, p := range []store.Policy{store.AtLeastOnce, store.AtMostOnce} {
			t.Run(name+"/claim/"+p.String(), func(t *testing.T) {
				t.Parallel()
				f := newFaultRig(t, retries, true)
				s, check, px := f.s, f.check, f.px
				ctx := context.Background()
				px.DropAnswers(1)
				req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "lost", Policy: p, Lease: time.Minute, Retention: time.Hour}
				cr, err := s.Claim(ctx, req)
				if retries {
					if err != nil || !cr.Acquired || cr.Takeover || cr.Record.Attempt != 1 || cr.Record.AttemptID != req.AttemptID || cr.Record.Owner != "lost" {
						t.Fatalf("Claim whose first answer was lost, retried: %+v, %v; want acquired, attempt 1", cr, err)
					}
					return
				}
				wantStoreErr(t, "Claim whose answer was lost", err)
				// It ran: the claim holds the key (its caller can tell by the
				// attempt id), and nobody runs it.
				rec, err := check.Get(ctx, "k")
				if err != nil || rec.AttemptID != req.AttemptID || rec.Attempt != 1 {
					t.Fatalf("after the claim whose answer was lost: %+v, %v; want held by its attempt %q", brief(rec), err, req.AttemptID)
				}
				followsPolicy(t, f.clocks, check, p, rec)
			})
			t.Run(name+"/complete/"+p.String(), func(t *testing.T) {
				t.Parallel()
				f := newFaultRig(t, retries, true)
				s, check, px := f.s, f.check, f.px
				ctx := context.Background()
				cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "lost", Policy: p, Lease: time.Minute, Retention: time.Hour})
				if err != nil || !cr.Acquired {
					t.Fatal(cr, err)
				}
				px.DropAnswers(1)
				err = s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("sent"), Retention: time.Hour})
				if retries {
					if err != nil {
						t.Fatalf("Complete whose first answer was lost, retried: %v; want nil (it completed)", err)
					}
				} else {
					wantStoreErr(t, "Complete whose answer was lost", err)
				}
				// It ran: duplicates get the result.
				var n atomic.Int32
				res, err := idem.New(check, idem.WithLogger(quiet), idem.WithPolicy(p)).Do(ctx, idem.Key("k"),
					func(context.Context) ([]byte, error) { n.Add(1); return nil, nil })
				if err != nil || !res.Replayed || string(res.Value) != "sent" || n.Load() != 0 {
					t.Fatalf("Do after the completion: %+v, %v; want the result replayed", res, err)
				}
			})
		}
		t.Run(name+"/extend_and_release", func(t *testing.T) {
			t.Parallel()
			f := newFaultRig(t, retries, true)
			s, px := f.s, f.px
			ctx := context.Background()
			cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "lost", Lease: time.Minute, Retention: time.Hour})
			if err != nil || !cr.Acquired {
				t.Fatal(cr, err)
			}
			px.DropAnswers(1)
			until, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Hour})
			if retries != (err == nil) || (err == nil && until.Before(cr.Now.Add(time.Hour))) {
				t.Fatalf("Extend whose first answer was lost: %v, %v", until, err)
			}
			if !retries {
				wantStoreErr(t, "Extend whose answer was lost", err)
			}
			_ = s.client.Ping(ctx).Err() // a new connection, so that the next drop hits the release
			px.DropAnswers(1)
			err = s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "retry"})
			if retries != (err == nil) {
				t.Fatalf("Release whose first answer was lost: %v", err)
			}
			if !retries {
				wantStoreErr(t, "Release whose answer was lost", err)
			}
			rec, err := s.Get(ctx, "k")
			if err != nil || rec.Status != store.StatusReleased || rec.Reason != "retry" {
				t.Fatalf("after the release: %+v, %v", brief(rec), err)
			}
		})
	}
}

// brief is r without its journal, for messages.
func brief(r store.Record) store.Record {
	r.Journal = nil
	return r
}

// A batch whose connection dies after part of its replies arrived (Redis
// ran every script; the store heard only the first answers) returns an
// error and no outcome for any key without retries, and with them the
// truth for every key: the call ids make the re-run answer what the first
// run did (acquired, completed), never busy or lease lost.
func TestFaultBatchCutMidPipeline(t *testing.T) {
	testURL(t)
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	for _, mode := range retryModes {
		name, retries := mode.name, mode.retries
		t.Run(name+"/claim_batch", func(t *testing.T) {
			t.Parallel()
			f := newFaultRig(t, retries, true)
			s, check := f.s, f.check
			ctx := context.Background()
			reqs := make([]store.ClaimRequest, len(keys))
			ids := map[string]string{} // key: the attempt id of its claim in the batch
			for i, k := range keys {
				reqs[i] = store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "cut", Lease: time.Minute, Retention: time.Hour}
				ids[k] = reqs[i].AttemptID
			}
			var (
				res []store.ClaimResult
				err error
			)
			f.cutBatch(t, 70, func() { res, err = s.ClaimBatch(ctx, reqs) }) // about two and a half claim replies
			if !retries {
				wantStoreErr(t, "ClaimBatch cut mid-pipeline", err)
				if res != nil {
					t.Fatalf("ClaimBatch cut mid-pipeline returned results %+v with its error", res)
				}
			} else {
				if err != nil || len(res) != len(keys) {
					t.Fatalf("ClaimBatch cut mid-pipeline, retried: %d results, %v", len(res), err)
				}
				for i, r := range res {
					if !r.Acquired || r.Err != nil || r.Record.Attempt != 1 || r.Record.AttemptID != reqs[i].AttemptID || r.Record.Owner != "cut" {
						t.Fatalf("ClaimBatch cut mid-pipeline, retried: %q: %+v; want acquired by its own claim, attempt 1", keys[i], brief(r.Record))
					}
				}
			}
			// Redis ran every claim: each key is held by it.
			for _, k := range keys {
				if rec, err := check.Get(ctx, k); err != nil || rec.Status != store.StatusInProgress || rec.Attempt != 1 || rec.AttemptID != ids[k] || rec.Owner != "cut" {
					t.Fatalf("%q after the cut batch: %+v, %v", k, brief(rec), err)
				}
			}
		})
		t.Run(name+"/finish_batch", func(t *testing.T) {
			t.Parallel()
			f := newFaultRig(t, retries, true)
			s, check := f.s, f.check
			ctx := context.Background()
			cs := make([]store.FinishRequest, len(keys))
			for i, k := range keys {
				cr, err := check.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "cut", Lease: time.Minute, Retention: time.Hour})
				if err != nil || !cr.Acquired {
					t.Fatal(cr, err)
				}
				cs[i] = store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r" + k), Retention: time.Hour}
			}
			var (
				errs []error
				err  error
			)
			f.cutBatch(t, 20, func() { errs, err = s.FinishBatch(ctx, cs) })
			if !retries {
				wantStoreErr(t, "FinishBatch cut mid-pipeline", err)
				if errs != nil {
					t.Fatalf("FinishBatch cut mid-pipeline returned answers %v with its error", errs)
				}
			} else {
				if err != nil || len(errs) != len(keys) {
					t.Fatalf("FinishBatch cut mid-pipeline, retried: %v, %v", errs, err)
				}
				for i, e := range errs {
					if e != nil {
						t.Fatalf("FinishBatch cut mid-pipeline, retried: %q: %v, want nil (it completed)", keys[i], e)
					}
				}
			}
			for _, k := range keys {
				if rec, err := check.Get(ctx, k); err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "r"+k {
					t.Fatalf("%q after the cut batch: %+v, %v", k, brief(rec), err)
				}
			}
		})
	}
}
