// Package dist is drmas's data-parallel layer on libtorch's own distributed engine, c10d: Init joins
// a TCPStore rendezvous and a Gloo (CPU) or NCCL (CUDA) process group (a Group, with the collectives
// training needs: AllReduce, Broadcast, AllGather, Barrier on gotch tensors); EnvFromOS reads the
// torchrun environment and Launch starts `--nproc` local ranks.
//
// The C++ shim is compiled at set-up by scripts/torchsetup; this is the one package that uses it.
//
// A nil *Group is the single-process group: every collective is a no-op on it, so callers need no
// special case for world size 1 without a launch environment.
//
// Faults: every collective is bounded by the group's timeout, and a monitor goroutine exchanges
// heartbeats through the store; a peer whose heartbeat stops (killed, crashed, stopped) ends this
// process with an error naming that rank, also while this rank waits in a collective. The store's
// host is watched too (a watchdog times the monitor's round trips to the store), so a hung rank 0 is
// named within the same bound as any other rank. Ranks started by Launch report whom they blame to
// the launcher, which names the lost rank in its own error.
//
// At rendezvous the ranks compare an identity (Options.Identity: the resolved config, the binary's
// version) and refuse to start when it differs, naming the keys.
package dist
