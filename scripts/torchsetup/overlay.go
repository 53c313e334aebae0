package main

import (
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The Go files set-up adds to gotch live in overlay/, laid out as in gotch (overlay/libtch/… goes to
// gotch's libtch, overlay/ts/… to its ts), as real Go files that editors and go vet can read. Each
// starts with overlayBuildLine, which keeps it out of drmas's own build (its package is gotch's, and
// its cgo needs gotch's headers); the copy written into gotch drops that line. The API they add is
// listed in docs/gotch.md.
//
//go:embed overlay
var overlay embed.FS

const overlayBuildLine = "//go:build drmas_overlay\n\n"

// overlaySource returns overlay file name ("ts/drmas_hook.go") as it goes into gotch.
func overlaySource(name string) (string, error) {
	b, err := overlay.ReadFile("overlay/" + name)
	if err != nil {
		return "", err
	}
	s, ok := strings.CutPrefix(string(b), overlayBuildLine)
	if !ok {
		return "", fmt.Errorf("overlay/%s: does not start with %q", name, overlayBuildLine)
	}
	return s, nil
}

// writeOverlay writes overlay file name into the gotch copy dst at the same path, after edit (nil: as it is).
func writeOverlay(dst, name string, edit func(string) string) error {
	src, err := overlaySource(name)
	if err != nil {
		return err
	}
	if edit != nil {
		src = edit(src)
	}
	return os.WriteFile(filepath.Join(dst, filepath.FromSlash(name)), []byte(src), 0o644)
}
