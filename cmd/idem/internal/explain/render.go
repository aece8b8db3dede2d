package explain

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Write prints x for people: a header, the story in time order, the
// decision tree's questions with their answers, the verdict and what
// happens next. Lines are indented by indent.
func Write(w io.Writer, x Explanation, indent string) error {
	ew := &errWriter{w: w}
	p := func(format string, args ...any) { ew.printf(indent+format+"\n", args...) }

	attempts := "attempts"
	if x.Attempts == 1 {
		attempts = "attempt"
	}
	p("%s: %s (%s), fence %d, %d %s", x.Key, x.State, x.Policy, x.Fence, x.Attempts, attempts)
	layout, day := timeLayout(x.Story)
	if day != "" {
		p("Story (UTC, %s):", day)
	} else {
		p("Story (UTC):")
	}
	if x.Truncated {
		p("  (the journal keeps the newest attempts only; earlier ones are not shown)")
	}
	for _, e := range x.Story {
		p("  %s  %s", e.At.UTC().Format(layout), e.Text)
	}
	p("Two emails, one booking?")
	for i, s := range x.Steps {
		p("  %d. %s %s: %s", i+1, s.Question, s.Answer, s.Why)
	}
	p("Verdict: %s", x.Verdict.Text)
	p("Now: %s", x.Current)
	return ew.err
}

// timeLayout picks the shortest time layout that keeps the story
// unambiguous: the time of day when every event falls on one UTC day (and
// returns that day), else the date too.
func timeLayout(ev []Event) (layout, day string) {
	if len(ev) == 0 {
		return "", ""
	}
	d := ev[0].At.UTC().Format(time.DateOnly)
	for _, e := range ev[1:] {
		if e.At.UTC().Format(time.DateOnly) != d {
			return "2006-01-02 15:04:05.000", ""
		}
	}
	return "15:04:05.000", d
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err != nil {
		return
	}
	s := fmt.Sprintf(format, args...)
	_, e.err = io.WriteString(e.w, strings.ReplaceAll(s, "\r", ""))
}
