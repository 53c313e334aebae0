package arch

import (
	"fmt"
	"slices"
	"strings"
)

// ExpandTargets checks target module names and returns them in LoRAModules order, "all-linear"
// standing for every projection (not embed_tokens or lm_head, as in PEFT).
func ExpandTargets(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("target_modules: none given (want %s or some of %s)", LoRAAllLinear, strings.Join(LoRAModules, ", "))
	}
	want := map[string]bool{}
	for _, n := range names {
		switch {
		case n == LoRAAllLinear:
			for _, p := range LoRATargets {
				want[p] = true
			}
		case slices.Contains(LoRAModules, n):
			want[n] = true
		default:
			return nil, fmt.Errorf("target_modules: %q is not a module an adapter can target (want %s or some of %s)", n, LoRAAllLinear, strings.Join(LoRAModules, ", "))
		}
	}
	var out []string
	for _, p := range LoRAModules {
		if want[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// LoRAShapes lists the element counts of the A and B tensors of an adapter of rank r on the given
// targets of a model of configuration c (for memory plans), without building anything. In a
// mixture-of-experts layer, gate_proj, up_proj and down_proj stand for every expert's (PEFT matches
// target_modules by the module's last name, mlp.experts.{j}.gate_proj included); the router
// (mlp.gate) is never adapted.
func LoRAShapes(c Config, r int, targets []string) ([]int64, error) {
	t, err := ExpandTargets(targets)
	if err != nil {
		return nil, err
	}
	c.FillDefaults()
	o := OptionsOf(c)
	q, kv := o.Heads*o.HeadDim, o.KVHeads*o.HeadDim
	var out []int64
	for l := range c.NumHiddenLayers {
		inter, copies := o.Inter, int64(1)
		if o.MoE.SparseLayer(l) {
			inter, copies = o.MoE.Inter, o.MoE.Experts
		}
		dims := map[string][2]int64{"q_proj": {o.Hidden, q}, "k_proj": {o.Hidden, kv}, "v_proj": {o.Hidden, kv}, "o_proj": {q, o.Hidden},
			"gate_proj": {o.Hidden, inter}, "up_proj": {o.Hidden, inter}, "down_proj": {inter, o.Hidden}}
		for _, p := range t {
			d, ok := dims[p]
			if !ok {
				continue
			}
			n := int64(1)
			if p == "gate_proj" || p == "up_proj" || p == "down_proj" {
				n = copies
			}
			for range n {
				out = append(out, int64(r)*d[0], int64(r)*d[1])
			}
		}
	}
	outer := map[string][2]int64{LoRAEmbed: {o.Vocab, o.Hidden}, LoRAHead: {o.Hidden, o.Vocab}}
	for _, p := range t {
		if d, ok := outer[p]; ok {
			out = append(out, int64(r)*d[0], int64(r)*d[1])
		}
	}
	return out, nil
}

// LoRAParams is the number of adapter parameters of rank r on the given targets of a model of
// configuration c (the sum of LoRAShapes).
func LoRAParams(c Config, r int, targets []string) (int64, error) {
	sizes, err := LoRAShapes(c, r, targets)
	var n int64
	for _, s := range sizes {
		n += s
	}
	return n, err
}
