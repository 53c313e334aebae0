package train

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/dataset"
	"github.com/drmas/drmas/pkg/env/retriever"
	"github.com/drmas/drmas/pkg/env/toy"
)

// loadData reads the training tasks and the validation sets (a toy task generates its own).
func loadData(c *config.Config) (train []env.Task, val []env.EvalSet, err error) {
	if c.IsToy() {
		if train, err = toy.Tasks(c.Toy, toy.Train); err != nil {
			return nil, nil, err
		}
		v, err := toy.Tasks(c.Toy, toy.Val)
		if err != nil {
			return nil, nil, err
		}
		return train, []env.EvalSet{{Name: c.Toy.Task, Tasks: firstN(v, c.Run.ValLimit)}}, nil
	}
	pc, err := newPromptCheck(c)
	if err != nil {
		return nil, nil, err
	}
	opts := pc.options(dataset.Options{Fields: dataset.Fields(c.Data.Fields), Shape: dataset.Shape(c.Data.Shape), Limit: c.Data.Limit})
	if train, err = dataset.Load(c.Data.Train, opts); err != nil {
		return nil, nil, fmt.Errorf("data.train: %w", err)
	}
	if val, err = readSets(c.Data.Val, opts, "data.val"); err != nil {
		return nil, nil, err
	}
	for i := range val {
		val[i].Tasks = firstN(val[i].Tasks, c.Run.ValLimit)
	}
	return train, val, nil
}

func firstN(tasks []env.Task, n int) []env.Task {
	if n > 0 && len(tasks) > n {
		return tasks[:n]
	}
	return tasks
}

func newRetriever(c *config.Config) (env.Retriever, error) {
	r := c.Retriever
	switch r.Type {
	case "", retriever.TypeNone:
		return nil, nil
	case retriever.TypeFacts:
		return env.FactRetriever{}, nil
	}
	ret, err := retriever.New(retriever.Config{Type: r.Type, Corpus: r.Corpus, IndexDir: r.IndexDir, URL: r.URL,
		Timeout: r.Timeout, Retries: r.Retries, Deadline: r.Deadline})
	if err != nil {
		return nil, fmt.Errorf("retriever: %w", err)
	}
	return ret, nil
}

// readSets reads one evaluation set per file, named after the file; key, when set, names the list in
// errors (key[i]).
func readSets(paths []string, opts dataset.Options, key string) ([]env.EvalSet, error) {
	var sets []env.EvalSet
	for i, p := range paths {
		tasks, err := dataset.Load(p, opts)
		if err != nil && key != "" {
			return nil, fmt.Errorf("%s[%d]: %w", key, i, err)
		}
		if err != nil {
			return nil, err
		}
		sets = append(sets, env.EvalSet{Name: strings.TrimSuffix(filepath.Base(p), filepath.Ext(p)), Tasks: tasks})
	}
	return sets, nil
}
