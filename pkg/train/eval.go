package train

import (
	"context"
	"io"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/check"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/team"
)

// EvalSets reads evaluation files (JSON lines or Parquet, read with the config's data.fields and
// data.shape, their first prompts measured as training's are: pkg/check), one set per file, named
// after the file.
func (t *Team) EvalSets(paths []string) ([]env.EvalSet, error) {
	pc, err := check.NewPrompts(t.Config, t.Tools)
	if err != nil {
		return nil, err
	}
	return team.ReadSets(paths, t.Config.DataOptions(0, pc.Keep), "")
}

// EvalOptions are an evaluation's choices beyond the config.
type EvalOptions struct {
	env.EvalOptions        // samples per question, seed, batch, progress (Transcripts: see Out)
	Limit           int    // questions per set; 0 = all
	Out             string // when set, every agent call is written to this file as a JSON line, all at once
}

// Evaluate runs the team over the sets, the first opt.Limit questions of each, and reports avg@k and
// pass@k per set and the per-agent figures.
func (t *Team) Evaluate(ctx context.Context, sets []env.EvalSet, opt EvalOptions) (*env.EvalReport, error) {
	defer t.Router.HoldDecodingLayout()()
	sets = append([]env.EvalSet(nil), sets...)
	for i := range sets {
		sets[i].Tasks = team.FirstN(sets[i].Tasks, opt.Limit)
	}
	if opt.Out == "" {
		return env.Evaluate(ctx, t.Orchestra, t.Router, sets, opt.EvalOptions)
	}
	var rep *env.EvalReport
	var evalErr error
	err := atomicfile.Write(opt.Out, func(w io.Writer) error {
		o := opt.EvalOptions
		o.Transcripts, o.Render = w, t.render
		rep, evalErr = env.Evaluate(ctx, t.Orchestra, t.Router, sets, o)
		return evalErr
	})
	if evalErr != nil {
		return nil, evalErr
	}
	return rep, err
}
