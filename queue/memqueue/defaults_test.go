package memqueue_test

import (
	"testing"

	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/queuetest"
)

// A consumer of a memqueue at its defaults does not warn.
func TestDefaultsAgree(t *testing.T) {
	queuetest.DefaultsAgree(t, memqueue.New())
}
