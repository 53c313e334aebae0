package dataset

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/answer"
)

// Shape says how a record's answer field becomes gold answers.
type Shape string

// Dataset shapes.
const (
	// ShapeAuto picks the shape from the first record (see Load).
	ShapeAuto Shape = "auto"
	// ShapeGSM8K: `question`, and `answer` ending in `#### N`; the gold is N.
	ShapeGSM8K Shape = "gsm8k"
	// ShapeMath: `problem`, and `solution` holding `\boxed{}`; the gold is the last box's content.
	ShapeMath Shape = "math"
	// ShapeQA: `question`, and `golden_answers`, a list of strings (or one string).
	ShapeQA Shape = "qa"
	// ShapePlain: `question`, and `answer` used as it is (a string, a number or a list).
	ShapePlain Shape = "plain"
	// ShapeRecord: the record as it stands, no field required (its ID from the ID field when it has
	// one): a gateway runner reads the task itself (Task.Record). Question and answer are kept when
	// the record has them as the plain shape's fields.
	ShapeRecord Shape = "record"
)

// Shapes lists the shape names a config's data.shape accepts.
var Shapes = []string{string(ShapeAuto), string(ShapeGSM8K), string(ShapeMath), string(ShapeQA), string(ShapePlain), string(ShapeRecord)}

// File formats.
const (
	FormatJSONL   = "jsonl"
	FormatParquet = "parquet"
)

// Fields names the record fields to read. An empty name means the shape's default. A name may be a
// dotted path (`reward_model.ground_truth`, `extra_info.question`); a numeric component indexes a
// list (`prompt.0.content`).
type Fields struct {
	ID       string `json:"id" mapstructure:"id"`             // default "id"; absent => <basename>-<index>
	Question string `json:"question" mapstructure:"question"` // default per shape
	Answer   string `json:"answer" mapstructure:"answer"`     // default per shape
}

// Options configures Load.
type Options struct {
	Fields Fields
	// Format is "jsonl" or "parquet"; empty picks by extension (.jsonl and .json are JSON lines).
	Format string
	// Shape is one of the Shape constants; empty means ShapeAuto.
	Shape Shape
	// Limit keeps only the first Limit tasks; 0 keeps all.
	Limit int
	// Check, when set, sees every task as it is read: an error rejects the file (named with the
	// record's line or row), keep = false skips the record. Skipped records are counted in the log
	// under SkipReason and do not count towards Limit.
	Check      func(t env.Task) (keep bool, err error)
	SkipReason string
}

// defaults are the field names of each shape.
var defaults = map[Shape]Fields{
	ShapeGSM8K:  {Question: "question", Answer: "answer"},
	ShapeMath:   {Question: "problem", Answer: "solution"},
	ShapeQA:     {Question: "question", Answer: "golden_answers"},
	ShapePlain:  {Question: "question", Answer: "answer"},
	ShapeRecord: {Question: "question", Answer: "answer"},
}

// Load reads the dataset at path into tasks.
//
// Each record gives one task: its question, its gold answers (by shape) and its ID (the ID field, or
// `<basename>-<index>` with the 0-based record index when the field is absent). ShapeAuto decides
// from the first record: with an explicit answer field, a value holding `####` is GSM8K, one holding
// `\boxed` is MATH, anything else plain; without one, a `golden_answers` field means QA,
// `problem` + `solution` MATH, an `answer` holding `####` GSM8K, else plain.
//
// Errors name the file and the line (JSON lines, 1-based) or row (Parquet, 0-based): a malformed
// line, a missing or empty field, a duplicate ID, an unreadable file. An empty dataset is an error.
func Load(path string, opt Options) ([]env.Task, error) {
	if opt.Limit < 0 {
		return nil, fmt.Errorf("dataset %s: limit %d is negative", path, opt.Limit)
	}
	if opt.Shape == "" {
		opt.Shape = ShapeAuto
	}
	if _, ok := defaults[opt.Shape]; !ok && opt.Shape != ShapeAuto {
		return nil, fmt.Errorf("dataset %s: unknown shape %q (want auto, gsm8k, math, qa, plain or record)", path, opt.Shape)
	}
	format, err := formatOf(path, opt.Format)
	if err != nil {
		return nil, err
	}
	read := readJSONL
	if format == FormatParquet {
		read = readParquet
	}
	l := &loading{opt: opt, base: strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)), seen: map[string]string{}}
	var bad badText
	err = read(path, l.add, &bad)
	if err != nil && !errors.Is(err, errLimit) {
		return nil, err
	}
	if bad.records > 0 { // kept: a stray byte is no reason to drop a record, but it is no silent change either
		how := "its invalid bytes read as U+FFFD (the replacement character)"
		if format == FormatParquet {
			how = "its invalid bytes kept as they are"
		}
		log.Warn().Str("path", path).Int("records", bad.records).Str("first", bad.first).
			Msg("dataset: records with invalid UTF-8 text, kept, " + how)
	}
	limited := errors.Is(err, errLimit)
	tasks, skipped := l.tasks, l.skipped
	if skipped > 0 {
		log.Warn().Str("path", path).Int("skipped", skipped).Int("kept", len(tasks)).Msg("records skipped: " + opt.SkipReason)
	}
	if len(tasks) == 0 && skipped > 0 {
		return nil, fmt.Errorf("dataset %s: all %d records read were skipped (%s)", path, skipped, opt.SkipReason)
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("dataset %s is empty", path)
	}
	if limited { // a check of the first records (--dry-run), not the dataset's size
		log.Info().Str("path", path).Str("shape", string(l.conv.shape)).Int("records_checked", len(tasks)).
			Msg("dataset: its first records checked (the whole file is read when training starts)")
		return tasks, nil
	}
	log.Info().Str("path", path).Str("shape", string(l.conv.shape)).Int("tasks", len(tasks)).Msg("loaded dataset")
	return tasks, nil
}

// errLimit stops the reading once Options.Limit tasks are kept.
var errLimit = errors.New("limit reached")

// loading is Load's state as the records arrive: the converter (its shape decided by the first
// record), the tasks kept, the IDs seen (where each was) and the records the check skipped.
type loading struct {
	opt     Options
	base    string // the file's name without its extension, for IDs of records without one
	conv    *converter
	tasks   []env.Task
	seen    map[string]string
	skipped int
}

// add turns the record at where into a task, refusing a duplicate ID or one the check rejects, and
// keeps it unless the check skips it; errLimit once Limit tasks are kept.
func (l *loading) add(rec map[string]any, where string, idx int) error {
	if l.conv == nil {
		c := newConverter(l.opt, rec)
		l.conv = &c
	}
	t, err := l.conv.task(rec, l.base, idx)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if first, dup := l.seen[t.ID]; dup {
		return fmt.Errorf("%s: duplicate id %q (first at %s)", where, t.ID, first)
	}
	l.seen[t.ID] = where
	if l.opt.Check != nil {
		keep, err := l.opt.Check(t)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if !keep {
			l.skipped++
			return nil
		}
	}
	l.tasks = append(l.tasks, t)
	if l.opt.Limit > 0 && len(l.tasks) >= l.opt.Limit {
		return errLimit
	}
	return nil
}

// formatOf returns the file format: the explicit one, or the one its extension implies.
func formatOf(path, format string) (string, error) {
	switch format {
	case FormatJSONL, FormatParquet:
		return format, nil
	case "":
	default:
		return "", fmt.Errorf("dataset %s: unknown format %q (want jsonl or parquet)", path, format)
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl", ".json", ".ndjson":
		return FormatJSONL, nil
	case ".parquet":
		return FormatParquet, nil
	}
	return "", fmt.Errorf("dataset %s: cannot tell the format from the extension (want .jsonl, .json or .parquet, or set the format)", path)
}

// converter turns records into tasks once the shape and field names are settled.
type converter struct {
	shape Shape
	f     Fields
}

// newConverter settles the shape (resolving ShapeAuto on the first record) and the field names.
func newConverter(opt Options, first map[string]any) converter {
	shape := opt.Shape
	if shape == ShapeAuto {
		shape = detectShape(opt.Fields, first)
	}
	f := opt.Fields
	d := defaults[shape]
	if f.ID == "" {
		f.ID = "id"
	}
	if f.Question == "" {
		f.Question = d.Question
	}
	if f.Answer == "" {
		f.Answer = d.Answer
	}
	return converter{shape: shape, f: f}
}

// detectShape implements the ShapeAuto rules documented on Load.
func detectShape(f Fields, rec map[string]any) Shape {
	byContent := func(v any) Shape {
		s, ok := v.(string)
		switch {
		case ok && strings.Contains(s, "####"):
			return ShapeGSM8K
		case ok && (strings.Contains(s, `\boxed`) || strings.Contains(s, `\fbox`)):
			return ShapeMath
		}
		return ShapePlain
	}
	if f.Answer != "" {
		v, _ := lookup(rec, f.Answer)
		return byContent(v)
	}
	if _, ok := lookup(rec, "golden_answers"); ok {
		return ShapeQA
	}
	_, hasProblem := lookup(rec, "problem")
	_, hasSolution := lookup(rec, "solution")
	if hasProblem && hasSolution {
		return ShapeMath
	}
	v, _ := lookup(rec, "answer")
	return byContent(v)
}

// task converts one record; idx is its 0-based index in the file.
func (c *converter) task(rec map[string]any, base string, idx int) (env.Task, error) {
	var t env.Task
	if v, ok := lookup(rec, c.f.ID); ok {
		id, err := scalarString(v)
		if err != nil {
			return t, fmt.Errorf("field %q %w", c.f.ID, err)
		}
		t.ID = id
	} else {
		t.ID = base + "-" + strconv.Itoa(idx)
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return t, fmt.Errorf("the record as JSON: %w", err)
	}
	t.Record = raw
	if c.shape == ShapeRecord { // no field required; what the plain fields hold is kept
		t.Question, _ = c.text(rec, c.f.Question)
		if v, ok := lookup(rec, c.f.Answer); ok {
			t.Answers, _ = answerStrings(v)
		}
		return t, nil
	}

	q, err := c.text(rec, c.f.Question)
	if err != nil {
		return t, err
	}
	t.Question = q

	v, ok := lookup(rec, c.f.Answer)
	if !ok {
		return t, missing(rec, c.f.Answer)
	}
	switch c.shape {
	case ShapeGSM8K:
		s, err := c.text(rec, c.f.Answer)
		if err != nil {
			return t, err
		}
		gold, err := answer.GSM8KGold(s)
		if err != nil {
			return t, fmt.Errorf("field %q: %w", c.f.Answer, err)
		}
		t.Answers = []string{gold}
	case ShapeMath:
		s, err := c.text(rec, c.f.Answer)
		if err != nil {
			return t, err
		}
		gold, ok := answer.Boxed(s)
		if !ok || strings.TrimSpace(gold) == "" {
			return t, fmt.Errorf("field %q has no non-empty \\boxed{} answer", c.f.Answer)
		}
		t.Answers = []string{strings.TrimSpace(gold)}
	default:
		golds, err := answerStrings(v)
		if err != nil {
			return t, fmt.Errorf("field %q %w", c.f.Answer, err)
		}
		t.Answers = golds
	}
	return t, nil
}

// text reads a field that must hold non-blank text.
func (c *converter) text(rec map[string]any, field string) (string, error) {
	v, ok := lookup(rec, field)
	if !ok {
		return "", missing(rec, field)
	}
	s, err := scalarString(v)
	if err != nil {
		return "", fmt.Errorf("field %q %w", field, err)
	}
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("field %q is empty", field)
	}
	return s, nil
}

func missing(rec map[string]any, field string) error {
	return fmt.Errorf("missing field %q (record has: %s)", field, keys(rec))
}
