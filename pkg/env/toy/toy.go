package toy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/drmas/drmas/pkg/env"
)

// Task names.
const (
	Math   = "toy-math"
	Search = "toy-search"
)

// Splits.
const (
	Train = "train"
	Val   = "val"
)

// Config holds a toy task's data settings (the `toy:` section). Decode YAML over Defaults.
type Config struct {
	// Task is toy-math or toy-search.
	Task string `mapstructure:"task"`
	// Seed fixes the data; train and val are drawn from different streams of it.
	Seed int64 `mapstructure:"seed"`
	// Train and Val are the number of questions in each split.
	Train int `mapstructure:"train"`
	Val   int `mapstructure:"val"`
	// Modulus (toy-math): answers are residues modulo it, one digit (2..10, default 10).
	Modulus int `mapstructure:"modulus"`
	// Ops (toy-math): the operators questions draw from, a subset of "+-*" (default "+-*").
	Ops string `mapstructure:"ops"`
	// OperandB (toy-math): the second operand is drawn from 0..OperandB−1 (0 = the modulus). Small
	// values make the task a near-copy that a tiny model learns fast: with 2, a+b is a or its successor.
	OperandB int `mapstructure:"operand_b"`
	// Keys (toy-search): size of the key space, keys a, b, c, … (1..26, default 8). A smaller space
	// makes a random query hit the needed fact more often (docs/toy-tasks.md).
	Keys int `mapstructure:"keys"`
	// Values (toy-search): size of the value alphabet, digits 0.. (2..10, default 10); the chance of a
	// blind answer is 1/Values.
	Values int `mapstructure:"values"`
}

// Defaults returns the default settings; Task is left empty.
func Defaults() Config {
	return Config{Seed: 1, Train: 2048, Val: 128, Modulus: 10, Ops: "+-*", Keys: 8, Values: 10}
}

// Validate checks the settings, naming the bad key under toy.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("toy.%s: "+format, append([]any{key}, args...)...))
	}
	if c.Task != Math && c.Task != Search {
		bad("task", "must be %q or %q (got %q)", Math, Search, c.Task)
	}
	if c.Train < 1 {
		bad("train", "must be ≥ 1 (got %d)", c.Train)
	}
	if c.Val < 1 {
		bad("val", "must be ≥ 1 (got %d)", c.Val)
	}
	if c.Modulus < 2 || c.Modulus > 10 {
		bad("modulus", "must be in [2, 10] so answers are one digit (got %d)", c.Modulus)
	}
	if c.OperandB < 0 || c.OperandB > c.Modulus {
		bad("operand_b", "must be in [0, modulus] (got %d)", c.OperandB)
	}
	if c.Ops == "" || strings.Trim(c.Ops, "+-*") != "" {
		bad("ops", "must be a non-empty subset of \"+-*\" (got %q)", c.Ops)
	}
	if c.Keys < 1 || c.Keys > 26 {
		bad("keys", "must be in [1, 26] (got %d)", c.Keys)
	}
	if c.Values < 2 || c.Values > 10 {
		bad("values", "must be in [2, 10] (got %d)", c.Values)
	}
	return errors.Join(errs...)
}

// Tasks generates one split of the configured task.
func Tasks(c Config, split string) ([]env.Task, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var n int
	var stream uint64
	switch split {
	case Train:
		n, stream = c.Train, 1
	case Val:
		n, stream = c.Val, 2
	default:
		return nil, fmt.Errorf("toy: unknown split %q (train or val)", split)
	}
	rng := rand.New(rand.NewPCG(uint64(c.Seed), stream))
	prefix := c.Task + "-" + split + "-"
	if c.Task == Math {
		nb := c.OperandB
		if nb == 0 {
			nb = c.Modulus
		}
		return mathTasks(rng, prefix, n, c.Modulus, nb, c.Ops), nil
	}
	return searchTasks(rng, prefix, n, c.Keys, c.Values), nil
}

// mathTasks draws questions "a∘b" with a < m and b < nb; the answer is the result modulo m.
func mathTasks(rng *rand.Rand, prefix string, n, m, nb int, ops string) []env.Task {
	out := make([]env.Task, n)
	for i := range out {
		a, b, op := rng.IntN(m), rng.IntN(nb), ops[rng.IntN(len(ops))]
		out[i] = env.Task{ID: prefix + strconv.Itoa(i), Question: fmt.Sprintf("%d%c%d", a, op, b),
			Answers: []string{strconv.Itoa(MathAnswer(a, op, b, m))}}
	}
	return out
}

// MathAnswer is (a op b) mod m as a residue in [0, m).
func MathAnswer(a int, op byte, b, m int) int {
	var v int
	switch op {
	case '+':
		v = a + b
	case '-':
		v = a - b
	case '*':
		v = a * b
	}
	return ((v % m) + m) % m
}

// searchTasks draws, per question, a value for every key; the question names one key ("c?"), its
// fact is the support and its value the answer.
func searchTasks(rng *rand.Rand, prefix string, n, keys, values int) []env.Task {
	out := make([]env.Task, n)
	for i := range out {
		facts := make([]string, keys)
		for k := range facts {
			facts[k] = Key(k) + "=" + strconv.Itoa(rng.IntN(values))
		}
		k := rng.IntN(keys)
		_, v, _ := strings.Cut(facts[k], "=")
		out[i] = env.Task{ID: prefix + strconv.Itoa(i), Question: Key(k) + "?", Answers: []string{v},
			Facts: facts, Support: []string{facts[k]}}
	}
	return out
}

// Key is the k-th key of toy-search: a, b, c, …
func Key(k int) string { return string(rune('a' + k)) }

// AddedTokens are the strings a toy tokenizer adds as single tokens: the orchestras' tags and the
// verdict words.
func AddedTokens() []string { return append(env.Tags(), env.Verdicts()...) }

// Alphabet holds every other character the toy prompts and responses use (role letters, keys,
// digits, operators, '=', '?', '}'), for a char-level tokenizer's base vocabulary.
const Alphabet = "abcdefghijklmnopqrstuvwxyzACPSV0123456789+-*=?}"

// Orchestra returns settings that give the task a real chance on a tiny model (docs/toy-tasks.md), for a
// config to start from: short toy prompts, responses of a few tokens, and for toy-search a
// curriculum (the needed fact injected into the team's context in half the episodes, and a first
// search forced in all, held for 30 iterations and annealed to 0 over 120, as configs/toy-search.yaml
// does) plus role rewards for the Verifier (its verdict matched whether the needed
// fact was in context, so it cannot settle on answering blind) and the Searcher (its retrieval hit
// the needed fact).
func Orchestra(task string) (env.OrchestraConfig, []env.AgentConfig, error) {
	o := env.DefaultOrchestraConfig()
	o.Prompts = env.PromptsToy
	samp := env.SamplingConfig{MaxNewTokens: 6}
	switch task {
	case Math:
		o.Type = "math"
		return o, []env.AgentConfig{
			{Name: "solver", Model: "small", Sampling: samp},
			{Name: "verifier", Model: "small", Sampling: samp},
		}, nil
	case Search:
		o.Type, o.MaxTurns, o.TopK = "search", 3, 1
		o.Curriculum = env.CurriculumConfig{
			Inject:      env.Ramp{P0: 0.5, Hold: 30, Decay: 120},
			ForceSearch: env.Ramp{P0: 1, Hold: 30, Decay: 120},
		}
		return o, []env.AgentConfig{
			{Name: "verifier", Model: "small", Sampling: samp, Reward: env.RewardConfig{RoleWeight: 0.5}},
			{Name: "searcher", Model: "small", Sampling: samp, Reward: env.RewardConfig{RoleWeight: 0.5}},
			{Name: "answerer", Model: "small", Sampling: samp},
		}, nil
	}
	return env.OrchestraConfig{}, nil, fmt.Errorf("toy: unknown task %q (%s or %s)", task, Math, Search)
}
