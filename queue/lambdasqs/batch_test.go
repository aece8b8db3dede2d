package lambdasqs_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/lambdasqs"
)

func record(id, body, group string, receives int) events.SQSMessage {
	r := events.SQSMessage{
		MessageId:     id,
		ReceiptHandle: "rh-" + id,
		Body:          body,
		Attributes: map[string]string{
			"ApproximateReceiveCount":          itoa(receives),
			"SentTimestamp":                    "1764460800000",
			"ApproximateFirstReceiveTimestamp": "1764460801500",
		},
		EventSource: "aws:sqs",
	}
	if group != "" {
		r.Attributes["MessageGroupId"] = group
		r.Attributes["MessageDeduplicationId"] = "dedup-" + id
	}
	return r
}

func itoa(n int) string { return strconv.Itoa(n) }

func failures(r events.SQSEventResponse) []string {
	var ids []string
	for _, f := range r.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	return ids
}

func TestRecordBecomesMessage(t *testing.T) {
	s := "receipt"
	r := record("m1", `{"order":8891}`, "g1", 3)
	r.MessageAttributes = map[string]events.SQSMessageAttribute{
		"kind": {StringValue: &s, DataType: "String"},
		"raw":  {BinaryValue: []byte{'o', 'k'}, DataType: "Binary"},
	}
	m := lambdasqs.NewBatch(events.SQSEvent{Records: []events.SQSMessage{r}}).Deliveries()[0].Message()
	if m.ID != "m1" || string(m.Body) != `{"order":8891}` || m.GroupID != "g1" || m.DedupID != "dedup-m1" || m.ReceiveCount != 3 {
		t.Errorf("message = %+v", m)
	}
	if !m.Published.Equal(time.UnixMilli(1764460800000)) || !m.FirstReceived.Equal(time.UnixMilli(1764460801500)) {
		t.Errorf("Published %v FirstReceived %v, want the record's SentTimestamp and ApproximateFirstReceiveTimestamp", m.Published, m.FirstReceived)
	}
	if m.Attributes["kind"] != "receipt" || m.Attributes["raw"] != "ok" {
		t.Errorf("attributes = %v", m.Attributes)
	}
}

// Ack is success; Retry, a DeadLetter without a sender, and no settle at all
// are failures, reported in the event's order.
func TestSettlingDecidesTheResponse(t *testing.T) {
	ctx := context.Background()
	ev := events.SQSEvent{Records: []events.SQSMessage{
		record("ack", "a", "", 1), record("retry", "b", "", 1), record("dl", "c", "", 1),
		record("unsettled", "d", "", 1), record("ack2", "e", "", 1),
	}}
	b := lambdasqs.NewBatch(ev)
	ds := b.Deliveries()
	if err := ds[0].Extend(ctx, time.Minute); err != nil {
		t.Errorf("Extend: %v", err)
	}
	must(t, ds[0].Ack(ctx))
	must(t, ds[1].Retry(ctx, 10*time.Second))
	must(t, ds[2].DeadLetter(ctx, "bad json"))
	must(t, ds[4].Ack(ctx))
	if got := failures(b.Response()); !slices.Equal(got, []string{"retry", "dl", "unsettled"}) {
		t.Errorf("BatchItemFailures = %v, want [retry dl unsettled]", got)
	}
	if r := ds[2].(*lambdasqs.Delivery).Reason(); r != "bad json" {
		t.Errorf("Reason() = %q", r)
	}
	for i, d := range ds[:3] {
		if err := d.Ack(ctx); !errors.Is(err, queue.ErrSettled) {
			t.Errorf("delivery %d: second settle = %v, want ErrSettled", i, err)
		}
		if err := d.Extend(ctx, time.Second); !errors.Is(err, queue.ErrSettled) {
			t.Errorf("delivery %d: Extend after settling = %v, want ErrSettled", i, err)
		}
	}
}

// With a dead-letter sender, a dead-lettered record is sent with its reason
// and counts as done; a failed send leaves it failed.
func TestDeadLetterSender(t *testing.T) {
	ctx := context.Background()
	type sent struct {
		id, reason string
	}
	var got []sent
	send := func(_ context.Context, m queue.Message, reason string) error {
		if string(m.Body) == "unsendable" {
			return errors.New("dead-letter queue unreachable")
		}
		got = append(got, sent{m.ID, reason})
		return nil
	}
	b := lambdasqs.NewBatch(events.SQSEvent{Records: []events.SQSMessage{
		record("poison", "x", "", 1), record("stuck", "unsendable", "", 1),
	}}, lambdasqs.WithDeadLetter(send))
	ds := b.Deliveries()
	must(t, ds[0].DeadLetter(ctx, "permanent failure: card declined"))
	if err := ds[1].DeadLetter(ctx, "also bad"); !errors.Is(err, lambdasqs.ErrNotDeadLettered) {
		t.Fatalf("DeadLetter with a failing sender = %v, want ErrNotDeadLettered", err)
	}
	if len(got) != 1 || got[0] != (sent{"poison", "permanent failure: card declined"}) {
		t.Errorf("sent %v", got)
	}
	if f := failures(b.Response()); !slices.Equal(f, []string{"stuck"}) {
		t.Errorf("BatchItemFailures = %v, want [stuck]", f)
	}
}

// On a FIFO queue a failure fails the rest of its group in the batch, and
// only its group.
func TestFIFOFailureFailsLaterRecordsOfItsGroup(t *testing.T) {
	ctx := context.Background()
	b := lambdasqs.NewBatch(events.SQSEvent{Records: []events.SQSMessage{
		record("a0", "", "A", 1), record("b0", "", "B", 1), record("a1", "", "A", 1),
		record("b1", "", "B", 1), record("a2", "", "A", 1),
	}})
	ds := b.Deliveries()
	must(t, ds[0].Ack(ctx))
	must(t, ds[1].Ack(ctx))
	must(t, ds[2].Retry(ctx, 0)) // a1 fails
	must(t, ds[3].Ack(ctx))
	must(t, ds[4].Ack(ctx)) // a2 acked all the same: must be reported failed
	if f := failures(b.Response()); !slices.Equal(f, []string{"a1", "a2"}) {
		t.Errorf("BatchItemFailures = %v, want [a1 a2]", f)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// With a retry-delay setter, Retry asks for the delay on the record's
// receipt handle; a failed call still leaves the record failed.
func TestRetryDelaySetter(t *testing.T) {
	ctx := context.Background()
	var calls []string
	set := func(_ context.Context, handle string, d time.Duration) error {
		calls = append(calls, handle+" "+d.String())
		if handle == "rh-down" {
			return errors.New("sqs unreachable")
		}
		return nil
	}
	b := lambdasqs.NewBatch(events.SQSEvent{Records: []events.SQSMessage{record("m1", "x", "", 1), record("down", "y", "", 1)}}, lambdasqs.WithRetryDelay(set))
	ds := b.Deliveries()
	must(t, ds[0].Retry(ctx, 4*time.Second))
	if err := ds[1].Retry(ctx, time.Second); err == nil {
		t.Error("Retry whose delay could not be set returned nil")
	}
	if !slices.Equal(calls, []string{"rh-m1 4s", "rh-down 1s"}) {
		t.Errorf("setter calls %q", calls)
	}
	if f := failures(b.Response()); !slices.Equal(f, []string{"m1", "down"}) {
		t.Errorf("BatchItemFailures = %v, want [m1 down]", f)
	}
}
