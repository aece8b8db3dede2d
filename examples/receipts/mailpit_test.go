package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/internal/testenv"
)

// smtpMailer returns a Mailer over Mailpit whose Message-IDs are this
// test's own (a domain made for it), so runs sharing a Mailpit do not see
// each other's mail.
func smtpMailer(t *testing.T) *SMTPMailer {
	t.Helper()
	addr := testenv.Require(t, testenv.SMTP, "the receipts worker against Mailpit")
	api := testenv.Require(t, testenv.Mailpit, "the receipts worker against Mailpit")
	domain := fmt.Sprintf("run%d.receipts.example", time.Now().UnixNano())
	return &SMTPMailer{SMTP: effect.NewSMTP(addr, effect.WithMessageIDDomain(domain)), API: api, Domain: domain,
		From: "Shop <receipts@shop.example>"}
}

func wantOneMessage(t *testing.T, m *SMTPMailer, key string) {
	t.Helper()
	n, err := m.Count(context.Background(), key)
	if err != nil || n != 1 {
		t.Fatalf("Mailpit holds %d messages for %s (%v), want exactly 1", n, key, err)
	}
}

// throwAfterSend fails the next n sends after the email went out.
type throwAfterSend struct {
	Mailer
	n int
}

func (f *throwAfterSend) Send(ctx context.Context, to, subject, key string) (string, error) {
	id, err := f.Mailer.Send(ctx, to, subject, key)
	if err == nil && f.n > 0 {
		f.n--
		return "", errors.New("the worker failed after the send")
	}
	return id, err
}

// The receipts worker's three checks over real SMTP: Mailpit holds exactly one
// message per receipt key after each.
func TestMailpitSeedChecks(t *testing.T) {
	t.Run("same payload twice", func(t *testing.T) {
		mail := smtpMailer(t)
		store, q := setup(t)
		publishJob(t, q, 42)
		publishJob(t, q, 42)
		drain(t, q, worker(t, store, q, mail))
		wantOneMessage(t, mail, "receipt:42:7")
	})
	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run("throw after the send/"+p.String(), func(t *testing.T) {
			mail := smtpMailer(t)
			store, q := setup(t)
			publishJob(t, q, 42)
			drain(t, q, worker(t, store, q, &throwAfterSend{Mailer: mail, n: 1}, idem.WithPolicy(p), idem.WithLease(200*time.Millisecond)))
			wantOneMessage(t, mail, "receipt:42:7")
			rec, err := store.Get(context.Background(), "receipt:42:7")
			if err != nil || rec.Status != idem.StatusCompleted || string(rec.Result) != effect.MessageID("receipt:42:7", mail.Domain) {
				t.Fatalf("record %+v (%v); want completed with the send's Message-ID", rec.Status, err)
			}
		})
	}
	t.Run("two consumers", func(t *testing.T) {
		mail := smtpMailer(t)
		store, q := setup(t)
		for range 4 {
			publishJob(t, q, 42)
		}
		drain(t, q, worker(t, store, q, mail, idem.WithOwner("a")), worker(t, store, q, mail, idem.WithOwner("b")))
		wantOneMessage(t, mail, "receipt:42:7")
	})
}
