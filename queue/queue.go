package queue

import (
	"context"
	"errors"
	"time"
)

// Message is one message as a broker delivered it.
type Message struct {
	// ID is the broker's id for the message (SQS MessageId, JetStream
	// stream sequence, AMQP message-id or delivery tag, sqlqueue row id).
	// A redelivery of the same message has the same ID on brokers that
	// keep one; a republished copy has a new one.
	ID string
	// Body is the payload, exactly as published.
	Body []byte
	// Attributes are the message's headers or attributes (string values).
	Attributes map[string]string
	// GroupID is the FIFO group ("" when the queue has no groups).
	GroupID string
	// DedupID is the publish-side dedup id the message was sent with, if
	// the broker reports it ("" otherwise).
	DedupID string
	// ReceiveCount is how many times the broker has handed the message out,
	// this time included: 1 on the first delivery. Brokers that only report
	// "redelivered" give 2 for a redelivery.
	ReceiveCount int
	// FirstReceived is when the message was first handed out (zero when the
	// broker does not say).
	FirstReceived time.Time
	// Published is when the message was published (zero when unknown).
	Published time.Time
}

// Delivery is a received message that the consumer must settle exactly once
// with Ack, Retry or DeadLetter. Extend may be called any number of times
// before that. Once a settle has succeeded the delivery holds nothing: a
// second settle, or an Extend, returns an error wrapping [ErrSettled] and
// changes nothing (a Retry included: an Ack after it must not drop the
// message handed back). queue/queuetest holds every adapter to this.
type Delivery interface {
	// Message returns the delivered message.
	Message() Message
	// Ack removes the message from the queue: it is done.
	Ack(ctx context.Context) error
	// Retry hands the message back to be delivered again no sooner than
	// delay from now (0: as soon as the broker can). The receive count
	// grows by one at the next delivery.
	Retry(ctx context.Context, delay time.Duration) error
	// Extend keeps the message invisible to other receivers for d from now
	// (SQS ChangeMessageVisibility, JetStream InProgress, sqlqueue's
	// visibility timeout). Brokers whose timeout is fixed (JetStream's ack
	// wait) reset it to its configured length, whatever d.
	Extend(ctx context.Context, d time.Duration) error
	// DeadLetter moves the message to the dead-letter destination with the
	// reason, which is kept with it where the broker can keep it.
	DeadLetter(ctx context.Context, reason string) error
}

// Source receives deliveries from one queue, subscription or consumer.
type Source interface {
	// Receive blocks until at least one delivery is available or ctx is
	// done, and returns up to max deliveries. It returns ctx's error (and
	// no deliveries) when ctx is done first. A message of a FIFO group is
	// not handed out while an earlier message of its group is in flight,
	// on brokers that have groups.
	Receive(ctx context.Context, max int) ([]Delivery, error)
	// Visibility is how long a delivery stays invisible to other receivers
	// unless extended: SQS's visibility timeout, JetStream's ack wait,
	// sqlqueue's visibility timeout. 0 means unbounded (AMQP: the message
	// returns only when the channel closes).
	Visibility() time.Duration
}

// Outgoing is a message to publish.
type Outgoing struct {
	Body       []byte
	Attributes map[string]string
	// DedupID makes the broker drop a second publish with the same id
	// inside its dedup window (SQS FIFO MessageDeduplicationId, JetStream
	// Nats-Msg-Id, sqlqueue's dedup window). Brokers without publish-side
	// dedup ignore it; the ledger is then the only line against duplicates.
	DedupID string
	// GroupID is the FIFO group ("" for none).
	GroupID string
	// Delay postpones the first delivery (0: none). Brokers without delays
	// return an error wrapping [ErrUnsupported] for a non-zero Delay.
	Delay time.Duration
}

// Published describes a publish the broker accepted.
type Published struct {
	// ID is the broker's id for the message (for a duplicate, the id of
	// the message already held, where the broker reports it).
	ID string
	// Duplicate is true when the broker dropped this publish as a
	// duplicate of one inside its dedup window.
	Duplicate bool
}

// Publisher sends messages. Publish returns only after the broker has
// accepted the message durably (publisher confirms, a committed row, an
// acknowledged PUB); an error means the message may or may not have been
// accepted, so a caller that retries should set a DedupID.
type Publisher interface {
	Publish(ctx context.Context, m Outgoing) (Published, error)
}

// TxPublisher publishes inside a caller's transaction of type Tx, so the
// message is queued if and only if the transaction commits (sqlqueue with
// *sql.Tx on SQLite, pgx.Tx on PostgreSQL). Combined with [idem.DoTx] on a
// store in the same database, a message is captured exactly once.
type TxPublisher[Tx any] interface {
	PublishTx(ctx context.Context, tx Tx, m Outgoing) (Published, error)
}

var (
	// ErrSettled is returned when a delivery already acked, retried or
	// dead-lettered is settled again or extended.
	ErrSettled = errors.New("queue: delivery already settled")
	// ErrUnsupported is returned for a feature the broker does not have.
	ErrUnsupported = errors.New("queue: not supported by this broker")
	// ErrUndecodable marks a message the consumer cannot make sense of; it
	// is dead-lettered at once. A KeyFunc or Handler returns it wrapped.
	ErrUndecodable = errors.New("queue: message cannot be decoded")
	// ErrRefused is matched (errors.Is) by every error with which a
	// Publisher refuses a message as it is, before sending anything: an
	// attribute or body the broker cannot carry unchanged, a missing group
	// or dedup id a FIFO queue needs, a delay it cannot hold. Publishing
	// the same message again cannot succeed, so a relay (outbox.Relay)
	// dead-letters it instead of retrying. Each adapter's own sentinel
	// errors (sqsqueue.ErrBadBody, jetstream.ErrBadAttribute, ...) still
	// match themselves too.
	ErrRefused = errors.New("queue: the message is refused as it is")
)

// Refusal returns a sentinel error with text msg that matches both itself
// and [ErrRefused]; adapters declare their refusals with it.
func Refusal(msg string) error { return &refusal{msg} }

type refusal struct{ msg string }

func (e *refusal) Error() string        { return e.msg }
func (e *refusal) Is(target error) bool { return target == ErrRefused }

// Undecodable wraps err so that the consumer dead-letters the message at
// once instead of retrying it. errors.Is(Undecodable(err), ErrUndecodable)
// holds and the original error stays reachable with errors.Unwrap/As. A
// handler that returns it declares that it did nothing: the key is
// released (as by [idem.NotDone]) under either policy.
func Undecodable(err error) error {
	if err == nil {
		return nil
	}
	return &undecodableError{err}
}

type undecodableError struct{ err error }

func (e *undecodableError) Error() string   { return "undecodable message: " + e.err.Error() }
func (e *undecodableError) Unwrap() []error { return []error{ErrUndecodable, e.err} }
