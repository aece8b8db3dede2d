package effect_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/store/memstore"
)

// The Message-ID of an operation's email is a function of its key: every
// attempt writes the same one, and a Reconcile hook can look for it.
func ExampleMessageID() {
	key := idem.Key("receipt", 8891, 7)
	fmt.Println(effect.MessageID(key.String(), "shop.example"))
	fmt.Println(effect.KeyToken(key.String()))
	// Output:
	// <86c6151146f5d7a77d58d9f18ead53db@shop.example>
	// 86c6151146f5d7a77d58d9f18ead53db
}

// A receipt sent at most once: a refused connection or a 4xx is retried,
// a send whose reply was lost is never repeated blindly, and the
// Reconcile hook asks the mailbox for the key's Message-ID first.
func ExampleSMTP_Send() {
	ctx := context.Background()
	mailer := effect.NewSMTP("127.0.0.1:1025", effect.WithMessageIDDomain("shop.example"))
	l := idem.New(memstore.New(), idem.WithPolicy(idem.AtMostOnce))
	key := idem.Key("receipt", 8891, 7)

	// found asks the mailbox or provider (Mailpit's
	// /api/v1/search?query=message-id:..., an IMAP SEARCH HEADER
	// Message-ID) whether the message arrived.
	var found func(ctx context.Context, messageID string) (bool, error)

	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		id, err := mailer.Send(ctx, key.String(), effect.Email{
			From:    "Shop <receipts@shop.example>",
			To:      []string{"user7@example.com"},
			Subject: "Your receipt for order 8891",
			Text:    "Thanks for your order.",
		})
		return []byte(id), err
	}, idem.WithReconcile(func(ctx context.Context, lp idem.Lapsed) ([]byte, bool, error) {
		id := effect.MessageID(lp.Key, "shop.example")
		ok, err := found(ctx, id)
		return []byte(id), ok, err
	}))
	var se *effect.SMTPError
	switch {
	case err == nil:
		fmt.Printf("sent %s (replayed: %v)\n", res.Value, res.Replayed)
	case errors.As(err, &se) && se.Temporary():
		log.Printf("refused for now (%d at %s): retry later", se.Code, se.Stage)
	case errors.Is(err, idem.ErrIndeterminate):
		log.Printf("an earlier attempt may have sent it: %v", err)
	default:
		log.Print(err)
	}
}
