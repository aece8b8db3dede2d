// Package bodyhash holds bodyhash's fixtures.
package bodyhash

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/idemkit/idem"
)

// hash(subject + body): "Dangerous" in the seed's key table.
func handle(ctx context.Context, l *idem.Ledger, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	sum := sha256.Sum256(body)
	l.Do(ctx, idem.Key("notify", hex.EncodeToString(sum[:])), nil) // want `idem.Key is a hash of http.Request.Body`
}

func streamed(ctx context.Context, l *idem.Ledger, r *http.Request) {
	h := sha256.New()
	io.Copy(h, r.Body)
	l.Do(ctx, idem.RawKey(fmt.Sprintf("%x", h.Sum(nil))), nil) // want `idem.RawKey is a hash of http.Request.Body`
}

func forward(ctx context.Context, c *sqs.Client, rec events.SQSMessage) {
	c.SendMessage(ctx, &sqs.SendMessageInput{
		MessageBody:            aws.String(rec.Body),
		MessageDeduplicationId: aws.String(fmt.Sprintf("%x", sha256.Sum256([]byte(rec.Body)))), // want `SQS MessageDeduplicationId is a hash of events.SQSMessage.Body`
	})
}

func deliberate(ctx context.Context, l *idem.Ledger, req events.APIGatewayProxyRequest) {
	sum := sha256.Sum256([]byte(req.Body))
	//idem:allow bodyhash the sender has no id and sends each document once
	l.Do(ctx, idem.Key("doc", hex.EncodeToString(sum[:])), nil)
}

// Good: a hash of a business id is as stable as the id.
func hashedID(ctx context.Context, l *idem.Ledger, orderID string) {
	sum := sha256.Sum256([]byte(orderID))
	l.Do(ctx, idem.Key("order", hex.EncodeToString(sum[:8])), nil)
}
