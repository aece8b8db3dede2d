package demo

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

func TestRun(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		s := memstore.New()
		// A longer lease than the demo's keeps a loaded test machine from
		// lapsing the attempts that did not crash (at 600 ms, two did
		// while three CI runs shared the machine). A run takes about
		// twice its lease.
		sum, err := Run(context.Background(), Config{Store: s, Seed: seed, Lease: testLease})
		if err != nil {
			t.Fatal(err)
		}
		if err := sum.Check(); err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
		if sum.Orders != 20 || len(sum.Keys) != 20 || sum.Sent != 21 {
			t.Errorf("seed %d: %d orders, %d keys, %d sent", seed, sum.Orders, len(sum.Keys), sum.Sent)
		}
		if sum.Sends[sum.CrashedAtLeastOnce] != 2 || sum.Sends[sum.CrashedAtMostOnce] != 1 {
			t.Errorf("seed %d: crashed keys sent %d and %d times", seed, sum.Sends[sum.CrashedAtLeastOnce], sum.Sends[sum.CrashedAtMostOnce])
		}
		if sum.Published != 20+sum.Reenqueued+2 || sum.AfterCrash != 4 {
			t.Errorf("seed %d: %d messages published (20 jobs + %d re-enqueued + 2 after the crashes), %d after crash", seed, sum.Published, sum.Reenqueued, sum.AfterCrash)
		}
		if sum.CrashReenqueued != 2 || sum.Executed != 18 || sum.IndeterminateDeadLettered != 2 || len(sum.Other) != 0 {
			t.Errorf("seed %d: %d enqueued again after the crashes, %d sent, %d refused and dead-lettered, other outcomes %v",
				seed, sum.CrashReenqueued, sum.Executed, sum.IndeterminateDeadLettered, sum.Other)
		}
		if sum.Redelivered < 2 {
			t.Errorf("seed %d: %d redeliveries, want at least the 2 crashed messages handed out again", seed, sum.Redelivered)
		}
		if len(sum.DeadLettered) != 2 {
			t.Errorf("seed %d: dead-lettered %v, want the AtMostOnce key's message and its re-enqueue", seed, sum.DeadLettered)
		}
		if sum.Replayed == 0 {
			t.Errorf("seed %d: no duplicate suppressed", seed)
		}
		// The stores' records agree: the AtMostOnce key is indeterminate,
		// the AtLeastOnce key was taken over, every other key completed once.
		ctx := context.Background()
		now, _ := s.Now(ctx)
		for _, k := range sum.Keys {
			r, err := s.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			switch k {
			case sum.CrashedAtMostOnce:
				if r.Status != idem.StatusInProgress || r.Policy != idem.AtMostOnce || !r.Lapsed(now) {
					t.Errorf("%s: %s %s", k, r.Status, r.Policy)
				}
			case sum.CrashedAtLeastOnce:
				if r.Status != idem.StatusCompleted || r.Attempt != 2 || !r.Journal[1].Takeover || r.Journal[0].Outcome != store.OutcomeLapsed {
					t.Errorf("%s: %+v", k, r)
				}
			default:
				if r.Status != idem.StatusCompleted || r.Attempt != 1 {
					t.Errorf("%s: %s, attempt %d", k, r.Status, r.Attempt)
				}
			}
		}
		if len(sum.Crashes) != 2 || !strings.Contains(sum.Crashes[0], "at_least_once") {
			t.Errorf("crashes: %v", sum.Crashes)
		}
	}
}

// testLease is the lease of the tests' runs: more than the demo's 300 ms,
// so that only the injected crashes lapse on a loaded machine.
const testLease = 1200 * time.Millisecond

func TestRunShiftsKeysOnAUsedStore(t *testing.T) {
	s := memstore.New()
	a, err := Run(context.Background(), Config{Store: s, Orders: 7, Lease: testLease})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), Config{Store: s, Orders: 7, Lease: testLease})
	if err != nil {
		t.Fatal(err)
	}
	if a.Keys[0] == b.Keys[0] {
		t.Errorf("second run reused key %s", a.Keys[0])
	}
	if err := b.Check(); err != nil {
		t.Error(err)
	}
}

func TestCheckCatchesADoubleSend(t *testing.T) {
	s := &Summary{Orders: 2, Keys: []string{"a", "b"}, Sends: map[string]int{"a": 2, "b": 1}, Sent: 3,
		CrashedAtLeastOnce: "b", TakeoverKeys: []string{"b"}, Indeterminate: 1, Crashes: []string{"x", "y"}}
	err := s.Check()
	if err == nil || !strings.Contains(err.Error(), "a sent 2 times, want 1") || !strings.Contains(err.Error(), "b sent 1 times, want 2") {
		t.Errorf("Check = %v", err)
	}
}

func TestRunValidates(t *testing.T) {
	if _, err := Run(context.Background(), Config{}); err == nil {
		t.Error("no store accepted")
	}
	if _, err := Run(context.Background(), Config{Store: memstore.New(), Orders: 3}); err == nil {
		t.Error("3 orders accepted")
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, Config{Store: memstore.New(), Orders: 200, SendTime: 50 * time.Millisecond})
	if err == nil {
		t.Fatal("no error after cancel")
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("took %v to stop", time.Since(start))
	}
}

// On the embedded default the jobs go through sqlqueue in the store's own
// file: the AtMostOnce key's messages end in its dead-letter table.
func TestRunOnSQLiteQueuesInTheStoresFile(t *testing.T) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sum, err := Run(ctx, Config{Store: s, Lease: testLease})
	if err != nil {
		t.Fatal(err)
	}
	if err := sum.Check(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sum.Queue, "sqlqueue ") {
		t.Fatalf("queue %q, want sqlqueue", sum.Queue)
	}
	h, err := sqlqueue.NewSQLite(ctx, s.DB(), sqlqueue.WithGroupCommit(s))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	q, err := h.Queue("receipts-1001")
	if err != nil {
		t.Fatal(err)
	}
	dead, err := q.DeadLetters(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 2 {
		t.Fatalf("%d dead letters in sqlqueue, want the AtMostOnce job and its re-enqueue: %+v", len(dead), dead)
	}
	for _, d := range dead {
		if !strings.Contains(string(d.Message.Body), `"orderId":1007`) || !strings.Contains(d.Reason, "indeterminate") {
			t.Errorf("dead letter %s: %q, want order 1007 refused as indeterminate", d.Message.Body, d.Reason)
		}
	}
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready+st.InFlight+st.Delayed != 0 {
		t.Errorf("the queue still holds messages after the run: %+v", st)
	}
}

// Check fails a run whose printed counts do not add up.
func TestCheckCatchesCountsThatDoNotAddUp(t *testing.T) {
	s := &Summary{Orders: 2, Keys: []string{"a", "b"}, Sends: map[string]int{"a": 1, "b": 2}, Sent: 3,
		CrashedAtLeastOnce: "b", TakeoverKeys: []string{"b"}, Takeovers: 1, Indeterminate: 1, Crashes: []string{"x", "y"},
		Published: 6, Reenqueued: 1, CrashReenqueued: 2, Executed: 1, Deliveries: 6, Redelivered: 2}
	err := s.Check()
	for _, want := range []string{
		"6 messages published, want 2 jobs + 1 enqueued again + 2 enqueued again after a crash",
		"6 deliveries, want 6 messages + 2 delivered again",
		"3 emails sent, want 2 by the crashed workers + 1 sent + 1 sent again",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %v, want %q", err, want)
		}
	}
}
