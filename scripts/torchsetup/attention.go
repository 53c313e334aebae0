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
//go:embed attention/drmas_attention.h attention/drmas_attention.cpp
var attentionFiles embed.FS

// writeAttention writes the shim (attention/) and its Go side (overlay/libtch/drmas_attention.go)
// into libtch.
func writeAttention(dst string, info torchInfo) error {
	for _, name := range []string{"drmas_attention.h", "drmas_attention.cpp"} {
		b, err := attentionFiles.ReadFile("attention/" + name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, "libtch", name), b, 0o644); err != nil {
			return err
		}
	}
	return writeOverlay(dst, "libtch/drmas_attention.go", func(src string) string {
		return strings.Replace(src, "@VERSION@", info.Version, 1)
	})
}
