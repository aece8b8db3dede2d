// Package nats is a stub of github.com/nats-io/nats.go.
package nats

type Header map[string][]string

func (h Header) Set(key, value string) {}
func (h Header) Add(key, value string) {}

type Msg struct {
	Subject string
	Header  Header
	Data    []byte
}

type SequencePair struct {
	Consumer uint64
	Stream   uint64
}

type MsgMetadata struct {
	Sequence     SequencePair
	NumDelivered uint64
}

func (m *Msg) Metadata() (*MsgMetadata, error) { return nil, nil }

type PubOpt interface{}

func MsgId(id string) PubOpt { return nil }

type JetStreamContext interface {
	Publish(subj string, data []byte, opts ...PubOpt) (any, error)
}
