// Package sqsmsg reads an SQS message into a queue.Message, whether it came
// from ReceiveMessage (sqsqueue) or in an AWS Lambda event (lambdasqs): the
// one place that knows which system attribute fills which field and what a
// message attribute's string form is.
package sqsmsg

import (
	"strconv"
	"time"

	"github.com/idemkit/idem/queue"
)

// The system attributes Message reads, by SQS's names (the same in
// ReceiveMessage's answer and in a Lambda event's record).
const (
	groupID       = "MessageGroupId"
	dedupID       = "MessageDeduplicationId"
	firstReceived = "ApproximateFirstReceiveTimestamp"
	sent          = "SentTimestamp"
	receiveCount  = "ApproximateReceiveCount"
)

// Attribute is the string form of a message attribute in a queue.Message:
// its string value, or a Binary attribute's bytes.
func Attribute(stringValue *string, binaryValue []byte) string {
	if stringValue != nil {
		return *stringValue
	}
	return string(binaryValue)
}

// Attributes returns the message attributes attrs in their string form
// (see [Attribute]), value giving each one's string and binary value; nil
// when there are none.
func Attributes[V any](attrs map[string]V, value func(V) (stringValue *string, binaryValue []byte)) map[string]string {
	if len(attrs) == 0 {
		return nil
	}
	out := make(map[string]string, len(attrs))
	for k, v := range attrs {
		out[k] = Attribute(value(v))
	}
	return out
}

// Message returns the queue.Message of the SQS message with id, body,
// system attributes system and message attributes attrs (in string form):
// GroupID, DedupID, FirstReceived, Published and ReceiveCount come from
// system (zero when absent or unreadable).
func Message(id, body string, system, attrs map[string]string) queue.Message {
	m := queue.Message{
		ID:            id,
		Body:          []byte(body),
		GroupID:       system[groupID],
		DedupID:       system[dedupID],
		FirstReceived: millis(system[firstReceived]),
		Published:     millis(system[sent]),
		Attributes:    attrs,
	}
	m.ReceiveCount, _ = strconv.Atoi(system[receiveCount])
	return m
}

// millis reads a timestamp in Unix milliseconds (zero when s is not one).
func millis(s string) time.Time {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(n)
}
