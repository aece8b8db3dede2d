package webhook

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
)

// fifoQueue is a memqueue that says it is a FIFO queue requiring a group,
// as an sqsqueue.Queue of an SQS FIFO queue does.
type fifoQueue struct{ *memqueue.Queue }

func (fifoQueue) FIFO() bool { return true }

// The captured message carries a group only for a queue that requires one:
// a group per event there (SQS FIFO refuses a message without one), none
// elsewhere (sqlqueue and memqueue would hold it behind its group).
func TestReceiverGroupsOnlyOnFIFOQueues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fifo      bool
		wantGroup string
	}{{"plain queue", false, ""}, {"FIFO queue", true, "accept:acme:msg_1"}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			q := memqueue.New()
			var pub queue.Publisher = q
			if tc.fifo {
				pub = fifoQueue{q}
			}
			rc, s := newReceiver(t, e, Publish(pub))
			if a := serve(rc, swRequest(t, s, "msg_1", `{"a":1}`, time.Now())); a.status != http.StatusOK {
				t.Fatalf("delivery: %d %s", a.status, a.body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ds, err := q.Receive(ctx, 10)
			if err != nil || len(ds) != 1 {
				t.Fatalf("receive: %d messages, %v", len(ds), err)
			}
			if m := ds[0].Message(); m.GroupID != tc.wantGroup || m.DedupID != "accept:acme:msg_1" {
				t.Errorf("GroupID %q DedupID %q, want GroupID %q and the operation key as DedupID", m.GroupID, m.DedupID, tc.wantGroup)
			}
		})
	}
}
