package dynamostore

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// proxy stands between a client and the test endpoint, to produce what a
// real endpoint does but an emulator cannot be made to do on demand: an
// answer lost after the write was made, an endpoint that goes away in the
// middle of a call, the item that DynamoDB returns with a failed
// condition (ReturnValuesOnConditionCheckFailure, which dynalite ignores),
// and answers of the test's choosing (intercept: a throttled request).
type proxy struct {
	t      testing.TB
	target string
	srv    *httptest.Server

	mu    sync.Mutex
	calls map[string]int // requests seen, by operation
	// drop: the operations whose next answers are lost after the
	// endpoint made them (the connection is closed instead), and how many.
	drop map[string]int
	// down: every request is dropped before it reaches the endpoint.
	down bool
	// allOld: failed conditions come back with the item, as DynamoDB
	// returns it when asked.
	allOld bool
	// pathErr: an UpdateItem whose condition fails is answered with the
	// ValidationException DynamoDB gives an update of a document path the
	// item lacks (the order of the two checks is DynamoDB's to choose).
	pathErr bool
	// before, when set, runs before a request is forwarded.
	before func(op string)
	// intercept, when set, sees each request first and may answer it in
	// the endpoint's stead (handled): with status and out, or by hanging
	// up when status is 0.
	intercept func(op string, body []byte) (status int, out []byte, handled bool)
}

func newProxy(t testing.TB) *proxy {
	p := &proxy{t: t, target: testEndpoint(t), calls: map[string]int{}, drop: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

// URL is the proxy's endpoint.
func (p *proxy) URL() string { return p.srv.URL }

func (p *proxy) Calls(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[op]
}

func (p *proxy) Drop(op string, n int) {
	p.mu.Lock()
	p.drop[op] += n
	p.mu.Unlock()
}

func (p *proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

func (p *proxy) SetBefore(f func(op string)) {
	p.mu.Lock()
	p.before = f
	p.mu.Unlock()
}

func (p *proxy) SetIntercept(f func(op string, body []byte) (status int, out []byte, handled bool)) {
	p.mu.Lock()
	p.intercept = f
	p.mu.Unlock()
}

func (p *proxy) SetPathErr(on bool) {
	p.mu.Lock()
	p.pathErr = on
	p.mu.Unlock()
}

func (p *proxy) SetAllOld(on bool) {
	p.mu.Lock()
	p.allOld = on
	p.mu.Unlock()
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func (p *proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	p.mu.Lock()
	p.calls[op]++
	down, allOld, before, pathErr, intercept := p.down, p.allOld, p.before, p.pathErr, p.intercept
	drop := p.drop[op] > 0
	if drop {
		p.drop[op]--
	}
	p.mu.Unlock()
	if down {
		hangUp(w)
		return
	}
	if intercept != nil {
		if status, out, handled := intercept(op, body); handled {
			if status == 0 {
				hangUp(w)
				return
			}
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(out)), 10))
			w.WriteHeader(status)
			w.Write(out)
			return
		}
	}
	if before != nil {
		before(op)
	}
	status, header, out := p.forward(r.Header, body)
	if drop {
		hangUp(w)
		return
	}
	if pathErr && op == "UpdateItem" && status == http.StatusBadRequest && bytes.Contains(out, []byte("ConditionalCheckFailedException")) {
		out = []byte(`{"__type":"com.amazon.coral.validate#ValidationException","message":"The document path provided in the update expression is invalid for update"}`)
		header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(out)), 10))
	}
	if allOld && status == http.StatusBadRequest && bytes.Contains(out, []byte("ConditionalCheckFailedException")) &&
		bytes.Contains(body, []byte(`"ReturnValuesOnConditionCheckFailure":"ALL_OLD"`)) {
		out = p.withItem(r.Header, body, out)
		header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(out)), 10))
	}
	for k, v := range header {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(status)
	w.Write(out)
}

func (p *proxy) forward(h http.Header, body []byte) (int, http.Header, []byte) {
	req, err := http.NewRequest(http.MethodPost, p.target, bytes.NewReader(body))
	if err != nil {
		p.t.Errorf("proxy: %v", err)
		return http.StatusInternalServerError, http.Header{}, nil
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Del("Accept-Encoding")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Errorf("proxy: %v", err)
		return http.StatusBadGateway, http.Header{}, nil
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out
}

// withItem adds the item the condition failed on to the error: read
// after the failure, which is the same item while nothing else writes.
func (p *proxy) withItem(h http.Header, reqBody, errBody []byte) []byte {
	var in struct {
		TableName string
		Key       map[string]json.RawMessage
		Item      map[string]json.RawMessage
	}
	if err := json.Unmarshal(reqBody, &in); err != nil {
		p.t.Errorf("proxy: %v", err)
		return errBody
	}
	key := in.Key
	if key == nil {
		key = map[string]json.RawMessage{AttrKey: in.Item[AttrKey]}
	}
	get, _ := json.Marshal(map[string]any{"TableName": in.TableName, "Key": key, "ConsistentRead": true})
	gh := h.Clone()
	gh.Set("X-Amz-Target", "DynamoDB_20120810.GetItem")
	status, _, out := p.forward(gh, get)
	var got struct{ Item json.RawMessage }
	if status != http.StatusOK || json.Unmarshal(out, &got) != nil {
		p.t.Errorf("proxy: GetItem: %d %s", status, out)
		return errBody
	}
	if len(got.Item) == 0 {
		return errBody
	}
	var e map[string]json.RawMessage
	if err := json.Unmarshal(errBody, &e); err != nil {
		p.t.Errorf("proxy: %v", err)
		return errBody
	}
	e["Item"] = got.Item
	b, _ := json.Marshal(e)
	return b
}
