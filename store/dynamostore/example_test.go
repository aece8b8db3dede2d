package dynamostore_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/dynamostore"
)

// The examples need AWS (or an emulator) and are compiled, not run.

func Example() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx) // credentials and region as usual
	if err != nil {
		log.Fatal(err)
	}
	client := dynamodb.NewFromConfig(cfg)
	// Once, at deployment (or with infrastructure code: partition key "key",
	// a string; TTL on "ttl").
	if err := dynamostore.CreateTable(ctx, client, "idem"); err != nil {
		log.Fatal(err)
	}

	l := idem.New(dynamostore.New(client, "idem"), idem.WithLease(30*time.Second), idem.WithRetention(7*24*time.Hour))
	res, err := l.Do(ctx, idem.Key("receipt", 8891, 7), func(ctx context.Context) ([]byte, error) {
		return []byte("msg-id-42"), nil // send the receipt
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("receipt %s (replayed: %v)", res.Value, res.Replayed)
}

// An emulator (dynalite) on a local endpoint, which has no TTL: the store
// checks expiry itself, and Sweep deletes expired records.
func ExampleCreateTable_emulator() {
	ctx := context.Background()
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://127.0.0.1:4567"),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
	err := dynamostore.CreateTable(ctx, client, "idem")
	if err != nil && !errors.Is(err, dynamostore.ErrTTLUnsupported) {
		log.Fatal(err)
	}
	s := dynamostore.New(client, "idem")
	n, err := s.Sweep(ctx, 1000)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("swept %d expired records", n)
}
