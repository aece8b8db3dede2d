package amqpqueue

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
)

// TestConformance runs the queue conformance suite against RabbitMQ, on a
// classic and on a quorum queue. RabbitMQ has no publish-side dedup and no
// visibility timeout; delays go through the adapter's delay queues.
func TestConformance(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		var mu sync.Mutex
		fixtures := map[queue.Source]*fixture{}
		queuetest.Run(t, queuetest.Harness{
			New: func(t *testing.T, _ time.Duration) (queue.Source, queue.Publisher) {
				f := newFixture(t, quorum)
				src := f.source(t, f.conn)
				mu.Lock()
				fixtures[src] = f
				mu.Unlock()
				return src, f.publisher(t, f.conn)
			},
			DeadLetters: func(t *testing.T, src queue.Source) []queuetest.DeadLetter {
				mu.Lock()
				f := fixtures[src]
				mu.Unlock()
				return f.peekDeadLetters(t)
			},
			Features: queuetest.Features{Delay: true, RetryDelay: true, DeadLetter: true, LoadMessages: 5_000},
		})
	})
}

// TestConformanceDial runs the suite on a dialing Source and Publisher
// (classic queue).
func TestConformanceDial(t *testing.T) {
	amqpURL(t)
	var mu sync.Mutex
	fixtures := map[queue.Source]*fixture{}
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, _ time.Duration) (queue.Source, queue.Publisher) {
			f := newFixture(t, false)
			src := f.sourceDial(t, DialURL(f.url))
			mu.Lock()
			fixtures[src] = f
			mu.Unlock()
			return src, f.publisherDial(t, DialURL(f.url))
		},
		DeadLetters: func(t *testing.T, src queue.Source) []queuetest.DeadLetter {
			mu.Lock()
			f := fixtures[src]
			mu.Unlock()
			return f.peekDeadLetters(t)
		},
		Features: queuetest.Features{Delay: true, RetryDelay: true, DeadLetter: true, LoadMessages: 5_000},
	})
}

// peekDeadLetters reads the dead-letter queue without removing anything:
// it takes every message unacked on a fresh channel and closes the channel,
// which puts them back.
func (f *fixture) peekDeadLetters(t *testing.T) []queuetest.DeadLetter {
	t.Helper()
	ch, err := f.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var out []queuetest.DeadLetter
	for {
		d, ok, err := ch.Get(f.cfg.Queue+".dead-letter", false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		attrs := map[string]string{}
		for k, v := range d.Headers {
			attrs[k] = fmt.Sprint(v)
		}
		out = append(out, queuetest.DeadLetter{
			Message: queue.Message{ID: d.MessageId, Body: d.Body, Attributes: attrs, Published: d.Timestamp},
			Reason:  fmt.Sprint(d.Headers[HeaderDeadLetterReason]),
		})
	}
}
