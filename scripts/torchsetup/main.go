package main

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
)

// patchVersion changes whenever this program's output would change, so stamps from older runs are redone.
const patchVersion = "14"

const gotchModule = "github.com/sugarme/gotch"
const gotchVersion = "v0.9.1"

func main() {
	libtorch := flag.String("libtorch", os.Getenv("LIBTORCH"), "libtorch folder (official zip or a PyTorch install's torch/); empty = the system's (Debian libtorch-dev)")
	out := flag.String("out", ".torch", "folder (ignored by git) that receives the patched gotch copy")
	force := flag.Bool("force", false, "redo everything even if the stamp matches")
	flag.Parse()
	if err := run(*libtorch, *out, *force); err != nil {
		fmt.Fprintln(os.Stderr, "torchsetup:", err)
		os.Exit(1)
	}
}

// torchInfo describes the libtorch that gotch is built against.
type torchInfo struct {
	Root     string   `json:"root"`
	Includes []string `json:"includes"`
	LibDir   string   `json:"lib_dir"`
	Version  string   `json:"version"`
	CUDA     bool     `json:"cuda"`
	CXX11ABI bool     `json:"cxx11_abi"`
}

func run(libtorch, out string, force bool) error {
	info, err := findTorch(libtorch)
	if err != nil {
		return err
	}
	unlock, err := lockOut(out)
	if err != nil {
		return err
	}
	defer unlock()
	src, err := gotchDir()
	if err != nil {
		return err
	}
	stampKey := hashOf(patchVersion, selfSource(), src, mustJSON(info))
	dst := filepath.Join(out, "gotch")
	stampPath := filepath.Join(out, "stamp")
	if old, err := os.ReadFile(stampPath); err == nil && string(old) == stampKey && !force {
		if _, err := os.Stat(filepath.Join(dst, "libtch", "lib.go")); err == nil {
			if err := writeGoWork(dst); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "torchsetup: up to date (libtorch %s, %s, cuda=%v)\n", info.Version, info.LibDir, info.CUDA)
			return nil
		}
	}
	fmt.Fprintf(os.Stderr, "torchsetup: libtorch %s at %s (cuda=%v, cxx11 abi=%v)\n", info.Version, info.LibDir, info.CUDA, info.CXX11ABI)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if err := copyTree(src, dst); err != nil {
		return fmt.Errorf("copy gotch: %w", err)
	}
	if err := addThreadAndSeedWrappers(dst); err != nil {
		return err
	}
	n, err := fixLeakedOutputSlots(dst)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "torchsetup: fixed the leaked output slot in %d generated ops\n", n)
	inPlace, err := fixInPlaceHandleLeak(dst)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "torchsetup: fixed the leaked tensor handle in %d in-place ops\n", inPlace)
	if err := fixTensorBallast(dst); err != nil {
		return err
	}
	if err := addScopeHooks(dst); err != nil {
		return err
	}
	if err := fixIntReadAsInt64(dst); err != nil {
		return err
	}
	c10d, nccl, err := writeC10d(dst, info)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "torchsetup: c10d shim written (gloo, nccl=%v)\n", nccl)
	if err := writeAttention(dst, info); err != nil {
		return err
	}
	stubs, archiveSum, err := buildWrappers(dst, info)
	if err != nil {
		return err
	}
	if err := writeLibGo(dst, info, archiveSum, c10d); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "torchsetup: %d wrapper functions need ops this libtorch lacks; compiled as stubs\n", len(stubs))
	if len(stubs) > 0 {
		if err := os.WriteFile(filepath.Join(out, "missing-ops.txt"), []byte(strings.Join(stubs, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(out, "libtorch.json"), []byte(mustJSON(info)), 0o644); err != nil {
		return err
	}
	if err := writeGoWork(dst); err != nil {
		return err
	}
	return os.WriteFile(stampPath, []byte(stampKey), 0o644)
}

// lockOut holds an exclusive lock on out for the whole set-up: two set-ups at once (make test and
// make demo started together) would otherwise copy, patch and compile over each other's files.
func lockOut(out string) (func(), error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(out, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		fmt.Fprintf(os.Stderr, "torchsetup: waiting for another set-up of %s to finish...\n", out)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
	}
	return func() { f.Close() }, nil
}

// selfSource is this program's source (every file under scripts/torchsetup: the Go code, the shims
// and the overlay), so that a changed patch redoes the set-up.
func selfSource() string {
	_, f, _, _ := runtime.Caller(0)
	root := filepath.Dir(f)
	var b strings.Builder
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			data, _ := os.ReadFile(path)
			rel, _ := filepath.Rel(root, path)
			b.WriteString(rel)
			b.Write(data)
		}
		return nil
	})
	return b.String()
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func mustJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// findTorch locates libtorch's headers and libraries and reads its version, CUDA support and ABI.
func findTorch(root string) (torchInfo, error) {
	var info torchInfo
	if root == "" {
		// Debian/Ubuntu libtorch-dev.
		lib := "/usr/lib/" + multiarch()
		if _, err := os.Stat("/usr/include/torch/csrc/api/include/torch/torch.h"); err != nil {
			return info, fmt.Errorf("no libtorch found: install Debian's libtorch-dev (make setup does) or set LIBTORCH=/path/to/libtorch")
		}
		info = torchInfo{Root: "/usr", Includes: []string{"/usr/include", "/usr/include/torch/csrc/api/include"}, LibDir: lib}
	} else {
		abs, err := filepath.Abs(root)
		if err != nil {
			return info, err
		}
		info = torchInfo{Root: abs, Includes: []string{filepath.Join(abs, "include"), filepath.Join(abs, "include/torch/csrc/api/include")}, LibDir: filepath.Join(abs, "lib")}
		if _, err := os.Stat(filepath.Join(abs, "include/torch/csrc/api/include/torch/torch.h")); err != nil {
			return info, fmt.Errorf("LIBTORCH=%s: no include/torch/csrc/api/include/torch/torch.h there (want the libtorch zip's folder or a PyTorch install's torch/ folder)", root)
		}
	}
	v, err := readVersion(filepath.Join(info.Includes[1], "torch", "version.h"))
	if err != nil {
		return info, err
	}
	info.Version = v
	c10 := filepath.Join(info.LibDir, "libc10.so")
	if _, err := os.Stat(c10); err != nil {
		return info, fmt.Errorf("libtorch libraries: %s not found", c10)
	}
	_, errCUDA := os.Stat(filepath.Join(info.LibDir, "libtorch_cuda.so"))
	info.CUDA = errCUDA == nil
	info.CXX11ABI, err = usesCXX11ABI(c10)
	if err != nil {
		return info, err
	}
	return info, nil
}

func multiarch() string {
	if out, err := exec.Command("gcc", "-print-multiarch").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		return string(bytes.TrimSpace(out))
	}
	return runtime.GOARCH + "-linux-gnu"
}

func readVersion(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("libtorch version: %w", err)
	}
	get := func(name string) string {
		m := regexp.MustCompile(`#define ` + name + ` (\d+)`).FindSubmatch(b)
		if m == nil {
			return "?"
		}
		return string(m[1])
	}
	if m := regexp.MustCompile(`#define TORCH_VERSION "([^"]+)"`).FindSubmatch(b); m != nil {
		return string(m[1]), nil
	}
	return get("TORCH_VERSION_MAJOR") + "." + get("TORCH_VERSION_MINOR") + "." + get("TORCH_VERSION_PATCH"), nil
}

// usesCXX11ABI reports whether libc10 exports std::__cxx11 symbols (built with _GLIBCXX_USE_CXX11_ABI=1).
func usesCXX11ABI(lib string) (bool, error) {
	f, err := elf.Open(lib)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", lib, err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return false, fmt.Errorf("read symbols of %s: %w", lib, err)
	}
	for _, s := range syms {
		if strings.Contains(s.Name, "St7__cxx11") {
			return true, nil
		}
	}
	return false, nil
}

// gotchDir returns the module cache folder of gotch, downloading it if needed.
func gotchDir() (string, error) {
	// A machine without a module proxy (scripts/device-check.sh on a GPU machine) hands over the
	// vendored copy instead.
	if dir := os.Getenv("DRMAS_GOTCH_SRC"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "libtch")); err != nil {
			return "", fmt.Errorf("DRMAS_GOTCH_SRC=%s: not a gotch source folder: %w", dir, err)
		}
		return filepath.Abs(dir)
	}
	cmd := exec.Command("go", "mod", "download", "-json", gotchModule+"@"+gotchVersion)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", gotchModule, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", err
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", gotchModule, m.Error)
	}
	return m.Dir, nil
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		// Examples, image code and tests are not needed and slow the copy.
		if d.IsDir() && (rel == "example" || rel == "gen" || rel == ".github") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// writeLibGo replaces gotch's libtch/lib.go, which links CUDA unconditionally and assumes the old ABI.
// It links the wrappers' archive that buildWrappers made; the archive's hash is part of the file, so
// Go rebuilds the package whenever the archive changes. The c10d and attention shims
// (drmas_c10d.cpp, drmas_attention.cpp) are the C++ files cgo compiles in the package, with c10d's flags.
func writeLibGo(dst string, info torchInfo, archiveSum string, c10d c10dFlags) error {
	abi := 0
	if info.CXX11ABI {
		abi = 1
	}
	var b strings.Builder
	b.WriteString("// Code generated by drmas scripts/torchsetup for libtorch " + info.Version + "; DO NOT EDIT.\n\npackage libtch\n\n")
	libs := "${SRCDIR}/build/" + archiveName + " -lstdc++ -lm -ltorch -ltorch_cpu -lc10"
	if info.CUDA {
		// --no-as-needed keeps libtorch_cuda linked although no symbol of it is referenced: it
		// registers the CUDA backend when loaded.
		libs = "-Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed " + libs
	}
	fmt.Fprintf(&b, "// #cgo LDFLAGS: -L%s -Wl,-rpath,%s %s\n", info.LibDir, info.LibDir, strings.TrimSpace(libs+" "+strings.Join(c10d.Libs, " ")))
	fmt.Fprintf(&b, "// #cgo CFLAGS: -I${SRCDIR} -O3 -Wall -Wno-unused-variable -Wno-deprecated-declarations -Wno-c++11-narrowing -Wno-sign-compare -Wno-unused-function\n")
	fmt.Fprintf(&b, "// #cgo CFLAGS: -D_GLIBCXX_USE_CXX11_ABI=%d\n", abi)
	fmt.Fprintf(&b, "// #cgo CXXFLAGS: -std=c++17 -I${SRCDIR} -O2 -w -D_GLIBCXX_USE_CXX11_ABI=%d", abi)
	for _, inc := range append(append([]string{}, info.Includes...), c10d.Includes...) {
		fmt.Fprintf(&b, " -I%s", inc)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "// /* The C++ wrappers are compiled by torchsetup into build/%s (sha256 %s). */\nimport \"C\"\n\n", archiveName, archiveSum)
	fmt.Fprintf(&b, "// TorchVersion is the version of the libtorch this package was built against.\nconst TorchVersion = %q\n", info.Version)
	return os.WriteFile(filepath.Join(dst, "libtch", "lib.go"), []byte(b.String()), 0o644)
}

// writeGoWork points this module's builds at the patched gotch copy.
func writeGoWork(dst string) error {
	goVersion := strings.TrimPrefix(runtime.Version(), "go")
	if i := strings.Index(goVersion, " "); i >= 0 {
		goVersion = goVersion[:i]
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		return fmt.Errorf("run torchsetup from the repository root: %w", err)
	}
	if m := regexp.MustCompile(`(?m)^go (\S+)`).FindSubmatch(gomod); m != nil {
		goVersion = string(m[1])
	}
	rel := "./" + filepath.ToSlash(dst)
	content := fmt.Sprintf("// Generated by scripts/torchsetup; DO NOT EDIT. Points gotch at the copy patched for this machine's libtorch.\ngo %s\n\nuse .\n\nreplace %s %s => %s\n", goVersion, gotchModule, gotchVersion, rel)
	if old, err := os.ReadFile("go.work"); err == nil && string(old) == content {
		return nil
	}
	return os.WriteFile("go.work", []byte(content), 0o644)
}
