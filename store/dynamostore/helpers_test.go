package dynamostore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// envEndpoint names the DynamoDB endpoint the tests use (dynalite, started
// by .ci/run); without it they are skipped.
const envEndpoint = "IDEM_TEST_DYNAMODB"

const skipMessage = "set " + envEndpoint + "=http://127.0.0.1:4567 (dynalite, see .ci/services/50-dynalite.sh) to run the DynamoDB suite"

// testEndpoint returns the test endpoint, or skips t.
func testEndpoint(t testing.TB) string {
	t.Helper()
	ep := os.Getenv(envEndpoint)
	if ep == "" {
		t.Skip(skipMessage)
	}
	return ep
}

// fakeCredentials sign requests for an emulator, which does not check them.
var fakeCredentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "idemtest", SecretAccessKey: "idemtest", Source: "idemtest"}, nil
})

// newClient returns a client of the endpoint.
func newClient(endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  fakeCredentials,
		HTTPClient:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second},
	}, opts...)
}

var shared struct {
	client atomic.Pointer[dynamodb.Client]
}

// testClient returns the client the tests share.
func testClient(t testing.TB) *dynamodb.Client {
	t.Helper()
	ep := testEndpoint(t)
	if c := shared.client.Load(); c != nil {
		return c
	}
	shared.client.CompareAndSwap(nil, newClient(ep))
	return shared.client.Load()
}

// run is this test binary's run id: table names start with it, so that
// parallel runs on one endpoint never share a table.
var run = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var tables atomic.Int64

// newTable creates a table of t's own, deleted when t ends.
func newTable(t testing.TB) string {
	t.Helper()
	c := testClient(t)
	name := "idemtest-" + run + "-" + strconv.FormatInt(tables.Add(1), 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := CreateTable(ctx, c, name); err != nil && !isTTLUnsupported(err) {
		t.Fatalf("CreateTable(%s): %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
			t.Errorf("deleting table %s: %v", name, err)
		}
	})
	return name
}

// rawItem reads key's item as it is stored.
func rawItem(t testing.TB, s *Store, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := s.Client().GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(s.Table()), Key: s.keyOf(key), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("GetItem(%q): %v", key, err)
	}
	return out.Item
}

// testEndpointEnv is the endpoint for a child process of the suite.
func testEndpointEnv() string { return os.Getenv(envEndpoint) }
