package train

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/toy"
	"github.com/drmas/drmas/pkg/optim"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
)

// warmupFile is the warm-up's report under run.dir.
var warmupFile = rundir.Own("warmup.json")

// WarmupReport is what the format warm-up measured (written to <run>/warmup.json and logged).
type WarmupReport struct {
	Steps        int                `json:"steps"`
	Demos        int                `json:"demos"`
	LossFirst    float64            `json:"loss_first"`
	LossLast     float64            `json:"loss_last"`
	RewardBefore float64            `json:"reward_before"` // val avg@1 before the warm-up
	RewardAfter  float64            `json:"reward_after"`
	AgentsBefore map[string]float64 `json:"invalid_before"` // invalid-call rate per agent
	AgentsAfter  map[string]float64 `json:"invalid_after"`
	Seconds      float64            `json:"seconds"`
}

// warmup runs the supervised format warm-up (docs/toy-tasks.md): each model learns, by next-token
// likelihood, its agents' responses in format demonstrations (right tags, random content), so RL
// starts from a policy that knows the format but not the answers.
func warmup(ctx context.Context, t *Team, models []*modelState, dir string, g *c10d.Group) (*WarmupReport, error) {
	w := t.Config.Warmup
	began := time.Now()
	rep := &WarmupReport{Steps: w.Steps}
	var err error
	if rep.RewardBefore, rep.AgentsBefore, err = quickEval(ctx, t); err != nil {
		return nil, err
	}
	n := min(len(t.Train), 512)
	demos, err := toy.Demos(ctx, env.RuleOrchestra(t.Orchestra), t.Config.Toy, t.Train[:n], 2, t.Config.Run.Seed)
	if err != nil {
		return nil, err
	}
	rep.Demos = len(demos)
	err = torch.Do(func() error {
		var err error
		rep.LossFirst, rep.LossLast, err = sftWarmup(t, models, demos)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("format warm-up: %w", err)
	}
	if rep.RewardAfter, rep.AgentsAfter, err = quickEval(ctx, t); err != nil {
		return nil, err
	}
	rep.Seconds = time.Since(began).Seconds()
	if g.Rank() != 0 { // data-parallel: rank 0 writes
		return rep, nil
	}
	if b, err := json.MarshalIndent(rep, "", "  "); err != nil { // a non-finite figure
		log.Warn().Err(err).Msg("warmup.json not written")
	} else if err := atomicfile.WriteBytes(filepath.Join(dir, warmupFile), b); err != nil {
		return nil, err
	}
	log.Info().Int("steps", w.Steps).Int("demos", rep.Demos).Float64("loss_first", rep.LossFirst).
		Float64("loss_last", rep.LossLast).Float64("reward_before", rep.RewardBefore).Float64("reward_after", rep.RewardAfter).
		Interface("invalid_after", rep.AgentsAfter).Msg("format warm-up done")
	return rep, nil
}

// warmupGroups are the models the warm-up trains, and the group each model id's demonstrations go
// to: every model group as it is, except LoRA adapters, whose demonstrations warm their frozen base
// instead (once for all its adapters, like a shared model's warm-up), which is frozen again after:
// the base plays the pretrained model that knows the format, and every adapter starts from it
// (PEFT's init: the adapted model is the base) for RL. Warming adapters on a frozen random base does not work: the toy's random tied
// embeddings and final norm cap the logits, and the warm-up's loss stalls (docs/lora.md).
func warmupGroups(t *Team, models []*modelState) ([]*modelState, map[string]string) {
	var groups []*modelState
	target := map[string]string{}
	bases := map[string]bool{}
	for _, ms := range models {
		base := ms.cfg.Base
		if base == "" { // the model's own weights (whole meanwhile under dist.shard parameters, whose optimizer steps shards)
			g := &modelState{id: ms.id, pol: ms.pol, upd: ms.upd}
			g.names, g.params = policy.SplitParams(ms.pol.Model.Parameters())
			groups = append(groups, g)
			target[ms.id] = ms.id
			continue
		}
		target[ms.id] = base
		if bases[base] {
			continue
		}
		bases[base] = true
		bp := t.Router[base]
		g := &modelState{id: base, pol: bp, upd: ms.upd}
		g.names, g.params = policy.SplitParams(bp.Model.Parameters())
		groups = append(groups, g)
	}
	return groups, target
}

// sftStep takes one AdamW step on the token-mean negative log-likelihood of the responses.
func sftStep(ms *modelState, batch []policy.Sequence, opt *optim.AdamW) (float64, error) {
	s := torch.NewScope()
	defer s.Close()
	ZeroGrad(ms.params)
	sc, bp, err := ms.pol.Model.TrainScore(batch, false, ms.upd.checkpointing)
	if err != nil {
		return 0, err
	}
	mask := sc.Mask.MustTotype(gotch.Float, false)
	nll := sc.LogProbs.MustTotype(gotch.Float, false).MustNeg(true)
	loss, err := Aggregate(nll, mask, TokenMean, Denominators{Tokens: MaskedSum(mask, mask)})
	if err != nil {
		return 0, err
	}
	bp.Backward(loss)
	if norm := GradNorm(ms.params); isFinite(norm) {
		_ = clippedStep(ms.params, norm, ms.upd.gradClip, adamwStep(opt)) // a plain AdamW step cannot fail
	} else {
		ZeroGrad(ms.params)
	}
	return loss.Float64Values()[0], nil
}

// quickEval measures mean reward (avg@1, no curriculum) and invalid rates on the validation tasks.
func quickEval(ctx context.Context, t *Team) (float64, map[string]float64, error) {
	release := t.Router.HoldDecodingLayout()
	rep, err := env.Evaluate(ctx, t.Orchestra, t.Router, t.Val, env.EvalOptions{K: 1, Seed: t.Config.Run.Seed ^ 0x77})
	release()
	if err != nil {
		return 0, nil, err
	}
	inv := map[string]float64{}
	for k, v := range env.AgentMetrics("", rep.Agents) {
		if a, ok := strings.CutPrefix(k, "invalid/agent/"); ok {
			inv[a] = v
		}
	}
	return rep.AvgAtK, inv, nil
}

// sftWarmup trains each warm-up group on its demonstrations for warmup.steps AdamW steps of the
// token-mean NLL of the responses, and returns the mean loss of the first and the last step. Torch
// thread.
func sftWarmup(t *Team, models []*modelState, demos []env.Demo) (first, last float64, err error) {
	w := t.Config.Warmup
	type example struct{ prompt, response []int }
	perModel := map[string][]example{}
	groups, target := warmupGroups(t, models)
	byID := map[string]*modelState{}
	for _, ms := range models {
		byID[ms.id] = ms
	}
	for _, d := range demos {
		ms := byID[d.Model]
		p, err := ms.pol.EncodePrompt(d.Messages)
		if err != nil {
			return 0, 0, err
		}
		perModel[target[d.Model]] = append(perModel[target[d.Model]], example{p, ms.pol.EncodeResponse(d.Response)})
	}
	rng := rand.New(rand.NewPCG(uint64(t.Config.Run.Seed), 0x5f7))
	opts := map[string]*optim.AdamW{}
	for _, ms := range groups {
		if ms.pol.Model.Adapter() == nil && t.Config.IsFrozenBase(ms.id) {
			ms.pol.Model.Thaw() // trained here only: frozen again below
		}
		opts[ms.id] = optim.NewAdamW(ms.names, ms.params, optim.AdamWOptions{LR: w.LR, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
	}
	for step := 1; step <= w.Steps; step++ {
		var total, count float64
		for _, ms := range groups {
			ex := perModel[ms.id]
			if len(ex) == 0 {
				continue
			}
			batch := make([]policy.Sequence, w.BatchSize)
			for i := range batch {
				e := ex[rng.IntN(len(ex))]
				batch[i] = policy.Sequence{PromptIDs: e.prompt, ResponseIDs: e.response}
			}
			loss, err := sftStep(ms, batch, opts[ms.id])
			if err != nil {
				return 0, 0, err
			}
			total += loss
			count++
		}
		if count > 0 {
			if step == 1 {
				first = total / count
			}
			last = total / count
		}
	}
	for _, o := range opts {
		o.Free()
	}
	for _, ms := range groups {
		if t.Config.IsFrozenBase(ms.id) {
			ZeroGrad(ms.params)
			ms.pol.Model.Freeze()
		}
	}
	syncMasters(models)
	return first, last, nil
}

// syncMasters gives the RL optimizers' master copies (half dtypes, offload) the weights they step:
// after the warm-up changed them (and, sharded, after the shards were cut from them again).
func syncMasters(models []*modelState) {
	for _, ms := range models {
		ms.opt.SyncMaster()
	}
}
