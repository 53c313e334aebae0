package inspect

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"

	"github.com/drmas/drmas/pkg/jsonl"
	"github.com/drmas/drmas/pkg/metric"
	"go.yaml.in/yaml/v3"
)

// MetricsFile is the name of the metrics file inside a run directory.
const MetricsFile = "metrics.jsonl"

// ConfigFile is the name of the resolved config inside a run directory; the agent → model map is read from it.
const ConfigFile = "config.yaml"

// The key families of metrics.jsonl that this package reads (pkg/metric's table): the agent or model
// id follows the prefix.
var (
	keyGradAgent = metric.GradNormAgent("")
	keyGradModel = metric.GradNormModel("")
	keyNonfinite = metric.NonfiniteModel("")
	keyInflation = metric.InflationAgent("")
	keyEnergy    = metric.EnergyRatioAgent("")
	keySigma     = strings.TrimSuffix(metric.AdvStdDistAgent("", ""), "/") // then <a>/<stat>
	keyAbsAdv    = strings.TrimSuffix(metric.AdvNormAgent("", ""), "/")    // then <a>/<stat>
)

const maxLineWarning = 80 // characters of a bad line quoted in its warning

// Series is one metric over a run's iterations: Values[i] was logged at Steps[i]. A value that is not
// finite (JSON null in the file) is NaN. Steps without the key are absent, not NaN.
type Series struct {
	Steps  []int
	Values []float64
}

// Run is one training run's metrics, deduplicated by step and sorted by step.
type Run struct {
	Label  string // the run directory's name unless set otherwise
	File   string // the metrics.jsonl read
	Config string // the config.yaml read, "" when there was none

	// AgentModel maps an agent to the model id it trains, from the config's agents: [{name, model}];
	// nil when unknown.
	AgentModel map[string]string
	// Normalization is the config's algorithm.normalization (grpo, drmas, or "mean=…,std=…,weighting=…");
	// "" when unknown.
	Normalization string

	Steps     []int             // every row's step, ascending
	GradAgent map[string]Series // grad_norm/agent/<a>: pre-clip norm, max over the iteration's optimizer steps
	GradModel map[string]Series // grad_norm/model/<id>
	Nonfinite map[string]Series // nonfinite/model/<id>: optimizer steps skipped for a non-finite norm
	Inflation map[string]Series // inflation/agent/<a>: the Lemma 4.2 factor
	Energy    map[string]Series // adv_energy_ratio/agent/<a>: ΣA²(GRPO)/ΣA²(Dr. MAS) on each rollout
	// Sigma and AbsAdv are the σ_k diagnostics, by "<a>/<stat>": adv_std/agent/<a>/<stat> (σ_k over the
	// agent's (uid, agent) groups) and adv_norm/agent/<a>/<stat> (|A| over its calls).
	Sigma, AbsAdv map[string]Series
	Lines         int // lines in the file, blank ones included
	Malformed     int // lines skipped as malformed or truncated
	Duplicates    int // rows dropped because a later row had the same step
}

// Agents returns the agents found in the run (grad_norm/agent or inflation/agent keys), sorted.
func (r *Run) Agents() []string { return sortedKeys(r.GradAgent, r.Inflation) }

// Models returns the model ids found in the run (grad_norm/model or nonfinite/model keys), sorted.
func (r *Run) Models() []string { return sortedKeys(r.GradModel, r.Nonfinite) }

// Warning is a problem in a metrics or config file that was skipped over.
type Warning struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"` // 1-based; 0 when the warning is about no single line
	Message string `json:"message"`
}

// String gives the warning as "file:line: message" (or "file: message").
func (w Warning) String() string {
	if w.Line == 0 {
		return w.File + ": " + w.Message
	}
	return fmt.Sprintf("%s:%d: %s", w.File, w.Line, w.Message)
}

// ReadMetrics reads a run: path is a run directory holding metrics.jsonl (and, optionally, config.yaml)
// or a metrics file itself (config.yaml is then looked for beside it). The label is the directory's name
// (a file not named metrics.jsonl gives its own name, less the extension).
//
// Lines that are not a JSON object with an integer "step" (malformed, or truncated by a crash mid-write)
// are skipped with a warning naming the line; so is a value of a read key that is neither a number nor
// null. When a step repeats (a resumed run whose rows were not dropped) the last row wins, with a warning.
// Only a file that cannot be opened or read is an error.
func ReadMetrics(path string) (*Run, []Warning, error) {
	file, dir, err := metricsPath(path)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("run %s: %w", path, err)
	}
	defer f.Close()
	run, warns, err := parseMetrics(f, file)
	if err != nil {
		return nil, nil, err
	}
	run.Label = runLabel(file)
	if cfg := filepath.Join(dir, ConfigFile); fileExists(cfg) {
		run.Config = cfg
		if w := readConfig(run, cfg); w != nil {
			warns = append(warns, *w)
		}
	}
	if len(run.Steps) == 0 {
		warns = append(warns, Warning{File: file, Message: "no metrics rows"})
	}
	return run, warns, nil
}

// metricsPath is the metrics file of a run (path: its directory, holding MetricsFile, or the file
// itself) and the directory the file is in.
func metricsPath(path string) (file, dir string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("run %s: %w", path, err)
	}
	if st.IsDir() {
		return filepath.Join(path, MetricsFile), path, nil
	}
	return path, filepath.Dir(path), nil
}

func runLabel(file string) string {
	abs, err := filepath.Abs(file)
	if err != nil {
		abs = file
	}
	if base := filepath.Base(abs); base != MetricsFile {
		return strings.TrimSuffix(base, filepath.Ext(base))
	}
	return filepath.Base(filepath.Dir(abs))
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
}

// row is the part of one metrics line that this package keeps.
type row struct {
	step int
	line int
	vals map[string]float64 // read keys only; NaN = not finite
}

// parseMetrics reads metrics lines from r; name is used in warnings.
func parseMetrics(r io.Reader, name string) (*Run, []Warning, error) {
	run := &Run{File: name}
	rr := &rowReader{file: name, keep: readKey}
	rr.repeated = func(rw, earlier row) {
		run.Duplicates++
		rr.warn(rw.line, "step %d repeats line %d; keeping this one (a resumed run whose later rows were not dropped?)",
			rw.step, earlier.line)
	}
	lines, err := jsonl.Read(r, name, rr.line)
	if err != nil {
		return nil, nil, err
	}
	run.Lines, run.Malformed = lines, rr.malformed
	run.GradAgent, run.GradModel = map[string]Series{}, map[string]Series{}
	run.Nonfinite, run.Inflation, run.Energy = map[string]Series{}, map[string]Series{}, map[string]Series{}
	run.Sigma, run.AbsAdv = map[string]Series{}, map[string]Series{}
	for _, rw := range rr.sorted() {
		run.Steps = append(run.Steps, rw.step)
		for key, v := range rw.vals {
			m, id := run.seriesFor(key)
			s := m[id]
			s.Steps = append(s.Steps, rw.step)
			s.Values = append(s.Values, v)
			m[id] = s
		}
	}
	return run, rr.warns, nil
}

// rowReader keeps the rows of a metrics file's lines (line is jsonl's callback), each with the keys
// keep says. A line that is not a row is skipped with a warning (counted in malformed), and so is a
// kept key whose value is neither a number nor null; a row whose step repeats an earlier row's
// replaces it, repeated (when set) told of it.
type rowReader struct {
	file      string
	keep      func(key string) bool
	repeated  func(rw, earlier row)
	rows      []row
	at        map[int]int // step → index in rows
	warns     []Warning
	malformed int
}

func (rr *rowReader) warn(line int, format string, args ...any) {
	rr.warns = append(rr.warns, Warning{File: rr.file, Line: line, Message: fmt.Sprintf(format, args...)})
}

func (rr *rowReader) line(l jsonl.Line) error {
	rw, bad, msg := parseRowKeys(l.Text, rr.keep)
	if msg != "" {
		rr.malformed++
		if l.Unterminated && !json.Valid(l.Text) {
			msg = "truncated line (no newline at the end of the file and incomplete JSON)"
		}
		rr.warn(l.N, "skipped: %s: %s", msg, excerpt(l.Text))
		return nil
	}
	rw.line = l.N
	for _, key := range bad {
		rr.warn(l.N, "key %q: want a number or null; value ignored", key)
	}
	if i, dup := rr.at[rw.step]; dup {
		if rr.repeated != nil {
			rr.repeated(rw, rr.rows[i])
		}
		rr.rows[i] = rw
		return nil
	}
	if rr.at == nil {
		rr.at = map[int]int{}
	}
	rr.at[rw.step] = len(rr.rows)
	rr.rows = append(rr.rows, rw)
	return nil
}

// sorted returns the rows in order of their steps.
func (rr *rowReader) sorted() []row {
	sort.SliceStable(rr.rows, func(i, j int) bool { return rr.rows[i].step < rr.rows[j].step })
	return rr.rows
}

// seriesFor returns the map and id that key belongs to, or nil.
func (r *Run) seriesFor(key string) (map[string]Series, string) {
	for _, p := range []struct {
		prefix string
		m      map[string]Series
	}{{keyGradAgent, r.GradAgent}, {keyGradModel, r.GradModel}, {keyNonfinite, r.Nonfinite}, {keyInflation, r.Inflation}, {keyEnergy, r.Energy},
		{keySigma, r.Sigma}, {keyAbsAdv, r.AbsAdv}} {
		if id, ok := strings.CutPrefix(key, p.prefix); ok && id != "" {
			return p.m, id
		}
	}
	return nil, ""
}

// parseRow parses one non-blank line, keeping the keys this package reads; it returns the keys whose
// values were neither a number nor null (sorted), and msg says why the line is malformed, "" when it
// is not.
func parseRow(line []byte) (rw row, bad []string, msg string) { return parseRowKeys(line, readKey) }

// parseRowKeys is parseRow keeping the keys keep says.
func parseRowKeys(line []byte, keep func(string) bool) (rw row, bad []string, msg string) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return rw, nil, "not a JSON object"
		}
		return rw, nil, "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: ")
	}
	rawStep, ok := obj[metric.Step]
	if !ok {
		return rw, nil, `no "step"`
	}
	var step float64
	if err := json.Unmarshal(rawStep, &step); err != nil || step != math.Trunc(step) || math.Abs(step) > 1<<53 {
		return rw, nil, fmt.Sprintf(`"step" is %s, want an integer`, rawStep)
	}
	rw = row{step: int(step), vals: map[string]float64{}}
	for key, raw := range obj {
		if !keep(key) {
			continue
		}
		if v, ok := number(raw); ok {
			rw.vals[key] = v
		} else {
			bad = append(bad, key)
		}
	}
	sort.Strings(bad)
	return rw, bad, ""
}

func readKey(key string) bool {
	for _, p := range []string{keyGradAgent, keyGradModel, keyNonfinite, keyInflation, keyEnergy, keySigma, keyAbsAdv} {
		if strings.HasPrefix(key, p) && len(key) > len(p) {
			return true
		}
	}
	return false
}

// number decodes a metric value: a JSON number, or null (the trainer's non-finite value) as NaN. The
// strings "NaN", "Infinity", "-Infinity", "inf" … that other writers use are also taken as non-finite.
func number(raw json.RawMessage) (float64, bool) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, false
	}
	switch v := v.(type) {
	case nil:
		return math.NaN(), true
	case float64:
		return v, true
	case string:
		switch strings.ToLower(strings.TrimLeft(v, "+-")) {
		case "nan", "inf", "infinity":
			return math.NaN(), true
		}
	}
	return 0, false
}

// excerpt returns the start of a bad line for its warning, unprintable characters replaced.
func excerpt(line []byte) string {
	s := strings.ToValidUTF8(string(line), "?")
	if r := []rune(s); len(r) > maxLineWarning {
		s = string(r[:maxLineWarning]) + "…"
	}
	return strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

// runConfig is the part of a resolved config.yaml that the report uses; other keys are ignored.
type runConfig struct {
	Agents []struct {
		Name  string `yaml:"name"`
		Model string `yaml:"model"`
	} `yaml:"agents"`
	Algorithm struct {
		Normalization yaml.Node `yaml:"normalization"`
	} `yaml:"algorithm"`
}

// readConfig fills run's agent → model map and normalization from a config.yaml; a problem is a warning.
func readConfig(run *Run, path string) *Warning {
	data, err := os.ReadFile(path)
	if err != nil {
		return &Warning{File: path, Message: fmt.Sprintf("not read: %v", err)}
	}
	var cfg runConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return &Warning{File: path, Message: fmt.Sprintf("not read (agent → model map unknown): %v", err)}
	}
	for _, a := range cfg.Agents {
		if a.Name == "" || a.Model == "" {
			continue
		}
		if run.AgentModel == nil {
			run.AgentModel = map[string]string{}
		}
		run.AgentModel[a.Name] = a.Model
	}
	switch n := cfg.Algorithm.Normalization; n.Kind {
	case yaml.ScalarNode:
		run.Normalization = n.Value
	case yaml.MappingNode:
		var parts []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			parts = append(parts, n.Content[i].Value+"="+n.Content[i+1].Value)
		}
		run.Normalization = strings.Join(parts, ",")
	}
	return nil
}

func sortedKeys(ms ...map[string]Series) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}
