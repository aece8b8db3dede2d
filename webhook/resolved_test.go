package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// Under AtMostOnce a publish whose outcome is unknown (a timeout) leaves the
// key indeterminate. An operator who finds the message in the queue resolves
// the key as done (idem resolve KEY --done), with no result or a note of
// their own: the sender's retry is then answered as a captured event, 200
// with the usual accepted body (no message id: none was recorded), and
// nothing is published again.
func TestReceiverAnswersAKeyResolvedDoneAsCaptured(t *testing.T) {
	for _, result := range []string{"", `{"charged":true}`, "found m17 in the queue"} {
		t.Run("result="+result, func(t *testing.T) {
			e := newEnv(t, idem.WithPolicy(idem.AtMostOnce), idem.WithLease(time.Second))
			rc, s := newReceiver(t, e, Publish(e.pub))
			e.pub.setHook(func(context.Context) error { return context.DeadlineExceeded })
			if a := serve(rc, swRequest(t, s, "msg_1", `{}`, time.Now())); a.status != http.StatusInternalServerError {
				t.Fatalf("publish timed out: %d %s, want 500", a.status, a.body)
			}
			e.pub.setHook(nil)
			if _, err := e.store.Resolve(context.Background(), store.ResolveRequest{Key: Key("acme", "msg_1").String(), Done: true, Result: []byte(result), Reason: "operator: message found", By: "op"}); err != nil {
				t.Fatal(err)
			}
			a := serve(rc, swRequest(t, s, "msg_1", `{}`, time.Now()))
			if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
				t.Fatalf("retry after resolve --done: %d %q %s, want 200 application/json", a.status, a.header.Get("Content-Type"), a.body)
			}
			var ab acceptedBody
			if err := json.Unmarshal(a.body, &ab); err != nil || ab != (acceptedBody{Status: "accepted", Source: "acme", EventID: "msg_1"}) {
				t.Fatalf("answer %s (%v), want the accepted body without a message id", a.body, err)
			}
			if a.header.Get(ReplayedHeader) != "true" {
				t.Fatalf("%s = %q, want true", ReplayedHeader, a.header.Get(ReplayedHeader))
			}
			if n := len(e.pub.messages(t)); n != 0 {
				t.Fatalf("%d messages published, want 0", n)
			}
		})
	}
}

// A stored answer in the Receiver's own format (a status, then the JSON
// body) that cannot be read is 500 answer-unreadable: never 2xx, never a
// second capture.
func TestReceiverRefusesAnUnreadableAnswer(t *testing.T) {
	e := newEnv(t)
	rc, s := newReceiver(t, e, Publish(e.pub))
	if _, err := e.l.Do(context.Background(), Key("acme", "msg_c"), func(context.Context) ([]byte, error) {
		return []byte(`999{"status":"accepted"}`), nil
	}); err != nil {
		t.Fatal(err)
	}
	a := serve(rc, swRequest(t, s, "msg_c", `{}`, time.Now()))
	if a.status != http.StatusInternalServerError || problemOf(t, a).Type != ProblemTypePrefix+"answer-unreadable" {
		t.Fatalf("unreadable answer: %d %s, want 500 answer-unreadable", a.status, a.body)
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d messages published, want 0", n)
	}
}
