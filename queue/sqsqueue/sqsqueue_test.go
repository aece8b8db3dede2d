package sqsqueue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqsqueue"
)

func TestPublishReceiveAck(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{})
	if q.Visibility() != 30*time.Second {
		t.Errorf("Visibility() = %v, want the queue's default 30s", q.Visibility())
	}
	before := time.Now().Add(-2 * time.Second)
	p := publish(t, q, queue.Outgoing{Body: []byte(`{"order":8891}`), Attributes: map[string]string{"kind": "receipt"}})
	if p.ID == "" || p.Duplicate {
		t.Fatalf("Publish = %+v, want an id and Duplicate false", p)
	}
	ds := receive(t, q, 10)
	if len(ds) != 1 {
		t.Fatalf("received %d deliveries, want 1", len(ds))
	}
	m := ds[0].Message()
	if m.ID != p.ID || string(m.Body) != `{"order":8891}` || m.Attributes["kind"] != "receipt" {
		t.Errorf("message = %+v, want id %s, the body and attribute kind=receipt", m, p.ID)
	}
	if m.ReceiveCount != 1 {
		t.Errorf("ReceiveCount = %d, want 1", m.ReceiveCount)
	}
	after := time.Now().Add(2 * time.Second)
	if m.Published.Before(before) || m.Published.After(after) {
		t.Errorf("Published = %v, want between %v and %v", m.Published, before, after)
	}
	if m.FirstReceived.Before(m.Published) || m.FirstReceived.After(after) {
		t.Errorf("FirstReceived = %v, want between Published %v and %v", m.FirstReceived, m.Published, after)
	}
	if m.GroupID != "" || m.DedupID != "" {
		t.Errorf("standard queue message has GroupID %q DedupID %q, want none", m.GroupID, m.DedupID)
	}
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := ds[0].Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
		t.Errorf("second Ack = %v, want ErrSettled", err)
	}
	if err := ds[0].Extend(context.Background(), time.Second); !errors.Is(err, queue.ErrSettled) {
		t.Errorf("Extend after Ack = %v, want ErrSettled", err)
	}
	nothing(t, q, 1500*time.Millisecond)
}

func TestReceiveReturnsContextError(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{WaitTime: 20 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(300 * time.Millisecond); cancel() }()
	start := time.Now()
	ds, err := q.Receive(ctx, 10)
	if len(ds) != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive = %d deliveries, %v; want none and context.Canceled", len(ds), err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("Receive returned %v after the cancel, want it to stop its long poll", el)
	}
}

// A message whose visibility lapses is redelivered with receive count 2;
// the first delivery's Ack then reports the stale receipt instead of
// pretending to have deleted it, and the current delivery's Ack works.
func TestVisibilityLapseAndStaleReceipt(t *testing.T) {
	t.Parallel()
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			t.Parallel()
			c := client(t)
			url, _ := newQueue(t, c, queueSpec{fifo: fifo, visibility: 2 * time.Second})
			q := open(t, c, url, sqsqueue.Options{})
			if q.Visibility() != 2*time.Second {
				t.Fatalf("Visibility() = %v, want the queue's 2s", q.Visibility())
			}
			p := publish(t, q, queue.Outgoing{Body: []byte("lapse"), GroupID: "g", DedupID: "d1"})
			first := receive(t, q, 1)[0]
			second := receive(t, q, 1)[0] // only after the 2 s visibility lapsed
			m1, m2 := first.Message(), second.Message()
			if m1.ID != p.ID || m2.ID != p.ID {
				t.Fatalf("ids %s, %s; want both %s", m1.ID, m2.ID, p.ID)
			}
			if m1.ReceiveCount != 1 || m2.ReceiveCount != 2 {
				t.Errorf("receive counts %d, %d; want 1, 2", m1.ReceiveCount, m2.ReceiveCount)
			}
			if !m2.FirstReceived.Equal(m1.FirstReceived) {
				t.Errorf("FirstReceived moved on redelivery: %v then %v", m1.FirstReceived, m2.FirstReceived)
			}
			if fifo && (m2.GroupID != "g" || m2.DedupID != "d1") {
				t.Errorf("FIFO message GroupID %q DedupID %q, want g, d1", m2.GroupID, m2.DedupID)
			}
			if err := first.Ack(context.Background()); !errors.Is(err, sqsqueue.ErrStaleReceipt) {
				t.Fatalf("Ack with the lapsed receipt = %v, want ErrStaleReceipt", err)
			}
			if err := first.Extend(context.Background(), time.Minute); !errors.Is(err, sqsqueue.ErrStaleReceipt) {
				t.Errorf("Extend with the lapsed receipt = %v, want ErrStaleReceipt", err)
			}
			if err := first.Retry(context.Background(), 0); !errors.Is(err, sqsqueue.ErrStaleReceipt) {
				t.Errorf("Retry with the lapsed receipt = %v, want ErrStaleReceipt", err)
			}
			// The stale holder touched nothing: the current holder still has
			// the message invisible and can ack it.
			if err := second.Ack(context.Background()); err != nil {
				t.Fatalf("Ack with the current receipt: %v", err)
			}
			nothing(t, q, 2500*time.Millisecond)
		})
	}
}

// A FIFO queue refuses a receipt handle that is no longer current even
// before the holder's visibility ran out (here another actor made the
// message visible and it was received again).
func TestServerRefusesStaleReceipt(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{fifo: true})
	q := open(t, c, url, sqsqueue.Options{})
	publish(t, q, queue.Outgoing{Body: []byte("x"), GroupID: "g", DedupID: "x"})
	first := receive(t, q, 1)[0]
	if _, err := c.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(url), ReceiptHandle: aws.String(first.(*sqsqueue.Delivery).ReceiptHandle()), VisibilityTimeout: 0,
	}); err != nil {
		t.Fatal(err)
	}
	second := receive(t, q, 1)[0]
	if second.Message().ID != first.Message().ID || second.Message().ReceiveCount != 2 {
		t.Fatalf("second delivery %s (count %d), want %s again", second.Message().ID, second.Message().ReceiveCount, first.Message().ID)
	}
	if err := q.ChangeVisibility(context.Background(), first.(*sqsqueue.Delivery).ReceiptHandle(), time.Minute); !errors.Is(err, sqsqueue.ErrStaleReceipt) {
		t.Errorf("ChangeVisibility with the superseded receipt = %v, want ErrStaleReceipt", err)
	}
	if err := first.Ack(context.Background()); !errors.Is(err, sqsqueue.ErrStaleReceipt) {
		t.Fatalf("Ack with the superseded receipt = %v, want ErrStaleReceipt", err)
	}
	if err := second.Ack(context.Background()); err != nil {
		t.Fatalf("Ack with the current receipt: %v", err)
	}
	nothing(t, q, time.Second)
}

// A long poll whose caller gave up still runs to its end; what it brings is
// handed back at once instead of staying invisible for the visibility
// timeout (30 s here).
func TestAbandonedPollHandsBack(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{WaitTime: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if ds, err := q.Receive(ctx, 10); len(ds) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive = %d deliveries, %v; want none and DeadlineExceeded", len(ds), err)
	}
	// The abandoned poll is still waiting on the queue: it takes this one.
	publish(t, q, queue.Outgoing{Body: []byte("caught by the abandoned poll")})
	time.Sleep(500 * time.Millisecond)
	d := receive(t, q, 1)[0] // within 10 s, not after the 30 s visibility timeout
	if d.Message().ReceiveCount != 2 {
		t.Errorf("ReceiveCount %d, want 2 (the abandoned poll's receive, then this one)", d.Message().ReceiveCount)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Extend (the consumer's heartbeat) keeps a message invisible past its
// visibility timeout; without it the message comes back.
func TestExtendKeepsMessageInvisible(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{Visibility: 2 * time.Second})
	if q.Visibility() != 2*time.Second {
		t.Fatalf("Visibility() = %v, want the configured 2s", q.Visibility())
	}
	publish(t, q, queue.Outgoing{Body: []byte("slow work")})
	d := receive(t, q, 1)[0]
	stop := make(chan struct{})
	var hb sync.WaitGroup
	var hbErr error
	hb.Go(func() {
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if err := d.Extend(context.Background(), 2*time.Second); err != nil {
					hbErr = err
					return
				}
			}
		}
	})
	nothing(t, q, 5*time.Second) // two and a half visibility timeouts
	close(stop)
	hb.Wait()
	if hbErr != nil {
		t.Fatalf("Extend: %v", hbErr)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatalf("Ack after heartbeats: %v", err)
	}
	nothing(t, q, 1500*time.Millisecond)
}

func TestRetry(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{})
	publish(t, q, queue.Outgoing{Body: []byte("again")})
	d := receive(t, q, 1)[0]
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatalf("Retry(0): %v", err)
	}
	if err := d.Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
		t.Errorf("Ack after Retry = %v, want ErrSettled", err)
	}
	d = receive(t, q, 1)[0] // at once: the queue's visibility is 30 s
	if d.Message().ReceiveCount != 2 {
		t.Errorf("ReceiveCount after Retry(0) = %d, want 2", d.Message().ReceiveCount)
	}
	start := time.Now()
	if err := d.Retry(context.Background(), 3*time.Second); err != nil {
		t.Fatalf("Retry(3s): %v", err)
	}
	nothing(t, q, time.Second)
	d = receive(t, q, 1)[0]
	if el := time.Since(start); el < 3*time.Second {
		t.Errorf("redelivered %v after Retry(3s)", el)
	}
	if d.Message().ReceiveCount != 3 {
		t.Errorf("ReceiveCount = %d, want 3", d.Message().ReceiveCount)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPublishDelay(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{})
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x"), Delay: 16 * time.Minute}); !errors.Is(err, sqsqueue.ErrDelayTooLong) {
		t.Errorf("Publish with a 16 min delay = %v, want ErrDelayTooLong", err)
	}
	start := time.Now()
	publish(t, q, queue.Outgoing{Body: []byte("later"), Delay: 1500 * time.Millisecond}) // rounded up to 2 s
	nothing(t, q, time.Second)
	d := receive(t, q, 1)[0]
	if el := time.Since(start); el < 1500*time.Millisecond {
		t.Errorf("delayed message arrived after %v, want >= 1.5s", el)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPublishRefusesBadInput(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	furl, _ := newQueue(t, c, queueSpec{fifo: true})
	q, fq := open(t, c, url, sqsqueue.Options{}), open(t, c, furl, sqsqueue.Options{})
	many := map[string]string{}
	for i := range 11 {
		many[fmt.Sprint("a", i)] = "v"
	}
	for _, tc := range []struct {
		name string
		q    *sqsqueue.Queue
		m    queue.Outgoing
		want error
	}{
		{"11 attributes", q, queue.Outgoing{Body: []byte("x"), Attributes: many}, sqsqueue.ErrBadAttribute},
		{"empty attribute", q, queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"k": ""}}, sqsqueue.ErrBadAttribute},
		{"FIFO without group", fq, queue.Outgoing{Body: []byte("x"), DedupID: "d"}, sqsqueue.ErrNoGroupID},
		{"FIFO without dedup id", fq, queue.Outgoing{Body: []byte("x"), GroupID: "g"}, sqsqueue.ErrNoDedupID},
		{"FIFO with delay", fq, queue.Outgoing{Body: []byte("x"), GroupID: "g", DedupID: "d", Delay: time.Second}, queue.ErrUnsupported},
		// SQS carries text: the SDK would turn invalid bytes into U+FFFD.
		{"body not UTF-8", q, queue.Outgoing{Body: []byte{'{', 0xff, 0xfe, 0x80, '}'}}, sqsqueue.ErrBadBody},
		{"body with NUL", q, queue.Outgoing{Body: []byte("a\x00b")}, sqsqueue.ErrBadBody},
		{"body with U+FFFF", q, queue.Outgoing{Body: []byte("a\uffffb")}, sqsqueue.ErrBadBody},
		{"attribute not UTF-8", q, queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"sig": "a\xffb"}}, sqsqueue.ErrBadAttribute},
		{"attribute with a control character", q, queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"k": "a\x01b"}}, sqsqueue.ErrBadAttribute},
		{"attribute name not UTF-8", q, queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"k\xff": "v"}}, sqsqueue.ErrBadAttribute},
		{"FIFO body not UTF-8", fq, queue.Outgoing{Body: []byte{0xc3}, GroupID: "g", DedupID: "d"}, sqsqueue.ErrBadBody},
	} {
		if _, err := tc.q.Publish(context.Background(), tc.m); !errors.Is(err, tc.want) {
			t.Errorf("%s: Publish = %v, want %v", tc.name, err, tc.want)
		}
	}
	nothing(t, q, time.Second)
	nothing(t, fq, time.Second)
}

// Text at the edges of what SQS accepts (tab, CR, LF, a real U+FFFD, a
// private-use and a four-byte character) is published, not refused, and
// arrives unchanged in the body and in an attribute.
func TestPublishTextEdges(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{})
	text := "a\tb\r\nc é \ufffd \ue000 \U0001F600 \U0010FFFD"
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte(text), Attributes: map[string]string{"note": text}}); err != nil {
		t.Fatalf("Publish(%q): %v", text, err)
	}
	d := receive(t, q, 1)[0]
	m := d.Message()
	if string(m.Body) != text || m.Attributes["note"] != text {
		t.Errorf("arrived as body %q, attribute %q; want %q for both", m.Body, m.Attributes["note"], text)
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A FIFO queue hands out a group's messages in order and holds a group back
// while an earlier message of it is in flight; other groups go on.
func TestFIFOGroupOrdering(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{fifo: true})
	q := open(t, c, url, sqsqueue.Options{})
	for i := range 3 {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "a%d", i), GroupID: "A", DedupID: fmt.Sprint("a", i)})
	}
	for i := range 2 {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "b%d", i), GroupID: "B", DedupID: fmt.Sprint("b", i)})
	}
	first := receive(t, q, 1)[0]
	if string(first.Message().Body) != "a0" || first.Message().GroupID != "A" {
		t.Fatalf("first delivery %q (group %q), want a0 of group A", first.Message().Body, first.Message().GroupID)
	}
	// A is blocked by a0 in flight; B's messages come, in order.
	var got []string
	for _, d := range receive(t, q, 10) {
		got = append(got, string(d.Message().Body))
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, ",") != "b0,b1" {
		t.Fatalf("while a0 was in flight received %v, want [b0 b1]", got)
	}
	nothing(t, q, time.Second)
	if err := first.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	got = nil
	for len(got) < 2 {
		d := receive(t, q, 1)[0]
		got = append(got, string(d.Message().Body))
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, ",") != "a1,a2" {
		t.Errorf("after a0's ack received %v, want [a1 a2]", got)
	}
}

// SQS FIFO drops a second send of a dedup id within 5 minutes and answers it
// with the first message's id; Publish reports it as a duplicate.
func TestFIFODedupID(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{fifo: true})
	q := open(t, c, url, sqsqueue.Options{})
	p1 := publish(t, q, queue.Outgoing{Body: []byte("charge 8891"), GroupID: "g", DedupID: "charge:8891"})
	p2 := publish(t, q, queue.Outgoing{Body: []byte("charge 8891 (resent)"), GroupID: "g", DedupID: "charge:8891"})
	p3 := publish(t, q, queue.Outgoing{Body: []byte("charge 8892"), GroupID: "g", DedupID: "charge:8892"})
	if p1.Duplicate || p3.Duplicate {
		t.Errorf("first sends reported as duplicates: %+v %+v", p1, p3)
	}
	if !p2.Duplicate || p2.ID != p1.ID {
		t.Errorf("resend = %+v, want Duplicate with the first id %s", p2, p1.ID)
	}
	ds := receiveAll(t, q, 2)
	if string(ds[0].Message().Body) != "charge 8891" || string(ds[1].Message().Body) != "charge 8892" {
		t.Errorf("received %q, %q; want the first send of each dedup id", ds[0].Message().Body, ds[1].Message().Body)
	}
	if err := sqsqueue.AckAll(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	nothing(t, q, time.Second)
}

func TestFIFOContentBasedDedup(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{fifo: true, contentDedup: true})
	q := open(t, c, url, sqsqueue.Options{})
	publish(t, q, queue.Outgoing{Body: []byte("same"), GroupID: "g"})
	publish(t, q, queue.Outgoing{Body: []byte("same"), GroupID: "g"})
	d := receive(t, q, 10)
	if len(d) != 1 {
		t.Fatalf("received %d copies of one body, want 1", len(d))
	}
	if err := d[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	nothing(t, q, time.Second)
}

func dlqMessages(t *testing.T, c *sqs.Client, url string, want int) []queue.Message {
	t.Helper()
	q := open(t, c, url, sqsqueue.Options{})
	var out []queue.Message
	for _, d := range receiveAll(t, q, want) {
		out = append(out, d.Message())
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestDeadLetterWithReason(t *testing.T) {
	t.Parallel()
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			t.Parallel()
			c := client(t)
			dlq, _ := newQueue(t, c, queueSpec{fifo: fifo})
			url, _ := newQueue(t, c, queueSpec{fifo: fifo})
			q := open(t, c, url, sqsqueue.Options{DeadLetterURL: dlq})
			p := publish(t, q, queue.Outgoing{Body: []byte("poison"), GroupID: "g", DedupID: "p1", Attributes: map[string]string{"tenant": "t7"}})
			d := receive(t, q, 1)[0]
			reason := "handler: permanent: card declined\x00 (code 51)"
			if err := d.DeadLetter(context.Background(), reason); err != nil {
				t.Fatalf("DeadLetter: %v", err)
			}
			if err := d.Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
				t.Errorf("Ack after DeadLetter = %v, want ErrSettled", err)
			}
			nothing(t, q, time.Second)
			got := dlqMessages(t, c, dlq, 1)[0]
			if string(got.Body) != "poison" || got.Attributes["tenant"] != "t7" {
				t.Errorf("dead letter = %q %v, want the body and the original attributes", got.Body, got.Attributes)
			}
			if r := got.Attributes[sqsqueue.ReasonAttribute]; r != "handler: permanent: card declined\uFFFD (code 51)" {
				t.Errorf("reason attribute = %q", r)
			}
			if got.Attributes[sqsqueue.SourceIDAttribute] != p.ID {
				t.Errorf("source id attribute = %q, want %s", got.Attributes[sqsqueue.SourceIDAttribute], p.ID)
			}
			if fifo && got.GroupID != "g" {
				t.Errorf("dead letter's group = %q, want the original g", got.GroupID)
			}
		})
	}
}

// Without an explicit DeadLetterURL, DeadLetter uses the queue's redrive
// policy target; SQS's own redrive moves a message that is never settled
// after maxReceiveCount receives, without a reason.
func TestRedrivePolicy(t *testing.T) {
	t.Parallel()
	c := client(t)
	dlq, dlqARN := newQueue(t, c, queueSpec{})
	url, _ := newQueue(t, c, queueSpec{visibility: time.Second, dlqARN: dlqARN, maxReceives: 2})
	q := open(t, c, url, sqsqueue.Options{})
	if q.DeadLetterURL() != dlq || q.MaxReceiveCount() != 2 {
		t.Fatalf("DeadLetterURL %q MaxReceiveCount %d, want %q and 2 from the RedrivePolicy", q.DeadLetterURL(), q.MaxReceiveCount(), dlq)
	}
	publish(t, q, queue.Outgoing{Body: []byte("reasoned")})
	d := receive(t, q, 1)[0]
	if err := d.DeadLetter(context.Background(), "bad payload"); err != nil {
		t.Fatal(err)
	}
	publish(t, q, queue.Outgoing{Body: []byte("crashes every time")})
	for want := 1; want <= 2; want++ {
		d := receive(t, q, 1)[0] // never settled: the visibility lapses
		if d.Message().ReceiveCount != want {
			t.Errorf("receive %d: ReceiveCount %d", want, d.Message().ReceiveCount)
		}
	}
	nothing(t, q, 2500*time.Millisecond)
	got := map[string]string{}
	for _, m := range dlqMessages(t, c, dlq, 2) {
		got[string(m.Body)] = m.Attributes[sqsqueue.ReasonAttribute]
	}
	if r, ok := got["reasoned"]; !ok || r != "bad payload" {
		t.Errorf("DeadLetter's copy: present %v, reason %q", ok, r)
	}
	if r, ok := got["crashes every time"]; !ok || r != "" {
		t.Errorf("redriven message: present %v, reason %q (SQS keeps none)", ok, r)
	}
}

func TestDeadLetterWithoutQueue(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{})
	publish(t, q, queue.Outgoing{Body: []byte("x")})
	d := receive(t, q, 1)[0]
	if err := d.DeadLetter(context.Background(), "r"); !errors.Is(err, sqsqueue.ErrNoDeadLetterQueue) {
		t.Fatalf("DeadLetter = %v, want ErrNoDeadLetterQueue", err)
	}
	// Nothing was lost: the delivery can still be settled.
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if d := receive(t, q, 1)[0]; string(d.Message().Body) != "x" {
		t.Fatalf("got %q back", d.Message().Body)
	}
}

// AckAll deletes 25 messages in three DeleteMessageBatch calls.
func TestAckAllBatches(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	cc := &countingClient{Client: c}
	q := open(t, cc, url, sqsqueue.Options{})
	for i := range 25 {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	ds := receiveAll(t, q, 25)
	if err := sqsqueue.AckAll(context.Background(), ds); err != nil {
		t.Fatalf("AckAll: %v", err)
	}
	if n, b := cc.counts(); n != 0 || b != 3 {
		t.Errorf("AckAll of 25 made %d DeleteMessage and %d DeleteMessageBatch calls, want 0 and 3", n, b)
	}
	err := sqsqueue.AckAll(context.Background(), ds[:2])
	if !errors.Is(err, queue.ErrSettled) {
		t.Errorf("second AckAll = %v, want ErrSettled", err)
	}
	nothing(t, q, 1500*time.Millisecond)
}

// Acks made together share delete calls, and each still gets its own
// answer.
func TestConcurrentAcksShareCalls(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	cc := &countingClient{Client: c}
	q := open(t, cc, url, sqsqueue.Options{})
	const n = 30
	for i := range n {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	ds := receiveAll(t, q, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, d := range ds {
		wg.Go(func() { errs[i] = d.Ack(context.Background()) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	single, batch := cc.counts()
	t.Logf("%d concurrent acks: %d DeleteMessage + %d DeleteMessageBatch calls", n, single, batch)
	if single+batch > n || batch > n/2 {
		t.Errorf("%d acks made %d DeleteMessage and %d DeleteMessageBatch calls", n, single, batch)
	}
	nothing(t, q, 1500*time.Millisecond)
}

// A delete that fails is reported, the delivery stays unsettled, and the
// message comes back.
func TestAckErrorIsNotDone(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{})
	fc := &countingClient{Client: c, failDeletes: true}
	q := open(t, fc, url, sqsqueue.Options{})
	publish(t, q, queue.Outgoing{Body: []byte("x")})
	d := receive(t, q, 1)[0]
	if err := d.Ack(context.Background()); !errors.Is(err, errInjected) {
		t.Fatalf("Ack = %v, want the injected error", err)
	}
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatalf("Retry after the failed Ack (still unsettled): %v", err)
	}
	if d := receive(t, q, 1)[0]; d.Message().ReceiveCount != 2 {
		t.Errorf("redelivery ReceiveCount %d, want 2", d.Message().ReceiveCount)
	}
}

var errInjected = errors.New("injected: connection reset")

// countingClient counts delete calls and can make them fail (a fault the
// emulator cannot produce on demand).
type countingClient struct {
	*sqs.Client
	failDeletes bool
	mu          sync.Mutex
	single      int
	batch       int
}

func (c *countingClient) counts() (single, batch int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.single, c.batch
}

func (c *countingClient) DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, o ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error) {
	c.mu.Lock()
	c.single++
	c.mu.Unlock()
	if c.failDeletes {
		return nil, errInjected
	}
	return c.Client.DeleteMessage(ctx, in, o...)
}

func (c *countingClient) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, o ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	c.mu.Lock()
	c.batch++
	c.mu.Unlock()
	if c.failDeletes {
		return nil, errInjected
	}
	return c.Client.DeleteMessageBatch(ctx, in, o...)
}

func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	url, _ := newQueue(t, c, queueSpec{})
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(url), Attributes: map[string]string{"VisibilityTimeout": "0"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sqsqueue.Open(ctx, c, url, sqsqueue.Options{}); err == nil {
		t.Error("Open of a queue with VisibilityTimeout 0 and no Options.Visibility succeeded")
	}
	if q, err := sqsqueue.Open(ctx, c, url, sqsqueue.Options{Visibility: 10 * time.Second}); err != nil {
		t.Errorf("Open with Options.Visibility 10s: %v", err)
	} else if q.Visibility() != 10*time.Second {
		t.Errorf("Visibility() = %v, want the configured 10s", q.Visibility())
	}
	if _, err := sqsqueue.Open(ctx, c, url+"-missing", sqsqueue.Options{}); err == nil {
		t.Error("Open of a missing queue succeeded")
	}
	for _, o := range []sqsqueue.Options{{Visibility: 13 * time.Hour}, {WaitTime: 21 * time.Second}, {Visibility: -1}} {
		if _, err := sqsqueue.Open(ctx, c, url, o); err == nil {
			t.Errorf("Open with %+v succeeded", o)
		}
	}
}

// A message sent by another producer may carry Binary and Number
// attributes; the dead-lettered copy must keep them as they were, not as
// String attributes (a Binary value that is not UTF-8 would be mangled, or
// refused by SQS, which would leave the message never dead-lettered).
func TestDeadLetterKeepsAttributeTypes(t *testing.T) {
	t.Parallel()
	c := client(t)
	dlq, _ := newQueue(t, c, queueSpec{})
	url, _ := newQueue(t, c, queueSpec{})
	q := open(t, c, url, sqsqueue.Options{DeadLetterURL: dlq})
	bin := []byte{0xff, 0x00, 0x80, 'x'}
	if _, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{
		QueueUrl: aws.String(url), MessageBody: aws.String("poison"),
		MessageAttributes: map[string]types.MessageAttributeValue{
			"bin":    {DataType: aws.String("Binary"), BinaryValue: bin},
			"num":    {DataType: aws.String("Number"), StringValue: aws.String("42")},
			"tenant": {DataType: aws.String("String"), StringValue: aws.String("t7")},
		},
	}); err != nil {
		t.Fatal(err)
	}
	d := receive(t, q, 1)[0]
	if err := d.DeadLetter(context.Background(), "permanent"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(dlq), MessageAttributeNames: []string{"All"}, WaitTimeSeconds: 5,
	})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("dead-letter queue: %d messages, %v", len(out.Messages), err)
	}
	a := out.Messages[0].MessageAttributes
	if v := a["bin"]; aws.ToString(v.DataType) != "Binary" || !bytes.Equal(v.BinaryValue, bin) {
		t.Errorf("bin on the dead letter = %s %q %q, want Binary %q", aws.ToString(v.DataType), aws.ToString(v.StringValue), v.BinaryValue, bin)
	}
	if v := a["num"]; aws.ToString(v.DataType) != "Number" || aws.ToString(v.StringValue) != "42" {
		t.Errorf("num on the dead letter = %s %q, want Number 42", aws.ToString(v.DataType), aws.ToString(v.StringValue))
	}
	if v := a["tenant"]; aws.ToString(v.DataType) != "String" || aws.ToString(v.StringValue) != "t7" {
		t.Errorf("tenant on the dead letter = %s %q, want String t7", aws.ToString(v.DataType), aws.ToString(v.StringValue))
	}
	if v := a[sqsqueue.ReasonAttribute]; aws.ToString(v.StringValue) != "permanent" {
		t.Errorf("reason = %q", aws.ToString(v.StringValue))
	}
}

// SQS takes a MessageGroupId or MessageDeduplicationId of at most 128
// characters from a small ASCII set. An idem key can be longer (up to 1,024
// bytes) or hold other characters (an event id with a space or an
// accent): such an id is sent as its SHA-256, so the publish is not refused
// (forever, for a webhook receiver's retries) and dedup still holds.
func TestFIFOLongAndNonASCIIIDs(t *testing.T) {
	t.Parallel()
	c := client(t)
	url, _ := newQueue(t, c, queueSpec{fifo: true})
	q := open(t, c, url, sqsqueue.Options{})
	long := "accept:" + strings.Repeat("x", 300)
	for _, id := range []string{long, "accept:évènement 42"} {
		p1 := publish(t, q, queue.Outgoing{Body: []byte("first " + id), GroupID: id, DedupID: id})
		p2 := publish(t, q, queue.Outgoing{Body: []byte("resent " + id), GroupID: id, DedupID: id})
		if p1.Duplicate || !p2.Duplicate || p2.ID != p1.ID {
			t.Errorf("%.20s…: publishes %+v and %+v, want the second a duplicate of the first", id, p1, p2)
		}
	}
	ds := receiveAll(t, q, 2)
	for _, d := range ds {
		m := d.Message()
		if !strings.HasPrefix(string(m.Body), "first ") {
			t.Errorf("received %q, want only the first send of each id", m.Body)
		}
		if len(m.GroupID) > 128 || len(m.DedupID) > 128 || m.GroupID != m.DedupID {
			t.Errorf("received GroupID %q DedupID %q", m.GroupID, m.DedupID)
		}
	}
	if err := sqsqueue.AckAll(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	nothing(t, q, time.Second)
}
