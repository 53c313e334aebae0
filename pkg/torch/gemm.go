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
)

// GEMM libraries for libtorch's float32 CPU matrix products (see gemm.c).
const (
	GEMMOneDNN = "onednn" // oneDNN's sgemm, which libtorch links for its own kernels
	GEMMBLAS   = "blas"   // the BLAS libtorch was linked with (OpenBLAS on Debian)
)

// GEMM names the library that runs libtorch's float32 CPU matrix products in this process.
func GEMM() string {
	if C.drmas_gemm_use() == 1 && C.drmas_gemm_has_dnnl() == 1 {
		return GEMMOneDNN
	}
	return GEMMBLAS
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
