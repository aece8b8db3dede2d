package jetstream

import (
	"context"
	"strings"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/queue/queuetest"
)

// A consumer of a JetStream consumer made with the server's defaults (no
// AckWait: 30 s), bound with the adapter's defaults, does not warn.
func TestDefaultsAgree(t *testing.T) {
	_, js := connect(t, natsURL(t))
	ctx := context.Background()
	id := uniq()
	name, subject, dl := "IDEMT_"+strings.ToUpper(id), "idemt."+id+".q", "idemt."+id+".dl"
	for stream, subj := range map[string]string{name: subject, name + "_DL": dl} {
		if _, err := js.CreateStream(ctx, njs.StreamConfig{Name: stream, Subjects: []string{subj}, Storage: njs.MemoryStorage}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, name, njs.ConsumerConfig{Durable: "worker", AckPolicy: njs.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(ctx, js, SourceConfig{Stream: name, Consumer: "worker", DeadLetterSubject: dl})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Visibility() != 30*time.Second {
		t.Fatalf("a consumer made with the server's defaults has ack wait %v, want 30s", s.Visibility())
	}
	queuetest.DefaultsAgree(t, s)
}
