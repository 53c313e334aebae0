// Package dist is drmas's data-parallel layer around libtorch's distributed engine, c10d, in pure
// Go: the `dist:` section (Config: backend, timeouts, shard stage, balance), the torchrun-style launch
// environment (EnvFromOS) and the `--nproc` launcher (Launch), which starts local ranks and names the
// one that failed. The process group itself — the collectives training calls — is pkg/dist/c10d.
package dist
