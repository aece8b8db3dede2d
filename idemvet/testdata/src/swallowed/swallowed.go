// Package swallowed holds swallowed's fixtures.
package swallowed

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/sirupsen/logrus"
)

type payment struct {
	Result    string `json:"result"`
	Reference string `json:"reference"`
}

func createRecordInCoreSystem(ctx context.Context, p payment) error { return nil }
func updatePayment(ctx context.Context, p payment) error            { return nil }

func process(ctx context.Context, p payment) error {
	if p.Result == "SUCCESS" {
		if err := createRecordInCoreSystem(ctx, p); err != nil {
			return err
		}
	}
	return updatePayment(ctx, p)
}

// seedHandler is the seed's payment notification handler ported to Go:
// the catch logs, then the handler returns 200 {"success":true}.
func seedHandler(ctx context.Context, req events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	var p payment
	if err := json.Unmarshal([]byte(req.Body), &p); err != nil {
		return events.APIGatewayProxyResponse{StatusCode: 400}, nil
	}
	err := process(ctx, p)
	if err != nil { // want `the error is only logged, and the handler then returns success \(line 44\)`
		log.Println(err)
	}
	return events.APIGatewayProxyResponse{StatusCode: 200, Body: `{"success":true}`}, nil
}

// seedHandlerFixed returns 500 so that the sender retries.
func seedHandlerFixed(ctx context.Context, req events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	var p payment
	if err := json.Unmarshal([]byte(req.Body), &p); err != nil {
		return events.APIGatewayProxyResponse{StatusCode: 400}, nil
	}
	if err := process(ctx, p); err != nil {
		log.Println(err)
		return events.APIGatewayProxyResponse{StatusCode: 500}, nil
	}
	return events.APIGatewayProxyResponse{StatusCode: 200, Body: `{"success":true}`}, nil
}

func httpHandler(w http.ResponseWriter, r *http.Request) {
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, "bad payload", http.StatusBadRequest)
		return
	}
	if err := process(r.Context(), p); err != nil { // want `the error is only logged, and the handler then answers 2xx \(line 69\)`
		slog.Error("processing payment", "reference", p.Reference, "err", err)
	}
	w.WriteHeader(http.StatusOK)
}

func httpHandlerFixed(w http.ResponseWriter, r *http.Request) {
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, "bad payload", http.StatusBadRequest)
		return
	}
	if err := process(r.Context(), p); err != nil {
		slog.Error("processing payment", "reference", p.Reference, "err", err)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// Good: the answer was already written; a failed write can only be logged.
func writeFailure(w http.ResponseWriter, r *http.Request) {
	if _, err := w.Write([]byte("ok")); err != nil {
		log.Printf("writing the answer: %v", err)
	}
	w.Write(nil)
}

// Good: the error is kept and decides the answer later.
func collected(w http.ResponseWriter, r *http.Request) {
	var errs []error
	err := process(r.Context(), payment{})
	if err != nil {
		log.Print(err)
	}
	errs = append(errs, err)
	if len(errs) > 0 {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// sqsWorker logs and skips a failed record, then reports success: the
// failed record is deleted.
func sqsWorker(ctx context.Context, ev events.SQSEvent) error {
	for _, rec := range ev.Records {
		var p payment
		if err := json.Unmarshal([]byte(rec.Body), &p); err != nil {
			return errors.New("undecodable")
		}
		if err := process(ctx, p); err != nil { // want `the handler then returns success \(line 123\)`
			log.Printf("record %s: %v", rec.MessageId, err)
			continue
		}
		log.Printf("processed %s", rec.MessageId)
	}
	return nil
}

// Good: the failed record is reported in BatchItemFailures.
func sqsWorkerPartial(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, rec := range ev.Records {
		if err := process(ctx, payment{}); err != nil {
			log.Printf("record %s: %v", rec.MessageId, err)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
		}
	}
	return resp, nil
}

// Good: not a handler.
func notHandler(ctx context.Context) error {
	if err := process(ctx, payment{}); err != nil {
		log.Println(err)
	}
	return nil
}

func notify(ctx context.Context) error { return nil }

// withElse: the else branch runs only on success; the error path logs and
// falls through to the 200 after the switch.
func withElse(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Query().Get("type") {
	case "payment_intent.succeeded":
		if err := notify(r.Context()); err != nil { // want `answers 2xx \(line 161\)`
			slog.Error("notify", "err", err)
		} else {
			log.Print("notified")
		}
	case "charge.succeeded":
		log.Print("charged")
	}
	w.WriteHeader(http.StatusOK)
}

// A third-party logger's package function logs too.
func logrusHandler(w http.ResponseWriter, r *http.Request) {
	if err := notify(r.Context()); err != nil { // want `answers 2xx`
		logrus.Errorf("notify: %v", err)
	}
	w.Write([]byte("ok"))
}
