package lambdasqs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/lambdasqs"
	"github.com/idemkit/idem/queue/sqsqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// fixture is a consumer over a real SQLite ledger whose handler counts its
// runs per message body; bodies are the operation keys.
type fixture struct {
	ledger *idem.Ledger
	mu     sync.Mutex
	runs   map[string]int
	fail   map[string]error                     // body -> error returned
	block  map[string]bool                      // body -> wait for ctx
	seen   map[string]func(ctx context.Context) // body -> called while running
	copts  []queue.Option                       // consumer options
}

func newFixture(t *testing.T, lease time.Duration) *fixture {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &fixture{
		ledger: idem.New(s, idem.WithLease(lease)),
		runs:   map[string]int{}, fail: map[string]error{}, block: map[string]bool{},
		seen: map[string]func(context.Context){},
	}
}

func (f *fixture) handler(t *testing.T, opts ...lambdasqs.Option) func(context.Context, events.SQSEvent) (events.SQSEventResponse, error) {
	t.Helper()
	key := func(m queue.Message) (idem.OperationKey, error) { return idem.Key("order", string(m.Body)), nil }
	h := func(ctx context.Context, m queue.Message) ([]byte, error) {
		body := string(m.Body)
		f.mu.Lock()
		f.runs[body]++
		err, block, seen := f.fail[body], f.block[body], f.seen[body]
		f.mu.Unlock()
		if seen != nil {
			seen(ctx)
		}
		if block {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []byte("done " + body), err
	}
	c, err := queue.NewConsumer(lambdasqs.Source(), f.ledger, key, h, f.copts...)
	if err != nil {
		t.Fatal(err)
	}
	return lambdasqs.Handler(c, opts...)
}

func (f *fixture) runCount(body string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs[body]
}

func invoke(t *testing.T, h func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), timeout time.Duration, recs ...events.SQSMessage) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := h(ctx, events.SQSEvent{Records: recs})
	if err != nil {
		t.Fatalf("handler returned an error (Lambda would fail the whole batch): %v", err)
	}
	return failures(resp)
}

// Two messages for one operation in one batch run the effect once; the one
// that found the key busy (if any) is reported failed and, redelivered,
// replays the result instead of running again.
func TestHandlerDuplicatesInOneBatchRunOnce(t *testing.T) {
	f := newFixture(t, time.Minute)
	h := f.handler(t)
	recs := []events.SQSMessage{
		record("m1", "8891", "", 1), record("m2", "8891", "", 1), record("m3", "8892", "", 1),
	}
	failed := invoke(t, h, 30*time.Second, recs...)
	if slices.Contains(failed, "m1") && slices.Contains(failed, "m2") || slices.Contains(failed, "m3") {
		t.Fatalf("BatchItemFailures = %v: at most one copy of 8891 may wait, 8892 must succeed", failed)
	}
	if f.runCount("8891") != 1 || f.runCount("8892") != 1 {
		t.Fatalf("runs: 8891 %d, 8892 %d; want 1 each", f.runCount("8891"), f.runCount("8892"))
	}
	// Lambda redelivers what failed; it is replayed, not run again.
	var again []events.SQSMessage
	for _, r := range recs {
		if slices.Contains(failed, r.MessageId) {
			r.Attributes["ApproximateReceiveCount"] = "2"
			again = append(again, r)
		}
	}
	if len(again) > 0 {
		if f2 := invoke(t, h, 30*time.Second, again...); len(f2) != 0 {
			t.Fatalf("redelivered duplicate reported failed again: %v", f2)
		}
	}
	if f.runCount("8891") != 1 {
		t.Fatalf("8891 ran %d times after the redelivery, want 1", f.runCount("8891"))
	}
}

func TestHandlerReportsOnlyFailedRecords(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.fail["bad"] = errors.New("payment service unavailable")
	h := f.handler(t)
	failed := invoke(t, h, 30*time.Second,
		record("m1", "ok1", "", 1), record("m2", "bad", "", 1), record("m3", "ok2", "", 1))
	if !slices.Equal(failed, []string{"m2"}) {
		t.Fatalf("BatchItemFailures = %v, want [m2]", failed)
	}
	// A retry that now succeeds.
	delete(f.fail, "bad")
	if failed := invoke(t, h, 30*time.Second, record("m2", "bad", "", 2)); len(failed) != 0 {
		t.Fatalf("retry reported %v, want success", failed)
	}
	if f.runCount("ok1") != 1 || f.runCount("bad") != 2 {
		t.Errorf("runs ok1 %d bad %d, want 1 and 2", f.runCount("ok1"), f.runCount("bad"))
	}
}

// Lambda's FIFO rule: after a failure in a group, the group's later records
// are reported failed (and not run); other groups go on.
func TestHandlerFIFOStopsTheFailedGroup(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.fail["a1"] = errors.New("temporarily down")
	h := f.handler(t)
	failed := invoke(t, h, 30*time.Second,
		record("A0", "a0", "A", 1), record("B0", "b0", "B", 1), record("A1", "a1", "A", 1),
		record("B1", "b1", "B", 1), record("A2", "a2", "A", 1), record("B2", "b2", "B", 1))
	if !slices.Equal(failed, []string{"A1", "A2"}) {
		t.Fatalf("BatchItemFailures = %v, want [A1 A2]", failed)
	}
	if n := f.runCount("a2"); n != 0 {
		t.Errorf("a2 ran %d times after a1 failed in its group, want 0", n)
	}
	for _, b := range []string{"a0", "a1", "b0", "b1", "b2"} {
		if f.runCount(b) != 1 {
			t.Errorf("%s ran %d times, want 1", b, f.runCount(b))
		}
	}
}

// A permanent failure is dead-lettered: without a sender the record is
// reported failed (SQS's redrive policy will move it); with one it is sent
// with its reason and reported done.
func TestHandlerDeadLetter(t *testing.T) {
	for _, withSender := range []bool{false, true} {
		t.Run(fmt.Sprintf("sender=%v", withSender), func(t *testing.T) {
			f := newFixture(t, time.Minute)
			f.fail["poison"] = idem.Permanent(errors.New("card declined"))
			var mu sync.Mutex
			var sent []string
			var opts []lambdasqs.Option
			if withSender {
				opts = append(opts, lambdasqs.WithDeadLetter(func(_ context.Context, m queue.Message, reason string) error {
					mu.Lock()
					defer mu.Unlock()
					sent = append(sent, m.ID+": "+reason)
					return nil
				}))
			}
			failed := invoke(t, f.handler(t, opts...), 30*time.Second, record("m1", "poison", "", 1), record("m2", "fine", "", 1))
			if withSender {
				if len(failed) != 0 {
					t.Errorf("BatchItemFailures = %v, want none (the poison message went to the DLQ)", failed)
				}
				if len(sent) != 1 || !strings.HasPrefix(sent[0], "m1: ") || !strings.Contains(sent[0], "card declined") {
					t.Errorf("sent to the DLQ: %q, want m1 with the reason", sent)
				}
			} else if !slices.Equal(failed, []string{"m1"}) {
				t.Errorf("BatchItemFailures = %v, want [m1]", failed)
			}
		})
	}
}

// The invocation's deadline bounds the work: a handler still running is
// cancelled before the deadline, its record reported failed, the response
// returned in time, and the ledger's lease on its key ends by the deadline.
func TestHandlerBoundedByInvocationDeadline(t *testing.T) {
	f := newFixture(t, 10*time.Minute)
	f.block["slow"] = true
	leaseUntil := make(chan time.Time, 1)
	f.seen["slow"] = func(context.Context) {
		_, err := f.ledger.Do(context.Background(), idem.Key("order", "slow"),
			func(context.Context) ([]byte, error) { return nil, nil })
		var busy *idem.InProgressError
		if errors.As(err, &busy) {
			leaseUntil <- busy.LeaseUntil
		} else {
			leaseUntil <- time.Time{}
		}
	}
	h := f.handler(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	resp, err := h(ctx, events.SQSEvent{Records: []events.SQSMessage{record("m1", "slow", "", 1), record("m2", "fast", "", 1)}})
	returned := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if !returned.Before(deadline) {
		t.Errorf("handler returned %v after the invocation deadline", returned.Sub(deadline))
	}
	if got := failures(resp); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("BatchItemFailures = %v, want [m1]", got)
	}
	lu := <-leaseUntil
	if lu.IsZero() {
		t.Fatal("a second attempt on the running key did not find it in progress")
	}
	if lu.After(deadline.Add(time.Second)) {
		t.Errorf("the ledger's lease ran until %v, past the invocation deadline %v (ledger lease 10m)", lu, deadline)
	}
}

// With an sqsqueue.Queue's SendDeadLetter as the sender, a permanent
// failure lands in the SQS dead-letter queue with its reason.
func TestHandlerDeadLetterToSQS(t *testing.T) {
	ctx := context.Background()
	c, urls := sqsQueues(t, "src", "dlq")
	q, err := sqsqueue.Open(ctx, c, urls[0], sqsqueue.Options{DeadLetterURL: urls[1]})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, time.Minute)
	f.fail["poison"] = idem.Permanent(errors.New("card declined"))
	if failed := invoke(t, f.handler(t, lambdasqs.WithDeadLetter(q.SendDeadLetter)), 30*time.Second, record("m1", "poison", "", 1)); len(failed) != 0 {
		t.Fatalf("BatchItemFailures = %v, want none", failed)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(urls[1]), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != "poison" {
		t.Fatalf("dead-letter queue holds %d messages, want the poison one", len(out.Messages))
	}
	a := out.Messages[0].MessageAttributes
	if r := aws.ToString(a[sqsqueue.ReasonAttribute].StringValue); !strings.Contains(r, "card declined") {
		t.Errorf("reason %q, want it to name the failure", r)
	}
	if id := aws.ToString(a[sqsqueue.SourceIDAttribute].StringValue); id != "m1" {
		t.Errorf("source id %q, want m1", id)
	}
}

// A record's message attributes reach the dead-letter queue as SQS
// delivered them to Lambda: the same data types (Number, Binary, and custom
// ones such as "Binary.gzip" and "Number.int") and the same bytes, whether
// or not they are valid UTF-8. The event is built from a real receive, as
// Lambda's event source mapping does.
func TestHandlerDeadLetterKeepsAttributeTypesOnSQS(t *testing.T) {
	ctx := context.Background()
	c, urls := sqsQueues(t, "typed", "typed-dlq")
	q, err := sqsqueue.Open(ctx, c, urls[0], sqsqueue.Options{DeadLetterURL: urls[1]})
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]types.MessageAttributeValue{
		"kind":   {DataType: aws.String("String"), StringValue: aws.String("receipt")},
		"amount": {DataType: aws.String("Number"), StringValue: aws.String("12.50")},
		"count":  {DataType: aws.String("Number.int"), StringValue: aws.String("7")},
		"raw":    {DataType: aws.String("Binary"), BinaryValue: []byte{0xff, 0x00, 0xfe, 'o', 'k', 0x80}},
		"gz":     {DataType: aws.String("Binary.gzip"), BinaryValue: []byte{0x1f, 0x8b, 0x08, 0x00, 0xc3}},
		"ascii":  {DataType: aws.String("Binary"), BinaryValue: []byte("plain")},
	}
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(urls[0]), MessageBody: aws.String("poison"),
		MessageAttributes: sent}); err != nil {
		t.Fatal(err)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(urls[0]), MaxNumberOfMessages: 1, WaitTimeSeconds: 1,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}, MessageAttributeNames: []string{"All"}})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("ReceiveMessage: %d messages, %v", len(out.Messages), err)
	}
	m := out.Messages[0]
	rec := events.SQSMessage{MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle),
		Body: aws.ToString(m.Body), Attributes: m.Attributes, MessageAttributes: map[string]events.SQSMessageAttribute{}}
	for k, v := range m.MessageAttributes {
		rec.MessageAttributes[k] = events.SQSMessageAttribute{DataType: aws.ToString(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
	}

	f := newFixture(t, time.Minute)
	f.fail["poison"] = idem.Permanent(errors.New("card declined"))
	if failed := invoke(t, f.handler(t, lambdasqs.WithDeadLetter(q.SendDeadLetter)), 30*time.Second, rec); len(failed) != 0 {
		t.Fatalf("BatchItemFailures = %v, want none (the record went to the dead-letter queue)", failed)
	}
	dl, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(urls[1]), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
		MessageAttributeNames: []string{"All"}})
	if err != nil || len(dl.Messages) != 1 {
		t.Fatalf("dead-letter queue: %d messages, %v; want the poison one", len(dl.Messages), err)
	}
	got := dl.Messages[0].MessageAttributes
	for k, want := range sent {
		g, ok := got[k]
		if !ok {
			t.Errorf("attribute %q missing from the dead-lettered copy", k)
			continue
		}
		if aws.ToString(g.DataType) != aws.ToString(want.DataType) || aws.ToString(g.StringValue) != aws.ToString(want.StringValue) ||
			!bytes.Equal(g.BinaryValue, want.BinaryValue) {
			t.Errorf("attribute %q: got %s %q %x, want %s %q %x", k, aws.ToString(g.DataType), aws.ToString(g.StringValue), g.BinaryValue,
				aws.ToString(want.DataType), aws.ToString(want.StringValue), want.BinaryValue)
		}
	}
	if r := aws.ToString(got[sqsqueue.ReasonAttribute].StringValue); !strings.Contains(r, "card declined") {
		t.Errorf("reason %q, want it to name the failure", r)
	}
}

// sqsQueues creates queues (deleted at cleanup) on the emulator that
// IDEM_TEST_SQS names and returns a client and their URLs.
func sqsQueues(t *testing.T, names ...string) (*sqs.Client, []string) {
	t.Helper()
	endpoint := testenv.Require(t, testenv.SQS, "the lambdasqs checks against SQS (local-aws-sqs; .ci/services/60-local-aws-sqs.sh starts it)")
	c := sqs.New(sqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	var urls []string
	for _, name := range names {
		out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(fmt.Sprintf("idem-lambdasqs-%s-%d", name, time.Now().UnixNano()))})
		if err != nil {
			t.Fatal(err)
		}
		url := aws.ToString(out.QueueUrl)
		urls = append(urls, url)
		t.Cleanup(func() {
			if _, err := c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
				t.Errorf("DeleteQueue %s: %v", url, err)
			}
		})
	}
	return c, urls
}

// With an sqsqueue.Queue's ChangeVisibility as the retry delay, a record
// the consumer retries comes back after the consumer's backoff, not after
// the queue's 30 s visibility timeout.
func TestHandlerRetryDelayOnSQS(t *testing.T) {
	ctx := context.Background()
	c, urls := sqsQueues(t, "retry")
	q, err := sqsqueue.Open(ctx, c, urls[0], sqsqueue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("flaky")}); err != nil {
		t.Fatal(err)
	}
	// What Lambda's event source mapping does: receive, then invoke.
	in := &sqs.ReceiveMessageInput{QueueUrl: aws.String(urls[0]), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}}
	out, err := c.ReceiveMessage(ctx, in)
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("ReceiveMessage: %d messages, %v", len(out.Messages), err)
	}
	m := out.Messages[0]
	rec := events.SQSMessage{MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body), Attributes: m.Attributes}

	f := newFixture(t, time.Minute)
	f.fail["flaky"] = errors.New("provider timed out")
	f.copts = []queue.Option{queue.WithBackoff(2*time.Second, 2*time.Second)} // 1 to 2 s with jitter
	start := time.Now()
	if failed := invoke(t, f.handler(t, lambdasqs.WithRetryDelay(q.ChangeVisibility)), 30*time.Second, rec); !slices.Equal(failed, []string{rec.MessageId}) {
		t.Fatalf("BatchItemFailures = %v, want [%s]", failed, rec.MessageId)
	}
	in.WaitTimeSeconds = 5
	out, err = c.ReceiveMessage(ctx, in)
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("the retried record did not come back within the backoff (+5 s): %d messages, %v", len(out.Messages), err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("came back after %v, want about the 2 s backoff, not the 30 s visibility timeout", el)
	}
	if n := out.Messages[0].Attributes["ApproximateReceiveCount"]; n != "2" {
		t.Errorf("ApproximateReceiveCount %s, want 2", n)
	}
}
