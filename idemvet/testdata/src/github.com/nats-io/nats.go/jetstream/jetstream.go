// Package jetstream is a stub of github.com/nats-io/nats.go/jetstream.
package jetstream

import "context"

type SequencePair struct {
	Consumer uint64
	Stream   uint64
}

type MsgMetadata struct{ Sequence SequencePair }

type Msg interface {
	Data() []byte
	Metadata() (*MsgMetadata, error)
}

type PublishOpt func()

func WithMsgID(id string) PublishOpt { return nil }

type JetStream interface {
	Publish(ctx context.Context, subject string, payload []byte, opts ...PublishOpt) (any, error)
}
