package main

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The c10d shim (data-parallel training on libtorch's own distributed engine) and the Go package
// that wraps its C interface are written into the patched gotch copy as package
// github.com/sugarme/gotch/drmasc10d, compiled by cgo with this libtorch's flags. pkg/dist is the
// only drmas package that imports it.
//
//go:embed c10d/shim.h c10d/shim.cpp c10d/glue.go.txt
var c10dFiles embed.FS

// c10dPackage is the folder (inside the gotch copy) of the generated package.
const c10dPackage = "drmasc10d"

// writeC10d writes the shim and its cgo package. Gloo is always built; NCCL when this libtorch has
// CUDA, ProcessGroupNCCL's header and the CUDA runtime and NCCL headers it includes are found and
// the shim compiles with them (checked here, so a failure names the missing piece at set-up).
func writeC10d(dst string, info torchInfo) (nccl bool, err error) {
	dir := filepath.Join(dst, c10dPackage)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	for _, name := range []string{"shim.h", "shim.cpp"} {
		b, err := c10dFiles.ReadFile("c10d/" + name)
		if err != nil {
			return false, err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return false, err
		}
	}
	if _, err := os.Stat(filepath.Join(info.Includes[0], "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")); err != nil {
		return false, fmt.Errorf("libtorch %s has no c10d headers (torch/csrc/distributed/c10d/ProcessGroupGloo.hpp under %s)", info.Version, info.Includes[0])
	}
	if _, err := os.Stat("/usr/include/gloo/algorithm.h"); err != nil && info.Root == "/usr" {
		return false, fmt.Errorf("Gloo's headers are missing (/usr/include/gloo): install Debian's libgloo-dev (make setup does)")
	}
	flags := c10dFlags{Includes: info.Includes, Defines: []string{"-DUSE_C10D_GLOO"}}
	if info.CUDA {
		extra, libs, why := ncclDeps(info)
		if why == "" {
			try := flags
			try.Includes = append(append([]string{}, info.Includes...), extra...)
			try.Defines = append(try.Defines, "-DUSE_C10D_NCCL", "-DDRMAS_WITH_NCCL")
			if out, err := syntaxCheck(dir, info, try); err != nil {
				why = "the shim did not compile with ProcessGroupNCCL:\n" + tail(out, 3000)
			} else {
				flags, nccl = try, true
				flags.Libs = libs
			}
		}
		if !nccl {
			fmt.Fprintf(os.Stderr, "torchsetup: WARNING: libtorch has CUDA but the c10d shim is built without NCCL (data-parallel training on GPUs will refuse backend nccl): %s\n", why)
		}
	}
	if !nccl {
		fmt.Fprintf(os.Stderr, "torchsetup: checking the c10d shim (Gloo) against libtorch %s...\n", info.Version)
		if out, err := syntaxCheck(dir, info, flags); err != nil {
			return false, fmt.Errorf("the c10d shim does not compile against libtorch %s:\n%s", info.Version, tail(out, 3000))
		}
	}
	return nccl, writeC10dGlue(dir, info, flags)
}

// c10dFlags are the compiler and linker inputs of the shim.
type c10dFlags struct {
	Includes []string
	Defines  []string
	Libs     []string // extra linker flags (the CUDA runtime for NCCL builds)
}

func abiFlag(info torchInfo) string {
	if info.CXX11ABI {
		return "-D_GLIBCXX_USE_CXX11_ABI=1"
	}
	return "-D_GLIBCXX_USE_CXX11_ABI=0"
}

// syntaxCheck compiles the shim without producing code (a few seconds) and returns the compiler's output.
func syntaxCheck(dir string, info torchInfo, f c10dFlags) (string, error) {
	args := []string{"-std=c++17", "-fsyntax-only", "-w", abiFlag(info)}
	args = append(args, f.Defines...)
	for _, inc := range f.Includes {
		args = append(args, "-I"+inc)
	}
	args = append(args, filepath.Join(dir, "shim.cpp"))
	out, err := exec.Command("g++", args...).CombinedOutput()
	return string(out), err
}

// ncclDeps finds the include folders (CUDA runtime, NCCL) and link flags that ProcessGroupNCCL needs
// beside libtorch's own, or says what is missing. CUDA_HOME, NCCL_INCLUDE_DIR and NCCL_LIB_DIR
// override the search; a pip-installed PyTorch keeps them in site-packages/nvidia/*.
func ncclDeps(info torchInfo) (includes, libs []string, why string) {
	if _, err := os.Stat(filepath.Join(info.Includes[0], "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")); err != nil {
		return nil, nil, "no torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp in libtorch"
	}
	nvidia := filepath.Join(filepath.Dir(info.Root), "nvidia") // pip: site-packages/torch → site-packages/nvidia
	cudaHome := os.Getenv("CUDA_HOME")
	if cudaHome == "" {
		cudaHome = "/usr/local/cuda"
	}
	find := func(header string, dirs ...string) string {
		for _, d := range dirs {
			if d == "" {
				continue
			}
			if _, err := os.Stat(filepath.Join(d, header)); err == nil {
				return d
			}
		}
		return ""
	}
	cudaInc := find("cuda_runtime_api.h", info.Includes[0], filepath.Join(cudaHome, "include"), filepath.Join(nvidia, "cuda_runtime/include"), "/usr/include")
	if cudaInc == "" {
		return nil, nil, "cuda_runtime_api.h not found (set CUDA_HOME)"
	}
	ncclInc := find("nccl.h", os.Getenv("NCCL_INCLUDE_DIR"), info.Includes[0], filepath.Join(cudaHome, "include"), filepath.Join(nvidia, "nccl/include"), "/usr/include")
	if ncclInc == "" {
		return nil, nil, "nccl.h not found (set NCCL_INCLUDE_DIR)"
	}
	includes = []string{cudaInc, ncclInc}
	// Headers the shim includes call into the CUDA runtime; link it where it lives.
	for _, d := range []string{info.LibDir, filepath.Join(cudaHome, "lib64"), filepath.Join(nvidia, "cuda_runtime/lib")} {
		matches, _ := filepath.Glob(filepath.Join(d, "libcudart.so*"))
		if len(matches) > 0 {
			libs = append(libs, "-L"+d, "-Wl,-rpath,"+d, "-l:"+filepath.Base(matches[0]))
			break
		}
	}
	return includes, libs, ""
}

// writeC10dGlue writes the cgo file of the package from its template.
func writeC10dGlue(dir string, info torchInfo, f c10dFlags) error {
	tmpl, err := c10dFiles.ReadFile("c10d/glue.go.txt")
	if err != nil {
		return err
	}
	libs := "-lstdc++ -ltorch -ltorch_cpu -lc10"
	if info.CUDA {
		libs = "-Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed " + libs
	}
	var cgo strings.Builder
	fmt.Fprintf(&cgo, "// #cgo LDFLAGS: -L%s -Wl,-rpath,%s %s %s\n", info.LibDir, info.LibDir, libs, strings.Join(f.Libs, " "))
	fmt.Fprintf(&cgo, "// #cgo CXXFLAGS: -std=c++17 -O2 -w %s %s", abiFlag(info), strings.Join(f.Defines, " "))
	for _, inc := range f.Includes {
		fmt.Fprintf(&cgo, " -I%s", inc)
	}
	cgo.WriteString("\n")
	src := strings.Replace(string(tmpl), "// @CGO@\n", cgo.String(), 1)
	src = strings.Replace(src, "@VERSION@", info.Version, 1)
	return os.WriteFile(filepath.Join(dir, "c10d.go"), []byte(src), 0o644)
}
