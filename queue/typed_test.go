package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

type receipt struct {
	OrderID string `json:"order_id"`
	UserID  string `json:"user_id"`
}

func receiptKey(r receipt) (idem.OperationKey, error) {
	if r.OrderID == "" {
		return idem.OperationKey{}, errors.New("no order_id")
	}
	return idem.Key("receipt", r.OrderID, r.UserID), nil
}

// countingSource counts the deliveries it hands out.
type countingSource struct {
	queue.Source
	n atomic.Int64
}

func (s *countingSource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	s.n.Add(int64(len(ds)))
	return ds, err
}

// typedWorld is a memqueue and a typed consumer of receipts over it whose
// decodes and handler calls are counted.
type typedWorld struct {
	q       *memqueue.Queue
	src     *countingSource
	c       *queue.Consumer
	log     *bytes.Buffer
	decodes atomic.Int64
	mu      sync.Mutex
	handled []receipt
}

func newTypedWorld(t *testing.T, opts ...queue.Option) *typedWorld {
	t.Helper()
	w := &typedWorld{q: memqueue.New(), log: new(bytes.Buffer)}
	w.src = &countingSource{Source: w.q}
	decode := func(m queue.Message) (receipt, error) {
		w.decodes.Add(1)
		return queue.JSON[receipt](m)
	}
	handle := func(ctx context.Context, k idem.OperationKey, r receipt) ([]byte, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.handled = append(w.handled, r)
		if want, _ := receiptKey(r); k != want {
			t.Errorf("handler of %+v got key %v, want %v", r, k, want)
		}
		return []byte("sent " + r.OrderID), nil
	}
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, w.log}, debugLevel))
	opts = append([]queue.Option{queue.WithLogger(log), queue.WithBackoff(time.Millisecond, time.Millisecond),
		queue.WithBusyDelay(time.Millisecond)}, opts...)
	c, err := queue.NewTypedConsumer(w.src, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		decode, receiptKey, handle, opts...)
	if err != nil {
		t.Fatal(err)
	}
	w.c = c
	return w
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *typedWorld) publish(t *testing.T, body string) {
	t.Helper()
	if _, err := w.q.Publish(context.Background(), queue.Outgoing{Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
}

// handleAll receives and handles batches until the queue is empty (a
// message retried as busy comes back a millisecond later).
func (w *typedWorld) handleAll(t *testing.T) {
	t.Helper()
	for {
		if ready, held := w.q.Len(); ready+held == 0 {
			return
		}
		ds, err := w.src.Receive(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		w.c.HandleBatch(context.Background(), ds)
	}
}

// One decode per delivery gives both the key and the handler's value; a
// duplicate is decoded for its key and replayed without the handler.
func TestTypedConsumerDecodesOncePerDelivery(t *testing.T) {
	w := newTypedWorld(t)
	w.publish(t, `{"order_id":"42","user_id":"alice"}`)
	w.publish(t, `{"order_id":"42","user_id":"alice"}`) // the producer retried
	w.publish(t, `{"order_id":"43","user_id":"bob"}`)
	w.handleAll(t)

	// The duplicate comes back once more if it ran beside the first copy
	// (busy): still one decode per delivery.
	if n, d := w.decodes.Load(), w.src.n.Load(); n != d || d < 3 {
		t.Fatalf("%d decodes for %d deliveries; want one each, at least 3", n, d)
	}
	slices.SortFunc(w.handled, func(a, b receipt) int { return strings.Compare(a.OrderID, b.OrderID) })
	want := []receipt{{"42", "alice"}, {"43", "bob"}}
	if fmt.Sprint(w.handled) != fmt.Sprint(want) {
		t.Fatalf("handled %v, want %v", w.handled, want)
	}
	if ready, held := w.q.Len(); ready+held != 0 || len(w.q.DeadLetters()) != 0 {
		t.Fatalf("ready %d held %d dead %v; want every message acked", ready, held, w.q.DeadLetters())
	}
	if got := strings.Count(w.log.String(), "outcome=replayed"); got != 1 {
		t.Fatalf("%d replayed lines, want 1; log:\n%s", got, w.log)
	}
}

// A body the decode refuses is dead-lettered at once, cause undecodable,
// and its handler does not run.
func TestTypedConsumerDeadLettersUndecodable(t *testing.T) {
	w := newTypedWorld(t)
	w.publish(t, `{"order_id":`)
	w.handleAll(t)
	dl := w.q.DeadLetters()
	if len(dl) != 1 || !strings.Contains(dl[0].Reason, "undecodable") || !strings.Contains(dl[0].Reason, "decoding: unexpected end of JSON input") {
		t.Fatalf("dead letters %+v; want the message, undecodable with the JSON error", dl)
	}
	if len(w.handled) != 0 || w.decodes.Load() != 1 {
		t.Fatalf("handled %v after %d decodes; want no handler call after 1", w.handled, w.decodes.Load())
	}
	if !strings.Contains(w.log.String(), "cause=undecodable") {
		t.Fatalf("no cause=undecodable in the log:\n%s", w.log)
	}
}

// A decoded value whose key cannot be computed is dead-lettered with the
// key function's error, never dropped, and its handler does not run.
func TestTypedConsumerDeadLettersKeyError(t *testing.T) {
	w := newTypedWorld(t)
	w.publish(t, `{"user_id":"alice"}`)
	w.handleAll(t)
	dl := w.q.DeadLetters()
	if len(dl) != 1 || !strings.Contains(dl[0].Reason, "key of the decoded value: no order_id") {
		t.Fatalf("dead letters %+v; want the message with the key error", dl)
	}
	if len(w.handled) != 0 {
		t.Fatalf("handled %v; want no handler call", w.handled)
	}
}

// A typed handler's errors mean what an untyped handler's do: Undecodable
// dead-letters, a panic is retried.
func TestTypedConsumerHandlerErrors(t *testing.T) {
	q := memqueue.New()
	var calls atomic.Int32
	c, err := queue.NewTypedConsumer(q, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.JSON[receipt], receiptKey,
		func(ctx context.Context, k idem.OperationKey, r receipt) ([]byte, error) {
			calls.Add(1)
			switch r.UserID {
			case "panic":
				panic("nil map")
			case "bad":
				return nil, queue.Undecodable(errors.New("no such user"))
			}
			return nil, nil
		}, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{`{"order_id":"1","user_id":"bad"}`, `{"order_id":"2","user_id":"panic"}`} {
		if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.Receive(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	c.HandleBatch(context.Background(), ds)
	if dl := q.DeadLetters(); len(dl) != 1 || !strings.Contains(dl[0].Reason, "no such user") {
		t.Fatalf("dead letters %+v; want order 1's", dl)
	}
	if _, held := q.Len(); held != 1 || calls.Load() != 2 {
		t.Fatalf("held %d after %d calls; want order 2 retried after both ran", held, calls.Load())
	}
}

// Under Run with concurrent handlers and duplicates, every delivery is
// decoded once and every key handled once (run with -race).
func TestTypedConsumerConcurrent(t *testing.T) {
	w := newTypedWorld(t, queue.WithConcurrency(8), queue.WithBatchSize(10))
	const orders, copies = 50, 3
	for range copies {
		for i := range orders {
			w.publish(t, fmt.Sprintf(`{"order_id":"%d","user_id":"alice"}`, i))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.c.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if ready, held := w.q.Len(); ready+held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("messages not all done after 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, d := w.decodes.Load(), w.src.n.Load(); n != d {
		t.Fatalf("%d decodes for %d deliveries; want one each", n, d)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range w.handled {
		if seen[r.OrderID] {
			t.Fatalf("order %s handled twice", r.OrderID)
		}
		seen[r.OrderID] = true
	}
	if len(seen) != orders || len(w.q.DeadLetters()) != 0 {
		t.Fatalf("%d orders handled, %d dead letters; want %d and none", len(seen), len(w.q.DeadLetters()), orders)
	}
}

func TestNewTypedConsumerChecks(t *testing.T) {
	l := idem.New(memstore.New())
	q := memqueue.New()
	h := func(context.Context, idem.OperationKey, receipt) ([]byte, error) { return nil, nil }
	if _, err := queue.NewTypedConsumer(q, l, nil, receiptKey, h); err == nil {
		t.Fatal("NewTypedConsumer(nil decode): no error")
	}
	if _, err := queue.NewTypedConsumer(q, l, queue.JSON[receipt], nil, h); err == nil {
		t.Fatal("NewTypedConsumer(nil key): no error")
	}
	if _, err := queue.NewTypedConsumer[receipt](q, l, queue.JSON[receipt], receiptKey, nil); err == nil {
		t.Fatal("NewTypedConsumer(nil handler): no error")
	}
	_, err := queue.NewTypedConsumer(memqueue.New(memqueue.WithVisibility(time.Minute)), l, queue.JSON[receipt], receiptKey, h,
		queue.WithHandlerTimeout(2*time.Minute))
	if !errors.Is(err, queue.ErrVisibilityTooShort) {
		t.Fatalf("visibility 1m, handler timeout 2m: %v, want ErrVisibilityTooShort", err)
	}
}

func TestJSON(t *testing.T) {
	r, err := queue.JSON[receipt](queue.Message{Body: []byte(`{"order_id":"42","user_id":"alice","extra":1}`)})
	if err != nil || r != (receipt{"42", "alice"}) {
		t.Fatalf("JSON = %+v, %v", r, err)
	}
	if _, err := queue.JSON[receipt](queue.Message{Body: []byte("nope")}); err == nil {
		t.Fatal("JSON of a non-JSON body: no error")
	}
}
