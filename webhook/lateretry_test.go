package webhook

import (
	"net/http"
	"testing"
	"time"
)

// Webhook senders: a broker's dedup window (SQS FIFO's 5 minutes) is a first
// line, not the mechanism; senders retry for days. A retry of a captured
// event minutes or days later, well past any broker window, is answered
// with the first answer and queues nothing, for as long as the ledger keeps
// the key (its retention, 7 days by default). After that the event is new
// again: retention is the promise's horizon, so set it past the sender's.
func TestReceiverRetryDaysLater(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			rc, s := newReceiver(t, e, captures(e)[mode], WithClock(e.clock.Now))
			const body = `{"type":"invoice.paid"}`
			deliver := func() answer {
				return serve(rc, swRequest(t, s, "msg_late", body, e.clock.Now()))
			}
			first := deliver()
			if first.status != http.StatusOK {
				t.Fatalf("first delivery: %d %s", first.status, first.body)
			}
			var elapsed time.Duration
			for _, at := range []time.Duration{6 * time.Minute, time.Hour, 3 * 24 * time.Hour, 6*24*time.Hour + 23*time.Hour} {
				e.clock.Add(at - elapsed)
				elapsed = at
				again := deliver()
				if again.status != http.StatusOK || again.header.Get(ReplayedHeader) != "true" || string(again.body) != string(first.body) {
					t.Fatalf("retry %v later: %d %s (replayed %q), want the first answer replayed", at, again.status, again.body, again.header.Get(ReplayedHeader))
				}
			}
			if n := len(e.pub.messages(t)); n != 1 {
				t.Fatalf("%d messages queued after retries over 7 days, want 1", n)
			}
			e.clock.Add(7*24*time.Hour + time.Minute - elapsed) // past the ledger's retention
			late := deliver()
			if late.status != http.StatusOK || late.header.Get(ReplayedHeader) != "" {
				t.Fatalf("retry after the retention: %d %s (replayed %q), want a new capture", late.status, late.body, late.header.Get(ReplayedHeader))
			}
			if n := len(e.pub.messages(t)); n != 2 {
				t.Fatalf("%d messages queued after a retry past the retention, want 2", n)
			}
		})
	}
}

// Webhook senders vary a payload between retries (a new timestamp in
// the body, re-serialized JSON). The event id the sender signed is the
// key, not the body: a retry with another validly signed body is the same
// event, answered with the first answer, and nothing more is queued.
func TestReceiverRetryWithAnotherBody(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			rc, s := newReceiver(t, e, captures(e)[mode])
			now := time.Now()
			first := serve(rc, swRequest(t, s, "msg_v", `{"type":"invoice.paid","sent_at":"10:00:00"}`, now))
			if first.status != http.StatusOK {
				t.Fatalf("first delivery: %d %s", first.status, first.body)
			}
			again := serve(rc, swRequest(t, s, "msg_v", `{"sent_at":"10:05:00", "type":"invoice.paid"}`, now.Add(5*time.Minute)))
			if again.status != http.StatusOK || again.header.Get(ReplayedHeader) != "true" || string(again.body) != string(first.body) {
				t.Fatalf("retry with another body: %d %s (replayed %q), want the first answer replayed", again.status, again.body, again.header.Get(ReplayedHeader))
			}
			msgs := e.pub.messages(t)
			if len(msgs) != 1 || string(msgs[0].Body) != `{"type":"invoice.paid","sent_at":"10:00:00"}` {
				t.Fatalf("queued %+v, want the first body once", msgs)
			}
		})
	}
}
