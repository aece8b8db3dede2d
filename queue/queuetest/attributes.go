package queuetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
)

// awkwardValues are attribute values some broker cannot carry as they are:
// NATS headers trim spaces and flatten line breaks, SQS carries only valid
// UTF-8 of its character set, SQL text columns refuse NUL.
var awkwardValues = map[string]string{
	"padded":    "  padded  ",
	"tab":       "\tx\t",
	"crlf":      "line1\r\nInjected: yes",
	"lf":        "a\nb",
	"nul":       "a\x00b",
	"not-utf8":  "a\xff\xfeb",
	"utf8":      "é ü 😀",
	"u+fffd":    "\uFFFD",
	"backslash": `a\nb`,
}

// testAttributes checks that Publish either carries each awkward attribute
// value unchanged or refuses it with an error matching [queue.ErrRefused]
// and stores nothing: a value
// silently changed on the way (trimmed, flattened, its bytes replaced)
// reaches a handler that cannot know. Every broker must hold to this, so
// no feature flag: one that cannot carry a value refuses it.
func testAttributes(t *testing.T, h Harness) {
	t.Run("attributes_unchanged_or_refused", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		sent := map[string]string{} // body -> value, for the publishes accepted
		for name, v := range awkwardValues {
			_, err := pub.Publish(context.Background(), queue.Outgoing{Body: []byte(name), Attributes: map[string]string{"v": v}})
			switch {
			case err == nil:
				sent[name] = v
			case !errors.Is(err, queue.ErrRefused):
				// A relay must tell "never, as it is" from "not now".
				t.Errorf("%s: Publish refused the value with %v, which does not match queue.ErrRefused", name, err)
			}
		}
		if len(sent) > 0 {
			for _, d := range receiveAll(t, src, len(sent), 10*time.Second) {
				m := d.Message()
				want, ok := sent[string(m.Body)]
				if !ok {
					t.Errorf("received %q, whose Publish returned an error (or twice)", m.Body)
				} else if got, present := m.Attributes["v"]; !present || got != want {
					t.Errorf("%s: Publish returned nil, attribute arrived as %q (present %v), want %q", m.Body, got, present, want)
				}
				delete(sent, string(m.Body))
				settle(t, "Ack", d.Ack(context.Background()))
			}
		}
		receiveNone(t, src, 500*time.Millisecond, "after every accepted message (a refused publish must store nothing)")
	})
}
