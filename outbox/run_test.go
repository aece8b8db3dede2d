package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// TestRunRelaysUntilStopped: Run relays messages as they are written;
// when its context ends it lets a publish under way finish and acks it,
// then returns nil.
func TestRunRelaysUntilStopped(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	started := make(chan struct{}, 10)
	rec := &recorder{to: tg.q, fail: func(m queue.Outgoing, _ int) error {
		if string(m.Body) == "order placed slow" {
			started <- struct{}{}
			time.Sleep(300 * time.Millisecond)
		}
		return nil
	}}
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for _, id := range []string{"o1", "o2", "o3"} {
		a.placeOrder(t, id, true)
	}
	waitFor(t, 10*time.Second, "three messages at the target", func() bool { return stats(t, tg.q).Ready == 3 })
	a.placeOrder(t, "slow", true)
	<-started
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if st := stats(t, a.outbox); st != (sqlqueue.Stats{Queue: "outbox"}) {
		t.Fatalf("outbox after Run: %+v, want empty (the slow publish finished and was acked)", st)
	}
	if st := stats(t, tg.q); st.Ready != 4 {
		t.Fatalf("target: %+v, want 4 ready", st)
	}
}

// TestRunShutdownTimeout: a publish still under way at the shutdown
// timeout is cancelled and its message handed back to the outbox, ready
// for the next relay at once.
func TestRunShutdownTimeout(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	started := make(chan struct{}, 1)
	hang := publisherFunc(func(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
		started <- struct{}{}
		<-ctx.Done()
		return queue.Published{}, ctx.Err()
	})
	r, err := outbox.NewRelay(a.outbox, hang, outbox.WithShutdownTimeout(100*time.Millisecond), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	a.placeOrder(t, "o1", true)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-started
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := stats(t, a.outbox); st.Ready != 1 {
		t.Fatalf("outbox after the shutdown timeout: %+v, want the message ready again", st)
	}
	r2, err := outbox.NewRelay(a.outbox, tg.q, outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r2.Drain(t.Context()); n != 1 || err != nil {
		t.Fatalf("the next relay's Drain = %d, %v; want 1, nil", n, err)
	}
}

type publisherFunc func(ctx context.Context, m queue.Outgoing) (queue.Published, error)

func (f publisherFunc) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	return f(ctx, m)
}

// TestHungPublishLetsTheMessageGo: a publisher that ignores its context
// and never returns no longer holds its message for good. Once the
// publish timeout (and a second more) has passed the message is no longer
// extended, its visibility lapses, and a healthy relay publishes it.
// Before, the hung relay extended it for as long as the publish hung.
func TestHungPublishLetsTheMessageGo(t *testing.T) {
	a := openApp(t, "", 600*time.Millisecond)
	tg := openTarget(t, "")
	a.placeOrder(t, "o1", true)
	release := make(chan struct{})
	defer close(release)
	hung := publisherFunc(func(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
		<-release // ignores ctx
		return queue.Published{}, errors.New("late")
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r1, err := outbox.NewRelay(a.outbox, hung, outbox.WithPublishTimeout(200*time.Millisecond), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	go r1.Run(ctx)
	waitFor(t, 5*time.Second, "the hung relay to take the message", func() bool { return stats(t, a.outbox).InFlight == 1 })
	r2, err := outbox.NewRelay(a.outbox, tg.q, outbox.WithPublishTimeout(200*time.Millisecond), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	relayed := 0
	waitFor(t, 10*time.Second, "a healthy relay to publish the message", func() bool {
		n, err := r2.Drain(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		relayed += n
		return relayed == 1
	})
	if st := stats(t, tg.q); st.Ready != 1 {
		t.Fatalf("target: %+v, want the message once", st)
	}
}
