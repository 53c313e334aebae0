package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ncclDeps finds the CUDA runtime and NCCL in a pip-installed PyTorch's site-packages/nvidia, in the
// layout of CUDA 12's wheels (a folder per component) and of CUDA 13's (one nvidia/cu13 for the toolkit).
func TestNCCLDepsPipLayouts(t *testing.T) {
	t.Setenv("CUDA_HOME", "")
	t.Setenv("NCCL_INCLUDE_DIR", "")
	for _, c := range []struct {
		name                  string
		files                 []string
		cudaInc, ncclInc, lib string
	}{
		{"cu13", []string{"nvidia/cu13/include/cuda_runtime_api.h", "nvidia/cu13/include/cublas_v2.h",
			"nvidia/nccl/include/nccl.h", "nvidia/cu13/lib/libcudart.so.13"},
			"nvidia/cu13/include", "nvidia/nccl/include", "nvidia/cu13/lib"},
		{"cu12", []string{"nvidia/cuda_runtime/include/cuda_runtime_api.h", "nvidia/cublas/include/cublas_v2.h",
			"nvidia/nccl/include/nccl.h", "nvidia/cuda_runtime/lib/libcudart.so.12"},
			"nvidia/cuda_runtime/include", "nvidia/nccl/include", "nvidia/cuda_runtime/lib"},
	} {
		t.Run(c.name, func(t *testing.T) {
			site := t.TempDir()
			for _, f := range append(c.files, "torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp", "torch/lib/libc10.so") {
				p := filepath.Join(site, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			root := filepath.Join(site, "torch")
			info := torchInfo{Root: root, Includes: []string{filepath.Join(root, "include"), filepath.Join(root, "include/torch/csrc/api/include")},
				LibDir: filepath.Join(root, "lib"), CUDA: true}
			incs, libs, why := ncclDeps(info)
			if why != "" {
				t.Fatal(why)
			}
			at := func(rel string) string { return filepath.Join(site, rel) }
			if len(incs) < 2 || incs[0] != at(c.cudaInc) || incs[1] != at(c.ncclInc) {
				t.Errorf("includes %v: want %s then %s first", incs, c.cudaInc, c.ncclInc)
			}
			for _, f := range c.files {
				if dir := filepath.Dir(f); filepath.Base(dir) == "include" && !slices.Contains(incs, at(dir)) {
					t.Errorf("includes %v lack %s (libtorch's CUDA headers include every component's)", incs, dir)
				}
			}
			if !slices.Contains(libs, "-L"+at(c.lib)) {
				t.Errorf("link flags %v: want the CUDA runtime from %s", libs, c.lib)
			}
		})
	}
	// Without NCCL's header the reason names what to set.
	site := t.TempDir()
	root := filepath.Join(site, "torch")
	hdr := filepath.Join(root, "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
	_ = os.MkdirAll(filepath.Dir(hdr), 0o755)
	_ = os.WriteFile(hdr, nil, 0o644)
	_ = os.MkdirAll(filepath.Join(site, "nvidia/cu13/include"), 0o755)
	_ = os.WriteFile(filepath.Join(site, "nvidia/cu13/include/cuda_runtime_api.h"), nil, 0o644)
	if fileExists("/usr/include/nccl.h") || fileExists("/usr/local/cuda/include/nccl.h") {
		return // NCCL installed system-wide is found there
	}
	if _, _, why := ncclDeps(torchInfo{Root: root, Includes: []string{filepath.Join(root, "include")}, LibDir: filepath.Join(root, "lib")}); why != "nccl.h not found (set NCCL_INCLUDE_DIR)" {
		t.Errorf("no nccl.h: %q", why)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
