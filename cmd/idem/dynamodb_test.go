package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
)

// TestDynamoDBURL opens a dynamodb:// store as an operator's command does:
// an existing table only. The endpoint is IDEM_TEST_DYNAMODB (dynalite).
func TestDynamoDBURL(t *testing.T) {
	ep := os.Getenv("IDEM_TEST_DYNAMODB")
	if ep == "" {
		t.Skip("set IDEM_TEST_DYNAMODB=http://127.0.0.1:4567 (dynalite) to run the command tests on DynamoDB")
	}
	// The SDK's chain finds these and nothing else.
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "idemtest", "AWS_SECRET_ACCESS_KEY": "idemtest", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_REGION": "", "AWS_CONFIG_FILE": "/nonexistent/idemtest",
		"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/idemtest", "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	ctx := context.Background()
	var b [4]byte
	rand.Read(b[:])
	table := "idemcmd-" + hex.EncodeToString(b[:])
	url := "dynamodb://" + table + "?region=us-east-1&endpoint=" + ep
	for _, args := range [][]string{{"ls"}, {"inspect", "k"}, {"sweep"}, {"release", "k"}} {
		r := idemRun(ctx, append([]string{"--store", url}, args...)...)
		r.expectErr(t, 1, "no table "+table)
	}
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idemtest", SecretAccessKey: "idemtest"}, nil
		}),
	})
	if err := dynamostore.CheckTable(ctx, client, table); !errors.Is(err, dynamostore.ErrNoTable) {
		t.Fatalf("an operator's command created the table (%v)", err)
	}

	// The workers' store creates the table; then the commands open it,
	// whichever way the scheme is spelt.
	if err := dynamostore.CreateTable(ctx, client, table); err != nil && !errors.Is(err, dynamostore.ErrTTLUnsupported) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	s := dynamostore.New(client, table)
	res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:1:7", Owner: "w1", Lease: time.Minute, Retention: time.Hour})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "receipt:1:7", Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ses-1"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rest := url[len("dynamodb:"):]
	for _, scheme := range []string{"dynamodb", "DynamoDB"} {
		idemRun(ctx, "--store", scheme+":"+rest, "inspect", "receipt:1:7").expect(t, 0, `"ses-1" (5 bytes)`, "status       completed")
	}
	idemRun(ctx, "--store", url, "ls").expect(t, 0, "receipt:1:7")
	idemRun(ctx, "--store", url, "inspect", "nope").expectErr(t, 3, "no record")
}
