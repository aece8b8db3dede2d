// Package queuetest is the conformance suite every queue adapter passes:
// the broker semantics a [queue.Consumer] relies on (receive, ack, retry,
// visibility, dead letters, dedup, FIFO groups), the three checks of a
// receipts worker (one email per order) under each policy, and a load check. Features the broker
// lacks are declared in [Features] and their tests skip with the reason.
//
//	func TestQueue(t *testing.T) {
//		queuetest.Run(t, queuetest.Harness{
//			New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) { ... },
//			Features: queuetest.Features{FIFO: true, DeadLetter: true, ...},
//		})
//	}
package queuetest

import (
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// Harness tells the suite how to make queues of one adapter.
type Harness struct {
	// New returns a fresh, empty queue (its own name) as a Source and a
	// Publisher of that same queue, with visibility (or ack wait) set to
	// visibility where the broker has one. It registers its cleanup with
	// t.Cleanup.
	New func(t *testing.T, visibility time.Duration) (queue.Source, queue.Publisher)
	// DeadLetters returns what has been dead-lettered from src's queue,
	// with the reason where the broker keeps one. Required when
	// Features.DeadLetter is set.
	DeadLetters func(t *testing.T, src queue.Source) []DeadLetter
	// Store returns the ledger store for the consumer checks (default: a
	// fresh memstore per test).
	Store func(t *testing.T) store.Store
	// Features says what the broker can do.
	Features Features
}

// Features flags what a broker offers; the suite skips what it lacks.
type Features struct {
	// FIFO: GroupID is honoured: messages of a group are handed out in
	// publish order, and not while an earlier one of the group is in
	// flight.
	FIFO bool
	// DedupWindow: a publish with a DedupID seen recently is dropped and
	// reported with Published.Duplicate.
	DedupWindow bool
	// Delay: Outgoing.Delay postpones the first delivery.
	Delay bool
	// RetryDelay: Retry(delay) postpones the next delivery by delay.
	RetryDelay bool
	// DeadLetter: DeadLetter moves the message where DeadLetters reads it.
	DeadLetter bool
	// LoadMessages is the size of the load check (default 100,000; 5,000
	// with -short; IDEM_TEST_LOAD_MESSAGES overrides it).
	LoadMessages int
}

// DeadLetter is a dead-lettered message as the broker keeps it.
type DeadLetter struct {
	Message queue.Message
	Reason  string // "" when the broker keeps no reason
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("queuetest: Harness.New is required")
	}
	if h.Features.DeadLetter && h.DeadLetters == nil {
		t.Fatal("queuetest: Features.DeadLetter needs Harness.DeadLetters")
	}
	t.Run("broker", func(t *testing.T) { testBroker(t, h) })
	t.Run("attributes", func(t *testing.T) { testAttributes(t, h) })
	t.Run("consumer", func(t *testing.T) { testConsumer(t, h) })
	t.Run("seed", func(t *testing.T) { testSeed(t, h) })
	t.Run("load", func(t *testing.T) { testLoad(t, h) })
}

// RunSeed runs only the receipts worker's three checks (the same
// handler called twice with one payload, a throw after the send, two
// consumers on one message at once), under each policy. It lets an adapter
// run them again on a production ledger (Harness.Store), such as SQS with
// a DynamoDB table, without the rest of the suite.
func RunSeed(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("queuetest: Harness.New is required")
	}
	testSeed(t, h)
}

func (h Harness) store(t *testing.T) store.Store {
	if h.Store != nil {
		return h.Store(t)
	}
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	return s
}
