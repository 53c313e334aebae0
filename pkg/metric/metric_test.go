package metric

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docKeys reads the key column of the metrics.jsonl table of docs/contracts.md, every `{x,y}`
// expanded.
func docKeys(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/contracts.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## metrics.jsonl\n")
	if !ok {
		t.Fatal("docs/contracts.md: no metrics.jsonl section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	code := regexp.MustCompile("`([^`]+)`")
	var keys []string
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.TrimSpace(cells[1]) == "key" || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			keys = append(keys, expand(m[1])...)
		}
	}
	if len(keys) == 0 {
		t.Fatal("docs/contracts.md: no keys in the metrics.jsonl table")
	}
	return keys
}

// expand expands each {x,y,…} of a pattern.
func expand(p string) []string {
	open := strings.IndexByte(p, '{')
	if open < 0 {
		return []string{p}
	}
	end := strings.IndexByte(p[open:], '}') + open
	var out []string
	for _, alt := range strings.Split(p[open+1:end], ",") {
		out = append(out, expand(p[:open]+alt+p[end+1:])...)
	}
	return out
}

// covers reports whether the documented key d names the table's key k: the same, or d a prefix
// wildcard ("time/*") k falls under.
func covers(d, k string) bool {
	if prefix, ok := strings.CutSuffix(d, "*"); ok {
		return strings.HasPrefix(k, prefix)
	}
	return d == k
}

// The documentation lists every key of the table, and the table every documented key.
func TestFamiliesMatchContractsDoc(t *testing.T) {
	doc, table := docKeys(t), Families()
	for _, k := range table {
		if !slices.ContainsFunc(doc, func(d string) bool { return covers(d, k) }) {
			t.Errorf("key %s of the table is not in docs/contracts.md", k)
		}
	}
	for _, d := range doc {
		if !slices.ContainsFunc(table, func(k string) bool { return covers(d, k) }) {
			t.Errorf("docs/contracts.md documents %s, which is not in the table (pkg/metric)", d)
		}
	}
	for i, k := range table {
		if slices.Contains(table[:i], k) {
			t.Errorf("key %s twice in the table", k)
		}
	}
}

func TestBuilders(t *testing.T) {
	for got, want := range map[string]string{
		GradNormAgent("searcher"):   "grad_norm/agent/searcher",
		GradNormAgent(""):           "grad_norm/agent/",
		AdvMaxAgent("v"):            "adv/agent/v/max",
		PerModel(LossPG, "m1"):      "loss/pg/m1",
		LogprobDiffMeanModel("m1"):  "rollout/logprob_diff/m1/mean",
		ValAvgAt(4):                 "val/avg@4",
		ValDatasetPassAt("math", 4): "val/math/pass@4",
		Val(CallsAgent("solver")):   "val/calls/agent/solver",
		GuardNonfiniteAgent("a"):    "guard/nonfinite/agent/a",
		EnergyRatioAgent("a"):       "adv_energy_ratio/agent/a",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}
