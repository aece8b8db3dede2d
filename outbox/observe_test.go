package outbox_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testobserve"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
)

// The relay reports each message published (with its age) and each
// publish refused, with why.
func TestRelayReportsToItsObserver(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	a.placeOrder(t, "fine", true)
	a.placeOrder(t, "big", true)
	a.placeOrder(t, "flaky", true)
	rec := &recorder{to: tg.q, fail: func(m queue.Outgoing, _ int) error {
		switch string(m.Body) {
		case "order placed big":
			return fmt.Errorf("target: %w", errTooBig)
		case "order placed flaky":
			return errors.New("target: connection reset")
		}
		return nil
	}}
	obs := new(testobserve.Recorder)
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithPermanentErrors(errTooBig), outbox.WithObserver(obs),
		outbox.WithLogger(quiet), outbox.WithConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Drain(t.Context()); err != nil || n != 1 {
		t.Fatalf("Drain = %d, %v; want 1, nil", n, err)
	}
	evs := obs.Events()
	var kinds []idem.EventKind
	reasons := map[string]string{}
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
		if e.Queue != "outbox" || e.MessageID == "" {
			t.Errorf("%v without the outbox's name or the message id: %+v", e.Kind, e.Event)
		}
		switch e.Kind {
		case idem.RelayPublished:
			if e.Duration <= 0 || e.Started.IsZero() {
				t.Errorf("RelayPublished without the message's age: %+v", e.Event)
			}
		case idem.RelayRefused:
			reasons[e.MessageID] = e.Reason
			if e.Err == nil || e.Receives != 1 {
				t.Errorf("RelayRefused %+v", e.Event)
			}
		}
	}
	slices.Sort(kinds)
	if want := []idem.EventKind{idem.RelayPublished, idem.RelayRefused, idem.RelayRefused}; !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want one published and two refused", kinds)
	}
	var got []string
	for _, why := range reasons {
		got = append(got, why)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"refused", "retried"}) {
		t.Errorf("refusal reasons %v, want refused (the permanent one) and retried", got)
	}
	if err := obs.Check(); err != nil {
		t.Fatal(err)
	}
}
