package torch

/*
#include <stdatomic.h>
extern atomic_int drmas_gemm_use_dnnl;
extern atomic_int drmas_gemm_threads;
extern atomic_long drmas_gemm_dnnl_calls;
int drmas_gemm_has_dnnl(void);
static void drmas_gemm_set(int use_dnnl, int threads) {
	atomic_store(&drmas_gemm_use_dnnl, use_dnnl);
	if (threads > 0) atomic_store(&drmas_gemm_threads, threads);
}
static int drmas_gemm_use(void) { return atomic_load(&drmas_gemm_use_dnnl); }
static long drmas_gemm_calls(void) { return atomic_load(&drmas_gemm_dnnl_calls); }
static int drmas_gemm_nthreads(void) { return atomic_load(&drmas_gemm_threads); }
*/
import "C"

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/sugarme/gotch"
	"github.com/sugarme/gotch/ts"
)

// GEMM libraries for libtorch's float32 CPU matrix products (see gemm.c).
const (
	GEMMOneDNN = "onednn" // oneDNN's sgemm, which libtorch links for its own kernels
	GEMMBLAS   = "blas"   // the BLAS libtorch was linked with (OpenBLAS on Debian)
)

// GEMM names the library that runs libtorch's float32 CPU matrix products in this process.
func GEMM() string {
	if C.drmas_gemm_use() == 1 && C.drmas_gemm_has_dnnl() == 1 && reachesUs.Load() >= 0 {
		return GEMMOneDNN
	}
	return GEMMBLAS
}

// reachesUs says whether libtorch's products reach gemm.c's sgemm_: 1 yes, 0 not known yet, −1 no (a
// libtorch whose BLAS is linked in privately, as PyTorch's wheels link MKL, calls its own).
var reachesUs atomic.Int32

// probeGEMM finds out, once, whether libtorch's products reach gemm.c, with one small product.
// Call it on the torch thread.
func probeGEMM() {
	if reachesUs.Load() != 0 || GEMM() != GEMMOneDNN {
		return
	}
	before := gemmProducts()
	_ = NoGrad(func() error {
		a := ts.MustOnes([]int64{64, 64}, gotch.Float, gotch.CPU)
		a.MustMm(a, false).MustDrop()
		a.MustDrop()
		return nil
	})
	if gemmProducts() > before {
		reachesUs.Store(1)
	} else {
		reachesUs.Store(-1)
	}
}

// SetGEMM picks the library for float32 CPU matrix products: "auto" (oneDNN when libtorch has it,
// the default), "onednn" (an error when it is missing) or "blas". The environment variable
// DRMAS_GEMM sets the same choice for a whole process.
func SetGEMM(choice string) error {
	switch choice {
	case "", "auto":
		C.drmas_gemm_set(1, 0)
	case GEMMOneDNN:
		if C.drmas_gemm_has_dnnl() == 0 {
			return fmt.Errorf("gemm %q: this libtorch %s has no oneDNN sgemm (use auto or blas)", choice, Version())
		}
		C.drmas_gemm_set(1, 0)
	case GEMMBLAS:
		C.drmas_gemm_set(0, 0)
	default:
		return fmt.Errorf("gemm %q: want auto, onednn or blas", choice)
	}
	return nil
}

// gemmProducts counts the products oneDNN has run in this process.
func gemmProducts() int64 { return int64(C.drmas_gemm_calls()) }

// gemmThreads is the OpenMP thread count of oneDNN's products.
func gemmThreads() int { return int(C.drmas_gemm_nthreads()) }

// setGEMMThreads sets the OpenMP thread count of oneDNN's products.
func setGEMMThreads(n int) { C.drmas_gemm_set(C.drmas_gemm_use(), C.int(n)) }

func init() {
	if v, ok := os.LookupEnv("DRMAS_GEMM"); ok {
		if err := SetGEMM(v); err != nil {
			fmt.Fprintln(os.Stderr, "drmas: DRMAS_GEMM:", err)
			os.Exit(2)
		}
	}
}
