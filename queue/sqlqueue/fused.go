package sqlqueue

import (
	"errors"

	"github.com/idemkit/idem/store"
)

// ErrLedger is wrapped by the error of [NewPostgres] when the store given
// to [WithLedger] cannot take part in the queue's transactions (it is
// not a pgstore.Store, or it is in another database).
var ErrLedger = errors.New("sqlqueue: the ledger store cannot share the queue's transactions")

// WithLedger names the ledger store that lives in the handle's database:
// on PostgreSQL a pgstore.Store in the same database (best on the same
// pool: its Pool()). A queue.Consumer whose ledger is on that store then
// takes the fused path by itself (a queue of the handle is a
// [queue.ClaimingSource]):
//
//   - the receive of a batch and the claims of its messages' keys commit
//     in one transaction: a receive statement, then one claim statement
//     for the batch (pgstore's ClaimBatchTx);
//   - a handled message's completion and its ack commit together, in one
//     transaction shared with the other messages finished meanwhile (a
//     completer gathers them, as acks are gathered): the ack's DELETE, then
//     one completion statement (pgstore's FinishBatchTx). A message whose
//     attempt no longer holds its key (its completion refused) is not
//     acked by it.
//
// Everything else is as without it: busy and duplicate answers, retries,
// delays and dead letters, heartbeats (the ledger's, and the message's
// extensions), AtMostOnce's indeterminate keys, graceful shutdown (a
// message handed back before its handler ran has its claim undone), and
// the messages of FIFO groups, whose completion and ack stay apart (the
// ack must wake the group's next message).
//
// It is an option, not the default, because only the caller knows that
// the store and the queue share a database; NewPostgres refuses a store
// that cannot join the queue's transactions ([ErrLedger]). [SQLite]
// ignores it: with [WithGroupCommit] its writes already share the store's
// commits.
func WithLedger(s store.Store) Option {
	return func(c *config) { c.ledger = s }
}
