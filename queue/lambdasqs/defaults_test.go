package lambdasqs_test

import (
	"testing"

	"github.com/idemkit/idem/queue/lambdasqs"
	"github.com/idemkit/idem/queue/queuetest"
)

// A consumer of the Lambda event source at its defaults does not warn:
// its visibility is unbounded, so the handler timeout is the 30 s default.
func TestDefaultsAgree(t *testing.T) {
	queuetest.DefaultsAgree(t, lambdasqs.Source())
}
