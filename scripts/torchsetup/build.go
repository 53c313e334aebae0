package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// archiveName is the static library of gotch's C++ wrappers that set-up compiles and libtch links.
const archiveName = "libtch_wrappers.a"

// buildWrappers compiles gotch's C++ wrappers once, at set-up, into libtch/build/libtch_wrappers.a,
// and takes the C++ sources out of the libtch package, so that `go build` only links the archive
// (cgo would otherwise compile them again, silently, for minutes). The generated wrappers are split
// into one file per CPU core and compiled in parallel. A function this libtorch cannot compile
// becomes a stub that raises "op X is not available in libtorch V"; the files that failed are
// compiled again after stubbing. It returns the stubbed functions and the archive's SHA-256.
func buildWrappers(dst string, info torchInfo) ([]string, string, error) {
	libtch := filepath.Join(dst, "libtch")
	build := filepath.Join(libtch, "build")
	if err := os.RemoveAll(build); err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(build, 0o755); err != nil {
		return nil, "", err
	}
	srcs, err := splitSources(libtch, build, max(2, runtime.NumCPU()))
	if err != nil {
		return nil, "", err
	}
	abi := "0"
	if info.CXX11ABI {
		abi = "1"
	}
	flags := []string{"-std=c++17", "-O2", "-fPIC", "-w", "-D_GLIBCXX_USE_CXX11_ABI=" + abi, "-I" + libtch}
	for _, inc := range info.Includes {
		flags = append(flags, "-I"+inc)
	}
	cache := newObjectCache(filepath.Join(filepath.Dir(dst), "wrapper-cache"), info, flags, libtch)
	var stubbed []string
	var todo []string
	keys := map[string]string{}      // source → cache key of its content before stubbing
	stubsOf := map[string][]string{} // source → the functions stubbed in it
	for _, src := range srcs {
		key, names, hit := cache.lookup(src)
		keys[src] = key
		if hit {
			stubbed = append(stubbed, names...)
			continue
		}
		todo = append(todo, src)
	}
	if n := len(srcs) - len(todo); n > 0 {
		fmt.Fprintf(os.Stderr, "torchsetup: %d of %d wrapper files unchanged since an earlier set-up: reusing their objects\n", n, len(srcs))
	}
	compiled := append([]string{}, todo...)
	for round := 1; round <= 6 && len(todo) > 0; round++ {
		fmt.Fprintf(os.Stderr, "torchsetup: compiling gotch's C++ wrappers against libtorch %s: %d files on %d cores (round %d; a few minutes on 2 cores)...\n",
			info.Version, len(todo), runtime.NumCPU(), round)
		failed := map[string]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, runtime.NumCPU())
		for _, src := range todo {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				start := time.Now()
				out, err := exec.Command("g++", append(flags, "-c", src, "-o", strings.TrimSuffix(src, ".cpp")+".o")...).CombinedOutput()
				mu.Lock()
				defer mu.Unlock()
				status := "compiled"
				if err != nil {
					failed[src] = string(out)
					status = "needs stubs"
				}
				fmt.Fprintf(os.Stderr, "torchsetup:   %s: %s in %.0f s\n", filepath.Base(src), status, time.Since(start).Seconds())
			}()
		}
		wg.Wait()
		todo = nil
		for src, out := range failed {
			lines := map[int]bool{}
			for _, m := range errLine.FindAllStringSubmatch(out, -1) {
				if filepath.Base(m[1]) != filepath.Base(src) {
					continue
				}
				var line int
				fmt.Sscan(m[2], &line)
				lines[line] = true
			}
			if len(lines) == 0 {
				return nil, "", fmt.Errorf("compiling %s failed for a reason other than missing ops:\n%s", src, tail(out, 4000))
			}
			names, err := stubFunctions(src, lines, info.Version)
			if err != nil {
				return nil, "", err
			}
			stubbed = append(stubbed, names...)
			stubsOf[src] = append(stubsOf[src], names...)
			todo = append(todo, src)
		}
		sort.Strings(todo)
	}
	if len(todo) > 0 {
		return nil, "", fmt.Errorf("gotch wrappers still fail to compile after 6 rounds of stubbing")
	}
	for _, src := range compiled {
		cache.store(keys[src], src, stubsOf[src])
	}
	archive := filepath.Join(build, archiveName)
	args := []string{"rcs", archive}
	for _, src := range srcs {
		args = append(args, strings.TrimSuffix(src, ".cpp")+".o")
	}
	if out, err := exec.Command("ar", args...).CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("ar: %v: %s", err, out)
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(data)
	sort.Strings(stubbed)
	return stubbed, hex.EncodeToString(sum[:]), nil
}

// helperDecls declares torch_api.cpp's C++ helpers for the files that hold the generated wrappers.
const helperDecls = `#include "torch_api.h"
using namespace std;
vector<torch::Tensor> of_carray_tensor(torch::Tensor **vs, int len);
c10::List<c10::optional<torch::Tensor>> of_carray_tensor_opt(torch::Tensor **vs, int len);
at::Device device_of_int(int d);
`

// splitSources moves libtch's C++ sources into build: torch_api.cpp without the generated wrappers,
// and the generated wrappers cut at function boundaries into n files. torch_api.h's thread-local
// error slot becomes a declaration (defined once, in torch_api.cpp) so several files can include it.
func splitSources(libtch, build string, n int) ([]string, error) {
	hdrPath := filepath.Join(libtch, "torch_api.h")
	hdr, err := os.ReadFile(hdrPath)
	if err != nil {
		return nil, err
	}
	const slot = "thread_local char *torch_last_err = nullptr;"
	if !bytes.Contains(hdr, []byte(slot)) {
		return nil, fmt.Errorf("split: %q not found in gotch's torch_api.h: unexpected gotch source", slot)
	}
	hdr = bytes.Replace(hdr, []byte(slot), []byte("extern thread_local char *torch_last_err;"), 1)
	if err := os.WriteFile(hdrPath, hdr, 0o644); err != nil {
		return nil, err
	}
	apiPath := filepath.Join(libtch, "torch_api.cpp")
	api, err := os.ReadFile(apiPath)
	if err != nil {
		return nil, err
	}
	const inc = "#include \"torch_api_generated.cpp.h\""
	if !bytes.Contains(api, []byte(inc)) {
		return nil, fmt.Errorf("split: %s not found in gotch's torch_api.cpp: unexpected gotch source", inc)
	}
	api = bytes.Replace(api, []byte(inc), nil, 1)
	api = bytes.Replace(api, []byte("using namespace std;\n"), []byte("using namespace std;\n\n"+slot+"\n"), 1)
	genPath := filepath.Join(libtch, "torch_api_generated.cpp.h")
	gen, err := os.ReadFile(genPath)
	if err != nil {
		return nil, err
	}
	// Top-level functions end with a "}" line followed by a blank line.
	funcs := strings.SplitAfter(string(gen), "\n}\n")
	per := (len(funcs) + n - 1) / n
	srcs := []string{filepath.Join(build, "torch_api.cpp")}
	if err := os.WriteFile(srcs[0], api, 0o644); err != nil {
		return nil, err
	}
	for i := 0; i*per < len(funcs); i++ {
		part := strings.Join(funcs[i*per:min((i+1)*per, len(funcs))], "")
		path := filepath.Join(build, fmt.Sprintf("torch_api_generated_%d.cpp", i))
		if err := os.WriteFile(path, []byte(helperDecls+part), 0o644); err != nil {
			return nil, err
		}
		srcs = append(srcs, path)
	}
	for _, p := range []string{apiPath, genPath} {
		if err := os.Remove(p); err != nil {
			return nil, err
		}
	}
	return srcs, nil
}

// objectCache keeps compiled wrapper objects by the content they were compiled from (the source
// before stubbing, the headers, the flags and the libtorch), so that a set-up redone for another
// reason (a change to this program, a new gotch patch elsewhere) does not compile them again.
type objectCache struct {
	dir  string
	salt string
}

func newObjectCache(dir string, info torchInfo, flags []string, libtch string) *objectCache {
	var hdrs []string
	for _, h := range []string{"torch_api.h", "torch_api_generated.h"} {
		b, _ := os.ReadFile(filepath.Join(libtch, h))
		hdrs = append(hdrs, string(b))
	}
	return &objectCache{dir: dir, salt: hashOf(append(append([]string{mustJSON(info)}, flags...), hdrs...)...)}
}

// lookup copies the object of src's content into place (beside src) when the cache has it, and
// returns the key and the functions that were stubbed in it.
func (c *objectCache) lookup(src string) (key string, stubs []string, ok bool) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", nil, false
	}
	key = hashOf(c.salt, string(b))
	obj, err := os.ReadFile(filepath.Join(c.dir, key+".o"))
	if err != nil {
		return key, nil, false
	}
	list, err := os.ReadFile(filepath.Join(c.dir, key+".stubs"))
	if err != nil || os.WriteFile(strings.TrimSuffix(src, ".cpp")+".o", obj, 0o644) != nil {
		return key, nil, false
	}
	return key, strings.Fields(string(list)), true
}

// store saves src's object under key (best effort: a failure only costs a compile next time).
func (c *objectCache) store(key, src string, stubs []string) {
	obj, err := os.ReadFile(strings.TrimSuffix(src, ".cpp") + ".o")
	if err != nil || os.MkdirAll(c.dir, 0o755) != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(c.dir, key+".stubs"), []byte(strings.Join(stubs, "\n")+"\n"), 0o644)
	_ = os.WriteFile(filepath.Join(c.dir, key+".o"), obj, 0o644)
}
