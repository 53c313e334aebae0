package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// addThreadAndSeedWrappers adds Go wrappers for the libtorch functions that gotch declares in C
// (torch_api.h) but does not expose: seeding and the intra-/inter-op thread counts
// (overlay/libtch/drmas_extra.go).
func addThreadAndSeedWrappers(dst string) error {
	return writeOverlay(dst, "libtch/drmas_extra.go", nil)
}

var mallocSlot = regexp.MustCompile(`(?m)^(\s*)(\w+) := \(\*lib\.Ctensor\)\(unsafe\.Pointer\(C\.malloc\(0\)\)\)\n`)

// fixLeakedOutputSlots fixes gotch's output slots: every generated op allocates C.malloc(0) for its
// output pointers, never frees it, and writes up to several pointers into it (a leak per op, and a
// write past the allocation). Patched, every op gets a slot of 16 pointers (enough for every
// fixed-output op) that is freed on return.
func fixLeakedOutputSlots(dst string) (int, error) {
	total := 0
	files, _ := filepath.Glob(filepath.Join(dst, "ts", "*.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		n := len(mallocSlot.FindAllIndex(b, -1))
		if n == 0 {
			continue
		}
		b = mallocSlot.ReplaceAll(b, []byte("${1}${2} := (*lib.Ctensor)(C.malloc(16 * 8))\n${1}defer C.free(unsafe.Pointer(${2}))\n"))
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return 0, err
		}
		total += n
	}
	if total == 0 {
		return 0, fmt.Errorf("patch: no C.malloc(0) output slots found in gotch/ts: unexpected gotch source")
	}
	return total, nil
}

// fixInPlaceHandleLeak stops every in-place op (Add_, MulScalar_, Zero_ … : 260 in gotch v0.9.1) from
// leaking a tensor handle. Their C wrappers return a new torch::Tensor handle to the same tensor,
// and the Go side overwrites ts.ctensor with it without freeing the old one: 32 bytes of C heap per
// in-place op, and a reference that keeps the tensor's storage alive for good (measured: an AdamW
// step over 30 parameters leaked 6 KB; toy-math's C heap grew ~24 KB per iteration). The patched
// wrappers free the handle they replace.
func fixInPlaceHandleLeak(dst string) (int, error) {
	f := filepath.Join(dst, "ts", "tensor-generated.go")
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, err
	}
	old := []byte("  ts.ctensor = *ptr\n")
	n := bytes.Count(b, old)
	if n == 0 {
		return 0, fmt.Errorf("patch: no in-place ops (ts.ctensor = *ptr) in %s: unexpected gotch source", f)
	}
	b = bytes.ReplaceAll(b, old, []byte("  if prev := ts.ctensor; prev != *ptr { lib.AtFree(prev) }\n  ts.ctensor = *ptr\n"))
	return n, os.WriteFile(f, b, 0o644)
}

// fixTensorBallast removes the 100 KB Go array that gotch attaches to every tensor wrapper (it makes the Go
// GC run constantly) and the per-tensor name formatting and global map bookkeeping. Tensors are freed
// explicitly (pkg/torch scopes) or by their finalizer.
func fixTensorBallast(dst string) error {
	return replaceOnce(filepath.Join(dst, "ts", "tensor.go"), "tensor ballast", []replacement{
		{"\tx.d = new(bigStruct)\n", ""},
		// newTensor: no name formatting or global map per tensor.
		{`	lock.Lock()
	atomic.AddInt64(&TensorCount, 1)
	if gotch.Debug {
		nbytes := x.nbytes()
		atomic.AddInt64(&AllocatedMem, nbytes)

		log.Printf("INFO: Added tensor %q - Allocated memory: %d bytes.\n", x.name, nbytes)
	}
	name := newName(nameOpt...)
	if _, ok := ExistingTensors[name]; ok {
		name = fmt.Sprintf("%s_%09d", name, TensorCount)
	}
	ExistingTensors[name] = struct{}{}
	lock.Unlock()

	x.name = name

	x.calledFrom = "newTensor()"
`, `	atomic.AddInt64(&TensorCount, 1)
	if len(nameOpt) > 0 {
		x.name = nameOpt[0]
	}
`},
		// freeCTensor: a nil ctensor marks a freed tensor; no map lookup.
		{`	lock.Lock()
	defer lock.Unlock()

	if _, ok := ExistingTensors[ts.name]; !ok {
		log.Printf("WARNING: Probably double free tensor %q. Called from %q. Just skipping...\n", ts.name, ts.calledFrom)

		return nil
	}

	if gotch.Debug {`, `	if gotch.Debug {`},
		{"\tdelete(ExistingTensors, ts.name)\n", ""},
	})
}

// replacement is one edit of a gotch source file: old, which must be there, becomes new.
type replacement struct{ old, new string }

// replaceOnce applies each replacement to the first occurrence of its old text in file f, and fails
// (naming the patch) when one is not found: gotch changed and the patch must be looked at again.
func replaceOnce(f, patch string, reps []replacement) error {
	b, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	s := string(b)
	for _, r := range reps {
		if !strings.Contains(s, r.old) {
			return fmt.Errorf("%s: pattern not found in %s: %.60q", patch, filepath.Base(f), r.old)
		}
		s = strings.Replace(s, r.old, r.new, 1)
	}
	return os.WriteFile(f, []byte(s), 0o644)
}

// addScopeHooks lets pkg/torch see every tensor wrapper and scalar gotch creates, so a scope can
// free all the intermediates of a step deterministically instead of waiting for the Go GC: newTensor
// and newScalar call NewTensorHook and NewScalarHook, declared with Scalar.Free in
// overlay/ts/drmas_hook.go.
func addScopeHooks(dst string) error {
	err := replaceOnce(filepath.Join(dst, "ts", "tensor.go"), "scope hooks (newTensor's end)", []replacement{{
		"\truntime.SetFinalizer(x, freeCTensor)\n\n\treturn x\n",
		"\truntime.SetFinalizer(x, freeCTensor)\n\tif NewTensorHook != nil {\n\t\tNewTensorHook(x)\n\t}\n\n\treturn x\n"}})
	if err != nil {
		return err
	}
	if err := fixScalarBookkeeping(dst); err != nil {
		return err
	}
	return writeOverlay(dst, "ts/drmas_hook.go", nil)
}

// fixScalarBookkeeping makes scalars cheap and freeable on time. gotch gives every Scalar (FloatScalar(x),
// one per op that takes a number) a formatted name and an entry in a global map under a lock, and
// frees its C memory only in a finalizer, at some later garbage collection: the small C blocks then
// outlive the step that made them, land in the holes that freed tensors leave in glibc's heap and
// split them, and the heap grows (measured: an AdamW step over a 0.6B model left 5.1 GB free and
// unusable). Patched, newScalar only sets the finalizer and calls NewScalarHook, through which
// pkg/torch's scopes free the scalars made inside them when they close.
func fixScalarBookkeeping(dst string) error {
	return replaceOnce(filepath.Join(dst, "ts", "scalar.go"), "scalar bookkeeping", []replacement{
		// newScalar: no name or global map entry; the hook instead.
		{"\tlock.Lock()\n\tx.name = newName(nameOpt...)\n\tExistingScalars[x.name] = struct{}{}\n\tlock.Unlock()\n\n\truntime.SetFinalizer(x, freeCScalar)\n\n\treturn x\n",
			"\truntime.SetFinalizer(x, freeCScalar)\n\tif NewScalarHook != nil {\n\t\tNewScalarHook(x)\n\t}\n\n\treturn x\n"},
		// freeCScalar: no map bookkeeping; a scalar freed by Free is skipped.
		{"\tlock.Lock()\n\tdelete(ExistingScalars, x.name)\n\tlock.Unlock()\n\n\tlib.AtsFree(x.cscalar)",
			"\tif x.cscalar == nil {\n\t\treturn nil\n\t}\n\tlib.AtsFree(x.cscalar)"},
	})
}

var intRead = regexp.MustCompile(`return \*\(\*int\)\(unsafe\.Pointer\(&(\w+)\)\)`)

// fixIntReadAsInt64 fixes libtch wrappers that read a 4-byte C int as an 8-byte Go int (garbage in the upper
// half): at_grad_set_enabled's previous state (so every no-grad guard restored the wrong mode) and
// at_device.
func fixIntReadAsInt64(dst string) error {
	files, _ := filepath.Glob(filepath.Join(dst, "libtch", "*.go"))
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		m := intRead.FindAllIndex(b, -1)
		if len(m) == 0 {
			continue
		}
		n += len(m)
		b = intRead.ReplaceAll(b, []byte("return int($1)"))
		if !bytes.Contains(b, []byte("unsafe.")) {
			b = bytes.Replace(b, []byte("\t\"unsafe\"\n"), nil, 1)
		}
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return err
		}
	}
	if n == 0 {
		return fmt.Errorf("patch: no C int reads found in gotch/libtch: unexpected gotch source")
	}
	return nil
}
