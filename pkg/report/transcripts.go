package report

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/rundir"
)

// RolloutsDir is the folder under run.dir of the rollouts' transcripts (rollouts/step-N.jsonl, one
// JSON line per agent call: docs/contracts.md).
var RolloutsDir = rundir.Own("rollouts")

// writeTranscripts writes iteration it's transcripts, whole or not at all.
func writeTranscripts(r Run, it int, roll *env.Rollout) error {
	dir := filepath.Join(r.Dir, RolloutsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := env.WriteTranscripts(&b, r.Transcripts, roll, r.Render); err != nil {
		return err
	}
	return atomicfile.WriteBytes(filepath.Join(dir, fmt.Sprintf("step-%d.jsonl", it)), b.Bytes())
}
