package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
)

// KeyAttribute is the attribute in which [PublishTx] carries a message's
// operation key to the consumer ([MessageKey] reads it back). Its name is
// one that SQS message attributes, NATS headers and AMQP headers all
// carry unchanged.
const KeyAttribute = "Idem-Key"

// ErrNoKey is returned by [MessageKey] for a message without a
// [KeyAttribute].
var ErrNoKey = errors.New("outbox: the message carries no operation key")

// PublishTx writes m to the outbox inside tx, the application's
// transaction that changes the business data, for the operation key: the
// message is in the outbox if and only if tx commits. It is the outbox's
// PublishTx (sqlqueue's, for *sql.Tx on SQLite or pgx.Tx on PostgreSQL)
// with two things added, both from key:
//
//   - m.DedupID is set to the key, so that the relay, the target broker's
//     dedup window and the outbox's own dedup window (a second write of the
//     same operation inside it is dropped, and Published.Duplicate set) all
//     know the message by its operation, whatever retried the transaction;
//   - the attribute [KeyAttribute] carries the key, so that the consumer at
//     the target keys its ledger by it ([MessageKey]) on every broker, also
//     those that do not report the dedup id to receivers.
//
// The key travels to the target as it is, so it must be one the target
// carries: an SQS FIFO target takes dedup ids of at most 128 printable
// ASCII characters; a JetStream target refuses a header value with a
// line break or a space or tab at either end (the relay then
// dead-letters the message, as for any refusal: queue.ErrRefused). Keep
// the keys of messages bound there within that.
//
// A key names one operation for every writer to a target: the relay
// trusts a target that answers Duplicate (it already holds that dedup id)
// and acks, so two services that both wrote idem.Key("order-placed", id)
// for different effects to one target would lose one of them. Give each
// its own key space (a service name in the key's first part).
//
// It returns an error wrapping [idem.ErrInvalidKey] for an invalid key, and
// an error for an m whose DedupID or KeyAttribute is already set to
// something else; nothing is written then.
//
// Calling the outbox's PublishTx directly is just as good when the message
// has no operation key of its own: the relay then derives a dedup id from
// the outbox message (see [Relay]) and publishes it as the message's
// [KeyAttribute] too, so that [MessageKey] keys its copies alike.
func PublishTx[Tx any](ctx context.Context, outbox queue.TxPublisher[Tx], tx Tx, key idem.OperationKey, m queue.Outgoing) (queue.Published, error) {
	if err := key.Err(); err != nil {
		return queue.Published{}, fmt.Errorf("outbox: %w", err)
	}
	k := key.String()
	if m.DedupID != "" && m.DedupID != k {
		return queue.Published{}, fmt.Errorf("outbox: the message's DedupID %q is not its key %q", m.DedupID, k)
	}
	if v, ok := m.Attributes[KeyAttribute]; ok && v != k {
		return queue.Published{}, fmt.Errorf("outbox: the message's %s attribute %q is not its key %q", KeyAttribute, v, k)
	}
	m.DedupID = k
	m.Attributes = maps.Clone(m.Attributes)
	if m.Attributes == nil {
		m.Attributes = make(map[string]string, 1)
	}
	m.Attributes[KeyAttribute] = k
	return outbox.PublishTx(ctx, tx, m)
}

// MessageKey is a [queue.KeyFunc] for the consumer at the target: the
// operation key that [PublishTx] put in the message's [KeyAttribute] (or,
// for a message written without one, the dedup id the relay derived). A
// message without one gets an error wrapping [ErrNoKey] (the consumer
// dead-letters it).
func MessageKey(m queue.Message) (idem.OperationKey, error) {
	k, ok := m.Attributes[KeyAttribute]
	if !ok || k == "" {
		return idem.OperationKey{}, fmt.Errorf("%w (attribute %s)", ErrNoKey, KeyAttribute)
	}
	key := idem.RawKey(k)
	return key, key.Err()
}

var _ queue.KeyFunc = MessageKey
