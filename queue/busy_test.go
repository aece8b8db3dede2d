package queue_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// The busy wait starts short, grows with the receive count and with how
// long the holder has run, stays under the busy delay, and never passes the
// holder's lease.
func TestBusyWait(t *testing.T) {
	src := memqueue.New()
	c, err := queue.NewConsumer(src, idem.New(memstore.New()), queue.MessageIDKey("m"), noop, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	small, err := queue.NewConsumer(src, idem.New(memstore.New()), queue.MessageIDKey("m"), noop,
		queue.WithBusyDelay(10*time.Millisecond), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c                          *queue.Consumer
		receive                    int
		running, leaseLeft, lo, hi time.Duration
	}{
		{c, 1, 0, 0, 12 * time.Millisecond, 25 * time.Millisecond},
		{c, 1, 0, 30 * time.Second, 12 * time.Millisecond, 25 * time.Millisecond},
		{c, 2, 0, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		{c, 3, 0, 0, 200 * time.Millisecond, 400 * time.Millisecond},
		{c, 4, 0, 0, 800 * time.Millisecond, 1600 * time.Millisecond},
		{c, 5, 0, 0, 2500 * time.Millisecond, 5 * time.Second},
		{c, 1000, 0, 0, 2500 * time.Millisecond, 5 * time.Second},
		{c, 1, 2 * time.Second, 0, time.Second, 2 * time.Second},       // as long as the holder has run
		{c, 1, time.Hour, 0, 2500 * time.Millisecond, 5 * time.Second}, // at most the busy delay
		{c, 5, 0, 300 * time.Millisecond, 0, 300 * time.Millisecond},   // never past the lease
		{c, 1, time.Hour, time.Millisecond, time.Millisecond, time.Millisecond},
		{small, 1, 0, 0, 5 * time.Millisecond, 10 * time.Millisecond}, // WithBusyDelay bounds the first wait too
		{small, 9, time.Hour, 0, 5 * time.Millisecond, 10 * time.Millisecond},
	} {
		for range 50 {
			if d := queue.BusyWait(tc.c, tc.receive, tc.running, tc.leaseLeft); d < tc.lo || d > tc.hi {
				t.Fatalf("receive %d, running %v, lease left %v: wait %v, want within [%v, %v]",
					tc.receive, tc.running, tc.leaseLeft, d, tc.lo, tc.hi)
			}
		}
	}
}

// lines collects the consumer's per-message lines.
type lines struct {
	mu   sync.Mutex
	recs []slog.Record
	more chan struct{}
}

func newLines() *lines { return &lines{more: make(chan struct{}, 1)} }

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	select {
	case l.more <- struct{}{}:
	default:
	}
	return nil
}

// count returns how many lines have message msg, and their delay
// attributes.
func (l *lines) count(msg string) (n int, delays []time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Message != msg {
			continue
		}
		n++
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "delay" {
				delays = append(delays, a.Value.Duration())
			}
			return true
		})
	}
	return n, delays
}

// waitFor waits until there are n lines with message msg, or fails.
func (l *lines) waitFor(t *testing.T, ctx context.Context, msg string, n int) {
	t.Helper()
	for {
		if got, _ := l.count(msg); got >= n {
			return
		}
		select {
		case <-l.more:
		case <-ctx.Done():
			got, _ := l.count(msg)
			t.Fatalf("%d %q lines, want %d", got, msg, n)
		}
	}
}

type source interface {
	queue.Source
	queue.Publisher
}

// quickDuplicate publishes two copies of one operation, runs a consumer
// whose handler holds the key for hold, and returns how long it took
// until both were acked (one executed, the other replayed after finding
// the key busy).
func quickDuplicate(t *testing.T, q source, l *idem.Ledger, hold time.Duration) (took time.Duration, busy int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 2 {
		if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("order-1")}); err != nil {
			t.Fatal(err)
		}
	}
	log := newLines()
	c, err := queue.NewConsumer(q, l, func(m queue.Message) (idem.OperationKey, error) { return idem.Key("order", string(m.Body)), nil },
		func(context.Context, queue.Message) ([]byte, error) { time.Sleep(hold); return nil, nil },
		queue.WithLogger(slog.New(log)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	began := time.Now()
	go func() { defer close(done); c.Run(runCtx) }()
	log.waitFor(t, ctx, "queue message executed", 1)
	log.waitFor(t, ctx, "queue message replayed", 1)
	took = time.Since(began)
	stop()
	<-done
	busy, _ = log.count("queue message busy")
	return took, busy
}

// A duplicate whose holder is done in 50 ms is acked in well under the 5 s
// busy delay, on memqueue and on sqlqueue (SQLite, in the ledger's file).
func TestQuickDuplicateIsAckedSoon(t *testing.T) {
	const hold = 50 * time.Millisecond
	quiet := slog.New(slog.DiscardHandler)
	t.Run("memqueue", func(t *testing.T) {
		took, busy := quickDuplicate(t, memqueue.New(), idem.New(memstore.New(), idem.WithLogger(quiet)), hold)
		t.Logf("both copies acked %v after start (holder holds %v; %d busy retries)", took, hold, busy)
		if busy == 0 || took > time.Second {
			t.Fatalf("both copies acked after %v with %d busy retries; want a busy retry and well under the %v busy delay", took, busy, queue.DefaultBusyDelay)
		}
	})
	t.Run("sqlqueue", func(t *testing.T) {
		st, queues := embedded(t, sqlitestore.WithLogger(quiet))
		q, err := queues.Queue("orders")
		if err != nil {
			t.Fatal(err)
		}
		took, busy := quickDuplicate(t, q, idem.New(st, idem.WithLogger(quiet)), hold)
		t.Logf("both copies acked %v after start (holder holds %v; %d busy retries)", took, hold, busy)
		if busy == 0 || took > time.Second {
			t.Fatalf("both copies acked after %v with %d busy retries; want a busy retry and well under the %v busy delay", took, busy, queue.DefaultBusyDelay)
		}
	})
}

// A holder that runs for 2 s, under a 1 s lease it keeps extending, is
// looked at a handful of times, never past its lease's end, and its
// duplicate is acked soon after it is done.
func TestLongHolderIsNotHammered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const (
		hold  = 2 * time.Second
		lease = time.Second
	)
	q := memqueue.New()
	for range 2 {
		if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("order-1")}); err != nil {
			t.Fatal(err)
		}
	}
	log := newLines()
	var finished time.Time
	var mu sync.Mutex
	l := idem.New(memstore.New(), idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	c, err := queue.NewConsumer(q, l, func(m queue.Message) (idem.OperationKey, error) { return idem.Key("order", string(m.Body)), nil },
		func(context.Context, queue.Message) ([]byte, error) {
			time.Sleep(hold)
			mu.Lock()
			finished = time.Now()
			mu.Unlock()
			return nil, nil
		}, queue.WithLogger(slog.New(log)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(runCtx) }()
	log.waitFor(t, ctx, "queue message replayed", 1)
	acked := time.Now()
	stop()
	<-done
	busy, delays := log.count("queue message busy")
	mu.Lock()
	after := acked.Sub(finished)
	mu.Unlock()
	t.Logf("%d busy retries over a %v hold, delays %v; duplicate acked %v after the holder finished", busy, hold, delays, after)
	if busy < 2 || busy > 8 {
		t.Fatalf("%d busy retries over a %v hold (delays %v), want a handful (2 to 8)", busy, hold, delays)
	}
	for _, d := range delays {
		// On its last two receives a message looks again just after the
		// lease ends (up to 25 ms of jitter past it).
		if d > lease+25*time.Millisecond {
			t.Fatalf("a busy delay %v passes the holder's lease (%v): delays %v", d, lease, delays)
		}
	}
	if after > lease+200*time.Millisecond {
		t.Fatalf("the duplicate was acked %v after the holder finished, want within its lease (%v)", after, lease)
	}
}
