package webhook

import (
	"net/http"
	"testing"
	"time"
)

// Seed 004: a broker's dedup window (SQS FIFO's 5 minutes) is a first
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
