package dispatch_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/dispatch"
)

type delivery struct{ id, group string }

// loop returns a Loop over deliveries that records what it hands back.
func loop(process func(context.Context, *delivery, *dispatch.Keep[*delivery]) bool) (*dispatch.Loop[*delivery], func() []string) {
	var mu sync.Mutex
	var handedBack []string
	l := &dispatch.Loop[*delivery]{
		Settings: dispatch.Settings{Concurrency: 2, BatchSize: 10, ShutdownTimeout: time.Second},
		Log:      slog.New(slog.DiscardHandler),
		Group:    func(d *delivery) string { return d.group },
		Extend:   func(context.Context, *delivery, time.Duration) error { return nil },
		Process:  process,
		HandBack: func(_ context.Context, d *delivery, why dispatch.HandBackReason) {
			mu.Lock()
			defer mu.Unlock()
			handedBack = append(handedBack, d.id+":"+[]string{"stopping", "stopping-behind", "behind-not-done"}[why])
		},
	}
	return l, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(handedBack) }
}

// The reason a delivery is handed back tells the first one not processed
// of a stopping loop from those behind it in its group, and both from
// those behind a delivery that was not done: the Consumer logs them as
// handed-back and held-back.
func TestHandBackReasons(t *testing.T) {
	l, handedBack := loop(func(_ context.Context, d *delivery, k *dispatch.Keep[*delivery]) bool {
		k.Stop()
		return d.id != "a1"
	})
	l.HandleBatch(context.Background(), []*delivery{{"a1", "a"}, {"b1", ""}, {"a2", "a"}, {"a3", "a"}})
	if got, want := handedBack(), []string{"a2:behind-not-done", "a3:behind-not-done"}; !slices.Equal(got, want) {
		t.Fatalf("handed back %v, want %v", got, want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, handedBack = loop(func(_ context.Context, d *delivery, k *dispatch.Keep[*delivery]) bool {
		k.Stop()
		cancel() // the loop stops while a1 is processed
		return true
	})
	l.Concurrency = 1
	l.HandleBatch(ctx, []*delivery{{"a1", "a"}, {"a2", "a"}, {"a3", "a"}, {"b1", ""}})
	if got, want := handedBack(), []string{"a2:stopping", "a3:stopping-behind", "b1:stopping"}; !slices.Equal(got, want) {
		t.Fatalf("handed back %v, want %v", got, want)
	}
}

type records struct {
	slog.Handler
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }

func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

func (r *records) first() (slog.Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) == 0 {
		return slog.Record{}, false
	}
	return r.recs[0], true
}

// A failed extension is logged with the name the processing gave the
// Keep (the operation key), then the delivery's own attributes, then the
// error.
func TestFailedExtensionLogLine(t *testing.T) {
	logs := &records{Handler: slog.DiscardHandler}
	l, _ := loop(func(_ context.Context, d *delivery, k *dispatch.Keep[*delivery]) bool {
		defer k.Stop()
		k.Name(slog.String("key", "receipt:42"))
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if _, ok := logs.first(); ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		return true
	})
	l.ExtendEvery, l.ExtendBy = 2*time.Millisecond, time.Second
	l.Log = slog.New(logs)
	l.Lines.ExtendFailed = "extending failed"
	l.Extend = func(context.Context, *delivery, time.Duration) error { return errors.New("broker down") }
	l.Attrs = func(d *delivery) []slog.Attr { return []slog.Attr{slog.String("message_id", d.id)} }
	l.HandleBatch(context.Background(), []*delivery{{"m1", ""}})

	rec, ok := logs.first()
	if !ok {
		t.Fatal("no line for the failed extension")
	}
	var got []string
	rec.Attrs(func(a slog.Attr) bool { got = append(got, a.String()); return true })
	want := []string{"key=receipt:42", "message_id=m1", "error=broker down"}
	if rec.Message != "extending failed" || rec.Level != slog.LevelWarn || !slices.Equal(got, want) {
		t.Fatalf("logged %v %q %v, want WARN %q %v", rec.Level, rec.Message, got, "extending failed", want)
	}
}

// Past the bound StopAfter set, work that still runs is no longer
// extended, and that is logged once, with the Keep's name, the delivery's
// attributes and the bound.
func TestStopAfterLogLine(t *testing.T) {
	logs := &records{Handler: slog.DiscardHandler}
	var extends atomic.Int32
	l, _ := loop(func(_ context.Context, d *delivery, k *dispatch.Keep[*delivery]) bool {
		defer k.Stop()
		k.Name(slog.String("key", "receipt:42"))
		k.StopAfter(20 * time.Millisecond)
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if _, ok := logs.first(); ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // ten more extensions would be due
		return true
	})
	l.ExtendEvery, l.ExtendBy = 2*time.Millisecond, time.Second
	l.Log = slog.New(logs)
	l.Lines.ExtendBounded = "no longer extending"
	l.Extend = func(context.Context, *delivery, time.Duration) error { extends.Add(1); return nil }
	l.Attrs = func(d *delivery) []slog.Attr { return []slog.Attr{slog.String("message_id", d.id)} }
	l.HandleBatch(context.Background(), []*delivery{{"m1", ""}})

	rec, ok := logs.first()
	if !ok {
		t.Fatal("no line for the bounded extensions")
	}
	var got []string
	rec.Attrs(func(a slog.Attr) bool { got = append(got, a.String()); return true })
	want := []string{"key=receipt:42", "message_id=m1", "bound=20ms"}
	if rec.Message != "no longer extending" || rec.Level != slog.LevelWarn || !slices.Equal(got, want) {
		t.Fatalf("logged %v %q %v, want WARN %q %v", rec.Level, rec.Message, got, "no longer extending", want)
	}
	logs.mu.Lock()
	n := len(logs.recs)
	logs.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d lines, want 1", n)
	}
	if n := extends.Load(); n > 15 {
		t.Fatalf("%d extensions in 20ms at one per 2ms, then none", n)
	}
}

// A nil Keep, what a loop that does not extend hands out, can be named and
// stopped.
func TestNilKeep(t *testing.T) {
	var k *dispatch.Keep[*delivery]
	k.Name(slog.String("key", "k"))
	k.Stop()
}

func TestExtension(t *testing.T) {
	for _, tc := range []struct{ visibility, every, wantEvery, wantBy time.Duration }{
		{30 * time.Second, 0, 10 * time.Second, 30 * time.Second},
		{30 * time.Second, time.Second, time.Second, 30 * time.Second},
		{0, 0, 0, 0},
		{0, time.Second, time.Second, 3 * time.Second},
	} {
		every, by := dispatch.Extension(tc.visibility, tc.every)
		if every != tc.wantEvery || by != tc.wantBy {
			t.Errorf("Extension(%v, %v) = %v, %v; want %v, %v", tc.visibility, tc.every, every, by, tc.wantEvery, tc.wantBy)
		}
	}
}
