package sqsqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/internal/reason"
	"github.com/idemkit/idem/queue/internal/sqsmsg"
	"github.com/idemkit/idem/queue/internal/visibility"
	"github.com/idemkit/idem/queue/lambdasqs"
)

// Delivery is one received SQS message. Its methods may be called from
// several goroutines; they run one at a time. Once Ack, Retry or DeadLetter
// has succeeded, further settling (and Extend) returns an error wrapping
// [queue.ErrSettled]. A failed settle can be tried again.
type Delivery struct {
	q      *Queue
	msg    queue.Message
	attrs  map[string]types.MessageAttributeValue // as received, for DeadLetter's copy
	handle string

	mu       sync.Mutex
	deadline visibility.Deadline // bought by the last Receive/Extend, counted from before the request
	settled  bool
	dlqSent  bool // DeadLetter's copy was accepted; a repeat only deletes
}

var _ queue.Delivery = (*Delivery)(nil)

// Message returns the delivered message.
func (d *Delivery) Message() queue.Message { return d.msg }

// ReceiptHandle returns the handle SQS gave this delivery.
func (d *Delivery) ReceiptHandle() string { return d.handle }

// lapsed reports whether the visibility bought so far has run out.
func (d *Delivery) lapsed(now time.Time) bool { return d.q.visibility > 0 && d.deadline.Lapsed(now) }

func (d *Delivery) staleErr(op string) error {
	return fmt.Errorf("sqsqueue: %s message %s: %w (deadline %s passed; SQS may redeliver it)",
		op, d.msg.ID, ErrStaleReceipt, d.deadline)
}

// sqsErr wraps err from SQS, adding ErrStaleReceipt when SQS refused the
// receipt handle.
func (d *Delivery) sqsErr(op string, err error) error {
	var inv *types.ReceiptHandleIsInvalid
	var nif *types.MessageNotInflight
	if errors.As(err, &inv) || errors.As(err, &nif) {
		return fmt.Errorf("sqsqueue: %s message %s: %w: %w", op, d.msg.ID, ErrStaleReceipt, err)
	}
	if isStaleCode(err) {
		return fmt.Errorf("sqsqueue: %s message %s: %w: %w", op, d.msg.ID, ErrStaleReceipt, err)
	}
	return fmt.Errorf("sqsqueue: %s message %s: %w", op, d.msg.ID, err)
}

// isStaleCode recognises SQS's refusals of a receipt handle that do not
// come back as a typed error (InvalidParameterValue "... The receipt handle
// has expired").
func isStaleCode(err error) bool {
	var ae interface{ ErrorMessage() string }
	return errors.As(err, &ae) && isStaleText(ae.ErrorMessage())
}

func isStaleText(m string) bool {
	return strings.Contains(m, "receipt handle has expired") ||
		strings.Contains(m, "not available for visibility timeout change") ||
		strings.Contains(m, "not a valid receipt handle")
}

// Ack deletes the message. Acks made while another delete is in flight are
// sent together in one DeleteMessageBatch. Once the visibility timeout has
// lapsed, Ack sends nothing and returns an error wrapping
// [ErrStaleReceipt]: the message comes back (if it has not already gone to
// another receiver), and the ledger replays it as done. The error wraps
// ErrStaleReceipt too when SQS refuses the handle.
func (d *Delivery) Ack(ctx context.Context) error {
	return d.settle("ack", func() error { return d.q.del.delete(ctx, d.handle) })
}

// Retry makes the message visible again after delay (ChangeMessageVisibility;
// rounded up to whole seconds, at most 12 hours; 0: at once). Once the
// visibility timeout has lapsed it sends nothing (the message is visible
// already, or held by another receiver whose visibility it must not
// change) and returns an error wrapping [ErrStaleReceipt].
func (d *Delivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.settle("retry", func() error { return d.changeVisibility(ctx, delay) })
}

// settle runs call, which settles the delivery (op names it in errors),
// unless refuse says no, and marks the delivery settled once call has
// succeeded.
func (d *Delivery) settle(op string, call func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refuse(op, time.Now()); err != nil {
		return err
	}
	if err := call(); err != nil {
		return d.sqsErr(op, err)
	}
	d.settled = true
	return nil
}

// refuse returns the error op gets, sending nothing, on a delivery already
// settled or whose visibility has lapsed by now; nil otherwise. The caller
// holds d.mu.
func (d *Delivery) refuse(op string, now time.Time) error {
	if d.settled {
		return fmt.Errorf("sqsqueue: %s message %s: %w", op, d.msg.ID, queue.ErrSettled)
	}
	if d.lapsed(now) {
		return d.staleErr(op)
	}
	return nil
}

// Extend keeps the message invisible for d from now (ChangeMessageVisibility;
// rounded up to whole seconds, at most 12 hours). SQS counts a message's
// total visibility from its receipt and refuses to extend it past 12 hours.
// Once the visibility timeout has lapsed it sends nothing and returns an
// error wrapping [ErrStaleReceipt].
func (d *Delivery) Extend(ctx context.Context, dur time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	if err := d.refuse("extend", start); err != nil {
		return err
	}
	if err := d.changeVisibility(ctx, dur); err != nil {
		return d.sqsErr("extend", err)
	}
	d.deadline.Extend(start, time.Duration(seconds(dur))*time.Second)
	return nil
}

func (d *Delivery) changeVisibility(ctx context.Context, dur time.Duration) error {
	_, err := d.q.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(d.q.url),
		ReceiptHandle:     aws.String(d.handle),
		VisibilityTimeout: seconds(dur),
	})
	return err
}

// DeadLetter sends a copy of the message to the dead-letter queue (see
// [Options.DeadLetterURL]) with the same body and attributes (data types
// and Binary values as received) plus reason in
// [ReasonAttribute] and the original MessageId in [SourceIDAttribute], then
// deletes the original. The reason is cut to 4096 bytes; characters SQS
// does not accept become U+FFFD; an empty reason adds no attribute. SQS
// allows 10 attributes: when the original has 9, only the reason is added;
// when it has 10, neither is (the copy keeps the message whole).
//
// If the visibility timeout had already lapsed, nothing is sent and the
// error wraps [ErrStaleReceipt]: the message is redelivered, and
// dead-lettered then. If the copy was sent but the delete failed, a repeat
// of DeadLetter only deletes. Without a dead-letter queue it returns
// [ErrNoDeadLetterQueue] and leaves the message in flight.
func (d *Delivery) DeadLetter(ctx context.Context, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return fmt.Errorf("sqsqueue: dead-letter message %s: %w", d.msg.ID, queue.ErrSettled)
	}
	if d.q.dlqURL == "" {
		return fmt.Errorf("sqsqueue: dead-letter message %s from %s: %w", d.msg.ID, d.q.url, ErrNoDeadLetterQueue)
	}
	if !d.dlqSent {
		if d.lapsed(time.Now()) {
			return d.staleErr("dead-letter")
		}
		if err := d.q.sendDeadLetter(ctx, d.msg, d.attrs, reason); err != nil {
			return err
		}
		d.dlqSent = true
	}
	if err := d.q.del.delete(ctx, d.handle); err != nil {
		return d.sqsErr("dead-letter (delete after the copy was sent)", err)
	}
	d.settled = true
	return nil
}

// SendDeadLetter sends a copy of m to the queue's dead-letter queue as
// [Delivery.DeadLetter] does (same body and attributes, reason in
// [ReasonAttribute], m.ID in [SourceIDAttribute]; on a FIFO dead-letter
// queue m's group, or "dead-letter" when it has none, and m.ID as the dedup
// id), without deleting anything. It is for messages received by other
// means, such as an AWS Lambda SQS event (lambdasqs.WithDeadLetter). It
// returns [ErrNoDeadLetterQueue] when the Queue has none.
//
// m.Attributes are strings: on their own they go as String attributes.
// When ctx carries the Lambda record m came from ([lambdasqs.Record], as
// lambdasqs's DeadLetter gives it) and m's attributes are still the
// record's, the copy takes the record's attributes instead, with their
// data types (Number, Binary, custom types such as "Binary.gzip") and
// Binary values as SQS delivered them.
func (q *Queue) SendDeadLetter(ctx context.Context, m queue.Message, reason string) error {
	return q.sendDeadLetter(ctx, m, recordAttributes(ctx, m), reason)
}

// recordAttributes returns the message attributes of the Lambda record in
// ctx as SQS types, if the record is m's and m's attributes are the
// record's in string form (a sender that changed them gets them as
// given); nil otherwise.
func recordAttributes(ctx context.Context, m queue.Message) map[string]types.MessageAttributeValue {
	r, ok := lambdasqs.Record(ctx)
	if !ok || r.MessageId != m.ID || len(r.MessageAttributes) == 0 || len(r.MessageAttributes) != len(m.Attributes) {
		return nil
	}
	out := make(map[string]types.MessageAttributeValue, len(r.MessageAttributes))
	for k, v := range r.MessageAttributes {
		if got, ok := m.Attributes[k]; !ok || got != sqsmsg.Attribute(v.StringValue, v.BinaryValue) || v.DataType == "" {
			return nil
		}
		out[k] = types.MessageAttributeValue{DataType: aws.String(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
	}
	return out
}

// sendDeadLetter is SendDeadLetter with the message's attributes as SQS
// delivered them (raw, nil when unknown): a Delivery's copy keeps their
// data types (Number, Binary, custom types) and Binary values as they were,
// which m.Attributes, strings only, cannot.
func (q *Queue) sendDeadLetter(ctx context.Context, m queue.Message, raw map[string]types.MessageAttributeValue, reason string) error {
	if q.dlqURL == "" {
		return fmt.Errorf("sqsqueue: dead-letter message %s from %s: %w", m.ID, q.url, ErrNoDeadLetterQueue)
	}
	attrs := make(map[string]types.MessageAttributeValue, len(m.Attributes)+2)
	if raw != nil {
		for k, v := range raw {
			attrs[k] = types.MessageAttributeValue{DataType: v.DataType, StringValue: v.StringValue, BinaryValue: v.BinaryValue}
		}
	} else {
		for k, v := range m.Attributes {
			if v == "" {
				continue
			}
			attrs[k] = stringAttribute(v)
		}
	}
	if reason = cleanReason(reason); reason != "" && len(attrs) < maxAttributes {
		attrs[ReasonAttribute] = stringAttribute(reason)
	}
	if len(attrs) < maxAttributes && m.ID != "" {
		attrs[SourceIDAttribute] = stringAttribute(m.ID)
	}
	in := &sqs.SendMessageInput{
		QueueUrl:          aws.String(q.dlqURL),
		MessageBody:       aws.String(string(m.Body)),
		MessageAttributes: attrs,
	}
	if q.dlqFIFO {
		g := m.GroupID
		if g == "" {
			g = "dead-letter"
		}
		in.MessageGroupId = aws.String(g)
		if m.ID != "" {
			in.MessageDeduplicationId = aws.String(m.ID)
		}
	}
	if _, err := q.client.SendMessage(ctx, in); err != nil {
		return fmt.Errorf("sqsqueue: dead-letter message %s to %s: %w", m.ID, q.dlqURL, err)
	}
	return nil
}

// cleanReason keeps reason within what SQS accepts in a String attribute.
func cleanReason(s string) string {
	return strings.Map(func(r rune) rune {
		if sqsRune(r) {
			return r
		}
		return utf8.RuneError
	}, reason.Bound(s))
}

// ChangeVisibility sets the visibility of the message received with
// receiptHandle to d from now (rounded up to whole seconds, at most 12
// hours; 0: visible at once). It is for messages received by other means,
// such as an AWS Lambda SQS event (lambdasqs.WithRetryDelay); a Delivery's
// Retry and Extend do this for messages a Queue received. SQS's refusal of
// the handle is returned wrapping [ErrStaleReceipt].
func (q *Queue) ChangeVisibility(ctx context.Context, receiptHandle string, d time.Duration) error {
	_, err := q.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(q.url),
		ReceiptHandle:     aws.String(receiptHandle),
		VisibilityTimeout: seconds(d),
	})
	if err == nil {
		return nil
	}
	var inv *types.ReceiptHandleIsInvalid
	var nif *types.MessageNotInflight
	if errors.As(err, &inv) || errors.As(err, &nif) || isStaleCode(err) {
		return fmt.Errorf("sqsqueue: change visibility on %s: %w: %w", q.url, ErrStaleReceipt, err)
	}
	return fmt.Errorf("sqsqueue: change visibility on %s: %w", q.url, err)
}
