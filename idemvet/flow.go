package idemvet

import (
	"go/ast"
	"go/token"
	"go/types"
	"reflect"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

// def is one value given to a variable somewhere in the package.
type def struct {
	expr  ast.Expr // the value (a call for multi-value assignments)
	field string   // "" for the whole variable, else x.field = expr
}

// flow is the def-use index of a package: every value assigned to each
// variable, flow-insensitively.
type flow struct {
	info    *types.Info
	pkg     *types.Package
	defs    map[types.Object][]def
	counter map[types.Object]bool // variables incremented with ++ or +=
}

var flowAnalyzer = &analysis.Analyzer{
	Name:       "idemflow",
	Doc:        "indexes the values assigned to each variable (used by the idemvet key checks)",
	Run:        runFlow,
	ResultType: reflect.TypeFor[*flow](),
}

func runFlow(pass *analysis.Pass) (any, error) {
	fl := &flow{info: pass.TypesInfo, pkg: pass.Pkg, defs: map[types.Object][]def{}, counter: map[types.Object]bool{}}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				fl.assign(n.Lhs, n.Rhs, n.Tok)
			case *ast.ValueSpec:
				lhs := make([]ast.Expr, len(n.Names))
				for i, id := range n.Names {
					lhs[i] = id
				}
				fl.assign(lhs, n.Values, token.DEFINE)
			case *ast.RangeStmt:
				// The key and value come from the ranged value.
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if obj := fl.varOf(e); obj != nil {
						fl.defs[obj] = append(fl.defs[obj], def{expr: n.X})
					}
				}
			case *ast.IncDecStmt:
				if obj := fl.varOf(n.X); obj != nil {
					fl.counter[obj] = true
				}
			case *ast.CallExpr:
				fl.writeCall(n)
			}
			return true
		})
	}
	return fl, nil
}

// assign records lhs = rhs.
func (fl *flow) assign(lhs, rhs []ast.Expr, tok token.Token) {
	if len(rhs) == 0 {
		return
	}
	for i, l := range lhs {
		var r ast.Expr
		if len(rhs) == len(lhs) {
			r = rhs[i]
		} else {
			r = rhs[0] // a, b := f()
		}
		if tok == token.ADD_ASSIGN || tok == token.SUB_ASSIGN {
			if obj := fl.varOf(l); obj != nil {
				fl.counter[obj] = true
			}
		}
		if obj := fl.varOf(l); obj != nil {
			fl.defs[obj] = append(fl.defs[obj], def{expr: r})
			continue
		}
		if sel, ok := ast.Unparen(l).(*ast.SelectorExpr); ok {
			if obj := fl.varOf(sel.X); obj != nil {
				fl.defs[obj] = append(fl.defs[obj], def{expr: r, field: sel.Sel.Name})
			}
		}
	}
}

// writeCall records the calls that fill a variable through an argument
// or a receiver: h.Write(b), io.WriteString(h, s), io.Copy(h, r),
// fmt.Fprintf(h, ...), rand.Read(b).
func (fl *flow) writeCall(call *ast.CallExpr) {
	fn := typeutil.StaticCallee(fl.info, call)
	if fn == nil {
		if m, ok := typeutil.Callee(fl.info, call).(*types.Func); ok {
			fn = m // an interface method, such as hash.Hash's Write
		} else {
			return
		}
	}
	sig := fn.Type().(*types.Signature)
	if sig.Recv() != nil {
		switch fn.Name() {
		case "Write", "WriteString", "WriteByte", "WriteRune", "ReadFrom":
			if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok && len(call.Args) > 0 {
				if obj := fl.varOf(sel.X); obj != nil {
					fl.defs[obj] = append(fl.defs[obj], def{expr: call.Args[0]})
				}
			}
		case "Read":
			if isRandPkg(fn.Pkg()) && len(call.Args) > 0 {
				if obj := fl.varOf(call.Args[0]); obj != nil {
					fl.defs[obj] = append(fl.defs[obj], def{expr: call})
				}
			}
		}
		return
	}
	if fn.Pkg() == nil || len(call.Args) == 0 {
		return
	}
	switch fn.Pkg().Path() + "." + fn.Name() {
	case "io.WriteString", "io.Copy", "io.CopyN", "io.CopyBuffer", "fmt.Fprint", "fmt.Fprintf", "fmt.Fprintln":
		if obj := fl.varOf(call.Args[0]); obj != nil && len(call.Args) > 1 {
			for _, a := range call.Args[1:] {
				fl.defs[obj] = append(fl.defs[obj], def{expr: a})
			}
		}
	case "crypto/rand.Read", "math/rand.Read":
		if obj := fl.varOf(call.Args[0]); obj != nil {
			fl.defs[obj] = append(fl.defs[obj], def{expr: call})
		}
	}
}

// varOf returns the variable e names (x or &x), or nil.
func (fl *flow) varOf(e ast.Expr) types.Object {
	e = ast.Unparen(e)
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = ast.Unparen(u.X)
	}
	id, ok := e.(*ast.Ident)
	if !ok || id.Name == "_" {
		return nil
	}
	obj := fl.info.ObjectOf(id)
	if v, ok := obj.(*types.Var); ok && !v.IsField() {
		return v
	}
	return nil
}

// mode is what a walk looks for.
type mode int

const (
	modeNondet   mode = iota // time, randomness, generated ids, counters
	modeDelivery             // a broker's delivery or message id
	modeBody                 // a whole payload
	modeBodyHash             // a hash of a whole payload
)

// origin is where a tainted value comes from.
type origin struct {
	what string // "time.Now", "sqs types.Message.MessageId", ...
	pos  token.Pos
}

// walker follows a value back to its origins.
type walker struct {
	fl    *flow
	mode  mode
	seen  map[types.Object]bool
	depth int
}

func (fl *flow) trace(m mode, e ast.Expr) *origin {
	w := &walker{fl: fl, mode: m, seen: map[types.Object]bool{}}
	return w.expr(e)
}

const maxDepth = 40

func (w *walker) expr(e ast.Expr) *origin {
	if e == nil || w.depth > maxDepth {
		return nil
	}
	w.depth++
	defer func() { w.depth-- }()
	info := w.fl.info
	switch e := e.(type) {
	case *ast.ParenExpr:
		return w.expr(e.X)
	case *ast.Ident:
		return w.ident(e, "")
	case *ast.SelectorExpr:
		if _, ok := info.Selections[e]; !ok {
			return w.ident(e.Sel, "") // pkg.Var
		}
		return w.selector(e)
	case *ast.CallExpr:
		return w.call(e)
	case *ast.BinaryExpr:
		switch e.Op {
		case token.EQL, token.NEQ, token.LSS, token.LEQ, token.GTR, token.GEQ, token.LAND, token.LOR:
			return nil
		}
		if o := w.expr(e.X); o != nil {
			return o
		}
		return w.expr(e.Y)
	case *ast.UnaryExpr:
		if e.Op == token.ARROW || e.Op == token.NOT {
			return nil
		}
		return w.expr(e.X)
	case *ast.StarExpr:
		return w.expr(e.X)
	case *ast.IndexExpr:
		if tv, ok := info.Types[e.X]; ok && (tv.IsType() || isFuncValue(tv.Type)) {
			return nil
		}
		return w.expr(e.X)
	case *ast.SliceExpr:
		return w.expr(e.X)
	case *ast.TypeAssertExpr:
		return w.expr(e.X)
	case *ast.CompositeLit:
		for _, el := range e.Elts {
			if o := w.expr(el); o != nil {
				return o
			}
		}
	case *ast.KeyValueExpr:
		return w.expr(e.Value)
	}
	return nil
}

func isFuncValue(t types.Type) bool {
	_, ok := t.Underlying().(*types.Signature)
	return ok
}

// ident follows variable id; field narrows it to one of its fields.
func (w *walker) ident(id *ast.Ident, field string) *origin {
	obj, ok := w.fl.info.ObjectOf(id).(*types.Var)
	if !ok || obj.IsField() {
		return nil
	}
	if w.mode == modeNondet && w.fl.counter[obj] && obj.Parent() == obj.Pkg().Scope() && field == "" {
		return &origin{what: "the counter " + obj.Name(), pos: obj.Pos()}
	}
	if w.seen[obj] {
		return nil
	}
	w.seen[obj] = true
	defer delete(w.seen, obj)
	for _, d := range w.fl.defs[obj] {
		var o *origin
		switch {
		case field == "" || d.field == field:
			o = w.expr(d.expr)
		case d.field == "":
			o = w.fieldOf(d.expr, field)
		}
		if o != nil {
			return o
		}
	}
	return nil
}

// fieldOf follows field of the value e: the field's element when e is a
// composite literal, else the whole value.
func (w *walker) fieldOf(e ast.Expr, field string) *origin {
	x := ast.Unparen(e)
	if u, ok := x.(*ast.UnaryExpr); ok && u.Op == token.AND {
		x = ast.Unparen(u.X)
	}
	if cl, ok := x.(*ast.CompositeLit); ok {
		if _, isStruct := typeOf(w.fl.info, cl).Underlying().(*types.Struct); isStruct {
			for _, el := range cl.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
						return w.expr(kv.Value)
					}
				}
			}
			return nil
		}
	}
	return w.expr(e)
}

func typeOf(info *types.Info, e ast.Expr) types.Type {
	if t := info.TypeOf(e); t != nil {
		return t
	}
	return types.Typ[types.Invalid]
}

func (w *walker) selector(e *ast.SelectorExpr) *origin {
	sel := w.fl.info.Selections[e]
	switch sel.Kind() {
	case types.FieldVal:
		owner := fieldOwner(sel)
		name := owner + "." + e.Sel.Name
		switch w.mode {
		case modeDelivery:
			if deliveryFields[name] {
				return &origin{what: shortName(name), pos: e.Pos()}
			}
		case modeBody:
			if bodyFields[name] {
				return &origin{what: shortName(name), pos: e.Pos()}
			}
		}
		if id, ok := ast.Unparen(e.X).(*ast.Ident); ok {
			return w.ident(id, e.Sel.Name)
		}
		return w.expr(e.X)
	case types.MethodVal:
		return w.expr(e.X)
	}
	return nil
}

// fieldOwner returns "pkgpath.Type" of the struct that declares the
// selected field, following embedded fields.
func fieldOwner(sel *types.Selection) string {
	t := sel.Recv()
	idx := sel.Index()
	for _, i := range idx[:len(idx)-1] {
		st, ok := deref(t).Underlying().(*types.Struct)
		if !ok {
			return ""
		}
		t = st.Field(i).Type()
	}
	return typeName(deref(t))
}

func deref(t types.Type) types.Type {
	if p, ok := types.Unalias(t).(*types.Pointer); ok {
		return p.Elem()
	}
	return t
}

// typeName returns "pkgpath.Name" of a named type, else "".
func typeName(t types.Type) string {
	n, ok := types.Unalias(t).(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return ""
	}
	return n.Obj().Pkg().Path() + "." + n.Obj().Name()
}

// funcName returns "pkgpath.Func" or "pkgpath.Type.Method".
func funcName(fn *types.Func) string {
	if fn.Pkg() == nil {
		return fn.Name()
	}
	sig := fn.Type().(*types.Signature)
	if r := sig.Recv(); r != nil {
		return typeName(deref(r.Type())) + "." + fn.Name()
	}
	return fn.Pkg().Path() + "." + fn.Name()
}

// shortName drops the path before the package name:
// "github.com/aws/aws-lambda-go/events.SQSMessage.MessageId" becomes
// "events.SQSMessage.MessageId".
func shortName(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[i+1:]
	}
	return name
}

func (w *walker) call(call *ast.CallExpr) *origin {
	info := w.fl.info
	if tv, ok := info.Types[call.Fun]; ok && tv.IsType() {
		if len(call.Args) == 1 {
			return w.expr(call.Args[0]) // a conversion
		}
		return nil
	}
	if id, ok := ast.Unparen(call.Fun).(*ast.Ident); ok {
		if b, ok := info.Uses[id].(*types.Builtin); ok {
			if b.Name() == "append" || b.Name() == "min" || b.Name() == "max" {
				return w.args(call.Args)
			}
			return nil
		}
	}
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return nil
	}
	name := funcName(fn)
	recv := fn.Type().(*types.Signature).Recv()
	switch w.mode {
	case modeNondet:
		if what := nondetSource(fn, name); what != "" {
			return &origin{what: what, pos: call.Pos()}
		}
	case modeDelivery:
		if deliveryFuncs[name] {
			return &origin{what: shortName(name), pos: call.Pos()}
		}
	case modeBody:
		if bodyFuncs[name] {
			return &origin{what: shortName(name) + "()", pos: call.Pos()}
		}
	case modeBodyHash:
		if hashFuncs[name] || (recv != nil && isHashSum(fn)) {
			body := &walker{fl: w.fl, mode: modeBody, seen: map[types.Object]bool{}}
			var o *origin
			if recv != nil {
				if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
					o = body.expr(sel.X)
				}
			} else {
				o = body.args(call.Args)
			}
			if o != nil {
				return &origin{what: "a hash of " + o.what, pos: call.Pos()}
			}
			return nil
		}
	}
	if passThrough(fn, name) {
		if o := w.args(call.Args); o != nil {
			return o
		}
	}
	if recv != nil && receiverPassesThrough(fn, recv) {
		if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
			return w.expr(sel.X)
		}
	}
	return nil
}

func (w *walker) args(args []ast.Expr) *origin {
	for _, a := range args {
		if o := w.expr(a); o != nil {
			return o
		}
	}
	return nil
}
