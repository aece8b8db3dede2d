package idemvet

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"path/filepath"
	"reflect"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// sink is one value in a key position.
type sink struct {
	expr ast.Expr
	what string // "idem.Key", "MessageDeduplicationId", ...
	// publish is true for a key given to a broker or a server at
	// publication (SQS dedup id, Nats-Msg-Id, asynq TaskID, an
	// Idempotency-Key request header, River unique args), false for the
	// key of an operation this code runs (idem.Key).
	publish bool
}

// sinkCalls are functions whose arguments are keys: the argument index,
// or -1 for all of them.
var sinkCalls = map[string]struct {
	arg     int
	what    string
	publish bool
}{
	pkgIdem + ".Key":            {-1, "idem.Key", false},
	pkgIdem + ".RawKey":         {0, "idem.RawKey", false},
	pkgWebhook + ".Key":         {1, "webhook.Key", false},
	pkgNATS + ".MsgId":          {0, "nats.MsgId", true},
	pkgJetStream + ".WithMsgID": {0, "jetstream.WithMsgID", true},
	pkgAsynq + ".TaskID":        {0, "asynq.TaskID", true},
}

// dedupFields are struct fields that are publish-side dedup ids.
var dedupFields = map[string]string{
	pkgSQS + ".SendMessageInput.MessageDeduplicationId":                  "SQS MessageDeduplicationId",
	pkgSQSTypes + ".SendMessageBatchRequestEntry.MessageDeduplicationId": "SQS MessageDeduplicationId",
	pkgSNS + ".PublishInput.MessageDeduplicationId":                      "SNS MessageDeduplicationId",
	pkgSNS + "/types.PublishBatchRequestEntry.MessageDeduplicationId":    "SNS MessageDeduplicationId",
}

// keyHeaders are headers whose value is a dedup or idempotency key.
var keyHeaders = map[string]bool{"idempotency-key": true, "nats-msg-id": true}

// sinks returns every key position in the package.
func sinks(pass *analysis.Pass) []sink {
	info := pass.TypesInfo
	var out []sink
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				out = append(out, callSinks(info, n)...)
			case *ast.CompositeLit:
				st, ok := deref(typeOf(info, n)).Underlying().(*types.Struct)
				if !ok {
					return true
				}
				owner := typeName(deref(typeOf(info, n)))
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					k, ok := kv.Key.(*ast.Ident)
					if !ok {
						continue
					}
					if s, ok := fieldSink(st, owner, k.Name, kv.Value); ok {
						out = append(out, s)
					}
				}
			case *ast.AssignStmt:
				if len(n.Lhs) != len(n.Rhs) {
					return true
				}
				for i, l := range n.Lhs {
					sel, ok := ast.Unparen(l).(*ast.SelectorExpr)
					if !ok {
						continue
					}
					s, ok := info.Selections[sel]
					if !ok || s.Kind() != types.FieldVal {
						continue
					}
					ownerT := fieldOwnerType(s)
					st, ok := ownerT.Underlying().(*types.Struct)
					if !ok {
						continue
					}
					if s, ok := fieldSink(st, typeName(ownerT), sel.Sel.Name, n.Rhs[i]); ok {
						out = append(out, s)
					}
				}
			}
			return true
		})
	}
	return out
}

// fieldSink reports whether owner.field = value puts value in a key
// position.
func fieldSink(st *types.Struct, owner, field string, value ast.Expr) (sink, bool) {
	if what, ok := dedupFields[owner+"."+field]; ok {
		return sink{expr: value, what: what, publish: true}, true
	}
	for i := range st.NumFields() {
		if st.Field(i).Name() != field {
			continue
		}
		tag := reflect.StructTag(st.Tag(i)).Get("river")
		for _, opt := range strings.Split(tag, ",") {
			if opt == "unique" {
				return sink{expr: value, what: "River unique arg " + field, publish: true}, true
			}
		}
	}
	return sink{}, false
}

// fieldOwnerType is fieldOwner's type.
func fieldOwnerType(sel *types.Selection) types.Type {
	t := sel.Recv()
	idx := sel.Index()
	for _, i := range idx[:len(idx)-1] {
		st, ok := deref(t).Underlying().(*types.Struct)
		if !ok {
			return types.Typ[types.Invalid]
		}
		t = st.Field(i).Type()
	}
	return deref(t)
}

func callSinks(info *types.Info, call *ast.CallExpr) []sink {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return nil
	}
	name := funcName(fn)
	if sc, ok := sinkCalls[name]; ok {
		if sc.arg < 0 {
			var out []sink
			for _, a := range call.Args {
				out = append(out, sink{expr: a, what: sc.what, publish: sc.publish})
			}
			return out
		}
		if sc.arg < len(call.Args) {
			return []sink{{expr: call.Args[sc.arg], what: sc.what, publish: sc.publish}}
		}
		return nil
	}
	switch name {
	case "net/http.Header.Set", "net/http.Header.Add", pkgNATS + ".Header.Set", pkgNATS + ".Header.Add":
		if len(call.Args) == 2 {
			if tv, ok := info.Types[call.Args[0]]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
				h := constant.StringVal(tv.Value)
				if keyHeaders[strings.ToLower(h)] {
					return []sink{{expr: call.Args[1], what: "the " + h + " header", publish: true}}
				}
			}
		}
	case pkgAsynq + ".NewTask":
		// With asynq.Unique, asynq derives the task's uniqueness key from
		// its payload.
		if len(call.Args) > 2 {
			for _, o := range call.Args[2:] {
				if oc, ok := ast.Unparen(o).(*ast.CallExpr); ok {
					if f, _ := typeutil.Callee(info, oc).(*types.Func); f != nil && funcName(f) == pkgAsynq+".Unique" {
						return []sink{{expr: call.Args[1], what: "the payload of an asynq.Unique task", publish: true}}
					}
				}
			}
		}
	}
	return nil
}

// where describes position p relative to the finding at at: "line 12",
// or "file.go:12" in another file.
func where(fset *token.FileSet, p, at token.Pos) string {
	pp, ap := fset.Position(p), fset.Position(at)
	if pp.Filename == ap.Filename {
		return fmt.Sprintf("line %d", pp.Line)
	}
	return fmt.Sprintf("%s:%d", filepath.Base(pp.Filename), pp.Line)
}

// keyCheck runs a key check: each sink (publish-side ones too when
// publish is set) traced in mode m.
func keyCheck(pass *analysis.Pass, check string, m mode, publish bool, msg func(s sink, o *origin, at string) string) (any, error) {
	fl := pass.ResultOf[flowAnalyzer].(*flow)
	var list []finding
	reported := map[token.Pos]bool{}
	for _, s := range sinks(pass) {
		if s.publish && !publish {
			continue
		}
		o := fl.trace(m, s.expr)
		if o == nil || reported[s.expr.Pos()] {
			continue
		}
		reported[s.expr.Pos()] = true
		list = append(list, finding{pos: s.expr.Pos(), end: s.expr.End(), message: msg(s, o, where(pass.Fset, o.pos, s.expr.Pos()))})
	}
	return report(pass, check, list), nil
}

// NondetKey reports keys derived from the clock, randomness, an id
// generator or a shared counter.
var NondetKey = &analysis.Analyzer{
	Name: "nondetkey",
	Doc: `report dedup and idempotency keys derived from time, randomness or counters

A key must be the same on every retry of one operation. A key built from
time.Now, math/rand, crypto/rand, a uuid/ksuid/xid/ulid generator or a
counter is new on every call, so a repeat is never recognised: an SQS
MessageDeduplicationId of time.Now().UnixNano() dedups nothing.`,
	Requires:   []*analysis.Analyzer{allowsAnalyzer, flowAnalyzer},
	ResultType: reflect.TypeFor[*findings](),
	Run: func(pass *analysis.Pass) (any, error) {
		return keyCheck(pass, "nondetkey", modeNondet, true, func(s sink, o *origin, at string) string {
			return fmt.Sprintf("%s is derived from %s (%s), which differs on every call: a retry of the same operation gets a new key and is not recognised as a repeat; fix: build the key from the operation's identity (an order id, the sender's event id)", s.what, o.what, at)
		})
	},
}

// DeliveryID reports operation keys built from a broker's delivery or
// message id.
var DeliveryID = &analysis.Analyzer{
	Name: "deliveryid",
	Doc: `report operation keys built from a broker's delivery or message id

A broker's id (SQS MessageId, AMQP DeliveryTag, a JetStream sequence, a
River job id, an asynq task id) names one enqueued copy of a message: a
redelivery keeps it, but the same request published twice gets two ids and
runs twice. Only keys of operations this code runs (idem.Key, idem.RawKey,
webhook.Key) are checked; passing a received id on as the dedup id of a
message published downstream is how a bridge should dedup, and is not
reported.`,
	Requires:   []*analysis.Analyzer{allowsAnalyzer, flowAnalyzer},
	ResultType: reflect.TypeFor[*findings](),
	Run: func(pass *analysis.Pass) (any, error) {
		return keyCheck(pass, "deliveryid", modeDelivery, false, func(s sink, o *origin, at string) string {
			return fmt.Sprintf("%s is built from the broker's id %s (%s): a redelivery keeps it, but the same request published twice gets a new id and runs twice; fix: key by a business id in the message (an order id, the sender's event id)", s.what, o.what, at)
		})
	},
}

// BodyHash reports keys that are a hash of a whole payload.
var BodyHash = &analysis.Analyzer{
	Name: "bodyhash",
	Doc: `report keys that are a hash of a whole payload

Two legitimately identical requests (two customers sent the same
notification) share a body hash, so the second is silently dropped; a
sender that changes a timestamp between retries defeats it. Where no id
exists and that is understood, say so with //idem:allow bodyhash REASON.`,
	Requires:   []*analysis.Analyzer{allowsAnalyzer, flowAnalyzer},
	ResultType: reflect.TypeFor[*findings](),
	Run: func(pass *analysis.Pass) (any, error) {
		return keyCheck(pass, "bodyhash", modeBodyHash, true, func(s sink, o *origin, at string) string {
			return fmt.Sprintf("%s is %s (%s): two legitimately identical requests collide and the second is dropped, and a sender that changes a field between retries defeats it; fix: key by an id in the payload, or write //idem:allow bodyhash REASON if there is none", s.what, o.what, at)
		})
	},
}
