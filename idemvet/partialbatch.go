package idemvet

import (
	"go/ast"
	"go/types"
	"reflect"

	"golang.org/x/tools/go/analysis"
)

// PartialBatch reports SQS Lambda handlers that cannot report partial
// batch failures.
var PartialBatch = &analysis.Analyzer{
	Name: "partialbatch",
	Doc: `report events.SQSEvent handlers that return only error

A Lambda SQS handler that returns an error makes the whole batch visible
again: the records that succeeded run again with the one that failed. A
handler that returns events.SQSEventResponse names the failed records in
BatchItemFailures (with ReportBatchItemFailures on the event source
mapping) and only they come back. Handlers that never return a non-nil
error are not reported (they have the swallowed problem instead).`,
	Requires:   []*analysis.Analyzer{allowsAnalyzer},
	ResultType: reflect.TypeFor[*findings](),
	Run:        runPartialBatch,
}

func runPartialBatch(pass *analysis.Pass) (any, error) {
	info := pass.TypesInfo
	var list []finding
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			var at ast.Node
			switch n := n.(type) {
			case *ast.FuncDecl:
				body, at = n.Body, n.Name
			case *ast.FuncLit:
				body, at = n.Body, n.Type
			default:
				return true
			}
			sig := signatureOf(info, n)
			if sig == nil || body == nil || sig.Results().Len() != 1 || !isError(sig.Results().At(0).Type()) {
				return true
			}
			takesEvent := false
			for i := range sig.Params().Len() {
				if typeName(deref(sig.Params().At(i).Type())) == pkgEvents+".SQSEvent" {
					takesEvent = true
				}
			}
			if !takesEvent || !returnsError(info, body) {
				return true
			}
			list = append(list, finding{pos: at.Pos(), end: at.End(),
				message: "this SQS batch handler returns only error: one failed record makes the whole batch come back, and the records that succeeded run again; fix: return (events.SQSEventResponse, error) with the failed records' MessageId in BatchItemFailures, and turn on ReportBatchItemFailures on the event source mapping"})
			return true
		})
	}
	return report(pass, "partialbatch", list), nil
}

// returnsError reports whether body (outside function literals) has a
// return whose error is not the literal nil.
func returnsError(info *types.Info, body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			if len(n.Results) == 1 {
				if id, ok := ast.Unparen(n.Results[0]).(*ast.Ident); ok && info.Uses[id] == types.Universe.Lookup("nil") {
					return true
				}
				found = true
			}
		}
		return !found
	})
	return found
}
