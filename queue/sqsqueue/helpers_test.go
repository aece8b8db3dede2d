package sqsqueue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// client returns an SQS client for the emulator named by IDEM_TEST_SQS,
// skipping the test when it is unset.
func client(t testing.TB) *sqs.Client {
	t.Helper()
	url := testenv.Require(t, testenv.SQS, "the SQS suite (local-aws-sqs; .ci/services/60-local-aws-sqs.sh starts it)")
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "idem tests"}, nil
		}),
	})
}

// queueSpec describes a queue to create for one test.
type queueSpec struct {
	fifo         bool
	contentDedup bool
	visibility   time.Duration // 0: SQS's default 30 s
	dlqARN       string        // set a RedrivePolicy to this queue
	maxReceives  int
}

// newQueue creates a queue with a name unique to the test and deletes it at
// cleanup; it returns the queue's URL and ARN.
func newQueue(t testing.TB, c *sqs.Client, s queueSpec) (url, arn string) {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	rand.Read(b)
	name := "idem-" + regexp.MustCompile(`[^A-Za-z0-9_-]+`).ReplaceAllString(t.Name(), "-")
	if len(name) > 60 {
		name = name[:60]
	}
	name += "-" + hex.EncodeToString(b)
	attrs := map[string]string{}
	if s.fifo {
		name += ".fifo"
		attrs["FifoQueue"] = "true"
		if s.contentDedup {
			attrs["ContentBasedDeduplication"] = "true"
		}
	}
	if s.visibility > 0 {
		attrs["VisibilityTimeout"] = strconv.Itoa(int(s.visibility / time.Second))
	}
	if s.dlqARN != "" {
		attrs["RedrivePolicy"] = `{"deadLetterTargetArn":"` + s.dlqARN + `","maxReceiveCount":"` + strconv.Itoa(s.maxReceives) + `"}`
	}
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("CreateQueue %s: %v", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		if _, err := c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Errorf("DeleteQueue %s: %v", url, err)
		}
	})
	a, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		t.Fatal(err)
	}
	return url, a.Attributes["QueueArn"]
}

func open(t testing.TB, c sqsqueue.Client, url string, o sqsqueue.Options) *sqsqueue.Queue {
	t.Helper()
	if o.WaitTime == 0 {
		o.WaitTime = time.Second
	}
	q, err := sqsqueue.Open(context.Background(), c, url, o)
	if err != nil {
		t.Fatalf("Open %s: %v", url, err)
	}
	return q
}

func publish(t testing.TB, q *sqsqueue.Queue, m queue.Outgoing) queue.Published {
	t.Helper()
	p, err := q.Publish(context.Background(), m)
	if err != nil {
		t.Fatalf("Publish %q: %v", m.Body, err)
	}
	return p
}

// receive waits up to 10 s for deliveries.
func receive(t testing.TB, q *sqsqueue.Queue, n int) []queue.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, err := q.Receive(ctx, n)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return ds
}

// receiveAll receives until want deliveries have arrived (10 s at most).
func receiveAll(t testing.TB, q *sqsqueue.Queue, want int) []queue.Delivery {
	t.Helper()
	var all []queue.Delivery
	for len(all) < want {
		all = append(all, receive(t, q, min(10, want-len(all)))...)
	}
	return all
}

// nothing asserts that no message becomes receivable within d. It polls
// without waiting (a long poll cut off by a deadline could take a message
// out of the queue after the test stopped looking).
func nothing(t testing.TB, q *sqsqueue.Queue, d time.Duration) {
	t.Helper()
	c := client(t)
	for end := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(q.URL()), MaxNumberOfMessages: 10,
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("ReceiveMessage: %v", err)
		}
		if n := len(out.Messages); n > 0 {
			m := out.Messages[0]
			t.Fatalf("received %d message(s) (first %s %q, receive count %s), want none within %v",
				n, aws.ToString(m.MessageId), aws.ToString(m.Body), m.Attributes["ApproximateReceiveCount"], d)
		}
		if time.Now().After(end) {
			return
		}
	}
}
