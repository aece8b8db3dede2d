// Command booking is a booking-confirmation email worker ("Two emails, one
// booking") built on idem: an AWS Lambda function fed by an SQS queue of
// booking-confirmed jobs, sending one confirmation per booking. Where a naive
// worker checks a completion record, sends, then records (two workers can
// both check before either records, and a crash after the send leaves no
// record), this one claims the booking's key first, with a
// lease bounded by the invocation's deadline, in a DynamoDB table with the
// fence in every condition; a send whose answer was lost is looked up at the
// provider before the key runs again; and the partial batch response
// returns only the records not done.
//
// Deployed, it reads IDEM_TABLE (the DynamoDB table, made with
// dynamostore.CreateTable) and runs under lambda.Start. Its tests run the
// same handler on the embedded SQLite store, and on dynalite when
// IDEM_TEST_DYNAMODB is set.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/lambdasqs"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
)

// BookingConfirmed is a job's body.
type BookingConfirmed struct {
	BookingID string `json:"bookingId"`
	Email     string `json:"email"`
}

// Mailer is the email provider (SES, say). Send carries an
// idempotency token the provider keeps; Find looks a send up by it.
type Mailer interface {
	Send(ctx context.Context, to, subject, token string) (messageID string, err error)
	Find(ctx context.Context, token string) (messageID string, found bool, err error)
}

// Key is a job's operation key: the booking, never the SQS message id (two
// publishes of one booking have two message ids).
func Key(m queue.Message) (idem.OperationKey, error) {
	var j BookingConfirmed
	if err := json.Unmarshal(m.Body, &j); err != nil || j.BookingID == "" {
		return idem.OperationKey{}, queue.Undecodable(fmt.Errorf("job %q: no booking id", m.Body))
	}
	return idem.Key("booking-confirmed", j.BookingID), nil
}

// Handler returns the Lambda handler: one confirmation per booking.
func Handler(st store.Store, mail Mailer, log *slog.Logger) (func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), error) {
	send := func(ctx context.Context, m queue.Message) ([]byte, error) {
		var j BookingConfirmed
		if err := json.Unmarshal(m.Body, &j); err != nil {
			return nil, queue.Undecodable(err)
		}
		key, _ := Key(m)
		id, err := mail.Send(ctx, j.Email, "Your booking "+j.BookingID+" is confirmed", key.String())
		return []byte(id), err
	}
	reconcile := idem.WithReconcile(func(ctx context.Context, lp idem.Lapsed) ([]byte, bool, error) {
		id, found, err := mail.Find(ctx, lp.Key)
		return []byte(id), found, err
	})
	c, err := queue.NewConsumer(lambdasqs.Source(), idem.New(st, idem.WithLogger(log)), Key, send,
		queue.WithLogger(log),
		queue.WithCallOptions(func(m queue.Message) []idem.CallOption {
			return []idem.CallOption{idem.Fingerprint(m.Body), reconcile}
		}))
	if err != nil {
		return nil, err
	}
	return lambdasqs.Handler(c), nil
}

func main() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "booking:", err)
		os.Exit(1)
	}
	st := dynamostore.New(dynamodb.NewFromConfig(cfg), os.Getenv("IDEM_TABLE"))
	h, err := Handler(st, sesMailer{}, newJSONLogger(os.Stdout))
	if err != nil {
		fmt.Fprintln(os.Stderr, "booking:", err)
		os.Exit(1)
	}
	lambda.Start(h)
}

// newJSONLogger is the Lambda's log: JSON lines (CloudWatch Logs Insights
// searches them by key and by correlation_id). It keeps DEBUG lines, where
// the ledger and the consumer say a duplicate was skipped.
func newJSONLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// sesMailer stands for the SES client; wire yours here.
type sesMailer struct{}

func (sesMailer) Send(ctx context.Context, to, subject, token string) (string, error) {
	return "", fmt.Errorf("booking: no mail provider configured")
}

func (sesMailer) Find(ctx context.Context, token string) (string, bool, error) {
	return "", false, fmt.Errorf("booking: no mail provider configured")
}
