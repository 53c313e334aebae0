// drmas c10d shim: a C interface over libtorch's distributed engine (TCPStore rendezvous, Gloo and
// NCCL process groups). Written into the patched gotch copy (package libtch) by scripts/torchsetup; compiled with
// the libtorch found there. Tensors are gotch's handles (torch::Tensor*). Every function that can fail
// returns NULL on success or an error message the caller frees with free().
#ifndef DRMAS_C10D_SHIM_H
#define DRMAS_C10D_SHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct drmas_group drmas_group;

// drmas_nccl_built reports whether this build includes ProcessGroupNCCL.
int drmas_nccl_built(void);

// drmas_group_new forms a group: the rank with serve_store set serves the TCPStore at host:port
// (none does when a launcher's agent serves it, as torchrun's does), every rank connects to it
// (waiting up to timeout_ms), then the process group of the backend ("gloo" or "nccl") is created.
// A non-empty prefix puts every key of the group under "prefix/" (a store shared with a launcher).
// timeout_ms also bounds every collective.
char *drmas_group_new(const char *backend, const char *host, int port, int rank, int world,
                      int64_t timeout_ms, int serve_store, const char *prefix, drmas_group **out);

// drmas_group_free shuts the process group and the store connections down.
void drmas_group_free(drmas_group *g);

// op: 0 sum, 1 max, 2 min.
char *drmas_all_reduce(drmas_group *g, void **tensors, int n, int op);
char *drmas_broadcast(drmas_group *g, void **tensors, int n, int root);
// outs holds world tensors shaped like in.
char *drmas_all_gather(drmas_group *g, void **outs, void *in);
char *drmas_barrier(drmas_group *g);
// The flat collectives of parameter sharding (pkg/dist/c10d/shards.go): out holds world × in's
// elements. drmas_all_gather_base gathers every rank's in into out, in rank order;
// drmas_reduce_scatter_base reduces in (world × out's elements) over the ranks and leaves this rank's
// part in out. NCCL has both (all_gather_into_tensor, reduce_scatter_tensor); Debian's 1.13 Gloo
// refuses them.
char *drmas_all_gather_base(drmas_group *g, void *out, void *in);
char *drmas_reduce_scatter_base(drmas_group *g, void *out, void *in, int op);

// Store access on a connection of its own (safe beside collectives in flight).
char *drmas_store_set(drmas_group *g, const char *key, const void *data, int64_t n);
// drmas_store_get waits up to timeout_ms for the key; *data is malloc'd (caller frees).
char *drmas_store_get(drmas_group *g, const char *key, int64_t timeout_ms, void **data, int64_t *n);

#ifdef __cplusplus
}
#endif

#endif
