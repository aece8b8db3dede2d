package problem_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/internal/problemdoc"
)

func TestWrite(t *testing.T) {
	w := httptest.NewRecorder()
	w.Header().Set("Content-Length", "99")
	problem.Write(w, 409, "urn:x:busy", "Busy", "retry later",
		map[string]any{"outcome": "busy", "status": 200, "type": "forged"}, 1500*time.Millisecond)
	var doc map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if w.Code != 409 || doc["type"] != "urn:x:busy" || doc["title"] != "Busy" || doc["status"] != float64(409) ||
		doc["detail"] != "retry later" || doc["outcome"] != "busy" {
		t.Fatalf("%d %v", w.Code, doc)
	}
	h := w.Header()
	if h.Get("Content-Type") != "application/problem+json" || h.Get("Cache-Control") != "no-store" ||
		h.Get("Retry-After") != "2" || h.Get("Content-Length") != "" {
		t.Fatalf("headers %v", h)
	}
	w = httptest.NewRecorder()
	problem.Write(w, 400, "urn:x:bad", "Bad", "", map[string]any{"detail": "a member"}, 0)
	doc = nil
	_ = json.Unmarshal(w.Body.Bytes(), &doc)
	if _, ok := doc["detail"]; ok || w.Header().Get("Retry-After") != "" {
		t.Fatalf("no detail, no retry: %v %v", doc, w.Header())
	}
}

func TestRetryAfter(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", time.Minute: "60"} {
		if got := problem.RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %s, want %s", d, got, want)
		}
	}
}

// The members keep one order (type, title, status, detail, then the
// extension members by name): documented examples print them.
func TestWriteOrder(t *testing.T) {
	w := httptest.NewRecorder()
	problem.Write(w, 409, "urn:x:busy", "Busy", "later", map[string]any{"outcome": "busy", "fence": 3}, 0)
	want := `{"type":"urn:x:busy","title":"Busy","status":409,"detail":"later","fence":3,"outcome":"busy"}` + "\n"
	if got := w.Body.String(); got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}

// TestTypeBase pins the base of every problem type (clients match on it) and
// checks that each type docs/problems.md documents belongs to a surface.
func TestTypeBase(t *testing.T) {
	if problem.TypeBase != "https://github.com/idemkit/idem/blob/main/docs/problems.md#" {
		t.Errorf("TypeBase = %s", problem.TypeBase)
	}
	all := problemdoc.Titles(t, "")
	if len(all) == 0 {
		t.Fatal("docs/problems.md documents no type")
	}
	for anchor := range all {
		if !strings.HasPrefix(anchor, "httpidem-") && !strings.HasPrefix(anchor, "webhook-") && !strings.HasPrefix(anchor, "serve-") {
			t.Errorf("docs/problems.md: %s belongs to no surface (httpidem-, webhook-, serve-)", anchor)
		}
	}
}
