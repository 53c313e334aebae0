// drmas c10d shim (see drmas_c10d.h). Compiles against the c10d of libtorch 1.13 (ProcessGroup subclasses)
// and 2.x (c10d::Backend subclasses): it only uses the constructor, Options::create, the collective
// methods and Work::wait, which have the same shape in both.
#include "drmas_c10d_config.h"  // written by torchsetup: USE_C10D_GLOO, and NCCL when built

#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef DRMAS_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drmas_c10d.h"

namespace {

char *dup_error(const std::string &s) {
  char *p = static_cast<char *>(std::malloc(s.size() + 1));
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

// first_line keeps an exception's message without c10's multi-line backtrace.
std::string first_line(const char *what) {
  std::string s(what);
  auto i = s.find("\nException raised from");
  if (i != std::string::npos) s = s.substr(0, i);
  return s;
}

}  // namespace

#define DRMAS_TRY(x)                                   \
  try {                                                \
    x                                                  \
  } catch (const c10::Error &e) {                      \
    return dup_error(first_line(e.what_without_backtrace())); \
  } catch (const std::exception &e) {                  \
    return dup_error(first_line(e.what()));            \
  } catch (...) {                                      \
    return dup_error("unknown C++ exception");         \
  }                                                    \
  return nullptr;

struct drmas_group {
  std::string backend;
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds timeout{0};
  std::string prefix;                        // of every key ("" or "<prefix>/")
  c10::intrusive_ptr<c10d::Store> store;     // rendezvous (prefixed); owned by the process group afterwards
  c10::intrusive_ptr<c10d::TCPStore> side;   // a connection of its own for heartbeats and diagnostics
  std::mutex side_mu;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#ifdef DRMAS_WITH_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif

  // run calls f with the process group (the concrete type: both versions expose the same methods).
  template <typename F>
  void run(F f) {
#ifdef DRMAS_WITH_NCCL
    if (nccl) {
      f(*nccl);
      return;
    }
#endif
    f(*gloo);
  }
};

namespace {

std::vector<at::Tensor> tensors_of(void **ts, int n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int i = 0; i < n; i++) out.push_back(*static_cast<at::Tensor *>(ts[i]));
  return out;
}

void wait_for(const c10::intrusive_ptr<c10d::Work> &w, std::chrono::milliseconds timeout) {
  w->wait(timeout);
}

// set_libuv sets TCPStoreOptions::useLibUV where the field exists (libtorch >= 2.2; PyTorch's default
// since 2.4) and reports whether it did; 1.13 has one store backend and no field.
template <typename O>
auto set_libuv(O &o, bool on, int) -> decltype(o.useLibUV = on, bool()) {
  o.useLibUV = on;
  return true;
}
template <typename O>
bool set_libuv(O &, bool, long) {
  return false;
}

// connect_store opens a TCPStore connection (serving it when so.isServer). libuv's store backend is
// asked for as PyTorch asks for it (unless USE_LIBUV=0); a libtorch built without libuv (Debian's)
// refuses it before binding anything, and then the classic backend serves, as USE_LIBUV=0 would
// choose. The choice is left in so, so later connections made from a copy of it skip the refusal.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string &host, c10d::TCPStoreOptions &so) {
  const char *env = std::getenv("USE_LIBUV");
  bool want = !(env && std::string(env) == "0");
  bool libuv = set_libuv(so, want, 0) && want;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, so);
  } catch (const c10::Error &e) {
    if (!libuv || std::string(e.what()).find("libuv") == std::string::npos) throw;
  }
  set_libuv(so, false, 0);
  return c10::make_intrusive<c10d::TCPStore>(host, so);
}

}  // namespace

extern "C" {

int drmas_nccl_built(void) {
#ifdef DRMAS_WITH_NCCL
  return 1;
#else
  return 0;
#endif
}

char *drmas_group_new(const char *backend, const char *host, int port, int rank, int world,
                      int64_t timeout_ms, int serve_store, const char *prefix, drmas_group **out) {
  DRMAS_TRY({
    auto g = std::make_unique<drmas_group>();
    g->backend = backend;
    g->rank = rank;
    g->world = world;
    g->timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = serve_store != 0;
    so.numWorkers = static_cast<std::size_t>(world);
    so.waitWorkers = false;
    so.timeout = g->timeout;
    auto tcp = connect_store(std::string(host), so);
    g->store = tcp;
    if (prefix && *prefix) {
      g->prefix = std::string(prefix) + "/";
      g->store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    }
    c10d::TCPStoreOptions side = so;  // with the backend the first connection settled on
    side.isServer = false;
    g->side = c10::make_intrusive<c10d::TCPStore>(std::string(host), side);
    if (g->backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(g->timeout);
      // Bind to the address the store resolved for this host: on one machine that is the loopback,
      // across machines the interface that reaches MASTER_ADDR.
      const char *ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname && *ifname) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else if (std::string(host) == "127.0.0.1" || std::string(host) == "localhost") {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      opts->threads = 2;
      g->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(g->store, rank, world, opts);
    } else if (g->backend == "nccl") {
#ifdef DRMAS_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = g->timeout;
      g->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(g->store, rank, world, opts);
#else
      throw std::runtime_error(
          "backend nccl: this drmas was set up against a libtorch without CUDA/NCCL (scripts/torchsetup built Gloo only)");
#endif
    } else {
      throw std::runtime_error("unknown backend " + g->backend + " (want gloo or nccl)");
    }
    *out = g.release();
  })
}

void drmas_group_free(drmas_group *g) {
  if (!g) return;
  try {
#ifdef DRMAS_WITH_NCCL
    g->nccl.reset();
#endif
    g->gloo.reset();
    g->side.reset();
    g->store.reset();
  } catch (...) {
  }
  delete g;
}

char *drmas_all_reduce(drmas_group *g, void **tensors, int n, int op) {
  DRMAS_TRY({
    auto ts = tensors_of(tensors, n);
    c10d::AllreduceOptions o;
    o.reduceOp = op == 1 ? c10d::ReduceOp::MAX : op == 2 ? c10d::ReduceOp::MIN : c10d::ReduceOp::SUM;
    o.timeout = g->timeout;
    for (auto &t : ts) {
      // One tensor per call: a vector of several means several devices to c10d.
      std::vector<at::Tensor> one{t};
      g->run([&](auto &pg) { wait_for(pg.allreduce(one, o), g->timeout); });
    }
  })
}

char *drmas_broadcast(drmas_group *g, void **tensors, int n, int root) {
  DRMAS_TRY({
    auto ts = tensors_of(tensors, n);
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = g->timeout;
    for (auto &t : ts) {
      std::vector<at::Tensor> one{t};
      g->run([&](auto &pg) { wait_for(pg.broadcast(one, o), g->timeout); });
    }
  })
}

char *drmas_all_gather(drmas_group *g, void **outs, void *in) {
  DRMAS_TRY({
    std::vector<at::Tensor> input{*static_cast<at::Tensor *>(in)};
    std::vector<std::vector<at::Tensor>> output{tensors_of(outs, g->world)};
    c10d::AllgatherOptions o;
    o.timeout = g->timeout;
    g->run([&](auto &pg) { wait_for(pg.allgather(output, input, o), g->timeout); });
  })
}

char *drmas_all_gather_base(drmas_group *g, void *out, void *in) {
  DRMAS_TRY({
    at::Tensor &output = *static_cast<at::Tensor *>(out);
    at::Tensor &input = *static_cast<at::Tensor *>(in);
    c10d::AllgatherOptions o;
    o.timeout = g->timeout;
    g->run([&](auto &pg) { wait_for(pg._allgather_base(output, input, o), g->timeout); });
  })
}

char *drmas_reduce_scatter_base(drmas_group *g, void *out, void *in, int op) {
  DRMAS_TRY({
    at::Tensor &output = *static_cast<at::Tensor *>(out);
    at::Tensor &input = *static_cast<at::Tensor *>(in);
    c10d::ReduceScatterOptions o;
    o.reduceOp = op == 1 ? c10d::ReduceOp::MAX : op == 2 ? c10d::ReduceOp::MIN : c10d::ReduceOp::SUM;
    o.timeout = g->timeout;
    g->run([&](auto &pg) { wait_for(pg._reduce_scatter_base(output, input, o), g->timeout); });
  })
}

char *drmas_barrier(drmas_group *g) {
  DRMAS_TRY({
    c10d::BarrierOptions o;
    o.timeout = g->timeout;
    g->run([&](auto &pg) { wait_for(pg.barrier(o), g->timeout); });
  })
}

char *drmas_store_set(drmas_group *g, const char *key, const void *data, int64_t n) {
  DRMAS_TRY({
    std::lock_guard<std::mutex> lock(g->side_mu);
    const auto *p = static_cast<const uint8_t *>(data);
    g->side->set(g->prefix + key, std::vector<uint8_t>(p, p + n));
  })
}

char *drmas_store_get(drmas_group *g, const char *key, int64_t timeout_ms, void **data, int64_t *n) {
  DRMAS_TRY({
    std::lock_guard<std::mutex> lock(g->side_mu);
    g->side->setTimeout(std::chrono::milliseconds(timeout_ms));
    struct restore {
      drmas_group *g;
      ~restore() { g->side->setTimeout(g->timeout); }
    } r{g};
    auto v = g->side->get(g->prefix + key);
    *n = static_cast<int64_t>(v.size());
    *data = std::malloc(v.size() + 1);
    if (!v.empty()) std::memcpy(*data, v.data(), v.size());
  })
}

}  // extern "C"
