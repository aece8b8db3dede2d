// Package queue is a stub of github.com/idemkit/idem/queue.
package queue

import "github.com/idemkit/idem"

type Message struct {
	ID         string
	Body       []byte
	Attributes map[string]string
}

type KeyFunc func(m Message) (idem.OperationKey, error)
