package sqsmsg

import (
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
)

type attr struct {
	s *string
	b []byte
}

func value(a attr) (*string, []byte) { return a.s, a.b }

func TestAttribute(t *testing.T) {
	s, empty := "text", ""
	for _, c := range []struct {
		name string
		s    *string
		b    []byte
		want string
	}{
		{"string", &s, nil, "text"},
		{"empty_string", &empty, []byte("ignored"), ""},
		{"string_over_binary", &s, []byte("ignored"), "text"},
		{"binary", nil, []byte{0xff, 0x00, 'o', 'k'}, "\xff\x00ok"},
		{"neither", nil, nil, ""},
	} {
		if got := Attribute(c.s, c.b); got != c.want {
			t.Errorf("%s: Attribute = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestAttributes(t *testing.T) {
	if got := Attributes(map[string]attr{}, value); got != nil {
		t.Errorf("Attributes of none = %#v, want nil", got)
	}
	if got := Attributes[attr](nil, value); got != nil {
		t.Errorf("Attributes of nil = %#v, want nil", got)
	}
	s := "t7"
	got := Attributes(map[string]attr{"tenant": {s: &s}, "raw": {b: []byte("ok")}}, value)
	if want := map[string]string{"tenant": "t7", "raw": "ok"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Attributes = %#v, want %#v", got, want)
	}
}

func TestMessage(t *testing.T) {
	system := map[string]string{
		"MessageGroupId":                   "g",
		"MessageDeduplicationId":           "d",
		"ApproximateFirstReceiveTimestamp": "1700000000123",
		"SentTimestamp":                    "1700000000001",
		"ApproximateReceiveCount":          "3",
		"SenderId":                         "ignored",
	}
	attrs := map[string]string{"a": "b"}
	got := Message("id-1", "body", system, attrs)
	want := queue.Message{
		ID: "id-1", Body: []byte("body"), GroupID: "g", DedupID: "d",
		FirstReceived: time.UnixMilli(1700000000123), Published: time.UnixMilli(1700000000001),
		ReceiveCount: 3, Attributes: attrs,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Message = %+v, want %+v", got, want)
	}
	// Absent or unreadable system attributes leave their fields zero.
	got = Message("id-2", "", map[string]string{"SentTimestamp": "soon", "ApproximateFirstReceiveTimestamp": "0", "ApproximateReceiveCount": "x"}, nil)
	if want := (queue.Message{ID: "id-2", Body: []byte{}}); !reflect.DeepEqual(got, want) {
		t.Errorf("Message with unreadable attributes = %+v, want %+v", got, want)
	}
}
