// Package vetmod is what the idem vet tests check: only the standard
// library, so that go vet runs without downloading anything.
package vetmod

import (
	"fmt"
	"log"
	"net/http"
	"time"
)

func process(r *http.Request) error { return nil }

// Notify answers 200 whether or not the work was done.
func Notify(w http.ResponseWriter, r *http.Request) {
	if err := process(r); err != nil {
		log.Printf("notify: %v", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// Charge sends a new idempotency key on every call.
func Charge(orderID string) (*http.Request, error) {
	req, err := http.NewRequest("POST", "https://pay.example/charges", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", fmt.Sprint(time.Now().UnixNano()))
	//idem:allow nondetkey a typo'd allow comment that silences nothing
	req.Header.Set("X-Order", orderID)
	return req, nil
}
