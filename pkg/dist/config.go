package dist

import (
	"github.com/drmas/drmas/pkg/choice"
)

// Config is the `dist:` section: data-parallel training on c10d (used when the process is launched
// with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or by drmas train --nproc N).
type Config struct {
	Backend    string `mapstructure:"backend"`     // auto (nccl on CUDA, else gloo) | gloo | nccl
	TimeoutS   int    `mapstructure:"timeout_s"`   // bound on the rendezvous and every collective
	StallS     int    `mapstructure:"stall_s"`     // a rank silent this long (no heartbeat) ends the run
	AgentNorms string `mapstructure:"agent_norms"` // exact (one all-reduce per agent share) | approx (one per step)
	// Shard partitions the training state among the ranks (docs/scale-out.md "Sharded training
	// state"): none (every rank holds everything) | optimizer (ZeRO-1: each rank holds and steps its
	// partition of the float32 master weights and AdamW moments) | gradients (ZeRO-2: and keeps only
	// its partition's reduced gradients between steps) | parameters (ZeRO-3, FSDP-style: each rank
	// holds 1/N of every model's flat weights, gradients and optimizer state; a unit — a decoder
	// layer, or the root: embeddings, final norm, lm_head — is gathered whole only around its use).
	Shard string `mapstructure:"shard"`
	// RolloutGather is how generation on the trainer sees weights sharded by dist.shard: parameters:
	// unit (the default: one unit gathered at a time, every forward; a rank never holds a whole model)
	// | model (the rollout gathers each model whole once and generates from that copy: faster, at the
	// memory of one model's weights). Other stages hold the whole weights anyway.
	RolloutGather string `mapstructure:"rollout_gather"`
	// Balance is which trajectories' calls each rank trains on: tokens (whole trajectories in shares
	// of equal token count, a function of the global rollout) | tasks (those of the tasks it rolled
	// out: equal sample count).
	Balance string `mapstructure:"balance"`
}

// Defaults is the section a config's `dist:` is decoded over.
func Defaults() Config {
	return Config{Backend: BackendAuto, TimeoutS: 1800, StallS: 60, AgentNorms: NormsExact, Shard: ShardNone, Balance: BalanceTokens,
		RolloutGather: GatherUnit}
}

// Validate checks the section, each problem naming its key under key ("dist").
func (c Config) Validate(key string) error {
	var p choice.Problems
	p.Registered(key+".backend", c.Backend, Backends)
	p.Registered(key+".agent_norms", c.AgentNorms, AgentNorms)
	p.Registered(key+".shard", c.Shard, ShardStages)
	p.Registered(key+".balance", c.Balance, Balances)
	p.Registered(key+".rollout_gather", c.RolloutGather, RolloutGathers)
	p.IntIn(key+".timeout_s", c.TimeoutS, 1, 7*24*3600)
	p.IntIn(key+".stall_s", c.StallS, 1, 24*3600)
	return p.Err()
}

// Shard stages (dist.shard): how much of the training state each data-parallel rank holds
// (pkg/train/shard.go: ZeRO-1 and ZeRO-2; the strategy of each stage is registered there).
const (
	ShardNone      = "none"      // every rank holds everything
	ShardOptimizer = "optimizer" // each rank holds and steps its partition of the optimizer state
	ShardGradients = "gradients" // and keeps only its partition's reduced gradients between steps
	// ShardParameters: each rank holds its shard of every unit's weights, gradients and optimizer
	// state; units are gathered around their use (pkg/shard; the strategy: pkg/train/fsdp.go).
	ShardParameters = "parameters"
)

// ShardStages registers the shard stages.
var ShardStages = choice.NewSet("shard stage", ShardNone, ShardOptimizer, ShardGradients, ShardParameters)

// How generation on the trainer gathers weights sharded by dist.shard: parameters (dist.rollout_gather).
const (
	GatherUnit  = "unit"  // one unit at a time, every forward
	GatherModel = "model" // each model whole for the rollout, once
)

// RolloutGathers registers the ways generation gathers sharded weights.
var RolloutGathers = choice.NewSet("rollout gather", GatherUnit, GatherModel)

// Data-parallel balance (dist.balance): which trajectories' calls each rank trains on.
const (
	BalanceTokens = "tokens" // whole trajectories, shares of equal token count (longest first, to the lightest rank)
	BalanceTasks  = "tasks"  // the trajectories of the tasks it rolled out (equal sample count)
)

// Balances registers the data-parallel balances.
var Balances = choice.NewSet("balance", BalanceTokens, BalanceTasks)

// Per-agent gradient norms across ranks (dist.agent_norms).
const (
	NormsExact  = "exact"  // one all-reduce per agent share: the global share's norm
	NormsApprox = "approx" // one all-reduce per step: the root of the summed squares of the ranks' shares
)

// AgentNorms registers the ways of measuring per-agent norms across ranks.
var AgentNorms = choice.NewSet("agent norms", NormsExact, NormsApprox)

// c10d backends of data-parallel training (dist.backend; pkg/dist/c10d).
const (
	BackendAuto = "auto" // NCCL when the models run on CUDA, else Gloo
	BackendGloo = "gloo"
	BackendNCCL = "nccl"
)

// Backends registers the backends.
var Backends = choice.NewSet("dist backend", BackendAuto, BackendGloo, BackendNCCL)
