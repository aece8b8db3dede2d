package queuetest

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/queue"
)

// SettleOp is one call on a delivery that must never report success for
// something the broker did not take: a settlement or an extension.
type SettleOp struct {
	Name string
	Call func(context.Context, queue.Delivery) error
}

// SettleOps are Ack, Retry(0), Retry(delay), Extend and DeadLetter, for an
// adapter's tests that cut its connection mid-call.
func SettleOps(delay time.Duration) []SettleOp {
	return []SettleOp{
		{"Ack", func(ctx context.Context, d queue.Delivery) error { return d.Ack(ctx) }},
		{"Retry(0)", func(ctx context.Context, d queue.Delivery) error { return d.Retry(ctx, 0) }},
		{fmt.Sprintf("Retry(%v)", delay), func(ctx context.Context, d queue.Delivery) error { return d.Retry(ctx, delay) }},
		{"Extend", func(ctx context.Context, d queue.Delivery) error { return d.Extend(ctx, time.Minute) }},
		{"DeadLetter", func(ctx context.Context, d queue.Delivery) error { return d.DeadLetter(ctx, "x") }},
	}
}
