// Command torchsetup makes github.com/sugarme/gotch v0.9.1 build against the libtorch found on this
// machine: it copies the module into an ignored folder (.torch/gotch), patches and compiles it for
// that libtorch, and writes go.work so that the module's builds use the patched copy.
//
// In order, it:
//
//   - writes libtch/lib.go for that libtorch (include and lib paths, CPU or CUDA libraries, C++ ABI);
//   - compiles gotch's C++ wrappers once, in parallel, into a static library that libtch links (so
//     `go build` does not compile them again), turning every function this libtorch cannot compile
//     into a stub that raises "op X is not available in libtorch V" (found by compiling, not by a list);
//   - fixes two gotch defects that make long runs impossible: the C.malloc(0) output slot that every
//     generated op leaks (and overruns for multi-output ops), and the 100 KB Go ballast per tensor;
//   - adds Go wrappers for libtorch's manual seed and thread-count functions;
//   - writes the c10d shim (data-parallel training: TCPStore, Gloo, NCCL when built) and its Go
//     functions into libtch (c10d.go);
//   - writes the attention shim (libtorch's fused scaled_dot_product_attention, 2.1 and later) and
//     its Go function into libtch (attention.go);
//   - writes go.work so that the module's builds use the patched copy.
//
// It is idempotent: a stamp records the inputs, and a second run with the same inputs does nothing.
//
//	go run ./scripts/torchsetup [-libtorch DIR] [-out .torch]
package main
