package idemvet

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"reflect"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// Swallowed reports handlers that log an error and then answer success.
var Swallowed = &analysis.Analyzer{
	Name: "swallowed",
	Doc: `report HTTP and Lambda handlers that only log an error, then answer success

The status code is part of the sender's retry protocol: 200 means "I have
taken responsibility for this". A handler that catches an error, logs it
and goes on to write a 2xx (or to return a response with a nil error)
switches the sender's retries off, and the only trace of the lost work is a
log line. The check looks at an "if err != nil" whose body only logs (and
may continue a loop), then follows the handler's statements: an explicit
2xx write or success return, before anything that uses the error again or
answers with a failure, is reported. Errors from writing the response or
from Close are not reported: nothing can be done about them.`,
	Requires:   []*analysis.Analyzer{allowsAnalyzer},
	ResultType: reflect.TypeFor[*findings](),
	Run:        runSwallowed,
}

// handlerKind is what kind of handler a function is.
type handlerKind int

const (
	notHandler handlerKind = iota
	httpHandler
	lambdaHandler
)

type handler struct {
	kind    handlerKind
	w       types.Object // the http.ResponseWriter (http)
	wName   string
	ftype   *ast.FuncType
	body    *ast.BlockStmt
	results []types.Type
	file    *ast.File
}

// signatureOf returns the signature of a *ast.FuncDecl or *ast.FuncLit.
func signatureOf(info *types.Info, n ast.Node) *types.Signature {
	var t types.Type
	switch n := n.(type) {
	case *ast.FuncDecl:
		if obj := info.Defs[n.Name]; obj != nil {
			t = obj.Type()
		}
	case *ast.FuncLit:
		t = info.TypeOf(n)
	}
	sig, _ := t.(*types.Signature)
	return sig
}

func classify(sig *types.Signature) (h handler) {
	if sig == nil {
		return h
	}
	var hasReq bool
	for i := range sig.Params().Len() {
		p := sig.Params().At(i)
		switch tn := typeName(deref(p.Type())); {
		case tn == "net/http.ResponseWriter":
			h.w = p
			h.wName = p.Name()
		case tn == "net/http.Request":
			hasReq = true
		case strings.HasPrefix(tn, pkgEvents+"."):
			h.kind = lambdaHandler
		}
	}
	for i := range sig.Results().Len() {
		t := sig.Results().At(i).Type()
		h.results = append(h.results, t)
		if strings.HasPrefix(typeName(deref(t)), pkgEvents+".") {
			h.kind = lambdaHandler
		}
	}
	if h.w != nil && hasReq {
		h.kind = httpHandler
	}
	if h.kind == lambdaHandler && (len(h.results) == 0 || !isError(h.results[len(h.results)-1])) {
		h.kind = notHandler
	}
	return h
}

var errorType = types.Universe.Lookup("error").Type()

func isError(t types.Type) bool { return types.Identical(t, errorType) }

func runSwallowed(pass *analysis.Pass) (any, error) {
	var list []finding
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			var ft *ast.FuncType
			var body *ast.BlockStmt
			switch n := n.(type) {
			case *ast.FuncDecl:
				ft, body = n.Type, n.Body
			case *ast.FuncLit:
				ft, body = n.Type, n.Body
			default:
				return true
			}
			if body == nil {
				return true
			}
			h := classify(signatureOf(pass.TypesInfo, n))
			if h.kind == notHandler {
				return true
			}
			h.ftype, h.body, h.file = ft, body, f
			list = append(list, swallowedIn(pass, &h)...)
			return true
		})
	}
	return report(pass, "swallowed", list), nil
}

// stmtPath is the chain of statement lists from the function body down
// to a statement: each level's list and the index in it.
type stmtLevel struct {
	list []ast.Stmt
	i    int
	loop bool // the list is a loop body
}

func swallowedIn(pass *analysis.Pass, h *handler) []finding {
	var out []finding
	var walk func(list []ast.Stmt, path []stmtLevel, loop bool)
	walk = func(list []ast.Stmt, path []stmtLevel, loop bool) {
		for i, s := range list {
			here := append(path[:len(path):len(path)], stmtLevel{list: list, i: i, loop: loop})
			if ifs, ok := s.(*ast.IfStmt); ok {
				if f, ok := checkIf(pass, h, ifs, here); ok {
					out = append(out, f)
				}
			}
			for _, sub := range childLists(s) {
				walk(sub.list, here, sub.loop)
			}
		}
	}
	walk(h.body.List, nil, false)
	return out
}

type childList struct {
	list []ast.Stmt
	loop bool
}

// childLists returns the statement lists nested directly in s (not in
// function literals).
func childLists(s ast.Stmt) []childList {
	switch s := s.(type) {
	case *ast.BlockStmt:
		return []childList{{s.List, false}}
	case *ast.IfStmt:
		out := []childList{{s.Body.List, false}}
		if s.Else != nil {
			if b, ok := s.Else.(*ast.BlockStmt); ok {
				out = append(out, childList{b.List, false})
			} else {
				out = append(out, childList{[]ast.Stmt{s.Else}, false})
			}
		}
		return out
	case *ast.ForStmt:
		return []childList{{s.Body.List, true}}
	case *ast.RangeStmt:
		return []childList{{s.Body.List, true}}
	case *ast.SwitchStmt:
		return clauses(s.Body)
	case *ast.TypeSwitchStmt:
		return clauses(s.Body)
	case *ast.SelectStmt:
		return clauses(s.Body)
	case *ast.LabeledStmt:
		return childLists(s.Stmt)
	}
	return nil
}

func clauses(b *ast.BlockStmt) []childList {
	var out []childList
	for _, c := range b.List {
		switch c := c.(type) {
		case *ast.CaseClause:
			out = append(out, childList{c.Body, false})
		case *ast.CommClause:
			out = append(out, childList{c.Body, false})
		}
	}
	return out
}

// checkIf reports ifs = "if err != nil { log... }" followed by a success.
func checkIf(pass *analysis.Pass, h *handler, ifs *ast.IfStmt, path []stmtLevel) (finding, bool) {
	info := pass.TypesInfo
	// An else branch runs only without the error: the error's path is the
	// body, then what follows the if.
	errObj := nilCheckedError(info, ifs.Cond)
	if errObj == nil {
		return finding{}, false
	}
	// The body only logs, and may continue the loop.
	body := ifs.Body.List
	cont := false
	if n := len(body); n > 0 {
		if br, ok := body[n-1].(*ast.BranchStmt); ok && br.Tok == token.CONTINUE && br.Label == nil {
			cont = true
			body = body[:n-1]
		}
	}
	if len(body) == 0 {
		return finding{}, false
	}
	for _, s := range body {
		es, ok := s.(*ast.ExprStmt)
		if !ok {
			return finding{}, false
		}
		call, ok := ast.Unparen(es.X).(*ast.CallExpr)
		if !ok || !isLogCall(info, call) {
			return finding{}, false
		}
	}
	// Errors from writing the response or closing are left alone.
	if src := errorSource(info, ifs, path, errObj); src == nil || writesResponse(info, h, src) || isCloseLike(info, src) {
		return finding{}, false
	}
	// Follow what runs next.
	for lvl := len(path) - 1; lvl >= 0; lvl-- {
		l := path[lvl]
		if cont && !l.loop {
			continue // skip to the end of the loop body
		}
		if cont && l.loop {
			cont = false
			continue // the rest of the loop body does not run
		}
		for _, s := range l.list[l.i+1:] {
			switch v, at := verdict(info, h, s, errObj); v {
			case success:
				return swallowedFinding(pass, h, ifs, at), true
			case stop:
				return finding{}, false
			}
		}
		if l.loop {
			// The loop runs again; the statements after it come next.
		}
	}
	return finding{}, false
}

// nilCheckedError returns the error variable of "err != nil".
func nilCheckedError(info *types.Info, cond ast.Expr) types.Object {
	be, ok := ast.Unparen(cond).(*ast.BinaryExpr)
	if !ok || be.Op != token.NEQ {
		return nil
	}
	x, y := ast.Unparen(be.X), ast.Unparen(be.Y)
	if id, ok := x.(*ast.Ident); ok && id.Name == "nil" {
		x, y = y, x
	}
	if id, ok := y.(*ast.Ident); !ok || id.Name != "nil" {
		return nil
	}
	id, ok := x.(*ast.Ident)
	if !ok {
		return nil
	}
	obj := info.ObjectOf(id)
	if obj == nil || !isError(obj.Type()) {
		return nil
	}
	return obj
}

// errorSource returns the call that set err: in the if's init, or the
// statement just before it.
func errorSource(info *types.Info, ifs *ast.IfStmt, path []stmtLevel, errObj types.Object) *ast.CallExpr {
	find := func(s ast.Stmt) *ast.CallExpr {
		as, ok := s.(*ast.AssignStmt)
		if !ok {
			return nil
		}
		for i, l := range as.Lhs {
			if id, ok := l.(*ast.Ident); ok && info.ObjectOf(id) == errObj {
				r := as.Rhs[0]
				if len(as.Rhs) == len(as.Lhs) {
					r = as.Rhs[i]
				}
				call, _ := ast.Unparen(r).(*ast.CallExpr)
				return call
			}
		}
		return nil
	}
	if ifs.Init != nil {
		return find(ifs.Init)
	}
	l := path[len(path)-1]
	if l.i > 0 {
		return find(l.list[l.i-1])
	}
	return nil
}

// writesResponse reports whether call writes to the handler's
// ResponseWriter (w.Write, json.NewEncoder(w).Encode, fmt.Fprint(w, ...)).
func writesResponse(info *types.Info, h *handler, call *ast.CallExpr) bool {
	if h.w == nil {
		return false
	}
	found := false
	ast.Inspect(call, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && info.Uses[id] == h.w {
			found = true
		}
		return !found
	})
	return found
}

func isCloseLike(info *types.Info, call *ast.CallExpr) bool {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return false
	}
	switch fn.Name() {
	case "Close", "Flush", "Shutdown", "Sync":
		return true
	}
	return false
}

var logMethods = map[string]bool{
	"Print": true, "Printf": true, "Println": true,
	"Error": true, "Errorf": true, "Errorw": true, "ErrorContext": true,
	"Warn": true, "Warnf": true, "Warnw": true, "Warning": true, "Warningf": true, "WarnContext": true,
	"Info": true, "Infof": true, "Infow": true, "InfoContext": true,
	"Debug": true, "Debugf": true, "Debugw": true, "DebugContext": true,
	"Log": true, "Logf": true, "LogAttrs": true,
	"Msg": true, "Msgf": true, "Send": true,
	"RecordError": true, "CaptureException": true, "CaptureError": true,
}

// isLogCall reports whether call only logs: log, slog, fmt.Print*,
// fmt.Fprint* to os.Stderr or os.Stdout, or a logger method returning no
// error.
func isLogCall(info *types.Info, call *ast.CallExpr) bool {
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return false
	}
	sig := fn.Type().(*types.Signature)
	for i := range sig.Results().Len() {
		if isError(sig.Results().At(i).Type()) {
			return false
		}
	}
	pkg := ""
	if fn.Pkg() != nil {
		pkg = fn.Pkg().Path()
	}
	if sig.Recv() == nil {
		switch pkg {
		case "log":
			return strings.HasPrefix(fn.Name(), "Print")
		case "log/slog":
			return logMethods[fn.Name()]
		default:
			// golang.org/x/exp/slog, logrus, glog, klog, zerolog/log, ...
			last := pkg[strings.LastIndex(pkg, "/")+1:]
			return strings.Contains(last, "log") && logMethods[fn.Name()]
		case "fmt":
			switch fn.Name() {
			case "Print", "Printf", "Println":
				return true
			case "Fprint", "Fprintf", "Fprintln":
				if len(call.Args) > 0 {
					if sel, ok := ast.Unparen(call.Args[0]).(*ast.SelectorExpr); ok {
						if v, ok := info.Uses[sel.Sel].(*types.Var); ok && v.Pkg() != nil && v.Pkg().Path() == "os" {
							return v.Name() == "Stderr" || v.Name() == "Stdout"
						}
					}
				}
			}
			return false
		}
	}
	if typeName(deref(sig.Recv().Type())) == "testing.common" {
		return false
	}
	return logMethods[fn.Name()]
}

type verdictKind int

const (
	unknown verdictKind = iota // go on
	success                    // the handler answers success here
	stop                       // anything else: failure, or err used again
)

// verdict says what statement s does for the swallowed error errObj.
func verdict(info *types.Info, h *handler, s ast.Stmt, errObj types.Object) (v verdictKind, at ast.Node) {
	v = unknown
	ast.Inspect(s, func(n ast.Node) bool {
		if v != unknown {
			return false
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.Ident:
			if info.Uses[n] == errObj {
				v = stop
			}
		case *ast.ReturnStmt:
			v, at = returnVerdict(info, h, n), n
			return false
		case *ast.CallExpr:
			if h.kind == httpHandler {
				if k := writeVerdict(info, h, n); k != unknown {
					v, at = k, n
					return false
				}
			}
			if fn, _ := typeutil.Callee(info, n).(*types.Func); fn != nil {
				switch funcName(fn) {
				case "os.Exit", "log.Fatal", "log.Fatalf", "log.Fatalln", "log.Panic", "log.Panicf", "log.Panicln":
					v = stop
				}
			} else if id, ok := ast.Unparen(n.Fun).(*ast.Ident); ok && id.Name == "panic" {
				v = stop
			}
		}
		return true
	})
	return v, at
}

// writeVerdict classifies a call in an HTTP handler that uses w.
func writeVerdict(info *types.Info, h *handler, call *ast.CallExpr) verdictKind {
	if !writesResponse(info, h, call) {
		return unknown
	}
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return stop
	}
	switch name := funcName(fn); name {
	case "net/http.ResponseWriter.WriteHeader":
		if len(call.Args) == 1 {
			if c, ok := intConst(info, call.Args[0]); ok {
				if c >= 200 && c < 300 {
					return success
				}
			}
		}
		return stop
	case "net/http.ResponseWriter.Write", "fmt.Fprint", "fmt.Fprintf", "fmt.Fprintln", "io.WriteString",
		"encoding/json.Encoder.Encode", "encoding/json.NewEncoder":
		return success
	case "net/http.ResponseWriter.Header", "net/http.Header.Set", "net/http.Header.Add":
		return unknown // headers only
	}
	return stop
}

func intConst(info *types.Info, e ast.Expr) (int64, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil {
		return 0, false
	}
	return constant.Int64Val(constant.ToInt(tv.Value))
}

// returnVerdict classifies a return statement.
func returnVerdict(info *types.Info, h *handler, r *ast.ReturnStmt) verdictKind {
	if h.kind == httpHandler {
		return stop // the response is whatever was written before
	}
	if len(r.Results) == 0 || len(r.Results) != len(h.results) {
		return stop
	}
	last := ast.Unparen(r.Results[len(r.Results)-1])
	if id, ok := last.(*ast.Ident); !ok || id.Name != "nil" || info.Uses[id] != types.Universe.Lookup("nil") {
		return stop
	}
	for _, e := range r.Results[:len(r.Results)-1] {
		switch e := ast.Unparen(e).(type) {
		case *ast.CompositeLit:
			for _, el := range e.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "StatusCode" {
						if c, ok := intConst(info, kv.Value); !ok || c < 200 || c >= 300 {
							return stop
						}
					}
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "BatchItemFailures" {
						return stop
					}
				}
			}
		case *ast.BasicLit:
		default:
			return stop // a variable or a call: cannot tell
		}
	}
	return success
}

func swallowedFinding(pass *analysis.Pass, h *handler, ifs *ast.IfStmt, at ast.Node) finding {
	line := pass.Fset.Position(at.Pos()).Line
	var msg string
	var fixes []analysis.SuggestedFix
	switch h.kind {
	case httpHandler:
		msg = fmt.Sprintf("the error is only logged, and the handler then answers 2xx (line %d): the sender takes it as done and never retries, and the work is lost; fix: answer 5xx and return (http.Error(w, ..., http.StatusInternalServerError)), unless the payload was durably kept for later", line)
		if fix, ok := httpFix(pass, h, ifs); ok {
			fixes = append(fixes, fix)
		}
	default:
		msg = fmt.Sprintf("the error is only logged, and the handler then returns success (line %d): the sender or Lambda takes it as done and never retries, and the work is lost; fix: return the error (or a 5xx response, or the record in BatchItemFailures)", line)
		if len(h.results) == 1 {
			fixes = append(fixes, insertFix(pass, ifs, "return the error", "return "+errName(ifs)))
		}
	}
	return finding{pos: ifs.Pos(), end: ifs.Cond.End(), message: msg, fixes: fixes}
}

func errName(ifs *ast.IfStmt) string {
	be := ast.Unparen(ifs.Cond).(*ast.BinaryExpr)
	if id, ok := ast.Unparen(be.X).(*ast.Ident); ok && id.Name != "nil" {
		return id.Name
	}
	return ast.Unparen(be.Y).(*ast.Ident).Name
}

// httpFix answers 500 and returns after the logging.
func httpFix(pass *analysis.Pass, h *handler, ifs *ast.IfStmt) (analysis.SuggestedFix, bool) {
	if h.wName == "" || h.wName == "_" {
		return analysis.SuggestedFix{}, false
	}
	httpName := ""
	for _, imp := range h.file.Imports {
		if imp.Path.Value == `"net/http"` {
			httpName = "http"
			if imp.Name != nil {
				httpName = imp.Name.Name
			}
		}
	}
	if httpName == "" || httpName == "_" || httpName == "." {
		return analysis.SuggestedFix{}, false
	}
	code := httpName + ".StatusInternalServerError"
	return insertFix(pass, ifs, "answer 500 and return",
		fmt.Sprintf("%s.Error(%s, %s.StatusText(%s), %s)\nreturn", httpName, h.wName, httpName, code, code)), true
}

// insertFix inserts text, one statement a line, after the if body's last
// logging statement (before a trailing continue, which it replaces).
func insertFix(pass *analysis.Pass, ifs *ast.IfStmt, msg, text string) analysis.SuggestedFix {
	body := ifs.Body.List
	last := body[len(body)-1]
	pos, end := last.End(), last.End()
	if br, ok := last.(*ast.BranchStmt); ok && br.Tok == token.CONTINUE {
		prev := body[len(body)-2]
		pos, end = prev.End(), br.End()
	}
	indent := strings.Repeat("\t", pass.Fset.Position(last.Pos()).Column-1)
	var b bytes.Buffer
	for _, l := range strings.Split(text, "\n") {
		b.WriteString("\n" + indent + l)
	}
	return analysis.SuggestedFix{Message: msg, TextEdits: []analysis.TextEdit{{Pos: pos, End: end, NewText: b.Bytes()}}}
}
