package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// provider is an in-memory SES: it keeps every send with its token.
type provider struct {
	mu            sync.Mutex
	sent          map[string][]string // token -> message ids
	n             int
	failAfterSend string // the next send with this token goes out, then its answer is lost
}

func (p *provider) Send(ctx context.Context, to, subject, token string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == nil {
		p.sent = map[string][]string{}
	}
	p.n++
	id := fmt.Sprintf("ses-%03d", p.n)
	p.sent[token] = append(p.sent[token], id)
	if token == p.failAfterSend {
		p.failAfterSend = ""
		return "", errors.New("ses: connection reset after the message was accepted")
	}
	return id, nil
}

func (p *provider) Find(ctx context.Context, token string) (string, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ids := p.sent[token]; len(ids) > 0 {
		return ids[0], true, nil
	}
	return "", false, nil
}

func (p *provider) emails(booking string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent[idem.Key("booking-confirmed", booking).String()])
}

func record(id, booking string, receives int) events.SQSMessage {
	return events.SQSMessage{
		MessageId: id, ReceiptHandle: "rh-" + id, EventSource: "aws:sqs",
		Body: fmt.Sprintf(`{"bookingId":%q,"email":"guest@example.com"}`, booking),
		Attributes: map[string]string{
			"ApproximateReceiveCount": strconv.Itoa(receives),
			"SentTimestamp":           strconv.FormatInt(time.Now().UnixMilli(), 10),
		},
	}
}

// invoke runs one Lambda invocation with a 10-second function timeout (a
// typical Lambda's) and returns the ids of the records reported failed.
func invoke(t *testing.T, h func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), recs ...events.SQSMessage) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h(ctx, events.SQSEvent{Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, f := range res.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	return failed
}

// invokeWithin is invoke with a function timeout of d.
func invokeWithin(t *testing.T, h func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), d time.Duration, recs ...events.SQSMessage) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := h(ctx, events.SQSEvent{Records: recs})
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, f := range res.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	return failed
}

// gatedProvider is a provider whose first send signals entered and waits
// for gate.
type gatedProvider struct {
	provider
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (p *gatedProvider) Send(ctx context.Context, to, subject, token string) (string, error) {
	p.once.Do(func() {
		close(p.entered)
		<-p.gate
	})
	return p.provider.Send(ctx, to, subject, token)
}

// stores are the ledgers the checks run on: SQLite always, DynamoDB (the
// production one) on dynalite when IDEM_TEST_DYNAMODB is set.
func stores(t *testing.T) map[string]func(t *testing.T) store.Store {
	return map[string]func(t *testing.T) store.Store{
		"sqlite": func(t *testing.T) store.Store {
			s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"dynamodb": func(t *testing.T) store.Store {
			ep := testenv.Require(t, testenv.DynamoDB, "the booking example on DynamoDB")
			client := dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(ep),
				Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
					return aws.Credentials{AccessKeyID: "x", SecretAccessKey: "x"}, nil
				})})
			var b [6]byte
			rand.Read(b[:])
			table := "booking-" + hex.EncodeToString(b[:])
			if err := dynamostore.CreateTable(context.Background(), client, table); err != nil && !errors.Is(err, dynamostore.ErrTTLUnsupported) {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
			})
			return dynamostore.New(client, table)
		},
	}
}

// The scenario's "Prevent": test sequential duplicate suppression and
// send/record failures; and the race it names, two workers checking before
// either records.
func TestSeed002(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	for name, open := range stores(t) {
		t.Run(name+"/sequential_duplicates", func(t *testing.T) {
			mail := &provider{}
			h, err := Handler(open(t), mail, quiet)
			if err != nil {
				t.Fatal(err)
			}
			// The same booking published twice (two message ids) in one
			// batch: one sends; the other, if it met the first's claim, is
			// reported failed, comes back and is skipped as done.
			failed := invoke(t, h, record("m1", "b-7", 1), record("m2", "b-7", 1))
			if len(failed) > 1 {
				t.Fatalf("failed records %v, want at most the copy that met the running send", failed)
			}
			for _, id := range append(failed, "m1") {
				if again := invoke(t, h, record(id, "b-7", 2)); len(again) != 0 {
					t.Fatalf("redelivery of %s: failed %v, want none (skipped, already done)", id, again)
				}
			}
			if n := mail.emails("b-7"); n != 1 {
				t.Fatalf("%d emails for one booking, want 1", n)
			}
		})
		t.Run(name+"/send_succeeds_record_fails", func(t *testing.T) {
			mail := &provider{failAfterSend: idem.Key("booking-confirmed", "b-8").String()}
			h, err := Handler(open(t), mail, quiet)
			if err != nil {
				t.Fatal(err)
			}
			if failed := invoke(t, h, record("m1", "b-8", 1), record("m2", "b-9", 1)); len(failed) != 1 || failed[0] != "m1" {
				t.Fatalf("failed records %v, want only m1 (the partial batch response keeps m2 done)", failed)
			}
			// SQS redelivers m1: the provider's log shows the send, so no
			// second email.
			if failed := invoke(t, h, record("m1", "b-8", 2)); len(failed) != 0 {
				t.Fatalf("redelivery of m1: failed %v, want none", failed)
			}
			if n := mail.emails("b-8"); n != 1 {
				t.Fatalf("%d emails for b-8 after a lost answer and a redelivery, want 1", n)
			}
		})
		t.Run(name+"/two_workers_at_once", func(t *testing.T) {
			// The race: two workers both past the check before either
			// records. Worker 1's send is held until worker 2's invocation
			// has returned, so the two overlap for certain.
			st := open(t)
			mail := &gatedProvider{entered: make(chan struct{}), gate: make(chan struct{})}
			h1, err := Handler(st, mail, quiet)
			if err != nil {
				t.Fatal(err)
			}
			h2, _ := Handler(st, mail, quiet)
			first := make(chan []string, 1)
			go func() { first <- invoke(t, h1, record("m1", "b-10", 1)) }()
			select {
			case <-mail.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("worker 1 never reached the send")
			}
			// Worker 2 gets the same booking while worker 1 is sending: the
			// conditional claim refuses it (busy) and its record is reported
			// failed, to come back.
			if failed := invoke(t, h2, record("m2", "b-10", 1)); len(failed) != 1 || failed[0] != "m2" {
				t.Fatalf("worker 2 during worker 1's send: failed %v, want [m2] (busy, not sent, not acked)", failed)
			}
			close(mail.gate)
			if failed := <-first; len(failed) != 0 {
				t.Fatalf("worker 1: failed %v, want none", failed)
			}
			if n := mail.emails("b-10"); n != 1 {
				t.Fatalf("two overlapping workers: %d emails, want 1", n)
			}
			// SQS redelivers m2: skipped, already done.
			if again := invoke(t, h2, record("m2", "b-10", 2)); len(again) != 0 {
				t.Fatalf("the busy record's redelivery failed again: %v", again)
			}
			if n := mail.emails("b-10"); n != 1 {
				t.Fatalf("after the redelivery: %d emails, want 1", n)
			}
		})
		t.Run(name+"/send_succeeds_mark_done_fails_once", func(t *testing.T) {
			// markDone fails once (a throttled write): the ledger retries
			// it, the invocation succeeds, one email.
			fs := idemtest.NewFaultStore(open(t))
			mail := &provider{}
			h, err := Handler(fs, mail, quiet)
			if err != nil {
				t.Fatal(err)
			}
			fs.Inject(idemtest.OpComplete, idemtest.Fault{Err: errors.New("dynamodb: ProvisionedThroughputExceededException (injected)"), Times: 1})
			if failed := invoke(t, h, record("m1", "b-12", 1)); len(failed) != 0 {
				t.Fatalf("failed %v, want none: the completion was retried", failed)
			}
			if n, calls := mail.emails("b-12"), fs.Calls(idemtest.OpComplete); n != 1 || calls != 2 {
				t.Fatalf("%d emails, %d completion writes; want 1 and 2", n, calls)
			}
			rec, err := fs.Unwrap().Get(context.Background(), idem.Key("booking-confirmed", "b-12").String())
			if err != nil || rec.Status != idem.StatusCompleted {
				t.Fatalf("record %+v, %v; want completed", rec, err)
			}
		})
		t.Run(name+"/send_succeeds_mark_done_fails", func(t *testing.T) {
			// The first cause of two emails: the email goes out, then markDone (the
			// ledger's completion write) fails for as long as the ledger
			// retries it. The record comes back; after its lease lapses the
			// provider is asked and the send is found: no second email.
			fs := idemtest.NewFaultStore(open(t))
			mail := &provider{}
			h, err := Handler(fs, mail, quiet)
			if err != nil {
				t.Fatal(err)
			}
			fs.Inject(idemtest.OpComplete, idemtest.Fault{Err: errors.New("dynamodb: ProvisionedThroughputExceededException (injected)")})
			// A short invocation: the lease is bounded by its deadline.
			if failed := invokeWithin(t, h, 3*time.Second, record("m1", "b-11", 1)); len(failed) != 1 {
				t.Fatalf("failed %v, want [m1]: its completion was not recorded", failed)
			}
			if calls := fs.Calls(idemtest.OpComplete); calls < 2 {
				t.Fatalf("%d completion writes, want them retried", calls)
			}
			fs.Heal(idemtest.OpComplete)
			if n := mail.emails("b-11"); n != 1 {
				t.Fatalf("%d emails after the first invocation, want 1", n)
			}
			key := idem.Key("booking-confirmed", "b-11").String()
			held, err := fs.Unwrap().Get(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if lease := held.LeaseUntil.Sub(held.Journal[0].Started); lease > 3*time.Second {
				t.Fatalf("the attempt's lease is %v, want it bounded by the invocation's 3 s", lease)
			}
			time.Sleep(time.Until(held.LeaseUntil) + 100*time.Millisecond) // the lease lapses
			if failed := invoke(t, h, record("m1", "b-11", 3)); len(failed) != 0 {
				t.Fatalf("redelivery after the lease: failed %v, want none (the send found at the provider)", failed)
			}
			if n := mail.emails("b-11"); n != 1 {
				t.Fatalf("%d emails after markDone failed and SQS redelivered, want 1", n)
			}
			rec, err := fs.Unwrap().Get(context.Background(), key)
			if err != nil || rec.Status != idem.StatusCompleted || string(rec.Result) != "ses-001" {
				t.Fatalf("record %+v, %v; want completed with the first send's id", rec, err)
			}
		})
	}
}
