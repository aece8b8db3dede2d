package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/store"
)

// recordJSON is a record as the command prints it with --json: snake_case
// names, times in RFC 3339 (UTC), the result in base64.
type recordJSON struct {
	Key         string        `json:"key,omitempty"`
	KeyHash     string        `json:"key_hash,omitempty"` // serve --hash-keys: the key's hash, no key
	Status      idem.Status   `json:"status"`
	State       explain.State `json:"state"`
	Policy      string        `json:"policy"`
	Fence       int64         `json:"fence"`
	Attempt     int           `json:"attempt"`
	AttemptID   string        `json:"attempt_id"`
	Owner       string        `json:"owner"`
	Fingerprint string        `json:"fingerprint"`
	Result      []byte        `json:"result"`
	ResultSize  int           `json:"result_size"`
	Reason      string        `json:"reason"`
	LeaseUntil  time.Time     `json:"lease_until"`
	ExpiresAt   time.Time     `json:"expires_at"`
	CreatedAt   time.Time     `json:"created_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
	Journal     []journalJSON `json:"journal,omitempty"`
}

type journalJSON struct {
	Attempt     int           `json:"attempt"`
	Fence       int64         `json:"fence"`
	AttemptID   string        `json:"attempt_id,omitempty"`
	Owner       string        `json:"owner,omitempty"`
	Correlation string        `json:"correlation,omitempty"`
	Started     time.Time     `json:"started"`
	LeaseUntil  time.Time     `json:"lease_until"`
	Ended       time.Time     `json:"ended,omitzero"`
	Outcome     store.Outcome `json:"outcome,omitempty"`
	Reason      string        `json:"reason,omitempty"`
	Takeover    bool          `json:"takeover,omitempty"`
	AfterExpiry bool          `json:"after_expiry,omitempty"`
	Policy      string        `json:"policy,omitempty"`
	LateFinish  time.Time     `json:"late_finish,omitzero"`
	ResolvedBy  string        `json:"resolved_by,omitempty"`
	Decision    bool          `json:"decision,omitempty"`
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

func toJSON(r *idem.Record, now time.Time, withJournal bool) recordJSON {
	out := recordJSON{
		Key: r.Key, Status: r.Status, State: explain.StateOf(r, now), Policy: r.Policy.String(),
		Fence: r.Fence, Attempt: r.Attempt, AttemptID: r.AttemptID, Owner: r.Owner, Fingerprint: r.Fingerprint,
		Result: r.Result, ResultSize: len(r.Result), Reason: r.Reason,
		LeaseUntil: utc(r.LeaseUntil), ExpiresAt: utc(r.ExpiresAt), CreatedAt: utc(r.CreatedAt), UpdatedAt: utc(r.UpdatedAt),
	}
	if withJournal {
		out.Journal = make([]journalJSON, 0, len(r.Journal))
		for _, e := range r.Journal {
			out.Journal = append(out.Journal, journalJSON{
				Attempt: e.Attempt, Fence: e.Fence, AttemptID: e.AttemptID, Owner: e.Owner, Correlation: e.Correlation,
				Started: utc(e.Started), LeaseUntil: utc(e.LeaseUntil), Ended: utc(e.Ended),
				Outcome: e.Outcome, Reason: e.Reason, Takeover: e.Takeover, AfterExpiry: e.AfterExpiry,
				Policy: e.Policy, LateFinish: utc(e.LateFinish), ResolvedBy: e.ResolvedBy, Decision: e.Decision,
			})
		}
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func writeJSONIndent(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// stamp formats t for people: UTC with milliseconds.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// rel says how far t is from now: "in 29s", "3m0s ago".
func rel(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	switch {
	case d > 0:
		return "in " + explain.Dur(d)
	case d == 0:
		return "now"
	}
	return explain.Dur(-d) + " ago"
}

// preview shows a result: quoted text when it is printable, else hex.
func preview(b []byte) string {
	const maxRunes, maxHex = 60, 24
	if len(b) == 0 {
		return `""`
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), func(r rune) bool { return !unicode.IsPrint(r) && !unicode.IsSpace(r) }) < 0 {
		s := string(b)
		if utf8.RuneCountInString(s) > maxRunes {
			s = string([]rune(s)[:maxRunes])
			return strconv.Quote(s) + "…"
		}
		return strconv.Quote(s)
	}
	if len(b) > maxHex {
		return "hex " + hex.EncodeToString(b[:maxHex]) + "…"
	}
	return "hex " + hex.EncodeToString(b)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// table is a tabwriter that drops the padding at the end of lines.
type table struct {
	w   io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(w io.Writer) *table {
	t := &table{w: w}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	return t
}

func (t *table) Write(p []byte) (int, error) { return t.tw.Write(p) }

// Flush writes the rows so far.
func (t *table) Flush() error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	for line := range strings.Lines(t.buf.String()) {
		if _, err := io.WriteString(t.w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	t.buf.Reset()
	return nil
}

// writeRecord prints r for people: its fields, then its journal.
func writeRecord(w io.Writer, r *idem.Record, now time.Time) error {
	st := explain.StateOf(r, now)
	tw := newTable(w)
	f := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{name}, args...)...)
	}
	f("key", "%s", r.Key)
	f("status", "%s", r.Status)
	f("state", "%s: %s", st, st.DescribeFor(r))
	f("policy", "%s", r.Policy)
	f("fence", "%d", r.Fence)
	f("attempt", "%d", r.Attempt)
	f("attempt id", "%s", orDash(r.AttemptID))
	f("owner", "%s", orDash(r.Owner))
	f("fingerprint", "%s", orDash(r.Fingerprint))
	if r.Result == nil && r.Status != idem.StatusCompleted {
		f("result", "-")
	} else {
		f("result", "%s (%d bytes)", preview(r.Result), len(r.Result))
	}
	f("reason", "%s", orDash(r.Reason))
	lease := rel(r.LeaseUntil, now)
	switch st {
	case explain.StateInProgress:
		lease = "live, ends " + lease
	case explain.StateLapsed, explain.StateIndeterminate:
		lease = "passed " + lease
	default:
		lease = "ended " + lease
	}
	f("lease until", "%s (%s)", stamp(r.LeaseUntil), lease)
	f("expires at", "%s (%s)", stamp(r.ExpiresAt), rel(r.ExpiresAt, now))
	f("created", "%s (%s)", stamp(r.CreatedAt), rel(r.CreatedAt, now))
	f("updated", "%s (%s)", stamp(r.UpdatedAt), rel(r.UpdatedAt, now))
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeJournal(w, r.Journal)
}

func writeJournal(w io.Writer, j []store.JournalEntry) error {
	if len(j) == 0 {
		_, err := fmt.Fprintln(w, "\njournal: empty")
		return err
	}
	var times []time.Time
	for _, e := range j {
		times = append(times, e.Started, e.LeaseUntil, e.Ended, e.LateFinish)
	}
	layout, day := dayLayout(times)
	head := "\njournal (oldest first, times UTC"
	if day != "" {
		head += " on " + day
	}
	fmt.Fprintln(w, head+"):")
	tw := newTable(w)
	fmt.Fprintln(tw, "  ATTEMPT\tFENCE\tPOLICY\tOWNER\tCORRELATION\tSTARTED\tLEASE UNTIL\tENDED\tOUTCOME\tNOTES")
	ft := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(layout)
	}
	for _, e := range j {
		var notes []string
		if e.Decision {
			notes = append(notes, "decision, not an attempt")
		}
		if e.Takeover {
			notes = append(notes, "takeover")
		}
		if e.AfterExpiry {
			notes = append(notes, "after expiry")
		}
		if !e.LateFinish.IsZero() {
			notes = append(notes, "still running at "+ft(e.LateFinish)+" after a takeover")
		}
		if e.ResolvedBy != "" && !e.Decision {
			notes = append(notes, "by "+e.ResolvedBy)
		}
		if e.Reason != "" {
			notes = append(notes, "reason: "+strconv.Quote(e.Reason))
		}
		outcome := e.Outcome
		if outcome == "" {
			outcome = "(running or unknown)"
		}
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Attempt, e.Fence, orDash(e.Policy), orDash(e.Owner), orDash(e.Correlation),
			ft(e.Started), ft(e.LeaseUntil), ft(e.Ended), outcome, strings.Join(notes, "; "))
	}
	return tw.Flush()
}

// dayLayout returns the time of day layout and the day when every non-zero
// time falls on one UTC day, else a layout with the date.
func dayLayout(times []time.Time) (layout, day string) {
	for _, t := range times {
		if t.IsZero() {
			continue
		}
		d := t.UTC().Format(time.DateOnly)
		if day == "" {
			day = d
		} else if d != day {
			return "2006-01-02 15:04:05.000", ""
		}
	}
	return "15:04:05.000", day
}
