// libtorch's float32 matrix products on oneDNN.
//
// libtorch runs every float32 CPU matrix product (mm, addmm, bmm, linear and their backward passes)
// through the Fortran BLAS symbol sgemm_, which the dynamic linker resolves to the first definition
// in load order: this one, since the executable comes first. It hands the product to oneDNN's
// dnnl_sgemm when the process has it (libtorch links oneDNN for its own kernels), else to the BLAS
// libtorch was linked with (RTLD_NEXT), exactly as if this file did not exist. Nothing is linked at
// build time: both are looked up at the first call, so a libtorch without oneDNN keeps its BLAS.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                             float, float *, int64_t);
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *, const float *,
                         const int *, const float *, const int *, const float *, float *, const int *);

static dnnl_sgemm_fn dnnl;
static sgemm_fn next_sgemm;
static int (*omp_get_max)(void);
static void (*omp_set)(int);
static atomic_int resolved;

atomic_int drmas_gemm_use_dnnl = 1; // 0: always the linked BLAS
atomic_int drmas_gemm_threads = 1;  // OpenMP threads for oneDNN's products
atomic_long drmas_gemm_dnnl_calls;  // products oneDNN ran (for tests and reports)

static void resolve(void) {
	dnnl = (dnnl_sgemm_fn)dlsym(RTLD_DEFAULT, "dnnl_sgemm");
	next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "sgemm_");
	omp_get_max = (int (*)(void))dlsym(RTLD_DEFAULT, "omp_get_max_threads");
	omp_set = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
	atomic_store(&resolved, 1);
}

// drmas_gemm_has_dnnl: 1 when oneDNN's sgemm is in the process.
int drmas_gemm_has_dnnl(void) {
	if (!atomic_load(&resolved)) resolve();
	return dnnl != NULL;
}

void sgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c, const int *ldc) {
	if (!atomic_load(&resolved)) resolve();
	if (dnnl && atomic_load(&drmas_gemm_use_dnnl)) {
		// Column-major C = op(A)·op(B) is row-major Cᵀ = op(B)ᵀ·op(A)ᵀ, and oneDNN's sgemm is row-major:
		// the same call with the operands (and their transposes and sizes) swapped. libtorch's
		// intra-op count is OpenMP's for this thread; the products get their own count meanwhile.
		int want = atomic_load(&drmas_gemm_threads), prev = omp_get_max ? omp_get_max() : want;
		if (omp_set && prev != want) omp_set(want);
		int status = dnnl(*transb, *transa, *n, *m, *k, *alpha, b, *ldb, a, *lda, *beta, c, *ldc);
		if (omp_set && prev != want) omp_set(prev);
		if (status == 0) {
			atomic_fetch_add(&drmas_gemm_dnnl_calls, 1);
			return;
		}
	}
	if (!next_sgemm) {
		fprintf(stderr, "drmas: sgemm_ called, but neither oneDNN nor a BLAS library provides it\n");
		abort();
	}
	next_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
