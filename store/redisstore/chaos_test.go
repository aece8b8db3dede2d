package redisstore

import (
	"context"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chaostest"
	"github.com/idemkit/idem/store"
)

// TestChaos runs worker processes on one key prefix while their
// connections are killed (CLIENT KILL ID of about a third of the clients
// whose name is the workers', every 200-400 ms, while their writes are
// held for 20-80 ms by CLIENT PAUSE WRITE) and workers are SIGKILLed, under each policy (see internal/chaostest). The workers'
// store is the one Open makes, but with go-redis's retries off
// (max_retries=-1): with them on, go-redis runs a command again on a new
// connection and most cuts never reach the Ledger.
func TestChaos(t *testing.T) {
	testURL(t)
	tg := chaostest.Target{
		Faults: "CLIENT KILL during CLIENT PAUSE WRITE",
		Setup: func(t *testing.T, _ bool) string {
			return withPrefixURL(t, newPrefix(t))
		},
		Open: func(ctx context.Context, locator, connName string) (store.Store, error) {
			u, err := url.Parse(locator)
			if err != nil {
				return nil, err
			}
			q := u.Query()
			q.Set("client_name", connName)
			q.Set("pool_size", "4")
			q.Set("max_retries", "-1") // every cut reaches the Ledger, not only go-redis
			u.RawQuery = q.Encode()
			return Open(ctx, u.String())
		},
		Fault: func(ctx context.Context, _, connName string) (int, error) {
			// Redis runs a command in microseconds, and go-redis checks an
			// idle connection before it hands it out: a connection killed
			// while idle is replaced unseen. So the writes are held for a
			// moment (CLIENT PAUSE WRITE), and the kill lands on calls in
			// flight, as a cut network's would.
			admin := testClient(t)
			if err := admin.Do(ctx, "CLIENT", "PAUSE", 2000, "WRITE").Err(); err != nil {
				return 0, err
			}
			defer admin.Do(context.WithoutCancel(ctx), "CLIENT", "UNPAUSE")
			time.Sleep(20*time.Millisecond + rand.N(60*time.Millisecond))
			list, err := admin.ClientList(ctx).Result()
			if err != nil {
				return 0, err
			}
			n := 0
			for line := range strings.SplitSeq(list, "\n") {
				var id, name string
				for f := range strings.FieldsSeq(line) {
					if v, ok := strings.CutPrefix(f, "id="); ok {
						id = v
					} else if v, ok := strings.CutPrefix(f, "name="); ok {
						name = v
					}
				}
				if name != connName || rand.N(3) != 0 {
					continue
				}
				if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err == nil {
					n++
				}
			}
			return n, nil
		},
	}
	for _, sc := range []chaostest.Scenario{{Policy: idem.AtLeastOnce}, {Policy: idem.AtMostOnce}} {
		t.Run(sc.String(), func(t *testing.T) { chaostest.Run(t, tg, sc) })
	}
}
