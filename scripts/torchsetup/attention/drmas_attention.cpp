// drmas attention shim (see drmas_attention.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "drmas_attention.h"

#define DRMAS_SDPA (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
#define DRMAS_SDPA_GQA (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))

namespace {

char *attn_error(const std::string &s) {
  std::string m = s;
  auto i = m.find("\nException raised from");
  if (i != std::string::npos) m = m.substr(0, i);
  char *p = static_cast<char *>(std::malloc(m.size() + 1));
  std::memcpy(p, m.c_str(), m.size() + 1);
  return p;
}

// guarded runs f, returning NULL, or the message of what it threw (for the caller to free).
template <typename F>
char *guarded(F f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error &e) {
    return attn_error(e.what_without_backtrace());
  } catch (const std::exception &e) {
    return attn_error(e.what());
  } catch (...) {
    return attn_error("unknown C++ exception");
  }
}

#if DRMAS_SDPA
// fused_choice is libtorch's kernel choice for these inputs (0: math).
int64_t fused_choice(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool causal, double scale,
                     bool gqa) {
#if DRMAS_SDPA_GQA
  return at::_fused_sdp_choice(q, k, v, c10::nullopt, 0.0, causal, scale, gqa);
#else
  (void)gqa;
  return at::_fused_sdp_choice(q, k, v, c10::nullopt, 0.0, causal, scale);
#endif
}

at::Tensor sdpa(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool causal, double scale,
                bool gqa) {
#if DRMAS_SDPA_GQA
  return at::scaled_dot_product_attention(q, k, v, c10::nullopt, 0.0, causal, scale, gqa);
#else
  (void)gqa;
  return at::scaled_dot_product_attention(q, k, v, c10::nullopt, 0.0, causal, scale);
#endif
}

// heads repeats each of x's KV heads g times: [B, KV, S, D] → [B, KV·g, S, D].
at::Tensor heads(const at::Tensor &x, int64_t g) {
  auto s = x.sizes();
  return x.unsqueeze(2).expand({s[0], s[1], g, s[2], s[3]}).reshape({s[0], s[1] * g, s[2], s[3]});
}
#endif

// rows describes drmas_attend_rows's rows: row i attends over the columns first(i) … S−1 of slot(i).
struct rows {
  const int64_t *slots, *starts;
  int64_t window, B, KV, G, D, S;
  int64_t slot(int64_t i) const { return slots ? slots[i] : i; }
  int64_t first(int64_t i) const { return window > 0 ? std::max(starts[i], S - window) : starts[i]; }
};

// attend_rows_ops is drmas_attend_rows with libtorch's ops, row by row: any dtype and device (each op
// on libtorch's threads). qg [B, KV, G, D] is the scaled query, o [B, KV, G, D] the output.
void attend_rows_ops(const at::Tensor &qg, const at::Tensor &k, const at::Tensor &v, at::Tensor &o, const rows &r) {
  at::ScalarType compute = qg.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  for (int64_t i = 0; i < r.B; i++) {
    int64_t st = r.first(i), n = r.S - st, b = r.slot(i);
    at::Tensor s = at::matmul(qg.select(0, i), k.select(0, b).narrow(1, st, n).transpose(1, 2));  // [KV, G, n]
    if (s.scalar_type() != compute) s = s.to(compute);
    at::Tensor p = at::softmax(s, -1);
    if (p.scalar_type() != v.scalar_type()) p = p.to(v.scalar_type());
    at::Tensor oi = o.select(0, i);
    at::matmul_out(oi, p, v.select(0, b).narrow(1, st, n));  // [KV, G, D]
  }
}

// The CPU kernel of drmas_attend_rows for float32: per (row, key/value head), the scores of its G
// query heads in one pass over the keys, their softmax, and the values weighted in one pass over the
// values, so each key and value is read once; libtorch's ops cost a dozen dispatches a row, as long
// as reading the row's keys at the lengths of a decoding step. Eight lanes at a time (GCC vector
// extensions: AVX2 where the CPU has it, two SSE halves elsewhere); exp is Cephes's expf polynomial
// (within 2 ulp of the exact value, as libtorch's own vectorized exp is within 1).
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

// The vectors go to and from functions by reference only (GCC notes that passing them by value changed
// in GCC 4.6, once per build).
static inline __attribute__((always_inline)) void load8(f8 &x, const float *p) { std::memcpy(&x, p, sizeof x); }

static inline __attribute__((always_inline)) void store8(float *p, const f8 &x) { std::memcpy(p, &x, sizeof x); }

static inline __attribute__((always_inline)) float hsum8(const f8 &x) {
  return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

// exp8 sets x to e^x for x ≤ 0 (a softmax's shifted scores), lanes below −87.3 flushed to 0.
static inline __attribute__((always_inline)) void exp8(f8 &x) {
  const f8 lo = f8{} - 87.3365447f;
  i8 under = x < lo;
  x = x < lo ? lo : x;
  f8 fx = x * 1.44269504088896341f + 0.5f;
  i8 n = __builtin_convertvector(fx, i8);
  f8 fn = __builtin_convertvector(n, f8);
  fn = fn > fx ? fn - 1.0f : fn;  // floor (fx < 0 truncates up)
  n = __builtin_convertvector(fn, i8);
  x = x - fn * 0.693359375f + fn * 2.12194440e-4f;
  f8 z = x * x;
  f8 y = ((((1.9875691500E-4f * x + 1.3981999507E-3f) * x + 8.3334519073E-3f) * x + 4.1665795894E-2f) * x +
          1.6666665459E-1f) * x + 5.0000001201E-1f;
  y = y * z + x + 1.0f;
  i8 e = (n + 127) << 23;
  f8 pow2;
  std::memcpy(&pow2, &e, sizeof pow2);
  y = y * pow2;
  x = under ? f8{} : y;
}

struct headTask {
  const float *q, *k, *v;  // the G scaled queries [G, D]; the first key and value of the row's columns
  float *o, *score;        // the output [G, D]; scratch for G × n scores
  int64_t n, stride, G, D;  // columns, elements between columns
};

static inline __attribute__((always_inline)) void attend_head(const headTask &t) {
  const int64_t n = t.n, G = t.G, D = t.D, D8 = D / 8 * 8;
  for (int64_t j = 0; j < n; j++) {
    const float *kj = t.k + j * t.stride;
    for (int64_t g = 0; g < G; g++) {
      const float *qg = t.q + g * D;
      f8 acc = f8{}, a, b;
      for (int64_t d = 0; d < D8; d += 8) {
        load8(a, qg + d);
        load8(b, kj + d);
        acc += a * b;
      }
      float s = hsum8(acc);
      for (int64_t d = D8; d < D; d++) s += qg[d] * kj[d];
      t.score[g * n + j] = s;
    }
  }
  const int64_t n8 = n / 8 * 8;
  for (int64_t g = 0; g < G; g++) {
    float *sg = t.score + g * n, m = sg[0];
    for (int64_t j = 1; j < n; j++) m = std::max(m, sg[j]);
    f8 sum8 = f8{};
    for (int64_t j = 0; j < n8; j += 8) {
      f8 e;
      load8(e, sg + j);
      e -= m;
      exp8(e);
      store8(sg + j, e);
      sum8 += e;
    }
    float sum = hsum8(sum8);
    for (int64_t j = n8; j < n; j++) {
      sg[j] = std::exp(sg[j] - m);
      sum += sg[j];
    }
    float inv = 1.0f / sum, *og = t.o + g * D;
    for (int64_t d = 0; d < D; d++) og[d] = 0;
    for (int64_t j = 0; j < n; j++) {
      const float *vj = t.v + j * t.stride;
      float p = sg[j] * inv;
      for (int64_t d = 0; d < D8; d += 8) {
        f8 a, b;
        load8(a, og + d);
        load8(b, vj + d);
        a += p * b;
        store8(og + d, a);
      }
      for (int64_t d = D8; d < D; d++) og[d] += p * vj[d];
    }
  }
}

__attribute__((target("avx2,fma"))) void attend_head_avx2(const headTask &t) { attend_head(t); }
void attend_head_base(const headTask &t) { attend_head(t); }

// omp is libgomp's entry for a parallel region (what `#pragma omp parallel` compiles to), found in the
// process (the OpenMP runtime libtorch runs its own parallel kernels on, whichever copy that is), so
// the kernel shares libtorch's threads: the shim is compiled without -fopenmp, where ATen's
// parallel_for runs serially. NULL where libtorch has no OpenMP runtime: one thread.
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
gomp_parallel_fn omp() {
  static gomp_parallel_fn f = reinterpret_cast<gomp_parallel_fn>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
  return f;
}

// headJob is the (row, key/value head) pairs of a call, longest first, handed out one at a time to
// the threads that run it (run_heads).
struct headJob {
  const rows *r;
  const float *Q, *K, *V;
  float *O;
  int64_t sb, sh, sc;
  std::vector<int64_t> order;
  std::atomic<int64_t> next{0};
  bool avx2;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;  // the first thread's exception (none can leave a libgomp thread)
};

void run_heads_of(headJob &j) {
  const rows &r = *j.r;
  std::vector<float> scratch;
  for (int64_t k; (k = j.next.fetch_add(1)) < int64_t(j.order.size());) {
    int64_t w = j.order[k], i = w / r.KV, h = w % r.KV, st = r.first(i), n = r.S - st;
    int64_t off = r.slot(i) * j.sb + h * j.sh + st * j.sc;
    scratch.resize(r.G * n);
    headTask t{j.Q + w * r.G * r.D, j.K + off, j.V + off, j.O + w * r.G * r.D, scratch.data(), n, j.sc, r.G, r.D};
    if (j.avx2)
      attend_head_avx2(t);
    else
      attend_head_base(t);
  }
}

void run_heads(void *p) {
  headJob &j = *static_cast<headJob *>(p);
  try {
    run_heads_of(j);
  } catch (...) {
    if (!j.failed.test_and_set()) j.error = std::current_exception();
    j.next.store(int64_t(j.order.size()));  // the other threads stop too
  }
}

void attend_rows_cpu(const at::Tensor &qg, const at::Tensor &k, const at::Tensor &v, at::Tensor &o, const rows &r) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  headJob j;
  j.r = &r;
  j.Q = qg.data_ptr<float>(), j.K = k.data_ptr<float>(), j.V = v.data_ptr<float>(), j.O = o.data_ptr<float>();
  j.sb = k.stride(0), j.sh = k.stride(1), j.sc = k.stride(2), j.avx2 = avx2;
  j.order.resize(r.B * r.KV);
  std::iota(j.order.begin(), j.order.end(), 0);
  std::stable_sort(j.order.begin(), j.order.end(),
                   [&](int64_t a, int64_t b) { return r.first(a / r.KV) < r.first(b / r.KV); });
  int64_t cols = 0;
  for (int64_t i = 0; i < r.B; i++) cols += r.S - r.first(i);
  // Threads only where each gets 4,096 columns of one head or more: a parallel region costs a few
  // microseconds, a short call less.
  int64_t threads = std::min<int64_t>({at::get_num_threads(), r.B * r.KV, cols * r.KV / 4096 + 1});
  if (threads > 1 && omp())
    omp()(run_heads, &j, unsigned(threads), 0);
  else
    run_heads(&j);
  if (j.error) std::rethrow_exception(j.error);
}

}  // namespace

extern "C" {

int drmas_sdpa_available(void) { return DRMAS_SDPA ? 1 : 0; }

char *drmas_sdpa(void *qp, void *kp, void *vp, int causal, double scale, void **out, int *backend) {
  *out = nullptr;
  *backend = 0;
#if DRMAS_SDPA
  return guarded([&] {
    const at::Tensor &q = *static_cast<at::Tensor *>(qp);
    at::Tensor k = *static_cast<at::Tensor *>(kp);
    at::Tensor v = *static_cast<at::Tensor *>(vp);
    int64_t g = q.size(1) / k.size(1);
    bool gqa = false;
    int64_t choice = 0;
    if (g > 1 && DRMAS_SDPA_GQA) {
      choice = fused_choice(q, k, v, causal != 0, scale, true);
      gqa = choice > 0;
    }
    if (!gqa) {
      if (g > 1) {
        k = heads(k, g);
        v = heads(v, g);
      }
      choice = fused_choice(q, k, v, causal != 0, scale, false);
    }
    if (choice <= 0) return;  // the math kernel (or none): the caller takes its tiles
    *backend = static_cast<int>(choice);
    *out = new at::Tensor(sdpa(q, k, v, causal != 0, scale, gqa));
  });
#else
  (void)qp, (void)kp, (void)vp, (void)causal, (void)scale;
  return attn_error("scaled_dot_product_attention needs libtorch 2.1 or later (this one is " TORCH_VERSION ")");
#endif
}

char *drmas_attend_rows(void *qp, void *kp, void *vp, void *scalep, const int64_t *slots, const int64_t *starts,
                        int64_t window, void **out) {
  *out = nullptr;
  return guarded([&] {
    c10::NoGradGuard no_grad;
    const at::Tensor &q = *static_cast<at::Tensor *>(qp);
    const at::Tensor &k = *static_cast<at::Tensor *>(kp);
    const at::Tensor &v = *static_cast<at::Tensor *>(vp);
    const at::Tensor &scale = *static_cast<at::Tensor *>(scalep);
    int64_t B = q.size(0), H = q.size(1), D = q.size(3), KV = k.size(1), S = k.size(2);
    at::Tensor qg = q.mul(scale).reshape({B, KV, H / KV, D}).contiguous();
    at::Tensor o = at::empty({B, KV, H / KV, D}, v.options());
    rows r{slots, starts, window, B, KV, H / KV, D, S};
    if (k.device().is_cpu() && k.stride(3) == 1 && v.stride(3) == 1 && k.strides() == v.strides() &&
        k.scalar_type() == at::kFloat && q.scalar_type() == at::kFloat) {
      attend_rows_cpu(qg, k, v, o, r);
    } else {
      attend_rows_ops(qg, k, v, o, r);
    }
    *out = new at::Tensor(o.reshape({B, 1, H * D}));
  });
}

}  // extern "C"
