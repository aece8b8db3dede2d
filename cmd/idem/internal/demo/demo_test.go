package demo

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

func TestRun(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		s := memstore.New()
		// A longer lease than the demo's keeps a loaded test machine from
		// lapsing the attempts that did not crash.
		sum, err := Run(context.Background(), Config{Store: s, Seed: seed, Lease: 600 * time.Millisecond})
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
		if sum.Messages != 20+sum.SameID+sum.NewID || sum.AfterCrash != 4 {
			t.Errorf("seed %d: %d messages (%d + %d dups), %d after crash", seed, sum.Messages, sum.SameID, sum.NewID, sum.AfterCrash)
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
				if r.Status != idem.StatusCompleted || r.Attempt != 2 || !r.Journal[1].Takeover || r.Journal[0].Outcome != idem.OutcomeLapsed {
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

func TestRunShiftsKeysOnAUsedStore(t *testing.T) {
	s := memstore.New()
	a, err := Run(context.Background(), Config{Store: s, Orders: 7, Lease: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), Config{Store: s, Orders: 7, Lease: 100 * time.Millisecond})
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
