package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every overlay file goes into gotch as Go source of the gotch package its folder names, without the
// build line that keeps it out of drmas's build.
func TestOverlayFiles(t *testing.T) {
	var names []string
	err := fs.WalkDir(overlay, "overlay", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, strings.TrimPrefix(p, "overlay/"))
		}
		return err
	})
	if err != nil || len(names) != 3 {
		t.Fatalf("overlay files %v (%v), want drmas_extra.go, drmas_c10d.go and drmas_hook.go", names, err)
	}
	dst := t.TempDir()
	for _, name := range names {
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeOverlay(dst, name, nil); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "go:build") {
			t.Errorf("%s: the copy keeps a build line", name)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, b, parser.PackageClauseOnly)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := filepath.Base(filepath.Dir(name)); f.Name.Name != want {
			t.Errorf("%s: package %s, want %s", name, f.Name.Name, want)
		}
	}
}
