package plan

import (
	"fmt"
	"io"
	"strings"
)

// Write prints the plan as a table per device (drmas train --dry-run).
func (pl *Plan) Write(w io.Writer) error {
	var t table
	t.p("# memory plan: before anything is loaded (docs/memory-plan.md)\n")
	for _, d := range pl.Devices {
		t.p("# device %s: %s\n", d.Device, strings.Join(d.Models, ", "))
		for _, m := range pl.Models {
			if m.Device == d.Device {
				t.model(m)
			}
		}
		t.parts(pl, d)
		t.peak(d)
	}
	if len(pl.Prompts) > 0 {
		t.p("# prompts measured on the data (tokens, chat template included; data.max_prompt_length unset):\n")
	}
	for _, m := range pl.Prompts {
		bound := "unbounded"
		if m.Bound > 0 {
			bound = fmt.Sprint(m.Bound)
		}
		t.p("#   %s (%s): longest first-turn prompt %d, any turn %s (%s); response budget %d (max_new_tokens)\n",
			m.Agent, m.Model, m.FirstTurn, bound, m.Later, m.MaxNewTokens)
	}
	for _, n := range pl.Notes {
		t.p("# note: %s\n", n)
	}
	_, err := io.WriteString(w, t.b.String())
	return err
}

// table is the text of Plan.Write, built line by line.
type table struct{ b strings.Builder }

// p adds formatted text.
func (t *table) p(format string, a ...any) { fmt.Fprintf(&t.b, format, a...) }

// row adds one part of a device: its name, its bytes and a note.
func (t *table) row(name string, n int64, note string) {
	t.p("#   %-22s %11s  %s\n", name, Bytes(n), note)
}

// model adds a model's line: its size, micro-batch, sequence, checkpointing and rollout, and its
// role when it has one.
func (t *table) model(m Model) {
	ckpt := "off"
	if m.GradientCheckpointing {
		ckpt = "on"
	}
	rows := fmt.Sprintf("%d rows (%s)", m.RolloutRows, m.in.rowsFrom())
	if m.RolloutRows == 0 {
		rows = "remote engine"
	}
	if m.Base != "" {
		rows = "in its base's calls"
	}
	t.p("#   %s: %s params %s, micro-batch %d × (%d prompt + %d response) tokens, checkpointing %s, rollout %s\n",
		m.ID, count(m.Params), m.DType, m.MicroBatch, m.PromptTokens, m.ResponseTokens, ckpt, rows)
	if m.Role != "" {
		t.p("#     %s\n", m.Role)
	}
}

// parts adds a row per part the device holds (the optional ones only when it holds them).
func (t *table) parts(pl *Plan, d Device) {
	t.row("weights", d.Weights, weightsNote(pl))
	part := ""
	if pl.WorldSize > 1 && pl.Shard != "" && pl.Shard != "none" {
		part = fmt.Sprintf(", this rank's partition (dist.shard %s, %d ranks)", pl.Shard, pl.WorldSize)
	}
	gpart := ""
	if pl.Shard == "gradients" || pl.Shard == "parameters" {
		gpart = part
	}
	t.row("master weights", d.Master, "float32 copy for AdamW (half dtypes; every dtype offloaded)"+part)
	t.row("gradients", d.Gradients, "between updates"+gpart)
	t.row("optimizer state", d.Optimizer, "AdamW moments, float32"+part)
	if d.Ahead > 0 {
		t.row("rollouts ahead", d.Ahead, "host: the rollouts generated ahead of training (rollout.max_staleness), token ids, log-probs and text")
	}
	if d.Offloaded > 0 {
		t.row("offloaded optimizer", d.Offloaded, "host: float32 master weights and AdamW moments of models on other devices (models[].optim.offload)"+part)
	}
	if d.Reference > 0 {
		t.row("KL reference", d.Reference, "frozen copy of the weights")
	}
	t.row("activations", d.Activations, "one micro-batch, kept for backward")
	t.row("attention work space", d.Attention, "one tile of query rows, float32 (pkg/policy/attention.go)")
	t.row("logits chunk", d.Logits, "one chunk of response tokens' logits, float32")
	t.row("optimizer step", d.OptimStep, "AdamW's scratch for its largest parameter (after backward)")
	if d.Reduce > 0 {
		t.row("gradient reduction", d.Reduce, "data-parallel: all-reduce buffer, share accumulator, whole gradients in backward")
	}
	kv := "largest Generate call"
	for _, m := range pl.Models {
		if m.Device == d.Device && m.in.rows > 0 && m.Base == "" {
			kv += fmt.Sprintf("; %s: %d positions of %d layers (%s)", m.ID, m.in.kvPositions(), m.in.cfg.NumHiddenLayers, m.in.kvFrom())
		}
	}
	t.row("rollout KV cache", d.RolloutKV, kv)
	shardRows(t.row, pl, d)
	if d.DecodeCopy > 0 {
		t.row("decoding layout", d.DecodeCopy, "CPU copy of the weights during rollout")
	}
	if d.Held > 0 {
		t.row("heap held", d.Held, fmt.Sprintf("C heap kept until the trim after the update: update's %s + rollout's %s (tensors ≤ 32 MiB)", Bytes(d.UpdateHeap), Bytes(d.KVHeap+d.DecodeHeap)))
	}
	t.row("runtime", d.Overhead, "")
}

// peak adds the device's peak, what it is made of, and whether it fits the device's memory (with
// the fix the plan found when it does not).
func (t *table) peak(d Device) {
	ranks := ""
	if d.Ranks > 1 {
		ranks = fmt.Sprintf(" × %d ranks", d.Ranks)
	}
	held := ""
	if h := d.heldPhases(); h > 0 {
		held = fmt.Sprintf(", held + mapped %s", Bytes(h))
	}
	t.row("peak", d.PeakBytes, fmt.Sprintf("static + max(update %s, rollout %s%s) + runtime%s: the %s", Bytes(d.Update), Bytes(d.Rollout), held, ranks, d.phase()))
	switch {
	case d.Fits == nil:
		t.p("#   %-22s %11s  %s\n", "device memory", "?", d.CapacitySource)
	case *d.Fits:
		t.row("device memory", d.CapacityBytes, d.CapacitySource+": fits")
	default:
		fix := ""
		if d.Fix != "" {
			fix = "; fits with " + d.Fix
		}
		for _, a := range d.Alternatives {
			fix += ", or with " + a
		}
		t.row("device memory", d.CapacityBytes, d.CapacitySource+": DOES NOT FIT"+fix)
	}
}

// count formats a parameter count: 4.02B, 136.4M, 9.8K.
func count(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// weightsNote says what the weights row holds.
func weightsNote(pl *Plan) string {
	if pl.Shard == "parameters" && pl.WorldSize > 1 {
		return fmt.Sprintf("this rank's shards (dist.shard parameters, %d ranks)", pl.WorldSize)
	}
	return ""
}

// shardRows are the rows of parameter sharding: the update's gathered units, the rollout's, the load.
func shardRows(row func(string, int64, string), pl *Plan, d Device) {
	if d.Gathered > 0 {
		row("gathered units", d.Gathered, "dist.shard parameters: the root and one layer whole in the update, with gradients and the collective's copies")
	}
	if d.RolloutGathered > 0 {
		row("rollout's gathered", d.RolloutGathered, "dist.shard parameters: the weights the rollout gathers (dist.rollout_gather "+gatherMode(pl)+")")
	}
	if d.Load > 0 {
		row("load", d.Load, "dist.shard parameters: every model's shards and the largest whole model, as it is loaded and cut")
	}
}

// gatherMode is dist.rollout_gather as the plan took it.
func gatherMode(pl *Plan) string {
	for _, m := range pl.Models {
		if m.in.gatherWhole {
			return "model"
		}
	}
	return "unit"
}
