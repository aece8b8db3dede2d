package amqpqueue

import (
	"testing"

	"github.com/idemkit/idem/queue/queuetest"
)

// A consumer of a RabbitMQ queue at its defaults does not warn: its
// visibility is unbounded, so the handler timeout is the 30 s default.
func TestDefaultsAgree(t *testing.T) {
	f := newFixture(t, false)
	queuetest.DefaultsAgree(t, f.source(t, f.conn))
}
