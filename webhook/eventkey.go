package webhook

import (
	"errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
)

// EventKey is the [queue.KeyFunc] for consumers of the events a [Receiver]
// captured: pass it to [queue.NewConsumer] so that the handler runs once
// per event, however often the sender delivered it and the queue
// redelivers it.
//
// The key is event:<source>:<event id>, built from the message's
// AttrSource and AttrEventID as [Key] builds the Receiver's own
// accept:<source>:<event id> (the same escaping, the same hash for an id
// too long for a key). It names the same event under another step on
// purpose: a consumer that shares the Receiver's ledger and keyed on
// accept:... would find the capture's record done and replay it without
// running the handler. Two consumers that each act on the same events
// through one ledger need a key each (their own prefix with [idem.Key]).
//
// A message without the attributes a Receiver sets (AttrSource,
// AttrEventID, AttrVerified "true") was not captured by one: EventKey
// returns a [queue.Undecodable] error, and the consumer dead-letters it
// without running the handler.
func EventKey(m queue.Message) (idem.OperationKey, error) {
	source, id := m.Attributes[AttrSource], m.Attributes[AttrEventID]
	switch {
	case source == "" || id == "":
		return idem.OperationKey{}, queue.Undecodable(errors.New("webhook: message has no " + AttrSource + " or " + AttrEventID + " attribute"))
	case m.Attributes[AttrVerified] != "true":
		return idem.OperationKey{}, queue.Undecodable(errors.New("webhook: message is not marked " + AttrVerified))
	}
	k := eventScopedKey("event", source, id)
	if err := k.Err(); err != nil {
		return idem.OperationKey{}, queue.Undecodable(err)
	}
	return k, nil
}

var _ queue.KeyFunc = EventKey
