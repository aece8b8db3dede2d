package queuetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
)

// receive waits up to wait for at least one delivery.
func receive(t *testing.T, src queue.Source, max int, wait time.Duration) []queue.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ds, err := src.Receive(ctx, max)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive: %v", err)
	}
	return ds
}

// receiveOne waits up to wait for exactly one delivery.
func receiveOne(t *testing.T, src queue.Source, wait time.Duration) queue.Delivery {
	t.Helper()
	ds := receive(t, src, 1, wait)
	if len(ds) != 1 {
		t.Fatalf("Receive(max 1) within %v: %d deliveries, want 1", wait, len(ds))
	}
	return ds[0]
}

// receiveAll collects n deliveries within wait.
func receiveAll(t *testing.T, src queue.Source, n int, wait time.Duration) []queue.Delivery {
	t.Helper()
	deadline := time.Now().Add(wait)
	var all []queue.Delivery
	for len(all) < n && time.Now().Before(deadline) {
		all = append(all, receive(t, src, n-len(all), time.Until(deadline))...)
	}
	if len(all) != n {
		t.Fatalf("received %d deliveries within %v, want %d", len(all), wait, n)
	}
	return all
}

// receiveNone fails if a delivery arrives within wait (and hands it back).
func receiveNone(t *testing.T, src queue.Source, wait time.Duration, why string) {
	t.Helper()
	if ds := receive(t, src, 10, wait); len(ds) > 0 {
		bodies := make([]string, len(ds))
		for i, d := range ds {
			bodies[i] = string(d.Message().Body)
		}
		t.Fatalf("%s: received %q, want nothing within %v", why, bodies, wait)
	}
}

func publish(t *testing.T, p queue.Publisher, o queue.Outgoing) queue.Published {
	t.Helper()
	pub, err := p.Publish(context.Background(), o)
	if err != nil {
		t.Fatalf("Publish(%q): %v", o.Body, err)
	}
	return pub
}

func settle(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// observed wraps a Source and records how each delivery was settled.
type observed struct {
	queue.Source
	mu       sync.Mutex
	received map[string]int // message id -> deliveries
	acked    map[string]int // body -> acks
	counts   map[string]int // action -> settlements
}

func observe(src queue.Source) *observed {
	return &observed{Source: src, received: map[string]int{}, acked: map[string]int{}, counts: map[string]int{}}
}

func (o *observed) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := o.Source.Receive(ctx, max)
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, d := range ds {
		o.received[d.Message().ID]++
		ds[i] = &observedDelivery{Delivery: d, o: o}
	}
	return ds, err
}

// ClaimsFor and ReceiveClaimed pass the fused path of a
// [queue.ClaimingSource] through, so the consumer checks run it too.
func (o *observed) ClaimsFor(s store.Store) bool {
	cs, ok := o.Source.(queue.ClaimingSource)
	return ok && cs.ClaimsFor(s)
}

func (o *observed) ReceiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	ds, claims, err := o.Source.(queue.ClaimingSource).ReceiveClaimed(ctx, max, claim)
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, d := range ds {
		o.received[d.Message().ID]++
		ds[i] = &observedDelivery{Delivery: d, o: o}
	}
	return ds, claims, err
}

func (o *observed) record(action string, d queue.Delivery, err error) {
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	body := string(d.Message().Body)
	if action == "ack" {
		o.acked[body]++
	}
	o.counts[action]++
}

// count returns how many settlements of action there were.
func (o *observed) count(action string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[action]
}

type observedDelivery struct {
	queue.Delivery
	o *observed
}

func (d *observedDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	d.o.record("ack", d.Delivery, err)
	return err
}

func (d *observedDelivery) Retry(ctx context.Context, delay time.Duration) error {
	err := d.Delivery.Retry(ctx, delay)
	d.o.record("retry", d.Delivery, err)
	return err
}

func (d *observedDelivery) Extend(ctx context.Context, by time.Duration) error {
	err := d.Delivery.Extend(ctx, by)
	d.o.record("extend", d.Delivery, err)
	return err
}

func (d *observedDelivery) DeadLetter(ctx context.Context, reason string) error {
	err := d.Delivery.DeadLetter(ctx, reason)
	d.o.record("dead-letter", d.Delivery, err)
	return err
}

// effects counts a handler's effects per key.
type effects struct {
	mu    sync.Mutex
	n     map[string]int
	total int
}

func (e *effects) do(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[key]++
	e.total++
}

func (e *effects) of(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key]
}

func (e *effects) distinct() (keys, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.n), e.total
}

// logs records the consumer's and ledger's log lines.
type logs struct {
	mu    sync.Mutex
	lines []map[string]string
}

func (l *logs) logger() *slog.Logger { return slog.New(&logHandler{l: l}) }

// find returns the lines whose attributes include all of want.
func (l *logs) find(want map[string]string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
next:
	for _, line := range l.lines {
		for k, v := range want {
			if line[k] != v {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

func (l *logs) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := ""
	for _, line := range l.lines {
		s += fmt.Sprintln(line)
	}
	return s
}

type logHandler struct {
	l     *logs
	attrs []slog.Attr
}

func (h *logHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *logHandler) WithGroup(string) slog.Handler            { return h }
func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &logHandler{l: h.l, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	line := map[string]string{"msg": r.Message, "level": r.Level.String()}
	for _, a := range h.attrs {
		line[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { line[a.Key] = a.Value.String(); return true })
	h.l.mu.Lock()
	h.l.lines = append(h.l.lines, line)
	h.l.mu.Unlock()
	return nil
}

// runConsumer runs c until the returned stop is called; stop waits for Run
// to return and fails the test if it returned an error.
func runConsumer(t *testing.T, c *queue.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consumer.Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// eventually polls cond every 10 ms until it holds or wait passes.
func eventually(t *testing.T, wait time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", wait, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
