package queue_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// fakeDelivery records how it was settled.
type fakeDelivery struct {
	m queue.Message

	mu      sync.Mutex
	actions []string
	reason  string
}

func (d *fakeDelivery) Message() queue.Message { return d.m }
func (d *fakeDelivery) Ack(context.Context) error {
	d.record("ack", "")
	return nil
}
func (d *fakeDelivery) Retry(context.Context, time.Duration) error {
	d.record("retry", "")
	return nil
}
func (d *fakeDelivery) Extend(context.Context, time.Duration) error { return nil }
func (d *fakeDelivery) DeadLetter(_ context.Context, reason string) error {
	d.record("dead-letter", reason)
	return nil
}

func (d *fakeDelivery) record(action, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.actions = append(d.actions, action)
	d.reason = reason
}

func (d *fakeDelivery) settled() ([]string, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.actions...), d.reason
}

// A copy over its receives whose key was completed for a different payload
// is a mismatch, dead-lettered, as it is on any earlier receive: not acked
// as "skipped, already done", which would drop a message whose effect never
// happened. (It gets there by waiting busy, its receives used up, while the
// other payload's attempt ran.)
func TestOverMaxReceivesMismatchIsNotAcked(t *testing.T) {
	st := memstore.New()
	l := idem.New(st, idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := func(m queue.Message) (idem.OperationKey, error) { return idem.Key("order", m.Attributes["order"]), nil }
	c, err := queue.NewConsumer(&fakeSource{}, l, key, noop,
		queue.WithMaxReceives(5),
		queue.WithCallOptions(func(m queue.Message) []idem.CallOption { return []idem.CallOption{idem.Fingerprint(m.Body)} }),
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	// Order 42 done for payload A.
	a := &fakeDelivery{m: queue.Message{ID: "a", Body: []byte("A"), Attributes: map[string]string{"order": "42"}, ReceiveCount: 1}}
	c.HandleBatch(context.Background(), []queue.Delivery{a})
	if got, _ := a.settled(); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("payload A: %v, want [ack]", got)
	}
	for _, rc := range []int{1, 5, 6, 9} {
		b := &fakeDelivery{m: queue.Message{ID: "b", Body: []byte("B"), Attributes: map[string]string{"order": "42"}, ReceiveCount: rc}}
		c.HandleBatch(context.Background(), []queue.Delivery{b})
		if got, reason := b.settled(); len(got) != 1 || got[0] != "dead-letter" {
			t.Fatalf("payload B for the same order, receive %d: %v (%q), want [dead-letter] for a mismatch", rc, got, reason)
		}
	}
	// A true copy over its receives is still acked as a replay.
	a2 := &fakeDelivery{m: queue.Message{ID: "a2", Body: []byte("A"), Attributes: map[string]string{"order": "42"}, ReceiveCount: 9}}
	c.HandleBatch(context.Background(), []queue.Delivery{a2})
	if got, reason := a2.settled(); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("a copy of payload A over its receives: %v (%q), want [ack]", got, reason)
	}
}

type fakeSource struct{}

func (*fakeSource) Receive(ctx context.Context, _ int) ([]queue.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (*fakeSource) Visibility() time.Duration { return time.Minute }

// The line of a message whose outcome came as an error (busy here) names
// the attempt that holds the key, as the ledger's own line does: the
// fence and attempt a person debugging "two emails" looks for.
func TestBusyLineNamesTheHoldingAttempt(t *testing.T) {
	st := memstore.New()
	l := idem.New(st, idem.WithLogger(slog.New(slog.DiscardHandler)))
	if _, err := st.Claim(context.Background(), store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: idem.Key("m", "1").String(), Owner: "other",
		Policy: idem.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c, err := queue.NewConsumer(&fakeSource{}, l, queue.MessageIDKey("m"), noop,
		queue.WithLogger(slog.New(slog.NewTextHandler(&buf, debugLevel))))
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDelivery{m: queue.Message{ID: "1", Body: []byte("x"), ReceiveCount: 1}}
	c.HandleBatch(context.Background(), []queue.Delivery{d})
	if got, _ := d.settled(); len(got) != 1 || got[0] != "retry" {
		t.Fatalf("a busy key: %v, want [retry]", got)
	}
	line := buf.String()
	if !strings.Contains(line, "outcome=busy") || !strings.Contains(line, "fence=1") || !strings.Contains(line, "attempt=1") {
		t.Fatalf("busy line without the holding attempt's fence and attempt: %s", line)
	}
}
