// Package replica runs the `drmas serve` replicas that `drmas train` starts itself for a model whose
// rollouts are on managed engines (models[].rollout.engine: managed): Start launches them on loopback
// with a fresh API key and weight updates from the run folder, each with its device and threads, its
// log and pid file under <run>/replicas; a replica that exits is restarted on its port and reloaded to
// the weights the engines serve before it takes requests again; Close stops them.
package replica
