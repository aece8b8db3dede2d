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
	"github.com/idemkit/idem/internal/testenv"
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

// invoke runs one Lambda invocation with a 10-second function timeout (the
// seed's) and returns the ids of the records reported failed.
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

// stores are the ledgers the checks run on: SQLite always, DynamoDB (the
// seed's) on dynalite when IDEM_TEST_DYNAMODB is set.
func stores(t *testing.T) map[string]func(t *testing.T) idem.Store {
	return map[string]func(t *testing.T) idem.Store{
		"sqlite": func(t *testing.T) idem.Store {
			s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"dynamodb": func(t *testing.T) idem.Store {
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

// The seed's "Prevent": test sequential duplicate suppression and
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
			store := open(t)
			mail := &provider{}
			h1, err := Handler(store, mail, quiet)
			if err != nil {
				t.Fatal(err)
			}
			h2, _ := Handler(store, mail, quiet)
			var wg sync.WaitGroup
			var failed [2][]string
			for i, h := range []func(context.Context, events.SQSEvent) (events.SQSEventResponse, error){h1, h2} {
				wg.Go(func() { failed[i] = invoke(t, h, record(fmt.Sprintf("m%d", i), "b-10", 1)) })
			}
			wg.Wait()
			if n := mail.emails("b-10"); n != 1 {
				t.Fatalf("two concurrent invocations: %d emails, want 1", n)
			}
			// The loser (if it met the winner's claim) is reported failed
			// and comes back; then it is skipped as done.
			for i, f := range failed {
				if len(f) > 0 {
					if again := invoke(t, []func(context.Context, events.SQSEvent) (events.SQSEventResponse, error){h1, h2}[i], record(f[0], "b-10", 2)); len(again) != 0 {
						t.Fatalf("the busy record's redelivery failed again: %v", again)
					}
				}
			}
			if n := mail.emails("b-10"); n != 1 {
				t.Fatalf("after the redelivery: %d emails, want 1", n)
			}
		})
	}
}
