package logevent_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxMessage is the longest log message: details go in fields, advice in
// the docs.
const maxMessage = 100

// TestLogLines reads every log call in the product's code (cmd/ and
// internal/, tests and internal/testenv aside): its message is a constant
// of at most maxMessage characters, so lines group by message, and every
// Warn and Error carries an event (an Event's Field), so tests, scripts and
// dashboards find it by its event, not its wording.
func TestLogLines(t *testing.T) {
	fset := token.NewFileSet()
	var calls int
	for _, root := range []string{"..", filepath.Join("..", "..", "cmd")} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testenv" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				fn, ok := n.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					return true
				}
				// A call that spreads a field slice built in its
				// function counts the function's event fields.
				funcHasEvent := hasEventField(fn.Body)
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					level, ok := logLevel(call)
					if !ok {
						return true
					}
					calls++
					at := fset.Position(call.Pos())
					msg, ok := call.Args[0].(*ast.BasicLit)
					if !ok || msg.Kind != token.STRING {
						t.Errorf("%s: %s's message is built at run time", at, level)
						return true
					}
					if s, _ := strconv.Unquote(msg.Value); len(s) > maxMessage {
						t.Errorf("%s: %s's message has %d characters, over %d: %q", at, level, len(s), maxMessage, s)
					}
					if level != "Warn" && level != "Error" {
						return true
					}
					event := false
					for _, a := range call.Args[1:] {
						event = event || isEventField(a)
					}
					if !event && !(call.Ellipsis.IsValid() && funcHasEvent) {
						t.Errorf("%s: %s %s carries no event", at, level, msg.Value)
					}
					return true
				})
				return false
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls < 60 {
		t.Fatalf("found %d log calls: the walk missed the tree", calls)
	}
}

// logLevel returns the level of a call on a logger (a receiver named log
// or logger, as the product names its *zap.Logger values).
func logLevel(call *ast.CallExpr) (string, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || len(call.Args) == 0 {
		return "", false
	}
	switch sel.Sel.Name {
	case "Debug", "Info", "Warn", "Error":
	default:
		return "", false
	}
	var name string
	switch x := sel.X.(type) {
	case *ast.Ident:
		name = x.Name
	case *ast.SelectorExpr:
		name = x.Sel.Name
	}
	return sel.Sel.Name, name == "log" || name == "logger"
}

// isEventField reports whether e is an event's field: X.Field().
func isEventField(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Field" && len(call.Args) == 0
}

// hasEventField reports whether body builds an event's field anywhere.
func hasEventField(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if e, ok := n.(ast.Expr); ok && isEventField(e) {
			found = true
		}
		return !found
	})
	return found
}
