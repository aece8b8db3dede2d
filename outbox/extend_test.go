package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
)

// TestNewRelayRefusesShortVisibility: an outbox whose visibility is
// shorter than the publish timeout would hand a slow publish's message to
// another relay meanwhile.
func TestNewRelayRefusesShortVisibility(t *testing.T) {
	a := openApp(t, "", time.Second)
	_, err := outbox.NewRelay(a.outbox, &recorder{}, outbox.WithPublishTimeout(2*time.Second))
	if !errors.Is(err, queue.ErrVisibilityTooShort) {
		t.Fatalf("NewRelay with visibility 1s and publish timeout 2s: %v, want ErrVisibilityTooShort", err)
	}
	if _, err := outbox.NewRelay(a.outbox, &recorder{}, outbox.WithPublishTimeout(time.Second)); err != nil {
		t.Fatalf("NewRelay with visibility = publish timeout: %v", err)
	}
}

// slowPublisher takes d per publish.
type slowPublisher struct {
	to queue.Publisher
	d  time.Duration
}

func (s slowPublisher) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	time.Sleep(s.d)
	return s.to.Publish(ctx, m)
}

// TestExtendsWhileWaiting: messages that wait for a publish slot for
// longer than the outbox's visibility are extended meanwhile, so a second
// relay on the same outbox never gets them: each is published once, on
// its first receive.
func TestExtendsWhileWaiting(t *testing.T) {
	const vis = 400 * time.Millisecond
	a := openApp(t, "", vis)
	tg := openTarget(t, "")
	for _, id := range []string{"o1", "o2", "o3", "o4"} {
		a.placeOrder(t, id, true)
	}
	rec := &recorder{to: slowPublisher{tg.q, 250 * time.Millisecond}}
	var log testlog.Buffer
	first, err := outbox.NewRelay(a.outbox, rec, outbox.WithConcurrency(1), outbox.WithBatchSize(4),
		outbox.WithPublishTimeout(vis), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	second, err := outbox.NewRelay(a.outbox, rec, outbox.WithPublishTimeout(vis), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	var firstDone atomic.Bool
	var secondRelayed atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond) // the first relay holds all four
		for !firstDone.Load() {
			n, _ := second.Drain(context.Background())
			secondRelayed.Add(int64(n))
		}
	}()
	n, err := first.Drain(context.Background())
	firstDone.Store(true)
	<-done
	if err != nil || n != 4 || secondRelayed.Load() != 0 {
		t.Fatalf("first relay relayed %d (%v), second %d; want 4 and 0\n%s", n, err, secondRelayed.Load(), log.String())
	}
	if calls := rec.published(); len(calls) != 4 {
		t.Fatalf("%d publishes, want 4\n%s", len(calls), log.String())
	}
	if strings.Contains(log.String(), "receive_count=2") {
		t.Fatalf("a message was received twice:\n%s", log.String())
	}
}
