package engine

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/rundir"
)

// WeightsDir is the folder under run.dir of the weights served to rollout engines (a name the run
// folder knows as drmas's): <run>/weights/<model>/v<step>, the newest version only.
var WeightsDir = rundir.Own("weights")

// Publisher writes the weights a run's engines load: one Hugging Face (or PEFT) folder per model and
// version under <run>/weights, written whole before it is named, the older versions pruned. It names
// adapter versions for the engines too. It knows nothing of tensors: the caller's save writes them.
type Publisher struct {
	run string // the run folder
	tag string // the run folder's tag in adapter names (runs sharing a server do not collide)
}

// NewPublisher publishes under the run folder run.
func NewPublisher(run string) *Publisher {
	abs, err := filepath.Abs(run)
	if err != nil {
		abs = run
	}
	sum := sha256.Sum256([]byte(abs))
	return &Publisher{run: run, tag: fmt.Sprintf("%x", sum[:4])}
}

// Write writes model id's folder of version v atomically: save writes into v<step>.tmp, which is
// renamed into place when complete (a folder of the same version written before a resume is
// replaced). It returns the folder's absolute path.
func (p *Publisher) Write(id string, v llm.Version, save func(dir string) error) (string, error) {
	base, err := filepath.Abs(filepath.Join(p.run, WeightsDir, id))
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, "v"+fmt.Sprint(v.Step))
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil { // a leftover of an interrupted write of ours
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := save(tmp); err != nil {
		return "", fmt.Errorf("model %s: write weights for the engines: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

var versionDir = regexp.MustCompile(`^v\d+(\.tmp)?$`)

// Prune removes model id's published versions other than keep (only the folders drmas names
// v<N>, nothing else in the model's folder).
func (p *Publisher) Prune(id string, keep llm.Version) {
	base := filepath.Join(p.run, WeightsDir, id)
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != "v"+fmt.Sprint(keep.Step) && versionDir.MatchString(e.Name()) {
			if err := os.RemoveAll(filepath.Join(base, e.Name())); err != nil {
				log.Warn().Err(err).Str("dir", e.Name()).Msg("could not prune an old weights version")
			}
		}
	}
}

// AdapterVersion is adapter id's version of step as an engine serves it: under a new name per
// version (engines reload a same-name adapter unreliably: SkyRL#1606, vllm#42125), tagged with the
// run folder (<id>@<step>.<tag>). Every rank names alike.
func (p *Publisher) AdapterVersion(id string, step int) llm.Version {
	return llm.Version{Step: step, Adapter: fmt.Sprintf("%s@%d.%s", id, step, p.tag), Known: true}
}
