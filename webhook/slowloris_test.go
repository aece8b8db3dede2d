package webhook

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A sender that trickles its body (slow loris) is cut off with 408 once the
// body timeout passes, and nothing is captured; the handler does not hold
// the connection for the server's whole ReadTimeout (none is set here).
func TestReceiverSlowLorisBody(t *testing.T) {
	e := newEnv(t)
	rc, s := newReceiver(t, e, Publish(e.pub), WithBodyTimeout(300*time.Millisecond))
	srv := httptest.NewServer(rc)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"slow":true}`
	now := time.Now()
	req := "POST /hooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
		"Webhook-Id: msg_slow\r\nWebhook-Timestamp: " + formatUnix(now) + "\r\n" +
		"Webhook-Signature: " + s.Sign("msg_slow", now, []byte(body)) + "\r\n" +
		"Content-Length: 1000\r\n\r\n" + body[:3]
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	// Keep trickling a byte now and then, as a slow-loris sender does, until
	// the server answers.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 3; i < len(body); i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a slow body: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("slow body: %d, want 408", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Fatalf("Content-Type %q", ct)
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d messages from a cut-off body", n)
	}
}
