package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// NewTypedConsumer returns a [Consumer] of src whose messages are values of
// type T: decode turns each delivery into a T once, key computes the
// operation key from that T, and h runs with the same T and its key (to
// pass on as the downstream idempotency key: an SMTP Message-ID, a
// payment API's Idempotency-Key). A message that
// decode refuses, or whose value key refuses, is dead-lettered at once
// (cause "undecodable"; the reason says which of the two failed and why):
// its handler does not run. Everything else is as for [NewConsumer]:
// options, the verdicts of [Consumer], h's errors ([idem.Permanent],
// [Undecodable], [idem.NotDone]). [WithCallOptions] still sees the
// [Message]; a handler that needs more of it (attributes, the receive
// count) decodes into a T that carries it.
//
// decode runs once per delivery, and key and h share its value: a body is
// never decoded twice to compute its key and then handle it. A redelivery
// is decoded again; a duplicate whose key is done is decoded (its key is
// needed) and acked without running h. [JSON] decodes JSON bodies.
func NewTypedConsumer[T any](src Source, l *idem.Ledger,
	decode func(Message) (T, error),
	key func(T) (idem.OperationKey, error),
	h func(ctx context.Context, k idem.OperationKey, v T) ([]byte, error),
	opts ...Option) (*Consumer, error) {
	if src == nil || l == nil || decode == nil || key == nil || h == nil {
		return nil, errors.New("queue: NewTypedConsumer needs a source, a ledger, a decode function, a key function and a handler")
	}
	bind := func(m Message) (idem.OperationKey, func(context.Context) ([]byte, error), error) {
		v, err := decode(m)
		if err != nil {
			return idem.OperationKey{}, nil, fmt.Errorf("decoding: %w", err)
		}
		k, err := key(v)
		if err != nil {
			return idem.OperationKey{}, nil, fmt.Errorf("key of the decoded value: %w", err)
		}
		return k, func(ctx context.Context) ([]byte, error) { return h(ctx, k, v) }, nil
	}
	return newConsumer(src, l, &Consumer{bind: bind}, opts)
}

// JSON decodes a message's body as JSON into a T (encoding/json, unknown
// fields ignored). Pass it to [NewTypedConsumer] as queue.JSON[T].
func JSON[T any](m Message) (T, error) {
	var v T
	err := json.Unmarshal(m.Body, &v)
	return v, err
}
