package c10d

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog/log"
)

// ErrMismatch marks a *MismatchError: the ranks were started with different configs or binaries.
var ErrMismatch = errors.New("ranks differ")

// MismatchError says which keys of the identity differ between this rank and another.
type MismatchError struct {
	Rank, Other int
	// Keys are the keys that differ, sorted; Here and There their values on this rank and the other
	// ("" when a rank lacks the key).
	Keys        []string
	Here, There []string
}

func (e *MismatchError) Error() string {
	const shown = 8
	var b strings.Builder
	fmt.Fprintf(&b, "rank %d and rank %d were started with different configs or drmas binaries (%d key(s) differ: ", e.Rank, e.Other, len(e.Keys))
	for i, k := range e.Keys {
		if i == shown {
			fmt.Fprintf(&b, "; and %d more", len(e.Keys)-shown)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s on rank %d, %s on rank %d", k, quoteValue(e.Here[i]), e.Rank, quoteValue(e.There[i]), e.Other)
	}
	b.WriteString("): every rank must run the same binary with the same config file, --set flags and DRMAS_ environment")
	return b.String()
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

func quoteValue(v string) string {
	if v == "" {
		return "(unset)"
	}
	return strconv.Quote(v)
}

// Digest is a SHA-256 over the identity's sorted key = value pairs.
func Digest(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s=%d:%s\n", len(k), k, len(id[k]), id[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func identityKey(rank int) string { return "drmas/identity/" + strconv.Itoa(rank) }

// identity is what a rank publishes at rendezvous.
type identity struct {
	Digest string            `json:"digest"`
	Keys   map[string]string `json:"keys"`
}

// agree compares this rank's identity with every other rank's through the store (before the monitor
// starts: it has the store's side connection to itself). Each rank publishes its digest and keys,
// reads the others' and names the first rank that differs; a barrier then keeps the store's host up
// until every rank has read what it needs, so every rank names the keys, not a lost store.
func (g *Group) agree(id map[string]string) error {
	if g.env.WorldSize == 1 {
		return nil
	}
	mine := identity{Digest: Digest(id), Keys: id}
	b, err := json.Marshal(mine)
	if err != nil {
		return err
	}
	if err := g.pg.StoreSet(identityKey(g.env.Rank), b); err != nil {
		return fmt.Errorf("dist: publish this rank's config digest: %w", err)
	}
	var mismatch error
	for r := 0; r < g.env.WorldSize && mismatch == nil; r++ {
		if r == g.env.Rank {
			continue
		}
		// Every rank publishes right after the rendezvous: a rank silent for the stall bound is lost.
		raw, err := g.pg.StoreGet(identityKey(r), g.opt.Stall)
		if err != nil {
			return fmt.Errorf("dist: read rank %d's config digest: %w", r, err)
		}
		var theirs identity
		if err := json.Unmarshal(raw, &theirs); err != nil {
			return fmt.Errorf("dist: rank %d's config digest: %w", r, err)
		}
		if theirs.Digest != mine.Digest {
			mismatch = diffIdentity(g.env.Rank, r, id, theirs.Keys)
		}
	}
	if err := g.pg.Barrier(); err != nil && mismatch == nil {
		return fmt.Errorf("dist: barrier after comparing config digests: %w", err)
	}
	if mismatch == nil {
		log.Debug().Str("digest", mine.Digest).Int("keys", len(id)).Msg("every rank holds the same config and binary")
	}
	return mismatch
}

// diffIdentity lists the keys whose values differ between here (rank) and there (rank other).
func diffIdentity(rank, other int, here, there map[string]string) *MismatchError {
	e := &MismatchError{Rank: rank, Other: other}
	keys := make([]string, 0, len(here)+len(there))
	for k := range here {
		keys = append(keys, k)
	}
	for k := range there {
		if _, ok := here[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if a, b := here[k], there[k]; a != b {
			e.Keys, e.Here, e.There = append(e.Keys, k), append(e.Here, a), append(e.There, b)
		}
	}
	return e
}
