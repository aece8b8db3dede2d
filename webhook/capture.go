package webhook

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
)

// Capture is how a [Receiver] takes durable responsibility for a verified
// event: it publishes the event into a queue under the ledger, so that the
// receiver answers 2xx only once the message is held. Build one with
// [Publish] or [PublishTx].
type Capture interface {
	// check reports a configuration that cannot work (a transactional
	// capture on a store without that transaction type).
	check(l *idem.Ledger) error
	// capture runs the claim, the publish and the completion for key, and
	// returns the ledger's result: the stored answer.
	capture(ctx context.Context, l *idem.Ledger, key idem.OperationKey, m queue.Outgoing,
		answer func(queue.Published) []byte) (idem.Result, error)
}

// Publish captures events with p, under [idem.Ledger.Do]: claim the key,
// publish the message (its DedupID is the operation key), complete the key
// with the answer. When Publish fails the ledger releases the key (under the
// default [idem.AtLeastOnce] policy) and the receiver answers 500, so the
// sender retries and the retry publishes.
//
// The window that remains: if the process dies (or the store fails) after
// the broker accepted the message and before the completion is recorded, the
// key's lease lapses and a retry publishes again, with the same DedupID. The
// broker's dedup window (where it has one) drops that copy; otherwise the
// consumer's own ledger must. Use [PublishTx] when the queue lives in the
// ledger's database, which closes the window.
//
// On a FIFO queue that requires a message group (p has a method FIFO()
// bool that reports true, as an sqsqueue.Queue of an SQS FIFO queue does),
// the message's GroupID is the operation key too: a group per event, so
// that events never wait for each other and a retry of one event stays in
// its group. Other queues get no group: they need none, and sqlqueue would
// give every grouped message its FIFO bookkeeping on each receive.
func Publish(p queue.Publisher) Capture { return publishCapture{p} }

type publishCapture struct{ p queue.Publisher }

func (c publishCapture) check(*idem.Ledger) error {
	if c.p == nil {
		return fmt.Errorf("webhook: Publish(nil)")
	}
	return nil
}

func (c publishCapture) capture(ctx context.Context, l *idem.Ledger, key idem.OperationKey, m queue.Outgoing,
	answer func(queue.Published) []byte) (idem.Result, error) {
	if f, ok := c.p.(interface{ FIFO() bool }); ok && m.GroupID == "" && f.FIFO() {
		m.GroupID = m.DedupID
	}
	return l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		pub, err := c.p.Publish(ctx, m)
		if err != nil {
			return nil, &PublishError{Err: err}
		}
		return answer(pub), nil
	})
}

// PublishTx captures events with p inside the ledger store's own
// transaction, under [idem.DoTx]: the claim, the published message and the
// completion commit together or not at all, so every event is captured
// exactly once, even across crashes. The ledger's store must implement
// [store.TxStore][Tx] and p must write to the same database (sqlqueue on the
// sqlitestore's file with *sql.Tx, or on pgstore's database with pgx.Tx);
// [NewReceiver] refuses a store of another transaction type.
//
// A duplicate of an event already captured is answered from the claim in
// its transaction (the ledger's cache, [idem.WithCache], answers repeats
// without one). When PublishTx fails the transaction rolls back (the key is
// as before) and the receiver answers 500. Concurrent deliveries of one
// event are serialized by the database: the first commits, the others
// replay its answer.
//
// The message's DedupID is still the operation key, but the claim in the
// same transaction is what makes the capture exactly once: a queue that
// only receives these captures can turn its own dedup off (sqlqueue's
// WithDedupWindow(0)) and save its dedup table's two statements per event.
func PublishTx[Tx any](p queue.TxPublisher[Tx]) Capture { return txCapture[Tx]{p} }

type txCapture[Tx any] struct{ p queue.TxPublisher[Tx] }

func (c txCapture[Tx]) check(l *idem.Ledger) error {
	if c.p == nil {
		return fmt.Errorf("webhook: PublishTx(nil)")
	}
	if _, ok := l.Store().(store.TxStore[Tx]); !ok {
		var tx Tx
		return fmt.Errorf("webhook: PublishTx: %w: %T with %T", idem.ErrNotTransactional, l.Store(), tx)
	}
	return nil
}

func (c txCapture[Tx]) capture(ctx context.Context, l *idem.Ledger, key idem.OperationKey, m queue.Outgoing,
	answer func(queue.Published) []byte) (idem.Result, error) {
	// A duplicate finds the key completed inside the transaction's claim and
	// is answered from it: no read ahead of the transaction, which would be
	// a second round trip for every new event.
	return idem.DoTx(ctx, l, key, func(ctx context.Context, tx Tx) ([]byte, error) {
		pub, err := c.p.PublishTx(ctx, tx, m)
		if err != nil {
			return nil, &PublishError{Err: err}
		}
		return answer(pub), nil
	})
}

// PublishError wraps an error from the queue. The event was not captured
// (or, for a plain [Publish], may have been: the broker's answer was lost);
// the receiver answered 500 and the sender will retry.
type PublishError struct{ Err error }

func (e *PublishError) Error() string { return "webhook: publish: " + e.Err.Error() }
func (e *PublishError) Unwrap() error { return e.Err }
