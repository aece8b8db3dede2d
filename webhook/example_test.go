package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/webhook"
)

// memQueue is an in-memory queue.Publisher for the example.
type memQueue struct {
	mu   sync.Mutex
	msgs []queue.Outgoing
}

func (q *memQueue) Publish(_ context.Context, m queue.Outgoing) (queue.Published, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = append(q.msgs, m)
	return queue.Published{ID: fmt.Sprint(len(q.msgs))}, nil
}

func ExampleReceiver() {
	scheme, err := webhook.NewStandard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	q := new(memQueue)
	l := idem.New(memstore.New())
	rcv, err := webhook.NewReceiver("billing", scheme, l, webhook.Publish(q))
	if err != nil {
		panic(err)
	}

	body := `{"type":"invoice.paid","invoice":"in_1"}`
	deliver := func(at time.Time) {
		r := httptest.NewRequest(http.MethodPost, "/hooks/billing", strings.NewReader(body))
		r.Header.Set("Webhook-Id", "msg_1")
		r.Header.Set("Webhook-Timestamp", fmt.Sprint(at.Unix()))
		r.Header.Set("Webhook-Signature", scheme.Sign("msg_1", at, []byte(body)))
		w := httptest.NewRecorder()
		rcv.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
	}
	now := time.Now()
	deliver(now)                  // the first delivery is captured
	deliver(now.Add(time.Minute)) // the sender's retry gets the same answer
	fmt.Println("queued:", len(q.msgs), q.msgs[0].Attributes[webhook.AttrEventID], q.msgs[0].DedupID)
	// Output:
	// 200  {"status":"accepted","source":"billing","event_id":"msg_1","message_id":"1"}
	// 200 true {"status":"accepted","source":"billing","event_id":"msg_1","message_id":"1"}
	// queued: 1 msg_1 accept:billing:msg_1
}
