package sqlqueue

import (
	"errors"

	"github.com/idemkit/idem/store"
)

// ErrLedger is wrapped by the error of [NewPostgres] and [NewSQLite] when
// the store given to [WithLedger] cannot take part in the queue's
// transactions: not a pgstore.Store (PostgreSQL) in the same database, or
// not a sqlitestore.Store (SQLite) that is the handle's group committer.
var ErrLedger = errors.New("sqlqueue: the ledger store cannot share the queue's transactions")

// WithLedger names the ledger store that lives in the handle's database:
// on PostgreSQL a pgstore.Store in the same database (best on the same
// pool: its Pool()); on SQLite the sqlitestore.Store whose DB() the handle
// is made on (WithLedger implies [WithGroupCommit] with it). A
// queue.Consumer whose ledger is on that store then takes the fused path
// by itself (a queue of the handle is a [queue.ClaimingSource]):
//
//   - the receive of a batch and the claims of its messages' keys commit
//     together: on PostgreSQL in one transaction, the receive statement
//     then one claim statement for the batch (pgstore's ClaimBatchTx); on
//     SQLite in one unit of the store's writer (sqlitestore's
//     ClaimBatchIn), where the consumer's key function runs too;
//   - a handled message's completion and its ack commit together, with
//     the other messages finished meanwhile (a completer gathers them, as
//     acks are gathered): on PostgreSQL one transaction of the acks'
//     DELETE and one completion statement (pgstore's FinishBatchTx); on
//     SQLite one unit of the writer (sqlitestore's FinishBatchIn, then the
//     DELETEs). A message whose attempt no longer holds its key (its
//     completion refused) is not acked by it.
//
// Everything else is as without it: busy and duplicate answers, retries,
// delays and dead letters, heartbeats (the ledger's, and the message's
// extensions), AtMostOnce's indeterminate keys, graceful shutdown (a
// message handed back before its handler ran has its claim undone). On
// PostgreSQL the messages of FIFO groups keep their own ack, which
// notifies the group's next message.
//
// It is an option, not the default, because only the caller knows that
// the store and the queue share a database; NewPostgres and NewSQLite
// refuse a store that cannot join the queue's transactions ([ErrLedger]).
func WithLedger(s store.Store) Option {
	return func(c *config) { c.ledger = s }
}
