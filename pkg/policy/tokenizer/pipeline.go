package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizeFunc rewrites text before pre-tokenization; nil means identity.
type normalizeFunc func(string) string

// parseNormalizer reads the "normalizer" section: null, a Unicode
// normalization form, Lowercase, or a Sequence of those.
func parseNormalizer(raw json.RawMessage) (normalizeFunc, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch c.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Sequence":
		var fs []normalizeFunc
		for i, sub := range c.Normalizers {
			f, err := parseNormalizer(sub)
			if err != nil {
				return nil, fmt.Errorf("normalizers[%d]: %w", i, err)
			}
			if f != nil {
				fs = append(fs, f)
			}
		}
		if len(fs) == 0 {
			return nil, nil
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	default:
		return nil, fmt.Errorf("normalizer: type %q is not supported (want NFC, NFD, NFKC, NFKD, Lowercase or a Sequence of them)", c.Type)
	}
}

// preTokenizer cuts a text segment into words. It is a list of Split steps
// ending with the ByteLevel step, whose optional prefix space and GPT-2
// regex apply to every piece the earlier steps produced.
type preTokenizer struct {
	splits         []*splitter // Split and Digits steps, in order
	addPrefixSpace bool        // ByteLevel add_prefix_space
	byteLevelRegex *splitter   // ByteLevel use_regex: the GPT-2 pattern, or nil
}

// parsePreTokenizer reads the "pre_tokenizer" section. Supported: ByteLevel
// alone, or a Sequence of Split / Digits steps followed by ByteLevel.
func parsePreTokenizer(raw json.RawMessage) (*preTokenizer, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("pre_tokenizer: missing; a byte-level BPE needs a ByteLevel pre-tokenizer")
	}
	var steps []component
	if err := flattenPreTokenizer(raw, &steps); err != nil {
		return nil, err
	}
	pt := &preTokenizer{}
	for i, c := range steps {
		last := i == len(steps)-1
		switch c.Type {
		case "ByteLevel":
			if !last {
				return nil, fmt.Errorf("pre_tokenizer: ByteLevel must be the last step (it is step %d of %d)", i+1, len(steps))
			}
			pt.addPrefixSpace = c.AddPrefixSpace
			if c.UseRegex == nil || *c.UseRegex { // use_regex defaults to true
				sp, err := newSplitter(GPT2Pattern, splitIsolated)
				if err != nil {
					return nil, err
				}
				pt.byteLevelRegex = sp
			}
		case "Split":
			sp, err := parseSplit(c)
			if err != nil {
				return nil, fmt.Errorf("pre_tokenizer step %d: %w", i+1, err)
			}
			pt.splits = append(pt.splits, sp)
		case "Digits":
			pattern := `\p{N}+`
			if c.IndividualDigits {
				pattern = `\p{N}`
			}
			sp, err := newSplitter(pattern, splitIsolated)
			if err != nil {
				return nil, err
			}
			pt.splits = append(pt.splits, sp)
		default:
			return nil, fmt.Errorf("pre_tokenizer step %d: type %q is not supported (want ByteLevel, Split, Digits or a Sequence of them)", i+1, c.Type)
		}
		if last && c.Type != "ByteLevel" {
			return nil, fmt.Errorf("pre_tokenizer: the last step must be ByteLevel, got %q", c.Type)
		}
	}
	return pt, nil
}

// flattenPreTokenizer appends the steps of raw to steps, unrolling Sequences.
func flattenPreTokenizer(raw json.RawMessage, steps *[]component) error {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	if c.Type != "Sequence" {
		*steps = append(*steps, c)
		return nil
	}
	for _, sub := range c.PreTokenizers {
		if err := flattenPreTokenizer(sub, steps); err != nil {
			return err
		}
	}
	return nil
}

func parseSplit(c component) (*splitter, error) {
	if c.Invert {
		return nil, fmt.Errorf("split: invert true is not supported")
	}
	b, ok := splitBehaviors[c.Behavior]
	if !ok {
		return nil, fmt.Errorf("split: behavior %q is not supported (want Isolated, Removed, MergedWithPrevious or MergedWithNext)", c.Behavior)
	}
	switch {
	case c.Pattern == nil:
		return nil, fmt.Errorf("split: missing pattern")
	case c.Pattern.Regex != nil:
		return newSplitter(*c.Pattern.Regex, b)
	case c.Pattern.String != nil:
		return newSplitter(regexp2.Escape(*c.Pattern.String), b)
	default:
		return nil, fmt.Errorf("split: pattern needs Regex or String")
	}
}

// appendWords appends the words of segment s to dst.
func (pt *preTokenizer) appendWords(dst []string, s string) []string {
	pieces := []string{s}
	for _, sp := range pt.splits {
		var next []string
		for _, p := range pieces {
			for _, sn := range sp.split(p) {
				next = append(next, p[sn.start:sn.end])
			}
		}
		pieces = next
	}
	for _, p := range pieces {
		if pt.addPrefixSpace && !strings.HasPrefix(p, " ") {
			p = " " + p
		}
		if pt.byteLevelRegex == nil {
			dst = append(dst, p)
			continue
		}
		for _, sn := range pt.byteLevelRegex.split(p) {
			dst = append(dst, p[sn.start:sn.end])
		}
	}
	return dst
}
