package tbevent

import (
	"encoding/binary"
	"hash/crc32"
	"math"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the file_version of an event file's first Event.
const FileVersion = "brain.Event:2"

// WriterName is the source_metadata.writer of the files this package writes.
const WriterName = "drmas"

// TextPlugin is the plugin name TensorBoard's text dashboard reads.
const TextPlugin = "text"

// Field numbers of TensorFlow's protos (tensorflow/core/util/event.proto, framework/summary.proto,
// framework/tensor.proto, framework/tensor_shape.proto).
const (
	eventWallTime       = 1 // double
	eventStep           = 2 // int64
	eventFileVersion    = 3 // string
	eventSummary        = 5 // Summary
	eventSourceMetadata = 10

	sourceMetadataWriter = 1 // string

	summaryValue = 1 // repeated Summary.Value

	valueTag      = 1 // string
	valueSimple   = 2 // float
	valueHisto    = 5 // HistogramProto
	valueTensor   = 8 // TensorProto
	valueMetadata = 9 // SummaryMetadata

	metadataPluginData = 1 // PluginData
	pluginName         = 1 // string
	pluginContent      = 2 // bytes

	histoMin         = 1 // double
	histoMax         = 2
	histoNum         = 3
	histoSum         = 4
	histoSumSquares  = 5
	histoBucketLimit = 6 // packed repeated double
	histoBucket      = 7 // packed repeated double

	tensorDType     = 1 // DataType enum
	tensorShape     = 2 // TensorShapeProto
	tensorStringVal = 8 // repeated bytes
	shapeDim        = 2 // repeated Dim
	dimSize         = 1 // int64

	dtString = 7 // DT_STRING
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is TensorFlow's masked CRC-32C of b.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// Frame appends data as one TFRecord to dst.
func Frame(dst, data []byte) []byte {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	dst = append(dst, n[:]...)
	dst = binary.LittleEndian.AppendUint32(dst, MaskedCRC(n[:]))
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, MaskedCRC(data))
}

// Histogram is a HistogramProto: bucket i counts the values v with BucketLimit[i-1] < v ≤
// BucketLimit[i] (the first from −∞).
type Histogram struct {
	Min, Max, Num, Sum, SumSquares float64
	BucketLimit, Bucket            []float64
}

// NewHistogram summarizes the finite values in buckets equal-width buckets over [min, max], as
// tensorboardX does: a leading empty bucket ending at min, then the buckets' counts (the first
// holding min itself). All values equal: one bucket. ok is false when there is no finite value.
func NewHistogram(values []float64, buckets int) (h Histogram, ok bool) {
	var xs []float64
	for _, v := range values {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return h, false
	}
	sort.Float64s(xs)
	h.Min, h.Max, h.Num = xs[0], xs[len(xs)-1], float64(len(xs))
	for _, v := range xs {
		h.Sum += v
		h.SumSquares += v * v
	}
	if h.Min == h.Max || buckets < 1 {
		h.BucketLimit, h.Bucket = []float64{h.Max}, []float64{h.Num}
		return h, true
	}
	width := (h.Max - h.Min) / float64(buckets)
	h.BucketLimit = []float64{h.Min}
	h.Bucket = []float64{0}
	i := 0
	for b := 1; b <= buckets; b++ {
		limit := h.Min + float64(b)*width
		if b == buckets {
			limit = h.Max
		}
		n := 0
		for i < len(xs) && xs[i] <= limit {
			i++
			n++
		}
		h.BucketLimit = append(h.BucketLimit, limit)
		h.Bucket = append(h.Bucket, float64(n))
	}
	return h, true
}

// Value is one Summary.Value: a scalar, a text or a histogram, by its tag.
type Value struct {
	Tag    string
	Kind   Kind
	Scalar float32    // KindScalar
	Text   string     // KindText
	Histo  *Histogram // KindHistogram
	Plugin string     // the metadata's plugin name, when any
}

// Kind says which of a Value's fields is set.
type Kind int

const (
	KindOther Kind = iota
	KindScalar
	KindText
	KindHistogram
)

// Scalar is a simple_value.
func Scalar(tag string, v float64) Value {
	return Value{Tag: tag, Kind: KindScalar, Scalar: float32(v)}
}

// Text is a text summary (TensorBoard's text dashboard renders it as Markdown).
func Text(tag, s string) Value { return Value{Tag: tag, Kind: KindText, Text: s, Plugin: TextPlugin} }

// Histo is a histogram summary.
func Histo(tag string, h Histogram) Value { return Value{Tag: tag, Kind: KindHistogram, Histo: &h} }

// Event is a TensorFlow Event: either the file's first (FileVersion set) or a step's Summary.
type Event struct {
	WallTime    float64 // seconds since the Unix epoch
	Step        int64
	FileVersion string
	Writer      string // source_metadata.writer
	Summary     []Value
}

// Marshal encodes the Event protocol buffer.
func (e Event) Marshal() []byte {
	var b []byte
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(e.WallTime))
	if e.Step != 0 {
		b = protowire.AppendTag(b, eventStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(e.Step))
	}
	if e.FileVersion != "" {
		b = protowire.AppendTag(b, eventFileVersion, protowire.BytesType)
		b = protowire.AppendString(b, e.FileVersion)
	}
	if len(e.Summary) > 0 {
		var s []byte
		for _, v := range e.Summary {
			s = protowire.AppendTag(s, summaryValue, protowire.BytesType)
			s = protowire.AppendBytes(s, v.marshal())
		}
		b = protowire.AppendTag(b, eventSummary, protowire.BytesType)
		b = protowire.AppendBytes(b, s)
	}
	if e.Writer != "" {
		var m []byte
		m = protowire.AppendTag(m, sourceMetadataWriter, protowire.BytesType)
		m = protowire.AppendString(m, e.Writer)
		b = protowire.AppendTag(b, eventSourceMetadata, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b
}

func (v Value) marshal() []byte {
	var b []byte
	b = protowire.AppendTag(b, valueTag, protowire.BytesType)
	b = protowire.AppendString(b, v.Tag)
	if v.Plugin != "" {
		var pd []byte
		pd = protowire.AppendTag(pd, pluginName, protowire.BytesType)
		pd = protowire.AppendString(pd, v.Plugin)
		var md []byte
		md = protowire.AppendTag(md, metadataPluginData, protowire.BytesType)
		md = protowire.AppendBytes(md, pd)
		b = protowire.AppendTag(b, valueMetadata, protowire.BytesType)
		b = protowire.AppendBytes(b, md)
	}
	switch v.Kind {
	case KindScalar:
		b = protowire.AppendTag(b, valueSimple, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(v.Scalar))
	case KindText:
		// A DT_STRING tensor of shape [1], as tensorboardX writes text.
		var dim, shape, t []byte
		dim = protowire.AppendTag(dim, dimSize, protowire.VarintType)
		dim = protowire.AppendVarint(dim, 1)
		shape = protowire.AppendTag(shape, shapeDim, protowire.BytesType)
		shape = protowire.AppendBytes(shape, dim)
		t = protowire.AppendTag(t, tensorDType, protowire.VarintType)
		t = protowire.AppendVarint(t, dtString)
		t = protowire.AppendTag(t, tensorShape, protowire.BytesType)
		t = protowire.AppendBytes(t, shape)
		t = protowire.AppendTag(t, tensorStringVal, protowire.BytesType)
		t = protowire.AppendString(t, v.Text)
		b = protowire.AppendTag(b, valueTensor, protowire.BytesType)
		b = protowire.AppendBytes(b, t)
	case KindHistogram:
		b = protowire.AppendTag(b, valueHisto, protowire.BytesType)
		b = protowire.AppendBytes(b, v.Histo.marshal())
	}
	return b
}

func (h *Histogram) marshal() []byte {
	var b []byte
	for _, f := range []struct {
		n protowire.Number
		v float64
	}{{histoMin, h.Min}, {histoMax, h.Max}, {histoNum, h.Num}, {histoSum, h.Sum}, {histoSumSquares, h.SumSquares}} {
		b = protowire.AppendTag(b, f.n, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(f.v))
	}
	for _, f := range []struct {
		n  protowire.Number
		vs []float64
	}{{histoBucketLimit, h.BucketLimit}, {histoBucket, h.Bucket}} {
		var p []byte
		for _, v := range f.vs {
			p = protowire.AppendFixed64(p, math.Float64bits(v))
		}
		b = protowire.AppendTag(b, f.n, protowire.BytesType)
		b = protowire.AppendBytes(b, p)
	}
	return b
}
