// Package allow holds the //idem:allow fixtures.
package allow

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/idemkit/idem"
)

func keys(ctx context.Context, l *idem.Ledger, orderID string) {
	//idem:allow nondetkey each call is a new operation by design: a user asked twice
	l.Do(ctx, idem.Key("ask", uuid.NewString()), nil)
	l.Do(ctx, idem.Key("ask", time.Now().Unix()), nil) //idem:allow nondetkey one per second on purpose

	//idem:allow nondetkey this key is deterministic // want `//idem:allow nondetkey silences nothing on this line or the next: delete it`
	l.Do(ctx, idem.Key("order", orderID), nil)

	//idem:allow deliveryid wrong check // want `silences nothing`
	l.Do(ctx, idem.Key("ask", uuid.NewString()), nil)

	//idem:allow nodetkey typo // want `names unknown check "nodetkey"`
	//idem:allow // want `names no check`
	l.Do(ctx, idem.Key("ask", uuid.NewString()), nil) //idem:allow nondetkey // want `gives no reason`
}
