package storeurl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
)

// awsTestEnv keeps the AWS SDK's configuration chain to what the test
// sets: fake credentials, no files, no instance metadata.
func awsTestEnv(t *testing.T, region string) {
	t.Setenv("AWS_ACCESS_KEY_ID", "idemtest")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "idemtest")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_REGION", region)
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent/idemtest")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/idemtest")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

func TestOpenDynamoDBErrors(t *testing.T) {
	awsTestEnv(t, "")
	for raw, want := range map[string]string{
		"dynamodb:table":                  "not a table URL; write dynamodb://TABLE?region=REGION",
		"dynamodb://":                     "not a table URL",
		"dynamodb://table/sub":            "not a table URL",
		"dynamodb://table?region=x&foo=1": `unknown parameter "foo"`,
		"dynamodb://table":                "no AWS region: add ?region=REGION or set AWS_REGION",
		// Nothing listens on port 1.
		"dynamodb://t?region=us-east-1&endpoint=http://127.0.0.1:1": `store "dynamodb://t?region=us-east-1&endpoint=http://127.0.0.1:1": `,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		s, err := New().Open(ctx, raw, Options{MustExist: true})
		cancel()
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", raw)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to mention %q", raw, err, want)
		}
	}
}

// TestOpenDynamoDB opens a dynamodb:// store on the test endpoint: an
// operator's open (MustExist) of a missing table fails and creates
// nothing; the demo's open creates it; then both open it, whichever way
// the scheme is spelt, and see the same records.
func TestOpenDynamoDB(t *testing.T) {
	ep := os.Getenv("IDEM_TEST_DYNAMODB")
	if ep == "" {
		t.Skip("set IDEM_TEST_DYNAMODB=http://127.0.0.1:4567 (dynalite) to run the dynamodb:// tests")
	}
	awsTestEnv(t, "eu-west-1") // the URL's region wins
	ctx := context.Background()
	var b [4]byte
	rand.Read(b[:])
	table := "idemurl-" + hex.EncodeToString(b[:])
	raw := "dynamodb://" + table + "?region=us-east-1&endpoint=" + ep
	o := New()
	if _, err := o.Open(ctx, raw, Options{MustExist: true}); err == nil || !strings.Contains(err.Error(), "no table "+table) {
		t.Fatalf("MustExist open of a missing table = %v, want no table", err)
	}
	s, err := o.Open(ctx, raw, Options{})
	if err != nil {
		t.Fatalf("Open(%q): %v", raw, err)
	}
	ds := s.(*dynamostore.Store)
	t.Cleanup(func() {
		ds.Client().DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	if r := ds.Client().Options().Region; r != "us-east-1" {
		t.Errorf("region %q, want the URL's us-east-1", r)
	}
	cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:1:7", Owner: "w1", Lease: time.Minute, Retention: time.Hour})
	if err != nil || !cr.Acquired {
		t.Fatalf("claim: %v %+v", err, cr)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "receipt:1:7", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ses-1"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, scheme := range []string{"dynamodb", "DynamoDB"} {
		s2, err := o.Open(ctx, scheme+strings.TrimPrefix(raw, "dynamodb"), Options{MustExist: true})
		if err != nil {
			t.Fatalf("%s: %v", scheme, err)
		}
		rec, err := s2.Get(ctx, "receipt:1:7")
		if err != nil || string(rec.Result) != "ses-1" {
			t.Fatalf("%s: Get = %+v, %v", scheme, rec, err)
		}
		if _, err := s2.Get(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: Get(nope) = %v", scheme, err)
		}
	}
}
