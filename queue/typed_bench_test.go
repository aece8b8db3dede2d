package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

// BenchmarkTypedConsumer compares a typed consumer with an untyped one on a
// queue and a ledger in memory, per message: "json" decodes JSON bodies
// (the untyped consumer twice, in its key function and its handler, as a
// consumer without NewTypedConsumer does); "cut" decodes by splitting the
// body, so that what differs is the consumer's own cost.
//
//	go test -run '^$' -bench TypedConsumer -benchtime 20000x ./queue/
func BenchmarkTypedConsumer(b *testing.B) {
	cut := func(m queue.Message) (receipt, error) {
		o, u, _ := strings.Cut(string(m.Body), " ")
		return receipt{o, u}, nil
	}
	unmarshal := func(m queue.Message) (receipt, error) {
		var r receipt
		err := json.Unmarshal(m.Body, &r)
		return r, err
	}
	for _, dec := range []struct {
		name   string
		body   string
		decode func(queue.Message) (receipt, error)
	}{
		{"json", `{"order_id":"%d","user_id":"alice"}`, unmarshal},
		{"cut", "%d alice", cut},
	} {
		b.Run("untyped/"+dec.name, func(b *testing.B) {
			benchConsumer(b, dec.body, func(q queue.Source, l *idem.Ledger, opts ...queue.Option) (*queue.Consumer, error) {
				key := func(m queue.Message) (idem.OperationKey, error) {
					r, err := dec.decode(m)
					if err != nil {
						return idem.OperationKey{}, err
					}
					return receiptKey(r)
				}
				h := func(ctx context.Context, m queue.Message) ([]byte, error) {
					_, err := dec.decode(m)
					return nil, err
				}
				return queue.NewConsumer(q, l, key, h, opts...)
			})
		})
		b.Run("typed/"+dec.name, func(b *testing.B) {
			benchConsumer(b, dec.body, func(q queue.Source, l *idem.Ledger, opts ...queue.Option) (*queue.Consumer, error) {
				h := func(context.Context, idem.OperationKey, receipt) ([]byte, error) { return nil, nil }
				return queue.NewTypedConsumer(q, l, dec.decode, receiptKey, h, opts...)
			})
		})
	}
}

func benchConsumer(b *testing.B, body string, newConsumer func(queue.Source, *idem.Ledger, ...queue.Option) (*queue.Consumer, error)) {
	quiet := slog.New(slog.DiscardHandler)
	q := memqueue.New()
	c, err := newConsumer(q, idem.New(memstore.New(), idem.WithLogger(quiet)), queue.WithLogger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i := range b.N {
		if _, err := q.Publish(ctx, queue.Outgoing{Body: fmt.Appendf(nil, body, i)}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		ds, err := q.Receive(ctx, 10)
		if err != nil {
			b.Fatal(err)
		}
		c.HandleBatch(ctx, ds)
		done += len(ds)
	}
	b.StopTimer()
	if dl := q.DeadLetters(); len(dl) != 0 {
		b.Fatalf("%d dead letters: %s", len(dl), dl[0].Reason)
	}
}
