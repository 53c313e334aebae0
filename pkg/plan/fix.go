package plan

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
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
// every switch with each number, then every switch with two numbers. Among changes of one size the order of moves is the preference:
// those that cost time only (checkpointing, micro-batch, token budget, offload, sharding) before
// those that change the training (prompt and response lengths, batch size); data.max_prompt_length
// first when a model's prompts are bounded by its context alone (nothing measured them). It sets d.Fix,
// d.FixSets, d.FixPeak and d.Alternatives (the other fitting changes of the same size, at most three).
func (pl *Plan) fix(d *Device) {
	fs := fixSearch{pl: pl, d: d}
	for _, m := range pl.Models {
		if m.Device == d.Device {
			fs.models = append(fs.models, m)
		}
	}
	text := func(f fixFound) string {
		s := fmt.Sprintf("--set %s (peak %s", strings.Join(f.sets, " --set "), Bytes(f.peak))
		for _, set := range f.sets {
			if v, ok := strings.CutPrefix(set, boundKey+"="); ok {
				s += "; " + pl.promptCut(v)
			}
		}
		return s + ")"
	}
	for i, f := range fs.search(pl.moves(d, fs.models)) {
		switch {
		case i == 0:
			d.Fix, d.FixSets, d.FixPeak = text(f), f.sets, f.peak
		case len(d.Alternatives) < 3:
			d.Alternatives = append(d.Alternatives, text(f))
		}
	}
}

// fixSearch is the search for a change that makes device d of plan pl fit; models are the device's.
type fixSearch struct {
	pl     *Plan
	d      *Device
	models []Model
}

// fixFound is a change that fits: its --set arguments and the device's peak with it.
type fixFound struct {
	sets []string
	peak int64
}

// search returns the fitting changes of the smallest size, in order of preference: one move; else a
// switch and another move; else every switch and a number.
func (fs fixSearch) search(moves []*move) []fixFound {
	var switches []*move
	for _, mv := range moves {
		if mv.values == nil {
			switches = append(switches, mv)
		}
	}
	var level []fixFound
	for _, mv := range moves { // one move
		if f, ok := fs.try(nil, mv); ok {
			level = append(level, f)
		}
	}
	if len(level) == 0 { // a switch and another move
		for i, sw := range switches {
			for _, mv := range moves {
				if mv == sw || (mv.values == nil && slices.Index(switches, mv) < i) {
					continue
				}
				if f, ok := fs.try([]*move{sw}, mv); ok {
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
			if f, ok := fs.try(switches, mv); ok {
				level = append(level, f)
			}
		}
	}
	if len(level) == 0 { // every switch and two numbers (a rollout bound and a micro-batch, say)
		level = fs.pairs(switches, moves)
	}
	return level
}

// pairs tries every switch with two numbers, in the moves' order of preference: for each value of
// the first (largest first), the largest value of the second that fits; a pair's first fit is its
// change.
func (fs fixSearch) pairs(switches, moves []*move) []fixFound {
	var level []fixFound
	for i, a := range moves {
		if a.values == nil {
			continue
		}
		for _, b := range moves[i+1:] {
			if b.values == nil {
				continue
			}
			for _, va := range a.values {
				if f, ok := fs.tryWith(append(slices.Clone(switches), a), append(make([]int64, len(switches)), va), b); ok {
					level = append(level, f)
					break
				}
			}
		}
	}
	return level
}

// try finds, for fixed switches and one last move, the largest value of the last that fits.
func (fs fixSearch) try(fixed []*move, last *move) (fixFound, bool) {
	return fs.tryWith(fixed, make([]int64, len(fixed)), last)
}

// tryWith is try with the fixed moves at values fixedVals.
func (fs fixSearch) tryWith(fixed []*move, fixedVals []int64, last *move) (fixFound, bool) {
	ms := append(slices.Clone(fixed), last)
	vs := append(slices.Clone(fixedVals), 0)
	values := last.values
	if values == nil {
		values = []int64{0}
	}
	for _, v := range values {
		vs[len(vs)-1] = v
		if p, sets, ok := fs.peak(ms, vs); ok && p <= fs.d.CapacityBytes {
			return fixFound{sets, p}, true
		}
	}
	return fixFound{}, false
}

// peak is the device's peak with the moves applied (values vs), and their --set arguments; false
// when a move changes nothing at its value.
func (fs fixSearch) peak(ms []*move, vs []int64) (int64, []string, bool) {
	cp := make([]Model, len(fs.models))
	copy(cp, fs.models)
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
	for _, m := range fs.pl.Models { // the host also holds other devices' offloaded optimizer state
		if m.Device != fs.d.Device {
			all = append(all, m)
		}
	}
	dd := Device{Device: fs.d.Device, Ranks: fs.d.Ranks}
	dd.sum(all, fs.d.Ahead) // the rollouts ahead: no change the search tries moves them
	return dd.PeakBytes, sets, true
}

// trained says whether the model trains (a frozen base only holds weights and the rollout).
func (m *Model) trained() bool { return !m.in.frozen }

// reach is what the fix search can lower or switch on a device's models: the largest micro-batch,
// token budget, prompt and response lengths and training batch, the keys that set the first two, and
// whether a trained model lacks checkpointing or could offload its optimizer.
type reach struct {
	maxB, maxBudget, maxP, maxR, batch int64
	rows                               int64 // the most rows of generation in flight (a local rollout's)
	microKeys, budgetKeys              []string
	ckpt, offload                      bool
}

// reachOf is the reach of models.
func reachOf(models []Model) reach {
	var r reach
	for _, m := range models {
		if m.trained() {
			r.maxB = max(r.maxB, m.in.b)
			r.ckpt = r.ckpt || !m.in.checkpointing
			r.offload = r.offload || (!m.in.offload && !m.in.cpu)
			for _, k := range m.microKeys {
				if !slices.Contains(r.microKeys, k) {
					r.microKeys = append(r.microKeys, k)
				}
			}
			if m.budgetKey != "" && !slices.Contains(r.budgetKeys, m.budgetKey) {
				r.budgetKeys = append(r.budgetKeys, m.budgetKey)
			}
			r.maxBudget = max(r.maxBudget, m.in.budget)
		}
		r.maxP, r.maxR = max(r.maxP, m.in.p), max(r.maxR, m.in.r)
		if m.Base == "" && m.in.rows > 0 {
			r.rows = max(r.rows, m.in.inFlight())
		}
		if m.in.rows > 0 && m.in.batch*m.in.group > m.in.valRows {
			r.batch = max(r.batch, m.in.batch)
		}
	}
	return r
}

// moves are the changes the fix search tries on a device's models, in order of preference.
func (pl *Plan) moves(d *Device, models []Model) []*move {
	r := reachOf(models)
	var out []*move
	if r.ckpt {
		out = append(out, checkpointMove())
	}
	if r.maxB > 1 && r.maxBudget == 0 {
		out = append(out, microBatchMove(r.maxB, r.microKeys))
	}
	if r.maxBudget > 0 {
		out = append(out, budgetMove(r.maxBudget, r.budgetKeys))
	}
	if r.offload {
		out = append(out, offloadMove())
	}
	if pl.WorldSize > 1 {
		for _, sh := range []string{"optimizer", "gradients", "parameters"} {
			if pl.Shard == sh || (pl.Shard == "gradients" && sh == "optimizer") || (pl.Shard == "parameters" && sh != "parameters") {
				continue
			}
			out = append(out, shardMove(sh))
		}
	}
	if r.rows > 1 { // models[i].rollout.max_batch: generation's rows in flight (time only: continuous batching)
		out = append(out, maxBatchMove(r.rows))
	}
	if lo := max(64, pl.promptFloor); r.maxP > lo { // data.max_prompt_length: every agent's prompt bound becomes v (≥ the data's first turns)
		out = append(out, promptMove(r.maxP, lo))
	}
	if len(out) > 0 && r.maxP > 64 && slices.ContainsFunc(models, func(m Model) bool { return m.PromptBound == boundContext }) {
		// A prompt bound guessed from the context, not measured or chosen: bounding it comes first.
		out = append(out[len(out)-1:], out[:len(out)-1]...)
	}
	if r.maxR > 16 { // the agents' max_new_tokens
		out = append(out, responseMove(r.maxR))
	}
	if r.batch > 1 { // algorithm.batch_size: the training rollout's rows (validation's stay)
		out = append(out, batchMove(r.batch))
	}
	return out
}

// checkpointMove turns gradient checkpointing on for every trained model without it.
func checkpointMove() *move {
	return &move{apply: func(ms []Model, _ int64) ([]string, bool) {
		var sets []string
		for i := range ms {
			if ms[i].trained() && !ms[i].in.checkpointing {
				ms[i].in.checkpointing = true
				sets = append(sets, fmt.Sprintf("models.%d.gradient_checkpointing=true", ms[i].Index))
			}
		}
		return sets, len(sets) > 0
	}}
}

// microBatchMove lowers the micro-batch (set by keys) in halves from maxB/2.
func microBatchMove(maxB int64, keys []string) *move {
	return &move{values: halves(maxB/2, 1), apply: func(ms []Model, v int64) ([]string, bool) {
		for i := range ms {
			ms[i].in.b = min(ms[i].in.b, v)
		}
		return assign(keys, v), true
	}}
}

// budgetMove lowers the token budget per micro-batch (set by keys) in halves from maxBudget/2.
func budgetMove(maxBudget int64, keys []string) *move {
	return &move{values: halves(maxBudget/2, 64), apply: func(ms []Model, v int64) ([]string, bool) {
		for i := range ms {
			if ms[i].in.budget > 0 {
				ms[i].in.budget = min(ms[i].in.budget, v)
			}
		}
		return assign(keys, v), true
	}}
}

// offloadMove moves the optimizer state of every trained model off a GPU to the host.
func offloadMove() *move {
	return &move{apply: func(ms []Model, _ int64) ([]string, bool) {
		var sets []string
		for i := range ms {
			if ms[i].trained() && !ms[i].in.offload && !ms[i].in.cpu {
				ms[i].in.offload = true
				sets = append(sets, fmt.Sprintf("models.%d.optim.offload=cpu", ms[i].Index))
			}
		}
		return sets, len(sets) > 0
	}}
}

// shardMove sets dist.shard to sh.
func shardMove(sh string) *move {
	return &move{apply: func(ms []Model, _ int64) ([]string, bool) {
		for i := range ms {
			ms[i].in.shard = sh
		}
		return []string{"dist.shard=" + sh}, true
	}}
}

// maxBatchMove bounds the rows of local generation in flight (models[i].rollout.max_batch) in halves
// from rows/2: continuous batching runs the same rollout in more steps.
func maxBatchMove(rows int64) *move {
	return &move{values: halves(rows/2, 1), apply: func(ms []Model, v int64) ([]string, bool) {
		var sets []string
		for i := range ms {
			if ms[i].Base == "" && ms[i].in.rows > 0 && ms[i].in.inFlight() > v {
				ms[i].in.maxBatch = v
				sets = append(sets, fmt.Sprintf("models.%d.rollout.max_batch=%d", ms[i].Index, v))
			}
		}
		return sets, len(sets) > 0
	}}
}

// promptMove lowers data.max_prompt_length in halves from below maxP down to lo.
func promptMove(maxP, lo int64) *move {
	return &move{values: halves(pow2Below(maxP), lo), apply: func(ms []Model, v int64) ([]string, bool) {
		for i := range ms {
			ms[i].in.t, ms[i].in.p = v+ms[i].in.r, v
		}
		return []string{fmt.Sprintf("%s=%d", boundKey, v)}, true
	}}
}

// responseMove lowers the max_new_tokens of the models' agents in halves from below maxR.
func responseMove(maxR int64) *move {
	return &move{values: halves(pow2Below(maxR), 16), apply: func(ms []Model, v int64) ([]string, bool) {
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
	}}
}

// batchMove lowers algorithm.batch_size in halves from batch/2: the training rollout's rows
// (validation's stay).
func batchMove(batch int64) *move {
	return &move{values: halves(batch/2, 1), apply: func(ms []Model, v int64) ([]string, bool) {
		for i := range ms {
			if in := &ms[i].in; in.rows > 0 && in.group > 0 {
				in.rows = max(v*in.group, in.valRows)
			}
		}
		return []string{fmt.Sprintf("algorithm.batch_size=%d", v)}, true
	}}
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

// promptCut says what data.max_prompt_length=v cuts, from the prompts measured on the data: the
// first turns longer (records refused at load, or skipped with data.filter_overlong_prompts) and the
// later turns longer (overlong calls: invalid, nothing generated, rollout/overlong_calls).
func (pl *Plan) promptCut(v string) string {
	n, _ := strconv.Atoi(v)
	if len(pl.Prompts) == 0 {
		return fmt.Sprintf("a prompt over %d tokens is cut: a record's first turn refused at load (skipped with data.filter_overlong_prompts), a later turn an overlong call, invalid with nothing generated", n)
	}
	var parts []string
	for _, m := range pl.Prompts {
		s := fmt.Sprintf("%s's first turns (up to %d tokens) ", m.Agent, m.FirstTurn)
		if m.FirstTurn > n {
			s += "over it: their records refused at load (skipped with data.filter_overlong_prompts)"
		} else {
			s += "fit"
		}
		switch {
		case m.Bound == 0:
			s += ", later turns (unbounded: documents, tool results) over it become overlong calls"
		case m.Bound > n && m.Bound > m.FirstTurn:
			s += fmt.Sprintf(", later turns (up to %d) over it become overlong calls", m.Bound)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ") + " (an overlong call is invalid with nothing generated: rollout/overlong_calls)"
}
