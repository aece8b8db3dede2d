// Package problem writes RFC 9457 problem documents
// (application/problem+json), the error answers of every HTTP surface of
// idem: the httpidem middleware, the webhook Receiver and `idem serve`.
package problem

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// TypeBase begins the type URI of every problem idem answers: the address
// of docs/problems.md, which documents each type under a heading of its
// own, so that a type URI followed in a browser lands on its
// documentation (RFC 9457 section 3.1.1). Each surface adds its name and
// the kind after the '#': TypeBase+"httpidem-key-reused",
// TypeBase+"webhook-in-progress", TypeBase+"serve-busy". The types are
// part of idem's API: clients match on them. Adding one means adding its
// heading to docs/problems.md (each surface's tests check its own).
const TypeBase = "https://github.com/idemkit/idem/blob/main/docs/problems.md#"

// Write answers w with status and a problem document of the given type URI,
// title and detail ("" leaves detail out), plus members as extension
// members (they cannot replace type, title, status or detail). It sets
// Content-Type and Cache-Control: no-store, drops a Content-Length a
// handler may have set, and with retryAfter > 0 sets Retry-After
// ([RetryAfter]).
func Write(w http.ResponseWriter, status int, typ, title, detail string, members map[string]any, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if retryAfter > 0 {
		h.Set("Retry-After", RetryAfter(retryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(document(status, typ, title, detail, members))
}

// document is the problem's JSON, members in a fixed order: type, title,
// status, detail, then the extension members by name.
func document(status int, typ, title, detail string, members map[string]any) []byte {
	b := []byte(`{"type":`)
	b = appendJSON(b, typ)
	b = append(b, `,"title":`...)
	b = appendJSON(b, title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	if detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSON(b, detail)
	}
	names := make([]string, 0, len(members))
	for k := range members {
		switch k {
		case "type", "title", "status", "detail":
		default:
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		v, err := json.Marshal(members[k])
		if err != nil {
			continue // a member that cannot be encoded is left out, not the answer
		}
		b = append(b, ',')
		b = appendJSON(b, k)
		b = append(b, ':')
		b = append(b, v...)
	}
	return append(b, "}\n"...)
}

func appendJSON(b []byte, s string) []byte {
	v, _ := json.Marshal(s) // a string always encodes
	return append(b, v...)
}

// RetryAfter is d as a Retry-After value: whole seconds, rounded up, at
// least 1.
func RetryAfter(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}
