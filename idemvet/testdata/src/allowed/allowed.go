// Package allowed checks that //idem:allow silences its own check only.
package allowed

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem"
)

func keys(ctx context.Context, l *idem.Ledger) {
	//idem:allow nondetkey each call is a new operation by design: a user asked twice
	l.Do(ctx, idem.Key("ask", uuid.NewString()), nil)
	l.Do(ctx, idem.Key("ask", time.Now().Unix()), nil) //idem:allow nondetkey one per second on purpose

	//idem:allow deliveryid names another check
	l.Do(ctx, idem.Key("ask", uuid.NewString()), nil) // want `derived from uuid.NewString`

	//idem:allow nondetkey covers the next line only

	l.Do(ctx, idem.Key("ask", uuid.NewString()), nil) // want `derived from uuid.NewString`
}
