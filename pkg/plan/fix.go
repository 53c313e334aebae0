package plan

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A move is one change of config keys that the search for a fitting plan tries on the models of a
// device: a switch (gradient checkpointing, optimizer offload, sharding) or a number lowered in
// halves (micro-batch, token budget, prompt and response lengths, batch size). apply changes the
// inputs of the device's models for value v (0 for a switch) and returns the --set arguments
// that make that change; false when the move changes nothing at v.
type move struct {
	values []int64 // nil: a switch; else the values to try, largest first
	apply  func(ms []Model, v int64) ([]string, bool)
}

// fix looks for the smallest change of the keys the refusal lists that makes the device fit: each
// move alone first (the largest value of a number that fits), then a switch with another move, then
// every switch with each number. Among changes of one size the order of moves is the preference:
// those that cost time only (checkpointing, micro-batch, token budget, offload, sharding) before
// those that change the training (prompt and response lengths, batch size); data.max_prompt_length
// first when a model's prompts are bounded by its context alone (nothing measured them). It sets d.Fix,
// d.FixSets, d.FixPeak and d.Alternatives (the other fitting changes of the same size, at most three).
func (pl *Plan) fix(d *Device) {
	var models []Model
	for _, m := range pl.Models {
		if m.Device == d.Device {
			models = append(models, m)
		}
	}
	moves := pl.moves(d, models)
	// peak is the device's peak with the moves applied (values vs), and their --set arguments.
	peak := func(ms []*move, vs []int64) (int64, []string, bool) {
		cp := make([]Model, len(models))
		copy(cp, models)
		var sets []string
		for k, mv := range ms {
			s, ok := mv.apply(cp, vs[k])
			if !ok {
				return 0, nil, false
			}
			sets = append(sets, s...)
		}
		all := slices.Clone(cp)
		for i := range all {
			all[i].Parts = all[i].in.share()
		}
		for _, m := range pl.Models { // the host also holds other devices' offloaded optimizer state
			if m.Device != d.Device {
				all = append(all, m)
			}
		}
		dd := Device{Device: d.Device, Ranks: d.Ranks}
		dd.sum(all, d.Ahead) // the rollouts ahead: no change the search tries moves them
		return dd.PeakBytes, sets, true
	}
	type found struct {
		sets []string
		peak int64
	}
	// try finds, for fixed moves and one last move, the largest value of the last that fits.
	try := func(fixed []*move, last *move) (found, bool) {
		ms := append(slices.Clone(fixed), last)
		vs := make([]int64, len(ms))
		values := last.values
		if values == nil {
			values = []int64{0}
		}
		for _, v := range values {
			vs[len(vs)-1] = v
			if p, sets, ok := peak(ms, vs); ok && p <= d.CapacityBytes {
				return found{sets, p}, true
			}
		}
		return found{}, false
	}
	var switches []*move
	for _, mv := range moves {
		if mv.values == nil {
			switches = append(switches, mv)
		}
	}
	var level []found
	for _, mv := range moves { // one move
		if f, ok := try(nil, mv); ok {
			level = append(level, f)
		}
	}
	if len(level) == 0 { // a switch and another move
		for i, sw := range switches {
			for _, mv := range moves {
				if mv == sw || (mv.values == nil && slices.Index(switches, mv) < i) {
					continue
				}
				if f, ok := try([]*move{sw}, mv); ok {
					level = append(level, f)
				}
			}
		}
	}
	if len(level) == 0 && len(switches) > 1 { // every switch and a number
		for _, mv := range moves {
			if mv.values == nil {
				continue
			}
			if f, ok := try(switches, mv); ok {
				level = append(level, f)
			}
		}
	}
	text := func(f found) string {
		return fmt.Sprintf("--set %s (peak %s)", strings.Join(f.sets, " --set "), Bytes(f.peak))
	}
	for i, f := range level {
		switch {
		case i == 0:
			d.Fix, d.FixSets, d.FixPeak = text(f), f.sets, f.peak
		case len(d.Alternatives) < 3:
			d.Alternatives = append(d.Alternatives, text(f))
		}
	}
}

// moves are the changes the fix search tries on a device's models, in order of preference.
func (pl *Plan) moves(d *Device, models []Model) []*move {
	trained := func(m *Model) bool { return !m.in.frozen }
	var maxB, maxBudget, maxP, maxR, batch int64
	var microKeys, budgetKeys []string
	ckpt, offload := false, false
	for _, m := range models {
		if trained(&m) {
			maxB = max(maxB, m.in.b)
			ckpt = ckpt || !m.in.checkpointing
			offload = offload || (!m.in.offload && !m.in.cpu)
			for _, k := range m.microKeys {
				if !slices.Contains(microKeys, k) {
					microKeys = append(microKeys, k)
				}
			}
			if m.budgetKey != "" && !slices.Contains(budgetKeys, m.budgetKey) {
				budgetKeys = append(budgetKeys, m.budgetKey)
			}
			maxBudget = max(maxBudget, m.in.budget)
		}
		maxP, maxR = max(maxP, m.in.p), max(maxR, m.in.r)
		if m.in.rows > 0 && m.in.batch*m.in.group > m.in.valRows {
			batch = max(batch, m.in.batch)
		}
	}
	var out []*move
	if ckpt {
		out = append(out, &move{apply: func(ms []Model, _ int64) ([]string, bool) {
			var sets []string
			for i := range ms {
				if trained(&ms[i]) && !ms[i].in.checkpointing {
					ms[i].in.checkpointing = true
					sets = append(sets, fmt.Sprintf("models.%d.gradient_checkpointing=true", ms[i].Index))
				}
			}
			return sets, len(sets) > 0
		}})
	}
	if maxB > 1 && maxBudget == 0 {
		out = append(out, &move{values: halves(maxB/2, 1), apply: func(ms []Model, v int64) ([]string, bool) {
			for i := range ms {
				ms[i].in.b = min(ms[i].in.b, v)
			}
			return assign(microKeys, v), true
		}})
	}
	if maxBudget > 0 {
		out = append(out, &move{values: halves(maxBudget/2, 64), apply: func(ms []Model, v int64) ([]string, bool) {
			for i := range ms {
				if ms[i].in.budget > 0 {
					ms[i].in.budget = min(ms[i].in.budget, v)
				}
			}
			return assign(budgetKeys, v), true
		}})
	}
	if offload {
		out = append(out, &move{apply: func(ms []Model, _ int64) ([]string, bool) {
			var sets []string
			for i := range ms {
				if trained(&ms[i]) && !ms[i].in.offload && !ms[i].in.cpu {
					ms[i].in.offload = true
					sets = append(sets, fmt.Sprintf("models.%d.optim.offload=cpu", ms[i].Index))
				}
			}
			return sets, len(sets) > 0
		}})
	}
	if pl.WorldSize > 1 {
		for _, sh := range []string{"optimizer", "gradients", "parameters"} {
			if pl.Shard == sh || (pl.Shard == "gradients" && sh == "optimizer") || (pl.Shard == "parameters" && sh != "parameters") {
				continue
			}
			out = append(out, &move{apply: func(ms []Model, _ int64) ([]string, bool) {
				for i := range ms {
					ms[i].in.shard = sh
				}
				return []string{"dist.shard=" + sh}, true
			}})
		}
	}
	if lo := max(64, pl.promptFloor); maxP > lo { // data.max_prompt_length: every agent's prompt bound becomes v (≥ the data's first turns)
		out = append(out, &move{values: halves(pow2Below(maxP), lo), apply: func(ms []Model, v int64) ([]string, bool) {
			for i := range ms {
				ms[i].in.t, ms[i].in.p = v+ms[i].in.r, v
			}
			return []string{fmt.Sprintf("%s=%d", boundKey, v)}, true
		}})
	}
	if len(out) > 0 && maxP > 64 && slices.ContainsFunc(models, func(m Model) bool { return m.PromptBound == boundContext }) {
		// A prompt bound guessed from the context, not measured or chosen: bounding it comes first.
		out = append(out[len(out)-1:], out[:len(out)-1]...)
	}
	if maxR > 16 { // the agents' max_new_tokens
		out = append(out, &move{values: halves(pow2Below(maxR), 16), apply: func(ms []Model, v int64) ([]string, bool) {
			var agents []int
			for i := range ms {
				in := &ms[i].in
				if in.r > v {
					in.t, in.r = min(in.t, in.p+v), v
				}
				for _, j := range in.agents {
					if !slices.Contains(agents, j) {
						agents = append(agents, j)
					}
				}
			}
			slices.Sort(agents)
			var keys []string
			for _, j := range agents {
				keys = append(keys, fmt.Sprintf("agents[%d].sampling.max_new_tokens", j))
			}
			return assign(keys, v), true
		}})
	}
	if batch > 1 { // algorithm.batch_size: the training rollout's rows (validation's stay)
		out = append(out, &move{values: halves(batch/2, 1), apply: func(ms []Model, v int64) ([]string, bool) {
			for i := range ms {
				if in := &ms[i].in; in.rows > 0 && in.group > 0 {
					in.rows = max(v*in.group, in.valRows)
				}
			}
			return []string{fmt.Sprintf("algorithm.batch_size=%d", v)}, true
		}})
	}
	return out
}

// halves is from, from/2, … down to lo (from first; nothing when from < lo).
func halves(from, lo int64) []int64 {
	var out []int64
	for v := from; v >= lo; v /= 2 {
		out = append(out, v)
		if v == lo {
			break
		}
	}
	return out
}

// pow2Below is the largest power of two below n (1 for n ≤ 1).
func pow2Below(n int64) int64 {
	p := int64(1)
	for p*2 < n {
		p *= 2
	}
	return p
}

var keyIndex = regexp.MustCompile(`\[(\d+)\]`)

// assign writes key=v for each key in --set syntax (agents[1].x is agents.1.x).
func assign(keys []string, v int64) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%s=%d", keyIndex.ReplaceAllString(k, ".$1"), v)
	}
	return out
}
