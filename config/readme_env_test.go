package config

import (
	"bufio"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestReadmeEnvTable holds the README's environment table (Configuration:
// "| env | overrides |") to the variables the gateway reads: every name in
// envOverrides, and every string literal passed to a Getenv, LookupEnv or
// getenv call in the product code (non-test files of the default build,
// outside e2e/, which holds test tools). It fails listing the names the
// table lacks and the ones it lists that nothing reads.
func TestReadmeEnvTable(t *testing.T) {
	documented := readmeEnvTable(t, "../README.md")
	read := map[string]bool{}
	for _, o := range envOverrides {
		read[o.name] = true
	}
	for _, name := range envLiteralsRead(t, "..") {
		read[name] = true
	}
	var missing, stale []string
	for name := range read {
		if !documented[name] {
			missing = append(missing, name)
		}
	}
	for name := range documented {
		if !read[name] {
			stale = append(stale, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(stale)
	if len(missing) > 0 {
		t.Errorf("README.md's environment table lacks %d variables the code reads: %s", len(missing), strings.Join(missing, ", "))
	}
	if len(stale) > 0 {
		t.Errorf("README.md's environment table lists %d variables nothing reads: %s", len(stale), strings.Join(stale, ", "))
	}
}

var envName = regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")

// readmeEnvTable returns the variable names in the first cell of each row
// of file's table headed "| env | overrides |".
func readmeEnvTable(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]bool{}
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !found {
			found = strings.HasPrefix(line, "| env | overrides |")
			continue
		}
		if strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "| ") {
			break
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		for _, m := range envName.FindAllStringSubmatch(first, -1) {
			names[m[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found || len(names) == 0 {
		t.Fatalf("%s has no environment table (| env | overrides |)", file)
	}
	return names
}

// envLiteralsRead returns the string literals passed as the first argument
// to a function or method named Getenv, LookupEnv or getenv in the product
// Go files under root: the non-test files the default build compiles
// (a failpoints-only file is not), outside e2e/.
func envLiteralsRead(t *testing.T, root string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == "e2e" || name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if ok, err := build.Default.MatchFile(filepath.Dir(path), d.Name()); err != nil || !ok {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if name, ok := envCallLiteral(n); ok {
				names = append(names, name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no environment variable read found: the walk is broken")
	}
	return names
}

// envCallLiteral reports the variable name n reads, when n is a call of
// Getenv, LookupEnv or getenv with a string literal first.
func envCallLiteral(n ast.Node) (string, bool) {
	call, ok := n.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return "", false
	}
	var fn string
	switch f := call.Fun.(type) {
	case *ast.Ident:
		fn = f.Name
	case *ast.SelectorExpr:
		fn = f.Sel.Name
	}
	if fn != "Getenv" && fn != "LookupEnv" && fn != "getenv" {
		return "", false
	}
	lit, ok := call.Args[0].(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}
