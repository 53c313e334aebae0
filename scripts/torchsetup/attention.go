package main

import (
	"embed"
	"os"
	"path/filepath"
	"strings"
)

// The attention shim: libtorch's fused scaled_dot_product_attention, for libtorch 2.1 and later
// (pkg/policy/attention.go takes it where it applies and its own tiles elsewhere). Written into the
// patched gotch copy's libtch package beside the c10d shim, for the reasons in drmas_attention.h.
//
//go:embed attention/drmas_attention.h attention/drmas_attention.cpp attention/drmas_attention.go.txt
var attentionFiles embed.FS

// writeAttention writes the shim and its Go side into libtch.
func writeAttention(dst string, info torchInfo) error {
	dir := filepath.Join(dst, "libtch")
	for _, f := range []struct{ from, to string }{
		{"drmas_attention.h", "drmas_attention.h"},
		{"drmas_attention.cpp", "drmas_attention.cpp"},
		{"drmas_attention.go.txt", "drmas_attention.go"},
	} {
		b, err := attentionFiles.ReadFile("attention/" + f.from)
		if err != nil {
			return err
		}
		src := strings.Replace(string(b), "@VERSION@", info.Version, 1)
		if err := os.WriteFile(filepath.Join(dir, f.to), []byte(src), 0o644); err != nil {
			return err
		}
	}
	return nil
}
