package redisstore_test

import (
	"context"
	"log"
	"os"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/redisstore"
)

// The example needs a Redis server and is compiled, not run.

// A Ledger on Redis that refuses to start on a server that can lose the
// writes it acknowledges, as AtMostOnce operations need.
func Example() {
	ctx := context.Background()
	s, err := redisstore.Open(ctx, os.Getenv("REDIS_URL")) // redis://host:6379/0?idem_prefix=billing:
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	d, err := s.Durability(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if !d.Durable() {
		log.Fatalf("redis loses acknowledged writes (%s): refusing AtMostOnce", d)
	}

	l := idem.New(s, idem.WithPolicy(idem.AtMostOnce))
	res, err := l.Do(ctx, idem.Key("receipt", 8891, 7), func(ctx context.Context) ([]byte, error) {
		return []byte("msg-id-42"), nil // send the receipt
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("receipt %s (replayed: %v)", res.Value, res.Replayed)
}
