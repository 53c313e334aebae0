// drmas attention shim (see drmas_attention.h).
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <string>

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

}  // namespace

extern "C" {

int drmas_sdpa_available(void) { return DRMAS_SDPA ? 1 : 0; }

char *drmas_sdpa(void *qp, void *kp, void *vp, int causal, double scale, void **out, int *backend) {
  *out = nullptr;
  *backend = 0;
#if DRMAS_SDPA
  try {
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
    if (choice <= 0) return nullptr;  // the math kernel (or none): the caller takes its tiles
    *backend = static_cast<int>(choice);
    *out = new at::Tensor(sdpa(q, k, v, causal != 0, scale, gqa));
    return nullptr;
  } catch (const c10::Error &e) {
    return attn_error(e.what_without_backtrace());
  } catch (const std::exception &e) {
    return attn_error(e.what());
  } catch (...) {
    return attn_error("unknown C++ exception");
  }
#else
  (void)qp, (void)kp, (void)vp, (void)causal, (void)scale;
  return attn_error("scaled_dot_product_attention needs libtorch 2.1 or later (this one is " TORCH_VERSION ")");
#endif
}

}  // extern "C"
