package webhook

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
)

func TestEventKey(t *testing.T) {
	attrs := func(source, id, verified string) queue.Message {
		return queue.Message{Attributes: map[string]string{AttrSource: source, AttrEventID: id, AttrVerified: verified}}
	}
	long := strings.Repeat("x", idem.MaxKeyLen)
	for _, c := range []struct {
		m    queue.Message
		want string
	}{
		{attrs("stripe", "evt_1", "true"), "event:stripe:evt_1"},
		{attrs("acme", "a:b", "true"), idem.Key("event", "acme", "a:b").String()},
		{attrs("acme", long, "true"), strings.Replace(Key("acme", long).String(), "accept:", "event:", 1)},
	} {
		k, err := EventKey(c.m)
		if err != nil || k.String() != c.want {
			t.Errorf("EventKey(%.60v) = %q, %v; want %q", c.m.Attributes, k, err, c.want)
		}
		if k.String() == Key(c.m.Attributes[AttrSource], c.m.Attributes[AttrEventID]).String() {
			t.Errorf("EventKey is the Receiver's own key %s: a consumer on its ledger would never run", k)
		}
	}
	for _, m := range []queue.Message{
		{},
		attrs("", "evt_1", "true"),
		attrs("stripe", "", "true"),
		attrs("stripe", "evt_1", ""),
		attrs("stripe", "evt_1", "false"),
	} {
		if k, err := EventKey(m); !errors.Is(err, queue.ErrUndecodable) {
			t.Errorf("EventKey(%v) = %q, %v; want ErrUndecodable", m.Attributes, k, err)
		}
	}
}
