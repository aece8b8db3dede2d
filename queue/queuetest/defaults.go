package queuetest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
)

// Warnings collects the lines at [slog.LevelWarn] and above of a logger.
type Warnings struct {
	mu    sync.Mutex
	lines []string
}

// Logger returns a logger whose warnings and errors w collects.
func (w *Warnings) Logger() *slog.Logger { return slog.New(warnHandler{w: w}) }

// Lines returns the lines collected, one string each (message and
// attributes).
func (w *Warnings) Lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

type warnHandler struct {
	w     *Warnings
	attrs []slog.Attr
}

func (h warnHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h warnHandler) WithGroup(string) slog.Handler                { return h }
func (h warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return warnHandler{w: h.w, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h warnHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	for _, a := range h.attrs {
		b.WriteString(" " + a.String())
	}
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	h.w.mu.Lock()
	h.w.lines = append(h.w.lines, b.String())
	h.w.mu.Unlock()
	return nil
}

// NoWarnings runs f with [slog.Default] replaced by a logger that collects
// warnings, restores it, and fails t with every warning or error logged
// meanwhile. Code that logs to slog.Default by default (a
// [queue.Consumer] without [queue.WithLogger], a ledger, a store) is then
// checked as a user who leaves every option alone would run it. It changes
// a process-wide setting: do not call it from a parallel test.
func NoWarnings(t testing.TB, what string, f func()) {
	t.Helper()
	var w Warnings
	old := slog.Default()
	slog.SetDefault(w.Logger())
	defer slog.SetDefault(old)
	f()
	for _, l := range w.Lines() {
		t.Errorf("%s: logged %s", what, l)
	}
}

// DefaultsAgree checks the rule that a source's defaults agree with the
// consumer's: a [queue.Consumer] of src with every option left at its
// default is made without an error and without a warning (the visibility
// warning of [queue.NewConsumer] included). Pass a source opened with the
// adapter's defaults, over a queue made with the broker's. It replaces
// slog.Default for the call (see [NoWarnings]).
func DefaultsAgree(t testing.TB, src queue.Source) {
	t.Helper()
	NoWarnings(t, "queue.NewConsumer with defaults", func() {
		l := idem.New(memstore.New())
		_, err := queue.NewConsumer(src, l, queue.MessageIDKey("defaults"),
			func(context.Context, queue.Message) ([]byte, error) { return nil, nil })
		if err != nil {
			t.Errorf("queue.NewConsumer with defaults over a source of visibility %v: %v", src.Visibility(), err)
		}
	})
}
