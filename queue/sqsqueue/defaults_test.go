package sqsqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// A consumer of an SQS queue made with SQS's defaults (visibility 30 s),
// opened with sqsqueue's defaults, does not warn.
func TestDefaultsAgree(t *testing.T) {
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q, err := sqsqueue.Open(context.Background(), c, url, sqsqueue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if q.Visibility() != 30*time.Second {
		t.Fatalf("a queue made with SQS's defaults has visibility %v, want 30s", q.Visibility())
	}
	queuetest.DefaultsAgree(t, q)
}
