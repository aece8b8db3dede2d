package idemvet

import (
	"go/ast"
	"go/token"
	"reflect"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// allowPrefix starts a comment that silences a finding.
const allowPrefix = "//idem:allow"

// allowComment is one //idem:allow comment.
type allowComment struct {
	pos    token.Pos // the comment's start
	end    token.Pos
	file   string
	line   int    // the comment's line; it covers this line and the next
	check  string // "" when the comment names none
	reason string
}

// allows is the allowsAnalyzer's result: the package's //idem:allow
// comments.
type allows struct {
	list []*allowComment
}

// covers returns the comment that silences check at pos, or nil.
func (a *allows) covers(fset *token.FileSet, check string, pos token.Pos) *allowComment {
	p := fset.Position(pos)
	for _, c := range a.list {
		if c.check == check && c.file == p.Filename && (c.line == p.Line || c.line+1 == p.Line) {
			return c
		}
	}
	return nil
}

var allowsAnalyzer = &analysis.Analyzer{
	Name:       "idemallows",
	Doc:        "collects the //idem:allow comments of a package (used by the idemvet checks)",
	Run:        runAllows,
	ResultType: reflect.TypeFor[*allows](),
}

func runAllows(pass *analysis.Pass) (any, error) {
	res := &allows{}
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if !strings.HasPrefix(c.Text, allowPrefix) {
					continue
				}
				rest := c.Text[len(allowPrefix):]
				if i := strings.Index(rest, " //"); i >= 0 {
					rest = rest[:i] // a trailing comment is not the reason
				}
				if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
					continue // //idem:allowance is some other comment
				}
				fields := strings.Fields(rest)
				p := pass.Fset.Position(c.Pos())
				ac := &allowComment{pos: c.Pos(), end: c.End(), file: p.Filename, line: p.Line}
				if len(fields) > 0 {
					ac.check = fields[0]
					ac.reason = strings.Join(fields[1:], " ")
				}
				res.list = append(res.list, ac)
			}
		}
	}
	return res, nil
}

// finding is one problem a check found, before //idem:allow comments are
// applied.
type finding struct {
	pos, end token.Pos
	message  string
	fixes    []analysis.SuggestedFix
}

// findings is a check's result: everything it found, silenced or not, so
// that unusedallow can tell which comments silenced something.
type findings struct {
	check string
	list  []finding
}

// report reports each finding that no //idem:allow comment silences and
// returns them all as the check's result.
func report(pass *analysis.Pass, check string, list []finding) *findings {
	al := pass.ResultOf[allowsAnalyzer].(*allows)
	for _, f := range list {
		if al.covers(pass.Fset, check, f.pos) != nil {
			continue
		}
		pass.Report(analysis.Diagnostic{Pos: f.pos, End: f.end, Category: check, Message: f.message, SuggestedFixes: f.fixes})
	}
	return &findings{check: check, list: list}
}

// UnusedAllow reports //idem:allow comments that silence nothing: the
// check they name found nothing on their line or the next, the check does
// not exist, or the comment gives no reason. Its suggested fix deletes
// the comment.
var UnusedAllow = &analysis.Analyzer{
	Name: "unusedallow",
	Doc: `report //idem:allow comments that silence nothing

An //idem:allow CHECK reason comment silences CHECK's finding on its own
line or the next. A comment that silences nothing hides nothing today and
would hide a real problem written there tomorrow; one without a reason
does not say why the code is safe.`,
	Requires:   []*analysis.Analyzer{allowsAnalyzer, NondetKey, DeliveryID, BodyHash, Swallowed, PartialBatch},
	Run:        runUnusedAllow,
	ResultType: reflect.TypeFor[*findings](),
}

func runUnusedAllow(pass *analysis.Pass) (any, error) {
	al := pass.ResultOf[allowsAnalyzer].(*allows)
	used := map[*allowComment]bool{}
	known := map[string]bool{}
	for _, a := range pass.Analyzer.Requires {
		fs, ok := pass.ResultOf[a].(*findings)
		if !ok {
			continue
		}
		known[fs.check] = true
		for _, f := range fs.list {
			if c := al.covers(pass.Fset, fs.check, f.pos); c != nil {
				used[c] = true
			}
		}
	}
	var list []finding
	for _, c := range al.list {
		del := []analysis.SuggestedFix{{Message: "delete the comment", TextEdits: []analysis.TextEdit{{Pos: c.pos, End: c.end}}}}
		var msg string
		switch {
		case c.check == "":
			msg = "//idem:allow names no check: write //idem:allow CHECK reason"
		case !known[c.check]:
			msg = "//idem:allow names unknown check " + quote(c.check) + " (checks: nondetkey, deliveryid, bodyhash, swallowed, partialbatch)"
		case !used[c]:
			msg = "//idem:allow " + c.check + " silences nothing on this line or the next: delete it"
		case c.reason == "":
			msg = "//idem:allow " + c.check + " gives no reason: say why the code is safe"
			del = nil
		default:
			continue
		}
		list = append(list, finding{pos: c.pos, end: c.end, message: msg, fixes: del})
	}
	// An unusedallow finding cannot be silenced by another comment.
	for _, f := range list {
		pass.Report(analysis.Diagnostic{Pos: f.pos, End: f.end, Category: "unusedallow", Message: f.message, SuggestedFixes: f.fixes})
	}
	return &findings{check: "unusedallow", list: list}, nil
}

func quote(s string) string { return `"` + s + `"` }

// Analyzers returns every check, in the order of the package doc.
func Analyzers() []*analysis.Analyzer {
	return []*analysis.Analyzer{NondetKey, DeliveryID, BodyHash, Swallowed, PartialBatch, UnusedAllow}
}

// funcBodies calls fn for each function body in the package's files:
// declarations and literals, outermost first.
func funcBodies(files []*ast.File, fn func(ftype *ast.FuncType, body *ast.BlockStmt, decl *ast.FuncDecl)) {
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Body != nil {
					fn(n.Type, n.Body, n)
				}
			case *ast.FuncLit:
				fn(n.Type, n.Body, nil)
			}
			return true
		})
	}
}
