package lambdasqs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/internal/sqsmsg"
)

// DefaultMargin is how long before the invocation's deadline [Handler]
// stops handlers, so that the response reaches Lambda in time.
const DefaultMargin = time.Second

// Option configures [Handler] and [NewBatch].
type Option func(*config)

type config struct {
	deadLetter func(ctx context.Context, m queue.Message, reason string) error
	retryDelay func(ctx context.Context, receiptHandle string, delay time.Duration) error
	margin     time.Duration
}

// WithRetryDelay makes Retry(delay) call setVisibility with the record's
// receipt handle and delay (an sqsqueue.Queue's ChangeVisibility, for the
// queue the function consumes), so that the failed record comes back after
// delay instead of the queue's visibility timeout. If the call fails the
// record is still reported failed and comes back after the visibility
// timeout.
func WithRetryDelay(setVisibility func(ctx context.Context, receiptHandle string, delay time.Duration) error) Option {
	return func(c *config) { c.retryDelay = setVisibility }
}

// WithDeadLetter makes DeadLetter(reason) send the message to a dead-letter
// queue with send (an sqsqueue.Queue's SendDeadLetter, for the queue the
// function consumes) and report the record as succeeded. send's context
// carries the record (see [Record]): queue.Message's attributes are
// strings, so a Binary attribute's bytes and every attribute's data type
// are only there. SendDeadLetter copies them from it.
func WithDeadLetter(send func(ctx context.Context, m queue.Message, reason string) error) Option {
	return func(c *config) { c.deadLetter = send }
}

// WithMargin sets how long before the invocation's deadline handlers are
// stopped and unfinished records handed back (default [DefaultMargin]; at
// most a tenth of the time left when the invocation starts).
func WithMargin(d time.Duration) Option {
	return func(c *config) { c.margin = max(d, 0) }
}

// Batch is one SQS event's records as deliveries, and the partial batch
// response they add up to.
type Batch struct {
	ds []*Delivery
}

// NewBatch wraps ev's records as deliveries.
func NewBatch(ev events.SQSEvent, opts ...Option) *Batch {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	return newBatch(ev, cfg)
}

func newBatch(ev events.SQSEvent, cfg config) *Batch {
	b := &Batch{ds: make([]*Delivery, len(ev.Records))}
	for i, r := range ev.Records {
		b.ds[i] = &Delivery{msg: toMessage(r), rec: &r, handle: r.ReceiptHandle, deadLetter: cfg.deadLetter, retryDelay: cfg.retryDelay}
	}
	return b
}

// Deliveries returns the records as deliveries, in the event's order.
func (b *Batch) Deliveries() []queue.Delivery {
	out := make([]queue.Delivery, len(b.ds))
	for i, d := range b.ds {
		out[i] = d
	}
	return out
}

// Response lists, in the event's order, the records that are not done:
// retried, dead-lettered without a dead-letter sender (or with a failed
// send), never settled, or after a failed record of the same FIFO group.
func (b *Batch) Response() events.SQSEventResponse {
	var resp events.SQSEventResponse
	failedGroups := map[string]bool{}
	for _, d := range b.ds {
		g := d.msg.GroupID
		failed := !d.Done()
		if g != "" && failedGroups[g] {
			failed = true
		}
		if failed {
			if g != "" {
				failedGroups[g] = true
			}
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: d.msg.ID})
		}
	}
	return resp
}

// ErrNotDeadLettered is returned (wrapped) by DeadLetter when the
// dead-letter sender failed; the record is reported as failed.
var ErrNotDeadLettered = errors.New("lambdasqs: message not sent to the dead-letter queue")

type state int

const (
	pending state = iota
	acked
	retried
	deadLettered // sent to the dead-letter queue: done
	failedDL     // DeadLetter without a sender: reported failed
)

// Delivery is one record of an SQS event. It is safe for concurrent use.
type Delivery struct {
	msg        queue.Message
	rec        *events.SQSMessage // as Lambda delivered it
	handle     string
	deadLetter func(ctx context.Context, m queue.Message, reason string) error
	retryDelay func(ctx context.Context, receiptHandle string, delay time.Duration) error

	mu     sync.Mutex
	state  state
	reason string
}

var _ queue.Delivery = (*Delivery)(nil)

// Message returns the record as a message.
func (d *Delivery) Message() queue.Message { return d.msg }

// Done reports whether the record counts as succeeded: acked, or sent to
// the dead-letter queue.
func (d *Delivery) Done() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state == acked || d.state == deadLettered
}

// Reason returns the reason given to DeadLetter ("" if none).
func (d *Delivery) Reason() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reason
}

func (d *Delivery) settle(op string, s state) error {
	if d.state != pending {
		return fmt.Errorf("lambdasqs: %s message %s: %w", op, d.msg.ID, queue.ErrSettled)
	}
	d.state = s
	return nil
}

// Ack marks the record as succeeded.
func (d *Delivery) Ack(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.settle("ack", acked)
}

// Retry marks the record as failed. It comes back after the queue's
// visibility timeout, or after delay with [WithRetryDelay]; if that call
// fails, Retry still marks the record failed and returns the error.
func (d *Delivery) Retry(ctx context.Context, delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.settle("retry", retried); err != nil {
		return err
	}
	if d.retryDelay != nil {
		if err := d.retryDelay(ctx, d.handle, delay); err != nil {
			return fmt.Errorf("lambdasqs: retry message %s after %v (it comes back after the visibility timeout instead): %w", d.msg.ID, delay, err)
		}
	}
	return nil
}

// Extend does nothing (the invocation's deadline bounds the work) and
// returns nil, or an error wrapping [queue.ErrSettled] once settled.
func (d *Delivery) Extend(context.Context, time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != pending {
		return fmt.Errorf("lambdasqs: extend message %s: %w", d.msg.ID, queue.ErrSettled)
	}
	return nil
}

// DeadLetter sends the message to the dead-letter queue with the
// [WithDeadLetter] sender and marks the record as succeeded; if the send
// fails it returns an error wrapping [ErrNotDeadLettered] and the record
// stays unsettled (reported failed unless settled again). Without a sender
// it marks the record as failed: SQS's redrive policy moves it after
// maxReceiveCount receives, without the reason.
func (d *Delivery) DeadLetter(ctx context.Context, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != pending {
		return fmt.Errorf("lambdasqs: dead-letter message %s: %w", d.msg.ID, queue.ErrSettled)
	}
	d.reason = reason
	if d.deadLetter == nil {
		d.state = failedDL
		return nil
	}
	if err := d.deadLetter(context.WithValue(ctx, recordKey{}, d.rec), d.msg, reason); err != nil {
		return fmt.Errorf("lambdasqs: dead-letter message %s: %w: %w", d.msg.ID, ErrNotDeadLettered, err)
	}
	d.state = deadLettered
	return nil
}

type recordKey struct{}

// Record returns the event record that DeadLetter is sending to the
// dead-letter queue, from the context it gives the [WithDeadLetter] sender.
// Its MessageAttributes keep what the message's string attributes cannot:
// each attribute's data type (Number, Binary, custom types such as
// "Binary.gzip") and a Binary attribute's bytes. The record is shared: do
// not modify it.
func Record(ctx context.Context) (*events.SQSMessage, bool) {
	r, ok := ctx.Value(recordKey{}).(*events.SQSMessage)
	return r, ok && r != nil
}

// toMessage reads a record as a queue.Message (see sqsmsg.Message).
func toMessage(r events.SQSMessage) queue.Message {
	return sqsmsg.Message(r.MessageId, r.Body, r.Attributes, sqsmsg.Attributes(r.MessageAttributes,
		func(a events.SQSMessageAttribute) (*string, []byte) { return a.StringValue, a.BinaryValue }))
}
