package sqsqueue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// BenchmarkReceiveAck receives b.N messages in batches of 10 and acks each
// from its own goroutine, as a consumer's handlers do; it reports the
// delete calls per ack that the group commit made.
//
//	IDEM_TEST_SQS=http://127.0.0.1:9324 go test -run '^$' -bench ReceiveAck ./queue/sqsqueue/
func BenchmarkReceiveAck(b *testing.B) {
	c := client(b)
	url, _ := newQueue(b, c, queueSpec{})
	cc := &countingClient{Client: c}
	q := open(b, cc, url, sqsqueue.Options{})
	ctx := context.Background()
	for i := range b.N {
		if _, err := q.Publish(ctx, queue.Outgoing{Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for got := 0; got < b.N; {
		ds := receive(b, q, min(10, b.N-got))
		got += len(ds)
		for _, d := range ds {
			wg.Go(func() {
				if err := d.Ack(ctx); err != nil {
					b.Error(err)
				}
			})
		}
	}
	wg.Wait()
	b.StopTimer()
	single, batch := cc.counts()
	b.ReportMetric(float64(single+batch)/float64(b.N), "deletes/ack")
}
