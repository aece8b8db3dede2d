package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/store/sqlitestore"
)

// jsonLines parses the JSON log lines in buf.
func jsonLines(t *testing.T, buf *testlog.Buffer) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// "Logs distinguish 'email sent' from 'skipped, already done'",
// searched by the job's key and by a correlation id. The booking is
// published twice (messages m1 and m2) and delivered one after the other:
// the JSON log (what the Lambda writes) has one "executed" line for m1 and
// one "replayed ... skipped, already done" line for m2, both with the
// booking's key, so a search for the key shows the one send and the
// skipped duplicate, and each line's correlation id names its message.
func TestSeed002Logs(t *testing.T) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var buf testlog.Buffer
	mail := &provider{}
	h, err := Handler(s, mail, newJSONLogger(&buf))
	if err != nil {
		t.Fatal(err)
	}
	if failed := invoke(t, h, record("m1", "b-7", 1)); len(failed) != 0 {
		t.Fatalf("m1 failed: %v", failed)
	}
	if failed := invoke(t, h, record("m2", "b-7", 1)); len(failed) != 0 {
		t.Fatalf("m2 failed: %v", failed)
	}
	if n := mail.emails("b-7"); n != 1 {
		t.Fatalf("%d emails, want 1", n)
	}
	const key = "booking-confirmed:b-7"
	var executed, replayed, ledgerReplayed []map[string]any
	for _, l := range jsonLines(t, &buf) {
		if l["key"] != key {
			continue
		}
		switch l["msg"] {
		case "queue message executed":
			executed = append(executed, l)
		case "queue message replayed":
			replayed = append(replayed, l)
		case "idem replayed":
			ledgerReplayed = append(ledgerReplayed, l)
		}
	}
	if len(executed) != 1 || executed[0]["correlation_id"] != "m1" || executed[0]["fence"] == nil || executed[0]["attempt"] != float64(1) {
		t.Fatalf("executed lines for %s: %v; want one, for m1, with its fence, attempt 1", key, executed)
	}
	if len(replayed) != 1 || replayed[0]["correlation_id"] != "m2" || replayed[0]["reason"] != "skipped, already done" {
		t.Fatalf("replayed lines for %s: %v; want one, for m2, reason \"skipped, already done\"", key, replayed)
	}
	if len(ledgerReplayed) != 1 || ledgerReplayed[0]["msg_detail"] != "skipped, already done" || ledgerReplayed[0]["outcome"] != "replayed" {
		t.Fatalf("the ledger's replayed lines for %s: %v; want one saying \"skipped, already done\"", key, ledgerReplayed)
	}
}
