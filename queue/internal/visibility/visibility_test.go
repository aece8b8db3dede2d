package visibility

import (
	"testing"
	"time"
)

func TestReceived(t *testing.T) {
	asked := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name     string
		answered time.Time
		want     time.Time // the deadline, for a visibility of 30 s
	}{
		{"long_poll", asked.Add(5 * time.Second), asked.Add(5*time.Second - ReceiveSlack + 30*time.Second)},
		{"quick_answer", asked.Add(100 * time.Millisecond), asked.Add(30 * time.Second)},
		{"answer_at_slack", asked.Add(ReceiveSlack), asked.Add(30 * time.Second)},
	} {
		dl := Received(asked, c.answered, 30*time.Second)
		if dl.Lapsed(c.want) || !dl.Lapsed(c.want.Add(time.Nanosecond)) {
			t.Errorf("%s: Received(asked, asked+%v, 30s) = %s, want %s", c.name, c.answered.Sub(asked), dl, c.want.Format(time.RFC3339Nano))
		}
	}
}

func TestExtend(t *testing.T) {
	asked := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	dl := Received(asked, asked, time.Second)
	if dl.Lapsed(asked.Add(time.Second)) || !dl.Lapsed(asked.Add(time.Second+time.Nanosecond)) {
		t.Fatalf("Received(asked, asked, 1s) = %s", dl)
	}
	// An extension counts from when its request was sent, earlier or
	// later than the deadline it replaces.
	started := asked.Add(500 * time.Millisecond)
	dl.Extend(started, 10*time.Second)
	if want := started.Add(10 * time.Second); dl.Lapsed(want) || !dl.Lapsed(want.Add(time.Nanosecond)) {
		t.Errorf("after Extend(asked+500ms, 10s): %s, want %s", dl, want.Format(time.RFC3339Nano))
	}
	dl.Extend(started, 100*time.Millisecond)
	if want := started.Add(100 * time.Millisecond); dl.Lapsed(want) || !dl.Lapsed(want.Add(time.Nanosecond)) {
		t.Errorf("after Extend(asked+500ms, 100ms): %s, want %s", dl, want.Format(time.RFC3339Nano))
	}
	if got, want := dl.String(), "2024-01-02T03:04:05.6Z"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
