package rollout

import (
	"context"

	"github.com/drmas/drmas/pkg/env"
)

// syncSource plays each iteration's rollout when it is asked for: on the weights the engines serve
// now, every engine call of them (rollout.max_staleness 0).
type syncSource struct{ p Player }

func openSync(_ Config, p Player, _ Options) (Source, error) { return syncSource{p}, nil }

func (s syncSource) Next(ctx context.Context, it, version int) (*env.Rollout, int, error) {
	sh, err := s.p.Play(ctx, it, true)
	if err != nil {
		return nil, sh.Epoch, err
	}
	roll, err := s.p.Complete(ctx, sh)
	if err != nil {
		return nil, sh.Epoch, err
	}
	roll.Version = version
	return roll, sh.Epoch, staleCalls(roll, it, version, 0)
}

func (syncSource) Updated(context.Context, int, map[string]float64) error { return nil }

func (syncSource) Pending() ([]byte, error) { return nil, nil }

func (syncSource) Close() {}
